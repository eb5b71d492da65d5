"""The aggregate functions a query may call: for each, the sqlglot class its calls parse to, the
kind of aggregate it answers and the forms its argument may take.

This is the half of an aggregate kind's declaration that reads SQL. ``dpsql.sql.validate``
admits exactly these calls, and ``dpsql.analyze.analyze`` reads each into an ``Aggregate`` of
its kind. The other half (what the kind measures, its estimator, its variance weights, its
accuracy and what an accuracy target binds) is the kind's rule in ``dpsql.plan.aggregates``. The
planning stage comes after this one and cannot be imported from here, so the two halves meet on
the kind's name; ``tests/plan/test_toy_aggregate.py`` checks that every kind named here has a
rule. Queries are checked against the table as it stands, so a test may extend it.

>>> from sqlglot import parse_one
>>> function_of(parse_one("SELECT STDDEV(x)").expressions[0]).kind
'stddev_samp'
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from sqlglot import exp

AggregateKind = Literal[
    "count_rows", "count", "count_units", "count_distinct", "sum", "avg",
    "var_pop", "var_samp", "stddev_pop", "stddev_samp", "quantile",
    "covar_pop", "covar_samp", "corr", "regr_slope", "regr_intercept",
]  # fmt: skip

# A quantile's order read from ``PERCENTILE_CONT(p) WITHIN GROUP (ORDER BY x)``.
WITHIN_GROUP = "within group"


@dataclass(frozen=True)
class AggregateFunction:
    """One SQL aggregate function: F(x) answers ``kind``.

    COUNT has more forms: F(*) and F(literal) answer ``star``, F(DISTINCT x) ``distinct`` and
    F(DISTINCT unit) ``units``; a function without a form refuses it. A quantile has an
    ``order`` p: fixed (MIN 0, MAX 1, MEDIAN 1/2), the name of the call's argument that holds
    it, or ``WITHIN_GROUP``.
    """

    node: type[exp.Expression]
    kind: AggregateKind
    bounded: bool = False  # x needs finite bounds (the policy's, or by interval arithmetic)
    star: AggregateKind | None = None
    distinct: AggregateKind | None = None
    units: AggregateKind | None = None
    order: Fraction | str | None = None
    # The only arguments a call may set (MIN(x, n) is refused); None: as sqlglot parses them.
    only: tuple[str, ...] | None = None
    name: str = ""  # in messages; default the node's key in capitals
    # F(y, x) of two bounded arguments, read over the rows where both are present (SQL's
    # meaning of COVAR_POP, CORR and the REGR_ functions).
    pair: bool = False
    column: str = ""  # the name of an unaliased output that is the call; default the node's key

    def __post_init__(self) -> None:
        # Subqueries and join conditions are told aggregating by sqlglot's AggFunc class
        # (dpsql.analyze.relations, joins, per_unit): a call of another class would pass there
        # for a row-level function and reach the engine over private rows. Hence classes, not
        # names: sqlglot parses a function it does not know as Anonymous, not as an AggFunc.
        if not issubclass(self.node, exp.AggFunc | exp.WithinGroup):
            raise TypeError(f"{self.node.__name__} is not an aggregate function to sqlglot")

    def sql_name(self, node: exp.Expression) -> str:
        return self.name or node.key.upper()

    def column_name(self, node: exp.Expression) -> str:
        return self.column or node.key.lower()

    def extra_arguments(self, node: exp.Expression) -> bool:
        """Whether ``node`` sets an argument besides ``only``."""
        if self.only is None:
            return False
        return any(k not in self.only and v not in (None, []) for k, v in node.args.items())


_PAIRS: tuple[tuple[type[exp.Expression], AggregateKind], ...] = (
    (exp.CovarPop, "covar_pop"),
    (exp.CovarSamp, "covar_samp"),
    (exp.Corr, "corr"),
    (exp.RegrSlope, "regr_slope"),
    (exp.RegrIntercept, "regr_intercept"),
)

FUNCTIONS: tuple[AggregateFunction, ...] = (
    AggregateFunction(
        exp.Count, "count", star="count_rows", distinct="count_distinct", units="count_units"
    ),
    AggregateFunction(exp.Sum, "sum", bounded=True),
    AggregateFunction(exp.Avg, "avg", bounded=True),
    # Variances and standard deviations with DuckDB's meanings (VARIANCE = VAR_SAMP, STDDEV =
    # STDDEV_SAMP); like AVG, their argument needs finite bounds.
    AggregateFunction(exp.Variance, "var_samp", bounded=True),
    AggregateFunction(exp.VariancePop, "var_pop", bounded=True, column="var_pop"),
    AggregateFunction(exp.Stddev, "stddev_samp", bounded=True),
    AggregateFunction(exp.StddevSamp, "stddev_samp", bounded=True, column="stddev_samp"),
    AggregateFunction(exp.StddevPop, "stddev_pop", bounded=True, column="stddev_pop"),
    # Covariances, correlation and least-squares regression of y on x, F(y, x) as in DuckDB
    # and PostgreSQL; both arguments need finite bounds.
    *(
        AggregateFunction(
            node,
            kind,
            bounded=True,
            pair=True,
            only=("this", "expression"),
            name=kind.upper(),
            column=kind,
        )
        for node, kind in _PAIRS
    ),
    # Quantiles, answered with the exponential mechanism; MIN and MAX are the quantiles 0 and 1.
    AggregateFunction(exp.Median, "quantile", bounded=True, order=Fraction(1, 2), only=("this",)),
    AggregateFunction(
        exp.ApproxQuantile, "quantile", bounded=True, order="quantile", name="APPROX_QUANTILE"
    ),
    AggregateFunction(exp.Quantile, "quantile", bounded=True, order="quantile"),
    AggregateFunction(
        exp.PercentileCont, "quantile", bounded=True, order="expression", name="PERCENTILE_CONT"
    ),
    AggregateFunction(
        exp.PercentileDisc, "quantile", bounded=True, order="expression", name="PERCENTILE_DISC"
    ),
    AggregateFunction(
        exp.WithinGroup, "quantile", bounded=True, order=WITHIN_GROUP, name="PERCENTILE_CONT"
    ),
    AggregateFunction(exp.Min, "quantile", bounded=True, order=Fraction(0), only=("this",)),
    AggregateFunction(exp.Max, "quantile", bounded=True, order=Fraction(1), only=("this",)),
)


def aggregate_nodes() -> tuple[type[exp.Expression], ...]:
    """The sqlglot classes of every aggregate call a query may make."""
    return tuple(f.node for f in FUNCTIONS)


def function_of(node: exp.Expression) -> AggregateFunction | None:
    """The first function of ``FUNCTIONS`` whose class ``node`` is an instance of (an
    APPROX_QUANTILE is a QUANTILE to sqlglot: its own entry comes first), or None."""
    return next((f for f in FUNCTIONS if isinstance(node, f.node)), None)


__all__ = [
    "FUNCTIONS",
    "WITHIN_GROUP",
    "AggregateFunction",
    "AggregateKind",
    "aggregate_nodes",
    "function_of",
]
