"""Neighbours under a person-within-period unit (``dpsql.policy.periods``).

- **A person-period.** D' adds the rows of one person in one period (a person of D who has no
  row in that period, or a new one). A query that does not read the period is unchanged to the
  row; one that reads it moves each bounded total by at most the plan's unit-level sensitivity
  (``_check`` of tests/privacy/test_neighbours.py): the period's own budget is sound.
- **A person.** D' adds one new person with rows in up to every period. Each bounded total moves
  by at most |P| times the unit-level sensitivity (|P| the periods the query reads), which is
  the sensitivity the lifetime cap is charged at (``dpsql.mechanisms.group``).
- **The lifetime figure.** Over a run of queries on ranges of periods, the lifetime figure is at
  least the loss of a person in any set of m periods: sum over queries of epsilon times the
  periods of the set that the query read.
"""

from __future__ import annotations

import datetime as dt
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from conftest import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_blocks_neighbours import MONTHS, REGIONS, Row, _base
from test_blocks_neighbours import _session as blocks_session
from test_neighbours import _check, _groups

from dpsql.mechanisms.group import for_group
from dpsql.session.session import Session

QUERIES = [
    "SELECT region, COUNT(*) AS n, SUM(spend) AS s FROM visits GROUP BY region",
    "SELECT region, COUNT(*) AS n FROM visits WHERE day < DATE '2026-03-01' GROUP BY region",
    "SELECT COUNT(*), AVG(spend) FROM visits WHERE day >= '2026-02-01'",
    "SELECT COUNT(*) AS n FROM visits WHERE day >= '2026-03-01'",
    "SELECT region, SUM(spend) FROM visits WHERE day < '2026-02-01' GROUP BY region",
]
NEW = 999
SETTINGS = settings(
    max_examples=examples(12),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


PERIODS = {"table": "visits", "epsilon": "50"}


def _session(folder: Path, months: list[list[Row]], capped: bool) -> Session:
    """test_blocks_neighbours's session, under a person-within-period unit."""
    return blocks_session(folder, months, capped, PERIODS)


@st.composite
def rows_in(draw: st.DrawFn, month: int, unit: int) -> list[Row]:
    start = MONTHS[month][0]
    return [
        (unit, draw(st.sampled_from(REGIONS)), draw(st.floats(-10, 300)),
         start + dt.timedelta(draw(st.integers(0, 27))))
        for _ in range(draw(st.integers(1, 7)))
    ]  # fmt: skip


def _totals(
    tmp: pytest.TempPathFactory,
    d: list[list[Row]],
    d_prime: list[list[Row]],
    sql: str,
    capped: bool,
) -> tuple[Any, list[Any], list[Any]]:
    one = _session(tmp.mktemp("d"), d, capped)
    two = _session(tmp.mktemp("d_prime"), d_prime, capped)
    try:
        plan = one.plan(sql)
        again = two.plan(sql)
        assert again.engine_sql == plan.engine_sql and again.blocks == plan.blocks
        two.engine.salt = one.engine.salt  # the same keyed hash picks every other unit's rows
        return plan, one.engine.run(plan.engine_sql)[1], two.engine.run(plan.engine_sql)[1]
    finally:
        one.close()
        two.close()


@SETTINGS
@given(data=st.data(), sql=st.sampled_from(QUERIES), capped=st.booleans(),
       at=st.tuples(st.integers(0, 2), st.integers(0, 5)))  # fmt: skip
def test_one_more_person_period_moves_only_its_period_within_the_unit_sensitivity(
    tmp_path_factory: pytest.TempPathFactory,
    data: st.DataObject,
    sql: str,
    capped: bool,
    at: tuple[int, int],
) -> None:
    month, seed = at
    base = _base(seed)
    # The person is one of D's in the other periods (or new), with no row in ``month`` in D.
    person = data.draw(st.sampled_from([NEW, *range(30)]))
    base[month] = [r for r in base[month] if r[0] != person]
    for other in range(3):
        if other != month and person == NEW:
            base[other] = base[other] + data.draw(rows_in(other, NEW))
    added = data.draw(rows_in(month, person))
    d_prime = [b + added if i == month else b for i, b in enumerate(base)]
    plan, before, after = _totals(tmp_path_factory, base, d_prime, sql, capped)
    ((_, read),) = plan.blocks
    if f"m{month}" not in read:
        assert sorted(before) == sorted(after)  # a period it does not read: nothing moves
    else:
        _check(plan, before, after)


@SETTINGS
@given(data=st.data(), sql=st.sampled_from(QUERIES), capped=st.booleans(),
       seed=st.integers(0, 5))  # fmt: skip
def test_one_more_person_in_several_periods_moves_totals_within_the_charged_sensitivity(
    tmp_path_factory: pytest.TempPathFactory,
    data: st.DataObject,
    sql: str,
    capped: bool,
    seed: int,
) -> None:
    base = _base(seed)
    months = data.draw(st.sets(st.integers(0, 2), min_size=1))
    d_prime = [b + data.draw(rows_in(i, NEW)) if i in months else b for i, b in enumerate(base)]
    plan, before, after = _totals(tmp_path_factory, base, d_prime, sql, capped)
    ((_, read),) = plan.blocks
    k = max(1, len(read))
    person = for_group(plan.event, k)
    d, dp = _groups(plan, before), _groups(plan, after)
    for j, m in enumerate(plan.measurements):
        moved = [
            abs(int(dp.get(g, (None,) * len(plan.measurements))[j] or 0)
                - int(d.get(g, (None,) * len(plan.measurements))[j] or 0))
            for g in d.keys() | dp.keys()
        ]  # fmt: skip
        assert sum(moved) <= k * m.sensitivity, (m.label, moved, k)
        assert max(moved, default=0) <= k * m.per_group
    # What the lifetime cap is charged: each event at k times the unit's sensitivity.
    for unit, charged in zip(plan.event.events, person.events, strict=True):
        if hasattr(unit, "sensitivity"):
            assert charged.sensitivity == k * unit.sensitivity  # type: ignore[attr-defined]
    assert person.epsilon >= k * plan.event.epsilon * Fraction(999999, 10**6)


QUERY_RANGES = [("2026-01-01", "2026-02-01"), ("2026-01-01", "2026-04-01"),
                ("2026-02-01", "2026-04-01"), ("2026-03-01", "2026-04-01")]  # fmt: skip


@settings(max_examples=examples(10), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(
    asked=st.lists(st.tuples(st.sampled_from(QUERY_RANGES),
                             st.sampled_from(["0.1", "0.25", "0.5"])), min_size=1, max_size=6),
    present=st.sets(st.integers(0, 2), min_size=1),
)  # fmt: skip
def test_the_lifetime_figure_covers_a_person_in_any_periods(
    tmp_path_factory: pytest.TempPathFactory,
    asked: list[tuple[tuple[str, str], str]],
    present: set[int],
) -> None:
    """The person is in the periods ``present`` (m = |present|); each query's true loss for
    them is its epsilon times the periods of ``present`` it read (the Laplace mechanism at that
    many units' shift); the lifetime figure must be at least their sum."""
    session = _session(tmp_path_factory.mktemp("life"), _base(1), False)
    try:
        loss = Fraction(0)
        for i, ((start, end), eps) in enumerate(asked):
            sql = (f"SELECT SUM(age) AS a{i} FROM visits WHERE day >= '{start}' "
                   f"AND day < '{end}'")  # fmt: skip
            result = session.execute(sql, epsilon=eps, fresh=True)
            assert result.charge is not None
            ((_, read),) = session.plan(sql, epsilon=eps).blocks
            mine = sum(1 for m in present if f"m{m}" in read)
            loss += Fraction(eps) * mine
        assert session.budget().epsilon_spent >= loss
    finally:
        session.close()
