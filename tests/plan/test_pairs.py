"""COVAR_POP, COVAR_SAMP, CORR, REGR_SLOPE and REGR_INTERCEPT (``dpsql.plan.aggregates.pairs``).

Measured over the pairs' rows (both arguments present): P = Σ(2·v_x - m_x)(2·v_y - m_y) in
units of (g_x/2)(g_y/2), the centred sums, the count, and the centred squares CORR and the REGR_
functions need. Checked here: the bounded totals against a Python computation where no bound
binds (NULL and NaN in either argument drop the pair); the estimator on those exact totals
against DuckDB's own functions; the per-unit invariant |P'| <= min(n, C)·width_x·width_y where
the data exceed every bound; the sensitivities by hand; the interval arithmetic's soundness
over the whole box of noises (hypothesis); the released ± covering the truth end to end; the
privacy loss a neighbouring pair shows, audited; the cache never serving a pair's measurement
to another aggregate.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from fractions import Fraction
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dpsql.engine.duckdb.engine import DuckDBEngine
from dpsql.errors import BoundsError, QueryError, UnsupportedQueryError
from dpsql.noise.measure import measure
from dpsql.plan.aggregates.pairs import _pairs
from dpsql.plan.estimators import half_width
from dpsql.plan.plans import Plan
from dpsql.policy import Policy, load_policy
from dpsql.release.post import publish
from dpsql.session.session import Session
from dpsql.sql.parse import DIALECT

REGIONS = ("east", "west")
L0, C = 2, 5
SALT = 7
KINDS = ("COVAR_POP", "COVAR_SAMP", "CORR", "REGR_SLOPE", "REGR_INTERCEPT")


def make_policy(tmp_path: Path, rows: list[tuple[Any, ...]], name: str = "p") -> Policy:
    path = tmp_path / f"{name}.parquet"
    types = {"user_id": pa.int64(), "region": pa.string(), "x": pa.float64(), "y": pa.int32()}
    columns = {n: pa.array([r[i] for r in rows], type=t) for i, (n, t) in enumerate(types.items())}
    pq.write_table(pa.table(columns), path)
    return load_policy(
        {
            "dataset": {"id": "pairs", "data_version": "1"},
            "data": {"tables": {"visits": str(path)}},
            "budget": {"diagnose": False, "epsilon": 10000, "query_epsilon": 1},
            "tables": {
                "visits": {
                    "privacy_unit": "user_id",
                    "max_groups_per_unit": L0,
                    "max_rows_per_unit_per_group": C,
                    "columns": {
                        "x": {"lower": 0, "upper": 10},
                        "y": {"lower": -20, "upper": 60},
                        "region": {"public_values": list(REGIONS)},
                    },
                }
            },
        },
        base_dir=tmp_path,
    )


def run(policy: Policy, sql: str) -> list[tuple[Any, ...]]:
    engine = DuckDBEngine(policy, SALT)
    try:
        return engine.run(sql)[1]
    finally:
        engine.close()


def with_ctes(plan: Plan, select: str) -> str:
    ctes = ", ".join(cte.sql(dialect=DIALECT) for cte in plan.bounded.ctes)
    return f"WITH {ctes} {select}"


def small_rows(seed: int = 1) -> list[tuple[Any, ...]]:
    """Within every bound (at most 2 regions, 3 rows per user and region), on the grid, with
    NULL and NaN in either argument."""
    rng = random.Random(seed)  # test data only
    rows = []
    for user in range(60):
        for region in rng.sample(REGIONS, rng.randint(1, 2)):
            for _ in range(rng.randint(1, 3)):
                x = rng.choice([None, math.nan, *(rng.randint(0, 40) / 4 for _ in range(6))])
                y = rng.choice([None, *(rng.randint(-20, 60) for _ in range(6))])
                rows.append((user, region, x, y))
    return rows


def pairs_of(rows: list[tuple[Any, ...]]) -> dict[str, list[tuple[float, int]]]:
    out: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for _, region, x, y in rows:
        if x is not None and not math.isnan(x) and y is not None:
            out[region].append((x, y))
    return out


def duckdb_truth(values: list[tuple[float, int]]) -> tuple[float, ...]:
    con = duckdb.connect(":memory:")
    try:
        calls = ", ".join(f"{k}(y, x)" for k in KINDS)
        row = con.execute(f"SELECT {calls} FROM unnest(?) AS t(p), LATERAL (SELECT p[1] AS x, "
                          "p[2] AS y)", [[list(v) for v in values]]).fetchone()  # fmt: skip
    finally:
        con.close()
    assert row is not None
    return tuple(row)


def test_totals_are_exact_and_the_estimates_are_duckdbs_where_no_bound_binds(
    tmp_path: Path,
) -> None:
    rows = small_rows()
    policy = make_policy(tmp_path, rows)
    calls = ", ".join(f"{k}(y, x)" for k in KINDS)
    plan = Session(policy).plan(f"SELECT region, {calls} FROM visits GROUP BY region")
    kinds = [m.spec.kind for m in plan.measurements]
    assert sorted(kinds) == sorted(
        ["centred_products", "centred", "centred", "count", "centred_squares", "centred_squares"]
    )
    est = plan.estimates[2]  # CORR reads all six
    gx, gy = est.grid, est.grid2
    assert gx is not None and gy is not None
    got = {r[0]: r[1:] for r in run(policy, plan.engine_sql)}
    by_region = pairs_of(rows)
    for region in REGIONS:
        values = by_region[region]
        cx = [int(2 * Fraction(x) / gx.step) - gx.centre_units for x, _ in values]
        cy = [int(2 * Fraction(y) / gy.step) - gy.centre_units for _, y in values]
        expected = {
            "centred_products": sum(a * b for a, b in zip(cx, cy, strict=True)),
            "count": len(values),
        }
        totals = got[region]
        for j, m in enumerate(plan.measurements):
            if m.spec.kind in expected:
                assert totals[j] == expected[m.spec.kind], m.label
        # The centred sums and squares of each value, over the pairs' rows only.
        sums = sorted(t for t, m in zip(totals, plan.measurements, strict=True)
                      if m.spec.kind == "centred")  # fmt: skip
        assert sums == sorted([sum(cx), sum(cy)])
        squares = sorted(t for t, m in zip(totals, plan.measurements, strict=True)
                         if m.spec.kind == "centred_squares")  # fmt: skip
        assert squares == sorted([sum(a * a for a in cx), sum(b * b for b in cy)])
        # Without noise, each estimator is DuckDB's function on the same pairs.
        truth = duckdb_truth(values)
        for est, expected_value in zip(plan.estimates, truth, strict=True):
            value, _ = _pairs(est, plan.measurements, [[t] for t in totals], 0.95)
            assert float(value[0]) == pytest.approx(expected_value, rel=1e-9, abs=1e-9), est.kind


def test_capped_products_stay_within_bounds(tmp_path: Path) -> None:
    rng = random.Random(2)  # test data only
    rows: list[tuple[Any, ...]] = []
    for user in range(30):
        many = user % 3 == 0
        for region in REGIONS if many else REGIONS[:1]:
            for _ in range(rng.randint(20, 60) if many else rng.randint(1, 4)):
                x = rng.choice([1e9, -1e9, 25.0, -3.0, 9.5, 0.0, math.nan, None, math.inf])
                y = rng.choice([2**31 - 1, -(2**31), 60, -20, 0, None])
                rows.append((user, region, x, y))
    # A unit with many pairs at a corner beyond the bounds: its product reaches the clamp.
    rows += [(99, "east", 1e9, 2**31 - 1)] * 40 + [(99, "west", -3.0, 60)] * 40
    policy = make_policy(tmp_path, rows)
    plan = Session(policy).plan("SELECT region, COVAR_POP(y, x) FROM visits GROUP BY region")
    est = plan.estimates[0]
    gx, gy = est.grid, est.grid2
    assert gx is not None and gy is not None
    (product,) = [m for m in plan.measurements if m.spec.kind == "centred_products"]
    i, j = product.spec.value, product.spec.other
    assert run(policy, with_ctes(plan, f"SELECT max(_n{i}) > {C} FROM _units")) == [(True,)]
    checked = run(policy, with_ctes(plan, f"SELECT _c{i}, _r{i}_{j} FROM _capped"))
    assert checked
    extremes = 0
    for c, r in checked:
        # min(n, C) pairs, each product within ±width_x·width_y: the sensitivity's premise.
        assert abs(r) <= c * gx.width * gy.width
        extremes += abs(r) == C * gx.width * gy.width
    assert extremes > 0  # the clamp is reached: the check could fail
    assert product.per_group == C * gx.width * gy.width


def test_sensitivities_by_hand(tmp_path: Path) -> None:
    policy = make_policy(tmp_path, small_rows())
    plan = Session(policy).plan(
        "SELECT region, CORR(y, x) FROM visits GROUP BY region", split="even"
    )
    by_kind = defaultdict(list)
    for m in plan.measurements:
        by_kind[m.spec.kind].append(m)
    (product,) = by_kind["centred_products"]
    # x in [0, 10], y in [-20, 60]: |(x - 5)(y - 20)| <= 5·40 per pair; L0 = 2, C = 5.
    assert product.sensitivity * product.unit == 2 * 5 * 5 * 40 == 2000
    assert product.per_group * product.unit == 5 * 5 * 40
    assert sorted(m.sensitivity * m.unit for m in by_kind["centred"]) == [2 * 5 * 5, 2 * 5 * 40]
    assert sorted(m.sensitivity * m.unit for m in by_kind["centred_squares"]) == [
        2 * 5 * 25,
        2 * 5 * 1600,
    ]
    assert len(plan.measurements) == 6
    assert all(m.epsilon == Fraction(1, 6) for m in plan.measurements)
    lines = plan.explain()
    assert any('SUM(("x" - 5)*("y" - 20)) over the pairs:' in line for line in lines), lines
    assert any('COUNT("x") where "y" is present:' in line for line in lines), lines


def test_the_arguments_need_bounds_and_two_of_them(tmp_path: Path) -> None:
    session = Session(make_policy(tmp_path, small_rows()))
    with pytest.raises(BoundsError):
        session.plan("SELECT CORR(user_id, x) FROM visits")
    for sql in ("SELECT CORR(x) FROM visits", "SELECT CORR(DISTINCT y, x) FROM visits",
                "SELECT REGR_SLOPE(y, x, x) FROM visits"):  # fmt: skip
        with pytest.raises(QueryError):
            session.plan(sql)
    with pytest.raises(UnsupportedQueryError, match="min_group"):
        session.plan("SELECT CORR(y, x) FROM visits", halfwidth=0.1, min_group=100)
    assert session.budget().epsilon_spent == 0


# -- the interval arithmetic, over the whole box ---------------------------------------------


@pytest.fixture(scope="module")
def pair_plan(tmp_path_factory: pytest.TempPathFactory) -> Plan:
    policy = make_policy(tmp_path_factory.mktemp("pairs"), small_rows())
    calls = ", ".join(f"{k}(y, x)" for k in KINDS)
    return Session(policy).plan(f"SELECT {calls} FROM visits", epsilon=Fraction(1, 10))


def exact(kind: str, totals: dict[str, Fraction], plan: Plan) -> Fraction | None:
    """The estimator in exact rationals at one point (None where it is undefined)."""
    est = plan.estimates[0]
    gx, gy = est.grid, est.grid2
    assert gx is not None and gy is not None
    ux, uy = gx.step / 2, gy.step / 2
    n = max(totals["n"], Fraction(1))
    cov = (totals["p"] / n - totals["sx"] * totals["sy"] / n**2) * ux * uy
    top = (gx.upper_value - gx.lower_value) * (gy.upper_value - gy.lower_value) / 4
    if kind == "COVAR_POP":
        return min(max(cov, -top), top)
    if kind == "COVAR_SAMP":
        return min(max(cov * n / max(n - 1, Fraction(1)), -2 * top), 2 * top)
    vx = max(totals["qx"] / n - (totals["sx"] / n) ** 2, Fraction(0)) * ux * ux
    vy = max(totals["qy"] / n - (totals["sy"] / n) ** 2, Fraction(0)) * uy * uy
    if kind == "CORR":
        if vx == 0 or vy == 0:
            return None
        return Fraction(min(max(float(cov) / math.sqrt(float(vx * vy)), -1.0), 1.0))
    if vx == 0:
        return None
    slope = cov / vx
    if kind == "REGR_SLOPE":
        return slope
    mx = gx.centre + totals["sx"] / n * ux
    my = gy.centre + totals["sy"] / n * uy
    return my - slope * mx


NAMES = ("p", "sx", "sy", "n", "qx", "qy")
OFFSET = st.fractions(-1, 1, max_denominator=8)


@settings(max_examples=examples(300), deadline=None)
@given(
    data=st.data(),
    confidence=st.floats(0.5, 0.999),
    offsets=st.lists(OFFSET, min_size=6, max_size=6),
)
def test_the_interval_holds_every_point_of_the_box(
    pair_plan: Plan, data: st.DataObject, confidence: float, offsets: list[Fraction]
) -> None:
    """For every kind, at noisy totals drawn anywhere (small and large counts, variances near
    0), the estimator in exact arithmetic at any point of the box (each total ± its half-width
    at c^(1/k)) lies within the released value ± half-width, when one is released."""
    plan = pair_plan
    est = plan.estimates[2]  # CORR: all six measurements, in its order
    order = dict(zip(NAMES, est.measurements, strict=True))
    gx, gy = est.grid, est.grid2
    assert gx is not None and gy is not None
    n = data.draw(st.integers(-5, 5000))
    scale = max(n, 1)
    sx = data.draw(st.integers(-gx.width * scale - 50, gx.width * scale + 50))
    sy = data.draw(st.integers(-gy.width * scale - 50, gy.width * scale + 50))
    qx = data.draw(st.integers(-50, gx.width**2 * scale + 50))
    qy = data.draw(st.integers(-50, gy.width**2 * scale + 50))
    p = data.draw(st.integers(-gx.width * gy.width * scale - 50, gx.width * gy.width * scale + 50))
    centre = {"p": p, "sx": sx, "sy": sy, "n": n, "qx": qx, "qy": qy}
    noisy: list[list[int]] = [[0] for _ in plan.measurements]
    for name, j in order.items():
        noisy[j] = [centre[name]]
    for kind, estimate in zip(KINDS, plan.estimates, strict=True):
        used = {name: j for name, j in order.items() if j in estimate.measurements}
        joint = math.nextafter(confidence ** (1 / len(used)), 1.0)
        ks = {name: half_width(plan.measurements[j], joint) for name, j in used.items()}
        point = {
            name: Fraction(centre[name]) + d * ks.get(name, 0)
            for name, d in zip(NAMES, offsets, strict=True)
        }
        value, width = _pairs(estimate, plan.measurements, noisy, confidence)
        if math.isinf(width[0]):
            assert kind not in ("COVAR_POP", "COVAR_SAMP")
            continue
        truth = exact(kind, point, plan)
        if truth is None:
            continue  # undefined at this point: only a kind whose box holds var 0 (none here)
        size = max(abs(float(truth)), abs(float(value[0])), 1.0)
        assert abs(float(truth) - float(value[0])) <= float(width[0]) + 1e-9 * size, (
            kind, centre, point, float(value[0]), float(width[0]), float(truth)
        )  # fmt: skip


# -- end to end: coverage, and an audit of the loss ------------------------------------------

COVERAGE_RUNS = 100
COVERAGE_ALPHA = 1e-6


def coverage_rows(users: int = 4000) -> list[tuple[Any, ...]]:
    rng = np.random.default_rng(5)  # test data only
    rows = []
    for user in range(users):
        region = REGIONS[user % 2]
        for _ in range(int(rng.integers(1, 4))):
            x = float(np.clip(round(rng.uniform(0, 10) * 4) / 4, 0, 10))
            y = int(np.clip(round(3 * x - 5 + rng.normal(0, 6)), -20, 60))
            rows.append((user, region, x, y))
    return rows


@pytest.mark.statistical
def test_the_released_interval_covers_the_truth(tmp_path: Path) -> None:
    """Through ``Session.execute(..., fresh=True)`` at epsilon 5: DuckDB's own function over the
    pairs (no bound binds) lies within value ± half-width in at least 95% of the cells that
    have a ±, by a one-sided binomial test at 1e-6; a cell without one is flagged."""
    rows = coverage_rows()
    policy = make_policy(tmp_path, rows)
    by_region = pairs_of(rows)
    truth = {r: duckdb_truth(by_region[r]) for r in REGIONS}
    session = Session(policy)
    calls = ", ".join(f"{k}(y, x)" for k in KINDS)
    sql = f"SELECT region, {calls} FROM visits GROUP BY region"
    hits = [0] * len(KINDS)
    draws = [0] * len(KINDS)
    for _ in range(COVERAGE_RUNS):
        result = session.execute(sql, fresh=True, epsilon=5, confidence=0.95)
        for row, accuracy, noise in zip(result.rows, result.accuracy, result.noise, strict=True):
            for k in range(len(KINDS)):
                value, width = row[1 + k], accuracy[1 + k]
                if width is None:
                    assert noise[1 + k]  # no valid interval: flagged as mostly noise
                    continue
                assert isinstance(width, float)
                draws[k] += 1
                hits[k] += abs(value - truth[row[0]][k]) <= width
    for k, kind in enumerate(KINDS):
        assert draws[k] >= COVERAGE_RUNS, kind  # most cells have a ± at this size
        p = stats.binomtest(hits[k], draws[k], 0.95, alternative="less").pvalue
        assert p > COVERAGE_ALPHA, (kind, hits[k], draws[k])


@pytest.mark.statistical
@pytest.mark.parametrize("kind", KINDS)
def test_audit_a_neighbour_shows_no_more_loss_than_charged(tmp_path: Path, kind: str) -> None:
    """The released value on D (40 units) and on D' (one more unit with C pairs at opposite
    corners of the bounds in each region, the most it can move P, the sums and the squares),
    4,000 draws each from the real samplers on the engine's exact totals at epsilon 8: binned
    at the deciles of both, ln of one side's Clopper-Pearson lower bound over the other's upper
    bound (Bonferroni at 1e-4) stays below the query's epsilon. Measured: 1.7-2.0 of 8 (at
    epsilon 4: 0.66-0.83), so the audit sees the neighbour and could fail."""
    from test_auto_bounds import _measured_loss

    runs, epsilon = 4000, 8
    base = coverage_rows(40)
    heavy = [(10**6, r, x, y) for r in REGIONS for x, y in [(0.0, 60), (10.0, -20)] * 3]
    released = []
    for name, data in (("d", base), ("d2", [*base, *heavy])):
        session = Session(make_policy(tmp_path, data, name))
        plan = session.plan(f"SELECT {kind}(y, x) FROM visits", epsilon=epsilon)
        rows = session.engine.run(plan.engine_sql)[1]
        values = [publish(plan, measure(plan, rows)).rows[0][0] for _ in range(runs)]
        released.append(np.asarray(values, dtype=np.float64))
        session.close()
    edges = np.quantile(np.concatenate(released), np.linspace(0.1, 0.9, 9))
    counts = [dict(zip(*np.unique(np.digitize(v, edges), return_counts=True), strict=True))
              for v in released]  # fmt: skip
    measured = _measured_loss(counts, runs, 1e-4)
    assert 0.5 < measured <= epsilon, measured


def test_the_cache_never_serves_a_pairs_measurement_to_another_aggregate(tmp_path: Path) -> None:
    """VARIANCE(x) after COVAR_POP(y, x) reads every row with x, the covariance only the pairs:
    a fresh release, charged, not the pairs' centred sums served again."""
    session = Session(make_policy(tmp_path, small_rows()))
    session.execute("SELECT COVAR_POP(y, x), CORR(y, x) FROM visits")
    spent = session.budget().epsilon_spent
    session.execute("SELECT VAR_POP(x) FROM visits")
    assert session.budget().epsilon_spent == spent + 1
    again = session.execute("SELECT COVAR_POP(y, x), CORR(y, x) FROM visits")
    assert again.cached_from is not None  # the same question again is served, free
    assert session.budget().epsilon_spent == spent + 1
