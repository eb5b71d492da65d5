"""Answering a family of a workload (``dpsql.plan.workload.family``) once its charge is committed.

One bounded query at the fine grouping gives every fine cell's exact bounded totals. Each
measurement the plan takes sums them up to its level (a coarser cell's rows are its fine
cells' rows, bounded once) and adds its discrete Laplace noise; per measurement kind, the
levels taken are combined by least squares in exact rationals
(``dpsql.plan.workload.least_squares``: a coarser cell equals the sum of its base cells, exactly,
after the adjustment). Every member is then published from its own plan (its estimates, outputs,
HAVING, ORDER BY, LIMIT) over the adjusted values, with half-widths that cover the combination's
noise (``dpsql.mechanisms.tails``). Everything after the noise is post-processing of released
values: the release, kept in the ledger, also answers any later plan that is a linear function of
its measurements (``derive``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from fractions import Fraction
from typing import Any

import numpy as np

from dpsql.errors import InternalError
from dpsql.noise import measure as release
from dpsql.noise.measure import Noisy
from dpsql.plan.plans import Plan
from dpsql.plan.workload.family import Family
from dpsql.plan.workload.least_squares import adjust
from dpsql.plan.workload.model import Kind, level_map, member_kinds

__all__ = ["answer_family", "combine", "exact_levels", "fine_cells", "measure_family"]


def fine_cells(
    family: Family, rows: Sequence[tuple[Any, ...]]
) -> tuple[list[list[Any]], list[int]]:
    """The fine cells in mixed-radix order: per fine key its values, and per engine row its
    cell index. The bounded query returns every cell of the public domains, whatever the data,
    so this fails only on a planner bug."""
    n = len(family.sizes)
    values: list[list[Any]] = [[] for _ in range(n)]
    seen: list[dict[tuple[str, Any], int]] = [{} for _ in range(n)]
    for row in rows:
        for k in range(n):
            key = (type(row[k]).__name__, row[k])
            if key not in seen[k]:
                seen[k][key] = len(values[k])
                values[k].append(row[k])
    if [len(v) for v in values] != list(family.sizes) or len(rows) != math.prod(family.sizes):
        raise InternalError("the fine bounded query did not return one row per public cell")
    # In a fixed order (NULL last), whatever order the engine returned the rows in: the cells
    # of two databases line up, and nothing here depends on the engine's hashing.
    for k in range(n):
        values[k].sort(key=lambda v: (v is None, type(v).__name__, v if v is not None else 0))
        seen[k] = {(type(v).__name__, v): i for i, v in enumerate(values[k])}
    index = []
    for row in rows:
        i = 0
        for k in range(n):
            i = i * family.sizes[k] + seen[k][(type(row[k]).__name__, row[k])]
        index.append(i)
    if len(set(index)) != len(index):
        raise InternalError("the fine bounded query returned a cell twice")
    return values, index


def exact_levels(
    family: Family, rows: Sequence[tuple[Any, ...]]
) -> dict[tuple[int, tuple[int, ...]], list[int]]:
    """Per measurement taken (kind, level): the exact bounded total of each of its cells, the
    sum of its fine cells' (what the noise is added to)."""
    n = len(family.sizes)
    _, index = fine_cells(family, rows)
    fine_level = tuple(range(n))
    totals = np.zeros((len(family.fine.measurements), math.prod(family.sizes)), dtype=object)
    for row, i in zip(rows, index, strict=True):
        for j in range(len(family.fine.measurements)):
            totals[j, i] = int(row[n + j] or 0)
    out = {}
    for t in family.taken:
        mapping = level_map(family.sizes, fine_level, t.level)
        cells = [0] * family.cells(t.level)
        for i, c in enumerate(mapping):
            cells[int(c)] += int(totals[t.spec, i])
        out[(t.spec, t.level)] = cells
    return out


def answer_family(family: Family, rows: Sequence[tuple[Any, ...]]) -> dict[int, tuple[Plan, Noisy]]:
    """Per member (its statement index): the plan to publish it with and its noisy values."""
    return combine(family, *measure_family(family, rows))


Noised = dict[tuple[int, tuple[int, ...]], list[int]]


def measure_family(
    family: Family, rows: Sequence[tuple[Any, ...]]
) -> tuple[list[list[Any]], Noised]:
    """The fine cells' key values and, per measurement taken, its noisy totals: the release
    (everything after it is post-processing)."""
    values, _ = fine_cells(family, rows)
    exact = exact_levels(family, rows)
    noised = {
        (t.spec, t.level): release._noisy(exact[(t.spec, t.level)], t.measurement)
        for t in family.taken
    }
    return values, noised


Answers = dict[
    tuple[int, tuple[int, ...]], tuple[list[Fraction], list[list[tuple[Fraction, Fraction]]]]
]


def combine(
    family: Family, values: Sequence[Sequence[Any]], noised: Noised
) -> dict[int, tuple[Plan, Noisy]]:
    """The members' answers from the released measurements, by least squares."""
    scales = {(t.spec, t.level): _scale(t.measurement.scale) for t in family.taken}
    answers = level_answers(
        family.sizes, member_kinds(family.sizes, family.members), scales, noised
    )
    out = {}
    for member in family.members:
        out[member.index] = member_answer(
            member.plan, member.positions, member.specs, answers, values, family.sizes
        )
    return out


def _scale(scale: Fraction | None) -> Fraction:
    assert scale is not None
    return scale


def level_answers(
    sizes: Sequence[int],
    kinds: Sequence[Kind],
    scales: dict[tuple[int, tuple[int, ...]], Fraction],
    noised: Noised,
) -> Answers:
    """Per (kind, level) of ``kinds``: each cell's value from the levels taken (``scales``: the
    discrete Laplace scale of each (kind, level) taken), by least squares, and the noise of
    its cells as a combination of the released noises."""
    answers: Answers = {}
    for kind in kinds:
        taken = [(i, lv) for i, lv in enumerate(kind.levels) if (kind.spec, lv) in scales]
        if not taken or taken[0][0] != 0:
            raise InternalError("a family kind's base level is not measured")
        offsets: dict[int, int] = {}
        y: list[int] = []
        variances: list[Fraction] = []
        cell_scales: list[Fraction] = []
        for i, lv in taken:
            noisy = noised[(kind.spec, lv)]
            if len(noisy) != math.prod(sizes[p] for p in lv):
                raise InternalError("a released measurement does not match its family")
            offsets[i] = len(y)
            y.extend(noisy)
            scale = scales[(kind.spec, lv)]
            # Weights 1/(2t²), the Laplace variance of scale t: public, so the combination is
            # post-processing (Hay et al. 2010); any positive weights keep it unbiased.
            variances.extend([2 * scale**2] * len(noisy))
            cell_scales.extend([scale] * len(noisy))
        constraints = []
        for i, _lv in taken[1:]:
            for c in range(int(kind.maps[i].max()) + 1):
                row = {offsets[i] + c: Fraction(1)}
                for f in np.nonzero(kind.maps[i] == c)[0]:
                    row[offsets[0] + int(f)] = Fraction(-1)
                constraints.append(row)
        adjustment = adjust(variances, constraints)
        adjusted = adjustment.apply(y)
        for i, level in enumerate(kind.levels):
            n_cells = int(kind.maps[i].max()) + 1
            vals = []
            for c in range(n_cells):
                if i in offsets:
                    vals.append(adjusted[offsets[i] + c])
                else:
                    base = np.nonzero(kind.maps[i] == c)[0]
                    vals.append(sum((adjusted[offsets[0] + int(f)] for f in base), Fraction(0)))
            # The noise of cell 0 as a combination of the released noises. Every cell of a level
            # has the same combination up to a permutation of the noises: permuting the values
            # of a key's domain maps the cells, the constraints and the weights onto themselves,
            # so the least squares commutes with it, and it moves any cell of a level to cell 0.
            if i in offsets:
                combo = adjustment.row(offsets[i])
            else:
                base = np.nonzero(kind.maps[i] == 0)[0]
                combo = adjustment.combination({offsets[0] + int(f): Fraction(1) for f in base})
            signature = sorted((a, cell_scales[k]) for k, a in combo.items() if a != 0)
            answers[(kind.spec, level)] = (vals, [signature])
    return answers


def member_answer(  # noqa: PLR0917
    plan: Plan,
    positions: Sequence[int],
    specs: Sequence[int],
    answers: Answers,
    values: Sequence[Sequence[Any]],
    sizes: Sequence[int],
) -> tuple[Plan, Noisy]:
    level = tuple(sorted(positions))
    n_cells = math.prod(sizes[p] for p in level)
    # The member's keys of each cell of its level, in the member's key order.
    keys: list[list[Any]] = [[] for _ in positions]
    for c in range(n_cells):
        digits, rest = {}, c
        for p in reversed(level):
            digits[p] = rest % sizes[p]
            rest //= sizes[p]
        for k, p in enumerate(positions):
            keys[k].append(values[p][digits[p]])
    totals, measurements = [], []
    for j, m in enumerate(plan.measurements):
        vals, terms = answers[(specs[j], level)]
        totals.append(tuple(float(v) for v in vals))
        signatures = tuple(sorted({tuple(t) for t in terms}))
        measurements.append(replace(m, combined=signatures))
    answered = replace(plan, measurements=tuple(measurements))
    return answered, Noisy(tuple(tuple(k) for k in keys), tuple(totals))  # type: ignore[arg-type]
