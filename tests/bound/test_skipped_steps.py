"""A bounding step the plan skips must change nothing: the totals equal those of the full
pipeline (R's window, L0's ranking, the per-unit pre-aggregation and C's cap all run), on data
generated to make every bound bind, NULLs, NaN and a NULL unit included.

The sensitivities never depend on what is skipped (they are the bounds'), so equal totals make
the skipping exactly as private as the full query; ``test_neighbours`` checks the sensitivities.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
import sqlglot
from conftest import TINY_BUDGET, TINY_COLUMNS, TINY_SCHEMA, examples, write_parquet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpsql.bound.rewrite import bounded_query
from dpsql.errors import BoundsError
from dpsql.plan.plans import Plan
from dpsql.policy import load_policy
from dpsql.session.session import Session

REGIONS = ("central", "east", "north", "south", "west")
QUERIES = [
    "SELECT COUNT(*) FROM visits",
    "SELECT COUNT(DISTINCT user_id) FROM visits",
    "SELECT COUNT(*), COUNT(DISTINCT user_id) FROM visits WHERE age > 40",
    "SELECT region, COUNT(*) FROM visits GROUP BY region",
    "SELECT region, SUM(spend), AVG(spend) FROM visits GROUP BY region",
    "SELECT region, STDDEV(spend), COUNT(spend) FROM visits GROUP BY region",
    "SELECT region, COUNT(DISTINCT user_id) FROM visits GROUP BY region",
    "SELECT region, COUNT(DISTINCT age) FROM visits GROUP BY region",
    "SELECT region, MEDIAN(spend) FROM visits GROUP BY region",
    "SELECT SUM(spend), VAR_POP(age) FROM visits",
    "SELECT COUNT(DISTINCT user_id), SUM(spend) FROM visits",
    "SELECT CASE WHEN age < 30 THEN 'y' ELSE 'o' END AS b, COUNT(*) FROM visits GROUP BY b",
    "SELECT COUNT(*), SUM(LEAST(n, 20)) FROM "
    "(SELECT user_id, COUNT(*) AS n FROM visits GROUP BY user_id)",
    "SELECT region, COUNT(*) FROM visits WHERE spend > 10 GROUP BY region",
]

ROW = st.tuples(
    st.one_of(st.integers(0, 5), st.none()),
    st.one_of(st.sampled_from(REGIONS), st.none(), st.just("elsewhere")),
    st.one_of(st.integers(0, 120), st.none()),
    st.one_of(st.floats(-50, 400, allow_nan=False), st.just(math.nan), st.none()),
)


def _full(plan: Plan) -> str:
    """The same plan with every step run: the reference the skipped form must equal."""
    assert plan.bounding is not None
    r = plan.options.max_rows_per_unit
    full = replace(
        plan.bounding,
        max_groups=plan.max_groups if plan.analysis.keys else None,
        max_total_rows=r,
        direct=False,
    )
    return bounded_query(plan.analysis, full)


def _normal(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    def value(v: Any) -> Any:
        if isinstance(v, dict):
            return tuple(sorted(v.items()))
        if isinstance(v, float) and math.isnan(v):
            return "nan"
        return v

    return sorted((tuple(value(v) for v in r) for r in rows), key=repr)


@pytest.mark.parametrize("query", QUERIES)
@settings(
    max_examples=examples(15),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    rows=st.lists(ROW, min_size=0, max_size=60),
    r=st.sampled_from([None, 1, 2, 3, 5, 12]),
    c=st.sampled_from([None, 1, 3, 20]),
    l0=st.sampled_from([None, 1, 2, 5]),
)
def test_skipped_steps_keep_the_totals(
    *,
    tmp_path_factory: pytest.TempPathFactory,
    rows: list[tuple[Any, ...]],
    query: str,
    r: int | None,
    c: int | None,
    l0: int | None,
) -> None:
    if c is None and r is None:
        return  # no C anywhere: refused, as test_plans checks
    path = tmp_path_factory.mktemp("skip") / "visits.parquet"
    write_parquet(path, rows, TINY_SCHEMA)
    bounds = {"max_rows_per_unit": r, "max_rows_per_unit_per_group": c,
              "max_groups_per_unit": l0}  # fmt: skip
    table = {"privacy_unit": "user_id", "columns": TINY_COLUMNS}
    table.update({k: v for k, v in bounds.items() if v is not None})
    policy = load_policy({"dataset": {"id": "skip"}, "data": {"tables": {"visits": str(path)}},
                          "budget": TINY_BUDGET, "tables": {"visits": table}})  # fmt: skip
    session = Session(policy)
    try:
        try:
            plan = session.plan(query)
        except BoundsError:
            assert l0 is None and r is None and "GROUP BY" in query
            return
        skipped = session.engine.run(plan.engine_sql)[1]
        full = session.engine.run(_full(plan))[1]
        assert _normal(skipped) == _normal(full), (plan.skipped, query)
    finally:
        session.close()


@pytest.mark.parametrize(
    ("query", "r", "expected"),
    [
        ("SELECT COUNT(*) FROM visits", 5, ("R = 5",)),
        ("SELECT COUNT(DISTINCT user_id) FROM visits", 5, ("R = 5",)),
        ("SELECT SUM(spend) FROM visits", 5, ()),
        ("SELECT SUM(spend) FROM visits", 2, ("per-unit pre-aggregation",)),
        ("SELECT region, COUNT(*) FROM visits GROUP BY region", 2, ("L0 ranking", "per-unit")),
        ("SELECT region, COUNT(*) FROM visits GROUP BY region", 4, ()),
    ],
)
def test_explain_names_each_skipped_step(
    tiny_policy: Any, query: str, r: int, expected: tuple[str, ...]
) -> None:
    """L0 = 2 and C = 3 here: R = 5 cannot skip C for a sum (C' = 3 < 5 rows) but no count
    depends on which rows R keeps; R = 2 skips L0 (a unit's 2 rows are at most 2 groups) and C
    (2 <= 3); R = 4 skips neither."""
    session = Session(tiny_policy([(1, "east", 30, 1.0)], max_groups=2, max_rows=3))
    try:
        plan = session.plan(query, max_rows_per_unit=r)
        lines = [line for line in plan.explain() if line.startswith("skipped: ")]
        assert len(lines) == len(expected), lines
        for line, start in zip(lines, expected, strict=True):
            assert line.startswith("skipped: " + start), line
    finally:
        session.close()


@settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    copies=st.lists(
        st.tuples(
            st.one_of(st.integers(0, 2), st.none()), st.sampled_from(REGIONS[:3]), st.integers(1, 6)
        ),
        max_size=12,
    ),
    r=st.integers(1, 9),
)
def test_counting_copies_keeps_what_the_row_window_keeps(
    tmp_path_factory: pytest.TempPathFactory, copies: list[tuple[Any, str, int]], r: int
) -> None:
    """A query reading no value caps R on (unit, key) rows weighted by their copies: per unit
    and key, exactly as many rows as R's window over the rows themselves keeps (ordered by the
    keyed hash, ties by the key), a NULL unit being one unit."""
    rows = [(unit, region, 30, 1.0) for unit, region, n in copies for _ in range(n)]
    path = tmp_path_factory.mktemp("weighted") / "visits.parquet"
    write_parquet(path, rows, TINY_SCHEMA)
    table = {"privacy_unit": "user_id", "columns": TINY_COLUMNS, "max_rows_per_unit": r}
    policy = load_policy({"dataset": {"id": "w"}, "data": {"tables": {"visits": str(path)}},
                          "budget": TINY_BUDGET, "tables": {"visits": table}})  # fmt: skip
    session = Session(policy)
    try:
        plan = session.plan("SELECT region, COUNT(*) FROM visits GROUP BY region")
        tree = sqlglot.parse_one(plan.engine_sql, read="duckdb")
        # With R >= the 5 regions, the copies are counted (_w); below, rows are ranked.
        n = "SUM(_w)" if r >= len(REGIONS) else "COUNT(*)"
        assert ("_w" in plan.engine_sql) == (r >= len(REGIONS))
        probe = sqlglot.parse_one(f"SELECT _u, _k0, {n} FROM _rows GROUP BY ALL", read="duckdb")
        probe.set("with_", tree.args.get("with_") or tree.args.get("with"))
        kept = session.engine.run(probe.sql(dialect="duckdb"))[1]
        domain = ", ".join(f"'{x}'" for x in REGIONS)
        window = (
            "SELECT _u, _k0, COUNT(*) FROM (SELECT user_id AS _u, region AS _k0 FROM visits "
            f"WHERE region IN ({domain}) QUALIFY ROW_NUMBER() OVER (PARTITION BY _u ORDER BY "
            f"hash(_u, _k0, CAST($salt AS BIGINT)), _k0) <= {r}) GROUP BY ALL"
        )
        assert _normal(kept) == _normal(session.engine.run(window)[1])
    finally:
        session.close()
