"""Values in the bounded query: the raw row values (each bounded column clamped first inside an
expression), their grid units (``_vals``), a counted value's NaN made NULL, and the cross-unit
aggregate of each measurement over ``_capped`` (``measure``).

>>> from fractions import Fraction
>>> grid_units(0, Grid(Fraction(1, 4), 0, 40)).sql("duckdb").split(" ELSE ")[1]
'CAST(ROUND(LEAST(GREATEST(_x0 * 4, 0), 40)) AS BIGINT) END'
>>> measure(MeasurementSpec("sum", 0), Bounding(None, 1, (), ())).sql("duckdb")
'SUM(_t0)'
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

from sqlglot import exp

from dpsql.analyze.analysis import Analysis
from dpsql.bound.grid import Grid
from dpsql.bound.nodes import (
    Node,
    Type,
    any_of,
    cast,
    clamp,
    column,
    func,
    greatest,
    hugeint,
    is_null,
    number,
    paren,
    when,
)
from dpsql.bound.specs import Bounding, MeasurementSpec
from dpsql.sql.tree import transform

_FLOATS = {"float", "double", "real"}

# A row-level expression made total (``dpsql.sql.totality``), a new tree on every call.
Total = Callable[[exp.Expression], exp.Expression]


def _is_float(analysis: Analysis, node: exp.Column) -> bool:
    return analysis.columns[node.name].lower() in _FLOATS


def _clamp_columns(
    expr: exp.Expression, analysis: Analysis, clamp_them: bool = True
) -> exp.Expression:
    """Clamp each bounded numeric column inside an aggregate argument to its declared bounds.
    ``clamp_them=False``: the same expression with each bounded column read as it is clamped
    (as DOUBLE, NaN as NULL) but not clamped: the value the clamps change, which the
    diagnosis of the bounds compares with (``dpsql.bound.diagnosis``)."""

    def clamp_column(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.Column):
            return node
        bounds = analysis.bounds.get(node.name)
        if bounds is None:
            return node
        lo, hi = bounds
        inner = exp.cast(node.copy(), exp.DataType.Type.DOUBLE)
        clamped = clamp(inner, bound_value(lo), bound_value(hi)) if clamp_them else inner
        # NULL stays NULL (GREATEST ignores NULL, so the clamp alone would give the lower
        # bound); NaN counts as NULL (DuckDB orders NaN above +inf: the clamp would give hi).
        missing: exp.Expression = is_null(node.copy())
        if _is_float(analysis, node):
            missing = exp.Or(this=missing, expression=exp.IsNan(this=node.copy()))
        return exp.Paren(this=exp.If(this=missing, true=exp.Null(), false=clamped))

    return transform(expr, clamp_column)


def summed_value(expr: exp.Expression, analysis: Analysis, total: Total) -> Node:
    """The raw DOUBLE of a summed value, before its grid clamp.

    A bare column needs no clamp of its own: the grid clamp enforces the same bounds (rounded
    out to the grid), and the NULL and NaN checks are there too. Inside a compound expression
    each bounded column is clamped first, so that the expression sees clamped inputs.
    """
    if isinstance(expr, exp.Column):
        if _is_float(analysis, expr):
            return expr.copy()
        return cast(expr.copy(), Type.DOUBLE)
    return total(exp.cast(_clamp_columns(expr, analysis), exp.DataType.Type.DOUBLE))


def unclamped_value(expr: exp.Expression, analysis: Analysis, total: Total) -> Node | None:
    """The raw DOUBLE of a summed compound expression with its bounded columns not clamped
    (else as ``summed_value``); None for a bare column, whose raw value no clamp has changed."""
    if isinstance(expr, exp.Column):
        return None
    unclamped = _clamp_columns(expr, analysis, clamp_them=False)
    return total(exp.cast(unclamped, exp.DataType.Type.DOUBLE))


def bound_value(value: Fraction | int) -> Node:
    """A bound as a literal: an integer, or the ratio of two integers in DOUBLE."""
    value = Fraction(value)
    if value.denominator == 1:
        return number(value.numerator)
    # Bounds are read from decimal text, so most are finite decimals; others become a ratio.
    return exp.Div(
        this=cast(number(value.numerator), Type.DOUBLE),
        expression=number(value.denominator),
    )


def grid_units(i: int, grid: Grid) -> Node:
    """Raw value ``_x<i>`` (a DOUBLE) on its grid: round(x/g), clamped to [lower, upper]."""
    step = grid.step
    if step <= 1:
        scaled: Node = exp.Mul(this=column(f"_x{i}"), expression=number(step.denominator))
    else:
        scaled = exp.Div(this=column(f"_x{i}"), expression=number(step.numerator))
    clamped = clamp(scaled, number(grid.lower), number(grid.upper))
    # NULL must stay NULL (DuckDB's GREATEST ignores NULL, so a clamp would turn it into the
    # lower bound) and NaN counts as NULL (DuckDB orders NaN above +inf: it would become hi).
    missing = any_of([is_null(column(f"_x{i}")), func("isnan", column(f"_x{i}"))])
    return when((missing, exp.Null()), otherwise=cast(func("ROUND", clamped), Type.BIGINT))


def counted(i: int, expr: exp.Expression, analysis: Analysis) -> Node:
    """Counted-only value ``_x<i>``: NaN counts as NULL here too, as where values are summed."""
    if isinstance(expr, exp.Column) and _is_float(analysis, expr):
        return when((func("isnan", column(f"_x{i}")), exp.Null()), otherwise=column(f"_x{i}"))
    return column(f"_x{i}")


def centred(value: str, grid: Grid) -> Node:
    """A row's centred value ``2·v - (lower + upper)`` in units of g/2, within ±width, of the
    grid units in column ``value``."""
    doubled = exp.Mul(this=number(2), expression=column(value))
    return exp.Sub(this=doubled, expression=number(grid.centre_units))


def bernstein(i: int, grid: Grid, part: int) -> Node:
    """One (unit, group) cell's Bernstein coordinate ``part`` of value ``i``, in units of
    (g/2)², from its capped count c (``_c<i>``), sum (``_t<i>``) and centred squares Q
    (``_r<i>``); with w the width and S = 2·t - c·(lower + upper) the centred sum:
    b0 = max(w²c - 2wS + Q, 0), b2 = max(w²c + 2wS + Q, 0), b1 = 4w²c - b0 - b2.

    A row's (x centred, in ±w) is ((w - x)², 2(w² - x²), (w + x)²): non-negative, summing to
    4w². A cell of at most C rows sums such vectors exactly. A scaled cell (more than C rows)
    is rounded, which can leave b0 or b2 a little below 0; flooring it keeps b0 + b2 <= 4w²c
    (S <= c·w and Q <= c·w² after their clamps), so b1 >= 0 and every cell's vector is
    non-negative with L1 exactly 4w²c <= 4w²C (``dpsql.plan.sensitivity``)."""
    w = grid.width
    c = hugeint(column(f"_c{i}"))
    doubled = exp.Mul(this=number(2), expression=hugeint(column(f"_t{i}")))
    s = paren(exp.Sub(this=doubled, expression=exp.Mul(this=c, expression=hugeint(
        number(grid.centre_units)))))  # fmt: skip

    def end(sign: int) -> Node:
        base = exp.Add(this=exp.Mul(this=hugeint(number(w * w)), expression=c.copy()),
                       expression=hugeint(column(f"_r{i}")))  # fmt: skip
        tilt = exp.Mul(this=hugeint(number(2 * w)), expression=s.copy())
        both = exp.Add(this=base, expression=tilt) if sign > 0 else exp.Sub(
            this=base, expression=tilt)  # fmt: skip
        return greatest(both, hugeint(number(0)))

    if part == 0:
        return end(-1)
    if part == 2:
        return end(1)
    whole = exp.Mul(this=hugeint(number(4 * w * w)), expression=c.copy())
    return exp.Sub(this=exp.Sub(this=whole, expression=end(-1)), expression=end(1))


def _count_sum(name: str, bounding: Bounding) -> Node:
    """The total of a count column of ``_capped`` (each row's count of rows, 0 to C). Over one
    table read directly the total is at most the table's row count, below 2^63 (COUNT(*) is a
    BIGINT on both engines), so it is written as a BIGINT: DuckDB's HUGEINT total cast without
    any possible error, and Spark's SUM of BIGINTs, not of DECIMAL(38,0) (``spark_aggregates.
    _count_total``; its partial sums of counts never pass the total). Over a join or a
    subquery the rows are not one table's: L0 * C * (2^63 - 1) does not fit, so HUGEINT."""
    total = func("SUM", column(name))
    return cast(total, Type.BIGINT) if bounding.one_table else total


def measure(spec: MeasurementSpec, bounding: Bounding) -> Node:
    """The cross-unit aggregate of one measurement, over ``_capped``."""
    if spec.kind == "rows":
        return _count_sum("_c", bounding)
    if spec.kind == "units":
        if bounding.direct:
            # One row per kept row here, not per (unit, group): count the distinct units, the
            # NULL unit being one unit as everywhere else (COUNT(DISTINCT) skips it).
            distinct = func("COUNT", exp.Distinct(expressions=[column("_u")]))
            null_unit = func("MAX", when((is_null(column("_u")), number(1))))
            return exp.Add(
                this=distinct, expression=exp.Coalesce(this=null_unit, expressions=[number(0)])
            )
        return func("COUNT", exp.Star())
    assert spec.value is not None
    i = spec.value
    if spec.kind == "count":
        return _count_sum(f"_c{i}", bounding)
    if spec.kind == "sum":
        return func("SUM", column(f"_t{i}"))
    if spec.kind == "centred_squares":
        # Σ(x - m)² in units of (g/2)², per unit and group already capped in _capped.
        return func("SUM", column(f"_r{i}"))
    if spec.kind == "centred_products":
        # Σ(x - m_x)(y - m_y) in units of (g_x/2)(g_y/2), capped per unit and group.
        return func("SUM", column(f"_r{i}_{spec.other}"))
    grid = bounding.values[i].grid
    assert grid is not None
    if spec.kind == "bernstein":
        assert spec.part is not None
        return func("SUM", bernstein(i, grid, spec.part))
    # Centred sum in units of g/2: each row contributes 2·x - (lower + upper).
    doubled = exp.Mul(this=number(2), expression=column(f"_t{i}"))
    centre = exp.Mul(this=column(f"_c{i}"), expression=hugeint(number(grid.centre_units)))
    return func("SUM", exp.Sub(this=doubled, expression=centre))


__all__ = ["Total", "bernstein", "bound_value", "centred", "counted", "grid_units", "measure",
           "summed_value", "unclamped_value"]  # fmt: skip
