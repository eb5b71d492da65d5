"""VAR_POP, VAR_SAMP, STDDEV_POP and STDDEV_SAMP, from three noisy measurements: the centred
sum of squares Q (units of (g/2)²), the centred sum S (units of g/2) and the count N.

Their half-width: each measurement's exact noise half-width at confidence c^(1/3), and the
estimator's range over that box by sound interval arithmetic (``_spread``); at
1 - (1 - c)/3 each instead when one is a combination of released noises
(``dpsql.plan.estimators._each``). It covers the noise only.

Their weights in the optimal split (``dpsql.plan.split``): 1 on Q, 4w²/3 on S and 11w⁴/45 on N,
w half the range of the bounds: N²·dVar = dQ - 2m·dS - (Q/N - 2m²)·dN, averaged over a mean m
uniform in ±w and a variance uniform between 0 and the largest the mean allows, w² - m².
STDDEV's error is VAR's over 2·STDDEV, a factor common to its three measurements, so it is
weighed as VAR.
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
from dpsql.errors import InternalError
from dpsql.plan.aggregates import bernstein
from dpsql.plan.aggregates.ratios import POINTS, probe
from dpsql.plan.aggregates.rule import AggregateRule, Builder, Ratio
from dpsql.plan.estimators import FloatArray, _each, half_width, within
from dpsql.plan.plans import Estimate, Measurement
from dpsql.sql.aggregates import AggregateKind

# Each kind: (the samples' variance, scaled by N/(N - 1); its square root).
_FORMS: dict[AggregateKind, tuple[bool, bool]] = {
    "var_pop": (False, False),
    "var_samp": (True, False),
    "stddev_pop": (False, True),
    "stddev_samp": (True, True),
}

_ROUNDING = bernstein.ROUNDING  # relative widening of an interval's ends for float rounding


def _measure(agg: Aggregate, builder: Builder) -> Estimate:
    """(centred sum of squares, centred sum, count) of x on its grid."""
    assert agg.arg is not None and agg.bounds is not None
    grid = value_grid(agg.bounds)
    v = builder.value(agg.arg, grid)
    parts = (
        builder.measure(MeasurementSpec("centred_squares", v)),
        builder.measure(MeasurementSpec("centred", v)),
        builder.measure(MeasurementSpec("count", v)),
    )
    return Estimate(agg.kind, parts, grid)


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


def square_range(s: FloatArray, k: float) -> tuple[FloatArray, FloatArray]:
    """The range of S² for S in s ± k: from 0 when the interval holds 0, else from its nearer
    end, to its farther end."""
    a_lo, a_hi = np.abs(s - k), np.abs(s + k)
    s_min = np.where(np.abs(s) <= k, 0.0, np.minimum(a_lo, a_hi))
    return s_min**2, np.maximum(a_lo, a_hi) ** 2


def _spread(
    estimate: Estimate,
    measurements: Sequence[Measurement],
    noisy: Sequence[npt.ArrayLike],
    confidence: float,
) -> tuple[FloatArray, FloatArray]:
    """VAR_POP, VAR_SAMP, STDDEV_POP and STDDEV_SAMP, and their half-widths, vectorized.

    The estimate, from the noisy Q, S and count: with N = max(count, 1),
    var_pop = max(Q/N - (S/N)², 0) and var_samp = var_pop·N/max(N - 1, 1), clamped to the
    largest variance a value in the bounds can have, ((hi_g - lo_g)/2)²; STDDEV is the square
    root. Post-processing of noisy values.

    The half-width: the interval is the estimator's range over the box (Q ± k_Q, S ± k_S,
    count ± k_N): the range of Q/N - (S/N)² (exact over the box, ``_moment_range``), floored at
    0, times the range of N/max(N - 1, 1) for the samples' variance, clamped like the estimate,
    square roots of the ends for STDDEV. It depends on the noisy values, so it is
    post-processing too.
    """
    grid = estimate.grid
    assert grid is not None
    i_squares, i_sum, i_count = estimate.measurements
    samp, root = _FORMS[estimate.kind]
    top = float(grid.width) ** 2  # ((hi_g - lo_g)/2)², the largest variance, in (g/2)²
    if estimate.joint:
        # One Bernstein vector (``bernstein``): Q, S and N are combinations of its coordinates.
        q, s, n = bernstein.moments([noisy[j] for j in estimate.measurements], grid.width)
    else:
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
    radius = None
    parts = [measurements[j] for j in estimate.measurements]
    scale = bernstein.one_scale(parts)
    if estimate.joint and scale is None:
        # Coordinates answered from several releases (``dpsql.cache.derive``): each within its
        # own half-width (the union bound, ``_each``), so within that cube.
        k_q, k_s, k_n = bernstein.cube_widths((k_q, k_s, k_n), grid.width)
    elif estimate.joint and scale is not None:
        # The three coordinates' noise within an L1 ball of radius t with probability >= c
        # (``bernstein.l1_radius``): the true Q, S and N lie in the box it spans.
        radius = bernstein.l1_radius(scale, confidence)
        k_q, k_s, k_n = bernstein.moment_widths(radius, grid.width)
    n_lo, n_hi = np.maximum(n - k_n, 1.0), np.maximum(n + k_n, 1.0)
    low, high = _moment_range((q - k_q, q + k_q), square_range(s, k_s), (1.0 / n_hi, 1.0 / n_lo))
    if radius is not None:
        # Tighter where it applies: the range over the coordinates' own box (``bernstein``),
        # intersected with the (Q, S, N) box's (both hold when the three coordinates hold).
        b = [noisy[j] for j in estimate.measurements]
        v_low, v_high, valid = bernstein.vertex_range(b, radius, grid.width)
        low = np.where(valid, np.maximum(low, v_low), low)
        high = np.where(valid, np.minimum(high, v_high), high)
    # A negative high end is a box that missed (a variance is >= 0): ``within`` below.
    low = np.maximum(low, 0.0)
    if samp:
        # N/(N - 1) (N/1 below 2) rises on [1, 2] and falls after: its peak 2 is at N = 2.
        ends = (_bessel(n_lo), _bessel(n_hi))
        low = low * np.minimum(*ends) * (1.0 - _ROUNDING)
        high = high * np.where((n_lo <= 2.0) & (n_hi >= 2.0), 2.0, np.maximum(*ends))
        high = high * (1.0 + _ROUNDING)
    unit = (float(grid.step) / 2) ** 2
    ends3 = [v * unit for v in (value, *within(low, high, 0.0, top))]
    if root:
        ends3 = [np.sqrt(v) for v in ends3]
    value, lower, upper = ends3
    # One ulp up: the rounded difference could leave value ± width a hair inside an end.
    return value, np.nextafter(np.maximum(value - lower, upper - value), np.inf)


def _weights(estimate: Estimate) -> tuple[Fraction, ...]:
    grid = estimate.grid
    assert grid is not None
    if estimate.joint:
        return (Fraction(1),) * 3  # one vector, one share (coordinate 0's: ``bernstein``)
    w = (grid.upper_value - grid.lower_value) / 2
    return (Fraction(1), 4 * w**2 / 3, 11 * w**4 / 45)


def _width(
    estimate: Estimate, measurements: Sequence[Measurement], confidence: float, n: int
) -> float:
    """The largest half-width ``_spread`` releases in a group of at least ``n`` units, over the
    noisy values of ``dpsql.plan.aggregates.ratios`` and, by noisy mean m = S/n and variance
    v = Q/n - m², over a grid of variances from -k_Q/n to w² + k_Q/n: the width is steepest
    near v = 0 (STDDEV's square root), so small and slightly negative v are dense in it.
    Accuracy targets measure Q, S and N apart (``dpsql.plan.targets``), never one vector."""
    grid = estimate.grid
    assert grid is not None
    if estimate.joint:
        raise InternalError("an accuracy target's plan has a joint measurement")
    at = probe(estimate, measurements, math.nextafter(confidence ** (1 / 3), 1.0), n)
    counts, k = at.counts, at.k
    top = float(grid.width * grid.width)
    rel = np.concatenate(([-1.0, -0.5, -0.1, -0.01, 0.0], np.full(POINTS, np.nan)))
    v = np.empty((len(counts), rel.size))
    v[:, :5] = rel[None, :5] * (k[0] / counts)[:, None]
    v[:, 5:] = np.geomspace(top * 1e-9, top + k[0] / counts, POINTS, axis=1)
    m = at.sums / counts[:, None]  # (counts, points)
    mm = np.broadcast_to(m[:, :, None], (*m.shape, rel.size))
    vv = np.broadcast_to(v[:, None, :], mm.shape)
    nn = np.broadcast_to(counts[:, None, None], mm.shape)
    i_squares, i_sum, i_count = estimate.measurements
    at.noisy[i_squares] = np.round(nn * (vv + mm * mm)).ravel()
    at.noisy[i_sum] = np.round(mm * nn).ravel()
    at.noisy[i_count] = nn.ravel()
    _, width = _spread(estimate, measurements, at.noisy, confidence)
    return float(width.max())


def _bounds(estimate: Estimate) -> tuple[float, float]:
    """A variance is clamped to [0, ((hi_g - lo_g)/2)²], a standard deviation to its root."""
    grid = estimate.grid
    assert grid is not None
    top = (float(grid.width) * float(grid.step) / 2) ** 2
    return 0.0, math.sqrt(top) if _FORMS[estimate.kind][1] else top


SPREADS = tuple(
    AggregateRule(
        kind,
        _measure,
        _spread,
        _weights,
        Ratio(_width, grid_key=lambda g: (g.width, g.step)),
        kind.upper() + "({arg})",
        bounds=_bounds,
    )
    for kind in _FORMS
)

__all__ = ["SPREADS"]
