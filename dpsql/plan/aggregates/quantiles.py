"""Quantiles (MEDIAN, QUANTILE, PERCENTILE_CONT/DISC, MIN and MAX): the exponential mechanism
over the grid candidates of x (Smith 2011), with an interval around each.

**The value** is the candidate chosen, a grid point: the noise is not additive. It has no
variance to weigh in the optimal split (weight 0: as with the even split, it keeps its share of
epsilon). ``dpsql.rank_error`` = r binds it: the mechanism picks a candidate whose score exceeds
b·r (b the denominator of p: the target rank is within r rows of the ranks the candidate spans)
with probability at most |R|·exp(-(b·r + 1)/(2·scale)), since the best candidate scores 0 and
scores are integers (the exponential mechanism's utility argument, McSherry and Talwar 2007).

**The interval** ``[lo, hi]`` covers the p-quantiles of the kept rows (on the grid, and the
value before rounding to it) with probability at least the query's confidence c. Each end is
another exponential mechanism on the same histogram, aimed Δ rows beyond the target rank: the
lower at p·n − Δ, the upper at p·n + Δ (``quantile_scores``' public shift, with Δ rows padded at
the grid's edge so that the best score is 0 wherever the target falls). Coverage: if lo lay
above a p-quantile q, then #{x < lo} >= #{x <= q} >= p·n, so lo's score would be at least
b·Δ; with the best score 0, the mechanism picks such a candidate with probability at most
|R|·exp(-b·Δ/(2·scale)) (McSherry and Talwar 2007), which Δ = ⌈2·scale·ln(|R|/β)/b⌉ keeps at
β = (1 − c)/2 (the same for hi; the union bound gives c). No noisy count of rows is needed: the
shift is in rows, public, and the score's sensitivity is unchanged. The interval is then
widened by one grid step on each side (the rows were rounded to the grid) and made to hold the
released value (post-processing). MIN has no lower end to draw (the grid's lower edge is one,
and the upper end alone takes β = 1 − c), MAX no upper end.

**The cost.** Each end is one more measurement of the query, charged within its epsilon: the
two ends of a quantile take together what one measurement takes in the even split
(``MeasurementSpec.slot``), so a lone MEDIAN gives half its epsilon to the value and a quarter
to each end; MIN and MAX two thirds and one third. An interval is drawn at the confidence
of its query (``dpsql.confidence``, part of the release's key): unlike a half-width, which any
confidence reads from the noise's scale, it is fixed when drawn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from dpsql.analyze.analysis import Aggregate
from dpsql.bound.grid import quantile_grid
from dpsql.bound.specs import MeasurementSpec
from dpsql.plan.aggregates.rule import AggregateRule, Builder, Rank, Released
from dpsql.plan.plans import Estimate, Measurement


def _measure(agg: Aggregate, builder: Builder) -> Estimate:
    """The exponential mechanism's choice among x's quantile-grid candidates, at order p, and
    its interval's ends (module docstring): MIN has no lower end to draw, MAX no upper."""
    assert agg.arg is not None and agg.bounds is not None and agg.p is not None
    grid = quantile_grid(agg.bounds)
    v = builder.value(agg.arg, grid, "quantile")
    own = [builder.measure(MeasurementSpec("quantile", v, agg.p))]
    for side in sides(agg.p):
        own.append(builder.measure(MeasurementSpec("quantile", v, agg.p, side, builder.confidence)))
    return Estimate(agg.kind, tuple(own), grid)


def sides(p: Fraction) -> tuple[int, ...]:
    """The ends of p's interval that are drawn: -1 the lower, +1 the upper."""
    return tuple(side for side, edge in ((-1, Fraction(0)), (1, Fraction(1))) if p != edge)


def endpoint_shift(m: Measurement) -> int:
    """Δ: how many rows beyond the target rank an interval's end aims (module docstring), a
    function of public numbers only: the end's scale, its grid's size, p and the confidence."""
    assert m.scale is not None and m.grid is not None and m.spec.p is not None
    assert m.spec.side != 0 and m.spec.confidence is not None
    beta = (1 - m.spec.confidence) / len(sides(m.spec.p))
    candidates = m.grid.upper - m.grid.lower + 1
    rows = 2 * float(m.scale) * math.log(candidates / beta) / m.spec.p.denominator
    # A relative margin of 1e-9 on the float ln: a Δ one row too large is safe, too small not.
    return max(math.ceil(rows * (1 + 1e-9)), 1)


def _chosen(
    estimate: Estimate,
    measurements: Sequence[Measurement],
    noisy: Sequence[npt.ArrayLike],
    confidence: float,
) -> Released:
    """The chosen grid points, in value units; NaN half-widths (none is released)."""
    j = estimate.measurements[0]
    chosen = cast(Sequence[Any], noisy[j])
    unit = measurements[j].unit
    return (
        np.array([float(v * unit) for v in chosen], dtype=np.float64),
        np.full(len(chosen), np.nan),
    )


def _interval(
    estimate: Estimate, measurements: Sequence[Measurement], noisy: Sequence[npt.ArrayLike]
) -> Released:
    """Each released value's interval (module docstring), in value units: its ends one grid
    step wider, the grid's edge where an end is not drawn, and holding the value."""
    main = estimate.measurements[0]
    m = measurements[main]
    assert m.grid is not None
    chosen = [int(v) for v in cast(Sequence[Any], noisy[main])]
    lows, highs = list(chosen), list(chosen)
    ends = {measurements[j].spec.side: j for j in estimate.measurements[1:]}
    lower = [int(v) for v in cast(Sequence[Any], noisy[ends[-1]])] if -1 in ends else None
    upper = [int(v) for v in cast(Sequence[Any], noisy[ends[1]])] if 1 in ends else None
    for g, value in enumerate(chosen):
        lo = m.grid.lower if lower is None else max(lower[g] - 1, m.grid.lower)
        hi = m.grid.upper if upper is None else min(upper[g] + 1, m.grid.upper)
        lows[g], highs[g] = min(lo, value), max(hi, value)
    unit = m.unit
    return (
        np.array([float(v * unit) for v in lows], dtype=np.float64),
        np.array([float(v * unit) for v in highs], dtype=np.float64),
    )


def _range(estimate: Estimate) -> tuple[float, float] | None:
    """The grid's range in value units: an interval spanning most of it, or a value on its
    edge, is mostly noise (``dpsql.release.post.mostly_noise``)."""
    grid = estimate.grid
    if grid is None:
        return None
    return (float(grid.lower * grid.step), float(grid.upper * grid.step))


def _weights(estimate: Estimate) -> tuple[Fraction, ...]:
    return (Fraction(0),) * len(estimate.measurements)


def quantile_rank(m: Measurement, confidence: float) -> float:
    """The rank error (rows) the exponential mechanism keeps with probability >= confidence."""
    assert m.scale is not None and m.grid is not None and m.spec.p is not None
    candidates = m.grid.upper - m.grid.lower + 1
    b = m.spec.p.denominator
    # |R|·exp(-(b·r + 1)/(2·scale)) <= 1 - c  <=>  r >= (2·scale·ln(|R|/(1 - c)) - 1)/b
    return max((2 * float(m.scale) * math.log(candidates / (1 - confidence)) - 1) / b, 0.0)


QUANTILE = AggregateRule(
    "quantile",
    _measure,
    _chosen,
    _weights,
    Rank(quantile_rank),
    "QUANTILE({arg}, {p})",
    bounds=_range,
    interval=_interval,
)

__all__ = ["QUANTILE", "endpoint_shift", "quantile_rank", "sides"]
