"""AVG(x) = m + S/N: the grid's centre m plus a noisy centred sum over a noisy count, clamped
to the bounds (DESIGN.md section 3: centring gains when the bounds are not symmetric around 0).

Its half-width: the box [S ± k_S] x [N ± k_N], each at confidence sqrt(c), covers both
independent noises with probability at least c; the half-width is the larger distance from the
estimate to the ends of the ratio's range over the box (clamped to the bounds). When one of the
two is a combination of released noises (a workload's least squares, or a centred sum derived
from a released SUM and COUNT, which shares the COUNT's noise), each is bounded at
1 - (1 - c)/2 instead (``dpsql.plan.estimators._each``). It covers the noise only.

Its weights in the optimal split (``dpsql.plan.split``): 1 on S and w²/3 on N, w half the range
of the bounds: the first-order error of S/N times N² is dS - (S/N)·dN, and (S/N)² averages w²/3
over a mean anywhere in ±w (uniform); N² makes the weight free of the unknown N.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from dpsql.analyze.analysis import Aggregate
from dpsql.bound.grid import value_grid
from dpsql.bound.specs import MeasurementSpec
from dpsql.plan.aggregates.ratios import probe
from dpsql.plan.aggregates.rule import AggregateRule, Builder, Ratio
from dpsql.plan.estimators import FloatArray, _each, half_width, within
from dpsql.plan.plans import Estimate, Measurement


def _measure(agg: Aggregate, builder: Builder) -> Estimate:
    """(centred sum, count) of x on its grid."""
    assert agg.arg is not None and agg.bounds is not None
    grid = value_grid(agg.bounds)
    v = builder.value(agg.arg, grid)
    parts = (
        builder.measure(MeasurementSpec("centred", v)),
        builder.measure(MeasurementSpec("count", v)),
    )
    return Estimate(agg.kind, parts, grid)


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
    lower, upper = within(centre + low * half, centre + high * half, lo, hi)
    # With no plausible positive count the average may be anywhere in the bounds.
    hopeless = n + k_n < 1
    lower = np.where(hopeless, lo, lower)
    upper = np.where(hopeless, hi, upper)
    width = np.maximum(value - lower, upper - value)
    return value, width


def _weights(estimate: Estimate) -> tuple[Fraction, ...]:
    grid = estimate.grid
    assert grid is not None
    w = (grid.upper_value - grid.lower_value) / 2
    return (Fraction(1), w**2 / 3)


def _width(
    estimate: Estimate, measurements: Sequence[Measurement], confidence: float, n: int
) -> float:
    """The largest half-width ``_avg`` releases in a group of at least ``n`` units, over the
    noisy values of ``dpsql.plan.aggregates.ratios``."""
    at = probe(estimate, measurements, math.sqrt(confidence), n)
    i_sum, i_count = estimate.measurements
    at.noisy[i_sum] = np.round(at.sums).ravel()
    at.noisy[i_count] = np.broadcast_to(at.counts[:, None], at.sums.shape).ravel()
    _, width = _avg(estimate, measurements, at.noisy, confidence)
    return float(width.max())


def _bounds(estimate: Estimate) -> tuple[float, float]:
    """An AVG is clamped to its value's grid-aligned bounds."""
    grid = estimate.grid
    assert grid is not None
    return float(grid.lower_value), float(grid.upper_value)


AVG = AggregateRule("avg", _measure, _avg, _weights, Ratio(_width), "AVG({arg})", bounds=_bounds)

__all__ = ["AVG"]
