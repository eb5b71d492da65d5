"""The noise half-widths every estimator builds on (``dpsql.plan.aggregates``).

Each released value that is a bare aggregate gets the half-width of a confidence interval that
covers the noise only (not the bias of clamping and contribution bounds), computed from the
discrete distribution actually sampled: the exact discrete Laplace or discrete Gaussian
quantile of one measurement (``half_width``). An estimate of several measurements bounds each
at a confidence that makes them hold together: c^(1/k) when their noises are independent, and
1 - (1 - c)/k when one of them is a combination of released noises (a workload's least squares,
or a centred sum derived from a released SUM and COUNT, which shares the COUNT's noise), since
the union bound needs no independence (``_each``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from dpsql.mechanisms.gaussian import discrete_gaussian_half_width
from dpsql.mechanisms.laplace import discrete_laplace_half_width
from dpsql.mechanisms.tails import Noise, linear_half_width
from dpsql.plan.plans import Measurement

__all__ = ["FloatArray", "combined_half_width", "half_width", "within"]

FloatArray = npt.NDArray[np.float64]

# A half-width is a function of the noise's parameters and the confidence alone (public, no
# data): kept, since a repeated query asks for the same ones (some 0.1 ms each, in Decimal).
_laplace_half_width = functools.lru_cache(maxsize=1024)(discrete_laplace_half_width)
_gaussian_half_width = functools.lru_cache(maxsize=1024)(discrete_gaussian_half_width)


def half_width(m: Measurement, confidence: float) -> int:
    """The noise half-width of one measurement, in its integer units, from the exact discrete
    distribution sampled: the smallest k with P(|Z| <= k) >= confidence. For a combination of
    a workload's measurements, a bound over its terms (``dpsql.mechanisms.tails``: near-exact), the
    largest over its cells' combinations: sound, a little wider than the exact quantile."""
    if m.combined is not None:
        return max(
            (combined_half_width(signature, confidence) for signature in m.combined), default=0
        )
    if m.scale is not None:
        return _laplace_half_width(m.scale, confidence)
    assert m.sigma2 is not None
    return _gaussian_half_width(m.sigma2, confidence)


@functools.lru_cache(maxsize=1024)
def combined_half_width(signature: tuple[tuple[Fraction, Fraction], ...], confidence: float) -> int:
    terms = [(a, Noise(scale=t)) for a, t in signature]
    return math.ceil(linear_half_width(terms, confidence)) if terms else 0


def _each(
    confidence: float, measurements: Sequence[Measurement], used: Sequence[int], independent: float
) -> float:
    """The confidence each of an estimate's measurements is bounded at, so that all of them
    hold at once with probability >= ``confidence``: ``independent`` (c^(1/k)) when their noises
    are independent draws; when one is a combination of released noises (a centred sum derived
    as 2·SUM - M·COUNT shares the COUNT's noise), the union bound 1 - (1 - c)/k, which needs no
    independence (Bonferroni), one ulp up."""
    if any(measurements[i].combined is not None for i in used):
        return math.nextafter(1.0 - (1.0 - confidence) / len(used), 1.0)
    return independent


def within(
    low: FloatArray, high: FloatArray, lo: float, hi: float
) -> tuple[FloatArray, FloatArray]:
    """An estimate's range over the noise box, clamped to [lo, hi], the range its truth always
    lies in; the whole [lo, hi] where the box's range misses it.

    The box covers the noise with probability >= c, and then the truth is in [low, high] and in
    [lo, hi]. A box whose range misses [lo, hi] did not cover the noise (the other 1 - c), and
    the truth may be anywhere in [lo, hi]: clamping both ends to one bound would release a
    half-width of 0 beside a value that may be wrong by the whole range."""
    missed = (high < lo) | (low > hi)
    return (np.where(missed, lo, np.clip(low, lo, hi)), np.where(missed, hi, np.clip(high, lo, hi)))
