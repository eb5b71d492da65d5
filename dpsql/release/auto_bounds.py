"""The bound choices of a query under ``dpsql.bounds = auto``, after its charge (the plan:
``dpsql.plan.auto``).

Each contribution bound is the first rung of ``dpsql.plan.auto.LADDER``, walking up, at which the
noisy count of units (or cells) beyond it is at most the noisy target k (one rung higher where
the walk cannot resolve k: ``dpsql.plan.auto.overshoot``): AboveThreshold over
counts that one unit moves by at most the walk's sensitivity, all in one direction (adding a
unit never lowers one), with the monotone-query noise of Lyu, Su and Li (VLDB 2017, Theorem 4)
from ``dpsql.noise.sparse_vector``; a walk that never stops gives the top rung. L0 is chosen
before C, whose target depends on it (sequential composition: C's walk is another mechanism,
its threshold post-processing of L0's release). C's walk over the cells of a public domain
first releases the groups' noisy sizes and weighs each group's cells by them
(``dpsql.plan.auto.GroupWeights``; sequential composition again). A clamped column's two
bounds are one walk pair over its ladder (``dpsql.release.clamp_bounds``), aimed at k units
beyond each side. The values chosen are released with the answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from dpsql.bound.estimates import TOP_INDEX
from dpsql.bound.selection import GROUP_CELLS, LARGEST_GROUP, UNIT_GROUPS, UNIT_ROWS
from dpsql.errors import InternalError
from dpsql.noise.laplace import discrete_laplace
from dpsql.noise.sparse_vector import Walks, above_threshold, beyond_each
from dpsql.plan.auto import (
    CLAMPS,
    GROUPS,
    LADDER,
    ROWS,
    ROWS_PER_GROUP,
    TRADEOFF_THRESHOLD,
    WEIGHT_CAP,
    WEIGHT_TOTAL,
    AutoBounds,
    Choice,
    GroupWeights,
    overshoot,
    rung_index,
)
from dpsql.release import clamp_bounds

# Which histogram of ``dpsql.bound.selection`` each walk reads.
_STATISTIC = {ROWS: UNIT_ROWS, GROUPS: UNIT_GROUPS, ROWS_PER_GROUP: LARGEST_GROUP}


def read_histograms(rows: Sequence[tuple[Any, ...]]) -> dict[int, dict[int, int]]:
    """The engine's (statistic, value, count) rows of ``dpsql.bound.selection`` as one
    histogram of values per statistic."""
    histograms: dict[int, dict[int, int]] = {}
    for statistic, value, n in rows:
        h = histograms.setdefault(int(statistic), {})
        h[int(value)] = h.get(int(value), 0) + int(n)
    return histograms


def beyond(histogram: Mapping[int, int]) -> list[int]:
    """For each rung, how many units (cells) have a value above it."""
    counts = [0] * len(LADDER)
    for value, n in histogram.items():
        counts[rung_index(value, LADDER)] += n
    return beyond_each(counts)


def tradeoff_walk(
    epsilon: Fraction, sensitivity: int, above: Sequence[int], target: Fraction, step: int = -1
) -> int:
    """The index a bias-noise trade-off walk chooses on a ladder of ``len(above)`` rungs: where
    AboveThreshold stops, ``step`` rungs higher (by default one where it cannot resolve
    ``target``: ``dpsql.plan.auto.overshoot``; post-processing of the stop). Charged before this
    runs."""
    walks = Walks(epsilon, 1, sensitivity, TRADEOFF_THRESHOLD)
    (stop,) = above_threshold(walks, [list(above)], [target])
    if step < 0:
        step = overshoot(epsilon, sensitivity, target)
    return min(stop + step, len(above) - 1)


def group_cells(histograms: Mapping[int, Mapping[int, int]], groups: int) -> list[dict[int, int]]:
    """Each group's histogram of rows per cell, the domain's absent groups empty: ``groups``
    of them, in the engine's numbering (which no step reads as a label)."""
    present = [dict(h) for b, h in sorted(histograms.items()) if b >= GROUP_CELLS]
    if len(present) > groups:
        raise InternalError("more groups than the public domain holds")
    return present + [{} for _ in range(groups - len(present))]


def group_weights(weights: GroupWeights, cells: Sequence[Mapping[int, int]]) -> list[int]:
    """The integer weights of the groups (``dpsql.plan.auto``): each group's size, the rows of
    its cells counted up to WEIGHT_CAP a cell, plus a discrete Laplace of ``weights.scale``
    (the Laplace mechanism at L1 sensitivity WEIGHT_CAP·G), then post-processing. Charged
    before this runs."""
    sizes = [sum(min(v, WEIGHT_CAP) * n for v, n in h.items()) for h in cells]
    noise = discrete_laplace(weights.scale, len(sizes))
    return weights.weights([s + int(z) for s, z in zip(sizes, noise, strict=True)])


def cell_walk(choice: Choice, cells: Sequence[Mapping[int, int]], target: Fraction) -> int:
    """C's walk over the cells, each group's weighed (``dpsql.plan.auto``): the weighted count
    beyond each rung moves by at most W = Σ w_g on a neighbour, upward; target W·``target``.
    Charged before this runs."""
    assert choice.weights is not None
    w = group_weights(choice.weights, cells)
    total = sum(w)
    if not 0 < total <= WEIGHT_TOTAL:
        raise InternalError("group weights outside (0, WEIGHT_TOTAL]")
    above = [0] * len(LADDER)
    for weight, h in zip(w, cells, strict=True):
        for i, n in enumerate(beyond(h)):
            above[i] += weight * n
    step = choice.steps(target)
    return LADDER[tradeoff_walk(choice.walk_epsilon, total, above, total * target, step)]


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
    histograms = read_histograms(rows)
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
        target = choice.target(auto.noise, l0 or 1, auto.groups)
        if choice.weights is not None:
            cells = group_cells(histograms, choice.weights.groups)
            chosen[choice.bound] = cell_walk(choice, cells, target)
        else:
            above = beyond(histograms.get(_STATISTIC[choice.bound], {}))
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
        elif choice.weights is not None:
            out.append(choice.weights.scale)
            out += tradeoff_scales(choice.walk_epsilon, WEIGHT_TOTAL)  # W at most
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
    "cell_walk",
    "choose",
    "describe",
    "group_cells",
    "group_weights",
    "read_histograms",
    "scales",
    "tradeoff_scales",
    "tradeoff_walk",
    "walk",
]
