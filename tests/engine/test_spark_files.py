"""On Spark too: a data file replaced under an open session is refused before the charge, and
a Parquet file's undeclared columns are hidden when the policy says so (the DuckDB engine's
cases are tests/engine/test_data_files.py and test_undeclared_columns.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from conftest import write_parquet
from spark_fixtures import SOCKET_WARNINGS, spark  # noqa: F401  (the session-scoped fixture)

from dpsql.errors import DataChangedError, SchemaError
from dpsql.policy import load_policy
from dpsql.session.session import Session

pytestmark = [pytest.mark.spark, *SOCKET_WARNINGS]

SCHEMA = (("user_id", "BIGINT"), ("age", "INTEGER"), ("salary", "DOUBLE"))
ROWS = [(u, 20 + u % 50, 1000.0 + u) for u in range(60)]


def _session(folder: Path, expose: bool | None) -> Session:
    write_parquet(folder / "visits.parquet", ROWS, SCHEMA)
    table: dict[str, Any] = {"privacy_unit": "user_id", "max_groups_per_unit": 1,
                             "max_rows_per_unit_per_group": 2,
                             "columns": {"age": {"lower": 0, "upper": 100}}}  # fmt: skip
    if expose is not None:
        table["expose_undeclared"] = expose
    raw = {
        "dataset": {"id": "spark-files"},
        "data": {"tables": {"visits": str(folder / "visits.parquet")}},
        "engine": {"name": "spark", "master": "local[2]"},
        "budget": {"diagnose": False, "epsilon": "10", "query_epsilon": "1"},
        "tables": {"visits": table},
    }
    return Session(load_policy(raw, base_dir=folder))


def test_a_replaced_file_is_refused_free_on_spark(tmp_path: Path, spark: Any) -> None:  # noqa: F811
    session = _session(tmp_path, None)
    try:
        assert "salary" in session.engine.catalog["visits"]  # a Parquet file shows every column
        session.execute("SELECT COUNT(*) FROM visits", fresh=True)
        fresh = tmp_path / "fresh.parquet"
        write_parquet(fresh, [r[:2] for r in ROWS], SCHEMA[:2])
        os.replace(fresh, tmp_path / "visits.parquet")
        spent = session.budget().queries
        with pytest.raises(DataChangedError, match="table visits"):
            session.execute("SELECT COUNT(*) FROM visits", fresh=True)
        assert session.budget().queries == spent
    finally:
        session.close()


def test_undeclared_columns_hidden_on_spark(tmp_path: Path, spark: Any) -> None:  # noqa: F811
    session = _session(tmp_path, False)
    try:
        assert set(session.engine.catalog["visits"]) == {"user_id", "age"}
        with pytest.raises(SchemaError, match="salary"):
            session.execute("SELECT COUNT(*) FROM visits WHERE salary > 1000")
        assert session.execute("SELECT COUNT(*) FROM visits WHERE age > 30").rows
    finally:
        session.close()
