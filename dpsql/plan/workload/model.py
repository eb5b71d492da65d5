"""A candidate family's variance model: what each member's error becomes under a split of epsilon.

For each measurement kind of a family, the levels taken are combined by least squares under the
constraints that a coarser cell is the sum of its base cells (Hay, Rastogi, Miklau, Suciu, VLDB
2010); every cell of a level has the same variance (the cells are a product of key domains, each
level one noise scale), so one level's answer variance stands for all its cells. A member's
weighted variance follows from its estimates' weights (``dpsql.plan.split``), and the split of
the family's epsilon minimises the sum of the members' ratios to their independent plans, with
none above ``MAX_LOSS`` (``optimise``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize

from dpsql.plan.plans import Plan
from dpsql.plan.split import estimate_weights, planned_variance
from dpsql.plan.workload.family import MAX_LOSS, Member


# -- the variance model --------------------------------------------------------------------------
def level_map(sizes: Sequence[int], fine: Sequence[int], level: Sequence[int]) -> np.ndarray:
    """For each cell of level ``fine`` (keys at those positions, mixed radix in that order),
    the index of its cell at ``level`` (a subset of ``fine``)."""
    shape = [sizes[p] for p in fine]
    grid = np.indices(shape).reshape(len(shape), -1) if shape else np.zeros((0, 1), dtype=int)
    out = np.zeros(grid.shape[1], dtype=np.int64)
    for p in level:
        out = out * sizes[p] + grid[list(fine).index(p)]
    return out


@dataclass(frozen=True)
class Kind:
    """One measurement kind of a family: its levels (the fine one first) and their cells."""

    spec: int
    levels: tuple[tuple[int, ...], ...]
    maps: tuple[np.ndarray, ...]  # per level: base cell -> that level's cell
    sizes: tuple[int, ...]  # the fine keys' domain sizes


def member_kinds(sizes: Sequence[int], members: Sequence[Member]) -> list[Kind]:
    """The measurement kinds of a family of ``members`` at the fine grouping of ``sizes``, each
    with the levels its members use (``kinds_of``)."""
    uses: dict[int, set[tuple[int, ...]]] = {}
    for member in members:
        for spec in member.specs:
            uses.setdefault(spec, set()).add(member.level)
    return kinds_of(sizes, tuple(range(len(sizes))), uses)


def kinds_of(
    sizes: Sequence[int], fine_level: tuple[int, ...], uses: dict[int, set[tuple[int, ...]]]
) -> list[Kind]:
    kinds = []
    for spec, levels in sorted(uses.items()):
        # The base: the finest level the kind is used at when it holds every other one (then
        # the fine level adds nothing), else the fine level.
        widest = max(levels, key=len)
        base = widest if all(set(lv) <= set(widest) for lv in levels) else fine_level
        ordered = (base, *sorted(lv for lv in levels if lv != base))
        maps = tuple(level_map(sizes, base, lv) for lv in ordered)
        kinds.append(Kind(spec, ordered, maps, tuple(sizes)))
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


def _structure(kind: Kind, taken: Sequence[bool]) -> _Structure:
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


def _answer_variances(kind: Kind, variances: Sequence[float], taken: Sequence[bool]) -> list[float]:
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
class FamilyModel:
    """A candidate family's variance model: the objective of a split of its epsilon."""

    fine: Plan
    members: tuple[Member, ...]
    kinds: tuple[Kind, ...]
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


def optimise(model: FamilyModel, taken: list[bool], start: list[float]) -> list[float]:
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
