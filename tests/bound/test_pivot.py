"""L0's ranking per unit in one row (``dpsql.bound.pivot``) keeps exactly the groups, and so the
totals, of the ranking window it replaces.

The pivot form is taken for counts over few public key combinations. On generated data (units
with rows in and out of the domains, NULL keys and values, units with more groups than L0 and
more rows than C), with and without the other group, at several L0 and C, every query's
bounded totals from the pivot form equal those of the window form (the same plan with
``PIVOT_CELLS`` at 0) on DuckDB; and the form is taken exactly where the rule says.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from conftest import TINY_SCHEMA, examples, write_parquet
from conftest import policy_over as tiny_policy_over
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsql.bound import pivot
from dpsql.session.session import Session

REGIONS = ("central", "east", "north", "south", "west")
BAND = "CASE WHEN age > 40 THEN 'old' WHEN age > 25 THEN 'mid' ELSE 'young' END"
# (query, the number of its public key combinations without the other group, with it)
QUERIES = (
    ("SELECT region, COUNT(*) FROM visits GROUP BY region", 5, 6),
    (
        "SELECT region, COUNT(age), COUNT(DISTINCT user_id), COUNT(*) FROM visits GROUP BY region",
        5,
        6,
    ),
    (f"SELECT {BAND} AS b, COUNT(*) FROM visits GROUP BY b", 3, 4),
    # Two keys of two types (an integer CASE key beside a text one): the combinations' hashes
    # must read each key in its own type, as the window's hash reads the row's keys.
    (
        "SELECT CASE WHEN spend > 50 THEN 1 ELSE 0 END AS hi, "
        "CASE WHEN age > 40 THEN 'old' ELSE 'young' END AS b, COUNT(*), COUNT(spend) "
        "FROM visits GROUP BY hi, b",
        4,
        9,
    ),
    # Sums are not pivoted (each row would update a sum per combination): the window stays.
    ("SELECT region, SUM(spend) FROM visits GROUP BY region", None, None),
)

row = st.tuples(
    st.integers(0, 12),
    st.sampled_from([*REGIONS, "mars", None]),
    st.one_of(st.none(), st.integers(15, 70)),
    st.one_of(st.none(), st.sampled_from([0.0, 10.5, 49.0, 51.0, 120.0, float("nan")])),
)


@contextmanager
def policy_over(rows: Sequence[tuple[Any, ...]], max_groups: int, max_rows: int) -> Iterator[Any]:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "visits.parquet"
        write_parquet(path, rows, TINY_SCHEMA)
        yield tiny_policy_over(path, max_groups=max_groups, max_rows=max_rows, dataset_id="pivot")


def bounded_totals(policy: Any, sql: str, other: bool) -> tuple[str, list[tuple[Any, ...]]]:
    """The plan's bounded SQL and its pre-noise rows, sorted (NaN-free: totals are integers)."""
    session = Session(policy)
    try:
        session.engine.salt = 7
        if other:
            session.execute("SET dpsql.other_group = on")
        plan = session.plan(sql)
        _, rows = session.engine.run(plan.engine_sql)
        return plan.engine_sql, sorted(rows, key=repr)
    finally:
        session.close()


@settings(max_examples=examples(20), deadline=None)
@given(
    rows=st.lists(row, min_size=1, max_size=80),
    heavy=st.lists(row, max_size=40).map(lambda rs: [(5, *r[1:]) for r in rs]),
    max_groups=st.integers(1, 4),
    max_rows=st.sampled_from([1, 2, 10]),
    other=st.booleans(),
)
def test_the_pivot_keeps_the_windows_groups(
    rows: list[tuple[Any, ...]],
    heavy: list[tuple[Any, ...]],
    max_groups: int,
    max_rows: int,
    other: bool,
) -> None:
    with policy_over(rows + heavy, max_groups, max_rows) as policy:
        for sql, cells, cells_other in QUERIES:
            size = cells_other if other else cells
            pivoted_sql, pivoted = bounded_totals(policy, sql, other)
            expected = size is not None and max_groups < size <= pivot.PIVOT_CELLS
            assert ("_pivot AS" in pivoted_sql) == expected, sql
            if not expected:
                continue
            saved = pivot.PIVOT_CELLS
            pivot.PIVOT_CELLS = 0
            try:
                window_sql, window = bounded_totals(policy, sql, other)
            finally:
                pivot.PIVOT_CELLS = saved
            assert "_pivot AS" not in window_sql
            assert pivoted == window, sql


def test_a_unit_keeps_its_l0_groups_of_smallest_hash() -> None:
    """One unit in every region, L0 = 2: the pivot keeps the two regions whose keyed hash
    hash(unit, region, salt) is smallest, whatever the other units hold."""
    alone = [(1, r, 30, 10.0) for r in REGIONS]
    crowd = alone + [(u, r, 30, 10.0) for u in range(2, 9) for r in REGIONS[: u % 5 + 1]]
    kept = []
    for rows in (alone, crowd):
        with policy_over(rows, 2, 10) as policy:
            session = Session(policy)
            try:
                session.engine.salt = 7
                plan = session.plan("SELECT region, COUNT(*) FROM visits GROUP BY region")
                assert "_pivot AS" in plan.engine_sql
                ctes = plan.engine_sql[: plan.engine_sql.index("_capped AS")].rstrip(", ")
                _, got = session.engine.run(f"{ctes} SELECT _k0 FROM _kept WHERE _u = 1")
                _, hashes = session.engine.run(
                    "SELECT r, hash(CAST(1 AS BIGINT), CAST(r AS VARCHAR), CAST(7 AS BIGINT)) "
                    f"FROM (VALUES {', '.join(f'({chr(39)}{r}{chr(39)})' for r in REGIONS)}) "
                    "AS t(r)"
                )
            finally:
                session.close()
        kept.append(sorted(k for (k,) in got))
        assert kept[-1] == sorted(r for r, _ in sorted(hashes, key=lambda x: x[1])[:2])
    assert kept[0] == kept[1]


@pytest.mark.parametrize("sql", [q for q, cells, _ in QUERIES if cells is not None])
def test_the_pivot_form_is_charged_like_the_window(sql: str) -> None:
    """The form changes no sensitivity and no cost: the plan's event is the same."""
    with policy_over([(1, "east", 30, 10.0)], 1, 10) as policy:
        events = []
        for cells in (pivot.PIVOT_CELLS, 0):
            saved = pivot.PIVOT_CELLS
            pivot.PIVOT_CELLS = cells
            try:
                session = Session(policy)
                try:
                    plan = session.plan(sql)
                    events.append((plan.event, "_pivot AS" in plan.engine_sql))
                finally:
                    session.close()
            finally:
                pivot.PIVOT_CELLS = saved
        assert events[0][0] == events[1][0]
        assert events[0][1] and not events[1][1]
