"""Exact constrained least squares: the best linear unbiased estimate (BLUE) of quantities each
measured once with independent noise, given exact linear relations between them.

Quantities q_0..q_{n-1} are measured as y_i = q_i + e_i with independent zero-mean noises of
known variances v_i > 0, V = diag(v). The true quantities satisfy C q = 0 (for example a parent
total equal to the sum of its children: the hierarchical consistency of Hay, Rastogi, Miklau and
Suciu, "Boosting the accuracy of differentially private histograms through consistency", PVLDB
2010). Minimising (ŷ - y)ᵀ V⁻¹ (ŷ - y) subject to C ŷ = 0 (Lagrange multipliers; equivalently
generalised least squares over a basis of the constraints' null space, Gauss–Markov) gives

    ŷ = y - V Cᵀ (C V Cᵀ)⁻¹ C y,    Cov(ŷ) = V - V Cᵀ (C V Cᵀ)⁻¹ C V.

Everything is exact ``Fraction`` arithmetic. The m×m Gram matrix M = C V Cᵀ is factored as
L D Lᵀ by symmetric Gaussian elimination on a sparse dict-of-dicts matrix, pivoting each time on
the remaining constraint whose row is sparsest (minimum degree: a hierarchy's constraints form a
tree and are eliminated leaves first, with no fill-in). M is positive semidefinite and its
Schur complement after eliminating a set P is the Gram matrix of the remaining constraints'
residuals after V-weighted projection onto P's span, so a zero pivot means exactly that the
constraint is a combination of those eliminated: it is dropped (its row is then zero too), and
``rank`` counts the pivots kept. Only the solves M x = b are ever needed:

* ``apply``: λ = M⁻¹ C y, ŷ = y - V Cᵀ λ, then C ŷ = 0 is checked exactly;
* ``variance(i)``: v_i - v_i² c_iᵀ M⁻¹ c_i = v_i - v_i² Σ_p z_p² / d_p with z = L⁻¹ c_i
  (c_i the i-th column of C), a forward solve that stays sparse on a tree;
* ``row(i)``: ŷ_i = y_i - v_i (M⁻¹ c_i)ᵀ C y, so its coefficients are e_i - v_i Cᵀ M⁻¹ c_i;
  ``combination(w)``, those of Σ_i w_i ŷ_i, in one solve.

``predicted_variances`` is the same diagonal in float64 for optimisers: with A = C V^½, the
variance reduction of q_i is v_i times the i-th diagonal entry of the projection onto A's row
space, read off a thin SVD of A (singular values below a relative tolerance are dependent
constraints).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from dpsql.errors import InternalError

MAX_CONSTRAINTS = 400
"""Most constraints accepted: exact elimination is cubic in the worst (dense) case."""

_ZERO = Fraction(0)

FloatArray = npt.NDArray[np.float64]


def _check_variances(variances: Sequence[Fraction]) -> tuple[Fraction, ...]:
    checked = tuple(Fraction(v) for v in variances)
    if any(v <= 0 for v in checked):
        raise InternalError("every measured variance must be positive")
    return checked


def _check_constraints(
    constraints: Sequence[Mapping[int, Fraction]], size: int
) -> list[dict[int, Fraction]]:
    if len(constraints) > MAX_CONSTRAINTS:
        raise InternalError(f"at most {MAX_CONSTRAINTS} consistency constraints are supported")
    rows: list[dict[int, Fraction]] = []
    for constraint in constraints:
        row: dict[int, Fraction] = {}
        for index, coefficient in constraint.items():
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < size:
                raise InternalError("a constraint names a quantity out of range")
            value = Fraction(coefficient)
            if value != 0:
                row[index] = value
        rows.append(row)
    return rows


@dataclass(frozen=True)
class Adjustment:
    """The exact BLUE of ``size`` quantities under ``rank`` independent constraints (module
    docstring). Build it with :func:`adjust`."""

    size: int
    rank: int
    variances: tuple[Fraction, ...]
    constraints: tuple[dict[int, Fraction], ...]
    """The independent constraints kept, in pivot order (p-th is the p-th pivot)."""
    columns: tuple[dict[int, Fraction], ...]
    """For each quantity i, c_i: {pivot p: coefficient of q_i in constraint p}."""
    pivots: tuple[Fraction, ...]
    """D of M = L D Lᵀ, in pivot order."""
    lower: tuple[dict[int, Fraction], ...]
    """Column p of L below the diagonal: {later pivot a: L[a][p]}."""

    def _forward(self, rhs: Mapping[int, Fraction]) -> list[Fraction]:
        """z = L⁻¹ rhs (L unit lower triangular, in pivot order)."""
        z = [_ZERO] * self.rank
        for p, value in rhs.items():
            z[p] = value
        for p in range(self.rank):
            zp = z[p]
            if zp:
                for a, factor in self.lower[p].items():
                    z[a] -= factor * zp
        return z

    def _solve(self, rhs: Mapping[int, Fraction]) -> list[Fraction]:
        """x = M⁻¹ rhs = L⁻ᵀ D⁻¹ L⁻¹ rhs."""
        x = self._forward(rhs)
        for p in range(self.rank):
            if x[p]:
                x[p] /= self.pivots[p]
        for p in reversed(range(self.rank)):
            column = self.lower[p]
            if column:
                x[p] -= sum((factor * x[a] for a, factor in column.items()), _ZERO)
        return x

    def _check_index(self, i: int) -> None:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.size:
            raise InternalError("a quantity index is out of range")

    def apply(self, y: Sequence[int | Fraction]) -> list[Fraction]:
        """ŷ = y - V Cᵀ (C V Cᵀ)⁻¹ C y, exactly; C ŷ = 0 is checked exactly."""
        if len(y) != self.size:
            raise InternalError("the measurements do not match the quantities")
        values = [Fraction(v) for v in y]
        residual = {
            p: sum((c * values[k] for k, c in row.items()), _ZERO)
            for p, row in enumerate(self.constraints)
        }
        multipliers = self._solve(residual)
        result = list(values)
        for i, column in enumerate(self.columns):
            if column:
                shift = sum((c * multipliers[p] for p, c in column.items()), _ZERO)
                result[i] -= self.variances[i] * shift
        for row in self.constraints:  # the BLUE satisfies every constraint exactly (C ŷ = 0)
            if sum((c * result[k] for k, c in row.items()), _ZERO) != 0:
                raise InternalError("the consistent estimates violate a constraint")
        return result

    def variance(self, i: int) -> Fraction:
        """Var(ŷ_i) = v_i - v_i² c_iᵀ (C V Cᵀ)⁻¹ c_i, exactly."""
        self._check_index(i)
        v = self.variances[i]
        column = self.columns[i]
        if not column:
            return v
        z = self._forward(column)
        reduction = sum((zp * zp / d for zp, d in zip(z, self.pivots, strict=True) if zp), _ZERO)
        return v - v * v * reduction

    def row(self, i: int) -> dict[int, Fraction]:
        """The coefficients a of ŷ_i = Σ_k a_k y_k (zeros omitted): e_i - v_i Cᵀ M⁻¹ c_i."""
        return self.combination({i: Fraction(1)})

    def combination(self, weights: Mapping[int, Fraction]) -> dict[int, Fraction]:
        """The coefficients a of Σ_i w_i ŷ_i = Σ_k a_k y_k (zeros omitted), in one solve: by
        linearity, Σ_i w_i e_i - Cᵀ M⁻¹ (Σ_i w_i v_i c_i)."""
        coefficients: dict[int, Fraction] = {}
        rhs: dict[int, Fraction] = {}
        for i, w in weights.items():
            self._check_index(i)
            coefficients[i] = coefficients.get(i, _ZERO) + w
            for p, c in self.columns[i].items():
                rhs[p] = rhs.get(p, _ZERO) + w * self.variances[i] * c
        if any(rhs.values()):
            x = self._solve(rhs)
            for p, constraint in enumerate(self.constraints):
                if x[p]:
                    for k, c in constraint.items():
                        coefficients[k] = coefficients.get(k, _ZERO) - x[p] * c
        return {k: a for k, a in coefficients.items() if a != 0}


def adjust(
    variances: Sequence[Fraction], constraints: Sequence[Mapping[int, Fraction]]
) -> Adjustment:
    """The exact BLUE of quantities with these measurement variances under C q = 0, each
    constraint a sparse {index: coefficient} row (dependent or empty ones are dropped).

    Raises InternalError for a variance ≤ 0, an index out of range or more than
    ``MAX_CONSTRAINTS`` constraints."""
    v = _check_variances(variances)
    rows = _check_constraints(constraints, len(v))
    # M = C V Cᵀ, sparse: only pairs of constraints sharing a quantity meet.
    touching: dict[int, list[int]] = {}
    for a, row in enumerate(rows):
        for k in row:
            touching.setdefault(k, []).append(a)
    gram: dict[int, dict[int, Fraction]] = {a: {} for a in range(len(rows))}
    for k, members in touching.items():
        for a in members:
            weight = rows[a][k] * v[k]
            entries = gram[a]
            for b in members:
                entries[b] = entries.get(b, _ZERO) + weight * rows[b][k]
    for a, entries in list(gram.items()):
        gram[a] = {b: x for b, x in entries.items() if x != 0}
    # L D Lᵀ by symmetric elimination, minimum degree first; a zero pivot is a dependent
    # constraint (PSD Schur complement: its whole row is then zero) and is dropped.
    order: list[int] = []
    pivot_values: list[Fraction] = []
    columns_by_original: list[dict[int, Fraction]] = []
    remaining = set(gram)
    while remaining:
        p = min(remaining, key=lambda a: (len(gram[a]), a))
        remaining.discard(p)
        entries = gram.pop(p)
        d = entries.pop(p, _ZERO)
        if d == 0:
            if entries:  # cannot happen for a PSD matrix in exact arithmetic
                raise InternalError("a dependent constraint left a nonzero Schur complement row")
            continue
        if d < 0:
            raise InternalError("the constraint Gram matrix is not positive semidefinite")
        neighbours = list(entries)
        for a in neighbours:
            gram[a].pop(p, None)
        for a in neighbours:
            factor = entries[a] / d
            row_a = gram[a]
            for b in neighbours:
                value = row_a.get(b, _ZERO) - factor * entries[b]
                if value:
                    row_a[b] = value
                else:
                    row_a.pop(b, None)
        order.append(p)
        pivot_values.append(d)
        columns_by_original.append({a: entries[a] / d for a in neighbours})
    # A constraint dropped later as dependent is absent from the kept system: eliminating the
    # others never reads its row, so their factors are those of M without it.
    position = {original: index for index, original in enumerate(order)}
    lower = tuple(
        {position[a]: factor for a, factor in column.items() if a in position}
        for column in columns_by_original
    )
    kept = tuple(rows[original] for original in order)
    columns: list[dict[int, Fraction]] = [{} for _ in v]
    for p, row in enumerate(kept):
        for k, c in row.items():
            columns[k][p] = c
    return Adjustment(
        size=len(v),
        rank=len(order),
        variances=v,
        constraints=kept,
        columns=tuple(columns),
        pivots=tuple(pivot_values),
        lower=lower,
    )


def predicted_variances(
    variances: Sequence[float], constraints: Sequence[Mapping[int, float | Fraction]]
) -> FloatArray:
    """Var(ŷ_i) for every i in float64 (the exact :meth:`Adjustment.variance`, for optimisers):
    v_i·(1 - P_ii), P the projection onto the row space of C V^½ (dependent constraints are
    the singular values below the relative tolerance)."""
    v = np.asarray(variances, dtype=np.float64)
    if v.ndim != 1 or not np.all(v > 0):
        raise InternalError("every measured variance must be positive")
    n = v.size
    if len(constraints) > MAX_CONSTRAINTS:
        raise InternalError(f"at most {MAX_CONSTRAINTS} consistency constraints are supported")
    c = np.zeros((len(constraints), n), dtype=np.float64)
    for a, constraint in enumerate(constraints):
        for k, coefficient in constraint.items():
            if not 0 <= k < n:
                raise InternalError("a constraint names a quantity out of range")
            c[a, k] = float(coefficient)
    if c.size == 0:
        return v.copy()
    a_matrix = c * np.sqrt(v)
    _, singular, w = np.linalg.svd(a_matrix, full_matrices=False)
    tolerance = singular.max(initial=0.0) * max(a_matrix.shape) * np.finfo(np.float64).eps
    basis = w[singular > tolerance]
    leverage = np.einsum("ij,ij->j", basis, basis)
    result: FloatArray = v * (1.0 - leverage)
    return result


__all__ = ["MAX_CONSTRAINTS", "Adjustment", "adjust", "predicted_variances"]
