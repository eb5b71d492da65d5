"""VAR_POP, VAR_SAMP (VARIANCE), STDDEV_POP and STDDEV_SAMP (STDDEV) over a bounded value.

Under ``dpsql.moments = 'separate'`` (every session here; the joint Bernstein vector, the
Laplace's default: tests/plan/test_bernstein.py), three measurements per value (DESIGN.md
section 3): the centred sum of squares
Q = Σ(2·v - lower - upper)² in units of (g/2)², the centred sum and the count. Checked here: the
bounded totals against an independent Python computation where no bound binds, the per-unit
invariant 0 <= Q' <= C·width² where the data exceed every bound, the sensitivities by hand,
the estimator against DuckDB with little noise, and the cost split.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from fractions import Fraction
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dpsql.bound.grid import Grid
from dpsql.engine.duckdb.engine import DuckDBEngine
from dpsql.errors import BoundsError
from dpsql.plan.aggregates.spreads import _spread
from dpsql.plan.estimators import half_width
from dpsql.plan.plans import Plan
from dpsql.policy import Policy, load_policy
from dpsql.session.session import Session
from dpsql.sql.parse import DIALECT

REGIONS = ("central", "east", "north", "south", "west")
L0, C = 2, 10
SALT = 7


def _separate(policy: Policy) -> Session:
    """A session whose variances measure Q, S and N apart."""
    session = Session(policy)
    session.set_option("moments", "separate")
    return session


def make_policy(tmp_path: Path, rows: list[tuple[Any, ...]], name: str = "v") -> Policy:
    path = tmp_path / f"{name}.parquet"
    types = {"user_id": pa.int64(), "region": pa.string(), "spend": pa.float64(), "age": pa.int32()}
    columns = {n: pa.array([r[i] for r in rows], type=t) for i, (n, t) in enumerate(types.items())}
    pq.write_table(pa.table(columns), path)
    return load_policy(
        {
            "dataset": {"id": "variance", "data_version": "1"},
            "data": {"tables": {"visits": str(path)}},
            "budget": {
                "diagnose": False,
                "epsilon": 1000,
                "delta": 1e-6,
                "query_epsilon": 1,
                "query_delta": 1e-8,
            },
            "tables": {
                "visits": {
                    "privacy_unit": "user_id",
                    "max_groups_per_unit": L0,
                    "max_rows_per_unit_per_group": C,
                    "columns": {
                        "spend": {"lower": 0, "upper": 200},
                        "age": {"lower": 18, "upper": 90},
                        "region": {"public_values": list(REGIONS)},
                    },
                }
            },
        },
        base_dir=tmp_path,
    )


def run(policy: Policy, sql: str) -> list[tuple[Any, ...]]:
    return DuckDBEngine(policy, SALT).run(sql)[1]


def with_ctes(plan: Plan, select: str) -> str:
    ctes = ", ".join(cte.sql(dialect=DIALECT) for cte in plan.bounded.ctes)
    return f"WITH {ctes} {select}"


def small_rows() -> list[tuple[Any, ...]]:
    """Within every bound: at most 2 regions and 3 rows per user, values on the grid."""
    rng = random.Random(1)
    rows = []
    for user in range(40):
        for region in rng.sample(REGIONS, rng.randint(1, 2)):
            for _ in range(rng.randint(1, 3)):
                spend = rng.choice([None, rng.randint(0, 400) / 2])
                rows.append((user, region, spend, rng.randint(18, 90)))
    return rows


def duckdb_var_pop(xs: list[float]) -> float:
    """DuckDB's own var_pop of ``xs``: the estimator's value without noise."""
    con = duckdb.connect(":memory:")
    try:
        row = con.execute("SELECT var_pop(x) FROM unnest(?) AS u(x)", [xs]).fetchone()
    finally:
        con.close()
    assert row is not None
    return float(row[0])


def index_of(plan: Plan, kind: str) -> int:
    return next(j for j, m in enumerate(plan.measurements) if m.spec.kind == kind)


def test_totals_are_exact_where_no_bound_binds(tmp_path: Path) -> None:
    rows = small_rows()
    policy = make_policy(tmp_path, rows)
    plan = _separate(policy).plan("SELECT region, VAR_POP(spend) FROM visits GROUP BY region")
    assert [m.spec.kind for m in plan.measurements] == ["centred_squares", "centred", "count"]
    grid = plan.estimates[0].grid
    assert grid is not None
    got = {r[0]: r[1:] for r in run(policy, plan.engine_sql)}
    values: dict[str, list[float]] = defaultdict(list)
    for _, region, spend, _ in rows:
        if spend is not None:
            values[region].append(spend)
    m = grid.lower + grid.upper
    for region in REGIONS:
        xs = values[region]
        units = [Fraction(x) / grid.step for x in xs]
        assert all(u.denominator == 1 for u in units)
        centred = [int(2 * u) - m for u in units]
        q, s, n = got[region]
        assert (q, s, n) == (sum(c * c for c in centred), sum(centred), len(xs))
        # Without noise, the estimator is DuckDB's var_pop exactly (up to float rounding).
        half = float(grid.step) / 2
        var = (q / n - (s / n) ** 2) * half * half
        assert var == pytest.approx(duckdb_var_pop(xs), rel=1e-9, abs=1e-9)


def test_capped_squares_stay_within_bounds(tmp_path: Path) -> None:
    rng = random.Random(2)
    rows: list[tuple[Any, ...]] = []
    for user in range(30):
        many = user % 3 == 0
        for region in REGIONS if many else REGIONS[:1]:
            for _ in range(rng.randint(20, 60) if many else rng.randint(1, 4)):
                spend = rng.choice([1e9, -1e9, 250.0, -3.0, 199.5, 0.0, float("nan"), None])
                rows.append((user, region, spend, 30))
    policy = make_policy(tmp_path, rows)
    plan = _separate(policy).plan("SELECT region, STDDEV(spend) FROM visits GROUP BY region")
    grid = plan.estimates[0].grid
    assert grid is not None
    cap = C * grid.width**2
    assert run(policy, with_ctes(plan, f"SELECT max(_n0) > {C} FROM _units")) == [(True,)]
    checked = run(policy, with_ctes(plan, "SELECT _c0, _r0 FROM _capped"))
    assert checked
    for c, r in checked:
        # n' = min(n, C) values, each square at most width²: the sensitivity's premise.
        assert 0 <= r <= c * grid.width**2 <= cap
    # Values beyond the bounds are clamped to them: |2·v - lower - upper| = width exactly.
    extreme = run(
        policy,
        with_ctes(
            plan, "SELECT max(abs(2 * _v0 - " + str(grid.lower + grid.upper) + ")) FROM _vals"
        ),
    )
    assert extreme == [(grid.width,)]


def test_sensitivities_by_hand(tmp_path: Path) -> None:
    policy = make_policy(tmp_path, small_rows())
    plan = _separate(policy).plan(
        "SELECT region, VARIANCE(spend) FROM visits GROUP BY region",
        epsilon=Fraction(3, 10),
        split="even",
    )
    squares = plan.measurements[index_of(plan, "centred_squares")]
    centred = plan.measurements[index_of(plan, "centred")]
    count = plan.measurements[index_of(plan, "count")]
    # spend in [0, 200], L0 = 2, C = 10: (x - 100)² <= 100² per row.
    assert squares.sensitivity * squares.unit == 2 * 10 * 100**2 == 200_000
    assert squares.per_group * squares.unit == 10 * 100**2
    assert centred.sensitivity * centred.unit == 2 * 10 * 100
    assert count.sensitivity == 2 * 10
    grid = plan.estimates[0].grid
    assert grid is not None
    assert squares.unit == (grid.step / 2) ** 2
    # Under the even split, three measurements share epsilon equally.
    for m in plan.measurements:
        assert m.epsilon == Fraction(1, 10)
    assert plan.epsilon == Fraction(3, 10)
    assert any("SUM((" in line and ")^2)" in line for line in plan.explain())


def test_cost_split_and_sharing(tmp_path: Path) -> None:
    policy = make_policy(tmp_path, small_rows())
    session = _separate(policy)
    session.set_option("split", "even")  # the shares of the optimal split: tests/plan/test_split.py
    one = session.plan("SELECT VAR_POP(spend) FROM visits", epsilon=Fraction(1, 2))
    assert len(one.measurements) == 3
    assert all(m.epsilon == Fraction(1, 6) for m in one.measurements)
    shared = session.plan(
        "SELECT VAR_POP(spend), VARIANCE(spend), STDDEV(spend), STDDEV_POP(spend), "
        "STDDEV_SAMP(spend), VAR_SAMP(spend), AVG(spend), COUNT(spend) FROM visits",
        epsilon=Fraction(1, 2),
    )
    assert len(shared.measurements) == 3
    both = session.plan("SELECT VAR_POP(spend), VAR_POP(age) FROM visits", epsilon=Fraction(1))
    assert len(both.measurements) == 6
    assert all(m.epsilon == Fraction(1, 6) for m in both.measurements)
    # A private key adds the units count for partition selection: four measurements.
    private = session.plan(
        "SELECT age, VAR_POP(spend) FROM visits GROUP BY age", epsilon=Fraction(1, 2)
    )
    assert len(private.measurements) == 4


def test_unbounded_argument_is_refused(tmp_path: Path) -> None:
    policy = make_policy(tmp_path, small_rows())
    with pytest.raises(BoundsError):
        _separate(policy).plan("SELECT VAR_POP(user_id) FROM visits")


def big_rows() -> list[tuple[Any, ...]]:
    rng = random.Random(3)
    rows = []
    for user in range(20_000):
        region = REGIONS[user % len(REGIONS)]
        for _ in range(rng.randint(1, 3)):
            rows.append((user, region, round(rng.uniform(0, 200), 3), rng.randint(18, 90)))
    return rows


def test_estimates_match_duckdb_with_little_noise(tmp_path: Path) -> None:
    rows = big_rows()
    policy = make_policy(tmp_path, rows)
    session = _separate(policy)
    result = session.execute(
        "SELECT region, VAR_POP(spend) AS vp, VAR_SAMP(spend) AS vs, VARIANCE(age) AS va, "
        "STDDEV_POP(spend) AS sp, STDDEV(spend) AS ss, STDDEV_SAMP(age) FROM visits "
        "GROUP BY region",
        epsilon=20,
    )
    assert result.columns == ("region", "vp", "vs", "va", "sp", "ss", "stddev_samp")
    con = duckdb.connect(":memory:")
    try:
        con.execute(f"CREATE VIEW t AS SELECT * FROM read_parquet('{tmp_path / 'v.parquet'}')")
        truth = {
            r[0]: r[1:]
            for r in con.execute(
                "SELECT region, var_pop(spend), var_samp(spend), variance(age), "
                "stddev_pop(spend), stddev(spend), stddev_samp(age) FROM t GROUP BY region"
            ).fetchall()
        }
    finally:
        con.close()
    assert len(result.rows) == len(REGIONS)
    for row, accuracy in zip(result.rows, result.accuracy, strict=True):
        # Epsilon 20 split over 6 measurements leaves noise of about half a percent of these
        # variances (1.02% seen at worst); 5% keeps a false failure out of reach while still
        # catching a wrong estimator (a missing centring or N-1 factor is off by far more).
        assert row[1:] == pytest.approx(truth[row[0]], rel=0.05)
        # Half-widths are now reported: positive, and informative at this epsilon (a few
        # percent of each value, 2.3% seen at worst), never the whole bound range.
        assert accuracy[0] is None
        for value, width in zip(row[1:], accuracy[1:], strict=True):
            assert width is not None and 0 < width < 0.1 * value
        assert 0 <= row[1] <= 100**2 and 0 <= row[4] <= 100


def test_estimator_edge_cases(tmp_path: Path) -> None:
    """One value per group, or none: released values stay in [0, ((hi - lo)/2)²]."""
    policy = make_policy(tmp_path, [(1, "east", 200.0, 90), (2, "west", None, 18)])
    result = _separate(policy).execute(
        "SELECT region, VAR_SAMP(spend), STDDEV_POP(age) FROM visits GROUP BY region",
        epsilon=1,
    )
    assert len(result.rows) == len(REGIONS)
    for _, var, std in result.rows:
        assert 0 <= var <= 100**2 and not math.isnan(var)
        assert 0 <= std <= 36 and not math.isnan(std)


# --- accuracy: the half-width of VAR and STDDEV --------------------------------------------------

SPREAD_SQL = "SELECT VAR_POP({c}), VAR_SAMP({c}), STDDEV_POP({c}), STDDEV_SAMP({c}) FROM visits"


@pytest.fixture(scope="module")
def spread_plans(tmp_path_factory: pytest.TempPathFactory) -> list[Plan]:
    """Real plans of the four estimators, built once: spend in [0, 200] and age in [18, 90],
    discrete Laplace at epsilon 1/10 and 20, and the discrete Gaussian."""
    policy = make_policy(tmp_path_factory.mktemp("spread"), small_rows())
    session = _separate(policy)
    plans = []
    for column in ("spend", "age"):
        sql = SPREAD_SQL.format(c=column)
        plans.append(session.plan(sql, epsilon=Fraction(1, 10)))
        plans.append(session.plan(sql, epsilon=20))
        plans.append(session.plan(sql, epsilon=1, delta=Fraction(1, 10**8), mechanism="gaussian"))
    assert any(m.sigma2 is not None for m in plans[-1].measurements)
    return plans


def reference_variance(kind: str, point: tuple[Fraction, ...], grid: Grid) -> Fraction:
    """The estimator of ``_spread`` in exact arithmetic at (Q, S, count), in value units²."""
    q, s, count = point
    n = max(count, Fraction(1))
    var = max(q / n - (s / n) ** 2, Fraction(0))
    if kind in ("var_samp", "stddev_samp"):
        var *= n / max(n - 1, Fraction(1))
    return min(var, Fraction(grid.width) ** 2) * (grid.step / 2) ** 2


def contains(kind: str, value: float, width: float, variance: Fraction) -> bool:
    """Whether value ± width holds the estimator (its square root for STDDEV), exactly."""
    low, high = Fraction(value) - Fraction(width), Fraction(value) + Fraction(width)
    if kind.startswith("stddev"):
        return (low <= 0 or low * low <= variance) and variance <= high * high
    return low <= variance <= high


OFFSET = st.one_of(
    st.sampled_from([Fraction(-1), Fraction(0), Fraction(1)]),
    st.fractions(min_value=-1, max_value=1, max_denominator=10**6),
)


@st.composite
def noisy_totals(draw: st.DrawFn, width: int) -> tuple[int, int, int]:
    """Noisy (Q, S, count) near what data could give: |S| <= n·width, Q near S²/n or anywhere
    in [0, n·width²], each off by a little noise (the box adds more)."""
    count = draw(st.integers(-20, 10**6))
    n = max(count, 1)
    s = draw(st.integers(-n * width - 50, n * width + 50))
    near = s * s // n
    q = draw(st.one_of(st.integers(near - 50, near + 50), st.integers(-50, n * width**2 + 50)))
    return q, s, count


@settings(max_examples=examples(300), deadline=None)
@given(
    data=st.data(),
    confidence=st.floats(0.5, 0.9999),
    offsets=st.tuples(OFFSET, OFFSET, OFFSET),
    at_vertex=st.booleans(),
)
def test_spread_interval_contains_the_box(
    spread_plans: list[Plan],
    data: st.DataObject,
    confidence: float,
    offsets: tuple[Fraction, Fraction, Fraction],
    at_vertex: bool,
) -> None:
    """Soundness of the interval arithmetic: for every estimator, the released value ± half-width
    holds the estimator (in exact arithmetic) at any point of the box Q ± k_Q, S ± k_S,
    count ± k_N, the ends included, and at the count where Q/N - (S/N)² peaks for that Q and S
    (N = 2S²/Q, inside the box): the place a naive corner-only bound misses."""
    plan = data.draw(st.sampled_from(spread_plans))
    grid = plan.estimates[0].grid
    assert grid is not None
    centre = data.draw(noisy_totals(grid.width))
    joint = math.nextafter(confidence ** (1 / 3), 1.0)
    # The box covers all three independent noises with probability >= confidence.
    assert Fraction(joint) ** 3 >= Fraction(confidence)
    order = plan.estimates[0].measurements
    ks = [half_width(plan.measurements[i], joint) for i in order]
    point = [c + d * k for c, d, k in zip(centre, offsets, ks, strict=True)]
    if at_vertex and point[0] > 0 and point[1] != 0:
        n_lo, n_hi = max(centre[2] - ks[2], 1), max(centre[2] + ks[2], 1)
        point[2] = min(max(2 * point[1] ** 2 / point[0], Fraction(n_lo)), Fraction(n_hi))
    noisy = [[0] for _ in plan.measurements]
    for i, total in zip(order, centre, strict=True):
        noisy[i] = [total]
    for estimate in plan.estimates:
        assert estimate.measurements == order
        value, width = _spread(estimate, plan.measurements, noisy, confidence)
        exact = reference_variance(estimate.kind, tuple(map(Fraction, centre)), grid)
        released = Fraction(value[0]) ** (2 if estimate.kind.startswith("stddev") else 1)
        # The float estimate is within rounding of the exact one: relative to the terms of
        # Q/N - (S/N)², which cancel when the variance is near 0.
        n = max(centre[2], 1)
        terms = (abs(centre[0]) / n + (centre[1] / n) ** 2) * float(grid.step / 2) ** 2
        assert float(released) == pytest.approx(float(exact), rel=1e-9, abs=1e-12 * terms)
        assert 0 <= width[0] < math.inf
        truth = reference_variance(estimate.kind, tuple(point), grid)
        assert contains(estimate.kind, float(value[0]), float(width[0]), truth), (
            estimate.kind,
            centre,
            point,
        )


def test_accuracy_is_reported(tmp_path: Path) -> None:
    """Session.execute reports a half-width for each of the six spellings (not for an
    expression over one), under both mechanisms, within the bound range's extent."""
    policy = make_policy(tmp_path, big_rows())
    session = _separate(policy)
    sql = (
        "SELECT region, VAR_POP(spend), VAR_SAMP(spend), VARIANCE(spend), STDDEV_POP(spend), "
        "STDDEV_SAMP(spend), STDDEV(spend), 2 * VAR_POP(spend) FROM visits GROUP BY region"
    )
    for options in ({"epsilon": 1}, {"epsilon": 1, "delta": 1e-8, "mechanism": "gaussian"}):
        result = session.execute(sql, **options)
        assert len(result.rows) == len(REGIONS)
        for row, accuracy in zip(result.rows, result.accuracy, strict=True):
            assert accuracy[0] is None and accuracy[7] is None
            widths = [w for w in accuracy[1:7] if w is not None and w > 0]
            assert len(widths) == 6, accuracy
            # Clamped to [0, 100²] (and [0, 100]), the interval spans at most the whole range.
            assert all(w <= 100**2 for w in widths[:3]) and all(w <= 100 for w in widths[3:])
            # About 8 000 values per group at epsilon 1: informative (19 % of the value seen at
            # worst over 1 200 cells, 12 % typical), far from the whole range (over 100 %).
            assert all(w < 0.4 * v for v, w in zip(row[1:7], widths, strict=True)), row
    # With one value or none in a group the noise swamps every total: the interval is the
    # whole range [0, 100] unless a noise nears or leaves its c^(1/3) half-width (about 1e-4
    # per cell at c = 0.9999, so 3 of 5 cells miss it together with probability about 1e-11).
    tiny = _separate(make_policy(tmp_path, [(1, "east", 200.0, 90)], name="one"))
    result = tiny.execute(
        "SELECT region, STDDEV_POP(spend) FROM visits GROUP BY region", confidence=0.9999
    )
    whole = 0
    for (_, value), (_, width) in zip(result.rows, result.accuracy, strict=True):
        assert width is not None and width <= max(value, 100 - value) + 1e-9
        whole += width == pytest.approx(max(value, 100 - value))
    assert whole >= 3


COVERAGE_GROUPS = tuple(f"g{i:02d}" for i in range(20))
COVERAGE_RUNS = 120  # fresh answers per query: 20 groups each, 2 400 draws per query
COVERAGE_ALPHA = 1e-6  # false-failure rate of each one-sided binomial test


@pytest.mark.statistical
@pytest.mark.parametrize("aggregate", ["VAR_SAMP", "STDDEV_POP"])
def test_half_width_coverage_end_to_end(aggregate: str, tiny_policy: Any) -> None:
    """Through ``Session.execute(..., fresh=True)``: the noise-free bounded value (DuckDB's own
    aggregate over the raw rows, since no bound binds: ages in [18, 90], at most 3 rows and one
    group per unit) lies in value ± half-width in at least 95 % of 2 400 draws (20 groups of
    about 400 values, epsilon 10 per query), up to a one-sided binomial test at 1e-6. Power:
    the same test rejects the half-widths shrunk to 40 % (the box of three c^(1/3) intervals is
    conservative: about 99.6 % coverage seen, the 95 % quantile of |error| near half of h).
    """
    rng = random.Random(11)
    rows = []
    for user in range(len(COVERAGE_GROUPS) * 200):
        for _ in range(rng.randint(1, 3)):
            rows.append((user, COVERAGE_GROUPS[user % len(COVERAGE_GROUPS)], rng.randint(18, 90)))
    columns = {"age": {"lower": 18, "upper": 90}, "region": {"public_values": COVERAGE_GROUPS}}
    policy = tiny_policy(
        [(*r, 1.0) for r in rows],
        max_groups=1,
        max_rows=3,
        columns=columns,
        budget={"epsilon": "10000", "query_epsilon": "10"},
    )
    con = duckdb.connect(":memory:")
    try:
        truth = dict(
            con.execute(
                f"SELECT region, {aggregate}(age) FROM read_parquet(?) GROUP BY region",
                [str(policy.data.tables["visits"])],
            ).fetchall()
        )
    finally:
        con.close()
    session = _separate(policy)
    sql = f"SELECT region, {aggregate}(age) FROM visits GROUP BY region"
    errors, widths = [], []
    for _ in range(COVERAGE_RUNS):
        result = session.execute(sql, fresh=True, confidence=0.95)
        assert result.cached_from is None and len(result.rows) == len(COVERAGE_GROUPS)
        for (group, value), (_, width) in zip(result.rows, result.accuracy, strict=True):
            assert width is not None
            errors.append(abs(value - truth[group]))
            widths.append(width)
    draws = len(errors)

    def plausible(scale: float) -> bool:
        covered = sum(e <= scale * w for e, w in zip(errors, widths, strict=True))
        return float(stats.binom.cdf(covered, draws, 0.95)) >= COVERAGE_ALPHA

    assert plausible(1.0)
    assert not plausible(0.4)
