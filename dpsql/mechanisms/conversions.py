"""Conversions between privacy notions: Renyi DP, zCDP, Gaussian DP and (epsilon, delta)-DP.

Pure functions on floats. Each returns a figure that is *valid*: an epsilon is rounded up and a
delta is rounded up (``round_up``), so float error never reports less privacy loss than the
theorem gives. Where a figure is an infimum over a free parameter (an order alpha), the value at
any alpha is itself a valid bound, so a numerical optimizer that misses the exact optimum costs
tightness, never validity.

References:
- Mironov, "Renyi Differential Privacy", CSF 2017 (Proposition 3: classic conversion).
- Canonne, Kamath, Steinke, "The Discrete Gaussian for Differential Privacy", NeurIPS 2020,
  arXiv:2004.00010 (Proposition 12: improved conversion; Corollary 13: zCDP; Theorem 7: the
  discrete Gaussian's exact delta(epsilon)). The same conversion is in Asoodeh et al. 2021 and
  Balle et al. 2020.
- Bun, Steinke, "Concentrated Differential Privacy", TCC 2016 (Proposition 1.3: simple bound).
- Dong, Roth, Su, "Gaussian Differential Privacy", JRSS-B 2022, arXiv:1905.02383 (Cor. 2.13).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np
from scipy.special import log_ndtr

from dpsql.errors import ParameterError

__all__ = [
    "FLOAT_SLACK",
    "SUM_SLACK",
    "discrete_gaussian_delta",
    "discrete_gaussian_epsilon",
    "frac_down",
    "frac_up",
    "gaussian_rdp_epsilon_optimal_order",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu_cap",
    "laplace_delta",
    "rdp_to_delta",
    "rdp_to_dp",
    "rdp_to_dp_classic",
    "round_down",
    "round_up",
    "zcdp_to_delta",
    "zcdp_to_dp",
    "zcdp_to_dp_simple",
]

FLOAT_SLACK = 2.0**-48
"""Relative margin added to every float figure: 32 ulps, above the error of the few correctly
rounded operations (log, exp, log_ndtr) each closed form takes; checked against 50-digit mpmath
in tests/accounting/test_accounting_closed_forms.py."""

SUM_SLACK = 1e-12
"""Relative margin for figures that sum up to ~10^7 pmf terms (discrete Gaussian)."""

_SEARCH_STEPS = 200


def round_up(x: float, rel: float = FLOAT_SLACK) -> float:
    """``x`` moved upwards by ``rel`` relative (and one ulp)."""
    if not math.isfinite(x):
        return x
    return math.nextafter(x + abs(x) * rel, math.inf)


def round_down(x: float, rel: float = FLOAT_SLACK) -> float:
    """``x`` moved downwards by ``rel`` relative (and one ulp)."""
    if not math.isfinite(x):
        return x
    return math.nextafter(x - abs(x) * rel, -math.inf)


def frac_up(value: Fraction | int) -> float:
    """The least float >= ``value`` (``float()`` rounds to nearest, possibly down)."""
    x = float(value)
    return x if Fraction(x) >= value else math.nextafter(x, math.inf)


def frac_down(value: Fraction | int) -> float:
    """The greatest float <= ``value``."""
    x = float(value)
    return x if Fraction(x) <= value else math.nextafter(x, -math.inf)


def _check_delta(delta: float) -> None:
    if not 0 < delta < 1:
        raise ParameterError("delta must be in (0, 1)")


def _check_order(alpha: float) -> None:
    if not alpha > 1:
        raise ParameterError("the Renyi order alpha must be > 1")


def rdp_to_dp_classic(rdp_at_alpha: float, alpha: float, delta: float) -> float:
    """epsilon = rdp + ln(1/delta)/(alpha - 1) (Mironov 2017, Proposition 3)."""
    _check_order(alpha)
    _check_delta(delta)
    return round_up(rdp_at_alpha + math.log(1 / delta) / (alpha - 1))


def gaussian_rdp_epsilon_optimal_order(k: int, sigma: float, delta: float) -> float:
    """k Gaussian mechanisms (sensitivity 1, noise sigma) by the classic conversion at the best
    continuous order: RDP = alpha*a with a = k/(2 sigma^2); minimizing alpha*a + ln(1/delta)/
    (alpha-1) over alpha > 1 gives epsilon = a + 2 sqrt(a ln(1/delta)) (Mironov 2017, Prop. 3)."""
    _check_delta(delta)
    a = k / (2 * sigma**2)
    return round_up(a + 2 * math.sqrt(a * math.log(1 / delta)))


def rdp_to_dp(rdp_at_alpha: float, alpha: float, delta: float) -> float:
    """The improved conversion (Canonne, Kamath, Steinke 2020, Proposition 12; Asoodeh et al.
    2021; Balle et al. 2020): (alpha, rdp)-RDP implies (epsilon, delta)-DP for
    epsilon = rdp + ln((alpha-1)/alpha) - (ln delta + ln alpha)/(alpha-1). Clipped at 0."""
    _check_order(alpha)
    _check_delta(delta)
    eps = rdp_at_alpha + math.log1p(-1 / alpha) - (math.log(delta) + math.log(alpha)) / (alpha - 1)
    return max(0.0, round_up(eps))


def _rdp_log_delta(rdp_at_alpha: float, alpha: float, epsilon: float) -> float:
    # CKS 2020 Prop. 12: delta = exp((alpha-1)(rdp - eps)) / alpha * (1 - 1/alpha)^(alpha-1).
    return (alpha - 1) * (rdp_at_alpha - epsilon + math.log1p(-1 / alpha)) - math.log(alpha)


def rdp_to_delta(rdp_at_alpha: float, alpha: float, epsilon: float) -> float:
    """delta at ``epsilon`` from (alpha, rdp)-RDP (CKS 2020, Proposition 12), at most 1."""
    _check_order(alpha)
    log_delta = _rdp_log_delta(rdp_at_alpha, alpha, epsilon)
    return 1.0 if log_delta >= 0 else min(1.0, round_up(math.exp(log_delta)))


def _minimize_over_order(objective: Callable[[float], float], hint: float) -> float:
    """min over alpha > 1 of ``objective``; searches t = ln(alpha - 1), plus the ``hint``."""
    hi = math.log(max(1e3, 100 * hint))

    def in_t(t: float) -> float:
        return objective(1 + math.exp(t))

    # Imported here: SciPy's optimize package costs ~0.3 s at start, needed by few figures.
    from scipy.optimize import minimize_scalar  # noqa: PLC0415

    found = minimize_scalar(
        in_t, bounds=(math.log(1e-6), hi), method="bounded", options={"xatol": 1e-12}
    )
    candidates = [float(found.fun), objective(1 + hint)]
    return min(c for c in candidates if not math.isnan(c))


def zcdp_to_dp(rho: float, delta: float) -> float:
    """rho-zCDP to (epsilon, delta)-DP through RDP alpha*rho at the best order with the improved
    conversion (Canonne, Kamath, Steinke 2020, Corollary 13 / Proposition 12)."""
    _check_delta(delta)
    if rho == 0:
        return 0.0
    log_inv = math.log(1 / delta)

    def eps_at(alpha: float) -> float:
        return (
            alpha * rho + math.log1p(-1 / alpha) - (math.log(delta) + math.log(alpha)) / (alpha - 1)
        )

    best = _minimize_over_order(eps_at, math.sqrt(log_inv / rho))
    return max(0.0, round_up(best))


def zcdp_to_delta(rho: float, epsilon: float) -> float:
    """delta at ``epsilon`` of rho-zCDP: inf over alpha > 1 of
    exp((alpha-1)(alpha rho - eps)) / (alpha-1) * (1 - 1/alpha)^alpha (CKS 2020, Corollary 13)."""
    if rho == 0:
        return 0.0
    best = _minimize_over_order(
        lambda a: _rdp_log_delta(a * rho, a, epsilon), max(1e-6, (epsilon - rho) / (2 * rho))
    )
    return 1.0 if best >= 0 else min(1.0, round_up(math.exp(best)))


def zcdp_to_dp_simple(rho: float, delta: float) -> float:
    """epsilon = rho + 2 sqrt(rho ln(1/delta)) (Bun, Steinke 2016, Proposition 1.3)."""
    _check_delta(delta)
    return round_up(rho + 2 * math.sqrt(rho * math.log(1 / delta)))


def gdp_delta(mu: float, epsilon: float) -> float:
    """The exact privacy profile of mu-GDP (Dong, Roth, Su 2019, Corollary 2.13):
    delta = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2), in log space (log_ndtr) so that
    neither term underflows: delta = A (1 - exp(d)), d = ln(e^eps B) - ln A.

    Rounding: an error eta in d (a few ulps of |ln A| + |ln B|) moves -expm1(d) by a relative
    eta/|d| at most, which can exceed FLOAT_SLACK when the two terms nearly cancel; the result
    is rounded up by that bound."""
    if mu <= 0:
        return 0.0
    log_a = float(log_ndtr(-epsilon / mu + mu / 2))
    log_b = epsilon + float(log_ndtr(-epsilon / mu - mu / 2))
    if log_b >= log_a:
        return 0.0
    d = log_b - log_a
    eta = 16 * 2.0**-53 * (abs(log_a) + abs(log_b) + epsilon)
    value = math.exp(log_a) * -math.expm1(d)
    return min(1.0, round_up(value, FLOAT_SLACK + eta / abs(d)))


def _least_passing(passes: Callable[[float], bool], hi: float) -> float:
    """The least float x in [0, hi] (to bisection precision) with ``passes(x)``, for a
    predicate monotone in x; always returns a passing value (``hi`` is doubled if needed)."""
    if passes(0.0):
        return 0.0
    while not passes(hi):
        hi *= 2
        if hi > 1e300:
            return math.inf
    lo = 0.0
    for _ in range(_SEARCH_STEPS):
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        lo, hi = (lo, mid) if passes(mid) else (mid, hi)
    return hi


def gdp_epsilon(mu: float, delta: float) -> float:
    """The least epsilon with gdp_delta(mu, epsilon) <= delta (exact mu-GDP, rounded up)."""
    _check_delta(delta)
    guess = mu * mu / 2 + mu * math.sqrt(2 * math.log(1 / delta)) + 1
    return _least_passing(lambda e: gdp_delta(mu, e) <= delta, guess)


def gdp_mu_cap(epsilon: float, delta: float) -> float:
    """The greatest mu (rounded down) with gdp_delta(mu, epsilon) <= delta: the mu-GDP budget
    that implies (epsilon, delta)-DP (Dong, Roth, Su 2019, Corollary 2.13)."""
    _check_delta(delta)
    lo, hi = 0.0, 1.0
    while gdp_delta(hi, epsilon) <= delta:
        lo, hi = hi, 2 * hi
    for _ in range(_SEARCH_STEPS):
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if gdp_delta(mid, epsilon) <= delta else (lo, mid)
    return lo


def _log_normalizer(sigma2: float) -> float:
    """ln sum_y exp(-y^2/(2 sigma2)) over all integers y."""
    sigma = math.sqrt(sigma2)
    if sigma >= 4:
        # Poisson summation: the sum is sigma sqrt(2 pi) (1 + 2 sum_k exp(-2 pi^2 sigma^2 k^2));
        # for sigma >= 4 the correction is below exp(-315), far under the float resolution.
        return math.log(sigma * math.sqrt(2 * math.pi))
    y = np.arange(1, int(40 * sigma) + 3, dtype=np.float64)
    return math.log(1 + 2 * math.fsum(np.exp(-(y * y) / (2 * sigma2))))


def discrete_gaussian_delta(sigma2: float, sensitivity: int, epsilon: float) -> float:
    """The exact delta(epsilon) of one discrete Gaussian N_Z(0, sigma2) with integer shift
    ``sensitivity`` (Canonne, Kamath, Steinke 2020, Theorem 7), summed over the pmf as
    delta = sum_y max(0, p(y) - e^eps p(y - Delta)): every term is non-negative, so the sum
    loses no digits. Terms are positive exactly for y < Delta/2 - eps sigma2/Delta; the window
    below that point is 40 sigma wide (the rest is below exp(-800) relative)."""
    if sigma2 <= 0 or sensitivity < 1 or int(sensitivity) != sensitivity:
        raise ParameterError("the discrete Gaussian needs sigma2 > 0 and an integer shift >= 1")
    d = float(sensitivity)
    top = math.floor(d / 2 - epsilon * sigma2 / d)
    width = int(40 * math.sqrt(sigma2)) + 2
    log_norm = _log_normalizer(sigma2)
    parts: list[float] = []
    for start in range(top - width, top + 1, 1 << 20):
        y = np.arange(start, min(start + (1 << 20), top + 1), dtype=np.float64)
        loss = (d * d - 2 * y * d) / (2 * sigma2)  # ln p(y)/p(y - Delta)
        terms = np.exp(-(y * y) / (2 * sigma2) - log_norm) * -np.expm1(epsilon - loss)
        parts.append(math.fsum(np.maximum(terms, 0.0)))
    return min(1.0, round_up(math.fsum(parts), SUM_SLACK))


def discrete_gaussian_epsilon(sigma2: float, sensitivity: int, delta: float) -> float:
    """The least epsilon (rounded up) with discrete_gaussian_delta <= delta, by bisection."""
    _check_delta(delta)
    guess = gdp_epsilon(sensitivity / math.sqrt(sigma2), delta) + 1
    return _least_passing(lambda e: discrete_gaussian_delta(sigma2, sensitivity, e) <= delta, guess)


def laplace_delta(epsilon0: float, epsilon: float) -> float:
    """The exact privacy profile of the continuous Laplace mechanism with epsilon0 =
    sensitivity/scale: delta(eps) = max(0, 1 - exp((eps - epsilon0)/2)) (e.g. Balle, Barthe,
    Gaboardi 2018; Koskela et al. 2020)."""
    if epsilon >= epsilon0:
        return 0.0
    return min(1.0, round_up(-math.expm1((epsilon - epsilon0) / 2)))


_RHO_STEPS = 200


def rho_for(epsilon: float, delta: float) -> float:
    """The largest rho (to a relative 1e-9, never above) with zcdp_to_dp(rho, delta) <= epsilon:
    the zCDP budget that implies (epsilon, delta)-DP (CKS 2020, Corollary 13).

    The search starts from the rho of the simple bound epsilon = rho + 2 sqrt(rho ln(1/delta))
    (Bun, Steinke 2016, Prop. 1.3), which the CKS conversion never exceeds, so it always fits;
    and rho <= epsilon, since rho-zCDP gives epsilon >= rho.
    """
    log_inv = math.log(1 / delta)
    lo = (math.sqrt(log_inv + epsilon) - math.sqrt(log_inv)) ** 2 * (1 - 1e-12)
    hi = epsilon
    for _ in range(_RHO_STEPS):
        mid = (lo + hi) / 2
        if hi - lo <= lo * 1e-9 or mid in (lo, hi):
            break
        lo, hi = (mid, hi) if zcdp_to_dp(mid, delta) <= epsilon else (lo, mid)
    # The conversion is optimized numerically: never return a rho it does not certify.
    while lo > 0 and zcdp_to_dp(lo, delta) > epsilon:
        lo *= 1 - 1e-6
    return lo
