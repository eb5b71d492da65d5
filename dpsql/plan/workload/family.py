"""A batch file planned as one workload: shared measurements, hierarchies and one budget.

Independent planning measures each statement on its own rows at its own epsilon. A workload
plan looks for statements that could share what they measure, all decided from public
quantities only (the statements, the policy, the key domains' sizes), never from the data:

* A **family** is a set of statements over the same rows before bounding (one table, the same
  WHERE, the same settings apart from epsilon), with public key domains only, whose GROUP BY
  keys are each a subset of one member's keys (the finest grouping, "fine" below). A key the
  fine grouping has and a coarser member lacks needs an other group (``SET dpsql.other_group =
  on``), so that no row outside its domain is dropped at the fine grouping that the coarser
  statement would have counted. When the statements' groupings do not nest, the fine grouping
  may be the union of their keys, which no statement asks for (``Family.union``); every
  statement is then a coarser level of it.
* The family's rows are **bounded once** (its L0, C and R; one bounded query at the fine
  grouping for the union of the members' measurements), with the units' groups chosen at a
  member's coarser grouping where L0 would rank fine cells (``_selected``): that member keeps
  its own bounded counts, and the finer levels the same rows. A coarser cell is the sum of
  fine cells, and a unit's kept rows (at most L0·C) may all fall in one coarser cell, so a
  measurement of a coarser level has L1 = L2 = L0·C times the per-row bound (or R times it when
  R binds): Hay, Rastogi, Miklau, Suciu, "Boosting the accuracy of differentially private
  histograms through consistency" (VLDB 2010), bounded at the leaves.
* Each measurement kind (a count, a sum on its grid, ...) is taken at the fine level and at any
  member's level the plan chooses; the family's epsilon (the sum of its members' independent
  epsilons) is split across the measurements taken to minimise the sum over members of
  (weighted variance under the joint plan) / (under the member's independent plan), with no
  member's variance above 1.21 times its independent one (a half-width at most 10% wider).
  The weighted variance is ``dpsql.plan.split``'s objective (public weights).
* Answers combine every level taken by weighted least squares
(``dpsql.plan.workload.least_squares``),
  in exact rationals: children sum to their parents exactly. The released values are not
  rounded nor clamped at 0 (either would break the sums), and the output says so.

A family is taken only when it predicts a lower objective than independent planning; members
whose share would not gain are planned on their own. Everything else (quantiles, private keys,
samples, diagnoses, accuracy targets, the Gaussian mechanism, a declared PLD mechanism, joins,
partition cells) is planned independently, and still charged with the workload, before any
engine work.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import cast

import numpy as np
from scipy.optimize import minimize
from sqlglot import exp

from dpsql.bound.rewrite import bounded_query
from dpsql.errors import DpsqlError, InternalError
from dpsql.mechanisms.events import Event
from dpsql.mechanisms.laplace_events import DiscreteLaplace
from dpsql.plan.plans import Measurement, Plan
from dpsql.plan.split import estimate_weights, planned_variance
from dpsql.plan.workload.least_squares import MAX_CONSTRAINTS
from dpsql.sql.parse import DIALECT, parse_select

# The measurement kinds whose coarser cell is the sum of its fine cells: a count of distinct
# units (or values) is not (a unit in two fine cells of one coarser cell counts once there),
# nor is a quantile.
ADDITIVE = ("rows", "count", "sum", "centred", "centred_squares")
# The statements of one group of shared rows the search considers (in file order).
MAX_CANDIDATES = 16
# The largest number of measured cells of one kind in a family: the least squares runs in
# exact rationals, and its covariance is dense.
MAX_FAMILY_CELLS = 2000
# A member may lose at most this much in variance to the family: (1.1)², a half-width at most
# 10% wider than under its own plan.
MAX_LOSS = Fraction(121, 100)
# A family is taken only if it gains at least this share of its objective.
MIN_GAIN = 0.01
# A measurement at a coarser level with less than this share of the family's epsilon is not
# taken (its level is answered from the finer levels).
MIN_SHARE = 0.02


@dataclass(frozen=True)
class Taken:
    """One measurement a family takes: kind ``spec`` (an index of the fine plan's
    measurements) at the level keeping the fine keys ``level`` (sorted positions)."""

    spec: int
    level: tuple[int, ...]
    measurement: Measurement  # its sensitivity and, once planned, its scale
    dimensions: int = 1  # the cells of its level one unit may move: L0 (at most its cells)

    @property
    def epsilon(self) -> Fraction:
        return self.measurement.epsilon


@dataclass(frozen=True)
class Member:
    """A statement answered from its family's measurements."""

    index: int  # its position among the workload's statements
    plan: Plan  # its independent plan (its estimates, outputs and post-processing)
    positions: tuple[int, ...]  # each of its keys, as a position among the fine keys
    specs: tuple[int, ...]  # each of its measurements, as an index of the fine plan's

    @property
    def level(self) -> tuple[int, ...]:
        return tuple(sorted(self.positions))


@dataclass(frozen=True)
class Family:
    """Statements answered from measurements on rows bounded once at the fine grouping."""

    fine: Plan  # the bounded query at the fine grouping, with every member's measurements
    fine_index: int  # the member whose grouping is the fine one (see ``union``)
    members: tuple[Member, ...]
    taken: tuple[Taken, ...]
    sizes: tuple[int, ...]  # the number of values of each fine key (its domain, other group)
    ratios: tuple[float, ...]  # per member: joint / independent weighted variance
    # The fine grouping is no member's but the union of the members' keys (planned with the
    # settings of a member of the most keys); ``fine_index`` is then the first member's.
    union: bool = False

    @property
    def grouping(self) -> str:
        """The fine grouping's keys, each by the name a member gives it."""
        names = [k.name for k in self.fine.analysis.keys]
        for member in reversed(self.members):
            a = member.plan.analysis
            for key, p in zip(a.keys, member.positions, strict=True):
                shown = [o.name for o in a.outputs
                         if isinstance(o.expr, exp.Column) and o.expr.name == key.name]  # fmt: skip
                names[p] = shown[0] if shown else key.name
        return ", ".join(names)

    def cells(self, level: Sequence[int]) -> int:
        return math.prod(self.sizes[p] for p in level)

    @property
    def event(self) -> list[Event]:
        return [_event(t) for t in self.taken]


@dataclass(frozen=True)
class Joint:
    """A workload's plan: its families and, per statement, the predicted variance ratio."""

    families: tuple[Family, ...]
    ratios: tuple[float | None, ...]  # per statement: joint / independent (None: on its own)

    def family_of(self, index: int) -> tuple[Family, Member] | None:
        for family in self.families:
            for member in family.members:
                if member.index == index:
                    return family, member
        return None


def _event(t: Taken) -> Event:
    m = t.measurement
    assert m.scale is not None
    # Discrete Laplace on a vector of L1 sensitivity m.sensitivity (Ghosh, Roughgarden,
    # Sundararajan 2009); one unit moves at most L0 cells of any level.
    return DiscreteLaplace(m.scale, Fraction(m.sensitivity), m.label, dimensions=t.dimensions)


# -- who may share ------------------------------------------------------------------------------
def eligible(plan: Plan) -> bool:
    """Whether a statement may join a family (module docstring), from its plan alone."""
    a, o = plan.analysis, plan.options
    return (
        a.base
        and a.cell is None
        and a.cell_predicate is None
        and plan.sample is None
        and plan.diagnosis is None
        and plan.selection is None
        and o.mechanism == "laplace"
        and o.declared is None
        and o.budgets is None
        and o.sample is None
        and all(k.domain is not None for k in a.keys)
        and bool(plan.measurements)
        and all(m.spec.kind in ADDITIVE for m in plan.measurements)
    )


def _base(plan: Plan) -> tuple[object, ...]:
    """What two statements must share to be bounded together: the rows before bounding and
    every setting but epsilon and the contribution bounds (fixed by the fine grouping)."""
    a, o = plan.analysis, plan.options
    where = a.where.sql(dialect=DIALECT) if a.where is not None else None
    options = replace(
        o, epsilon=Fraction(1), max_groups_per_unit=None, max_rows_per_unit_per_group=None,
        asked=frozenset(), confidence=0.5,
    )  # fmt: skip
    return (a.table, a.source, a.unit, where, options)


def _key_text(key: object) -> str:
    expr = getattr(key, "expr", None)
    assert isinstance(expr, exp.Expression)
    return str(expr.sql(dialect=DIALECT))


def key_descriptor(key: object) -> list[object]:
    """A group key as a family compares it, in JSON: its expression, its public domain (each
    value's repr: 1 and '1' differ), whether it has an other group, and that group's text."""
    domain = getattr(key, "domain", None)
    return [_key_text(key), [repr(v) for v in domain or ()], bool(getattr(key, "other", False)),
            getattr(key, "other_text", None)]  # fmt: skip


def _positions(fine: Plan, member: Plan) -> tuple[int, ...] | None:
    return positions_among(
        [key_descriptor(k) for k in fine.analysis.keys],
        [key_descriptor(k) for k in member.analysis.keys],
    )


def positions_among(
    fine: Sequence[Sequence[object]], member: Sequence[Sequence[object]]
) -> tuple[int, ...] | None:
    """The member's keys (``key_descriptor``) as positions among the fine keys; None when a key
    is not there (or differs in domain or other group), or when a fine key the member lacks has
    no other group: its rows outside the domain would be dropped at the fine grouping."""
    fine_keys = {str(k[0]): i for i, k in enumerate(fine)}
    out = []
    for key in member:
        i = fine_keys.get(str(key[0]))
        if i is None or list(fine[i]) != list(key):
            return None
        out.append(i)
    if len(set(out)) != len(out):
        return None
    for i, f in enumerate(fine):
        if i not in out and not f[2]:
            return None
    return tuple(out)


def _spec_key(plan: Plan, m: Measurement) -> tuple[object, ...]:
    """What one measurement measures, comparable across plans over the same rows."""
    assert plan.bounding is not None
    value = None
    if m.spec.value is not None:
        v = plan.bounding.values[m.spec.value]
        value = (v.expr.sql(dialect=DIALECT), repr(v.grid), v.role)
    return (m.spec.kind, value, m.spec.p, m.unit)


def spec_text(plan: Plan, m: Measurement) -> str:
    """``_spec_key`` as a text a ledger record keeps."""
    kind, value, p, unit = _spec_key(plan, m)
    return json.dumps([kind, value, None if p is None else str(p), str(unit)])


def base_digest(plan: Plan) -> str:
    """What a statement must share with a family's fine plan to be answered from its release:
    the rows before bounding and every setting but epsilon (``_base``), and the contribution
    bounds the analyst asked for (L0, C, R: the fine plan's are the family's bounding)."""
    o = plan.options
    bounds = (o.max_groups_per_unit, o.max_rows_per_unit_per_group, o.max_rows_per_unit)
    return hashlib.sha256(repr((_base(plan), bounds)).encode()).hexdigest()


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
            if _key_text(k) not in seen:
                seen.add(_key_text(k))
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


# -- the variance model --------------------------------------------------------------------------
def _level_map(sizes: Sequence[int], fine: Sequence[int], level: Sequence[int]) -> np.ndarray:
    """For each cell of level ``fine`` (keys at those positions, mixed radix in that order),
    the index of its cell at ``level`` (a subset of ``fine``)."""
    shape = [sizes[p] for p in fine]
    grid = np.indices(shape).reshape(len(shape), -1) if shape else np.zeros((0, 1), dtype=int)
    out = np.zeros(grid.shape[1], dtype=np.int64)
    for p in level:
        out = out * sizes[p] + grid[list(fine).index(p)]
    return out


@dataclass(frozen=True)
class _Kind:
    """One measurement kind of a family: its levels (the fine one first) and their cells."""

    spec: int
    levels: tuple[tuple[int, ...], ...]
    maps: tuple[np.ndarray, ...]  # per level: base cell -> that level's cell
    sizes: tuple[int, ...]  # the fine keys' domain sizes


def member_kinds(sizes: Sequence[int], members: Sequence[Member]) -> list[_Kind]:
    """The measurement kinds of a family of ``members`` at the fine grouping of ``sizes``, each
    with the levels its members use (``_kinds``)."""
    uses: dict[int, set[tuple[int, ...]]] = {}
    for member in members:
        for spec in member.specs:
            uses.setdefault(spec, set()).add(member.level)
    return _kinds(sizes, tuple(range(len(sizes))), uses)


def _kinds(
    sizes: Sequence[int], fine_level: tuple[int, ...], uses: dict[int, set[tuple[int, ...]]]
) -> list[_Kind]:
    kinds = []
    for spec, levels in sorted(uses.items()):
        # The base: the finest level the kind is used at when it holds every other one (then
        # the fine level adds nothing), else the fine level.
        widest = max(levels, key=len)
        base = widest if all(set(lv) <= set(widest) for lv in levels) else fine_level
        ordered = (base, *sorted(lv for lv in levels if lv != base))
        maps = tuple(_level_map(sizes, base, lv) for lv in ordered)
        kinds.append(_Kind(spec, ordered, maps, tuple(sizes)))
    return kinds


@dataclass(frozen=True)
class _Structure:
    """The least squares of one kind's levels taken, split by level so that a change of the
    noise scales costs no product with the constraint matrix C ("a coarser cell is the sum of
    its base cells"): C V Cᵀ = Σ_i v_i G_i, C V a = Σ_i v_i h_i(a), aᵀ V a = Σ_i v_i |a_i|²,
    with G_i = C_i C_iᵀ and h_i(a) = C_i a_i over the columns C_i of level i."""

    levels: tuple[int, ...]  # the levels taken, in order
    grams: tuple[np.ndarray, ...]  # G_i per level taken
    pulls: tuple[np.ndarray, ...]  # per answer: the columns h_i(a), one per level taken
    norms: tuple[np.ndarray, ...]  # per answer: |a_i|² per level taken


_CONSTRAINTS: dict[tuple[object, ...], _Structure] = {}


def _structure(kind: _Kind, taken: Sequence[bool]) -> _Structure:
    key = (kind.levels, kind.sizes, tuple(taken))
    found = _CONSTRAINTS.get(key)
    if found is not None:
        return found
    sizes = [int(mp.max()) + 1 if len(mp) else 0 for mp in kind.maps]
    offsets, n = {}, 0
    for i, size in enumerate(sizes):
        if taken[i]:
            offsets[i] = n
            n += size
    rows = []
    for i, size in enumerate(sizes):
        if taken[i] and i != 0:
            for c in range(size):
                r = np.zeros(n)
                r[offsets[i] + c] = 1.0
                r[np.nonzero(kind.maps[i] == c)[0]] -= 1.0
                rows.append(r)
    matrix = np.array(rows) if rows else np.zeros((0, n))
    levels = tuple(i for i in range(len(sizes)) if taken[i])
    columns = [slice(offsets[i], offsets[i] + sizes[i]) for i in levels]
    grams = tuple(matrix[:, cols] @ matrix[:, cols].T for cols in columns)
    pulls, norms = [], []
    for i in range(len(sizes)):
        a = np.zeros(n)
        if taken[i]:
            a[offsets[i]] = 1.0
        else:
            a[np.nonzero(kind.maps[i] == 0)[0]] = 1.0  # the sum of its base cells
        pulls.append(np.stack([matrix[:, cols] @ a[cols] for cols in columns], axis=1))
        norms.append(np.array([float(a[cols] @ a[cols]) for cols in columns]))
    out = _Structure(levels, grams, tuple(pulls), tuple(norms))
    if len(_CONSTRAINTS) > 256:
        _CONSTRAINTS.clear()
    _CONSTRAINTS[key] = out
    return out


def _answer_variances(
    kind: _Kind, variances: Sequence[float], taken: Sequence[bool]
) -> list[float]:
    """Per level of ``kind``: the variance of one of its cells as answered from the levels
    taken (the base one always), combined by least squares: Cov = V - V Cᵀ (C V Cᵀ)⁻¹ C V with
    the constraints "a coarser cell is the sum of its base cells". Every cell of a level has
    the same variance: the cells are a product of key domains, each level one noise scale."""
    st = _structure(kind, taken)
    v = np.array([variances[i] for i in st.levels])
    m = sum((vi * g for vi, g in zip(v, st.grams, strict=True)), np.zeros_like(st.grams[0]))
    rhs = np.stack([p @ v for p in st.pulls], axis=1)  # C V a, one column per answer
    if len(m):
        try:
            solved = np.linalg.solve(m, rhs)
        except np.linalg.LinAlgError:
            solved = np.linalg.lstsq(m, rhs, rcond=None)[0]
    out = []
    for j, norms in enumerate(st.norms):
        var = float(norms @ v)
        if len(m):
            var -= float(rhs[:, j] @ solved[:, j])
        out.append(max(var, 0.0))
    return out


def independent_variance(plan: Plan) -> float:
    """A statement's weighted variance under its own plan (``dpsql.plan.split``)."""
    total = 0.0
    for est in plan.estimates:
        for j, w in zip(est.measurements, estimate_weights(est), strict=True):
            if w > 0:
                total += float(w) * planned_variance(plan.measurements[j])
    return total


@dataclass(frozen=True)
class _Model:
    """A candidate family's variance model: the objective of a split of its epsilon."""

    fine: Plan
    members: tuple[Member, ...]
    kinds: tuple[_Kind, ...]
    sensitivity: tuple[tuple[float, ...], ...]  # per kind and level: L1 in value units
    base: tuple[float, ...]  # per member: independent weighted variance
    epsilon: float

    def slots(self) -> list[tuple[int, int]]:
        return [(k, i) for k, kind in enumerate(self.kinds) for i in range(len(kind.levels))]

    def member_variances(self, eps: Sequence[float], taken: Sequence[bool]) -> list[float]:
        slots = self.slots()
        per: dict[tuple[int, tuple[int, ...]], float] = {}
        for k, kind in enumerate(self.kinds):
            idx = [s for s, (kk, _) in enumerate(slots) if kk == k]
            variances = [2 * (self.sensitivity[k][i] / max(eps[s], 1e-12)) ** 2
                         for i, s in enumerate(idx)]  # fmt: skip
            answers = _answer_variances(kind, variances, [taken[s] for s in idx])
            for i, level in enumerate(kind.levels):
                per[(kind.spec, level)] = answers[i]
        out = []
        for member in self.members:
            total = 0.0
            for est in member.plan.estimates:
                for j, w in zip(est.measurements, estimate_weights(est), strict=True):
                    if w > 0:
                        total += float(w) * per[(member.specs[j], member.level)]
            out.append(total)
        return out

    def objective(self, eps: Sequence[float], taken: Sequence[bool]) -> tuple[float, list[float]]:
        ratios = [v / b for v, b in zip(self.member_variances(eps, taken), self.base, strict=True)]
        loss = float(MAX_LOSS)
        penalty = sum(1e3 * max(0.0, r - loss) ** 2 for r in ratios)
        return sum(ratios) + penalty, ratios


def _optimise(model: _Model, taken: list[bool], start: list[float]) -> list[float]:
    """The split of the family's epsilon over the measurements taken that minimises the
    objective (a smooth problem in log-epsilon; L-BFGS-B on a softmax, from ``start``)."""
    live = [s for s, t in enumerate(taken) if t]

    def split(z: np.ndarray) -> list[float]:
        w = np.exp(z - z.max())
        w = w / w.sum()
        eps = [0.0] * len(taken)
        for s, share in zip(live, w, strict=True):
            eps[s] = float(share) * model.epsilon
        return eps

    z0 = np.log(np.array([max(start[s], 1e-6) for s in live]))

    def f(z: np.ndarray) -> float:
        return model.objective(split(z), taken)[0]

    result = minimize(f, z0, method="L-BFGS-B", options={"maxiter": 60})
    best = result.x if result.fun <= f(z0) else z0
    return split(best)


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
    model = _Model(fine, tuple(members), tuple(kinds), tuple(sens), base, float(epsilon))
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
    eps = _optimise(model, taken, start)
    # Coarser levels the optimum starves are not taken; their cells come from finer ones.
    for s, (_, i) in enumerate(slots):
        if i != 0 and eps[s] < MIN_SHARE * model.epsilon:
            taken[s] = False
    if not all(taken):
        eps = _optimise(model, taken, eps)
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


# -- the workload --------------------------------------------------------------------------------
PlanSelect = Callable[[exp.Select, int], Plan]


def plan_joint(plans: Sequence[Plan | None], plan_select: PlanSelect) -> Joint:
    """Families among the statements to be charged (``plans[i]`` None for the others), chosen
    greedily: the fine grouping and members with the largest predicted gain first.
    ``plan_select(select, i)`` plans a query with the settings in force at statement i."""
    free = {i for i, p in enumerate(plans) if p is not None and eligible(p)}
    groups: dict[tuple[object, ...], list[int]] = {}
    for i in sorted(free):
        p = plans[i]
        assert p is not None
        groups.setdefault(_base(p), []).append(i)
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
            keysets = {i: frozenset(_key_text(k) for k in _plan(plans, i).analysis.keys)
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
            sizes[_key_text(k)] = len(k.domain or ()) + int(k.other)
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
        pos = _positions(fine_plan, p)
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
    index = {_spec_key(fine, m): j for j, m in enumerate(fine.measurements)}
    members = []
    for i, p, pos in candidates:
        specs = [index.get(_spec_key(p, m)) for m in p.measurements]
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


__all__ = [
    "MAX_FAMILY_CELLS",
    "MAX_LOSS",
    "Family",
    "Joint",
    "Member",
    "Taken",
    "eligible",
    "independent_variance",
    "plan_family",
    "plan_joint",
    "synthetic",
]
