"""Exact constrained least squares (dpsql.plan.workload.least_squares): consistency, agreement with
numpy's weighted least squares, dependent constraints, variances and a Monte Carlo check."""

from __future__ import annotations

import random
from fractions import Fraction

import numpy as np
import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsql.errors import InternalError
from dpsql.plan.workload.least_squares import adjust, predicted_variances

Constraint = dict[int, Fraction]


def hierarchy(k: int, j: int) -> tuple[int, list[Constraint], list[int]]:
    """A total (0), k children and j grandchildren per child: (size, constraints, leaves)."""
    constraints: list[Constraint] = [{0: Fraction(1), **{c: Fraction(-1) for c in range(1, k + 1)}}]
    leaves: list[int] = []
    nxt = k + 1
    for c in range(1, k + 1):
        kids = list(range(nxt, nxt + j))
        nxt += j
        leaves += kids
        constraints.append({c: Fraction(1), **{g: Fraction(-1) for g in kids}})
    return nxt, constraints, leaves


def design(size: int, constraints: list[Constraint], leaves: list[int]) -> np.ndarray:
    """X with q = X·(leaf values): each quantity is the sum of the leaves under it."""
    x = np.zeros((size, len(leaves)))
    for i, leaf in enumerate(leaves):
        x[leaf, i] = 1.0
    for constraint in reversed(constraints):  # children before parents
        parent = next(i for i, c in constraint.items() if c == 1)
        for child, c in constraint.items():
            if c == -1:
                x[parent] += x[child]
    return x


variances_st = st.fractions(min_value=Fraction(1, 10), max_value=Fraction(10), max_denominator=50)


@settings(max_examples=examples(25), deadline=None)
@given(
    k=st.integers(1, 5),
    j=st.integers(1, 4),
    data=st.data(),
)
def test_hierarchy_matches_gls(k: int, j: int, data: st.DataObject) -> None:
    size, constraints, leaves = hierarchy(k, j)
    v = data.draw(st.lists(variances_st, min_size=size, max_size=size))
    y = data.draw(st.lists(st.integers(-1000, 1000), min_size=size, max_size=size))
    fit = adjust(v, constraints)
    assert fit.size == size and fit.rank == len(constraints)
    estimate = fit.apply(y)
    for constraint in constraints:
        assert sum(c * estimate[i] for i, c in constraint.items()) == 0
    # Generalised least squares over the finest cells, weights V⁻¹.
    x = design(size, constraints, leaves)
    w = np.diag([1 / float(vi) for vi in v])
    leaf_fit = np.linalg.solve(x.T @ w @ x, x.T @ w @ np.asarray(y, dtype=float))
    np.testing.assert_allclose([float(e) for e in estimate], x @ leaf_fit, rtol=1e-9, atol=1e-9)
    cov = x @ np.linalg.inv(x.T @ w @ x) @ x.T
    exact = [fit.variance(i) for i in range(size)]
    np.testing.assert_allclose([float(e) for e in exact], np.diag(cov), rtol=1e-9)
    floats = predicted_variances([float(vi) for vi in v], constraints)
    np.testing.assert_allclose(floats, [float(e) for e in exact], rtol=1e-9)
    for i in range(size):
        assert exact[i] <= v[i]
        assert sum(a * y[k2] for k2, a in fit.row(i).items()) == estimate[i]
    # A weighted sum of estimates, in one solve, is the sum of their rows.
    weights = data.draw(st.dictionaries(st.integers(0, size - 1), variances_st, max_size=size))
    rows: dict[int, Fraction] = {}
    for i, w in weights.items():
        for k2, a in fit.row(i).items():
            rows[k2] = rows.get(k2, Fraction(0)) + w * a
    assert fit.combination(weights) == {k2: a for k2, a in rows.items() if a != 0}


def test_dependent_constraints_change_nothing() -> None:
    size, constraints, _ = hierarchy(3, 2)
    rng = random.Random(5)
    v = [Fraction(rng.randint(1, 50), rng.randint(1, 9)) for _ in range(size)]
    y = [rng.randint(-100, 100) for _ in range(size)]
    base = adjust(v, constraints)
    combined = {i: constraints[1].get(i, 0) + constraints[2].get(i, 0) for i in range(size)}
    for extra in ([constraints[0]], [combined], [{i: 3 * c for i, c in constraints[3].items()}]):
        fit = adjust(v, constraints + extra)
        assert fit.rank == base.rank
        assert fit.apply(y) == base.apply(y)
        assert [fit.variance(i) for i in range(size)] == [base.variance(i) for i in range(size)]
        assert [fit.row(i) for i in range(size)] == [base.row(i) for i in range(size)]
        floats = predicted_variances([float(x) for x in v], constraints + extra)
        np.testing.assert_allclose(floats, [float(base.variance(i)) for i in range(size)], 1e-9)
    empty = adjust(v, [*constraints, {}, {0: Fraction(0)}])
    assert empty.rank == base.rank


def test_no_constraints_is_identity() -> None:
    v = [Fraction(1), Fraction(2, 3), Fraction(5)]
    fit = adjust(v, [])
    assert fit.rank == 0
    assert fit.apply([3, -1, Fraction(1, 2)]) == [3, -1, Fraction(1, 2)]
    assert [fit.variance(i) for i in range(3)] == v
    assert fit.row(1) == {1: 1}
    np.testing.assert_array_equal(predicted_variances([1.0, 2.0], []), [1.0, 2.0])


def test_monte_carlo_variance() -> None:
    size, constraints, leaves = hierarchy(3, 3)
    rng = np.random.default_rng(20240601)
    v = [Fraction(int(rng.integers(1, 20)), int(rng.integers(1, 5))) for _ in range(size)]
    fit = adjust(v, constraints)
    rows = np.zeros((size, size))
    for i in range(size):
        for k, a in fit.row(i).items():
            rows[i, k] = float(a)
    truth = design(size, constraints, leaves) @ rng.normal(0, 10, len(leaves))
    draws = truth + rng.normal(size=(20_000, size)) * np.sqrt([float(x) for x in v])
    estimates = draws @ rows.T
    np.testing.assert_allclose(estimates.mean(axis=0), truth, atol=0.2)
    np.testing.assert_allclose(
        estimates.var(axis=0), [float(fit.variance(i)) for i in range(size)], rtol=0.05
    )
    # ŷ is exactly consistent, so the estimates of a draw satisfy every constraint.
    consistent = fit.apply([round(x) for x in draws[0]])
    assert consistent[0] == sum(consistent[c] for c in range(1, 4))


def test_bad_input() -> None:
    with pytest.raises(InternalError):
        adjust([Fraction(1), Fraction(0)], [])
    with pytest.raises(InternalError):
        adjust([Fraction(1), Fraction(-1)], [])
    with pytest.raises(InternalError):
        adjust([Fraction(1)], [{1: Fraction(1)}])
    with pytest.raises(InternalError):
        adjust([Fraction(1)], [{-1: Fraction(1)}])
    with pytest.raises(InternalError):
        adjust([Fraction(1)] * 2, [{0: Fraction(1)}] * 401)
    fit = adjust([Fraction(1)], [])
    with pytest.raises(InternalError):
        fit.variance(1)
    with pytest.raises(InternalError):
        fit.apply([1, 2])
    with pytest.raises(InternalError):
        predicted_variances([1.0, 0.0], [])
    with pytest.raises(InternalError):
        predicted_variances([1.0], [{3: 1.0}])
