"""Value grids: every aggregated value is rounded to a power-of-two grid fixed by its bounds.

Exact integer sums on a grid do not depend on the engine's thread order, and their rounding
error cannot exceed the declared sensitivity (Casacuberta et al. 2022), unlike a float SUM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from dpsql.analyze.intervals import Interval
from dpsql.errors import BoundsError
from dpsql.policy import MAX_ABS_BOUND

# Grid resolution: 2^-20 of the clamping range. Rounding each row to the grid moves a sum by at
# most half a step per row; at this resolution that is far below the noise for any realistic
# number of rows, while integer sums stay within HUGEINT.
GRID_BITS = 20
MIN_STEP_POWER = -60
# Quantiles choose among about 2**10 candidates: finer grids cost sampling time and dilute the
# exponential mechanism's mass (its error grows with log K) for little gain in resolution.
QUANTILE_BITS = 10
# Grid-unit values are computed in DOUBLE in the engine; they must stay exact integers there.
MAX_GRID_UNITS = 2**52


def floor_log2(x: Fraction) -> int:
    """floor(log2(x)) for x > 0, exactly."""
    if x <= 0:
        raise ValueError("log2 of a non-positive number")
    k = x.numerator.bit_length() - x.denominator.bit_length()
    # Now 2^(k-1) < x < 2^(k+1); settle the exact power.
    while Fraction(2) ** k > x:
        k -= 1
    while Fraction(2) ** (k + 1) <= x:
        k += 1
    return k


@dataclass(frozen=True)
class Grid:
    """The grid of an aggregated value: step ``g`` (a power of two) and integer bounds.

    Row values are rounded to multiples of ``g`` and clamped to ``[lower·g, upper·g]``, the
    grid-aligned bounds ``[g·floor(lo/g), g·ceil(hi/g)]`` (DESIGN.md section 3). Sums are exact
    integers in units of ``g`` (uncentred) or ``g/2`` (centred around the midpoint).
    """

    step: Fraction
    lower: int
    upper: int

    @property
    def lower_value(self) -> Fraction:
        return self.lower * self.step

    @property
    def upper_value(self) -> Fraction:
        return self.upper * self.step

    @property
    def centre_units(self) -> int:
        """The centre m = (lo_g + hi_g)/2 in units of g/2: an integer, lower + upper."""
        return self.lower + self.upper

    @property
    def centre(self) -> Fraction:
        return self.centre_units * self.step / 2

    @property
    def magnitude(self) -> int:
        """max(|lo_g|, |hi_g|) in units of g: the per-row L1 of an uncentred sum."""
        return max(abs(self.lower), abs(self.upper))

    @property
    def width(self) -> int:
        """hi_g - lo_g in units of g; a centred row value in units of g/2 lies in ±width."""
        return self.upper - self.lower


def quantile_grid(bounds: Interval) -> Grid:
    """The candidates of a quantile: multiples of a power of two g with about 2**10 of them
    between the bounds (every integer when an integer range is that small)."""
    return value_grid(bounds, QUANTILE_BITS)


def value_grid(bounds: Interval, bits: int = GRID_BITS) -> Grid:
    """The grid for an aggregated expression; depends on its bounds and type only."""
    lo, hi = bounds.lower, bounds.upper
    if lo is None or hi is None:
        raise BoundsError("an aggregated value needs finite bounds")
    if max(abs(lo), abs(hi)) > MAX_ABS_BOUND:
        # The same limit as the policy's bounds: beyond it the grid units would not stay exact
        # in the engine's DOUBLE, and noise in value units would overflow a float.
        raise BoundsError("an aggregated expression's bounds exceed ±2**52; clamp it tighter")
    if lo == hi:
        # A constant: widen so that the grid has a positive range (more noise, never less).
        lo, hi = lo - 1, hi + 1
    # At least 2^-60: finer steps (bounds a few subnormals wide) give grid literals the engine
    # cannot hold; such a value is then counted in whole steps of 2^-60 (more noise, not less).
    step = max(Fraction(2) ** (floor_log2(hi - lo) - bits), Fraction(2) ** MIN_STEP_POWER)
    if bounds.integral and step < 1:
        step = Fraction(1)  # integers are already on the unit grid: no rounding at all
    magnitude = max(abs(lo), abs(hi))
    while magnitude / step > MAX_GRID_UNITS:
        step *= 2
    return Grid(step, math.floor(lo / step), math.ceil(hi / step))
