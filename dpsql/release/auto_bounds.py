"""The bound choices of a query under ``dpsql.bounds = auto``, after its charge (the plan:
``dpsql.plan.auto``).

Each contribution bound is the first rung of ``dpsql.plan.auto.LADDER``, walking up, at which the
noisy count of units (or cells) beyond it is at most the noisy target k (one rung higher where
the walk cannot resolve k: ``dpsql.plan.auto.overshoot``): AboveThreshold over
counts that one unit moves by at most the walk's sensitivity, all in one direction (adding a
unit never lowers one), with the monotone-query noise of Lyu, Su and Li (VLDB 2017, Theorem 4)
from ``dpsql.noise.sparse_vector``; a walk that never stops gives the top rung. L0 is chosen
before C, whose target depends on it (sequential composition: C's walk is another mechanism,
its threshold post-processing of L0's release). A clamped column's two bounds are one walk
pair over its ladder (``dpsql.release.clamp_bounds``), aimed at k units beyond each side. The
values chosen are released with the answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from dpsql.bound.estimates import TOP_INDEX
from dpsql.bound.selection import CELL_ROWS, LARGEST_GROUP, UNIT_GROUPS, UNIT_ROWS
from dpsql.noise.sparse_vector import Walks, above_threshold, beyond_each
from dpsql.plan.auto import (
    CLAMPS,
    GROUPS,
    LADDER,
    ROWS,
    ROWS_PER_GROUP,
    TRADEOFF_THRESHOLD,
    AutoBounds,
    Choice,
    overshoot,
    rung_index,
)
from dpsql.release import clamp_bounds

# Which histogram of ``dpsql.bound.selection`` each walk reads.
_STATISTIC = {ROWS: UNIT_ROWS, GROUPS: UNIT_GROUPS, ROWS_PER_GROUP: LARGEST_GROUP}


def beyond(histogram: Mapping[int, int]) -> list[int]:
    """For each rung, how many units (cells) have a value above it."""
    counts = [0] * len(LADDER)
    for value, n in histogram.items():
        counts[rung_index(value, LADDER)] += n
    return beyond_each(counts)


def _statistic(choice: Choice) -> int:
    return CELL_ROWS if choice.statistic == "cells" else _STATISTIC[choice.bound]


def tradeoff_walk(
    epsilon: Fraction, sensitivity: int, above: Sequence[int], target: Fraction
) -> int:
    """The index a bias-noise trade-off walk chooses on a ladder of ``len(above)`` rungs: where
    AboveThreshold stops, one rung higher where it cannot resolve ``target``
    (``dpsql.plan.auto.overshoot``; post-processing of the stop). Charged before this runs."""
    walks = Walks(epsilon, 1, sensitivity, TRADEOFF_THRESHOLD)
    (stop,) = above_threshold(walks, [list(above)], [target])
    return min(stop + overshoot(epsilon, sensitivity, target), len(above) - 1)


def tradeoff_scales(epsilon: Fraction, sensitivity: int = 1) -> list[Fraction]:
    """The discrete Laplace scales of one trade-off walk."""
    walks = Walks(epsilon, 1, sensitivity, TRADEOFF_THRESHOLD)
    return [walks.threshold_scale, walks.query_scale]


def walk(choice: Choice, above: Sequence[int], target: Fraction) -> int:
    """One walk's chosen rung (charged before this runs)."""
    return LADDER[tradeoff_walk(choice.epsilon, choice.sensitivity, above, target)]


def choose(
    auto: AutoBounds,
    rows: Sequence[tuple[Any, ...]],
    clamp_rows: Sequence[Sequence[tuple[Any, ...]]],
) -> dict[str, object]:
    """The chosen bounds, by name: ``max_rows_per_unit`` and the others as integers, and
    ``table.column`` as a (lower, upper) pair of Fractions for each clamped column."""
    histograms: dict[int, dict[int, int]] = {}
    for statistic, value, n in rows:
        h = histograms.setdefault(int(statistic), {})
        h[int(value)] = h.get(int(value), 0) + int(n)
    chosen: dict[str, object] = dict(auto.fixed)
    l0 = auto.fixed_l0
    clamps = iter(clamp_rows)
    # L0's walk runs first: C's target depends on the L0 it chose.
    for choice in sorted(auto.choices, key=lambda c: c.bound != GROUPS):
        if choice.bound == CLAMPS:
            k = choice.target(auto.noise, 1, auto.groups)
            walks = Walks(choice.epsilon, 2)
            upper, lower = above_threshold(walks, clamp_bounds.beyond(next(clamps)), [k, k])
            chosen[f"{choice.table}.{choice.column}"] = clamp_bounds.from_release(
                TOP_INDEX - lower, upper
            )
            continue
        above = beyond(histograms.get(_statistic(choice), {}))
        target = choice.target(auto.noise, l0 or 1, auto.groups)
        chosen[choice.bound] = walk(choice, above, target)
        if choice.bound == GROUPS:
            l0 = int(chosen[GROUPS])  # type: ignore[call-overload]
    return chosen


def scales(auto: AutoBounds) -> list[Fraction]:
    """Every discrete Laplace scale the walks draw (checked before the charge)."""
    out = []
    for choice in auto.choices:
        if choice.bound == CLAMPS:
            w = Walks(choice.epsilon, 2, choice.sensitivity)
            out += [w.threshold_scale, w.query_scale]
        else:
            out += tradeoff_scales(choice.epsilon, choice.sensitivity)
    return out


def describe(chosen: Mapping[str, object]) -> str:
    """The chosen values as the answer's note shows them."""
    parts = []
    for name, value in chosen.items():
        if isinstance(value, tuple):
            lower, upper = value
            parts.append(f"{name} in [{_text(lower)}, {_text(upper)}]")
        else:
            parts.append(f"{name} = {value}")
    return "bounds chosen privately for this answer (released with it): " + "; ".join(parts)


def _text(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{float(value):.6g}"


__all__ = [
    "beyond",
    "choose",
    "describe",
    "scales",
    "tradeoff_scales",
    "tradeoff_walk",
    "walk",
]
