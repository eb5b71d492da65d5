"""The plan of a diagnosis: which flags a query's histogram of units carries, and its noise.

A diagnosis is one more measurement of the query, released with it in its one privacy event
(its ``Composite``), so the charge covers both before the engine runs and EXPLAIN shows its cost:

* its histogram has one cell per pattern of the k flags (``dpsql.bound.diagnosis``); each unit is
  in exactly one cell, so adding or removing a unit moves one cell by 1: L1 = L2 = 1 on one
  coordinate (the sensitivity of a histogram, Dwork, McSherry, Nissim, Smith 2006);
* it is a discrete Laplace of scale 1/epsilon_d (``dpsql.diagnose_epsilon``), pure
  epsilon_d-DP, whatever the query's mechanism: with the discrete Gaussian the query's certified
  pair grows by (epsilon_d, 0) (basic composition, Dwork and Roth 2014, Theorem 3.16);
* under the PLD filter it is the declared mechanism (a shift of 1 <= Delta on one coordinate is
  dominated by the declared one, ``dpsql.mechanisms.pld_lattice``): the declared noise, charged
  as one more declared measurement; a ``dpsql.diagnose_epsilon`` the analyst gave must ask for
  exactly that noise (Delta/scale with the Laplace; none with the Gaussian), else refused.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

from dpsql.analyze.analysis import Analysis
from dpsql.bound.diagnosis import diagnosis_query
from dpsql.bound.specs import Bounding, MeasurementSpec
from dpsql.errors import UndeclaredMechanismError
from dpsql.mechanisms.event_kinds import declared_event
from dpsql.mechanisms.events import Event
from dpsql.mechanisms.laplace_events import DiscreteLaplace
from dpsql.plan.plans import Diagnosis, Measurement, QueryOptions
from dpsql.policy.numbers import decimal_text
from dpsql.sql.parse import DIALECT

__all__ = ["LABEL", "plan_diagnosis"]

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
    # One unit, one cell: per_group 1 on 1 coordinate (L1 = L2 = 1).
    histogram = Measurement(MeasurementSpec("units"), LABEL, 1, 1, Fraction(1))
    return Diagnosis(tuple(flags), tuple(limits), histogram, sql)


def plan_diagnosis(
    analysis: Analysis, bounding: Bounding, options: QueryOptions, l0: int, c: int
) -> tuple[Diagnosis, Event]:
    """The diagnosis of a query with effective bounds (l0, c) and its event."""
    diagnosis = _flags(analysis, bounding, l0, c, options.max_rows_per_unit)
    m = diagnosis.measurement
    declared = options.declared
    if declared is None:
        # Discrete Laplace with scale 1/epsilon_d on an L1 = 1 histogram: epsilon_d-DP.
        scale = 1 / options.diagnose_epsilon
        event: Event = DiscreteLaplace(scale, Fraction(1), LABEL, dimensions=1)
        measured = replace(m, scale=scale)
        return replace(diagnosis, measurement=measured, epsilon=event.epsilon), event
    noise = declared_event(declared)
    asked = "diagnose_epsilon" in options.asked
    if isinstance(noise, DiscreteLaplace):
        if asked and options.diagnose_epsilon != noise.epsilon:
            raise UndeclaredMechanismError(
                f"dpsql.diagnose_epsilon = {decimal_text(options.diagnose_epsilon)} asks for "
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
