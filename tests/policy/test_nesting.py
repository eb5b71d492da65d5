"""Inputs nested past any sensible depth get a typed error, never a RecursionError.

Python's parsers of TOML and JSON recurse once per level of arrays and tables: a policy file, a
users file or a forged ledger record nested 100,000 deep would end in a RecursionError, which
the CLI reports as an internal error (exit 70). A policy is refused past ``MAX_POLICY_DEPTH``
levels, however the nesting is spelled (arrays, inline tables, dotted keys, table headers, or a
dict given in Python); the users file past json's own limit. The ledger's case is a tamper in
``tests/accounting/test_ledger.py`` (``deeply_nested_payload``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dpsql.errors import PolicyError
from dpsql.interfaces.cli import main as cli
from dpsql.interfaces.pgwire.users import load_users
from dpsql.policy import MAX_POLICY_DEPTH, load_policy

BUDGET = "[budget]\nepsilon = 1\n"


def nested(shape: str, depth: int) -> str:
    """A TOML line nesting ``depth`` levels in the form ``shape``."""
    if shape == "arrays":
        return "x = " + "[" * depth + "1" + "]" * depth
    if shape == "inline tables":
        return "x = " + "{a = " * depth + "1" + "}" * depth
    if shape == "dotted keys":
        return "x" + ".x" * (depth - 1) + " = 1"
    assert shape == "table header"
    return "[" + ".".join(["x"] * depth) + "]\ny = 1"


SHAPES = ["arrays", "inline tables", "dotted keys", "table header"]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("depth", [MAX_POLICY_DEPTH + 1, 5_000, 100_000])
def test_a_deep_policy_file_is_a_policy_error(tmp_path: Path, shape: str, depth: int) -> None:
    path = tmp_path / "deep.toml"
    path.write_text(BUDGET + nested(shape, depth) + "\n")
    with pytest.raises(PolicyError, match="nests tables or arrays more than 32 levels"):
        load_policy(path)
    result = CliRunner().invoke(cli.cli, ["--policy", str(path), "budget"])
    assert result.exit_code == 7, result.output
    assert "levels deep" in result.output and "internal error" not in result.output


@given(depth=st.integers(1, 3 * MAX_POLICY_DEPTH), shape=st.sampled_from(SHAPES))
@settings(max_examples=40, deadline=None)
@example(depth=MAX_POLICY_DEPTH - 1, shape="arrays")  # the edges, whatever hypothesis draws
@example(depth=MAX_POLICY_DEPTH - 2, shape="arrays")
@example(depth=MAX_POLICY_DEPTH - 1, shape="inline tables")
@example(depth=MAX_POLICY_DEPTH, shape="dotted keys")
@example(depth=MAX_POLICY_DEPTH + 1, shape="dotted keys")
@example(depth=MAX_POLICY_DEPTH, shape="table header")
@example(depth=MAX_POLICY_DEPTH - 1, shape="table header")
def test_the_depth_rule_is_exact(depth: int, shape: str) -> None:
    """Up to the limit the nesting reaches validation (which refuses the unknown key ``x``);
    past it, the depth rule refuses first, whatever the spelling."""
    import tomllib
    from decimal import Decimal

    raw = tomllib.loads(BUDGET + nested(shape, depth), parse_float=Decimal)
    # Levels from the top table to the value, which counts one: a line under [budget] is one
    # level down; a dotted key of n parts makes n - 1 tables; a header's y = 1 sits in its last.
    deep = depth + {"arrays": 2, "inline tables": 2, "dotted keys": 1, "table header": 1}[shape]
    with pytest.raises(PolicyError) as info:
        load_policy(raw)
    assert ("levels deep" in str(info.value)) == (deep > MAX_POLICY_DEPTH)


def test_a_deep_dict_policy_is_a_policy_error() -> None:
    value: object = 1
    for _ in range(100_000):
        value = {"a": value}
    with pytest.raises(PolicyError, match="levels deep"):
        load_policy({"budget": {"epsilon": 1}, "tables": value})


def test_a_deep_users_file_is_a_policy_error(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    path.write_text('{"version": 1, "users": ' + "[" * 100_000 + "]" * 100_000 + "}")
    path.chmod(0o600)
    with pytest.raises(PolicyError, match="is not valid JSON"):
        load_users(path)


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        ("a.b.c = 1", 3),
        ("[a.b . c]", 3),
        ("x = {a.b.c = 1}", 3),
        ('"a.b.c".d = 1', 2),  # a quoted part's dots are text
        ("1.2.3.4 = 1", 4),  # bare keys may be digits
        ('x = "a.b.c.d"', 0),
        ("x = [1.5, 2.5, 3.5]", 2),  # each float is its own run
        ("# a.b.c.d.e", 0),
        ('x = """\na.b.c.d.e\n"""', 0),
        ("x = '''\na.b.c.d.e\n'''", 0),
    ],
)
def test_dotted_keys_are_counted_on_the_text(text: str, parts: int) -> None:
    """The text check (which spares tomllib a quadratic parse) counts key parts, not dots in
    strings, comments or numbers: a valid policy is never refused by it."""
    from dpsql.policy.load import _longest_dotted_key

    assert _longest_dotted_key(text) == parts


def test_the_example_policies_pass_the_text_check() -> None:
    from dpsql.policy.load import _longest_dotted_key

    for path in Path(__file__).parents[2].glob("examples/*.toml"):
        assert 0 < _longest_dotted_key(path.read_text()) <= 4, path
