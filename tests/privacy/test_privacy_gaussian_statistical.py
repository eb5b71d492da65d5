"""Empirical (epsilon, delta)-DP of the discrete-Gaussian query path, with negative controls.

D and D' are the data sets of ``test_privacy_statistical.py``: D' is D plus one extreme unit with
500 rows (100 in each of the 5 public regions, every value far above its bound). For each query
a Session is built on each data set, the same query is planned with ``mechanism="gaussian"``,
epsilon 1, delta 1e-6 (the plans' measurements must be identical), and the plan's engine SQL
runs ONCE per data set. The noisy measurements are then drawn as ``dpsql.noise.measure`` draws
them: bounded total + ``discrete_gaussian(measurement.sigma2, N)`` per cell. Everything after
(AVG, clamping, HAVING, ...) is post-processing, so testing the noisy measurements is stronger.
Only the cells whose totals differ between D and D' are drawn; the others have the same law
under both and are independent of them. One noise array per cell serves both data sets
(O = x + Z on D, O' = x + d + Z on D'): each probability estimate below is then exactly
binomial, and the Bonferroni bound over them needs no independence between them.

Events. With shifts d_i and variances s_i, the log-likelihood ratio of D' to D is linear in the
output: T = sum_i w_i (O_i - x_i), w_i = d_i / s_i; under D it has mean 0 and standard deviation
mu = sqrt(sum_i d_i^2 / s_i) (the continuous approximation; the probabilities themselves are
computed exactly, see ``_exact``), under D' mean mu^2. The events are the level sets "up z"
{T >= z mu} and their mirrors "down z" {T <= mu^2 - z mu}, z in THRESHOLDS = (1.5, 2.75); each
is checked in both orders.

Why these thresholds. A Gaussian has no pure ratio bound: P_D'(up z) / P_D(up z) grows like
exp(mu z) without limit, and (epsilon, delta)-DP only holds through delta in the far tail (the
exact ratio passes e beyond z ~ 4.1 for COUNT, where P_D ~ 2e-5, and z ~ 4.4 for the GROUP BY,
P_D ~ 5e-6). At z <= 2.75 the events have mass >= 2.8e-3 (delta = 1e-6 is below 0.04 % of it)
and the exact ratio of the real mechanism is at most 2.016 (COUNT, mu 0.237; 1.543 at z = 1.5)
and 1.918 (GROUP BY, mu 0.221; 1.503 at z = 1.5), far below e = 2.718; with sigma halved (mu
doubled) the exact ratio at z = 2.75 is 3.903 and 3.518, far above. z = 2.75 is about where
the halved control needs the fewest draws; z = 1.5 adds events with 7-10 % mass.

Check: for each event E and order (P, P') of (D, D'), H0 is P(E) <= e^epsilon P'(E) + delta. It
is rejected when the one-sided Clopper-Pearson lower bound of P(E) exceeds e^epsilon times the
upper bound of P'(E) plus delta; with every bound at level a = (ALPHA / 2) / (2 · comparisons),
a true H0 is rejected with probability at most ALPHA / 2 per test. The true-path test spends the
other ALPHA / 2 on two-sided binomial tests of every estimate against its exact probability.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from scipy import signal, stats

from dpsql.mechanisms.gaussian import discrete_gaussian_pmf
from dpsql.noise.gaussian import discrete_gaussian
from dpsql.plan.plans import Measurement, Plan
from dpsql.session.session import Session

pytestmark = pytest.mark.statistical

EPSILON = Fraction(1)
DELTA = Fraction(1, 10**6)
MAX_GROUPS = 2  # L0
MAX_ROWS = 5  # C
DRAWS = 200_000  # true path: noise draws per differing cell
HALVED_DRAWS = 1_000_000  # sigma-halved control (see its docstring for the power)
LOOSE_DRAWS = 20_000  # bounding-removed control
ALPHA = 1e-6  # false-failure rate of one true-path test case (2 cases: 2e-6 for the file)
THRESHOLDS = (1.5, 2.75)  # z, in standard deviations of T under D (see the module docstring)
TRUNCATION = 1e-16  # relative pmf weight where the exact enumeration stops, per cell
REGIONS = ("central", "east", "north", "south", "west")
EXTREME_UNIT = 10**6
UNBOUNDED = 10**6  # L0 and C for the "bounding removed" control

QUERIES = {
    "count": "SELECT COUNT(*) FROM visits",
    "count_sum_by_region": "SELECT region, COUNT(*), SUM(age) FROM visits GROUP BY region",
}

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
Totals = dict[tuple[Any, int], int]  # (group key, measurement index) -> bounded total
Cell = tuple[int, int, Fraction]  # (x_i on D, d_i = x'_i - x_i, sigma2_i)


def _base_rows() -> list[tuple[Any, ...]]:
    """D: 30 units, each in at most L0 regions (so the salted group choice never matters for
    them), some with more than C rows, some values outside the bounds."""
    rows = []
    for u in range(30):
        regions = [REGIONS[u % 5]] if u % 3 else [REGIONS[u % 5], REGIONS[(u + 2) % 5]]
        for region in regions:
            for r in range(1 + (u * 7 + REGIONS.index(region)) % 8):
                age = 15 + (u * 13 + r * 5) % 85  # 15..99, partly outside [18, 90]
                spend = float((u * 37 + r * 11) % 260) - 20.5  # partly outside [0, 200]
                rows.append((u, region, age, spend))
    return rows


def _neighbour_rows() -> list[tuple[Any, ...]]:
    """D' = D plus one unit with 500 rows (100 per region) of values far above the bounds."""
    extreme = [(EXTREME_UNIT, region, 10**6, 1e12) for region in REGIONS for _ in range(100)]
    return _base_rows() + extreme


@pytest.fixture
def sessions(tiny_policy: Callable[..., Any]) -> tuple[Session, Session]:
    base = Session(tiny_policy(_base_rows(), max_groups=MAX_GROUPS, max_rows=MAX_ROWS))
    neighbour = Session(tiny_policy(_neighbour_rows(), max_groups=MAX_GROUPS, max_rows=MAX_ROWS))
    return base, neighbour


def _plan(session: Session, sql: str, **bounds: int) -> Plan:
    return session.plan(sql, None, mechanism="gaussian", epsilon=EPSILON, delta=DELTA, **bounds)


def _totals(session: Session, plan: Plan) -> Totals:
    """Run the plan's engine SQL once; totals keyed by (group key, measurement index)."""
    _, rows = session.engine.run(plan.engine_sql)
    n_keys = len(plan.analysis.keys)
    totals: Totals = {}
    for row in rows:
        key = tuple(row[:n_keys])
        for j in range(len(plan.measurements)):
            totals[(key, j)] = int(row[n_keys + j] or 0)
    return totals


def _cells(base: Totals, neighbour: Totals, measurements: tuple[Measurement, ...]) -> list[Cell]:
    """(x_i, d_i, sigma2_i) for every cell whose totals differ."""
    assert base.keys() == neighbour.keys()
    cells = []
    for c in sorted(base, key=repr):
        if neighbour[c] != base[c]:
            sigma2 = measurements[c[1]].sigma2
            assert sigma2 is not None
            cells.append((base[c], neighbour[c] - base[c], sigma2))
    assert cells and all(d > 0 for _, d, _ in cells)  # D' adds a unit: every shift is up
    return cells


def _classes(cells: list[Cell]) -> list[tuple[float, list[int]]]:
    """Cells grouped by their weight w = d / sigma2 (T is linear in each class's noise sum);
    at most two classes, the second enumerated against the first's tail in ``_exact``."""
    weights: dict[Fraction, list[int]] = {}
    for i, (_, d, sigma2) in enumerate(cells):
        weights.setdefault(d / sigma2, []).append(i)
    assert 1 <= len(weights) <= 2, "the exact enumeration handles at most two weight classes"
    return [(float(w), members) for w, members in sorted(weights.items())]


def _mu(cells: list[Cell]) -> float:
    """Standard deviation of T under D: sqrt(sum d_i^2 / sigma2_i)."""
    return math.sqrt(float(sum((Fraction(d * d) / s for _, d, s in cells), Fraction(0))))


def _rho(cells: list[Cell]) -> Fraction:
    """The zCDP rho the shift actually costs: sum d_i^2 / (2 sigma2_i) (CKS 2020 Theorem 14)."""
    return sum((Fraction(d * d) / (2 * s) for _, d, s in cells), Fraction(0))


# --- events: on draws and exactly ----------------------------------------------------------------


def _event_thresholds(mu: float) -> list[tuple[str, float]]:
    """("up z", t) for {T >= t = z mu} and ("down z", t) for {-T >= t = z mu - mu^2}."""
    out = []
    for z in THRESHOLDS:
        out.append((f"up {z}", z * mu))
        out.append((f"down {z}", z * mu - mu * mu))
    return out


def _at_least(w: list[float], sums: list[IntArray], t: float, sign: int) -> npt.NDArray[np.bool_]:
    """sign · sum_c w_c · sums_c >= t, decided on the integer lattice of the last class:
    sign · sums_last >= ceil((t - sign · w_first · sums_first) / w_last) / sign."""
    rest = t - sign * w[0] * sums[0].astype(np.float64) if len(w) == 2 else np.full(1, t)
    bound = np.ceil(rest / w[-1])
    return np.asarray(sign * sums[-1] >= bound)


def _observed(cells: list[Cell], noise: list[IntArray]) -> list[tuple[str, int, int, int]]:
    """Per event: (name, hits on D, hits on D', draws), from one noise array per cell."""
    classes = _classes(cells)
    w = [c[0] for c in classes]
    zs = [sum((noise[i] for i in members), np.zeros_like(noise[0])) for _, members in classes]
    shifts = [sum(cells[i][1] for i in members) for _, members in classes]
    out = []
    for name, t in _event_thresholds(_mu(cells)):
        sign = 1 if name.startswith("up") else -1
        hits = []
        for on_neighbour in (0, 1):
            sums = [z + on_neighbour * s for z, s in zip(zs, shifts, strict=True)]
            hits.append(int(_at_least(w, sums, t, sign).sum()))
        out.append((name, hits[0], hits[1], noise[0].size))
    return out


def _pmf(sigma2: Fraction) -> tuple[int, FloatArray]:
    """(K, P(Z = k) for k = -K..K): exp(-k^2 / (2 sigma2)) normalised over the window, which
    leaves out weight below TRUNCATION relative to the centre (total < 1e-15 for sigma <= 1e5)."""
    s = float(sigma2)
    k_max = math.ceil(math.sqrt(2 * s * math.log(1 / TRUNCATION))) + 1
    k = np.arange(-k_max, k_max + 1, dtype=np.float64)
    weights = np.exp(-(k * k) / (2 * s))
    return k_max, weights / weights.sum()


def _class_pmf(cells: list[Cell], members: list[int]) -> tuple[int, FloatArray]:
    """Law of the class's noise sum (offset, pmf): the convolution of its cells' pmfs."""
    offset, pmf = 0, np.ones(1)
    for i in members:
        k_max, p = _pmf(cells[i][2])
        offset, pmf = offset + k_max, np.clip(signal.fftconvolve(pmf, p), 0.0, None)
    return offset, pmf / pmf.sum()


def _exact(cells: list[Cell]) -> list[tuple[float, float]]:
    """Per event: the exact (P_D, P_D') from the discrete Gaussian pmfs (up to ~1e-13).

    The last class's sum is handled by its tail function; the first (if two) is enumerated.
    Z is symmetric, so P(-(s + Z) >= m) = P(Z >= m + s) as well."""
    classes = _classes(cells)
    w = [c[0] for c in classes]
    laws = [_class_pmf(cells, members) for _, members in classes]
    shifts = [sum(cells[i][1] for i in members) for _, members in classes]
    off_last, pmf_last = laws[-1]
    tail = np.concatenate([np.cumsum(pmf_last[::-1])[::-1], [0.0]])  # tail[j] = P(Z >= j - off)

    def p_at_least(t: float, sign: int, on_neighbour: int) -> float:
        if len(w) == 2:
            off, pmf = laws[0]
            first = sign * (np.arange(pmf.size) - off + on_neighbour * shifts[0])
            rest = t - w[0] * first.astype(np.float64)
        else:
            pmf, rest = np.ones(1), np.full(1, t)
        m = np.ceil(rest / w[-1])
        # sign · (on_neighbour · shift + Z) >= m  <=>  sign · Z >= m - sign · on_neighbour ·
        # shift, and sign · Z has the law of Z (symmetric, independent of the first class).
        low = m - sign * on_neighbour * shifts[-1] + off_last
        j = np.clip(low, 0, tail.size - 1).astype(np.int64)
        return float(np.dot(pmf, tail[j]))

    out = []
    for name, t in _event_thresholds(_mu(cells)):
        sign = 1 if name.startswith("up") else -1
        out.append((p_at_least(t, sign, 0), p_at_least(t, sign, 1)))
    return out


# --- the checks ----------------------------------------------------------------------------------


def _upper(k: int, n: int, a: float) -> float:
    return 1.0 if k == n else float(stats.beta.ppf(1 - a, k + 1, n - k))


def _lower(k: int, n: int, a: float) -> float:
    return 0.0 if k == 0 else float(stats.beta.ppf(a, k, n - k + 1))


def _violation(observed: list[tuple[str, int, int, int]]) -> tuple[float, list[Any]]:
    """The largest certified lower bound of P(E) / (e^epsilon P'(E) + delta) over events and
    orders (> 1: a violation at level ALPHA / 2), and per event both estimated ratios."""
    a = (ALPHA / 2) / (2 * 2 * len(observed))
    bound, delta = math.exp(float(EPSILON)), float(DELTA)
    worst, estimates = 0.0, []
    for name, k_d, k_n, n in observed:
        for num, den in ((k_d, k_n), (k_n, k_d)):
            worst = max(worst, _lower(num, n, a) / (bound * _upper(den, n, a) + delta))
        estimates.append((name, k_n / k_d if k_d else math.inf, k_d / k_n if k_n else math.inf))
    return worst, estimates


def _noise(cells: list[Cell], draws: int) -> list[IntArray]:
    # What release() draws for each cell: discrete_gaussian(sigma2, size) (``_noisy``).
    return [discrete_gaussian(s, draws) for _, _, s in cells]


def _rho_of(measurements: tuple[Measurement, ...]) -> Fraction:
    return sum((m.rho for m in measurements), Fraction(0))


def _real(sessions: tuple[Session, Session], query: str) -> tuple[Plan, Totals, Totals]:
    """The real plan (identical on D and D') and the bounded totals on D and D'."""
    base, neighbour = sessions
    plan, plan_n = _plan(base, QUERIES[query]), _plan(neighbour, QUERIES[query])
    assert plan.measurements == plan_n.measurements
    assert all(m.sigma2 is not None and m.scale is None for m in plan.measurements)
    assert (plan.epsilon, plan.delta) == (EPSILON, DELTA)
    return plan, _totals(base, plan), _totals(neighbour, plan_n)


def _ratios(exact: list[tuple[float, float]]) -> list[float]:
    """The larger of the two exact ratios of each event (the smaller is below 1)."""
    return [max(p_n / p_d, p_d / p_n) for p_d, p_n in exact]


def test_local_pmf_matches_dpsql() -> None:
    """The local pmf used for the exact probabilities agrees with dpsql's own to 1e-12."""
    for sigma2 in (Fraction(119789142391, 268435456), Fraction(16628366)):
        k_max, pmf = _pmf(sigma2)
        for k in (0, 1, 17, k_max // 3, k_max // 2):
            assert math.isclose(pmf[k_max + k], discrete_gaussian_pmf(sigma2, k), rel_tol=1e-12)


@pytest.mark.parametrize("query", sorted(QUERIES))
def test_neighbouring_outputs_are_epsilon_delta_close(
    query: str, sessions: tuple[Session, Session]
) -> None:
    """The real gaussian plans on D and D' satisfy P_D(E) <= e^epsilon P_D'(E) + delta on every
    event, and every estimated probability agrees with its exact value.

    COUNT(*) without GROUP BY is one measurement calibrated on the exact discrete curve
    (sigma2 ~ 446.25, mu = 0.237); the GROUP BY with COUNT and SUM has four differing cells
    (2 groups x 2 measurements, joint rho ~ 0.0244: sigma2 ~ 2052.9 and ~1.663e7, mu = 0.221).
    Exact ratios: <= 2.016 and <= 1.918 against e = 2.718 (asserted below to be < 0.75 e); the
    checked statistic is then ~0.53 and ~0.52 (binomial replays: never above 0.61 in 2000).

    False-failure rate: alpha = 1e-6 per query (5e-7 for the Clopper-Pearson check, Bonferroni
    over events, orders and both bounds; 5e-7 for the 8 two-sided binomial agreement tests).
    """
    plan, totals, totals_n = _real(sessions, query)
    cells = _cells(totals, totals_n, plan.measurements)
    # The extreme unit saturates every sensitivity: the shift costs exactly the plan's rho.
    assert _rho(cells) == _rho_of(plan.measurements)
    exact = _exact(cells)
    assert max(_ratios(exact)) < 0.75 * math.e, exact  # deterministic: well inside the bound
    observed = _observed(cells, _noise(cells, DRAWS))
    worst, estimates = _violation(observed)
    assert worst <= 1.0, (worst, estimates)
    a = (ALPHA / 2) / (2 * len(observed))
    for (name, k_d, k_n, n), probs in zip(observed, exact, strict=True):
        for k, p in zip((k_d, k_n), probs, strict=True):
            assert stats.binomtest(k, n, p).pvalue >= a, (name, k / n, p)


@pytest.mark.parametrize("query", sorted(QUERIES))
def test_halved_sigma_is_detected(query: str, sessions: tuple[Session, Session]) -> None:
    """Negative control: the same cells with every sigma2 divided by 4 (sigma halved, rho x4)
    must fail the same check.

    Exact ratio at z = 2.75: 3.903 (COUNT) and 3.518 (GROUP BY) against e, P_D(up) ~ 3e-3.
    With HALVED_DRAWS = 10**6 the checked statistic (certified lower bound / (e·upper + delta))
    of one such event is 1.115 +- 0.023 for the GROUP BY (5.1 standard deviations above 1: missed
    with probability ~2e-7) and 1.227 +- 0.026 for COUNT (8.8 sd); the up and down events of
    z = 2.75 live in opposite tails of the same draws (nearly independent), so the control is
    missed with probability ~1e-13 or less (binomial replays: the minimum of 2000 was 1.068).
    The check runs at the true-path test's level.
    """
    plan, totals, totals_n = _real(sessions, query)
    halved = tuple(
        dataclasses.replace(m, sigma2=Fraction(m.sigma2 or 0) / 4) for m in plan.measurements
    )
    cells = _cells(totals, totals_n, halved)
    assert _rho(cells) == _rho_of(halved) == 4 * _rho_of(plan.measurements)
    exact = _exact(cells)
    assert max(_ratios(exact)) > 1.25 * math.e, exact  # deterministic: far outside the bound
    observed = _observed(cells, _noise(cells, HALVED_DRAWS))
    worst, estimates = _violation(observed)
    assert worst > 1.0, (worst, estimates)


@pytest.mark.parametrize("query", sorted(QUERIES))
def test_removed_bounding_is_detected(query: str, sessions: tuple[Session, Session]) -> None:
    """Negative control: totals from a plan with L0 = C = 10**6 (no effective contribution
    bound), noise variances from the real plan, must fail the same check.

    The extreme unit then moves the totals by 100x (COUNT: 500 rows, mu ~ 23.7) or 20x per
    count cell over 5 groups (GROUP BY, mu ~ 7): the up event at z = 2.75 has mass ~1 on D' and
    ~3e-3 on D, a ratio of hundreds, so the control is missed with probability far below 1e-12
    even with LOOSE_DRAWS = 20 000. The check runs at the true-path test's level.
    """
    base, neighbour = sessions
    sql = QUERIES[query]
    real, _, _ = _real(sessions, query)
    loose = {"max_groups_per_unit": UNBOUNDED, "max_rows_per_unit_per_group": UNBOUNDED}
    plan, plan_n = _plan(base, sql, **loose), _plan(neighbour, sql, **loose)
    assert [m.spec for m in plan.measurements] == [m.spec for m in real.measurements]
    cells = _cells(_totals(base, plan), _totals(neighbour, plan_n), real.measurements)
    assert _rho(cells) >= 100 * _rho_of(real.measurements)
    worst, estimates = _violation(_observed(cells, _noise(cells, LOOSE_DRAWS)))
    assert worst > 1.0, (worst, estimates)
