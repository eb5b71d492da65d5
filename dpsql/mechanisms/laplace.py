"""The discrete Laplace distribution: its pmf, tail and confidence half-width.

P(Z = z) = (1 - q) / (1 + q) · q^|z|, q = exp(-1/scale): the distribution
:mod:`dpsql.noise.laplace` samples exactly (Canonne, Kamath, Steinke 2020, arXiv:2004.00010).
Everything here is a function of the scale and the confidence alone, in floating point or
60-digit decimals, and never draws: planning reads half-widths (accuracy targets, EXPLAIN)
before anything runs, and the release reads them after the noise.
"""

from __future__ import annotations

import decimal
import math
from decimal import Decimal
from fractions import Fraction

from dpsql.errors import ParameterError
from dpsql.mechanisms.checks import (
    check_confidence,
    check_int,
)

MAX_SCALE = Fraction(2**56)
"""Largest accepted scale. At this scale P(|Z| > 2**63 - 1) = 2 q^(2**63) / (1 + q)
< 2·exp(-128) < 2**-183 per draw, so outputs fit int64 except with negligible probability (and
that event raises instead of releasing). Larger scales would be absurd for int64 aggregates."""

__all__ = [
    "MAX_SCALE",
    "discrete_laplace_half_width",
    "discrete_laplace_pmf",
    "discrete_laplace_tail",
]


_DECIMAL = decimal.Context(prec=60, Emin=-999_999_999, Emax=999_999_999)
"""Context for the half-width search: 60 digits, so rounding errors are far below ``_DOUBT``."""


_DOUBT = Decimal("1e-40")
"""Relative margin by which a tail must be below the miss rate to count as covered."""


def check_scale(scale: object) -> Fraction:
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
    scale = check_scale(scale)
    k = check_int(k, "k")
    rate = _rate(scale)
    if k == 0:  # avoids 0 · inf for vanishing scales
        return math.exp(_log_mass_at_zero(rate))
    return math.exp(_log_mass_at_zero(rate) - _as_float(abs(k)) * rate)


def discrete_laplace_tail(scale: Fraction, k: int) -> float:
    """P(Z >= k). For k >= 1 this is q^k / (1 + q); for k <= 0 it is 1 - P(Z >= 1 - k) by
    symmetry (P(Z <= k - 1) = P(Z >= 1 - k))."""
    scale = check_scale(scale)
    k = check_int(k, "k")
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
    scale = check_scale(scale)
    confidence = check_confidence(confidence)
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
