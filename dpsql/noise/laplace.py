"""The exact discrete Laplace distribution: sampler, pmf, tail and confidence half-width.

The sampler is Algorithm 2 of Canonne, Kamath and Steinke, "The Discrete Gaussian for
Differential Privacy" (NeurIPS 2020, arXiv:2004.00010), drawing the discrete Laplace
distribution P(Z = z) = (1 - q) / (1 + q) · q^|z|, q = exp(-1/scale), with integers only. The
paper takes integers s, t and produces scale t/s, so for ``scale = Fraction(t, s)`` we pass
t = ``scale.numerator`` and s = ``scale.denominator``. Its Bernoulli(exp(-γ)) draws (their
Algorithm 1), uniform integers and batching come from :mod:`dpsql.noise.bits`, the only source
of randomness; no floating point value is computed on the sampling path (Mironov, CCS 2012,
shows what floats leak).

Integer ranges: X = U + t·V is computed in int64 while it stays below ``bits._FAST_LIMIT``
(read at call time) and with Python integers beyond; a scale whose numerator or denominator is
not below the limit uses the pure Python big-integer path for the whole batch (slow but exact).

The pmf, tail and half-width use floating point or 60-digit decimals and are never used for
sampling.
"""

from __future__ import annotations

import decimal
import math
from decimal import Decimal
from fractions import Fraction
from functools import partial

import numpy as np

from dpsql.errors import InternalError, ParameterError
from dpsql.noise import bits
from dpsql.noise.bits import (
    BoolArray,
    IntArray,
    _bernoulli_exp_fast,
    _bernoulli_exp_python,
    _check_confidence,
    _check_count,
    _check_int,
    _fill,
    _uniform_fast,
    _uniform_python,
)

__all__ = [
    "MAX_SCALE",
    "discrete_laplace",
    "discrete_laplace_half_width",
    "discrete_laplace_pmf",
    "discrete_laplace_tail",
]

MAX_SCALE = Fraction(2**56)
"""Largest accepted scale. At this scale P(|Z| > 2**63 - 1) = 2 q^(2**63) / (1 + q)
< 2·exp(-128) < 2**-183 per draw, so outputs fit int64 except with negligible probability (and
that event raises instead of releasing). Larger scales would be absurd for int64 aggregates."""

_INT64_MAX = 2**63 - 1

_DECIMAL = decimal.Context(prec=60, Emin=-999_999_999, Emax=999_999_999)
"""Context for the half-width search: 60 digits, so rounding errors are far below ``_DOUBT``."""

_DOUBT = Decimal("1e-40")
"""Relative margin by which a tail must be below the miss rate to count as covered."""


_ONE_BY_ONE = 8
"""Up to this many values are drawn one at a time with Python integers (``_laplace_python``):
for a handful of draws that is faster than the vectorized passes, and exactly as distributed."""


def _check_scale(scale: object) -> Fraction:
    # Only Fraction: a float scale would already have been rounded, defeating exactness.
    if not isinstance(scale, Fraction):
        raise ParameterError(
            f"the noise scale must be a fractions.Fraction, not {type(scale).__name__}"
        )
    if scale <= 0:
        raise ParameterError("the noise scale must be positive")
    if scale > MAX_SCALE:
        raise ParameterError("the noise scale must be at most 2**56 so that noise fits in int64")
    return scale


# --- Algorithm 2: discrete Laplace with scale t/s -------------------------------------------


def _geometric_fast(size: int) -> IntArray:
    """V = number of Bernoulli(exp(-1)) successes before the first failure (inner loop of
    CKS 2020 Algorithm 2), vectorized: P(V >= v) = exp(-v)."""
    v = np.zeros(size, dtype=np.int64)
    live = np.arange(size)
    while live.size:
        success = _bernoulli_exp_fast(np.ones(live.size, dtype=np.int64), 1)
        live = live[success]
        v[live] += 1
    return v


def _to_int64(value: int) -> int:
    # Cannot happen below MAX_SCALE except with probability < 2**-183 per draw; refuse rather
    # than wrap around or clip (clipping would change the distribution).
    if abs(value) > _INT64_MAX:
        raise InternalError("a noise draw exceeded the int64 range; nothing was released")
    return value


def _magnitude_fast(u: IntArray, v: IntArray, t: int, s: int) -> IntArray:
    """Y = floor((U + t·V) / s), exactly. X = U + t·V stays below ``bits._FAST_LIMIT`` when
    V <= (limit - t) // t because U <= t - 1; larger V (rare) is computed with Python ints."""
    v_max = (bits._FAST_LIMIT - t) // t
    fits = v <= v_max
    y = np.empty(u.size, dtype=np.int64)
    y[fits] = (u[fits] + t * v[fits]) // s
    for i in np.flatnonzero(~fits).tolist():
        y[i] = _to_int64((int(u[i]) + t * int(v[i])) // s)
    return y


def _laplace_round(t: int, s: int, tries: int) -> IntArray:
    """One vectorized pass of CKS 2020 Algorithm 2 over ``tries`` attempts; returns the
    accepted draws in attempt order (each one exactly discrete Laplace with scale t/s)."""
    u = _uniform_fast(t, tries)
    u = u[_bernoulli_exp_fast(u, t)]  # D ~ Bernoulli(exp(-U/t)); reject where D = 0
    y = _magnitude_fast(u, _geometric_fast(u.size), t, s)  # X = U + tV is Geometric(1 - e^{-1/t})
    negative = _uniform_fast(2, u.size) == 1  # B ~ Bernoulli(1/2)
    keep: BoolArray = ~(negative & (y == 0))  # B = 1 and Y = 0 would count zero twice: reject
    signed: IntArray = np.where(negative, -y, y)
    return signed[keep]


def _laplace_fast(t: int, s: int, size: int) -> IntArray:
    # Algorithm 2 accepts between ~0.3 and 1 of its attempts depending on t and s.
    return _fill(partial(_laplace_round, t, s), size, Fraction(3, 2))


def _laplace_python(t: int, s: int) -> int:
    """CKS 2020 Algorithm 2 with Python integers: one discrete Laplace draw with scale t/s."""
    while True:
        u = _uniform_python(t)
        if not _bernoulli_exp_python(u, t):  # D = 0: reject
            continue
        v = 0
        while _bernoulli_exp_python(1, 1):  # A ~ Bernoulli(exp(-1))
            v += 1
        y = (u + t * v) // s
        negative = _uniform_python(2) == 1
        if negative and y == 0:
            continue
        return _to_int64(-y if negative else y)


def discrete_laplace(scale: Fraction, size: int) -> IntArray:
    """Draw ``size`` independent exact discrete Laplace values with the given rational scale.

    P(Z = z) = (1 - q) / (1 + q) · q^|z| with q = exp(-1/scale), z an integer. This is
    Algorithm 2 of Canonne, Kamath and Steinke, "The Discrete Gaussian for Differential
    Privacy" (arXiv:2004.00010), with t = scale.numerator and s = scale.denominator, built on
    their Algorithm 1 and exact uniform integers; no floating point is used.

    Returns an int64 array. ``scale`` must be a positive Fraction at most ``MAX_SCALE`` (2**56),
    which keeps every value inside int64 except with probability below 2**-183 per draw (that
    event raises InternalError). Raises ParameterError for invalid inputs and EntropyError when
    the operating system's randomness is unavailable.
    """
    scale = _check_scale(scale)
    size = _check_count(size, "size", 0)
    t, s = scale.numerator, scale.denominator
    if t < bits._FAST_LIMIT and s < bits._FAST_LIMIT and size > _ONE_BY_ONE:
        return _laplace_fast(t, s, size)
    # A few draws (an ungrouped total, a handful of groups), or big integers: the same
    # algorithm one draw at a time. (The vectorized passes cost a fixed ~0.4 ms per call.)
    # Big-integer path for huge numerators or denominators: exact, one draw at a time.
    return np.fromiter((_laplace_python(t, s) for _ in range(size)), dtype=np.int64, count=size)


# --- exact distribution helpers (floating point; never used for sampling) --------------------


def _rate(scale: Fraction) -> float:
    """1/scale as a correctly rounded float (inf when it is beyond the float range)."""
    try:
        return scale.denominator / scale.numerator  # int / int is correctly rounded
    except OverflowError:
        return math.inf


def _as_float(k: int) -> float:
    # Python ints beyond the float range would raise; any |k| >= 2**1000 has probability 0.0.
    return float(min(k, 2**1000))


def _log_mass_at_zero(rate: float) -> float:
    # log((1 - q) / (1 + q)) with q = exp(-rate); expm1/log1p keep precision for large scales.
    return math.log(-math.expm1(-rate)) - math.log1p(math.exp(-rate))


def discrete_laplace_pmf(scale: Fraction, k: int) -> float:
    """P(Z = k) = (1 - q) / (1 + q) · q^|k|, q = exp(-1/scale): the discrete Laplace of
    Canonne, Kamath and Steinke 2020 (arXiv:2004.00010) that ``discrete_laplace`` samples."""
    scale = _check_scale(scale)
    k = _check_int(k, "k")
    rate = _rate(scale)
    if k == 0:  # avoids 0 · inf for vanishing scales
        return math.exp(_log_mass_at_zero(rate))
    return math.exp(_log_mass_at_zero(rate) - _as_float(abs(k)) * rate)


def discrete_laplace_tail(scale: Fraction, k: int) -> float:
    """P(Z >= k). For k >= 1 this is q^k / (1 + q); for k <= 0 it is 1 - P(Z >= 1 - k) by
    symmetry (P(Z <= k - 1) = P(Z >= 1 - k))."""
    scale = _check_scale(scale)
    k = _check_int(k, "k")
    if k <= 0:
        return 1.0 - discrete_laplace_tail(scale, 1 - k)
    rate = _rate(scale)
    return math.exp(-_as_float(k) * rate - math.log1p(math.exp(-rate)))


def _covered(k: int, rate: Decimal, miss: Decimal) -> bool:
    # P(|Z| > k) = 2 q^(k+1) / (1 + q). Near the decision (k + 1)·rate ~ ln(2 / miss) < 40
    # (miss >= 2**-53 for a float confidence below 1), so at 60 digits the computed tail is
    # within 1e-55 of the truth, relatively; demanding a 1e-40 margin therefore proves the true
    # tail is below ``miss``. Far from the decision the margin is irrelevant.
    tail = 2 * (-(k + 1) * rate).exp() / (1 + (-rate).exp())
    return tail * (1 + _DOUBT) <= miss


def discrete_laplace_half_width(scale: Fraction, confidence: float) -> int:
    """Smallest integer k >= 0 with P(|Z| <= k) >= ``confidence`` for the discrete Laplace.

    Uses the exact discrete tail P(|Z| > k) = 2 q^(k+1) / (1 + q) (CKS 2020, arXiv:2004.00010),
    evaluated in 60-digit decimal arithmetic. A candidate only counts as covering when its tail
    is below 1 - confidence by a margin far larger than the rounding error, so the returned k
    never gives coverage below ``confidence`` (ties round up).
    """
    scale = _check_scale(scale)
    confidence = _check_confidence(confidence)
    with decimal.localcontext(_DECIMAL):
        rate = Decimal(scale.denominator) / Decimal(scale.numerator)
        miss = 1 - Decimal(confidence)  # Decimal(float) is exact
        # (k + 1) · rate >= ln 2 - ln(1 + q) - ln(miss) solves the tail bound for real k.
        bound = (Decimal(2).ln() - (1 + (-rate).exp()).ln() - miss.ln()) / rate - 1
        k = max(0, int(bound.to_integral_value(rounding=decimal.ROUND_CEILING)))
        while not _covered(k, rate, miss):  # the candidate is within one of the answer
            k += 1
        while k > 0 and _covered(k - 1, rate, miss):
            k -= 1
    return k
