"""Where a ratio's half-width is checked against an accuracy target with ``dpsql.min_group``.

AVG = m + S/N, and VARIANCE and STDDEV from Q, S and N, release a half-width that depends on
the noisy values (``dpsql.plan.aggregates.avg``, ``dpsql.plan.aggregates.spreads``). A target
``dpsql.halfwidth`` with ``dpsql.min_group`` = N asks that it be met in every group of at
least N units. It is checked wherever the noisy values can fall when each measurement's noise
is within its joint half-width: every noisy count n from N - k_N to 2(N + k_N), and every noisy
mean of a centred sum in ±(w·(n + k_N) + k_S), w the largest centred value in units of g/2,
over a grid of them (beyond it every term of the width shrinks as 1/n). So in a group of at
least N units the released ± meets the target with probability at least the confidence, up to
the grid's resolution (measured: tests/plan/test_targets.py, on data at the bounds, where the
width is largest). Public numbers only: the noise's parameters, the grid and the confidence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dpsql.plan.estimators import FloatArray, half_width
from dpsql.plan.plans import Estimate, Measurement

# Points of each noisy centred sum (and sum of squares) at which a ratio's half-width is checked.
POINTS = 33
# Noisy counts (a geometric grid) at which it is checked.
_COUNTS = 9


@dataclass(frozen=True)
class Probe:
    """The noisy values a ratio is checked at, for a group of at least ``n`` units."""

    k: list[int]  # each measurement's half-width at the joint confidence, in its order
    counts: FloatArray  # the noisy counts
    sums: FloatArray  # (counts, POINTS): for each count, the noisy centred sums it can give
    noisy: list[npt.ArrayLike]  # one entry per measurement of the plan, to fill in


def probe(estimate: Estimate, measurements: Sequence[Measurement], joint: float, n: int) -> Probe:
    """The counts and centred sums (module docstring) for the ratio ``estimate``, whose last two
    measurements are a centred sum and a count, each bounded at confidence ``joint``."""
    grid = estimate.grid
    assert grid is not None
    k = [half_width(measurements[j], joint) for j in estimate.measurements]
    # Noisy counts from N - k_N up: the width is not monotone in the count near a variance of
    # 0, so counts up to twice N + k_N are checked too (beyond, every term shrinks as 1/count).
    counts = np.unique(np.geomspace(max(n - k[-1], 1), 2 * (n + k[-1]), _COUNTS).round())
    # For each noisy count, every noisy centred sum a group of that count can give (its units
    # are at most count + k_N), all in one vectorized evaluation.
    units = counts + k[-1]
    spans = grid.width * units + k[-2]  # a centred row value lies in ±width units of g/2
    sums = np.linspace(-spans, spans, POINTS, axis=1)
    noisy: list[npt.ArrayLike] = [np.zeros(0) for _ in measurements]
    return Probe(k, counts, sums, noisy)


__all__ = ["POINTS", "Probe", "probe"]
