"""``spark_shape.reshape`` merges the split of ``caps._ranked_where_needed`` (only the units
over a cap go through the ranking window) back into the window over every unit, for Spark,
which reads a CTE once per reference, and writes literal key domains as IN lists. The claim is
that both forms return the same rows: it is checked on DuckDB itself, where both run with the
same keyed hash, so every row must match exactly, over the golden and breadth corpora (whose
data exceed L0, C and R) with their own bounds and with tighter ones, and over generated units
of every size around the cap.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import sqlglot
import test_breadth_golden as breadth
import test_rewrite_golden as golden
import test_spark_lower as spark_lower
from conftest import TINY_SCHEMA, examples, write_parquet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from spark_fixtures import duck_rows, sorted_rows
from test_spark_differential import EXTRA, breadth_world, golden_policy, golden_world

from dpsql.bound import caps, pivot
from dpsql.bound.nodes import column, first_rows
from dpsql.engine.spark.lower import lower
from dpsql.engine.spark.shape import reshape
from dpsql.errors import DpsqlError
from dpsql.session.session import Session

SALT = 11


def reshaped(sql: str) -> str:
    return reshape(sqlglot.parse_one(sql, read="duckdb")).sql(dialect="duckdb")


def split(sql: str) -> bool:
    """The bounded query splits a ranking between the units that need it and the others."""
    return " ANTI JOIN _multi " in sql or " ANTI JOIN _heavy " in sql


def _same(tables: dict[str, Path], sql: str) -> tuple[bool, bool]:
    """Both forms of ``sql`` return the same rows on DuckDB; whether a ranking was merged, and
    whether a domain was written as a list."""
    merged = reshaped(sql)
    assert not split(merged)
    assert "_multi" not in merged and "_heavy" not in merged  # their CTEs are gone too
    listed = merged.count("IN (SELECT _k") < sql.count("IN (SELECT _k")
    assert sorted_rows(duck_rows(tables, merged, SALT)) == sorted_rows(duck_rows(tables, sql, SALT))
    return split(sql), listed


def test_the_merged_ranking_keeps_the_same_rows_on_the_corpora(tmp_path: Path) -> None:
    merged = listed = 0
    world = golden_world(tmp_path / "golden", list(golden.exceeding_rows(3)))
    for path in sorted(golden.GOLDEN.glob("*.sql")):
        if path.name.endswith(".bounded.sql"):
            continue
        for l0 in (None, 1):
            try:
                plan = world.plan(path.stem, l0, None)
            except DpsqlError:
                continue
            m, li = _same(dict(world.tables), plan.engine_sql)
            merged, listed = merged + m, listed + li
    with breadth_world(tmp_path / "breadth", breadth.exceeding(5)) as bw:
        for name in [*breadth.CASES, *EXTRA]:
            for l0, r in ((None, None), (1, 2)):
                try:
                    plan = bw.plan(name, l0, r)
                except DpsqlError:
                    continue
                m, li = _same(dict(bw.tables), plan.engine_sql)
                merged, listed = merged + m, listed + li
    # The check is not vacuous: most plans rank where needed, or hold a key to a literal domain.
    assert merged >= 40 and listed >= 30, (merged, listed)


# Units of 1 to 6 rows over the tiny corpus's regions, some identical: around L0 = 2 groups
# and around R = 3 rows, so that units on both sides of each cap are generated.
UNITS = st.lists(
    st.lists(
        st.tuples(st.sampled_from(golden.TINY_REGIONS),
                  st.sampled_from([10.0, 20.0, None, math.nan, math.inf, -math.inf, -0.0, 0.0])),
        min_size=1, max_size=6,
    ),
    min_size=1, max_size=12,
)  # fmt: skip
QUERIES = (
    ("SELECT region, COUNT(*) FROM visits GROUP BY region", {}),
    ("SELECT region, SUM(spend) FROM visits GROUP BY region", {}),
    ("SELECT region, COUNT(*) FROM visits GROUP BY region", {"max_rows_per_unit": 3}),
    ("SELECT region, AVG(spend) FROM visits GROUP BY region", {"max_rows_per_unit": 3}),
    ("SELECT COUNT(*), SUM(spend) FROM visits", {"max_rows_per_unit": 3}),
)


@settings(
    max_examples=examples(10),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(units=UNITS)
def test_the_merged_ranking_keeps_the_same_rows_for_any_units(
    tmp_path: Path, units: list[list[tuple[str, float | None]]]
) -> None:
    path = tmp_path / "visits.parquet"
    write_parquet(
        path, [(u, k, 40, x) for u, rows in enumerate(units) for k, x in rows], TINY_SCHEMA
    )
    session = Session(golden_policy(path, 2))
    try:
        # Counts over these five regions rank per unit in one row (dpsql.bound.pivot), which has
        # no split to merge: the split of the window form is what is tested here.
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(pivot, "PIVOT_CELLS", 0)
            for sql, options in QUERIES:
                assert _same({"visits": path}, session.plan(sql, None, **options).engine_sql)[0]
    finally:
        session.close()


def test_other_unions_are_left_as_they_are() -> None:
    """A split whose window keeps more rows than its list of units counts (or a union of other
    queries) is not the shape the merge is proven for, and stays."""
    base = (
        "WITH _units AS (SELECT 1 AS _u, 'a' AS _k0), "
        "_multi AS (SELECT _u FROM _units GROUP BY _u HAVING COUNT(*) > {k}), "
        "_kept AS (SELECT * FROM _units ANTI JOIN _multi ON _units._u IS NOT DISTINCT FROM "
        "_multi._u UNION ALL SELECT * FROM (SELECT _units.* FROM _units SEMI JOIN _multi ON "
        "_units._u IS NOT DISTINCT FROM _multi._u) QUALIFY ROW_NUMBER() OVER (PARTITION BY _u "
        "ORDER BY hash(_u, _k0)) <= {n}) SELECT * FROM _kept"
    )
    assert not split(reshaped(base.format(k=2, n=2)))
    for k, n in ((2, 3), (3, 2)):
        assert split(reshaped(base.format(k=k, n=n)))
    # A branch that filters or computes more than the window is not the proven shape.
    filtered = base.format(k=2, n=2).replace(" QUALIFY", " WHERE _k0 <> 'b' QUALIFY")
    assert split(reshaped(filtered))
    projected = base.format(k=2, n=2).replace(
        "UNION ALL SELECT * FROM (SELECT _units.*", "UNION ALL SELECT _u, 'z' FROM (SELECT _units.*"
    )
    assert split(reshaped(projected))
    other = base.format(k=2, n=2).replace(
        "ON _units._u IS NOT DISTINCT FROM _multi._u UNION", "ON _units._k0 = _multi._u UNION"
    )
    assert split(reshaped(other))
    plain = "SELECT 1 AS a UNION ALL SELECT 2 AS a"
    assert reshaped(plain) == sqlglot.parse_one(plain).sql(dialect="duckdb")


def test_other_top_aggregates_are_left_as_they_are() -> None:
    """R's top-R split (``caps._top_where_needed``) merges into the window only where the
    aggregate keeps as many rows as its list of units counts and gives every column back as it
    is; anything else stays (and is refused by the lowering, which knows no ARG_MIN)."""
    base = (
        "WITH _all AS (SELECT 1 AS _u, 'a' AS _k0, 2.0 AS _x0), "
        "_heavy AS (SELECT _u FROM _all GROUP BY _u HAVING COUNT(*) > {k}), "
        "_rows AS (SELECT * FROM _all ANTI JOIN _heavy ON _all._u IS NOT DISTINCT FROM "
        "_heavy._u UNION ALL SELECT _u, _t['_k0'] AS _k0, _t['_x0'] AS _x0 FROM (SELECT _u, "
        "UNNEST(ARG_MIN({{'_k0': _k0, '_x0': _x0}}, {{'_o0': hash(_u, _k0, _x0), '_o1': _k0, "
        "'_o2': _x0}}, {n})) AS _t FROM (SELECT _all.* FROM _all SEMI JOIN _heavy ON "
        "_all._u IS NOT DISTINCT FROM _heavy._u) GROUP BY _u)) SELECT * FROM _rows"
    )
    merged = reshaped(base.format(k=2, n=2))
    assert not split(merged) and "ROW_NUMBER() OVER (PARTITION BY _u ORDER BY" in merged
    for k, n in ((2, 3), (3, 2)):
        assert split(reshaped(base.format(k=k, n=n)))
    swapped = base.format(k=2, n=2).replace("_t['_x0'] AS _x0", "_t['_k0'] AS _x0")
    assert split(reshaped(swapped))
    computed = base.format(k=2, n=2).replace("{'_k0': _k0, '_x0'", "{'_k0': _k0 || 'z', '_x0'")
    assert split(reshaped(computed))
    other = base.format(k=2, n=2).replace(
        "ON _all._u IS NOT DISTINCT FROM _heavy._u) GROUP", "ON _all._k0 = _heavy._u) GROUP"
    )
    assert split(reshaped(other))


def test_spark_runs_the_same_sql_for_the_top_r_form_as_for_the_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The breadth corpus's R query, bounded with today's top-R aggregate and with the window
    over the units over R that it replaced (``caps._ranked_where_needed``), lowers to the very
    same Spark SQL: both reshape into the window over every unit."""

    def bounded(name: str) -> str:
        session = Session(breadth.write_world(tmp_path / name, breadth.WITHIN, 2))
        try:
            return session.plan(breadth.sql_of("row_cap")).bounded_sql
        finally:
            session.close()

    top = bounded("top")
    monkeypatch.setattr(
        caps, "_top_where_needed",
        lambda name, needing, _names, order, r: caps._ranked_where_needed(
            name, needing, first_rows([column("_u")], order, r)),
    )  # fmt: skip
    window = bounded("window")
    assert "ARG_MIN" in top and "ARG_MIN" not in window and "ROW_NUMBER" in window
    catalog = dict(spark_lower.corpus_catalogs())[breadth.GOLDEN / "row_cap.bounded.sql"]
    assert lower(top, catalog) == lower(window, catalog)
