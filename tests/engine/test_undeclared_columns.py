"""Columns a policy does not declare: hidden in a DuckDB database file, unless it says so.

A database table's column that the policy does not name (its ``privacy_unit``, a key of its
``columns``, one of its ``constant_per_unit``) is in no catalog and a reference to it, in the
select list or in ``WHERE``, is the usual unknown-column error, nothing charged;
``tables.<t>.expose_undeclared = true`` shows it. Parquet and CSV files show every column by
default (as before) and hide the undeclared ones with ``expose_undeclared = false``. Real
DuckDB files; the server's catalog is in tests/interfaces/test_server_files.py.
"""

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

ROWS = [(u, 20 + u % 50, 1000.0 + u) for u in range(80)]
SCHEMA = (("user_id", "BIGINT"), ("age", "INTEGER"), ("salary", "DOUBLE"))


def _write(folder: Path, kind: str) -> Path:
    if kind == "parquet":
        write_parquet(folder / "visits.parquet", ROWS, SCHEMA)
        return folder / "visits.parquet"
    if kind == "csv":
        lines = "".join(f"{u},{a},{s}\n" for u, a, s in ROWS)
        (folder / "visits.csv").write_text("user_id,age,salary\n" + lines)
        return folder / "visits.csv"
    con = duckdb.connect(str(folder / "warehouse.duckdb"))
    try:
        con.execute("CREATE TABLE visits (user_id BIGINT, age INTEGER, salary DOUBLE)")
        con.executemany("INSERT INTO visits VALUES (?, ?, ?)", [list(r) for r in ROWS])
    finally:
        con.close()
    return folder / "warehouse.duckdb"


def _policy(folder: Path, kind: str, expose: bool | None) -> dict[str, Any]:
    path = _write(folder, kind)
    data = {"database": str(path)} if kind == "duckdb" else {"tables": {"visits": str(path)}}
    age: dict[str, Any] = {"lower": 0, "upper": 100}
    if kind == "csv":
        age["type"] = "INTEGER"
    table: dict[str, Any] = {"privacy_unit": "user_id", "max_groups_per_unit": 1,
                             "max_rows_per_unit_per_group": 2, "columns": {"age": age}}  # fmt: skip
    if expose is not None:
        table["expose_undeclared"] = expose
    return {
        "dataset": {"id": "undeclared"},
        "data": data,
        "budget": {"diagnose": False, "epsilon": "10", "delta": "0.000001",
                   "query_epsilon": "1"},
        "tables": {"visits": table},
    }  # fmt: skip


CASES = [
    ("duckdb", None, True),
    ("duckdb", False, True),
    ("duckdb", True, False),
    ("parquet", None, False),
    ("parquet", False, True),
    ("csv", None, False),
    ("csv", False, True),
]


@pytest.mark.parametrize(("kind", "expose", "hidden"), CASES)
def test_undeclared_columns_are_hidden_unless_exposed(
    tmp_path: Path, kind: str, expose: bool | None, hidden: bool
) -> None:
    session = Session(load_policy(_policy(tmp_path, kind, expose), base_dir=tmp_path))
    try:
        assert ("salary" not in session.engine.catalog["visits"]) is hidden
        assert {"user_id", "age"} <= set(session.engine.catalog["visits"])
        uses = [
            "SELECT COUNT(*) FROM visits WHERE salary > '1040'",
            "SELECT COUNT(*) FROM visits v WHERE v.salary > '1040'",
            "SELECT COUNT(*) FROM (SELECT user_id, salary FROM visits) t WHERE salary IS NOT NULL",
            "SELECT SUM(salary) FROM visits",
        ]
        for sql in uses[:3]:
            if hidden:
                with pytest.raises(SchemaError, match="salary"):
                    session.execute(sql)
            else:
                assert session.execute(sql).rows  # answered (the second from the first's release)
        if hidden:
            with pytest.raises(SchemaError, match="unknown column salary"):
                session.execute(uses[3])
            assert session.budget().queries == 0  # every refusal before the charge
        # Declared columns answer either way.
        assert session.execute("SELECT COUNT(*), AVG(age) FROM visits").charge is not None
    finally:
        session.close()


def test_the_dbapi_cursor_describes_declared_columns_only(tmp_path: Path) -> None:
    policy = load_policy(_policy(tmp_path, "duckdb", None), base_dir=tmp_path)
    with dpsql.connect(policy) as conn:
        cur = conn.cursor()
        cur.execute("SELECT COUNT(*) AS n FROM visits WHERE age > 30")
        assert [d[0] for d in cur.description] == ["n"]
        with pytest.raises(dpsql.ProgrammingError, match="unknown column salary"):
            cur.execute("SELECT COUNT(*) AS n FROM visits WHERE salary > 0")


def test_a_misspelled_declaration_still_suggests_the_hidden_column(tmp_path: Path) -> None:
    raw = _policy(tmp_path, "duckdb", None)
    raw["tables"]["visits"]["columns"]["salray"] = {"lower": 0, "upper": 1}
    with pytest.raises(PolicyError, match="did you mean salary"):
        Session(load_policy(raw, base_dir=tmp_path))
