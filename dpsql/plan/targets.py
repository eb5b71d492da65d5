"""Accuracy targets: the cheapest epsilon whose planned noise meets them (``dpsql.halfwidth``,
``dpsql.rank_error``, ``dpsql.min_group``; docs/sql.md).

A target is met on public quantities only: the sensitivities, the grid, the confidence and the
numbers the analyst states; never a count, sum or metadata of the data. What a target binds of
each aggregate is its kind's rule (``dpsql.plan.aggregates.rule``: ``Linear``, ``Ratio``,
``Rank``), as figures that are functions of the noise's parameters, which are functions of
epsilon:

* a count or sum: the exact noise half-width of its measurement at the session's confidence
  (``half_width``, the discrete distribution actually sampled) is at most ``halfwidth``;
* AVG, VARIANCE, STDDEV without ``min_group``: the target binds each of their measurements (a
  centred sum, a count, a centred sum of squares), each in its own units, as if released;
* the same with ``min_group`` = N: the half-width the release computes (the rule's own
  estimator) is at most ``halfwidth`` wherever the noisy values can fall in a group of at least
  N units (``dpsql.plan.aggregates.ratios``), with probability at least the confidence;
* a quantile with ``rank_error`` = r: the exponential mechanism's rank error exceeds r with
  probability at most 1 - confidence (``dpsql.plan.aggregates.quantiles``).

Each figure falls as its measurement's budget grows, so each measurement a target binds gets
the least budget that meets it, found by bisection on its logarithm and rounded up to four
significant digits (an exact decimal, at most 0.1% above the least), and checked again: epsilon_j
for a discrete Laplace or an exponential mechanism, rho_j for a discrete Gaussian. A figure of
several measurements (a ratio's, with ``min_group``) scales them together, in the optimal
split's proportions (``dpsql.plan.split``). A measurement no target binds (partition selection,
a quantile without ``rank_error``) keeps its budget at the query's own epsilon. The query's cost
is the sequential composition of these budgets (the epsilons add; the rhos add, converted with
the pure parts' epsilon by CKS Corollary 13): for counts, sums and quantiles the least any split
meets the targets at, each measurement having the least it can; for a ratio the least along the
optimal split's proportions. That is what EXPLAIN shows and the query is charged.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from fractions import Fraction

from dpsql.analyze.analysis import Analysis
from dpsql.errors import InternalError, ParameterError
from dpsql.mechanisms.events import Composite
from dpsql.plan import calibration
from dpsql.plan.aggregates.registry import rule_of
from dpsql.plan.aggregates.rule import Check, Goal
from dpsql.plan.planner import Calibration, calibrate
from dpsql.plan.plans import Measurement, QueryOptions
from dpsql.plan.split import shares
from dpsql.policy import Policy
from dpsql.policy.numbers import MAX_QUERY_EPSILON, MAX_QUERY_RHO, decimal_text, decimal_up

__all__ = ["MAX_RATIO_TARGETS", "Target", "solve"]

# Distinct ratio figures (AVG, VARIANCE, STDDEV under dpsql.min_group) one query's target binds:
# each is a bisection over a grid of noisy values (benchmarks/planning.py).
MAX_RATIO_TARGETS = 6


@dataclass(frozen=True)
class Target:
    """The targets of one query and what they bind."""

    halfwidth: Fraction | None
    rank_error: int | None
    min_group: int | None


def _checks(analysis: Analysis, cal: Calibration, target: Target, confidence: float) -> list[Check]:
    """The figures ``target`` bounds, in the order of the query's aggregates: what each one's
    rule binds, under the setting that binds it (none when that setting is not given)."""
    checks: list[Check] = []
    for agg, est in zip(analysis.aggregates, cal.estimates, strict=True):
        rule = rule_of(est.kind)
        binding = rule.binding
        goal = target.rank_error if binding.setting == "rank_error" else target.halfwidth
        if goal is not None:
            asked = Goal(Fraction(goal), target.min_group, confidence)
            checks.extend(binding.checks(est, rule.name(agg), cal.measurements, asked))
    return checks


def planned(
    analysis: Analysis, cal: Calibration, target: Target, confidence: float
) -> list[tuple[str, str, float, float]]:
    """(label, what, planned figure, target) for each figure a target binds."""
    return [
        (c.label if c.part is None else f"{c.label}: {c.part}", c.what,
         float(c.figure(cal.measurements)), float(c.goal))
        for c in _checks(analysis, cal, target, confidence)
    ]  # fmt: skip


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
        # A check's least budget by what it depends on (``_signature``): a query of many
        # aggregates alike (250 STDDEVs of one column) bisects once, not once each.
        self.solved: dict[tuple[object, ...], Fraction | None] = {}
        self.searches = 0  # bisections run, for the tests

    def _signature(self, check: Check, *parts: object) -> tuple[object, ...]:
        """What the least budget of ``check`` is a function of: its figure's own parameters
        (``Check.key``), its goal, and its measurements but for their names and budgets."""

        def alike(m: Measurement) -> str:
            return repr(replace(m, label="", spec=replace(m.spec, value=None), scale=None,
                                sigma2=None))  # fmt: skip

        shown = tuple(alike(self.ms[j]) for j in check.measurements)
        gaussian = tuple(self.is_gaussian(j) for j in check.measurements)
        return (check.key, check.goal, self.confidence, shown, gaussian, *parts)

    def _least(self, signature: tuple[object, ...], fits: Callable[[Fraction], bool],
               top: Fraction) -> Fraction | None:  # fmt: skip
        if not signature[0]:  # a check of no key: its figure reads more than is known here
            self.searches += 1
            return _least(fits, top)
        if signature not in self.solved:
            self.searches += 1
            self.solved[signature] = _least(fits, top)
        return self.solved[signature]

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

    def one(self, check: Check) -> None:
        """The least budget of the check's one measurement that meets it."""
        (j,) = check.measurements

        def fits(b: Fraction) -> bool:
            trial = list(self.ms)
            trial[j] = self.at(j, b)
            return check.figure(trial) <= check.goal

        self.require(j, self._least(self._signature(check), fits, self.top(j)), check.label)

    def together(self, check: Check) -> None:
        """The check's measurements in the optimal split's proportions, scaled together until
        the figure (a ratio's ± in groups of at least n units) meets the goal."""
        rel = shares(
            self.ms, self.base.estimates, check.measurements, self.gaussian, "min_total_variance"
        )

        def scaled(t: Fraction) -> list[Measurement]:
            return [
                self.at(j, max(self.need.get(j, Fraction(0)), _round_up(t * rel[j])))
                if j in rel
                else m
                for j, m in enumerate(self.ms)
            ]

        def fits(t: Fraction) -> bool:
            return check.figure(scaled(t)) <= check.goal

        js = check.measurements
        signature = self._signature(
            check, tuple(rel[j] for j in js), tuple(self.need.get(j) for j in js)
        )
        t = self._least(signature, fits, max(self.top(j) for j in js))
        for j in check.measurements:
            self.require(j, None if t is None else _round_up(t * rel[j]), check.label)

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
    # The solver searches each measurement's own budget: Q, S and N of a variance, each its own.
    options = replace(options, joint_moments=False)
    confidence = options.confidence
    # At the query's own epsilon: what no target binds keeps its budget from here.
    budgets = _Budgets(calibrate(analysis, options, policy), confidence)
    checks = _checks(analysis, budgets.base, target, confidence)
    # A ratio's figure (with min_group) is searched over a grid of noisy values at each step of
    # the bisection: refused before any search past this many distinct ones (those alike are
    # solved once, ``_Budgets._signature``).
    ratios = {budgets._signature(c) for c in checks if len(c.measurements) > 1}
    if len(ratios) > MAX_RATIO_TARGETS:
        raise ParameterError(
            f"an accuracy target with dpsql.min_group binds more than {MAX_RATIO_TARGETS} "
            "differently bounded AVG, VARIANCE or STDDEV aggregates in one query; ask them in "
            "separate queries"
        )
    for check in checks:
        if len(check.measurements) == 1:
            budgets.one(check)
        else:
            budgets.together(check)
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
