"""The release computed in Python (``release_post._direct``) against the scratch database.

Where post-processing only picks columns, sorts and slices, ``publish`` builds the released
table in Python; everywhere else it runs the post-processing SQL in a scratch DuckDB. Both must
give the same columns, types, rows (in the same order) and half-widths: here every query shape
the fast path takes is published both ways over generated noisy values (hostile key texts,
NULL keys of the other group, totals near and past 64 bits, NaN-free floats of any sign).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import examples, write_parquet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpsql.noise.measure import Noisy
from dpsql.plan.plans import Plan
from dpsql.policy import load_policy
from dpsql.release import post as release_post
from dpsql.release.post import Release, publish
from dpsql.session.session import Session

SCHEMA = (
    ("user_id", "BIGINT"),
    ("region", "VARCHAR"),
    ("flag", "BOOLEAN"),
    ("small", "SMALLINT"),
    ("big", "BIGINT"),
    ("day", "DATE"),
    ("age", "INTEGER"),
    ("spend", "DOUBLE"),
)
REGIONS = ["a", "B", "é", "ß", "z", "Z", "😀", "", " a", "a "]
COLUMNS: dict[str, dict[str, Any]] = {
    "region": {"public_values": REGIONS},
    "flag": {"public_values": [True, False]},
    "small": {"public_values": [-3, 0, 7]},
    "big": {"public_values": [-(2**62), 5, 2**62]},
    "day": {"public_values": ["2024-01-05", "1999-12-31", "2024-01-04"]},
    "age": {"lower": 18, "upper": 90},
    "spend": {"lower": -5, "upper": 200},
}

# Every shape the fast path takes, and two it must leave to the scratch database.
DIRECT = [
    "SELECT region, COUNT(*) AS n FROM visits GROUP BY region",
    "SELECT COUNT(*) AS n, SUM(spend) AS s, AVG(spend) AS a FROM visits",
    "SELECT region AS r, flag, SUM(spend) AS s FROM visits GROUP BY region, flag",
    "SELECT flag, region, COUNT(*) AS n FROM visits GROUP BY region, flag ORDER BY flag DESC",
    "SELECT small, COUNT(*) AS n FROM visits GROUP BY small ORDER BY n DESC LIMIT 2",
    "SELECT big, STDDEV(spend) AS sd FROM visits GROUP BY big ORDER BY sd, big DESC",
    "SELECT day, AVG(age) AS a FROM visits GROUP BY day ORDER BY a DESC NULLS FIRST",
    "SELECT COUNT(*) AS n, day FROM visits GROUP BY day ORDER BY day DESC LIMIT 2 OFFSET 1",
    "SELECT region, small, COUNT(*) AS n FROM visits GROUP BY region, small "
    "ORDER BY region NULLS FIRST, n",
]
THROUGH_SQL = [
    "SELECT region, COUNT(*) + 1 AS n FROM visits GROUP BY region",
    "SELECT region, COUNT(*) AS n FROM visits GROUP BY region HAVING COUNT(*) > 3",
]


@contextlib.contextmanager
def _scratch_only() -> Iterator[None]:
    direct = release_post._direct
    release_post._direct = lambda *args: None  # type: ignore[assignment]
    try:
        yield
    finally:
        release_post._direct = direct


def _same(a: Release, b: Release) -> None:
    assert a.columns == b.columns
    assert a.types == b.types
    assert a.confidence == b.confidence
    assert len(a.rows) == len(b.rows)
    for ra, rb in zip(a.rows, b.rows, strict=True):
        for x, y in zip(ra, rb, strict=True):
            assert type(x) is type(y)
            assert x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y))
    assert a.accuracy == b.accuracy


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], Plan]:
    folder = tmp_path_factory.mktemp("direct")
    path = folder / "visits.parquet"
    write_parquet(path, [(1, "a", True, 0, 5, dt.date(2024, 1, 5), 30, 1.0)], SCHEMA)
    policy = load_policy(
        {
            "dataset": {"id": "direct", "data_version": "1"},
            "data": {"tables": {"visits": str(path)}},
            "budget": {
                "diagnose": False,
                "epsilon": "10",
                "delta": "0.000001",
                "query_epsilon": "1",
                "query_delta": "0.00000001",
            },
            "tables": {
                "visits": {
                    "privacy_unit": "user_id",
                    "max_groups_per_unit": 2,
                    "max_rows_per_unit_per_group": 10,
                    "columns": COLUMNS,
                }
            },
        }
    )
    with contextlib.closing(Session(policy)) as session:
        return {
            (sql, other): session.plan(sql, other_group=other)
            for sql in DIRECT + THROUGH_SQL
            for other in (False, True)
        }


def _domain(plan: Plan, i: int) -> list[Any]:
    key = plan.analysis.keys[i]
    kind = key.engine_type
    texts = list(key.domain or ())
    values: list[Any] = []
    for t in texts:
        if t is None:
            values.append(None)
        elif kind == "BOOLEAN":
            values.append(t == "true")
        elif kind in ("SMALLINT", "BIGINT", "INTEGER"):
            values.append(int(t))
        elif kind == "DATE":
            values.append(dt.date.fromisoformat(t))
        else:
            values.append(t)
    if key.other:
        values.append(None)  # the other group, keyed NULL without a label
    return values


def _noisy(plan: Plan, draw: st.DrawFn) -> Noisy:
    keys = plan.analysis.keys
    if keys:
        domains = [_domain(plan, i) for i in range(len(keys))]
        cells = sorted(
            {
                tuple(draw(st.sampled_from(d)) for d in domains)
                for _ in range(draw(st.integers(1, 12)))
            },
            key=repr,
        )
        n = len(cells)
        columns = tuple(tuple(c[i] for c in cells) for i in range(len(keys)))
    else:
        n, columns = 1, ()
    big = st.integers(-(2**63), 2**63 - 1) | st.integers(-(2**70), 2**70) | st.integers(-50, 50)
    totals = tuple(
        tuple(draw(big if draw(st.booleans()) else st.integers(-50, 50)) for _ in range(n))
        for _ in plan.measurements
    )
    return Noisy(columns, totals)


@settings(
    max_examples=examples(120),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_the_python_release_is_the_scratch_databases(
    plans: dict[tuple[str, bool], Plan], data: st.DataObject
) -> None:
    for sql, other in sorted(plans):
        plan = plans[sql, other]
        noisy = _noisy(plan, data.draw)
        fast = publish(plan, noisy)
        with _scratch_only():
            slow = publish(plan, noisy)
        _same(fast, slow)


def test_the_fast_path_is_taken_where_it_applies(plans: dict[tuple[str, bool], Plan]) -> None:
    """Without this, the comparison above could pass with the fast path never taken."""
    taken = {}
    for (sql, other), plan in plans.items():
        keys = tuple((v,) for v in [_domain(plan, i)[0] for i in range(len(plan.analysis.keys))])
        noisy = Noisy(tuple(k for k in keys), tuple((1,) for _ in plan.measurements))
        values, widths, intervals = release_post._estimates(
            plan, [list(c) for c in noisy.totals], 0.95
        )
        direct = release_post._direct(plan, noisy.keys, values, widths, intervals)
        taken[sql, other] = direct is not None
    assert all(taken[sql, o] for sql in DIRECT for o in (False, True))
    assert not any(taken[sql, o] for sql in THROUGH_SQL for o in (False, True))


def test_released_types_do_not_depend_on_the_values(plans: dict[tuple[str, bool], Plan]) -> None:
    """A count is BIGINT and a BIGINT key stays BIGINT, whether the noisy values are small or
    not (the scratch database typed Python integers by their values: INTEGER when small)."""
    plan = plans[
        "SELECT small, COUNT(*) AS n FROM visits GROUP BY small ORDER BY n DESC LIMIT 2", False
    ]
    for total in (1, 2**40):
        with _scratch_only():
            release = publish(plan, Noisy(((0, 7),), ((total, total),)))
        assert release.types == ("SMALLINT", "BIGINT")
    plan = plans["SELECT region, COUNT(*) + 1 AS n FROM visits GROUP BY region", False]
    release = publish(plan, Noisy((("a",),), ((3,),)))
    assert release.types == ("VARCHAR", "BIGINT")
