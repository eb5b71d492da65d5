"""docs/cli.md keeps up with the ``dpsql`` command (datasette's test_docs.py style).

The checks walk the click group recursively and the exit-code table, so a new command, option,
argument, environment variable or exit code fails here until it is written down, in the section
of the command it belongs to.
"""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from dpsql.interfaces.cli import main as cli
from dpsql.interfaces.cli.check import EXIT_FINDINGS
from dpsql.interfaces.cli.context import EXIT_CODES

DOC = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text(encoding="utf-8")
COMMANDS = list(cli.walk(cli.cli))


def _section(name: str) -> str:
    """The text under the heading ``## `name` `` up to the next ``## `` heading."""
    match = re.search(rf"^## `{re.escape(name)}`\s*$(.*?)(?=^## |\Z)", DOC, re.M | re.S)
    assert match, f"docs/cli.md has no section '## `{name}`'"
    return match.group(1)


def test_the_walk_finds_every_command() -> None:
    # Guard against a walk that finds nothing (and so checks nothing).
    names = [name for name, _ in COMMANDS]
    assert names[0] == "dpsql"
    for expected in ("dpsql init", "dpsql ledger verify", "dpsql budget allocate", "dpsql report"):
        assert expected in names


@pytest.mark.parametrize(("name", "command"), COMMANDS, ids=[n for n, _ in COMMANDS])
def test_every_command_and_option_is_documented_in_its_section(
    name: str, command: click.Command
) -> None:
    section = _section(name)
    for param in command.params:
        if isinstance(param, click.Option):
            for opt in param.opts:
                if opt == "--help":
                    continue
                assert f"`{opt}" in section, f"{name}: option {opt} is not documented"
            for var in [param.envvar] if isinstance(param.envvar, str) else param.envvar or []:
                assert f"`{var}`" in section, f"{name}: variable {var} is not documented"
        else:
            metavar = param.human_readable_name.upper()
            assert f"`{metavar}`" in section, f"{name}: argument {metavar} is not documented"


def test_no_documented_command_is_missing_from_the_code() -> None:
    documented = re.findall(r"^## `(dpsql[^`]*)`", DOC, re.M)
    assert sorted(documented) == sorted(name for name, _ in COMMANDS)


def _documented_codes() -> dict[int, str]:
    table = _section_exit_codes()
    return {int(code): rest for code, rest in re.findall(r"^\| (\d+) \|(.*)$", table, re.M)}


def _section_exit_codes() -> str:
    match = re.search(r"^## Exit codes\s*$(.*?)(?=^## |\Z)", DOC, re.M | re.S)
    assert match, "docs/cli.md has no '## Exit codes' section"
    return match.group(1)


def test_every_exit_code_is_documented_with_its_error_class() -> None:
    documented = _documented_codes()
    codes = {cli.EXIT_OK, EXIT_FINDINGS, cli.EXIT_USAGE, cli.EXIT_INTERNAL, *EXIT_CODES.values()}
    assert set(documented) == codes
    for cls, code in EXIT_CODES.items():
        assert f"`{cls.__name__}`" in documented[code], f"{cls.__name__} not beside {code}"


def test_help_prints_the_same_exit_codes() -> None:
    result = CliRunner().invoke(cli.cli, ["--help"])
    assert result.exit_code == 0
    printed = {int(c) for c in re.findall(r"^\s+(\d+)\s{2}", result.output, re.M)}
    assert printed == set(_documented_codes())
