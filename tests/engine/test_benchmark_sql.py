"""The hand-written bounded SQL of benchmarks/queries.py returns dpsql's pre-noise totals.

The benchmark compares dpsql with that SQL ("(b)"), so the comparison is only fair if both
compute the same numbers: same grid, clamp, per-unit pre-aggregation, L0 ranking by the salted
hash and C-capping. Checked here per group and measurement on a small version of the
benchmark data (same generator, 20k rows).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import duckdb
import pytest

from dpsql.policy import load_policy
from dpsql.session.session import Session

QUERIES_PY = Path(__file__).resolve().parents[2] / "benchmarks" / "queries.py"


def _load_queries() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dpsql_benchmark_queries", QUERIES_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being created
    spec.loader.exec_module(module)
    return module


Q = _load_queries()


def _session(path: Path) -> Session:
    return Session(load_policy(Q.policy_dict(path)))


@pytest.fixture(scope="module")
def bench_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bench") / "visits.parquet"
    Q.write_visits(path, 20_000, 2_000)
    return path


def _compare(session: Session, query: object, salt: int | None = None) -> None:
    plan = session.plan(query.sql)  # type: ignore[attr-defined]
    assert tuple(m.spec.kind for m in plan.measurements) == query.kinds  # type: ignore[attr-defined]
    bounds = Q.Bounds(salt=session.engine.salt if salt is None else salt)
    for estimate in plan.estimates:
        assert estimate.grid is None or estimate.grid.step == bounds.step
    _, ours = session.engine.run(plan.bounded_sql)
    _, hand = session.engine.run(query.bounded(bounds))  # type: ignore[attr-defined]
    keyed = query.keyed  # type: ignore[attr-defined]
    assert Q.totals(hand, keyed) == Q.totals(ours, keyed)


def test_generator_is_exact_and_skewed(bench_data: Path) -> None:
    con = duckdb.connect(":memory:")
    try:
        n, units, biggest, over_c = con.execute(
            "SELECT SUM(c), COUNT(*), MAX(c), COUNT(*) FILTER (WHERE c > 10) FROM "
            f"(SELECT user_id, COUNT(*) AS c FROM read_parquet('{bench_data}') GROUP BY ALL)"
        ).fetchone()  # type: ignore[misc]
        columns = con.execute(f"DESCRIBE SELECT * FROM read_parquet('{bench_data}')").fetchall()
    finally:
        con.close()
    assert (n, units) == (20_000, 2_000)
    assert biggest > 100 and over_c > 0  # C = 10 binds for some units
    assert [(c[0], c[1]) for c in columns] == [
        ("user_id", "BIGINT"),
        ("region", "VARCHAR"),
        ("age", "INTEGER"),
        ("spend", "DOUBLE"),
        ("day", "DATE"),
    ]


@pytest.mark.parametrize("query", Q.QUERIES, ids=lambda q: q.name)
def test_hand_written_sql_matches_dpsql(bench_data: Path, query: object) -> None:
    session = _session(bench_data)
    try:
        _compare(session, query)
    finally:
        session.close()


@pytest.mark.parametrize("salt", [5, 2**61 + 12345])
def test_ranking_uses_the_salt(bench_data: Path, salt: int) -> None:
    """Small and large salts (INTEGER vs BIGINT literals) rank the same in both SQLs."""
    session = _session(bench_data)
    try:
        session.engine.salt = salt
        for query in Q.QUERIES:
            _compare(session, query, salt)
    finally:
        session.close()


def test_null_values_are_not_counted(tmp_path: Path) -> None:
    """AVG(spend) over NULL spends: SQL ignores NULLs, and so do (b) and dpsql.

    Regression: dpsql's clamp used DuckDB's GREATEST/LEAST, which skip NULL arguments
    (GREATEST(NULL, 0) = 0), so a NULL value was counted as the lower bound.
    """
    path = tmp_path / "nulls.parquet"
    con = duckdb.connect(":memory:")
    try:
        con.execute(
            "COPY (SELECT i AS user_id, 'east' AS region, 40 AS age, "
            "CASE WHEN i % 2 = 0 THEN NULL ELSE 100.0 END::DOUBLE AS spend, "
            f"DATE '2026-01-01' AS day FROM range(1, 201) t(i)) TO '{path}' (FORMAT PARQUET)"
        )
    finally:
        con.close()
    session = _session(path)
    try:
        avg = next(q for q in Q.QUERIES if q.name == "avg_age30_by_region")
        _compare(session, avg)
    finally:
        session.close()
