"""What each aggregate of a query measures: the distinct values and measurement specs a plan
needs (``_Builder``, which shares them between aggregates), and the :class:`Estimate` of each
aggregate over them, as its kind's rule declares (``dpsql.plan.aggregates``).
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.analyze.analysis import Analysis
from dpsql.bound.grid import Grid
from dpsql.bound.specs import MeasurementSpec, ValueRole, ValueSpec
from dpsql.plan.aggregates.registry import rule_of
from dpsql.plan.plans import Estimate
from dpsql.sql.parse import DIALECT


class _Builder:
    def __init__(self, confidence: float = 0.95) -> None:
        self.values: list[ValueSpec] = []
        self.specs: list[MeasurementSpec] = []
        self.confidence = confidence  # a quantile interval's coverage (public: a setting)

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
    """Each aggregate's estimate, its measurements added to ``builder`` by its kind's rule."""
    return [rule_of(agg.kind).measure(agg, builder) for agg in analysis.aggregates]
