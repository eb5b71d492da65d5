"""Coverage of the released 95 % half-widths under the discrete Gaussian, at small counts.

The setting of ``test_coverage_statistical.py`` with ``mechanism="gaussian"``, epsilon 1, delta
1e-6: 100 public groups ("g00".."g99") with identical contents, so one ``release(plan, rows)``
call gives 100 independent draws; the bounded SQL runs once and ``release`` is called CALLS
times (DRAWS = 10**5 per query), with the sampler wrapped to record every noise value. The
"small" data set has 4 units per group with 1, 2, 3 and 4 rows (C = 3, L0 = 1: count 9); the
"moderate" one repeats them 30 times per group (count 270), where the AVG interval is no longer
close to the whole bound range.

Truth is the pre-noise bounded value from the engine totals (the count, the sum times its unit,
or for AVG m + centred · (g/2) / count). A draw covers when |released - truth| <= half-width.
The exact discrete coverage is computed here independently of dpsql (a local pmf
exp(-k^2 / (2 sigma2)) normalised over a window leaving out < 1e-12 of mass): P(|Z| <= k) for
COUNT and SUM, and for AVG a full enumeration of both independent noises (per noise < 1e-12 of
mass left out) through an independent re-implementation of the interval rule of
``dpsql.noise.measure._avg``. The enumeration is small enough to be exact: with these bounds
the centred sum's sigma is ~1.4e3 (a window of ~2.4e4 values) and the count's ~19 (~330
values), so no coarse grid is needed.

Measured (one run, 10**5 draws each; exact in brackets): COUNT sigma2 ~ 160.48, k = 25,
0.9562 [0.95593]; SUM sigma2 ~ 1.4966e6, k = 2398, 0.9493 [0.95008]; AVG (k_s, k_n) =
(3095, 43) at sigma2 ~ 1.9156e6 and ~369.5: count 9, 0.9816 [0.981751]; count 270, 0.9985
[0.998774] (the box over two sqrt(0.95) intervals is conservative). Half-widths shrunk to 80 %
cover 0.896, 0.883, 0.974 and 0.986: all rejected.

Checks, at false-failure rate alpha = 1e-6 per test: the exact coverage is at least 0.95
(deterministic); the observed coverage is not significantly below 0.95 (one-sided binomial,
5e-7) and agrees with the exact coverage (two-sided binomial, 5e-7). A power check verifies
that the same tests reject half-widths shrunk to 80 %.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from scipy import stats

import dpsql.noise.measure as release_module
from dpsql.bound.grid import Grid
from dpsql.mechanisms.gaussian import discrete_gaussian_half_width
from dpsql.noise.gaussian import discrete_gaussian
from dpsql.plan.plans import Plan
from dpsql.release.post import release
from dpsql.session.session import Session

pytestmark = pytest.mark.statistical

EPSILON = Fraction(1)
DELTA = Fraction(1, 10**6)
CONFIDENCE = 0.95
GROUPS = tuple(f"g{i:02d}" for i in range(100))
CALLS = 1000  # release() calls; DRAWS = 100 * CALLS = 10**5 per query
HALF_ALPHA = 5e-7  # each of the two binomial tests; alpha = 1e-6 per test
TRUNCATION = 1e-12  # mass left out of each exact enumeration, per noise
REPEATS = {"small": 1, "moderate": 30}  # copies of the 4 units per group
COLUMNS = {
    "age": {"lower": 18, "upper": 90},
    "region": {"public_values": list(GROUPS)},
}

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def _rows(repeats: int) -> list[tuple[Any, ...]]:
    rows = []
    ages = (10, 25, 33, 47, 52, 61, 70, 88, 95, 40)  # two outside [18, 90]
    for g, group in enumerate(GROUPS):
        for rep in range(repeats):
            i = 0
            for j, n in enumerate((1, 2, 3, 4)):
                for _ in range(n):
                    unit = (g * repeats + rep) * 4 + j
                    rows.append((unit, group, ages[(i + rep) % len(ages)], 1.0))
                    i += 1
    return rows


@pytest.fixture
def make_session(tiny_policy: Callable[..., Any]) -> Callable[[str], Session]:
    def make(size: str) -> Session:
        policy = tiny_policy(_rows(REPEATS[size]), max_groups=1, max_rows=3, columns=COLUMNS)
        return Session(policy)

    return make


# --- independent exact discrete Gaussian helpers ------------------------------------------------


def _support(sigma2: Fraction) -> tuple[IntArray, FloatArray]:
    """(k, P(Z = k)) on -K..K: exp(-k^2 / (2 sigma2)) normalised over the window. K makes the
    left-out mass 2·sum_{j > K} exp(-j^2/(2 sigma2)) / norm below TRUNCATION (Gaussian tail
    bound: < exp(-K^2 / (2 sigma2)) for K >= sigma, and K/sigma >= sqrt(2 ln(1/TRUNCATION)))."""
    s = float(sigma2)
    k_max = math.ceil(math.sqrt(2 * s * math.log(1 / TRUNCATION)) + math.sqrt(s)) + 1
    k = np.arange(-k_max, k_max + 1, dtype=np.int64)
    weights = np.exp(-(k.astype(np.float64) ** 2) / (2 * s))
    return k, weights / weights.sum()


def _central_mass(sigma2: Fraction, k: int) -> float:
    """P(|Z| <= k), summed from the local pmf."""
    z, p = _support(sigma2)
    return float(p[np.abs(z) <= k].sum())


def _half_width(sigma2: Fraction, confidence: float) -> int:
    """Smallest k with P(|Z| <= k) >= confidence, by a direct scan of the local pmf."""
    z, p = _support(sigma2)
    order = np.argsort(np.abs(z), kind="stable")
    mass = np.cumsum(p[order])
    radius = np.abs(z[order])
    # The cumulative mass at the last index of each radius is P(|Z| <= radius).
    last = np.flatnonzero(np.append(radius[1:] != radius[:-1], True))
    return int(radius[last][np.argmax(mass[last] >= confidence)])


# --- the draws ----------------------------------------------------------------------------------


class _Recorder:
    """Wraps the real sampler as release() sees it and keeps every draw (to audit the rule)."""

    def __init__(self, sampler: Callable[[Fraction, int], IntArray]) -> None:
        self.sampler = sampler
        self.draws: list[tuple[Fraction, IntArray]] = []

    def __call__(self, sigma2: Fraction, size: int) -> IntArray:
        out = self.sampler(sigma2, size)
        self.draws.append((sigma2, out))
        return out


def _draws(
    session: Session, sql: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[Plan, list[tuple[Any, ...]], FloatArray, FloatArray, list[IntArray]]:
    """Plan, the bounded rows (engine run once), released values, half-widths and the noise of
    each measurement (DRAWS each, aligned with the released rows)."""
    plan = session.plan(
        sql, mechanism="gaussian", epsilon=EPSILON, delta=DELTA, confidence=CONFIDENCE
    )
    assert all(m.sigma2 is not None and m.scale is None for m in plan.measurements)
    _, rows = session.engine.run(plan.engine_sql)
    assert sorted(r[0] for r in rows) == list(GROUPS)
    assert len({tuple(r[1:]) for r in rows}) == 1, "groups must be identical"
    position = [[r[0] for r in rows].index(g) for g in GROUPS]  # released rows are by key
    recorder = _Recorder(discrete_gaussian)
    monkeypatch.setattr(release_module, "discrete_gaussian", recorder)
    values: list[float] = []
    widths: list[float] = []
    for _ in range(CALLS):
        out = release(plan, rows)
        assert [r[0] for r in out.rows] == list(GROUPS)
        values.extend(float(r[1]) for r in out.rows)
        widths.extend(float(a[1]) for a in out.accuracy)  # type: ignore[arg-type]
    k = len(plan.measurements)
    assert len(recorder.draws) == k * CALLS
    noise = []
    for j, m in enumerate(plan.measurements):
        assert all(sigma2 == m.sigma2 for sigma2, _ in recorder.draws[j::k])
        noise.append(np.concatenate([d[position] for _, d in recorder.draws[j::k]]))
    return plan, rows, np.array(values), np.array(widths), noise


def _check(covered: int, draws: int, exact: float) -> tuple[bool, float, float]:
    """(passes, p-value of 'coverage >= 0.95', p-value of 'coverage == exact')."""
    below = float(stats.binom.cdf(covered, draws, CONFIDENCE))
    equal = float(stats.binomtest(covered, draws, exact).pvalue)
    return exact >= CONFIDENCE and below >= HALF_ALPHA and equal >= HALF_ALPHA, below, equal


def _covered(values: FloatArray, widths: FloatArray, truth: float, slack: float) -> int:
    return int((np.abs(values - truth) <= widths + slack).sum())


@pytest.mark.parametrize("kind", ["count", "sum"])
def test_count_and_sum_half_width_coverage(
    kind: str, make_session: Callable[[str], Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    """COUNT(*) and SUM(age) per group (count 9): observed coverage of the released half-width
    agrees with the exact P(|Z| <= k) of the discrete Gaussian and is not significantly below
    95 %; the half-width is the smallest such k (independent scan of the pmf).

    False-failure rate: alpha = 1e-6 (two binomial tests at 5e-7 each).
    """
    sql = {
        "count": "SELECT region, COUNT(*) FROM visits GROUP BY region",
        "sum": "SELECT region, SUM(age) FROM visits GROUP BY region",
    }[kind]
    plan, rows, values, widths, (noise,) = _draws(make_session("small"), sql, monkeypatch)
    (m,) = plan.measurements
    assert m.sigma2 is not None
    truth = float(rows[0][1] * m.unit)
    # A count, and a sum of ages bounded at or above 0, are published at 0 or above; the ± is
    # the noise's, so its coverage is that of the noisy value before that clamp.
    noisy = truth + noise * float(m.unit)
    assert np.array_equal(values, np.maximum(noisy, 0.0))
    k = _half_width(m.sigma2, CONFIDENCE)
    assert k == discrete_gaussian_half_width(m.sigma2, CONFIDENCE)
    assert np.all(widths == float(k * m.unit))
    exact = _central_mass(m.sigma2, k)
    assert _central_mass(m.sigma2, k - 1) < CONFIDENCE <= exact
    # The clamp moves a value toward a truth at or above 0: it never uncovers one.
    assert _covered(values, widths, truth, 0.0) >= _covered(noisy, widths, truth, 0.0)
    values = noisy
    covered = _covered(values, widths, truth, 0.0)
    ok, below, equal = _check(covered, values.size, exact)
    assert ok, (covered / values.size, exact, below, equal)
    # Power: half-widths shrunk to 80 % are rejected by the same check.
    shrunk = _covered(values, 0.8 * widths, truth, 0.0)
    assert not _check(shrunk, values.size, exact)[0], shrunk / values.size


def _avg_interval(
    s: FloatArray, n: FloatArray, k: tuple[int, int], grid: Grid
) -> tuple[FloatArray, FloatArray]:
    """Independent statement of the AVG rule: estimate clamp(centre + half·s/max(n, 1)); the
    true ratio S/N lies in the box [s ± k_s] x [max(n ± k_n, 1)] when both noises are within
    their half-widths (and N >= 1), so its range is spanned by the four corners; the released
    half-width is the larger distance from the estimate to the clamped range's ends, and the
    whole bound range when even n + k_n < 1 or the box's range misses the bounds. ``k`` is
    (k_s, k_n); s is in units of g/2."""
    k_s, k_n = k
    centre, half = float(grid.centre), float(grid.step) / 2
    lo, hi = float(grid.lower_value), float(grid.upper_value)
    value = np.clip(centre + half * s / np.maximum(n, 1.0), lo, hi)
    corners = [(s + ds) / np.maximum(n + dn, 1.0) for ds in (-k_s, k_s) for dn in (-k_n, k_n)]
    low = centre + half * np.minimum.reduce(corners)
    high = centre + half * np.maximum.reduce(corners)
    # A box whose range misses the bounds did not cover the noise: the whole range.
    hopeless = (n + k_n < 1) | (high < lo) | (low > hi)
    low, high = np.clip(low, lo, hi), np.clip(high, lo, hi)
    low = np.where(hopeless, lo, low)
    high = np.where(hopeless, hi, high)
    return value, np.maximum(value - low, high - value)


def _avg_exact(
    centred: int, count: int, sigma2: tuple[Fraction, Fraction], k: tuple[int, int], grid: Grid
) -> float:
    """Exact coverage: enumerate both noises (sum vectorized, one count noise at a time)."""
    centre, half = float(grid.centre), float(grid.step) / 2
    truth = centre + centred * half / count
    slack = 1e-9 * float(grid.upper_value - grid.lower_value)
    z_s, p_s = _support(sigma2[0])
    s = (centred + z_s).astype(np.float64)
    exact = 0.0
    for z_n, p_n in zip(*_support(sigma2[1]), strict=True):
        n = np.full(s.shape, float(count + z_n))
        value, width = _avg_interval(s, n, k, grid)
        exact += float(p_n) * float(p_s[np.abs(value - truth) <= width + slack].sum())
    return exact


@pytest.mark.parametrize("size", sorted(REPEATS))
def test_avg_half_width_coverage(
    size: str, make_session: Callable[[str], Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    """AVG(age) per group at 9 (small) and 270 (moderate) capped rows: the observed coverage
    agrees with the exact coverage (both noises enumerated through an independent copy of the
    interval rule) and is not significantly below 95 %.

    At count 9 the count noise (sigma ~ 19, k_n ~ 43) makes the interval nearly the whole bound
    range, so coverage is ~1; at count 270 the interval is informative and coverage is lower.

    False-failure rate: alpha = 1e-6 (two binomial tests at 5e-7 each); the enumeration leaves
    out at most 2e-12 of mass, which only widens the exact coverage to an interval of that size.
    """
    plan, rows, values, widths, noise = _draws(
        make_session(size), "SELECT region, AVG(age) FROM visits GROUP BY region", monkeypatch
    )
    (est,) = plan.estimates
    i_sum, i_count = est.measurements
    grid = est.grid
    assert grid is not None
    m_sum, m_count = plan.measurements[i_sum], plan.measurements[i_count]
    assert m_sum.sigma2 is not None and m_count.sigma2 is not None
    centred, count = rows[0][1 + i_sum], rows[0][1 + i_count]
    centre, half = float(grid.centre), float(grid.step) / 2
    lo, hi = float(grid.lower_value), float(grid.upper_value)
    truth = centre + centred * half / count
    assert count == 9 * REPEATS[size] and lo <= truth <= hi

    joint = math.sqrt(CONFIDENCE)
    k_s, k_n = _half_width(m_sum.sigma2, joint), _half_width(m_count.sigma2, joint)
    assert (k_s, k_n) == (
        discrete_gaussian_half_width(m_sum.sigma2, joint),
        discrete_gaussian_half_width(m_count.sigma2, joint),
    )
    # The released values and widths are the rule's, at the noise release() actually drew.
    slack = 1e-9 * (hi - lo)
    mine = _avg_interval(
        centred + noise[i_sum].astype(np.float64),
        count + noise[i_count].astype(np.float64),
        (k_s, k_n),
        grid,
    )
    assert np.allclose(values, mine[0], rtol=0, atol=slack)
    assert np.allclose(widths, mine[1], rtol=0, atol=slack)

    exact = _avg_exact(centred, count, (m_sum.sigma2, m_count.sigma2), (k_s, k_n), grid)
    assert exact >= CONFIDENCE
    covered = _covered(values, widths, truth, slack)
    ok, below, equal = _check(covered, values.size, exact)
    assert ok, (covered / values.size, exact, below, equal)
    shrunk = _covered(values, 0.8 * widths, truth, slack)
    assert not _check(shrunk, values.size, exact)[0], shrunk / values.size
