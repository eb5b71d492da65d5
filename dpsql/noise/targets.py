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
  every noisy count n from N - k_N to 2(N + k_N), every centred sum in ±(w·(n + k_N) + k_S)
  and every centred sum of squares in [-k_Q, w²·(n + k_N) + k_Q], over a grid of them (beyond
  it every term of the width shrinks as 1/n). So in a group of at least N units the released
  ± meets the target with probability at least the confidence, up to the grid's resolution
  (measured: tests/test_targets.py, on data at the bounds, where the width is largest);
* a quantile with ``rank_error`` = r: the exponential mechanism picks a candidate whose score
  exceeds b·r (b the denominator of p: the target rank is within r rows of the ranks the
  candidate spans) with probability at most |R|·exp(-(b·r + 1)/(2·scale)), since the best
  candidate scores 0 and scores are integers (McSherry and Talwar 2007, Theorem 6's argument):
  at most 1 - confidence.

Every figure falls as epsilon grows, so a bisection on log(epsilon) finds the cheapest epsilon
that meets every target; it is rounded up to four significant digits (an exact decimal, at
most 0.1% above the cheapest) and checked again, and that epsilon is what the plan shows and
the query is charged. The split inside the query is the query's own (``dpsql.split``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np

from dpsql.errors import ParameterError
from dpsql.noise.release_estimates import _avg, _spread, half_width
from dpsql.plan.planner import Calibration, Estimate, QueryOptions, calibrate
from dpsql.policy import MAX_QUERY_EPSILON, Policy
from dpsql.policy_numbers import decimal_text
from dpsql.sql.analyze import SPREAD_KINDS, Analysis

__all__ = ["Target", "solve"]

# The smallest epsilon searched: below it no target short of the whole range of a value is met.
_FLOOR = Fraction(1, 10**9)
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


def _ratio_width(estimate: Estimate, cal: Calibration, confidence: float, n: int) -> float:
    """The largest half-width the release computes for a ratio in a group of at least ``n``
    units, over the noisy values within their joint half-widths (module docstring)."""
    grid = estimate.grid
    assert grid is not None
    parts = len(estimate.measurements)
    joint = math.sqrt(confidence) if parts == 2 else math.nextafter(confidence ** (1 / 3), 1.0)
    k = [half_width(cal.measurements[j], joint) for j in estimate.measurements]
    w = grid.width  # a centred row value lies in ±width units of g/2
    # Noisy counts from N - k_N up: the width is not monotone in the count near a variance of
    # 0, so counts up to twice N + k_N are checked too (beyond, every term shrinks as 1/count).
    counts = np.unique(np.geomspace(max(n - k[-1], 1), 2 * (n + k[-1]), _COUNTS).round())
    worst = 0.0
    for count in counts:
        units = count + k[-1]  # the most units a group of this noisy count can hold
        s = np.linspace(-(w * units + k[-2]), w * units + k[-2], _POINTS)
        noisy: list[list[int]] = [[] for _ in cal.measurements]
        if parts == 2:
            noisy[estimate.measurements[0]] = [int(v) for v in np.round(s)]
            noisy[estimate.measurements[1]] = [int(count)] * s.size
            _, width = _avg(estimate, cal.measurements, noisy, confidence)
        else:
            # By noisy mean m = S/n and variance v = Q/n - m²: the width is steepest near v = 0
            # (STDDEV's square root), so small and slightly negative v are dense in the grid.
            m = s / count
            top = float(w * w)
            v = np.concatenate(
                (
                    -k[0] / count * np.array([1.0, 0.5, 0.1, 0.01]),
                    [0.0],
                    np.geomspace(top * 1e-9, top + k[0] / count, _POINTS),
                )
            )
            mm, vv = np.meshgrid(m, v)
            q = count * (vv + mm * mm)
            noisy[estimate.measurements[0]] = [int(x) for x in np.round(q.ravel())]
            noisy[estimate.measurements[1]] = [int(x) for x in np.round((mm * count).ravel())]
            noisy[estimate.measurements[2]] = [int(count)] * q.size
            _, width = _spread(estimate, cal.measurements, noisy, confidence)
        worst = max(worst, float(width.max()))
    return worst


def _quantile_rank(cal: Calibration, j: int, confidence: float) -> float:
    """The rank error (rows) the exponential mechanism keeps with probability >= confidence."""
    m = cal.measurements[j]
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
                rank = _quantile_rank(cal, est.measurements[0], confidence)
                rows.append((label, "rank error (rows)", rank, float(target.rank_error)))
            continue
        if target.halfwidth is None:
            continue
        h = float(target.halfwidth)
        ratio = est.kind == "avg" or est.kind in SPREAD_KINDS
        if ratio and target.min_group is not None:
            width = _ratio_width(est, cal, confidence, target.min_group)
            rows.append((label, f"± at >= {target.min_group} units", width, h))
            continue
        for j in est.measurements:
            m = cal.measurements[j]
            width = float(half_width(m, confidence) * m.unit)
            rows.append((label if not ratio else f"{label}: {m.label}", "±", width, h))
    return rows


def _meets(analysis: Analysis, cal: Calibration, target: Target, confidence: float) -> bool:
    try:
        return all(fig <= goal for _, _, fig, goal in planned(analysis, cal, target, confidence))
    except ParameterError:
        # So little epsilon that a noise scale is past what can be sampled: not met. (The
        # query's own errors surface at the largest epsilon, checked first.)
        return False


def _round_up(x: Fraction) -> Fraction:
    """x rounded up to four significant decimal digits, exactly."""
    digits = 3 - math.floor(math.log10(x))
    scale = Fraction(10) ** digits
    return Fraction(math.ceil(x * scale)) / scale


def solve(
    analysis: Analysis, options: QueryOptions, policy: Policy, target: Target
) -> tuple[QueryOptions, list[str]]:
    """``options`` with the cheapest epsilon that meets ``target``, and EXPLAIN's lines of it;
    raises ``ParameterError`` when no epsilon a query may spend meets it (nothing charged)."""
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
    confidence = options.confidence

    def at(epsilon: Fraction) -> Calibration:
        return calibrate(analysis, replace(options, epsilon=epsilon), policy)

    top = at(MAX_QUERY_EPSILON)
    if not planned(analysis, top, target, confidence):
        raise ParameterError(
            "no accuracy target binds this query: dpsql.halfwidth binds counts, sums and "
            "ratios, dpsql.rank_error quantiles"
        )
    if not _meets(analysis, top, target, confidence):
        raise ParameterError(
            f"the accuracy target needs more than epsilon {decimal_text(MAX_QUERY_EPSILON)}, "
            "the most one query may spend; loosen it (or, for a ratio, state a larger "
            "dpsql.min_group)"
        )
    lo, hi = math.log(float(_FLOOR)), math.log(float(MAX_QUERY_EPSILON))
    if _meets(analysis, at(_FLOOR), target, confidence):
        hi = lo
    while hi - lo > 1e-5:
        mid = (lo + hi) / 2
        if _meets(analysis, at(Fraction(math.exp(mid))), target, confidence):
            hi = mid
        else:
            lo = mid
    epsilon = min(_round_up(Fraction(math.exp(hi))), MAX_QUERY_EPSILON)
    cal = at(epsilon)
    while not _meets(analysis, cal, target, confidence):  # rounding met a non-monotone step
        epsilon = min(_round_up(epsilon * Fraction(1001, 1000)), MAX_QUERY_EPSILON)
        cal = at(epsilon)
    lines = [
        f"target: at {confidence:g} confidence, epsilon {decimal_text(epsilon)} is the "
        "cheapest (to 4 digits) that meets it, and what is charged; the noise only"
    ]
    for label, what, figure, goal in planned(analysis, cal, target, confidence):
        lines.append(f"target: {label} {what} planned {figure:.6g} <= {goal:g}")
    return replace(options, epsilon=epsilon), lines
