"""How a query's budget is split across its measurements: evenly, or to minimise the error of
what the query releases (``SET dpsql.split = optimal``, the default).

The objective is the sum over the query's estimates of each one's noise variance, weighed by
public numbers only (the query, the policy's bounds and constants): never a count, sum or
metadata of the data. Measurement j, of integer sensitivity Δ_j in units of u_j, gets weight
W_j, the sum over the estimates that use it of the weight its kind's rule declares
(``dpsql.plan.aggregates``, where each is derived): 1 for a total (SUM, COUNT, COUNT(DISTINCT):
its own variance); for AVG = m + S/N, 1 on S and w²/3 on N; for VARIANCE and STDDEV, 1 on Q,
4w²/3 on S and 11w⁴/45 on N, where w is half the range of the value's bounds; 0 for a quantile.

Minimising Σ W_j·Var_j under the budget (Lagrange multipliers):

* discrete Laplace, Var_j ≈ 2(u_j·Δ_j/ε_j)² with Σ ε_j = ε: ε_j ∝ (W_j·(u_j·Δ_j)²)^(1/3);
* discrete Gaussian under zCDP, Var_j = u_j²·L2_j²/(2ρ_j) with Σ ρ_j = ρ: ρ_j ∝ √W_j·u_j·L2_j.

Each proportion is rounded to four significant digits (the optimum is flat: this costs under
1e-6 of the variance) and the shares are exact rationals that sum to exactly 1, so the charged
total is the query's, to the last digit. Quantiles and partition selection are pure-epsilon
mechanisms with no variance to weigh: each keeps its 1/k share of epsilon, as with the even
split, and the rest is split among the others.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Literal

from dpsql.errors import InternalError
from dpsql.plan.aggregates.registry import rule_of
from dpsql.plan.plans import Estimate, Measurement

Split = Literal["optimal", "even"]
SPLITS: tuple[Split, ...] = ("optimal", "even")


def estimate_weights(estimate: Estimate) -> tuple[Fraction, ...]:
    """The weight of each of ``estimate``'s measurements, in its order, by its kind's rule."""
    return rule_of(estimate.kind).weights(estimate)


def weights(estimates: Sequence[Estimate], count: int) -> list[Fraction]:
    """W_j for each of ``count`` measurements: the sum of its weights over the estimates (a
    measurement two estimates share, like AVG(x)'s count and COUNT(x), adds both)."""
    total = [Fraction(0)] * count
    for estimate in estimates:
        for j, weight in zip(estimate.measurements, estimate_weights(estimate), strict=True):
            total[j] += weight
    return total


def _short(x: float) -> Fraction:
    """x > 0 rounded to four significant decimal digits, as an exact rational."""
    digits = 3 - math.floor(math.log10(x))
    return Fraction(round(x * 10.0**digits)) / Fraction(10) ** digits


def shares(
    base: Sequence[Measurement],
    weight: Sequence[Fraction],
    free: Sequence[int],
    gaussian: bool,
    split: Split,
) -> dict[int, Fraction]:
    """The share of the budget (epsilon, or rho with ``gaussian``) that goes to each measurement
    in ``free``: exact rationals summing to 1 (none when nothing is free)."""
    if not free:
        return {}
    if split == "even" or any(weight[j] <= 0 for j in free):
        return {j: Fraction(1, len(free)) for j in free}
    raw: dict[int, Fraction] = {}
    for j in free:
        m = base[j]
        if gaussian:
            # rho_j ∝ √W_j·u_j·L2_j, L2_j = √L0·(per group) (Bun and Steinke 2016, Prop. 1.6).
            size = math.sqrt(float(weight[j]) * m.groups) * float(m.unit) * m.per_group
        else:
            # epsilon_j ∝ (W_j·(u_j·Δ_j)²)^(1/3), Δ_j the L1 sensitivity (Laplace variance 2b²).
            size = (float(weight[j]) * (float(m.unit) * m.sensitivity) ** 2) ** (1 / 3)
        if not math.isfinite(size) or size <= 0:
            return {j: Fraction(1, len(free)) for j in free}
        raw[j] = _short(size)
    total = sum(raw.values(), Fraction(0))
    result = {j: r / total for j, r in raw.items()}
    if sum(result.values(), Fraction(0)) != 1:
        raise InternalError("the budget's shares do not sum to 1")
    return result


def planned_variance(m: Measurement) -> float:
    """The variance of a measurement's noise in value units, as the split models it: 2b² for
    a discrete Laplace of scale b, σ² for a discrete Gaussian."""
    unit = float(m.unit)
    if m.scale is not None:
        return 2 * (float(m.scale) * unit) ** 2
    assert m.sigma2 is not None
    return float(m.sigma2) * unit**2


def objective(measurements: Sequence[Measurement], estimates: Sequence[Estimate]) -> float:
    """Σ W_j·Var_j, the weighed noise variance the split minimises (quantiles weigh 0)."""
    w = weights(estimates, len(measurements))
    return sum(
        float(w[j]) * planned_variance(m)
        for j, m in enumerate(measurements)
        if w[j] > 0 and not m.exponential
    )


__all__ = ["SPLITS", "Split", "estimate_weights", "objective", "planned_variance", "shares"]
