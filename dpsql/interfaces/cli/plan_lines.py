"""The cost plan of a file, as ``dpsql run`` and ``dpsql explain`` print it before anything runs.

One line per statement (its kind, its independent cost, where its answer comes from, and its
predicted half-width under the joint plan against its own), then the file's one charge, each
family of the joint plan with its measurements, and whether the budget's filter admits it."""

from __future__ import annotations

import math
from collections.abc import Sequence

from dpsql.accounting.budget.report import left_text
from dpsql.plan.aggregates.registry import rule_of
from dpsql.plan.estimators import half_width
from dpsql.policy.numbers import exact
from dpsql.session.workload_plan import (
    Session,
    Step,
    Workload,
    bounded_at,
    one_line,
    statement_totals,
)


def _joint_text(step: Step) -> str:
    """A statement's predicted accuracy under the joint plan against its independent one."""
    if step.ratio is None or step.plan is None:
        return "-"
    factor = math.sqrt(step.ratio)
    plan = step.plan
    estimates = plan.estimates
    if len(estimates) == 1 and rule_of(estimates[0].kind).total:
        m = plan.measurements[estimates[0].measurements[0]]
        alone = float(half_width(m, plan.options.confidence) * m.unit)
        return f"±{alone:.4g} -> ±{alone * factor:.4g} (x{factor:.3f})"
    return f"x{factor:.3f} of its half-widths"


def plan_lines(session: Session, name: str, given: Sequence[Step] | Workload) -> list[str]:
    """The cost plan of a file, as printed by ``dpsql run`` before anything runs."""
    workload = given if isinstance(given, Workload) else None
    steps = list(given.steps) if isinstance(given, Workload) else list(given)
    lines = [f"plan of {name}: {len(steps)} statement(s)"]
    lines.append(
        f"{'#':>3}  {'line':>4}  {'kind':<8}  {'epsilon':<10}  {'delta':<12}  {'source':<26}  "
        "joint plan (predicted half-width, independent -> joint)  statement"
    )
    for s in steps:
        event = s.plan.event if s.plan is not None else s.event
        cost = (exact(event.epsilon), exact(event.delta)) if event is not None else ("-", "-")
        source = s.source + (f" ({s.note})" if s.note else "")
        joint = _joint_text(s) + (f" [family at {s.family}]" if s.family is not None else "")
        lines.append(
            f"{s.piece.number:>3}  {s.piece.line:>4}  {s.kind:<8}  {cost[0]!s:<10}  "
            f"{cost[1]!s:<12}  {source:<26}  {joint:<55}  {one_line(s.piece.text)}"
        )
    eps, delta = statement_totals(steps, "charge")
    report = session.budget()
    refused = [s.piece.number for s in steps if s.source == "refused"]
    lines.append(
        f"to charge (basic composition, the sum): epsilon {exact(eps)}, delta {exact(delta)}, "
        "in one charge for the whole file, before anything runs"
    )
    if workload is not None:
        for family in workload.joint.families:
            numbers = ", ".join(str(steps[m.index].piece.number) for m in family.members)
            at = bounded_at(steps, family)
            lines.append(
                f"joint: statements {numbers} bounded once at the grouping of statement {at} "
                f"(L0 = {family.fine.max_groups}, C = {family.fine.max_rows}), each member at "
                "its own bounds; measured:"
            )
            for t in family.taken:
                m = t.measurement
                lines.append(
                    f"  {m.label}: L1 sensitivity {m.sensitivity * m.unit}, "
                    f"epsilon {exact(t.epsilon)}"
                )
            total = sum(family.ratios)
            lines.append(
                f"  variance over the independent plans, summed over these {len(family.ratios)} "
                f"statement(s): {total:.3f} (least squares, released unrounded: children sum "
                "to parents)"
            )
        ratios = [
            s.ratio if s.ratio is not None else 1.0
            for s in steps
            if s.charged and s.kind == "query"
        ]
        if ratios:
            lines.append(
                f"joint plan: the sum over the {len(ratios)} charged queries of (joint variance / "
                f"independent variance) is {sum(ratios):.3f} (independent: {len(ratios)})"
            )
    lines.append(
        f"remaining under the {report.accountant} filter: epsilon "
        f"{left_text(report.epsilon_remaining)}, delta {left_text(report.delta_remaining)}"
    )
    if refused:
        listed = ", ".join(map(str, refused))
        lines.append(f"fits: no: the {report.accountant} filter refuses statement(s) {listed}")
    else:
        lines.append(f"fits: yes (the whole file admitted by the {report.accountant} filter)")
    return lines
