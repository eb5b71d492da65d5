"""What EXPLAIN prints: concise by default, every exact figure with ``EXPLAIN VERBOSE``.

Both forms are read off the plan alone (public numbers: nothing runs, nothing is charged):

* concise: the table and unit, the bounds, the keys, then per measurement its mechanism, its
  epsilon (or rho) and share of the query's, and the half-width of its noise at the
  confidence (the ± every value built on it starts from); partition selection, the diagnosis
  and its cost, an accuracy target, a sample, the cost;
* verbose: the same, with each measurement's sensitivity and noise scale as exact fractions
  (``Plan.explain``), the diagnosis's every line, the bounding steps skipped, and the bounded
  SQL the engine would run.
"""

from __future__ import annotations

import math
from fractions import Fraction

from dpsql.plan.aggregates.quantiles import endpoint_shift
from dpsql.plan.estimators import half_width
from dpsql.plan.plans import Measurement, Plan, share_text
from dpsql.policy.numbers import decimal_text

__all__ = ["explain"]


def explain(plan: Plan, verbose: bool = False) -> list[str]:
    """EXPLAIN's lines of ``plan`` (module docstring)."""
    confidence = plan.options.confidence
    if plan.auto is not None:
        # Bounds chosen after the charge: no chosen value, sensitivity or ± before it.
        lines = plan.explain(sql=verbose)
        if not verbose:
            lines[-1] = "(EXPLAIN VERBOSE: the selection's SQL)"
        return lines
    if verbose:
        lines = plan.explain(sql=True)
        at = len(plan.head()) + len(plan.skipped)
        for i, m in enumerate(plan.measurements):
            lines[at + i] += _noise(m, confidence)
        return lines
    lines = plan.head()
    lines.extend(_concise(m) + _noise(m, confidence) for m in plan.measurements)
    lines.extend(plan.selection_lines())
    if plan.diagnosis is not None:
        lines.append(plan.diagnosis.explain()[-1])
    lines.extend(plan.targets)
    if plan.sample is not None:
        lines.extend(plan.sample.explain())
    lines.append(plan.cost_line())
    lines.append("(EXPLAIN VERBOSE: the exact sensitivities and scales, and the bounded SQL)")
    return lines


def _concise(m: Measurement) -> str:
    share = share_text(m, "Gaussian rho" if m.sigma2 is not None else "epsilon")
    if m.exponential:
        aim = ""
        if m.spec.side:
            # A quantile interval's end (public: its scale, grid, p and the confidence).
            where = "below" if m.spec.side < 0 else "above"
            aim = (
                f", aimed {endpoint_shift(m)} rows {where} the target rank (covers at "
                f"{m.spec.confidence:.4g})"
            )
        return (
            f"measurement {m.label}: exponential mechanism, epsilon {_short(m.epsilon)}{aim}{share}"
        )
    if m.scale is not None:
        return f"measurement {m.label}: discrete Laplace, epsilon {_short(m.epsilon)}{share}"
    return f"measurement {m.label}: discrete Gaussian, rho {_short(m.rho)}{share}"


def _noise(m: Measurement, confidence: float) -> str:
    """The half-width of the measurement's noise in its values' units, rounded up (a quantile's
    exponential mechanism has none: its error is in ranks, shown with its value)."""
    if m.exponential:
        return ""
    width = half_width(m, confidence) * m.unit
    return f"; noise ± {_up(width)} at {100 * confidence:.4g}%"


def _short(value: Fraction) -> str:
    """An epsilon or rho in at most four significant digits, exact when it is that short."""
    text = decimal_text(value)
    return text if len(text) <= 8 else f"{float(value):.4g}"


def _up(value: Fraction) -> str:
    """A half-width in three significant digits, rounded up: never shown tighter than it is."""
    if value <= 0:
        return "0"
    step = Fraction(10) ** (math.floor(math.log10(value)) - 2)
    rounded = math.ceil(value / step) * step
    return decimal_text(rounded) if rounded.denominator != 1 else str(rounded.numerator)
