"""Coverage of the released 95 % half-widths (``Release.accuracy``) at small counts.

The data set has 100 public groups ("g00".."g99") with identical contents: 4 units with 1, 2, 3
and 4 rows (10 rows per group, C = 3 so one unit is capped, L0 = 1), some ages outside the
bounds [18, 90]. So every group has the same bounded totals and one ``release(plan, rows)``
call gives 100 independent draws; the bounded SQL runs once and ``release`` is called
``CALLS`` times, DRAWS = 100 · CALLS draws per query, epsilon 1.

Truth is the pre-noise bounded value computed from the engine totals: the count, the sum times
its grid unit, or for AVG m + centred · (g/2) / count. A draw covers when
|released - truth| <= half-width. The exact discrete coverage is computed independently here:
P(|Z| <= k) from the discrete Laplace pmf for COUNT and SUM, and for AVG by enumerating both
independent noises (each truncated where its tail mass is below 1e-12) through an independent
re-implementation of the interval rule of ``dpsql.noise.measure._avg``.

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
from dpsql.mechanisms.laplace import discrete_laplace_half_width
from dpsql.noise.laplace import discrete_laplace
from dpsql.plan.plans import Plan
from dpsql.release.post import release
from dpsql.session.session import Session

pytestmark = pytest.mark.statistical

EPSILON = Fraction(1)
CONFIDENCE = 0.95
GROUPS = tuple(f"g{i:02d}" for i in range(100))
CALLS = 1000  # release() calls; DRAWS = 100 * CALLS = 10**5 per query
HALF_ALPHA = 5e-7  # each of the two binomial tests; alpha = 1e-6 per test
TRUNCATION = 1e-12  # tail mass left out of the AVG enumeration, per noise
COLUMNS = {
    "age": {"lower": 18, "upper": 90},
    "region": {"public_values": list(GROUPS)},
}

FloatArray = npt.NDArray[np.float64]


def _rows() -> list[tuple[Any, ...]]:
    rows = []
    ages = (10, 25, 33, 47, 52, 61, 70, 88, 95, 40)  # two outside [18, 90]
    for g, group in enumerate(GROUPS):
        i = 0
        for j, n in enumerate((1, 2, 3, 4)):
            for _ in range(n):
                rows.append((4 * g + j, group, ages[i], 1.0))
                i += 1
    return rows


@pytest.fixture
def session(tiny_policy: Callable[..., Any]) -> Session:
    return Session(tiny_policy(_rows(), max_groups=1, max_rows=3, columns=COLUMNS))


# --- independent exact discrete Laplace helpers --------------------------------------------------


def _q(scale: Fraction) -> float:
    return math.exp(-scale.denominator / scale.numerator)


def _pmf(scale: Fraction, z: npt.NDArray[np.int64]) -> FloatArray:
    q = _q(scale)
    return (1 - q) / (1 + q) * np.power(q, np.abs(z).astype(np.float64))


def _central_mass(scale: Fraction, k: int) -> float:
    """P(|Z| <= k), summed from the pmf."""
    return float(_pmf(scale, np.arange(-k, k + 1)).sum())


def _half_width(scale: Fraction, confidence: float) -> int:
    """Smallest k with P(|Z| <= k) >= confidence, by direct search on the pmf sum."""
    k = 0
    while _central_mass(scale, k) < confidence:
        k += 1
    return k


def _truncation(scale: Fraction) -> int:
    """K with P(|Z| > K) = 2 q^(K+1) / (1 + q) < TRUNCATION."""
    q = _q(scale)
    return math.ceil(math.log(TRUNCATION * (1 + q) / 2) / math.log(q))


# --- the draws -----------------------------------------------------------------------------------


class _Recorder:
    """Wraps the real sampler as release() sees it and keeps every draw (to audit the rule)."""

    def __init__(self, sampler: Callable[[Fraction, int], npt.NDArray[np.int64]]) -> None:
        self.sampler = sampler
        self.draws: list[tuple[Fraction, npt.NDArray[np.int64]]] = []

    def __call__(self, scale: Fraction, size: int) -> npt.NDArray[np.int64]:
        out = self.sampler(scale, size)
        self.draws.append((scale, out))
        return out


def _draws(
    session: Session, sql: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[Plan, list[tuple[Any, ...]], FloatArray, FloatArray, list[npt.NDArray[np.int64]]]:
    """Plan, the bounded rows (engine run once), released values, half-widths and the noise of
    each measurement (DRAWS each, aligned with the released rows)."""
    plan = session.plan(sql, epsilon=EPSILON, confidence=CONFIDENCE)
    _, rows = session.engine.run(plan.bounded_sql)
    assert sorted(r[0] for r in rows) == list(GROUPS)
    assert len({tuple(r[1:]) for r in rows}) == 1, "groups must be identical"
    position = [[r[0] for r in rows].index(g) for g in GROUPS]  # released rows are by key
    recorder = _Recorder(discrete_laplace)
    monkeypatch.setattr(release_module, "discrete_laplace", recorder)
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
        assert all(scale == m.scale for scale, _ in recorder.draws[j::k])
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
    kind: str, session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """COUNT(*) and SUM(age) per group: observed coverage of the released half-width agrees
    with the exact P(|Z| <= k) and is not significantly below 95 %.

    False-failure rate: alpha = 1e-6 (two binomial tests at 5e-7 each).
    """
    sql = {
        "count": "SELECT region, COUNT(*) FROM visits GROUP BY region",
        "sum": "SELECT region, SUM(age) FROM visits GROUP BY region",
    }[kind]
    plan, rows, values, widths, (noise,) = _draws(session, sql, monkeypatch)
    (m,) = plan.measurements
    truth = float(rows[0][1] * m.unit)
    # A count, and a sum of ages bounded at or above 0, are published at 0 or above; the ± is
    # the noise's, so its coverage is that of the noisy value before that clamp.
    noisy = truth + noise * float(m.unit)
    assert np.array_equal(values, np.maximum(noisy, 0.0))
    k = _half_width(m.scale, CONFIDENCE)
    assert k == discrete_laplace_half_width(m.scale, CONFIDENCE)
    assert np.all(widths == float(k * m.unit))
    exact = _central_mass(m.scale, k)
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


def test_avg_half_width_coverage(session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    """AVG(age) per group at 9 capped rows: the observed coverage agrees with the exact
    coverage (enumerated over both noises through an independent copy of the interval rule)
    and is not significantly below 95 %.

    False-failure rate: alpha = 1e-6 (two binomial tests at 5e-7 each); the enumeration leaves
    out at most 2e-12 of mass, which only widens the exact coverage to an interval of that size.
    """
    plan, rows, values, widths, noise = _draws(
        session, "SELECT region, AVG(age) FROM visits GROUP BY region", monkeypatch
    )
    (est,) = plan.estimates
    i_sum, i_count = est.measurements
    grid = est.grid
    assert grid is not None
    m_sum, m_count = plan.measurements[i_sum], plan.measurements[i_count]
    centred, count = rows[0][1 + i_sum], rows[0][1 + i_count]
    centre, half = float(grid.centre), float(grid.step) / 2
    lo, hi = float(grid.lower_value), float(grid.upper_value)
    truth = centre + centred * half / count
    assert count >= 1 and lo <= truth <= hi

    joint = math.sqrt(CONFIDENCE)
    k_s, k_n = _half_width(m_sum.scale, joint), _half_width(m_count.scale, joint)
    assert (k_s, k_n) == (
        discrete_laplace_half_width(m_sum.scale, joint),
        discrete_laplace_half_width(m_count.scale, joint),
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

    # Exact coverage: enumerate both noises, one count noise at a time.
    zs = np.arange(-_truncation(m_sum.scale), _truncation(m_sum.scale) + 1)
    p_s = _pmf(m_sum.scale, zs)
    s = (centred + zs).astype(np.float64)
    exact = 0.0
    for zn in range(-_truncation(m_count.scale), _truncation(m_count.scale) + 1):
        n = np.full(s.shape, float(count + zn))
        value, width = _avg_interval(s, n, (k_s, k_n), grid)
        cover = np.abs(value - truth) <= width + slack
        exact += _pmf(m_count.scale, np.array([zn]))[0] * float(p_s[cover].sum())
    assert exact >= CONFIDENCE

    covered = _covered(values, widths, truth, slack)
    ok, below, equal = _check(covered, values.size, exact)
    assert ok, (covered / values.size, exact, below, equal)
    shrunk = _covered(values, 0.8 * widths, truth, slack)
    assert not _check(shrunk, values.size, exact)[0], shrunk / values.size
