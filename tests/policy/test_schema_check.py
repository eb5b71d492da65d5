"""Policies are checked against the data's schema at connect, and unknown names in SQL get a
did-you-mean, drawn only from the names the policy exposes (never a table it does not declare,
never a data value)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pytest
from conftest import write_parquet

import dpsql
from dpsql.errors import PolicyError, SchemaError
from dpsql.policy import load_policy
from dpsql.session.session import Session

SCHEMA = (("user_id", "BIGINT"), ("region", "VARCHAR"), ("age", "INTEGER"), ("spend", "DOUBLE"))
ROWS = [(u, ("east", "west")[u % 2], 20 + u % 50, float(u)) for u in range(1, 60)]


@pytest.fixture
def files(tmp_path: Path) -> Path:
    write_parquet(tmp_path / "visits.parquet", ROWS, SCHEMA)
    write_parquet(tmp_path / "regions.parquet", [("east",), ("west",)], (("name", "VARCHAR"),))
    return tmp_path


def _policy(folder: Path, visits: dict[str, Any], **tables: Any) -> dict[str, Any]:
    return {
        "dataset": {"id": "schema-check", "data_version": "1"},
        "data": {
            "tables": {
                "visits": str(folder / "visits.parquet"),
                "regions": str(folder / "regions.parquet"),
            }
        },
        "budget": {"diagnose": False, "epsilon": "10", "query_epsilon": "1"},
        "tables": {"visits": {"privacy_unit": "user_id", **visits}, **tables},
    }


@pytest.mark.parametrize(
    ("visits", "tables", "field", "hint"),
    [
        ({"privacy_unit": "userid"}, {}, "tables.visits.privacy_unit", "user_id"),
        (
            {"columns": {"spnd": {"lower": 0, "upper": 1}}},
            {},
            "tables.visits.columns.spnd",
            "spend",
        ),
        ({"constant_per_unit": ["regoin"]}, {}, "tables.visits.constant_per_unit", "region"),
        (
            {"columns": {"region": {"public_values_from": "regions.nme"}}},
            {"regions": {"public": True}},
            "tables.visits.columns.region.public_values_from",
            "name",
        ),
        ({}, {"region": {"public": True}}, "tables.region", "regions"),
    ],
)
def test_a_policy_naming_what_the_data_lacks_fails_at_connect(
    files: Path, visits: dict[str, Any], tables: dict[str, Any], field: str, hint: str
) -> None:
    """At connect, or already at load where the policy alone shows it (a table [data] does
    not name: ``dpsql.policy.load``), with the same message."""
    with pytest.raises(PolicyError) as info:
        Session(load_policy(_policy(files, visits, **tables)))
    message = str(info.value)
    assert message.startswith(field + ":") and message.endswith(f"did you mean {hint}?")
    with pytest.raises(dpsql.Error):  # the DB-API's face of the same error
        dpsql.connect(_policy(files, visits, **tables))


def test_a_failed_connect_releases_the_data(tmp_path: Path) -> None:
    path = tmp_path / "data.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE visits AS SELECT 1::BIGINT AS user_id, 2.0 AS spend")
    con.close()
    raw = {
        "dataset": {"id": "x"},
        "data": {"database": str(path)},
        "budget": {"diagnose": False, "epsilon": "1"},
        "tables": {"visits": {"privacy_unit": "userid"}},
    }
    with pytest.raises(PolicyError, match="did you mean user_id"):
        Session(load_policy(raw))
    duckdb.connect(str(path)).close()  # read-write again: nothing holds the file


def test_unknown_names_in_sql_get_a_did_you_mean(files: Path) -> None:
    session = Session(load_policy(_policy(files, {}, regions={"public": True})))
    cases = {
        "SELECT SUM(spnd) FROM visits": "unknown column spnd in table visits; did you mean spend?",
        "SELECT COUNT(*) FROM visit": "unknown table visit; did you mean visits?",
        "SELECT v.regin, COUNT(*) FROM visits v GROUP BY 1": "did you mean region?",
        "SELECT COUNT(*) FROM visits WHERE x.age > 3": "unknown table or alias x",
        "SELECT COUNT(*) FROM visits WHERE zzzzzz > 3": "unknown column zzzzzz in table visits",
    }
    for sql, expected in cases.items():
        with pytest.raises(SchemaError) as info:
            session.execute(sql)
        assert expected in str(info.value), (sql, info.value)
    assert "did you mean" not in _message(session, "SELECT COUNT(*) FROM visits WHERE zzzzzz > 3")
    assert session.budget().queries == 0


def _message(session: Session, sql: str) -> str:
    with pytest.raises(SchemaError) as info:
        session.execute(sql)
    return str(info.value)


def test_a_table_the_policy_does_not_declare_is_never_suggested(tmp_path: Path) -> None:
    path = tmp_path / "warehouse.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE visits AS SELECT 1::BIGINT AS user_id, 2.0 AS spend")
    con.execute("CREATE TABLE salaries AS SELECT 1 AS id, 50000.0 AS salary")
    con.close()
    raw = {
        "dataset": {"id": "x"},
        "data": {"database": str(path)},
        "budget": {"diagnose": False, "epsilon": "1"},
        "tables": {"visits": {"privacy_unit": "user_id"}},
    }
    session = Session(load_policy(raw))
    try:
        message = _message(session, "SELECT COUNT(*) FROM salary")
        assert message == "unknown table salary" and "salaries" not in message
        assert "salary" not in _message(session, "SELECT SUM(salry) FROM visits").split("mean")[-1]
    finally:
        session.close()
