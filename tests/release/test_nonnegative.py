"""Counts, and sums of values bounded at or above 0, are published at 0 or above (issue: no
nonsense number without a flag); everything before publication keeps the noisy values.

What must hold:

- for any noisy measurements, a published COUNT(*), COUNT(x), COUNT(DISTINCT x) and a SUM of a
  value with both bounds at or above 0 is the noisy value where that is at or above 0, else 0;
  a SUM whose lower bound is below 0 is published as measured, negative or not;
- an AVG is computed from the noisy measurements, whatever the count beside it shows;
- a cached repeat and an answer derived from cached releases read the noisy measurements: the
  derived AVG equals the AVG computed from the unclamped measurements of the first release.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from conftest import TINY_SCHEMA, examples, policy_over, write_parquet
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsql.noise.measure import Noisy
from dpsql.release.post import publish
from dpsql.session import pipeline
from dpsql.session.session import Session

ROWS = [(u, "north", 30, 5.0) for u in range(3)]


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Session:
    path = tmp_path_factory.mktemp("nonnegative") / "visits.parquet"
    write_parquet(path, ROWS, TINY_SCHEMA)
    columns = {
        "spend": {"lower": 0, "upper": 200},
        "age": {"lower": -50, "upper": 90},
        "region": {"public_values": ["north", "south"]},
    }
    return Session(
        policy_over(path, max_groups=1, max_rows=1, columns=columns, budget={"epsilon": "1000"})
    )


QUERY = (
    "SELECT COUNT(*) AS n, COUNT(spend) AS c, COUNT(DISTINCT age) AS d, SUM(spend) AS s, "
    "SUM(age) AS a, AVG(spend) AS m FROM visits"
)


@settings(max_examples=examples(60))
@given(totals=st.lists(st.integers(-(10**6), 10**6), min_size=6, max_size=6))
def test_published_counts_and_nonnegative_sums_are_at_least_zero(
    session: Session, totals: list[int]
) -> None:
    plan = session.plan(QUERY)
    noisy = [totals[j % len(totals)] for j in range(len(plan.measurements))]
    raw = Noisy((), tuple((v,) for v in noisy))
    (row,) = publish(plan, raw).rows
    labels = [m.label for m in plan.measurements]
    n, c, d, s, a, m = row
    assert n == max(noisy[labels.index("COUNT(*)")], 0)
    assert c == max(noisy[labels.index('COUNT("spend")')], 0)
    assert d == max(noisy[labels.index('COUNT(DISTINCT "age")')], 0)
    s_unit = plan.measurements[labels.index('SUM("spend")')].unit
    assert s >= 0 and s == max(noisy[labels.index('SUM("spend")')] * s_unit, 0)
    # SUM(age), age in [-50, 90]: its truth may be negative, so it is published as measured.
    unit = plan.measurements[labels.index('SUM("age")')].unit
    assert a == noisy[labels.index('SUM("age")')] * unit
    # AVG(spend) is computed from the noisy count as it is, whatever the count beside it shows.
    avg = session.plan("SELECT AVG(spend) AS m FROM visits")
    mine = [noisy[labels.index(x.label)] for x in avg.measurements]
    (alone,) = publish(avg, Noisy((), tuple((v,) for v in mine))).rows
    assert m == alone[0] or (math.isnan(m) and math.isnan(alone[0]))  # NaN on a zero count


def test_a_negative_noisy_count_is_shown_as_zero_and_the_avg_reads_it_unclamped(
    session: Session,
) -> None:
    plan = session.plan("SELECT COUNT(spend) AS c, AVG(spend) AS m FROM visits")
    labels = [m.label for m in plan.measurements]
    count_at = labels.index('COUNT("spend")')
    noisy = [0] * len(plan.measurements)
    noisy[count_at] = -4
    centred = next(j for j, lab in enumerate(labels) if lab.startswith("SUM("))
    noisy[centred] = 16
    (row,) = publish(plan, Noisy((), tuple((v,) for v in noisy))).rows
    assert row[0] == 0
    # AVG = m + S/max(N, 1) from the noisy measurements, clamped to the bounds [0, 200].
    grid = plan.estimates[1].grid
    assert grid is not None
    centre = float(grid.centre)
    unit = float(plan.measurements[centred].unit)
    expected = min(max(centre + 16 * unit / max(-4, 1), 0.0), 200.0)
    assert row[1] == pytest.approx(expected)


def test_derived_answers_read_the_noisy_measurements(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tiny epsilon on three rows makes a negative noisy count likely (about one in two).
    Each published count is at least 0, while the AVG derived free from the cached SUM and
    COUNT is published from the very measurements released, the negative count included."""
    path = tmp_path / "visits.parquet"
    write_parquet(path, ROWS, TINY_SCHEMA)
    policy = policy_over(
        path, max_groups=1, max_rows=1, budget={"epsilon": "1000", "query_epsilon": "0.05"}
    )
    seen: list[Noisy] = []

    def spy(plan: object, noisy: Noisy) -> object:
        seen.append(noisy)
        return publish(plan, noisy)  # type: ignore[arg-type]

    monkeypatch.setattr(pipeline, "publish", spy)
    negative = 0
    for _ in range(30):
        s = Session(policy)
        try:
            seen.clear()
            first = s.execute("SELECT SUM(spend) AS s, COUNT(spend) AS c FROM visits")
            assert first.rows[0][0] >= 0 and first.rows[0][1] >= 0
            (measured,) = seen
            spent = s.budget().epsilon_spent
            derived = s.execute("SELECT AVG(spend) AS m FROM visits")
            assert derived.cached_from is not None
            assert s.budget().epsilon_spent == spent  # post-processing: free
            count = measured.totals[1]
            # The derived AVG's count is the released measurement itself; its centred sum is
            # rebuilt from the noisy SUM and that count (S - m·N), negative count included.
            assert count in seen[-1].totals
            if count[0] < 0:
                negative += 1
        finally:
            s.close()
    assert negative > 0
