"""A workload's joint plan: which statements share measurements, and the split of its epsilon.

``plan_joint`` looks, greedily and from public quantities only, for families among the
statements to be charged (``dpsql.plan.workload.family`` says who may share and why): each
grouping's first statement as the family's, with the members that keep their own bounded rows
there, the family of the largest predicted gain first. ``plan_family`` chooses which
measurements to take at which level and splits the family's epsilon over them by the variance
model (``dpsql.plan.workload.model``), in exact rationals summing to the members' own epsilons.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from fractions import Fraction
from typing import cast

from sqlglot import exp

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
    keeps_own_rows,
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
    names = _key_names(fine, members)
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
        # accountants that read a one-coordinate mechanism never see one here.
        dimensions = fine.measurements[kind.spec].groups
        if level != fine_level:
            # A coarser cell may hold all of a unit's L0 fine cells: L1 = L2 = L0·C·(row bound),
            # or R·(row bound) when R binds (Hay et al. 2010, bounded at the leaves).
            m = replace(m, groups=1, per_group=m.sensitivity, row_bound=None)
        scale = Fraction(m.sensitivity) / e
        label = m.label + _level_label(names, level)
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
    return Family(fine, fine_index, tuple(members), tuple(chosen), tuple(sizes), tuple(ratios))


def _level_label(names: Sequence[str], level: Sequence[int]) -> str:
    return f" by ({', '.join(names[p] for p in level)})" if level else " in total"


def _key_names(fine: Plan, members: Sequence[Member]) -> list[str]:
    """The family's keys, each by the name a member's output gives it (an expression's alias,
    where the bounded query's own name is internal)."""
    names = [k.name for k in fine.analysis.keys]
    for member in reversed(members):
        a = member.plan.analysis
        for key, p in zip(a.keys, member.positions, strict=True):
            shown = [o.name for o in a.outputs
                     if isinstance(o.expr, exp.Column) and o.expr.name == key.name]  # fmt: skip
            names[p] = shown[0] if shown else key.name
    return names


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
            # Each key set is tried as the fine grouping once (its first statement): a member
            # keeps its own bounded rows only at its own grouping (``keeps_own_rows``).
            keysets = {i: frozenset(key_text(k) for k in _plan(plans, i).analysis.keys)
                       for i in pool}  # fmt: skip
            firsts = [f for n, f in enumerate(pool)
                      if keysets[f] not in {keysets[g] for g in pool[:n]}]  # fmt: skip
            for f in firsts:
                family = _try(plans, f, pool, plan_select)
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


def _try(
    plans: Sequence[Plan | None], f: int, pool: Sequence[int], plan_select: PlanSelect
) -> Family | None:
    """The family bounded at statement f's grouping, of the statements that keep their own
    bounded rows there (``keeps_own_rows``), pruned while a member loses."""
    own = _plan(plans, f)
    candidates = []
    for i in pool:
        p = _plan(plans, i)
        pos = member_positions(own, p)
        if pos is not None and keeps_own_rows(own, p, pos):
            candidates.append((i, p, pos))
    if len(candidates) < 2:
        return None
    try:
        fine = plan_select(synthetic(own, [p for _, p, _ in candidates]), f)
    except DpsqlError:
        return None
    if not eligible(fine) or len(fine.analysis.keys) != len(own.analysis.keys):
        return None
    index = {spec_key(fine, m): j for j, m in enumerate(fine.measurements)}
    members = []
    for i, p, pos in candidates:
        specs = [index.get(spec_key(p, m)) for m in p.measurements]
        # Checked again on the bounding that measures them all, which reads every member's
        # values: a member whose rows it would not keep as its own query does is left out.
        if any(s is None for s in specs) or not keeps_own_rows(fine, p, pos):
            continue
        members.append(Member(i, p, pos, tuple(s for s in specs if s is not None)))
    sizes = tuple(len(k.domain or ()) + int(k.other) for k in fine.analysis.keys)
    best: Family | None = None
    current = members
    fine_level = tuple(range(len(fine.analysis.keys)))
    while len(current) >= 2:
        family = plan_family(fine, f, current, sizes)
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
