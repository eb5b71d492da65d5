"""Noise calibration for the discrete Gaussian: from a query's (epsilon, delta) to variances.

One measurement on one coordinate is calibrated on the discrete Gaussian's own exact curve
delta(epsilon) (Canonne, Kamath, Steinke 2020, Theorem 7): the continuous curve would be wrong
for it (FACTS: at sigma 1, delta 1e-9 it needs epsilon 6.32, not 6.17). Anything else goes
through zCDP: the query's total rho is the largest whose CKS conversion (Corollary 13) gives
(epsilon, delta); it is split across the measurements (``dpsql.plan.split``), and
rho_j = d_j·Δ_j²/(2σ_j²) holds exactly for any integer shift (Theorem 14), so Σ rho_j is at
most the total (variances are rounded up to short rationals for the sampler). Never the
one-dimensional continuous curve at the joint L2 (DESIGN.md section 3).

Every rounding goes the safe way: rho down, variances up, each checked after rounding.
"""

from __future__ import annotations

import math
from fractions import Fraction

from dpsql.errors import InternalError
from dpsql.mechanisms import conversions, events

# Rationals with this many significant bits keep exact arithmetic cheap; the rounding they
# force is far below any effect on accuracy (2^-40 relative).
_BITS = 40
# A float figure from a conversion is compared with this much slack, against float error.
_SLACK = 1e-12


def _round(x: float, up: bool) -> Fraction:
    """x rounded to a rational with _BITS significant bits, up or down."""
    if x <= 0:
        return Fraction(0)
    exponent = math.frexp(x)[1] - _BITS
    scaled = math.ldexp(x, -exponent)
    mantissa = math.ceil(scaled) if up else math.floor(scaled)
    return Fraction(mantissa) * Fraction(2) ** exponent


def rho_for(epsilon: Fraction, delta: Fraction) -> Fraction:
    """The largest rho (rounded down to a short rational) whose CKS conversion gives at most
    (epsilon, delta), checked after rounding."""
    eps, dlt = float(epsilon) * (1 - _SLACK), float(delta)
    rho = _round(conversions.rho_for(eps, dlt), up=False)
    if rho <= 0 or conversions.zcdp_to_dp(float(rho), dlt) > eps:
        raise InternalError("no positive rho fits the query's (epsilon, delta)")
    return rho


def epsilon_for(rho: Fraction, delta: Fraction) -> Fraction:
    """The epsilon (rounded up) that rho-zCDP certifies at delta (CKS Corollary 13)."""
    return _round(conversions.zcdp_to_dp(float(rho), float(delta)) * (1 + _SLACK), up=True)


# The exact one-dimensional curve sums the pmf over a window of 40 sigma: above this variance
# the zCDP route (valid, a little looser) is used instead of summing millions of terms (and a
# query's certified pair is checked the same way, ``events.supports``).
EXACT_CURVE_MAX_SIGMA2 = events.EXACT_CURVE_MAX_SIGMA2


def single_sigma2(sensitivity: int, epsilon: Fraction, delta: Fraction) -> Fraction:
    """The smallest variance (rounded up) of one discrete Gaussian with an integer shift of at
    most ``sensitivity`` that is (epsilon, delta)-DP by its exact curve (CKS Theorem 7).

    The zCDP route's variance is always valid and bounds the search from above; the exact curve
    then lowers it (by bisection to a relative 1e-4) when the variance is small enough to sum.
    """
    upper = sigma2_for(sensitivity, 1, rho_for(epsilon, delta))  # already short
    if upper > EXACT_CURVE_MAX_SIGMA2:
        return upper
    eps, dlt = float(epsilon), float(delta) * (1 - _SLACK)

    def fits(sigma2: float) -> bool:
        return bool(conversions.discrete_gaussian_delta(sigma2, sensitivity, eps) <= dlt)

    hi, lo = float(upper), float(upper) / 2
    while fits(lo):
        hi, lo = lo, lo / 2
    while hi / lo > 1 + 1e-4:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    sigma2 = min(short(_round(hi, up=True)), upper)
    if not fits(float(sigma2)):
        raise InternalError("the rounded variance does not meet the query's (epsilon, delta)")
    return sigma2


def sigma2_for(sensitivity: int, dimensions: int, rho: Fraction) -> Fraction:
    """The variance that makes a shift of ``sensitivity`` on ``dimensions`` coordinates
    rho-zCDP: d·Δ²/(2·rho), rounded up to a short rational (see ``short``)."""
    return short(Fraction(dimensions * sensitivity**2) / (2 * rho))


def short(sigma2: Fraction) -> Fraction:
    """``sigma2`` rounded up to an integer when it is at least 1 (a relative increase of at
    most 1/sigma2), else to a rational with _BITS significant bits.

    More noise than asked, never less; and the exact sampler runs its vectorized integer path
    only when sigma2's numerator and denominator are small (CKS Algorithm 3 computes with
    them): a 40-bit denominator made releases 6-9x slower.
    """
    if sigma2 >= 1:
        return Fraction(math.ceil(sigma2))
    return max(sigma2, _round(float(sigma2), up=True))
