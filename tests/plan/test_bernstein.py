"""VARIANCE and STDDEV from one Bernstein vector (``dpsql.plan.aggregates.bernstein``), the
Laplace's default (``dpsql.moments = 'joint'``).

Checked here: where the vector is used and where Q, S and N stay apart; the exact totals where
no bound binds; every (unit, group) cell's vector non-negative with L1 exactly 4w²·c, hostile
units with scaled cells included (the sensitivity's premise); the interval holding the true
variance whenever the three noises lie in the ball it is drawn for; that ball's radius; the
coverage end to end. The neighbouring-data-set checks are in tests/privacy (test_neighbours:
the vector's L1 on generated neighbours; test_privacy_statistical: an audit at epsilon 1).
"""

from __future__ import annotations

import dataclasses
import math
import random
from fractions import Fraction
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats
from test_variance import (
    L0,
    REGIONS,
    C,
    duckdb_var_pop,
    make_policy,
    reference_variance,
    run,
    small_rows,
)

from dpsql.bound.grid import Grid
from dpsql.bound.specs import MeasurementSpec
from dpsql.bound.values import bernstein as cell_vector
from dpsql.mechanisms.laplace_events import DiscreteLaplace
from dpsql.plan.aggregates import bernstein
from dpsql.plan.aggregates.spreads import _spread
from dpsql.plan.estimators import half_width
from dpsql.plan.plans import Estimate, Measurement, Plan
from dpsql.session.session import Session
from dpsql.session.workload_plan import plan_workload
from dpsql.session.workloads import run_workload
from dpsql.sql.parse import DIALECT
from dpsql.sql.split import split_statements

SPREADS = ("var_pop", "var_samp", "stddev_pop", "stddev_samp")


def _with_ctes(plan: Plan, select: str) -> str:
    ctes = ", ".join(cte.sql(dialect=DIALECT) for cte in plan.bounded.ctes)
    return f"WITH {ctes} {select}"


def test_a_variance_is_one_vector_under_the_laplace(tmp_path: Path) -> None:
    policy = make_policy(tmp_path, small_rows())
    session = Session(policy)
    plan = session.plan("SELECT region, VAR_POP(spend), STDDEV(spend) FROM visits GROUP BY 1")
    assert [(m.spec.kind, m.spec.part) for m in plan.measurements] == [
        ("bernstein", 0), ("bernstein", 1), ("bernstein", 2)
    ]  # fmt: skip
    assert all(e.joint and e.measurements == (0, 1, 2) for e in plan.estimates)
    grid = plan.estimates[0].grid
    assert grid is not None
    w = grid.width
    for m in plan.measurements:
        # The whole vector's L1: a row's three coordinates sum to 4w² (units of (g/2)²), that is
        # (hi - lo)² = 200² in value units, C rows a group, L0 groups.
        assert m.per_group == C * 4 * w * w
        assert m.sensitivity * m.unit == L0 * C * 200**2
        assert m.scale == plan.measurements[0].scale
    # One event for the three coordinates, of the query's whole epsilon.
    (only,) = plan.event.events
    assert isinstance(only, DiscreteLaplace) and only.dimensions == 3 * L0
    assert only.epsilon == plan.epsilon == 1
    assert sum("noised as one vector" in line for line in plan.explain()) == 3
    # Where the vector does not apply, or does not gain: Q, S and N apart.
    separate = {"centred_squares", "centred", "count"}
    for sql, options in (
        ("SELECT VAR_POP(spend) FROM visits", {"moments": "separate"}),
        ("SELECT VAR_POP(spend) FROM visits", {"mechanism": "gaussian", "delta": 1e-8}),
        ("SELECT AVG(spend), VAR_POP(spend) FROM visits", {}),
        ("SELECT VAR_POP(spend) FROM visits", {"sample_rate": Fraction(1, 2)}),
        ("SELECT VAR_POP(spend) FROM visits", {"halfwidth": 20000, "min_group": 40}),
    ):
        kinds = {m.spec.kind for m in session.plan(sql, **options).measurements}  # type: ignore[arg-type]
        assert kinds == separate, (sql, options, kinds)
    # A query with both: the vector for one value, the AVG's measurements for the other.
    both = session.plan("SELECT AVG(age), STDDEV(spend) FROM visits")
    assert sorted(m.spec.kind for m in both.measurements) == sorted(
        ["centred", "count", "bernstein", "bernstein", "bernstein"]
    )
    assert len(both.event.events) == 3 and both.epsilon == 1


def test_totals_are_exact_where_no_bound_binds(tmp_path: Path) -> None:
    rows = small_rows()
    policy = make_policy(tmp_path, rows)
    plan = Session(policy).plan("SELECT region, VAR_POP(spend) FROM visits GROUP BY region")
    grid = plan.estimates[0].grid
    assert grid is not None
    w, m = grid.width, grid.lower + grid.upper
    got = {r[0]: r[1:] for r in run(policy, plan.engine_sql)}
    for region in REGIONS:
        xs = [spend for _, g, spend, _ in rows if g == region and spend is not None]
        centred = [int(2 * Fraction(x) / grid.step) - m for x in xs]
        expected = (
            sum((w - a) ** 2 for a in centred),
            sum(2 * (w * w - a * a) for a in centred),
            sum((w + a) ** 2 for a in centred),
        )
        assert tuple(got[region]) == expected
        # Without noise, the estimator is DuckDB's var_pop (up to float rounding).
        q, s, n = bernstein.moments([np.array([float(b)]) for b in expected], w)
        half = float(grid.step) / 2
        var = float((q[0] / n[0] - (s[0] / n[0]) ** 2) * half * half)
        assert var == pytest.approx(duckdb_var_pop(xs), rel=1e-9, abs=1e-9)


HOSTILE = st.sampled_from([0.0, 200.0, 199.5, 100.25, -3.0, 250.0, 1e12, -1e12,
                           float("nan"), float("inf"), float("-inf"), None, 37.125])  # fmt: skip


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    units=st.lists(
        st.tuples(st.sampled_from(REGIONS), st.integers(1, 40), HOSTILE, HOSTILE),
        min_size=1,
        max_size=12,
    )
)
def test_every_cell_is_a_non_negative_vector_of_l1_4w2c(
    tmp_path_factory: pytest.TempPathFactory, units: list[tuple[str, int, Any, Any]]
) -> None:
    """Each (unit, group) cell's vector, scaled cells (more than C rows) of hostile values
    included: three non-negative coordinates summing to exactly 4w²·c, c <= C its kept rows
    (the L1 sensitivity's premise, docs/privacy.md). A unit's rows alternate two values."""
    rows = [
        (u, region, (a, b)[r % 2], 30)
        for u, (region, n, a, b) in enumerate(units)
        for r in range(n)
    ]
    policy = make_policy(tmp_path_factory.mktemp("cells"), rows)
    plan = Session(policy).plan("SELECT region, VAR_SAMP(spend) FROM visits GROUP BY region")
    grid = plan.estimates[0].grid
    assert grid is not None and plan.measurements[0].spec.kind == "bernstein"
    i = plan.measurements[0].spec.value
    assert i is not None
    parts = ", ".join(cell_vector(i, grid, p).sql(dialect=DIALECT) for p in range(3))
    cells = run(policy, _with_ctes(plan, f"SELECT _c{i}, {parts} FROM _capped"))
    assert cells
    w = grid.width
    for c, b0, b1, b2 in cells:
        assert min(b0, b1, b2) >= 0, (c, b0, b1, b2)
        assert b0 + b1 + b2 == 4 * w * w * c and c <= C


def _measurements(scale: Fraction, grid: Grid) -> list[Measurement]:
    return [
        Measurement(MeasurementSpec("bernstein", 0, part=p), f"b{p}", 4 * grid.width**2, 1,
                    (grid.step / 2) ** 2, scale=scale)
        for p in range(3)
    ]  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(st.integers(0, 16), min_size=1, max_size=30),
    scale=st.sampled_from([Fraction(1, 2), Fraction(3), Fraction(40), Fraction(2000)]),
    direction=st.tuples(st.integers(-50, 50), st.integers(-50, 50), st.integers(-50, 50)),
    reach=st.sampled_from([0.0, 0.3, 0.9, 1.0]),
    kind=st.sampled_from(SPREADS),
)
def test_the_interval_holds_the_true_variance_for_noise_in_the_ball(
    values: list[int], scale: Fraction, direction: tuple[int, int, int], reach: float, kind: str
) -> None:
    """For true totals of any data and any noise z with |z0| + |z1| + |z2| <= t (the ball the
    interval is drawn for, up to its surface), value ± half-width holds the estimator at the true
    totals (``_spread``'s range over the ball, exactly checked)."""
    grid = Grid(Fraction(1), 0, 16)  # values 0..16, centred a = 2v - 16 in ±16: w = 16
    w = grid.width
    centred = [2 * v - 16 for v in values]
    truth = [sum((w - a) ** 2 for a in centred), sum(2 * (w * w - a * a) for a in centred),
             sum((w + a) ** 2 for a in centred)]  # fmt: skip
    t = bernstein.l1_radius(scale, 0.95)
    norm = sum(abs(d) for d in direction) or 1
    z = [math.floor(d * reach * t / norm) if d > 0 else -math.floor(-d * reach * t / norm)
         for d in direction]  # fmt: skip
    assert sum(abs(x) for x in z) <= t
    noisy = [np.array([float(b + e)]) for b, e in zip(truth, z, strict=True)]
    estimate = Estimate(kind, (0, 1, 2), grid, joint=True)  # type: ignore[arg-type]
    value, width = _spread(estimate, _measurements(scale, grid), noisy, 0.95)
    q = Fraction(truth[0] + truth[2] - truth[1], 4)
    s = Fraction(truth[2] - truth[0], 4 * w)
    n = Fraction(sum(truth), 4 * w * w)
    exact = reference_variance(kind, (q, s, n), grid)
    low, high = (
        Fraction(float(value[0])) - Fraction(float(width[0])),
        Fraction(float(value[0])) + Fraction(float(width[0])),
    )
    if kind.startswith("stddev"):
        assert (low <= 0 or low * low <= exact) and exact <= high * high
    else:
        assert low <= exact <= high


@pytest.mark.parametrize("scale", [0.5, 1.0, 3.0, 10.0, 60.0])
@pytest.mark.parametrize("confidence", [0.5, 0.9, 0.95, 0.99])
def test_the_l1_radius_is_a_sound_and_tight_quantile(scale: float, confidence: float) -> None:
    """P(|Z0| + |Z1| + |Z2| <= t) >= c, by the exact convolution of three discrete Laplace
    pmfs, and t within 3 of the exact quantile."""
    p = math.exp(-1 / scale)
    top = int(80 * scale) + 60
    pmf = np.array([(1 - p) / (1 + p)] + [2 * (1 - p) / (1 + p) * p**m for m in range(1, top)])
    cdf = np.cumsum(np.convolve(np.convolve(pmf, pmf), pmf))
    t = bernstein.l1_radius(Fraction(scale), confidence)
    assert cdf[t] >= confidence
    assert t - int(np.searchsorted(cdf, confidence)) <= 3


COVERAGE_GROUPS = tuple(f"g{i:02d}" for i in range(20))


def coverage_policy(tiny_policy: Any, seed: int) -> Any:
    """4,000 users of 1 to 3 rows each in one of 20 groups, ages in [18, 90]: no bound binds
    (L0 = 1, C = 3), so a noise-free answer is the plain SQL's."""
    rng = random.Random(seed)
    rows = [
        (user, COVERAGE_GROUPS[user % len(COVERAGE_GROUPS)], rng.randint(18, 90), 1.0)
        for user in range(len(COVERAGE_GROUPS) * 200)
        for _ in range(rng.randint(1, 3))
    ]
    columns = {"age": {"lower": 18, "upper": 90}, "region": {"public_values": COVERAGE_GROUPS}}
    return tiny_policy(rows, max_groups=1, max_rows=3, columns=columns,
                       budget={"epsilon": "10000", "query_epsilon": "10"})  # fmt: skip


def plain_sql(policy: Any, select: str) -> dict[Any, tuple[Any, ...]]:
    """``SELECT region, <select> ... GROUP BY region`` on the policy's file by DuckDB, by group."""
    con = duckdb.connect(":memory:")
    try:
        rows = con.execute(
            f"SELECT region, {select} FROM read_parquet(?) GROUP BY region",
            [str(policy.data.tables["visits"])],
        ).fetchall()
    finally:
        con.close()
    return {r[0]: tuple(r[1:]) for r in rows}


def covers(errors: list[float], widths: list[float], scale: float) -> bool:
    """Whether ±``scale``·width covering the errors is plausible at 95 % (a one-sided binomial
    test at 1e-6)."""
    covered = sum(e <= scale * w for e, w in zip(errors, widths, strict=True))
    return float(stats.binom.cdf(covered, len(errors), 0.95)) >= 1e-6


@pytest.mark.statistical
@pytest.mark.parametrize("aggregate", ["VAR_SAMP", "STDDEV_POP"])
def test_half_width_coverage_end_to_end(aggregate: str, tiny_policy: Any) -> None:
    """As tests/plan/test_variance.py's, on the vector: the noise-free value lies in value ±
    half-width in at least 95 % of 2 400 draws (one-sided binomial test at 1e-6), and the
    same test rejects the half-widths shrunk to 40 % (measured: 99.8 % covered at 1, 88 % at
    0.4; the widths about half the separate measurements', as the errors are)."""
    policy = coverage_policy(tiny_policy, 11)
    truth = {g: v for g, (v,) in plain_sql(policy, f"{aggregate}(age)").items()}
    session = Session(policy)
    sql = f"SELECT region, {aggregate}(age) FROM visits GROUP BY region"
    assert session.plan(sql).measurements[0].spec.kind == "bernstein"
    errors, widths = [], []
    for _ in range(120):
        result = session.execute(sql, fresh=True, confidence=0.95)
        for (group, value), (_, width) in zip(result.rows, result.accuracy, strict=True):
            assert width is not None
            errors.append(abs(value - truth[group]))
            widths.append(width)

    assert covers(errors, widths, 1.0)
    assert not covers(errors, widths, 0.4)


def test_a_variance_is_served_again_whatever_form_released_it(tmp_path: Path) -> None:
    """A release of either form serves the same variance again, free (post-processing): asked
    after a release measured apart, and a file's statement (planned apart) after a vector's
    release. A later AVG of the value is derived from the vector, free
    (tests/cache/test_from_vector.py)."""
    policy = make_policy(tmp_path, small_rows())
    sql = "SELECT region, VAR_SAMP(spend), STDDEV(spend) FROM visits GROUP BY region"
    session = Session(policy)
    apart = session.execute(sql, moments="separate")
    assert apart.charge is not None
    # What EXPLAIN-like commands show is the plan that would run: the release's.
    assert session.served_from(session.plan(sql)) is not None
    again = session.execute(sql)
    assert again.charge is None and again.cached_from is not None
    assert again.rows == apart.rows
    other = Session(make_policy(tmp_path, small_rows(), name="w"))
    joint = other.execute(sql)
    assert joint.charge is not None and other.plan(sql).estimates[0].joint
    steps = plan_workload(other, split_statements(sql + ";\n" + sql.replace("VAR_SAMP", "VAR_POP")))
    assert [s.source for s in steps.steps] == ["cache", "cache"]
    spent = other.budget().epsilon_spent
    results = [r for _, r in run_workload(other, steps)]
    assert other.budget().epsilon_spent == spent
    assert results[0] is not None and results[0].rows == joint.rows
    assert other.execute("SELECT region, AVG(spend) FROM visits GROUP BY region").charge is None
    assert other.budget().epsilon_spent == spent


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.integers(0, 16), min_size=1, max_size=30),
    scale=st.sampled_from([Fraction(1, 2), Fraction(3), Fraction(40), Fraction(2000)]),
    reach=st.tuples(*(st.sampled_from([-1.0, -0.4, 0.0, 0.7, 1.0]) for _ in range(3))),
    kind=st.sampled_from(SPREADS),
)
def test_the_interval_holds_for_coordinates_combined_from_several_releases(
    values: list[int], scale: Fraction, reach: tuple[float, float, float], kind: str
) -> None:
    """Coordinates answered from several releases (an inverse-variance combination of their
    noises, ``dpsql.cache.derive``) are each bounded at their own half-width (the union bound):
    for noise anywhere in that cube, corners included, value ± half-width holds the estimator
    at the true totals."""
    grid = Grid(Fraction(1), 0, 16)
    w = grid.width
    centred = [2 * v - 16 for v in values]
    truth = [sum((w - a) ** 2 for a in centred), sum(2 * (w * w - a * a) for a in centred),
             sum((w + a) ** 2 for a in centred)]  # fmt: skip
    two = (((Fraction(1, 2), scale), (Fraction(1, 2), scale)),)
    parts = [dataclasses.replace(m, combined=two) for m in _measurements(scale, grid)]
    assert bernstein.one_scale(parts) is None  # the cube, not the ball
    each = math.nextafter(1.0 - 0.05 / 3, 1.0)  # ``_each``'s union bound for three
    k = [half_width(m, each) for m in parts]
    z = [math.trunc(r * h) for r, h in zip(reach, k, strict=True)]
    noisy = [np.array([float(b + e)]) for b, e in zip(truth, z, strict=True)]
    estimate = Estimate(kind, (0, 1, 2), grid, joint=True)  # type: ignore[arg-type]
    value, width = _spread(estimate, parts, noisy, 0.95)
    q = Fraction(truth[0] + truth[2] - truth[1], 4)
    s = Fraction(truth[2] - truth[0], 4 * w)
    n = Fraction(sum(truth), 4 * w * w)
    exact = reference_variance(kind, (q, s, n), grid)
    low = Fraction(float(value[0])) - Fraction(float(width[0]))
    high = Fraction(float(value[0])) + Fraction(float(width[0]))
    if kind.startswith("stddev"):
        assert (low <= 0 or low * low <= exact) and exact <= high * high
    else:
        assert low <= exact <= high
