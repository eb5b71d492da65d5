"""What each aggregate of a query measures: the distinct values and measurement specs a plan
needs (``_Builder``, which shares them between aggregates), and the :class:`Estimate` of each
aggregate over them.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.analyze.analysis import SPREAD_KINDS, Analysis
from dpsql.bound.grid import Grid, quantile_grid, value_grid
from dpsql.bound.specs import MeasurementSpec, ValueRole, ValueSpec
from dpsql.plan.plans import Estimate
from dpsql.sql.parse import DIALECT


class _Builder:
    def __init__(self) -> None:
        self.values: list[ValueSpec] = []
        self.specs: list[MeasurementSpec] = []

    def value(self, expr: exp.Expression, grid: Grid | None, role: ValueRole = "value") -> int:
        key = expr.sql(DIALECT)
        for i, v in enumerate(self.values):
            if (
                v.expr.sql(DIALECT) == key
                and v.role == role
                and (role == "value" or v.grid == grid)
            ):
                if grid is not None and v.grid is None:
                    self.values[i] = ValueSpec(v.expr, grid)
                return i
        self.values.append(ValueSpec(expr, grid, role))
        return len(self.values) - 1

    def measure(self, spec: MeasurementSpec) -> int:
        if spec not in self.specs:
            self.specs.append(spec)
        return self.specs.index(spec)


def _estimates(analysis: Analysis, builder: _Builder) -> list[Estimate]:
    estimates = []
    for agg in analysis.aggregates:
        if agg.kind == "count_rows":
            estimates.append(Estimate(agg.kind, (builder.measure(MeasurementSpec("rows")),), None))
        elif agg.kind == "count_units":
            estimates.append(Estimate(agg.kind, (builder.measure(MeasurementSpec("units")),), None))
        elif agg.kind == "count":
            assert agg.arg is not None
            v = builder.value(agg.arg, None)
            estimates.append(
                Estimate(agg.kind, (builder.measure(MeasurementSpec("count", v)),), None)
            )
        elif agg.kind == "count_distinct":
            assert agg.arg is not None
            v = builder.value(agg.arg, None, "distinct")
            estimates.append(
                Estimate(agg.kind, (builder.measure(MeasurementSpec("distinct", v)),), None)
            )
        elif agg.kind == "quantile":
            assert agg.arg is not None and agg.bounds is not None
            grid = quantile_grid(agg.bounds)
            v = builder.value(agg.arg, grid, "quantile")
            spec = MeasurementSpec("quantile", v, agg.p)
            estimates.append(Estimate(agg.kind, (builder.measure(spec),), grid))
        else:
            assert agg.arg is not None and agg.bounds is not None
            grid = value_grid(agg.bounds)
            v = builder.value(agg.arg, grid)
            parts: tuple[int, ...]
            if agg.kind == "sum":
                parts = (builder.measure(MeasurementSpec("sum", v)),)
            elif agg.kind in SPREAD_KINDS:
                parts = (
                    builder.measure(MeasurementSpec("centred_squares", v)),
                    builder.measure(MeasurementSpec("centred", v)),
                    builder.measure(MeasurementSpec("count", v)),
                )
            else:
                parts = (
                    builder.measure(MeasurementSpec("centred", v)),
                    builder.measure(MeasurementSpec("count", v)),
                )
            estimates.append(Estimate(agg.kind, parts, grid))
    return estimates
