"""The plan of a diagnosis: which flags a query's histogram of units carries, and its noise.

A diagnosis is one more measurement of the query, released with it in its one privacy event
(its ``Composite``), so the charge covers both before the engine runs and EXPLAIN shows its cost:

* its histogram has one cell per pattern of the k flags (``dpsql.bound.diagnosis``); each unit is
  in exactly one cell, so adding or removing a unit moves one cell by 1: L1 = L2 = 1 on one
  coordinate (the sensitivity of a histogram, Dwork, McSherry, Nissim, Smith 2006);
* it is a discrete Laplace of scale 1/epsilon_d, pure epsilon_d-DP, where epsilon_d is
  ``dpsql.diagnose_epsilon`` when the analyst set it, else the policy's ``diagnose_share`` of the
  query's own epsilon (before the diagnosis; rounded down to six significant digits, which can
  only lower the loss, and charged as rounded), whatever the query's mechanism: with the
  discrete Gaussian the query's certified pair grows by (epsilon_d, 0) (basic composition,
  Dwork and Roth 2014, Theorem 3.16);
* under the PLD filter it is the declared mechanism (a shift of 1 <= Delta on one coordinate is
  dominated by the declared one, ``dpsql.mechanisms.pld_lattice``): the declared noise, charged
  as one more declared measurement; a ``dpsql.diagnose_epsilon`` the analyst gave must ask for
  exactly that noise (Delta/scale with the Laplace; none with the Gaussian), else refused.
"""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction

from sqlglot import exp

from dpsql.analyze.analysis import Analysis
from dpsql.bound.diagnosis import diagnosis_query
from dpsql.bound.specs import Bounding, MeasurementSpec
from dpsql.bound.together import diagnosed_query
from dpsql.errors import InternalError, UndeclaredMechanismError
from dpsql.mechanisms.event_kinds import declared_event
from dpsql.mechanisms.events import Composite, Event
from dpsql.mechanisms.laplace_events import DiscreteLaplace
from dpsql.plan.plans import Diagnosis, Measurement, Plan, QueryOptions
from dpsql.policy.numbers import decimal_text
from dpsql.sql.parse import DIALECT

__all__ = ["LABEL", "plan_diagnosis", "share_of", "without_default"]

LABEL = "diagnosis of the bounds (flag patterns of the units)"


def _flags(analysis: Analysis, bounding: Bounding, l0: int, c: int, r: int | None) -> Diagnosis:
    flags: list[str] = []
    limits: list[tuple[str, int]] = []
    if analysis.keys:
        flags.append("L0")
        limits.append(("L0", l0))
    flags.append("C")
    limits.append(("C", c))
    if r is not None:
        flags.append("R")
        limits.append(("R", r))
    if any(v.grid is not None for v in bounding.values):
        flags.append("clamped")
    sql = diagnosis_query(analysis, bounding, flags, dict(limits)).sql(dialect=DIALECT, copy=False)
    together, width = diagnosed_query(analysis, bounding, flags, dict(limits))
    # One unit, one cell: per_group 1 on 1 coordinate (L1 = L2 = 1).
    histogram = Measurement(MeasurementSpec("units"), LABEL, 1, 1, Fraction(1))
    return Diagnosis(
        tuple(flags),
        tuple(limits),
        histogram,
        sql,
        table=analysis.table,
        keys=_keys(analysis),
        together_sql=together.sql(dialect=DIALECT, copy=False),
        width=width,
    )


def _keys(analysis: Analysis) -> tuple[str, ...]:
    """The columns the GROUP BY keys read, which an ESTIMATE BOUNDS GROUP BY would name."""
    names = (c.name for k in analysis.keys for c in k.expr.find_all(exp.Column))
    return tuple(dict.fromkeys(names))


def share_of(epsilon: Fraction, share: Fraction) -> Fraction:
    """``share`` of ``epsilon``, rounded down to six significant digits (never up: a smaller
    epsilon_d is less loss) when its denominator is long, so its noise scale stays short."""
    exact = epsilon * share
    if exact.denominator <= 10**6:
        return exact
    digits = 6 - math.floor(math.log10(exact))
    return Fraction(math.floor(exact * 10**digits), 10**digits)


def plan_diagnosis(
    analysis: Analysis,
    bounding: Bounding,
    options: QueryOptions,
    bounds: tuple[int, int],
    query_epsilon: Fraction,
) -> tuple[Diagnosis, Event]:
    """The diagnosis of a query with effective bounds (l0, c), whose own loss is
    ``query_epsilon``, and its event."""
    diagnosis = _flags(analysis, bounding, *bounds, options.max_rows_per_unit)
    m = diagnosis.measurement
    declared = options.declared
    if declared is None:
        epsilon = options.diagnose_epsilon
        if epsilon is None:
            epsilon = share_of(query_epsilon, options.diagnose_share)
        # Discrete Laplace with scale 1/epsilon_d on an L1 = 1 histogram: epsilon_d-DP.
        scale = 1 / epsilon
        event: Event = DiscreteLaplace(scale, Fraction(1), LABEL, dimensions=1)
        measured = replace(m, scale=scale)
        share = options.diagnose_share if options.diagnose_epsilon is None else None
        return replace(diagnosis, measurement=measured, epsilon=event.epsilon, share=share), event
    noise = declared_event(declared)
    asked = "diagnose_epsilon" in options.asked
    if isinstance(noise, DiscreteLaplace):
        given = options.diagnose_epsilon
        if asked and given is not None and given != noise.epsilon:
            raise UndeclaredMechanismError(
                f"dpsql.diagnose_epsilon = {decimal_text(given)} asks for "
                "other noise than the pld filter's declared mechanism gives the diagnosis, "
                f"epsilon {decimal_text(noise.epsilon)}; SET dpsql.diagnose_epsilon = "
                f"{decimal_text(noise.epsilon)}, or RESET it"
            )
        measured = replace(m, scale=noise.scale)
        return replace(diagnosis, measurement=measured, epsilon=noise.epsilon), replace(
            noise, label=LABEL
        )
    else:
        if asked:
            raise UndeclaredMechanismError(
                "dpsql.diagnose_epsilon would calibrate the diagnosis's noise, and the pld "
                "filter admits only its declared discrete Gaussian; RESET dpsql.diagnose_epsilon"
            )
        measured = replace(m, sigma2=noise.sigma2)
    return replace(diagnosis, measurement=measured), replace(noise, label=LABEL)


def without_default(plan: Plan) -> Plan:
    """``plan`` without the diagnosis the policy's default gave it (one the analyst asked for
    stays): what a workload family shares a measurement from. The event loses exactly the
    diagnosis's event, its last (``dpsql.plan.planner``); a plan whose certified pair counts the
    diagnosis in (a Gaussian's) keeps it, as the family takes only the Laplace's."""
    if plan.diagnosis is None or plan.options.diagnose_asked or plan.event.certified is not None:
        return plan
    events = plan.event.events[:-1]
    if plan.event.events[-1].label != LABEL:
        raise InternalError("a diagnosed plan's last event is not its diagnosis")
    event = Composite(events, None, plan.event.cell)
    options = replace(plan.options, diagnose=False)
    return replace(plan, diagnosis=None, event=event, options=options)
