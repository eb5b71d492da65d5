"""The estimates and their noise half-widths, from the noisy measurements.

Every value here is post-processing of noisy values (DESIGN.md section 2): AVG = m + noisy
centred sum / noisy count, clamped to its bounds; VARIANCE and STDDEV from three noisy
measurements; counts and sums in their units.

Accuracy: each output that is a bare aggregate gets the half-width of a confidence interval
that covers the noise only (not the bias of clamping and contribution bounds), computed from
the discrete distribution actually sampled. Counts and sums: the exact discrete Laplace or
discrete Gaussian quantile. AVG: the box [sum ± k1] x [count ± k2], each at confidence
sqrt(c), which covers both independent noises with probability at least c; the half-width is
the larger distance from the estimate to the ends of the ratio's range over the box (clamped to
the bounds). VARIANCE and STDDEV (``_spread``): the box of the three measurements, each at
confidence c^(1/3), and the estimator's range over it by sound interval arithmetic. When one
of an estimate's measurements is a combination of released noises (a workload's least squares,
or a centred sum derived from a released SUM and COUNT, which shares the COUNT's noise), each
is bounded at 1 - (1 - c)/k instead (``_each``): the union bound needs no independence.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from dpsql.analyze.analysis import SPREAD_KINDS
from dpsql.mechanisms.gaussian import discrete_gaussian_half_width
from dpsql.mechanisms.laplace import discrete_laplace_half_width
from dpsql.mechanisms.tails import Noise, linear_half_width
from dpsql.plan.plans import Estimate, Measurement, Plan

__all__ = ["TOTALS", "FloatArray", "combined_half_width", "half_width", "scaled"]

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


def _avg(
    estimate: Estimate,
    measurements: Sequence[Measurement],
    noisy: Sequence[npt.ArrayLike],
    confidence: float,
) -> tuple[FloatArray, FloatArray]:
    """AVG estimates and their half-widths, vectorized over the released groups."""
    grid = estimate.grid
    assert grid is not None
    i_sum, i_count = estimate.measurements
    half = float(grid.step) / 2
    lo, hi, centre = float(grid.lower_value), float(grid.upper_value), float(grid.centre)
    s = np.asarray(noisy[i_sum], dtype=np.float64)
    n = np.asarray(noisy[i_count], dtype=np.float64)
    value = np.clip(centre + s * half / np.maximum(n, 1.0), lo, hi)
    joint = _each(confidence, measurements, estimate.measurements, math.sqrt(confidence))
    k_s = half_width(measurements[i_sum], joint)
    k_n = half_width(measurements[i_count], joint)
    n_lo = np.maximum(n - k_n, 1.0)
    n_hi = np.maximum(n + k_n, 1.0)
    s_lo, s_hi = s - k_s, s + k_s
    low = np.minimum(s_lo / n_lo, s_lo / n_hi)
    high = np.maximum(s_hi / n_lo, s_hi / n_hi)
    lower = np.clip(centre + low * half, lo, hi)
    upper = np.clip(centre + high * half, lo, hi)
    # With no plausible positive count the average may be anywhere in the bounds.
    hopeless = n + k_n < 1
    lower = np.where(hopeless, lo, lower)
    upper = np.where(hopeless, hi, upper)
    width = np.maximum(value - lower, upper - value)
    return value, width


# Relative widening of the variance interval's ends: the bounds and the estimator are evaluated
# by different float operations, each within a few ulps (2**-52) of its terms; 1e-12 covers both.
_ROUNDING = 1e-12


def _bessel(n: FloatArray) -> FloatArray:
    """The sample-variance factor N/max(N - 1, 1) of a count N >= 1."""
    return n / np.maximum(n - 1.0, 1.0)


def _moment_range(
    q: tuple[FloatArray, FloatArray],
    s2: tuple[FloatArray, FloatArray],
    u: tuple[FloatArray, FloatArray],
) -> tuple[FloatArray, FloatArray]:
    """The range of f = Q/N - S²/N² over the box Q in ``q``, S² in ``s2`` (S² >= 0) and
    u = 1/N in ``u`` (0 < u <= 1), each a (low, high) pair of arrays.

    f = Q·u - S²·u² rises with Q and falls with S², so its minimum has (q_lo, s2_hi) and its
    maximum (q_hi, s2_lo). In u each is a concave parabola (a·u - b·u², b >= 0): the minimum
    is at an end of [u_lo, u_hi], the maximum at the vertex a/(2b) clipped into it. Exact over
    the box, then widened by ``_ROUNDING`` of the terms' size for float rounding.
    """
    q_lo, q_hi = q
    s2_lo, s2_hi = s2
    u_lo, u_hi = u
    low = np.minimum(q_lo * u_lo - s2_hi * u_lo * u_lo, q_lo * u_hi - s2_hi * u_hi * u_hi)
    # With b = 0 the parabola is a line, highest at u_hi if a >= 0 and at u_lo otherwise.
    line = np.where(q_hi >= 0.0, np.inf, -np.inf)
    vertex = np.divide(q_hi, 2.0 * s2_lo, out=line, where=s2_lo > 0.0)
    top = np.clip(vertex, u_lo, u_hi)
    high = q_hi * top - s2_lo * top * top
    size = np.maximum(np.abs(q_lo), np.abs(q_hi)) * u_hi + s2_hi * u_hi * u_hi
    return low - _ROUNDING * size, high + _ROUNDING * size


def _spread(
    estimate: Estimate,
    measurements: Sequence[Measurement],
    noisy: Sequence[npt.ArrayLike],
    confidence: float,
) -> tuple[FloatArray, FloatArray]:
    """VAR_POP, VAR_SAMP, STDDEV_POP and STDDEV_SAMP, and their half-widths, vectorized.

    The estimate, from the noisy centred sum of squares Q (units of (g/2)²), centred sum S
    (units of g/2) and count: with N = max(count, 1), var_pop = max(Q/N - (S/N)², 0) and
    var_samp = var_pop·N/max(N - 1, 1), clamped to the largest variance a value in the bounds
    can have, ((hi_g - lo_g)/2)²; STDDEV is the square root. Post-processing of noisy values.

    The half-width: each measurement gets its exact noise half-width at confidence c^(1/3), and
    the interval is the estimator's range over that box (Q ± k_Q, S ± k_S, count ± k_N), by
    sound interval arithmetic: the range of Q/N - (S/N)² (exact over the box, ``_moment_range``),
    floored at 0, times the range of N/max(N - 1, 1) for the samples' variance, clamped like the
    estimate, square roots of the ends for STDDEV. Like AVG's, it covers the noise only, and
    depends on the noisy values, so it is post-processing too.
    """
    grid = estimate.grid
    assert grid is not None
    i_squares, i_sum, i_count = estimate.measurements
    samp = estimate.kind in ("var_samp", "stddev_samp")
    top = float(grid.width) ** 2  # ((hi_g - lo_g)/2)², the largest variance, in (g/2)²
    q = np.asarray(noisy[i_squares], dtype=np.float64)
    s = np.asarray(noisy[i_sum], dtype=np.float64)
    n = np.asarray(noisy[i_count], dtype=np.float64)
    n1 = np.maximum(n, 1.0)
    mean = s / n1
    var = np.maximum(q / n1 - mean * mean, 0.0)
    value = np.clip(var * _bessel(n1) if samp else var, 0.0, top)
    # Independent noises: each within its c^(1/3) half-width, all three hold with probability
    # >= c (one ulp up keeps the rounded cube root from falling short of it).
    joint = _each(confidence, measurements, estimate.measurements,
                  math.nextafter(confidence ** (1 / 3), 1.0))  # fmt: skip
    k_q, k_s, k_n = (float(half_width(measurements[i], joint)) for i in estimate.measurements)
    n_lo, n_hi = np.maximum(n - k_n, 1.0), np.maximum(n + k_n, 1.0)
    a_lo, a_hi = np.abs(s - k_s), np.abs(s + k_s)
    # The range of |S|: from 0 when the interval of S holds 0, else from its nearer end.
    s_min = np.where(np.abs(s) <= k_s, 0.0, np.minimum(a_lo, a_hi))
    s_max = np.maximum(a_lo, a_hi)
    low, high = _moment_range((q - k_q, q + k_q), (s_min**2, s_max**2), (1.0 / n_hi, 1.0 / n_lo))
    low, high = np.maximum(low, 0.0), np.maximum(high, 0.0)
    if samp:
        # N/(N - 1) (N/1 below 2) rises on [1, 2] and falls after: its peak 2 is at N = 2.
        ends = (_bessel(n_lo), _bessel(n_hi))
        low = low * np.minimum(*ends) * (1.0 - _ROUNDING)
        high = high * np.where((n_lo <= 2.0) & (n_hi >= 2.0), 2.0, np.maximum(*ends))
        high = high * (1.0 + _ROUNDING)
    unit = (float(grid.step) / 2) ** 2
    ends3 = [v * unit for v in (value, np.clip(low, 0.0, top), np.clip(high, 0.0, top))]
    if estimate.kind in ("stddev_pop", "stddev_samp"):
        ends3 = [np.sqrt(v) for v in ends3]
    value, lower, upper = ends3
    # One ulp up: the rounded difference could leave value ± width a hair inside an end.
    return value, np.nextafter(np.maximum(value - lower, upper - value), np.inf)


# The estimates that are totals: on a sample, scaled by 1/q when asked (``scaled``).
TOTALS = ("count_rows", "count", "count_units", "count_distinct", "sum")


def scaled(plan: Plan, estimate: Estimate) -> float | None:
    """1/q for a total released as an estimate of the whole table from a sample at rate q
    (``SET dpsql.sample_scale = on``), else None. Post-processing of the noisy total."""
    if plan.sample is None or not plan.options.sample_scale or estimate.kind not in TOTALS:
        return None
    return 1.0 / float(plan.sample.rate)


def _estimates(
    plan: Plan, noisy: list[list[int]], confidence: float
) -> tuple[list[Any], list[Any]]:
    values: list[Any] = []
    widths: list[Any] = []
    for est in plan.estimates:
        m = plan.measurements[est.measurements[0]]
        if est.kind == "quantile":
            # The exponential mechanism's choice is a grid point: its value, and no interval.
            chosen = noisy[est.measurements[0]]
            values.append(np.array([float(v * m.unit) for v in chosen], dtype=np.float64))
            widths.append(np.full(len(chosen), np.nan))
            continue
        if est.kind == "avg":
            value, width = _avg(est, plan.measurements, noisy, confidence)
            values.append(value)
            widths.append(width)
            continue
        if est.kind in SPREAD_KINDS:
            value, width = _spread(est, plan.measurements, noisy, confidence)
            values.append(value)
            widths.append(width)
            continue
        k = half_width(m, confidence)
        raw = noisy[est.measurements[0]]
        factor = scaled(plan, est)
        if factor is not None:
            # The sample's noisy total and its noise half-width, both times 1/q.
            values.append(np.array([float(v * m.unit) * factor for v in raw], dtype=np.float64))
            widths.append(np.full(len(raw), float(k * m.unit) * factor))
            continue
        if m.unit == 1:
            values.append(_integers(raw))
        else:
            values.append(np.array([float(v * m.unit) for v in raw], dtype=np.float64))
        widths.append(np.full(len(raw), float(k * m.unit)))
    return values, widths


_INT64 = (-(2**63), 2**63 - 1)


def _integers(raw: list[int]) -> Any:
    """Exact noisy totals as int64 where every one is an integer that fits (released as
    BIGINT, whatever the values), else as they are (integers past 64 bits; a workload's
    combined, unrounded estimates)."""
    if all(type(v) is int and _INT64[0] <= v <= _INT64[1] for v in raw):
        return np.array(raw, dtype=np.int64)
    return np.array(raw, dtype=object)
