"""What the bounded query enforces: the public numbers of contribution bounding
(:class:`Bounding`), the row-level values it reads (:class:`ValueSpec`) and what each of its
output columns measures (:class:`MeasurementSpec`), with the name of the salt the engine binds.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from sqlglot import exp

from dpsql.bound.grid import Grid

SALT_PARAMETER = "salt"
MeasurementKind = Literal[
    "rows", "count", "sum", "centred", "centred_squares", "centred_products", "units",
    "distinct", "quantile", "bernstein",
]  # fmt: skip
# value: counted, and summed on its grid; quantile: listed on its (coarser) grid, C per unit and
# group; distinct: its distinct values listed, C per unit and group.
ValueRole = Literal["value", "quantile", "distinct"]


@dataclass(frozen=True)
class ValueSpec:
    """A distinct row-level expression that is counted, and summed on ``grid`` if given."""

    expr: exp.Expression
    grid: Grid | None
    role: ValueRole = "value"

    @property
    def listed(self) -> bool:
        return self.role != "value"


@dataclass(frozen=True)
class MeasurementSpec:
    """What one output column of the bounded query measures (see ``measurement_sql``)."""

    kind: MeasurementKind
    value: int | None = None
    p: Fraction | None = None  # the order of a quantile
    # A quantile interval's endpoint: -1 the lower, +1 the upper (0: the quantile itself), drawn
    # to cover the quantile with probability ``confidence`` (dpsql.plan.aggregates.quantiles).
    side: int = 0
    confidence: float | None = None
    # The second value of a sum of products of centred values (COVAR, CORR, REGR_).
    other: int | None = None
    # A Bernstein coordinate (0, 1 or 2) of a value's joint moment measurement (VARIANCE and
    # STDDEV under the Laplace: ``dpsql.plan.aggregates.bernstein``): the three are noised as
    # one vector, at one share of the epsilon.
    part: int | None = None

    @property
    def slot(self) -> Fraction:
        """Its part of an even split: half for an interval's endpoint (the two of a quantile
        take what one measurement would; ``dpsql.plan.sensitivity``)."""
        return Fraction(1, 2) if self.side else Fraction(1)


@dataclass(frozen=True)
class Bounding:
    """The public numbers the bounded query enforces."""

    max_groups: int | None  # L0 for the ranking; None when no ranking is needed
    max_rows: int  # C
    values: tuple[ValueSpec, ...]
    measurements: tuple[MeasurementSpec, ...]
    max_total_rows: int | None = None  # R: rows per unit in total, kept by keyed hash
    # Every unit holds at most C rows per group and at most L0 groups once the rows are built
    # (after R's window, or by the relation's structure): the per-(unit, group) step is then
    # the identity and the aggregate reads the rows directly (``dpsql.plan.planner``).
    direct: bool = False
    # A unit-level Poisson sample at this rate (``dpsql.analyze.sample``), before any bound.
    sample: Fraction | None = None
    # The rows come from one table read directly (no join, no subquery): a sum of counts of
    # its rows is at most its row count, which fits BIGINT (``values.measurement_sql``).
    one_table: bool = False
