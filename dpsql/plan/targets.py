"""Accuracy targets: the cheapest epsilon whose planned noise meets them (``dpsql.halfwidth``,
``dpsql.rank_error``, ``dpsql.min_group``; docs/sql.md).

A target is met on public quantities only: the sensitivities, the grid, the confidence and the
numbers the analyst states; never a count, sum or metadata of the data. Every figure below is a
function of the noise's parameters, which are functions of epsilon:

* a count or sum: the exact noise half-width of its measurement at the session's confidence
  (``half_width``, the discrete distribution actually sampled) is at most ``halfwidth``;
* AVG, VARIANCE, STDDEV without ``min_group``: the target binds each of their measurements (a
  centred sum, a count, a centred sum of squares), each in its own units, as if released;
* the same with ``min_group`` = N: the half-width the release computes (``release_estimates``,
  the very functions) is at most ``halfwidth`` wherever the noisy values can fall when each
  measurement's noise is within its joint half-width and the group holds at least N units:
  every noisy count n from N - k_N to 2(N + k_N), every noisy mean of a centred sum in
  ±(w·(n + k_N) + k_S), and (VARIANCE, STDDEV) every noisy variance from -k_Q/n to w² + k_Q/n,
  dense near 0 where STDDEV's square root is steepest, over a grid of them (beyond it every
  term of the width shrinks as 1/n). So in a group of at least N units the released
  ± meets the target with probability at least the confidence, up to the grid's resolution
  (measured: tests/plan/test_targets.py, on data at the bounds, where the width is largest);
* a quantile with ``rank_error`` = r: the exponential mechanism picks a candidate whose score
  exceeds b·r (b the denominator of p: the target rank is within r rows of the ranks the
  candidate spans) with probability at most |R|·exp(-(b·r + 1)/(2·scale)), since the best
  candidate scores 0 and scores are integers (the exponential mechanism's utility argument,
  McSherry and Talwar 2007): at most 1 - confidence.

Each figure falls as its measurement's budget grows, so each measurement a target binds gets
the least budget that meets it, found by bisection on its logarithm and rounded up to four
significant digits (an exact decimal, at most 0.1% above the least), and checked again: epsilon_j
for a discrete Laplace or an exponential mechanism, rho_j for a discrete Gaussian. A ratio's
measurements (with ``min_group``) are scaled together, in the optimal split's proportions
(``dpsql.plan.split``). A measurement no target binds (partition selection, a quantile without
``rank_error``) keeps its budget at the query's own epsilon. The query's cost is the sequential
composition of these budgets (the epsilons add; the rhos add, converted with the pure parts'
epsilon by CKS Corollary 13): for counts, sums and quantiles the least any split meets the
targets at, each measurement having the least it can; for a ratio the least along the optimal
split's proportions. That is what EXPLAIN shows and the query is charged.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from dpsql.analyze.analysis import SPREAD_KINDS, Analysis
from dpsql.errors import InternalError, ParameterError
from dpsql.mechanisms.events import Composite
from dpsql.plan import calibration
from dpsql.plan.estimators import _avg, _spread, half_width
from dpsql.plan.planner import Calibration, calibrate
from dpsql.plan.plans import Estimate, Measurement, QueryOptions
from dpsql.plan.split import shares, weights
from dpsql.policy import Policy
from dpsql.policy.numbers import MAX_QUERY_EPSILON, MAX_QUERY_RHO, decimal_text, decimal_up

__all__ = ["Target", "solve"]

# Points of each noisy centred sum (and sum of squares) at which a ratio's half-width is checked.
_POINTS = 33
# Noisy counts (a geometric grid) at which it is checked.
_COUNTS = 9


@dataclass(frozen=True)
class Target:
    """The targets of one query and what they bind."""

    halfwidth: Fraction | None
    rank_error: int | None
    min_group: int | None


def _label(analysis: Analysis, i: int) -> str:
    agg = analysis.aggregates[i]
    arg = agg.arg.sql("duckdb") if agg.arg is not None else "*"
    if agg.kind == "quantile":
        return f"QUANTILE({arg}, {decimal_text(agg.p or Fraction(0))})"
    name = {"count_rows": "COUNT", "count_units": "COUNT(DISTINCT unit)"}.get(agg.kind)
    if name == "COUNT(DISTINCT unit)":
        return name
    return f"{name or agg.kind.upper()}({arg})"


def _ratio_width(
    estimate: Estimate, measurements: Sequence[Measurement], confidence: float, n: int
) -> float:
    """The largest half-width the release computes for a ratio in a group of at least ``n``
    units, over the noisy values within their joint half-widths (module docstring)."""
    grid = estimate.grid
    assert grid is not None
    parts = len(estimate.measurements)
    joint = math.sqrt(confidence) if parts == 2 else math.nextafter(confidence ** (1 / 3), 1.0)
    k = [half_width(measurements[j], joint) for j in estimate.measurements]
    w = grid.width  # a centred row value lies in ±width units of g/2
    # Noisy counts from N - k_N up: the width is not monotone in the count near a variance of
    # 0, so counts up to twice N + k_N are checked too (beyond, every term shrinks as 1/count).
    counts = np.unique(np.geomspace(max(n - k[-1], 1), 2 * (n + k[-1]), _COUNTS).round())
    # For each noisy count, every noisy centred sum a group of that count can give (its units
    # are at most count + k_N), all in one vectorized evaluation.
    units = counts + k[-1]
    spans = w * units + k[-2]
    s = np.linspace(-spans, spans, _POINTS, axis=1)  # (counts, points)
    n_s = np.broadcast_to(counts[:, None], s.shape)
    noisy: list[npt.ArrayLike] = [np.zeros(0) for _ in measurements]
    if parts == 2:
        noisy[estimate.measurements[0]] = np.round(s).ravel()
        noisy[estimate.measurements[1]] = n_s.ravel()
        _, width = _avg(estimate, measurements, noisy, confidence)
        return float(width.max())
    # By noisy mean m = S/n and variance v = Q/n - m²: the width is steepest near v = 0
    # (STDDEV's square root), so small and slightly negative v are dense in the grid.
    top = float(w * w)
    rel = np.concatenate(([-1.0, -0.5, -0.1, -0.01, 0.0], np.full(_POINTS, np.nan)))
    v = np.empty((len(counts), rel.size))
    v[:, :5] = rel[None, :5] * (k[0] / counts)[:, None]
    v[:, 5:] = np.geomspace(top * 1e-9, top + k[0] / counts, _POINTS, axis=1)
    m = s / counts[:, None]  # (counts, points)
    mm = np.broadcast_to(m[:, :, None], (*m.shape, rel.size))
    vv = np.broadcast_to(v[:, None, :], mm.shape)
    nn = np.broadcast_to(counts[:, None, None], mm.shape)
    noisy[estimate.measurements[0]] = np.round(nn * (vv + mm * mm)).ravel()
    noisy[estimate.measurements[1]] = np.round(mm * nn).ravel()
    noisy[estimate.measurements[2]] = nn.ravel()
    _, width = _spread(estimate, measurements, noisy, confidence)
    return float(width.max())


def _quantile_rank(m: Measurement, confidence: float) -> float:
    """The rank error (rows) the exponential mechanism keeps with probability >= confidence."""
    assert m.scale is not None and m.grid is not None and m.spec.p is not None
    candidates = m.grid.upper - m.grid.lower + 1
    b = m.spec.p.denominator
    # |R|·exp(-(b·r + 1)/(2·scale)) <= 1 - c  <=>  r >= (2·scale·ln(|R|/(1 - c)) - 1)/b
    return max((2 * float(m.scale) * math.log(candidates / (1 - confidence)) - 1) / b, 0.0)


def planned(
    analysis: Analysis, cal: Calibration, target: Target, confidence: float
) -> list[tuple[str, str, float, float]]:
    """(label, what, planned figure, target) for each estimate a target binds."""
    rows: list[tuple[str, str, float, float]] = []
    for i, est in enumerate(cal.estimates):
        label = _label(analysis, i)
        if est.kind == "quantile":
            if target.rank_error is not None:
                rank = _quantile_rank(cal.measurements[est.measurements[0]], confidence)
                rows.append((label, "rank error (rows)", rank, float(target.rank_error)))
            continue
        if target.halfwidth is None:
            continue
        h = float(target.halfwidth)
        ratio = est.kind == "avg" or est.kind in SPREAD_KINDS
        if ratio and target.min_group is not None:
            width = _ratio_width(est, cal.measurements, confidence, target.min_group)
            rows.append((label, f"± at >= {target.min_group} units", width, h))
            continue
        for j in est.measurements:
            m = cal.measurements[j]
            width = float(half_width(m, confidence) * m.unit)
            rows.append((label if not ratio else f"{label}: {m.label}", "±", width, h))
    return rows


def _round_up(x: Fraction) -> Fraction:
    """x > 0 rounded up to four significant decimal digits, exactly."""
    return decimal_up(x, 4)


def _least(fits: Callable[[Fraction], bool], top: Fraction) -> Fraction | None:
    """The least budget in (0, top], to four digits, that ``fits`` (a test that holds from some
    budget on), or None when even ``top`` does not."""

    def holds(b: Fraction) -> bool:
        try:
            return fits(b)
        except ParameterError:
            return False  # a noise scale past what can be sampled: far too little budget

    if not holds(top):
        return None
    lo, hi = math.log(float(top)) - 60.0, math.log(float(top))
    while hi - lo > 1e-6:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if holds(Fraction(math.exp(mid))) else (mid, hi)
    budget = min(_round_up(Fraction(math.exp(hi))), top)
    while not holds(budget):  # the rounding met a step of the discrete half-width
        budget = min(_round_up(budget * Fraction(1001, 1000)), top)
    return budget


class _Budgets:
    """Each measurement's least budget under a target: epsilon_j for a discrete Laplace or the
    exponential mechanism, rho_j for a discrete Gaussian."""

    def __init__(self, base: Calibration, confidence: float) -> None:
        self.base, self.ms, self.confidence = base, base.measurements, confidence
        self.gaussian = base.options.mechanism == "gaussian"
        self.pure = {j for j, m in enumerate(self.ms) if m.exponential or j == base.selection_at}
        self.need: dict[int, Fraction] = {}

    def is_gaussian(self, j: int) -> bool:
        return self.gaussian and j not in self.pure

    def top(self, j: int) -> Fraction:
        return MAX_QUERY_RHO if self.is_gaussian(j) else MAX_QUERY_EPSILON

    def at(self, j: int, b: Fraction) -> Measurement:
        """Measurement j with budget b: scale Δ/b, or variance d·Δ²/(2b) (Bun and Steinke
        2016, Prop. 1.6; CKS 2020, Theorem 14)."""
        m = self.ms[j]
        if self.is_gaussian(j):
            return replace(m, sigma2=calibration.sigma2_for(m.per_group, m.groups, b))
        return replace(m, scale=Fraction(m.sensitivity) / b)

    def require(self, j: int, b: Fraction | None, label: str) -> None:
        if b is None:
            unit = "rho" if self.is_gaussian(j) else "epsilon"
            raise ParameterError(
                f"the accuracy target of {label} needs more than {unit} "
                f"{decimal_text(self.top(j))}, the most one query may spend; loosen it (or, "
                "for a ratio, state a larger dpsql.min_group)"
            )
        self.need[j] = max(self.need.get(j, Fraction(0)), b)

    def rank(self, j: int, rows: int, label: str) -> None:
        def fits(b: Fraction) -> bool:
            return _quantile_rank(self.at(j, b), self.confidence) <= rows

        self.require(j, _least(fits, self.top(j)), label)

    def direct(self, j: int, h: Fraction, label: str) -> None:
        def fits(b: Fraction) -> bool:
            return half_width(self.at(j, b), self.confidence) * self.ms[j].unit <= h

        self.require(j, _least(fits, self.top(j)), label)

    def ratio(self, est: Estimate, h: Fraction, n: int, label: str) -> None:
        """The ratio's measurements in the optimal split's proportions, scaled together until
        the ± the release computes in groups of n units meets h."""
        weight = weights(self.base.estimates, len(self.ms))
        rel = shares(self.ms, weight, est.measurements, self.gaussian, "optimal")

        def scaled(t: Fraction) -> list[Measurement]:
            return [
                self.at(j, max(self.need.get(j, Fraction(0)), _round_up(t * rel[j])))
                if j in rel
                else m
                for j, m in enumerate(self.ms)
            ]

        def fits(t: Fraction) -> bool:
            return _ratio_width(est, scaled(t), self.confidence, n) <= float(h)

        t = _least(fits, max(self.top(j) for j in est.measurements))
        for j in est.measurements:
            self.require(j, None if t is None else _round_up(t * rel[j]), label)

    def options(self) -> QueryOptions:
        """The base options with these budgets (and what no target binds keeps its own)."""
        budgets = tuple(
            self.need[j] if j in self.need else (m.rho if self.is_gaussian(j) else m.epsilon)
            for j, m in enumerate(self.ms)
        )
        if self.gaussian:
            rho = sum((b for j, b in enumerate(budgets) if self.is_gaussian(j)), Fraction(0))
            return replace(self.base.options, rho=rho, budgets=budgets)
        return replace(self.base.options, epsilon=sum(budgets, Fraction(0)), budgets=budgets)


def _cost(cal: Calibration) -> Fraction:
    return Composite(cal.events, cal.certified).epsilon


def _single_gaussian(
    analysis: Analysis, budgets: _Budgets, target: Target, policy: Policy
) -> tuple[QueryOptions, Calibration] | None:
    """For one discrete Gaussian on one coordinate, the query's own epsilon searched instead:
    the planner calibrates it on its exact curve (CKS 2020, Theorem 7), which needs less than
    the zCDP route a rho budget takes. The same targets; None when it does not apply."""
    ms = budgets.ms
    if not budgets.gaussian or len(ms) != 1 or ms[0].groups != 1:
        return None
    base = budgets.base.options

    def at(epsilon: Fraction) -> Calibration:
        return calibrate(analysis, replace(base, epsilon=epsilon), policy)

    def fits(epsilon: Fraction) -> bool:
        rows = planned(analysis, at(epsilon), target, budgets.confidence)
        return all(fig <= goal for _, _, fig, goal in rows)

    epsilon = _least(fits, MAX_QUERY_EPSILON)
    if epsilon is None:
        return None
    options = replace(base, epsilon=epsilon)
    return options, at(epsilon)


def _refuse(options: QueryOptions) -> None:
    if options.rho is not None or options.sigma is not None:
        raise ParameterError(
            "an accuracy target sets the query's noise, as do dpsql.rho and dpsql.sigma: "
            "give one (RESET dpsql.rho, dpsql.sigma)"
        )
    if options.declared is not None:
        raise ParameterError(
            "an accuracy target would calibrate the noise, and the pld filter admits only its "
            "declared mechanism; RESET dpsql.halfwidth and dpsql.rank_error"
        )


def solve(
    analysis: Analysis, options: QueryOptions, policy: Policy, target: Target
) -> tuple[QueryOptions, list[str]]:
    """``options`` with each measurement's least budget that meets ``target`` (module
    docstring), and EXPLAIN's lines of it; raises ``ParameterError`` when a query may not
    spend enough to meet it (nothing is charged)."""
    _refuse(options)
    confidence = options.confidence
    # At the query's own epsilon: what no target binds keeps its budget from here.
    budgets = _Budgets(calibrate(analysis, options, policy), confidence)
    h = target.halfwidth
    for i, est in enumerate(budgets.base.estimates):
        label = _label(analysis, i)
        if est.kind == "quantile":
            if target.rank_error is not None:
                budgets.rank(est.measurements[0], target.rank_error, label)
        elif h is None:
            continue
        elif (est.kind == "avg" or est.kind in SPREAD_KINDS) and target.min_group is not None:
            budgets.ratio(est, h, target.min_group, label)
        else:
            for j in est.measurements:
                budgets.direct(j, h, label)
    if not budgets.need:
        raise ParameterError(
            "no accuracy target binds this query: dpsql.halfwidth binds counts, sums and "
            "ratios, dpsql.rank_error quantiles"
        )
    solved = budgets.options()
    cal = calibrate(analysis, solved, policy)
    exact = _single_gaussian(analysis, budgets, target, policy)
    if exact is not None and _cost(exact[1]) < _cost(cal):
        solved, cal = exact
    if _cost(cal) > MAX_QUERY_EPSILON:
        raise ParameterError(
            f"the accuracy target needs more than epsilon {decimal_text(MAX_QUERY_EPSILON)} in "
            "all, the most one query may spend; loosen it, or ask its outputs in separate queries"
        )
    rows = planned(analysis, cal, target, confidence)
    if not all(fig <= goal for _, _, fig, goal in rows):
        raise InternalError("the solved budgets do not meet the accuracy target")
    lines = [
        f"target: at {confidence:g} confidence, each measurement a target binds gets the least "
        "budget (to 4 digits) that meets it; the cost below is what is charged; noise only"
    ]
    lines.extend(
        f"target: {lab} {what} planned {fig:.6g} <= {goal:g}" for lab, what, fig, goal in rows
    )
    lines.extend(
        f"target: {budgets.ms[j].label} is bound by no target and keeps its budget at dpsql.epsilon"
        for j in range(len(budgets.ms))
        if j not in budgets.need
    )
    return solved, lines
