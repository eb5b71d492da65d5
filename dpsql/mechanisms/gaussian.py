"""The discrete Gaussian distribution N_Z(0, σ²): its pmf, tail and confidence half-width.

P(Z = z) ∝ exp(-z²/(2σ²)) over the integers: the distribution :mod:`dpsql.noise.gaussian`
samples exactly (Canonne, Kamath, Steinke 2020, arXiv:2004.00010). Everything here is a
function of the variance and the confidence alone, in floating point, and never draws.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from dpsql.errors import ParameterError
from dpsql.mechanisms.checks import (
    check_confidence,
    check_int,
)

MAX_SIGMA2 = Fraction(2**110)
"""Largest accepted variance of the discrete Gaussian. Then sigma <= 2**55, the proposal scale
t = floor(sigma) + 1 is at most ``MAX_SCALE``, and P(|Z| > 2**63 - 1) <= 2·exp(-2**126 / 2**111)
= 2·exp(-32768) per draw (the discrete Gaussian is sub-Gaussian with parameter sigma, CKS 2020
Proposition 19)."""

__all__ = [
    "MAX_SIGMA2",
    "discrete_gaussian_half_width",
    "discrete_gaussian_pmf",
    "discrete_gaussian_tail",
]


def check_sigma2(sigma2: object) -> Fraction:
    # Only Fraction, as for the scale: exactness starts at the parameter.
    if not isinstance(sigma2, Fraction):
        raise ParameterError(
            f"the noise variance sigma2 must be a fractions.Fraction, not {type(sigma2).__name__}"
        )
    if sigma2 <= 0:
        raise ParameterError("the noise variance sigma2 must be positive")
    if sigma2 > MAX_SIGMA2:
        raise ParameterError("the noise variance sigma2 must be at most 2**110")
    return sigma2


_EM_FROM = 10**6
"""Variance above which tails use Euler-Maclaurin instead of summing up to 80·sigma terms."""


_TERM_EPS = 1e-18
"""Series terms below this fraction of 1 are dropped (half an ulp of 1.0 is 1.1e-16)."""


_GAUSS_DOUBT = 1e-9
"""Relative margin by which a computed tail must be below the miss rate to count as covered.
Near any decision (tails above 2**-53, so exponents below ~40) the float evaluation below is
accurate to ~1e-13 relatively (see ``_upper_sum``), so the margin exceeds the error by four
orders of magnitude. The price: for huge sigma, where one step of k changes the tail by only
~k/sigma² relatively, the answer may exceed the minimum by about 1e-9·sigma²/k."""


def _half_square(sigma2: Fraction, k: int) -> float:
    """k²/(2·sigma2) as a correctly rounded float; inf when beyond the float range."""
    try:
        return float(Fraction(k * k * sigma2.denominator, 2 * sigma2.numerator))
    except OverflowError:
        return math.inf


def _normaliser(sigma2: Fraction) -> float:
    """Σ_k exp(-k²/(2σ²)) over all integers k, summed until the terms drop below 1e-18.

    Small σ² (< 1): the series itself, whose terms vanish after a few k. Larger σ²: its Poisson
    summation (Jacobi theta identity, CKS 2020 eq. (8)) sqrt(2πσ²)·Σ_n exp(-2π²σ²n²), whose
    second term is already below 2.7e-9 at σ² = 1 and below 1e-18 from σ² = 2.1.
    """
    if sigma2 < 1:
        terms, k = [1.0], 1
        while (term := math.exp(-_half_square(sigma2, k))) >= _TERM_EPS:
            terms.append(2 * term)
            k += 1
        return math.fsum(terms)
    s = float(sigma2)
    dual, n = [1.0], 1
    while (term := math.exp(-2 * math.pi**2 * s * n * n)) >= _TERM_EPS:
        dual.append(2 * term)
        n += 1
    return math.sqrt(2 * math.pi * s) * math.fsum(dual)


def _upper_sum(sigma2: Fraction, m: int) -> float:
    """Σ_{j >= m} exp(-j²/(2σ²)) for m >= 1 (the unnormalised upper tail).

    Beyond m²/(2σ²) = 746 every term underflows and the sum is below 1e-320·σ: 0.0. Up to
    σ² = 10**6 the terms j in [m, 40σ + 50) are summed in float (j² < 2**53 is exact; the rest
    is below exp(-800)). Above, Euler-Maclaurin to the third derivative:
    ∫_m^∞ f + f(m)/2 - f'(m)/12 + f'''(m)/720, f(x) = exp(-x²/(2σ²)). Against a 30-digit
    mpmath sum at σ² = 10**6 the relative error of either method is below 4e-14 for m <= 20σ
    (the Euler-Maclaurin remainder shrinks like σ^-6 beyond); tails below ~1e-300 lose
    precision to subnormal floats, far from any decision.
    """
    if _half_square(sigma2, m) > 746:
        return 0.0
    s = float(sigma2)
    sigma = math.sqrt(s)
    if sigma2 <= _EM_FROM:
        j = np.arange(m, max(m + 1, int(40 * sigma) + 50), dtype=np.float64)
        # Positive terms: numpy's pairwise sum errs by at most ~log2(n)·2**-53 relatively.
        return float(np.sum(np.exp(-(j * j) * (0.5 / s))))
    x = float(m)
    f = math.exp(-_half_square(sigma2, m))
    integral = sigma * math.sqrt(math.pi / 2) * math.erfc(x / (sigma * math.sqrt(2)))
    d1 = -x / s * f
    d3 = (3 * x / s**2 - x**3 / s**3) * f
    return integral + f / 2 - d1 / 12 + d3 / 720


def discrete_gaussian_pmf(sigma2: Fraction, k: int) -> float:
    """P(Z = k) = exp(-k²/(2·sigma2)) / Σ_j exp(-j²/(2·sigma2)): the discrete Gaussian
    N_Z(0, sigma2) of Canonne, Kamath and Steinke 2020 that ``discrete_gaussian`` samples."""
    sigma2 = check_sigma2(sigma2)
    k = check_int(k, "k")
    return math.exp(-_half_square(sigma2, k)) / _normaliser(sigma2)


def discrete_gaussian_tail(sigma2: Fraction, k: int) -> float:
    """P(Z >= k) for Z ~ N_Z(0, sigma2). For k <= 0 it is 1 - P(Z >= 1 - k) by symmetry."""
    sigma2 = check_sigma2(sigma2)
    k = check_int(k, "k")
    if k <= 0:
        return 1.0 - discrete_gaussian_tail(sigma2, 1 - k)
    return min(1.0, _upper_sum(sigma2, k) / _normaliser(sigma2))


def discrete_gaussian_half_width(sigma2: Fraction, confidence: float) -> int:
    """Smallest integer k >= 0 with P(|Z| <= k) >= ``confidence`` for Z ~ N_Z(0, sigma2).

    Uses the discrete tail P(|Z| > k) = 2·Σ_{j > k} exp(-j²/(2σ²)) / normaliser, not the
    continuous Gaussian's. A candidate only counts as covering when its computed tail is below
    1 - confidence by the relative margin ``_GAUSS_DOUBT`` (1e-9, far above the evaluation
    error), so the returned k never gives coverage below ``confidence`` (doubt rounds up).
    """
    sigma2 = check_sigma2(sigma2)
    miss = 1.0 - check_confidence(confidence)  # exact: confidence is a float in (0, 1)
    norm = _normaliser(sigma2)

    def covered(k: int) -> bool:
        return 2 * _upper_sum(sigma2, k + 1) / norm * (1 + _GAUSS_DOUBT) <= miss

    # Sub-Gaussian tail P(|Z| > k) <= 2 exp(-(k+1)²/(2σ²)) (CKS 2020 Prop. 19): a first bracket.
    hi = max(1, math.ceil(math.sqrt(2 * float(sigma2) * math.log(2 / miss))))
    while not covered(hi):
        hi *= 2
    lo = -1  # P(|Z| > -1) = 1 > miss: never covered
    while hi - lo > 1:  # invariant: covered(hi) and not covered(lo)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if covered(mid) else (mid, hi)
    return hi
