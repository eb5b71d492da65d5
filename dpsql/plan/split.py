"""How a query's budget is split across its measurements (``SET dpsql.split``): so that every
estimate the query releases stays useful (``min_max_ratio``, the default), to minimise the summed
noise variance of its estimates (``min_total_variance``; ``optimal`` is its old name, kept as an
alias), or evenly (``even``).

Every rule weighs public numbers only (the query, the policy's bounds and constants): never a
count, sum or metadata of the data. Measurement j, of integer sensitivity Δ_j in units of u_j,
has weight W_ej in estimate e, by the estimate's kind's rule (``dpsql.plan.aggregates``, where
each is derived): 1 for a total (SUM, COUNT, COUNT(DISTINCT): its own variance); for AVG = m +
S/N, 1 on S and w²/3 on N; for VARIANCE and STDDEV, 1 on Q, 4w²/3 on S and 11w⁴/45 on N, where
w is half the range of the value's bounds; 0 for a quantile. With share s_j of the budget,
measurement j's noise variance is c_j/s_j^p: c_j = 2(u_j·Δ_j/ε)² and p = 2 for the discrete
Laplace (Σ ε_j = ε), c_j = u_j²·L2_j²/(2ρ) and p = 1 for the discrete Gaussian under zCDP
(Σ ρ_j = ρ). Estimate e's variance is V_e(s) = Σ_j W_ej·c_j/s_j^p.

* ``min_total_variance`` minimises Σ_e V_e (Lagrange multipliers): ε_j ∝ (W_j·(u_j·Δ_j)²)^(1/3)
  under Laplace, ρ_j ∝ √W_j·u_j·L2_j under zCDP, W_j = Σ_e W_ej. Each estimate's variance is in
  its own units, so a sum over values up to 100,000 outweighs a count by 10^10: the count gets
  almost nothing.
* ``min_max_ratio`` keeps every estimate near what it would be asked alone. Asked alone at the
  query's whole budget, estimate e would give measurement j the share φ_ej ∝ (W_ej·c_j)^(1/(p+1))
  (the rule above, on e alone), so its variance A_e = Σ_j W_ej·c_j/φ_ej^p. The rule minimises the
  largest ratio (φ_ej/s_j)^p, over e and j, of a measurement's noise variance in the query to its
  variance in e asked alone. For any shares summing to 1, max_j ω_j/s_j ≥ Σ_j ω_j/Σ_j s_j with
  ω_j = max_e φ_ej, with equality at s_j ∝ ω_j: that is the rule, in closed form. Since every
  term of V_e is then at most (Σ ω)^p times its term in A_e, V_e ≤ (Σ ω)^p·A_e; each ω_j ≤ 1 and
  the φ_ej of one estimate sum to 1, so Σ ω is at most k, the number of measurements, and at most
  the number of estimates with a variance. Each estimate's ± is then at most k times (√k times
  under zCDP) its ± asked alone at the same budget, whatever the bounds of the values.

Each proportion is rounded to four significant digits (under ``min_total_variance`` the
optimum is flat: this costs under 1e-6 of the objective; under ``min_max_ratio`` it moves a
ratio by at most 0.2%, and not at all where Σ ω = k, the even split) and the shares are exact
rationals that sum to exactly 1, so the charged total is the query's, to the last digit.
Quantiles and partition selection are pure-epsilon mechanisms with no variance to weigh: each
keeps its 1/k share of epsilon, as with the even split, and the rest is split among the others.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Literal

from dpsql.errors import InternalError
from dpsql.plan.aggregates.registry import rule_of
from dpsql.plan.plans import Estimate, Measurement

Split = Literal["min_max_ratio", "min_total_variance", "even"]
SPLITS: tuple[Split, ...] = ("min_max_ratio", "min_total_variance", "even")
# Names a rule had before, accepted for one release (docs/sql.md).
ALIASES: dict[str, Split] = {"optimal": "min_total_variance"}


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


def _exact(raw: dict[int, float]) -> dict[int, Fraction]:
    """Positive proportions, each to four significant digits, as exact shares summing to 1."""
    short = {j: _short(x) for j, x in raw.items()}
    total = sum(short.values(), Fraction(0))
    result = {j: r / total for j, r in short.items()}
    if sum(result.values(), Fraction(0)) != 1:
        raise InternalError("the budget's shares do not sum to 1")
    return result


def _size(m: Measurement, gaussian: bool) -> float:
    """c_j up to the budget's common factor: (u_j·Δ_j)², or u_j²·L2_j² with L2_j = √L0·(per
    group) (Bun and Steinke 2016, Prop. 1.6)."""
    if gaussian:
        return m.groups * (float(m.unit) * m.per_group) ** 2
    return (float(m.unit) * m.sensitivity) ** 2


def shares(
    base: Sequence[Measurement],
    estimates: Sequence[Estimate],
    free: Sequence[int],
    gaussian: bool,
    split: Split,
) -> dict[int, Fraction]:
    """The share of the budget (epsilon, or rho with ``gaussian``) that goes to each measurement
    in ``free``: exact rationals summing to 1 (none when nothing is free)."""
    if not free:
        return {}
    even = {j: Fraction(1, len(free)) for j in free}
    weight = weights(estimates, len(base))
    if split == "even" or any(weight[j] <= 0 for j in free):
        return even
    size = {j: _size(base[j], gaussian) for j in free}
    if not all(math.isfinite(c) and c > 0 for c in size.values()):
        return even
    raw: dict[int, float] = {}
    if split == "min_max_ratio":
        raw = _most_needed(estimates, free, size, 1 if gaussian else 2)
    for j in free if split == "min_total_variance" else ():
        m = base[j]
        if gaussian:
            # rho_j ∝ √W_j·u_j·L2_j, L2_j = √L0·(per group) (Bun and Steinke 2016, Prop. 1.6).
            raw[j] = math.sqrt(float(weight[j]) * m.groups) * float(m.unit) * m.per_group
        else:
            # epsilon_j ∝ (W_j·(u_j·Δ_j)²)^(1/3), Δ_j the L1 sensitivity (Laplace variance 2b²).
            raw[j] = (float(weight[j]) * (float(m.unit) * m.sensitivity) ** 2) ** (1 / 3)
    if not all(math.isfinite(x) and x > 0 for x in raw.values()):
        return even
    return _exact(raw)


def alone_shares(
    estimate: Estimate, free: Sequence[int], size: dict[int, float], p: int
) -> dict[int, float]:
    """φ_ej: the shares ``estimate`` would give its free measurements were it asked alone
    (min Σ_j W_ej·c_j/s_j^p on the simplex: s_j ∝ (W_ej·c_j)^(1/(p+1)), by Lagrange)."""
    raw: dict[int, float] = {}
    for j, w in zip(estimate.measurements, estimate_weights(estimate), strict=True):
        if j in size and w > 0:
            raw[j] = raw.get(j, 0.0) + float(w) * size[j]
    root = {j: x ** (1 / (p + 1)) for j, x in raw.items()}
    total = math.fsum(root.values())
    return {j: r / total for j, r in root.items()}


def _most_needed(
    estimates: Sequence[Estimate], free: Sequence[int], size: dict[int, float], p: int
) -> dict[int, float]:
    """ω_j = max_e φ_ej over the estimates (module docstring): the min_max_ratio proportions."""
    most = dict.fromkeys(free, 0.0)
    for est in estimates:
        for j, phi in alone_shares(est, free, size, p).items():
            most[j] = max(most[j], phi)
    return most


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


__all__ = [
    "ALIASES",
    "SPLITS",
    "Split",
    "estimate_weights",
    "objective",
    "planned_variance",
    "shares",
]
