"""The contribution bounds a query runs with: the effective L0 and C, and which bounding steps
the bounded query runs (``dpsql.bound.rewrite``). A step is left out only when the plan proves from
public information that it cannot bind, or that no total depends on it.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpsql.analyze.analysis import Analysis
from dpsql.bound.shape import public_size
from dpsql.bound.specs import MeasurementSpec
from dpsql.errors import BoundsError
from dpsql.plan.plans import QueryOptions

# More public keys than this would be released as one huge table of noise: refuse instead.
MAX_PUBLIC_GROUPS = 1_000_000


def _group_bounds(analysis: Analysis, options: QueryOptions) -> tuple[int, int]:
    """Effective (L0, C). L0 is 1 without GROUP BY, and at most the number of public keys."""
    max_rows = options.max_rows_per_unit_per_group
    if max_rows is None:
        # With R alone (BigQuery's max_rows_contributed), a unit has at most R rows in a group.
        max_rows = options.max_rows_per_unit
    if max_rows is None:
        raise BoundsError(
            f"table {analysis.table} has no max_rows_per_unit_per_group; declare it in the "
            "policy or SET dpsql.max_rows_per_unit_per_group"
        )
    if analysis.unit_rows is not None:
        # The relation holds at most this many rows per unit by construction (a per-unit
        # subquery grouped by the unit alone: one), a structural row cap.
        max_rows = min(max_rows, analysis.unit_rows)
    if not analysis.keys:
        return 1, min(max_rows, options.max_rows_per_unit or max_rows)
    max_groups = options.max_groups_per_unit
    if max_groups is None:
        # With R alone, a unit's R rows touch at most R groups.
        max_groups = options.max_rows_per_unit
    if max_groups is None:
        raise BoundsError(
            f"GROUP BY on table {analysis.table} needs max_groups_per_unit; declare it in the "
            "policy or SET dpsql.max_groups_per_unit"
        )
    size = public_size(analysis.keys)
    if size is not None:
        if size > MAX_PUBLIC_GROUPS:
            raise BoundsError(f"the public keys have {size} combinations; at most "
                              f"{MAX_PUBLIC_GROUPS} are released")  # fmt: skip
        max_groups = min(max_groups, size)
    if analysis.unit_rows is not None:
        max_groups = min(max_groups, analysis.unit_rows)
    if options.max_rows_per_unit is not None:
        # With R rows in total, a unit touches at most R groups with at most R rows each.
        return min(max_groups, options.max_rows_per_unit), min(max_rows, options.max_rows_per_unit)
    return max_groups, max_rows


@dataclass(frozen=True)
class Steps:
    """Which bounding steps the bounded query runs; a step is skipped only when the plan proves
    from public information that it cannot bind, or that no total depends on it."""

    ranking: int | None  # L0 for the keyed-hash ranking of a unit's groups
    window: int | None  # R for the keyed-hash window over a unit's rows
    direct: bool  # no per-(unit, group) step: every unit has <= C rows per group, <= L0 groups
    skipped: tuple[str, ...]  # why, for EXPLAIN


def _steps(
    analysis: Analysis, l0: int, c: int, r: int | None, specs: list[MeasurementSpec]
) -> Steps:
    skipped: list[str] = []
    window = r
    if r is not None and not analysis.keys and all(s.kind in ("rows", "units") for s in specs):
        # One group: a unit adds min(n, C) rows (C <= R) or 1 unit whichever R rows are kept,
        # so the totals and the sensitivity (C, or 1) are those of the window; it is not run.
        window = None
        skipped.append(f"R = {r}: no total depends on which of a unit's rows are kept")
    ranking: int | None = l0 if analysis.keys else None
    size = public_size(analysis.keys)
    if ranking is not None:
        # Rows outside a public domain are dropped before bounding, so a unit touches at most
        # `size` groups; after R's window, or with the relation's own row cap, at most that many.
        limits = [(size, "public key combinations"), (window, "rows kept per unit by R"),
                  (analysis.unit_rows, "rows per unit in the relation")]  # fmt: skip
        for limit, what in limits:
            if limit is not None and l0 >= limit:
                ranking = None
                skipped.append(f"L0 ranking: L0 = {l0} >= {limit} {what}")
                break
    rows = window if window is not None else analysis.unit_rows
    direct = ranking is None and rows is not None and rows <= c
    if direct:
        # Each unit then has at most `rows` <= C rows in any group: C cannot bind either.
        skipped.append(f"per-unit pre-aggregation: at most {rows} row(s) per unit <= C = {c}")
    return Steps(ranking, window, direct, tuple(skipped))
