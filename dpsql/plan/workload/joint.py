"""A workload's joint plan: which statements share measurements, and the split of its epsilon.

``plan_joint`` looks, greedily and from public quantities only, for families among the
statements to be charged (``dpsql.plan.workload.family`` says who may share and why):
the fine grouping and the members with the largest predicted gain first, then the union of
the groupings' keys when no member's grouping holds the others'. ``plan_family`` bounds the
members once at the fine grouping (``_selected``: the units' groups chosen at a member's
coarser grouping), chooses which measurements to take at which level and splits the family's
epsilon over them by the variance model (``dpsql.plan.workload.model``), in exact rationals
summing to the members' own epsilons.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from fractions import Fraction
from typing import cast

from sqlglot import exp

from dpsql.bound.rewrite import bounded_query
from dpsql.errors import DpsqlError, InternalError
from dpsql.mechanisms.laplace import MAX_SCALE
from dpsql.plan.plans import Plan
from dpsql.plan.workload.family import (
    MAX_CANDIDATES,
    MAX_FAMILY_CELLS,
    MAX_LOSS,
    MIN_GAIN,
    MIN_SHARE,
    Family,
    Joint,
    Member,
    Taken,
    eligible,
    key_text,
    member_positions,
    rows_and_settings,
    spec_key,
)
from dpsql.plan.workload.least_squares import MAX_CONSTRAINTS
from dpsql.plan.workload.model import (
    FamilyModel,
    independent_variance,
    member_kinds,
    optimise,
)
from dpsql.sql.parse import DIALECT, parse_select


def synthetic(fine: Plan, members: Sequence[Plan]) -> exp.Select:
    """The fine grouping's query with every member's aggregates: one bounded query measures
    all of them on the same bounded rows."""
    aggregates: list[exp.Expression] = []
    seen: set[str] = set()
    for plan in members:
        for node in parse_select(plan.query).find_all(exp.AggFunc):
            text = node.sql(dialect=DIALECT)
            if text not in seen and not node.find_ancestor(exp.AggFunc):
                seen.add(text)
                aggregates.append(cast(exp.Expression, node.copy()))
    # The keys as the analysis resolved them (an alias in GROUP BY names a SELECT expression).
    return _grouped(fine, [k.expr.copy() for k in fine.analysis.keys], aggregates)


def union_select(plans: Sequence[Plan]) -> exp.Select:
    """A count over the rows of ``plans[0]`` grouped by the union of the plans' keys (in
    order of first appearance): the grouping of a family that no statement asks for."""
    keys: list[exp.Expression] = []
    seen: set[str] = set()
    for plan in plans:
        for k in plan.analysis.keys:
            if key_text(k) not in seen:
                seen.add(key_text(k))
                keys.append(k.expr.copy())
    return _grouped(plans[0], keys, [exp.Count(this=exp.Star())])


def _grouped(
    source: Plan, keys: Sequence[exp.Expression], aggregates: Sequence[exp.Expression]
) -> exp.Select:
    """``aggregates`` over the rows of ``source`` (its FROM and WHERE), grouped by ``keys``."""
    select = parse_select(source.query)
    outputs = [exp.alias_(k, f"_wk{i}") for i, k in enumerate(keys)]
    outputs += [exp.alias_(a, f"_wa{i}") for i, a in enumerate(aggregates)]
    parts = {
        k: v.copy() for k, v in select.args.items() if k in ("from", "from_", "joins", "where")
    }
    out = exp.Select(expressions=outputs, **parts)
    if keys:
        out.set("group", exp.Group(expressions=[k.copy() for k in keys]))
    return out


def plan_family(  # noqa: PLR0915
    fine: Plan,
    fine_index: int,
    members: Sequence[Member],
    sizes: Sequence[int],
    union: bool = False,
) -> Family | None:
    """The best split for these members bounded at ``fine``, or None if it gains nothing."""
    fine_level = tuple(range(len(fine.analysis.keys)))
    kinds = member_kinds(sizes, members)
    n_fine = math.prod(sizes)
    if any(sum(int(mp.max()) + 1 for mp in kind.maps) > MAX_FAMILY_CELLS for kind in kinds):
        return None
    # One constraint per cell of each coarser level: refused here, on the plan, rather than
    # by the least squares after the charge.
    if any(sum(int(mp.max()) + 1 for mp in kind.maps[1:]) > MAX_CONSTRAINTS for kind in kinds):
        return None
    if n_fine == 0:
        return None
    sens = []
    for kind in kinds:
        m = fine.measurements[kind.spec]
        unit = float(m.unit)
        sens.append(tuple(float(m.sensitivity) * unit for _ in kind.levels))
    base = tuple(independent_variance(m.plan) for m in members)
    if any(b <= 0 or not math.isfinite(b) for b in base):
        return None
    epsilon = sum((m.plan.epsilon for m in members), Fraction(0))
    model = FamilyModel(fine, tuple(members), tuple(kinds), tuple(sens), base, float(epsilon))
    slots = model.slots()
    # Start from the members' own budgets, pooled per kind and level.
    start = [0.0] * len(slots)
    for member in members:
        for j, m in enumerate(member.plan.measurements):
            k = next(i for i, kind in enumerate(kinds) if kind.spec == member.specs[j])
            s = slots.index((k, kinds[k].levels.index(member.level)))
            start[s] += float(m.epsilon)
    total = sum(start)
    start = [max(x, 0.01 * total) for x in start]
    taken = [True] * len(slots)
    eps = optimise(model, taken, start)
    # Coarser levels the optimum starves are not taken; their cells come from finer ones.
    for s, (_, i) in enumerate(slots):
        if i != 0 and eps[s] < MIN_SHARE * model.epsilon:
            taken[s] = False
    if not all(taken):
        eps = optimise(model, taken, eps)
    value, ratios = model.objective(eps, taken)
    if not value <= (1 - MIN_GAIN) * len(members) or max(ratios) > float(MAX_LOSS):
        return None
    shares = _exact_shares([eps[s] for s in range(len(slots)) if taken[s]], epsilon)
    chosen = []
    it = iter(shares)
    for s, (k, i) in enumerate(slots):
        if not taken[s]:
            continue
        kind = kinds[k]
        m = fine.measurements[kind.spec]
        level = kind.levels[i]
        e = next(it)
        # One unit moves at most L0 cells of any level (its L0 fine cells, summed up): the
        # accountants that read a one-coordinate mechanism never see one here. With its groups
        # chosen at a coarser grouping, L0 of those, but any of its rows (at most L0·C, and R)
        # may fall in a cell of its own at another level.
        dimensions = fine.measurements[kind.spec].groups
        picked_at = fine.bounding.select_at if fine.bounding is not None else None
        if picked_at is not None and level != tuple(sorted(picked_at)):
            rows = fine.max_groups * fine.max_rows
            if fine.options.max_rows_per_unit is not None:
                rows = min(rows, fine.options.max_rows_per_unit)
            dimensions = min(rows, math.prod(sizes[p] for p in level))
        if level != fine_level:
            # A coarser cell may hold all of a unit's L0 fine cells: L1 = L2 = L0·C·(row bound),
            # or R·(row bound) when R binds (Hay et al. 2010, bounded at the leaves).
            m = replace(m, groups=1, per_group=m.sensitivity, row_bound=None)
        scale = Fraction(m.sensitivity) / e
        label = m.label + _level_label(fine, level)
        measured = replace(m, scale=scale, share=e / epsilon, label=label)
        chosen.append(Taken(kind.spec, level, measured, dimensions))
    # A coarser level's share of the family's epsilon with its L0·C sensitivity can ask for
    # noise no member's own plan does: past what the sampler draws, no family (the members'
    # own plans were checked), rather than a failure after the charge.
    if any(t.measurement.scale is not None and t.measurement.scale > MAX_SCALE for t in chosen):
        return None
    eps_taken = [float(t.epsilon) for t in chosen]
    full = [0.0] * len(slots)
    it2 = iter(eps_taken)
    for s in range(len(slots)):
        if taken[s]:
            full[s] = next(it2)
    _, ratios = model.objective(full, taken)
    if sum(t.epsilon for t in chosen) != epsilon:
        raise InternalError("the family's epsilon is not its members' sum")
    # A union's grouping is no member's: the family goes by its first member (members of two
    # families are disjoint, so the index names one family).
    index = members[0].index if union else fine_index
    return Family(fine, index, tuple(members), tuple(chosen), tuple(sizes), tuple(ratios), union)


def _selected(fine: Plan, members: Sequence[Member], sizes: Sequence[int]) -> Plan:
    """``fine`` with its units' groups chosen at a member's coarser grouping (``Bounding.
    select_at``), when its L0 ranking would run: each unit keeps the L0 groups of that grouping
    its member's own query keeps (the same keyed hash), and C rows in each, so that member's
    counts are its own bounded counts, and the finer levels keep those rows too, where L0
    counted the fine cells before (a unit touching 3 region-months of 2 regions lost a third
    of its rows under L0 = 2). The sensitivities stay: a unit still adds at most L0·C rows (and
    R), at most C to any cell of a level that refines the chosen grouping. The grouping is the
    one the most members refine, then the one of fewest cells (public quantities only)."""
    b = fine.bounding
    if b is None or b.direct or b.max_groups is None:
        return fine
    fine_level = tuple(range(len(sizes)))
    best: tuple[tuple[int, int], tuple[int, ...]] | None = None
    for member in members:
        level = member.level
        if not level or level == fine_level:
            continue
        refining = sum(1 for other in members if set(level) <= set(other.level))
        rank = (-refining, math.prod(sizes[p] for p in level))
        if best is None or rank < best[0]:
            best = (rank, member.positions)
    if best is None:
        return fine
    bounding = replace(b, select_at=best[1], direct=True)
    names = ", ".join(fine.analysis.keys[p].name for p in best[1])
    why = (f"groups chosen at ({names}): a unit keeps L0 = {b.max_groups} of them and C = "
           f"{b.max_rows} rows in each, then the finer cells sum those rows")  # fmt: skip
    return replace(fine, bounding=bounding, engine_sql=bounded_query(fine.analysis, bounding),
                   skipped=(*fine.skipped, why))  # fmt: skip


def _level_label(fine: Plan, level: Sequence[int]) -> str:
    names = [fine.analysis.keys[p].name for p in level]
    return f" by ({', '.join(names)})" if names else " in total"


def _exact_shares(eps: Sequence[float], total: Fraction) -> list[Fraction]:
    """Epsilons as exact rationals (four significant digits of their share) summing to
    ``total`` exactly."""
    raw = [max(e, 1e-9) / sum(eps) for e in eps]
    shares = [Fraction(round(r * 10**4), 10**4) or Fraction(1, 10**4) for r in raw]
    shares[-1] = 1 - sum(shares[:-1], Fraction(0))
    if shares[-1] <= 0:
        shares = [Fraction(1, len(eps))] * len(eps)
    return [s * total for s in shares]


def plan_joint(plans: Sequence[Plan | None], plan_select: PlanSelect) -> Joint:
    """Families among the statements to be charged (``plans[i]`` None for the others), chosen
    greedily: the fine grouping and members with the largest predicted gain first.
    ``plan_select(select, i)`` plans a query with the settings in force at statement i."""
    free = {i for i, p in enumerate(plans) if p is not None and eligible(p)}
    groups: dict[tuple[object, ...], list[int]] = {}
    for i in sorted(free):
        p = plans[i]
        assert p is not None
        groups.setdefault(rows_and_settings(p), []).append(i)
    families: list[Family] = []
    for indices in groups.values():
        # The first statements of a group only: the search plans a family per candidate fine
        # grouping, and a long file of similar statements must not make planning quadratic.
        pool = list(indices)[:MAX_CANDIDATES]
        while len(pool) >= 2:
            best: Family | None = None
            # The fine grouping is a maximal one: a statement whose keys another's include
            # bounds a family that the other's could hold too (with it as a member). Two
            # statements of one key set bound the same family: the first is tried.
            keysets = {i: frozenset(key_text(k) for k in _plan(plans, i).analysis.keys)
                       for i in pool}  # fmt: skip
            maximal = [f for f in pool if not any(keysets[f] < keysets[g] for g in pool)]
            maximal = [f for n, f in enumerate(maximal)
                       if keysets[f] not in {keysets[g] for g in maximal[:n]}]  # fmt: skip
            for f in maximal:
                family = _try(plans, f, pool, plan_select)
                if family is not None and (best is None or _gain(family) > _gain(best)):
                    best = family
            if len(maximal) >= 2:
                family = _try_union(plans, maximal, pool, plan_select)
                if family is not None and (best is None or _gain(family) > _gain(best)):
                    best = family
            if best is None:
                break
            families.append(best)
            used = {m.index for m in best.members}
            pool = [i for i in pool if i not in used]
    ratios: list[float | None] = [None] * len(plans)
    for family in families:
        for member, r in zip(family.members, family.ratios, strict=True):
            ratios[member.index] = r
    return Joint(tuple(families), tuple(ratios))


def _plan(plans: Sequence[Plan | None], i: int) -> Plan:
    plan = plans[i]
    assert plan is not None
    return plan


def _gain(family: Family) -> float:
    return len(family.members) - sum(family.ratios)


def _try_union(
    plans: Sequence[Plan | None],
    maximal: Sequence[int],
    pool: Sequence[int],
    plan_select: PlanSelect,
) -> Family | None:
    """The family bounded at the union of the maximal groupings' keys, with the settings of
    the first statement of most keys."""
    ordered = sorted(maximal, key=lambda i: -len(_plan(plans, i).analysis.keys))
    # The union's cells are the base of every kind that spans two of the groupings: refused
    # before planning it when there are more than the exact least squares takes.
    sizes: dict[str, int] = {}
    for i in ordered:
        for k in _plan(plans, i).analysis.keys:
            sizes[key_text(k)] = len(k.domain or ()) + int(k.other)
    if math.prod(sizes.values()) > MAX_FAMILY_CELLS:
        return None
    try:
        grouping = plan_select(union_select([_plan(plans, i) for i in ordered]), ordered[0])
    except DpsqlError:
        return None
    return _try(plans, ordered[0], pool, plan_select, grouping)


def _try(
    plans: Sequence[Plan | None],
    f: int,
    pool: Sequence[int],
    plan_select: PlanSelect,
    grouping: Plan | None = None,
) -> Family | None:
    """The family bounded at statement f's grouping (or at ``grouping``), pruned while a
    member loses."""
    fine_plan = plans[f] if grouping is None else grouping
    assert fine_plan is not None
    candidates = []
    for i in pool:
        p = plans[i]
        assert p is not None
        pos = member_positions(fine_plan, p)
        if pos is not None:
            candidates.append((i, p, pos))
    if len(candidates) < 2:
        return None
    try:
        fine = plan_select(synthetic(fine_plan, [p for _, p, _ in candidates]), f)
    except DpsqlError:
        return None
    if not eligible(fine) or len(fine.analysis.keys) != len(fine_plan.analysis.keys):
        return None
    index = {spec_key(fine, m): j for j, m in enumerate(fine.measurements)}
    members = []
    for i, p, pos in candidates:
        specs = [index.get(spec_key(p, m)) for m in p.measurements]
        if any(s is None for s in specs):
            continue
        members.append(Member(i, p, pos, tuple(s for s in specs if s is not None)))
    sizes = tuple(len(k.domain or ()) + int(k.other) for k in fine.analysis.keys)
    fine = _selected(fine, members, sizes)
    best: Family | None = None
    current = members
    fine_level = tuple(range(len(fine.analysis.keys)))
    while len(current) >= 2:
        family = plan_family(fine, f, current, sizes, grouping is not None)
        if family is not None and (best is None or _gain(family) > _gain(best)):
            best = family
        if family is not None and max(family.ratios) < 1 - MIN_GAIN:
            break  # every member gains: leaving one out would only lose its gain
        # Leave out the member that gains least (a member at the fine level never first; with
        # no split that gains, the coarsest), and try again.
        if family is None:
            scores = [float(len(fine_level) - len(m.level)) for m in current]
        else:
            scores = [r if m.level != fine_level else -1.0
                      for m, r in zip(current, family.ratios, strict=True)]  # fmt: skip
        worst = max(range(len(current)), key=lambda k: scores[k])
        current = [m for k, m in enumerate(current) if k != worst]
    return best


# -- the workload --------------------------------------------------------------------------------
PlanSelect = Callable[[exp.Select, int], Plan]
