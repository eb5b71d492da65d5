"""Policy errors as helpful as query errors: an unknown key at any level is named with the
closest key the policy knows there, a table under ``[tables]`` that ``[data]`` does not name
says so, and the real CLI exits 7 (``PolicyError``) with one line. EXPLAIN names the engine.
"""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import TINY_REGIONS, TINY_SCHEMA, write_parquet

from dpsql.errors import PolicyError
from dpsql.interfaces.cli import main as cli
from dpsql.policy import load_policy
from dpsql.session.session import Session

BASE = """
[dataset]
id = "typos"
data_version = "1"

[data]
tables = { visits = "visits.parquet" }

[budget]
diagnose = false
epsilon = 1.0
delta = 1e-6
query_epsilon = 0.25
query_delta = 1e-8

[tables.visits]
privacy_unit = "user_id"
max_groups_per_unit = 2
max_rows_per_unit_per_group = 10

[tables.visits.columns.age]
lower = 18
upper = 90

[tables.visits.columns.region]
public_values = ["central", "east", "north", "south", "west"]

[ledger]
path = "typos.ledger"

[engine]
name = "duckdb"

[server]
accuracy_columns = true
"""

# (where the typo goes, the misspelt key, the key it should have been)
TYPOS = [
    ((), "tabels", "tables"),
    (("dataset",), "data_versoin", "data_version"),
    (("data",), "tabels", "tables"),
    (("budget",), "query_epsilom", "query_epsilon"),
    (("tables", "visits"), "max_group_per_unit", "max_groups_per_unit"),
    (("tables", "visits", "columns", "age"), "lowr", "lower"),
    (("ledger",), "pth", "path"),
    (("engine",), "nmae", "name"),
    (("server",), "accuracy_colums", "accuracy_columns"),
]


def _with(typo: tuple[tuple[str, ...], str, str]) -> dict[str, Any]:
    where, wrong, right = typo
    policy = tomllib.loads(BASE)
    node = policy
    for part in where:
        node = node[part]
    node[wrong] = copy.deepcopy(node.pop(right)) if right in node else 1
    return policy


@pytest.mark.parametrize("typo", TYPOS, ids=[".".join((*t[0], t[1])) for t in TYPOS])
def test_an_unknown_key_at_any_level_names_the_closest(
    typo: tuple[tuple[str, ...], str, str], tmp_path: Path
) -> None:
    where, wrong, right = typo
    with pytest.raises(PolicyError) as error:
        load_policy(_with(typo), base_dir=tmp_path)
    message = str(error.value)
    assert f"{'.'.join((*where, wrong))}: unknown key {wrong}; did you mean {right}?" in message
    assert "Extra inputs" not in message


def test_a_key_far_from_every_known_one_gets_no_guess(tmp_path: Path) -> None:
    policy = tomllib.loads(BASE)
    policy["budget"]["zzzzzz"] = 1
    with pytest.raises(PolicyError, match=r"budget\.zzzzzz: unknown key zzzzzz$"):
        load_policy(policy, base_dir=tmp_path)


def test_a_table_that_data_does_not_name_says_so(tmp_path: Path) -> None:
    policy = tomllib.loads(BASE)
    policy["tables"]["visit"] = policy["tables"].pop("visits")
    with pytest.raises(PolicyError) as error:
        load_policy(policy, base_dir=tmp_path)
    message = str(error.value)
    assert message == "tables.visit: data.tables names no such table; did you mean visits?"
    assert "privacy_unit" not in message  # not the table's fields' errors
    # A database (or a Spark catalog) holds tables the policy cannot list: no such check.
    policy["data"] = {"database": "visits.duckdb"}
    load_policy(policy, base_dir=tmp_path)


def test_the_cli_exits_7_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(BASE.replace("max_groups_per_unit", "max_group_per_unit"), encoding="utf-8")
    result = CliRunner().invoke(cli.cli, ["--policy", str(path), "init"])
    assert result.exit_code == 7, (result.output, result.stderr)
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("Error: ") and "did you mean max_groups_per_unit?" in line


def test_explain_names_the_engine(tmp_path: Path) -> None:
    write_parquet(
        tmp_path / "visits.parquet",
        [(1, TINY_REGIONS[0], 30, 1.0), (2, TINY_REGIONS[1], 40, 2.0)],
        TINY_SCHEMA,
    )
    policy = tomllib.loads(BASE)
    del policy["ledger"]  # the budget in memory: nothing to initialise
    session = Session(load_policy(policy, base_dir=tmp_path))
    lines = [row[0] for row in session.execute("EXPLAIN SELECT COUNT(*) FROM visits").rows]
    engine = lines.index("engine: duckdb")
    assert lines[engine + 1].startswith("cost: ")
