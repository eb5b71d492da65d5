"""Totals: COUNT(*), COUNT(x), COUNT(DISTINCT unit), COUNT(DISTINCT x) and SUM(x).

Each is one noisy measurement released in its value units (1 for counts, the grid step g for a
sum), as the exact integer total plus discrete noise; its half-width is the exact quantile of
the discrete distribution sampled (``dpsql.plan.estimators.half_width``), so the interval covers
the noise only, not the bias of clamping and contribution bounds. Its weight in the optimal
split is its own variance's: 1. ``linear`` is the estimator of any aggregate that is a fixed
multiple of one measurement.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from dpsql.analyze.analysis import Aggregate
from dpsql.bound.grid import value_grid
from dpsql.bound.specs import MeasurementKind, MeasurementSpec, ValueRole
from dpsql.plan.aggregates.rule import (
    AggregateRule,
    Builder,
    Estimator,
    Linear,
    Measure,
    NonNegative,
    Released,
    Weights,
)
from dpsql.plan.estimators import half_width
from dpsql.plan.plans import Estimate, Measurement
from dpsql.sql.aggregates import AggregateKind

_INT64 = (-(2**63), 2**63 - 1)


def _integers(raw: Sequence[Any]) -> Any:
    """Exact noisy totals as int64 where every one is an integer that fits (released as
    BIGINT, whatever the values), else as they are (integers past 64 bits; a workload's
    combined, unrounded estimates)."""
    if all(type(v) is int and _INT64[0] <= v <= _INT64[1] for v in raw):
        return np.array(raw, dtype=np.int64)
    return np.array(raw, dtype=object)


def linear(factor: Fraction = Fraction(1)) -> Estimator:
    """The estimator ``factor`` times the estimate's one noisy measurement, in value units, with
    ``|factor|`` times its exact half-width: exact integers where the measurement counts in
    units of 1 and ``factor`` is whole, floats otherwise."""

    def estimate(
        est: Estimate,
        measurements: Sequence[Measurement],
        noisy: Sequence[npt.ArrayLike],
        confidence: float,
    ) -> Released:
        (j,) = est.measurements
        m = measurements[j]
        raw = cast(Sequence[Any], noisy[j])
        # A whole factor keeps integers integers (a Fraction would make a count a rational).
        scaled = (
            [v * factor.numerator for v in raw]
            if factor.denominator == 1
            else [v * factor for v in raw]
        )
        width = np.full(len(raw), float(half_width(m, confidence) * m.unit * abs(factor)))
        if m.unit == 1 and factor.denominator == 1:
            return _integers(scaled), width
        if all(type(v) is int for v in raw):
            # The same floats, without a Fraction per value: int / int is correctly rounded,
            # as float() of the exact rational v * factor * unit is (10,000 groups: 19 ms to 2).
            whole = factor * m.unit
            p, q = whole.numerator, whole.denominator
            return np.array([v * p / q for v in raw], dtype=np.float64), width
        return np.array([float(v * m.unit) for v in scaled], dtype=np.float64), width

    return estimate


def one_each(estimate: Estimate) -> tuple[Fraction, ...]:
    """The optimal split's weight of a total's measurement: its own variance."""
    return (Fraction(1),)


def _on(kind: MeasurementKind, role: ValueRole | None = None) -> Measure:
    """One measurement of ``kind``: of the rows (role None), or of the aggregate's argument
    listed in ``role`` (counted for ``value``, its distinct values for ``distinct``)."""

    def measure(agg: Aggregate, builder: Builder) -> Estimate:
        if role is None:
            return Estimate(agg.kind, (builder.measure(MeasurementSpec(kind)),), None)
        assert agg.arg is not None
        value = builder.value(agg.arg, None, role)
        return Estimate(agg.kind, (builder.measure(MeasurementSpec(kind, value)),), None)

    return measure


def _sum(agg: Aggregate, builder: Builder) -> Estimate:
    """SUM(x): the exact sum of x on its grid (units of g), DESIGN.md section 3."""
    assert agg.arg is not None and agg.bounds is not None
    grid = value_grid(agg.bounds)
    value = builder.value(agg.arg, grid)
    return Estimate(agg.kind, (builder.measure(MeasurementSpec("sum", value)),), grid)


def _always(est: Estimate) -> bool:
    return True  # a count of rows, units or values


def _bounded_at_zero(est: Estimate) -> bool:
    """A sum of values clamped at or above its lower bound: at or above 0 when that is."""
    return est.grid is not None and est.grid.lower >= 0


def total(
    kind: AggregateKind,
    measure: Measure,
    label: str,
    nonnegative: NonNegative,
    weights: Weights = one_each,
) -> AggregateRule:
    """A total released as its one noisy measurement."""
    return AggregateRule(
        kind,
        measure,
        linear(),
        weights,
        Linear(),
        label,
        total=True,
        exact=True,
        nonnegative=nonnegative,
    )


COUNTS = (
    total("count_rows", _on("rows"), "COUNT({arg})", _always),
    total("count", _on("count", "value"), "COUNT({arg})", _always),
    total("count_units", _on("units"), "COUNT(DISTINCT unit)", _always),
    total("count_distinct", _on("distinct", "distinct"), "COUNT_DISTINCT({arg})", _always),
)
SUM = total("sum", _sum, "SUM({arg})", _bounded_at_zero)

__all__ = ["COUNTS", "SUM", "linear", "one_each", "total"]
