"""Quantiles (MEDIAN, QUANTILE, PERCENTILE_CONT/DISC, MIN and MAX): the exponential mechanism
over the grid candidates of x (Smith 2011), one measurement per quantile.

The released value is the candidate chosen, a grid point, with no interval around it: the
noise is not additive. It has no variance to weigh in the optimal split (weight 0: as with the
even split, it keeps its 1/k share of epsilon). ``dpsql.rank_error`` = r binds it: the
mechanism picks a candidate whose score exceeds b·r (b the denominator of p: the target rank is
within r rows of the ranks the candidate spans) with probability at most
|R|·exp(-(b·r + 1)/(2·scale)), since the best candidate scores 0 and scores are integers (the
exponential mechanism's utility argument, McSherry and Talwar 2007).
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
    """The exponential mechanism's choice among x's quantile-grid candidates, at order p."""
    assert agg.arg is not None and agg.bounds is not None
    grid = quantile_grid(agg.bounds)
    v = builder.value(agg.arg, grid, "quantile")
    return Estimate(agg.kind, (builder.measure(MeasurementSpec("quantile", v, agg.p)),), grid)


def _chosen(
    estimate: Estimate,
    measurements: Sequence[Measurement],
    noisy: Sequence[npt.ArrayLike],
    confidence: float,
) -> Released:
    """The chosen grid points, in value units; NaN half-widths (none is released)."""
    (j,) = estimate.measurements
    chosen = cast(Sequence[Any], noisy[j])
    unit = measurements[j].unit
    return (
        np.array([float(v * unit) for v in chosen], dtype=np.float64),
        np.full(len(chosen), np.nan),
    )


def _weights(estimate: Estimate) -> tuple[Fraction, ...]:
    return (Fraction(0),)


def quantile_rank(m: Measurement, confidence: float) -> float:
    """The rank error (rows) the exponential mechanism keeps with probability >= confidence."""
    assert m.scale is not None and m.grid is not None and m.spec.p is not None
    candidates = m.grid.upper - m.grid.lower + 1
    b = m.spec.p.denominator
    # |R|·exp(-(b·r + 1)/(2·scale)) <= 1 - c  <=>  r >= (2·scale·ln(|R|/(1 - c)) - 1)/b
    return max((2 * float(m.scale) * math.log(candidates / (1 - confidence)) - 1) / b, 0.0)


QUANTILE = AggregateRule(
    "quantile", _measure, _chosen, _weights, Rank(quantile_rank), "QUANTILE({arg}, {p})"
)

__all__ = ["QUANTILE", "quantile_rank"]
