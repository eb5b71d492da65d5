"""The exact discrete Gaussian N_Z(0, σ²): sampler, pmf, tail and confidence half-width.

The sampler is Algorithm 3 of Canonne, Kamath and Steinke, "The Discrete Gaussian for
Differential Privacy" (NeurIPS 2020, arXiv:2004.00010), P(Z = z) ∝ exp(-z²/(2σ²)), for a
rational σ² = p/q: discrete Laplace proposals (:mod:`dpsql.noise.laplace`) with scale
t = floor(σ) + 1, each accepted with probability exp(-γ), γ = (|Y| - σ²/t)²/(2σ²) =
(|Y|·q·t - p)²/(2·p·q·t²), drawn as floor(γ) Bernoulli(exp(-1)) draws and one Algorithm 1 draw
for the fractional part. All bits come from :mod:`dpsql.noise.bits`, the only source of
randomness; no floating point value is computed on the sampling path.

Integer ranges: the acceptance runs in int64 while 2·p·q·t² and (|Y|·q·t - p)² stay below
``bits._FAST_LIMIT`` (read at call time) and with Python integers beyond.

The pmf, tail and half-width use floating point and are never used for sampling.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import partial

import numpy as np

from dpsql.errors import ParameterError
from dpsql.noise import bits
from dpsql.noise.bits import (
    BoolArray,
    IntArray,
    _bernoulli_exp_fast,
    _bernoulli_exp_rational_python,
    _bernoulli_exp_whole_fast,
    _check_confidence,
    _check_count,
    _check_int,
    _fill,
)
from dpsql.noise.laplace import _laplace_fast, _laplace_python

__all__ = [
    "MAX_SIGMA2",
    "discrete_gaussian",
    "discrete_gaussian_half_width",
    "discrete_gaussian_pmf",
    "discrete_gaussian_tail",
]

MAX_SIGMA2 = Fraction(2**110)
"""Largest accepted variance of the discrete Gaussian. Then sigma <= 2**55, the proposal scale
t = floor(sigma) + 1 is at most ``MAX_SCALE``, and P(|Z| > 2**63 - 1) <= 2·exp(-2**126 / 2**111)
= 2·exp(-32768) per draw (the discrete Gaussian is sub-Gaussian with parameter sigma, CKS 2020
Proposition 19)."""


def _check_sigma2(sigma2: object) -> Fraction:
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


# --- Algorithm 3: discrete Gaussian N_Z(0, sigma2) ------------------------------------------


def _gaussian_accept_fast(y: IntArray, p: int, q: int, t: int) -> BoolArray:
    """CKS 2020 Algorithm 3's C ~ Bernoulli(exp(-γ)) for each proposal Y, vectorized, with
    γ = (|Y| - σ²/t)² / (2σ²) = (|Y|·q·t - p)² / (2·p·q·t²) for σ² = p/q.

    Requires den = 2·p·q·t² < ``bits._FAST_LIMIT``. Since t² > p/q, den > 2p², so p <= D =
    isqrt(limit - 1) and d = |Y|·q·t - p >= -p has d² < limit whenever |Y| <= (p + D) // (q·t);
    larger |Y| (acceptance below exp(-D²/den), vanishingly rare) is settled with Python ints.
    """
    den, qt = 2 * p * q * t * t, q * t
    y_abs = np.abs(y)
    fits = y_abs <= (p + math.isqrt(bits._FAST_LIMIT - 1)) // qt
    d = y_abs[fits] * qt - p
    whole, rest = np.divmod(d * d, den)
    ok = _bernoulli_exp_whole_fast(whole)
    alive = np.flatnonzero(ok)
    ok[alive] = _bernoulli_exp_fast(rest[alive], den)  # exp(-frac(γ)): Algorithm 1 on a/b < 1
    accept = np.zeros(y.size, dtype=np.bool_)
    accept[fits] = ok
    for i in np.flatnonzero(~fits).tolist():
        accept[i] = _bernoulli_exp_rational_python((int(y_abs[i]) * qt - p) ** 2, den)
    return accept


def _gaussian_accept_python(y: IntArray, p: int, q: int, t: int) -> BoolArray:
    # The same acceptance when den = 2·p·q·t² is beyond int64: one proposal at a time.
    den, qt = 2 * p * q * t * t, q * t
    draws = (_bernoulli_exp_rational_python((abs(v) * qt - p) ** 2, den) for v in y.tolist())
    return np.fromiter(draws, dtype=np.bool_, count=y.size)


def _gaussian_round(p: int, q: int, t: int, tries: int) -> IntArray:
    """One vectorized pass of CKS 2020 Algorithm 3 over ``tries`` proposals Y ~ DLap(t); the
    accepted ones, in proposal order, are exactly N_Z(0, p/q) (their Theorem: the proposal
    weight exp(-|y|/t) times the acceptance exp(-(|y| - σ²/t)²/(2σ²)) is proportional to
    exp(-y²/(2σ²)) for every integer y)."""
    if t < bits._FAST_LIMIT:
        y = _laplace_fast(t, 1, tries)
    else:
        y = np.fromiter((_laplace_python(t, 1) for _ in range(tries)), np.int64, count=tries)
    if 2 * p * q * t * t < bits._FAST_LIMIT:
        return y[_gaussian_accept_fast(y, p, q, t)]
    return y[_gaussian_accept_python(y, p, q, t)]


def discrete_gaussian(sigma2: Fraction, size: int) -> IntArray:
    """Draw ``size`` independent exact discrete Gaussian values N_Z(0, sigma2).

    P(Z = z) = exp(-z²/(2·sigma2)) / Σ_k exp(-k²/(2·sigma2)), z an integer. This is
    Algorithm 3 of Canonne, Kamath and Steinke, "The Discrete Gaussian for Differential
    Privacy" (arXiv:2004.00010): t = floor(sigma) + 1, computed exactly as
    isqrt(floor(sigma2)); Y ~ discrete Laplace with scale t (Algorithm 2); accept Y with
    probability exp(-(|Y| - sigma2/t)²/(2·sigma2)) (Algorithm 1 extended to γ > 1); no floating
    point is used.

    Speed: the acceptance runs vectorized in int64 while 2·p·q·t² < 2**63 for sigma2 = p/q
    (roughly: numerator p below 2**31, e.g. any integer sigma2 up to 2·10**9); beyond that each
    proposal is accepted or rejected with Python integers (exact, ~50x slower). Callers that
    calibrate sigma2 should round it up to a short fraction (safe: more noise).

    Returns an int64 array. ``sigma2`` must be a positive Fraction at most ``MAX_SIGMA2``
    (2**110). Raises ParameterError for invalid inputs and EntropyError when the operating
    system's randomness is unavailable.
    """
    sigma2 = _check_sigma2(sigma2)
    size = _check_count(size, "size", 0)
    p, q = sigma2.numerator, sigma2.denominator
    t = math.isqrt(p // q) + 1  # floor(sqrt(x)) = isqrt(floor(x)) for real x >= 0
    # Acceptance per proposal is at least ~0.45 (lowest for small sigma2): start at 2.2x.
    return _fill(partial(_gaussian_round, p, q, t), size, Fraction(11, 5))


# --- the discrete Gaussian's distribution (floating point; never used for sampling) ----------

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
    sigma2 = _check_sigma2(sigma2)
    k = _check_int(k, "k")
    return math.exp(-_half_square(sigma2, k)) / _normaliser(sigma2)


def discrete_gaussian_tail(sigma2: Fraction, k: int) -> float:
    """P(Z >= k) for Z ~ N_Z(0, sigma2). For k <= 0 it is 1 - P(Z >= 1 - k) by symmetry."""
    sigma2 = _check_sigma2(sigma2)
    k = _check_int(k, "k")
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
    sigma2 = _check_sigma2(sigma2)
    miss = 1.0 - _check_confidence(confidence)  # exact: confidence is a float in (0, 1)
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
