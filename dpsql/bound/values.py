"""Values in the bounded query: the raw row values (clamped to their bounds), their grid
units, what one unit's values in one group become after the cap C (or, when no per-unit step
can bind, the rows as they are), and the cross-unit aggregate of each measurement.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

from sqlglot import exp

from dpsql.analyze.analysis import Analysis
from dpsql.bound.grid import Grid
from dpsql.bound.specs import Bounding, MeasurementSpec, ValueSpec
from dpsql.sql.parse import DIALECT
from dpsql.sql.tree import transform

_FLOATS = {"float", "double", "real"}


def _clamp_columns(
    expr: exp.Expression, analysis: Analysis, clamp_them: bool = True
) -> exp.Expression:
    """Clamp each bounded numeric column inside an aggregate argument to its declared bounds.
    ``clamp_them=False``: the same expression with each bounded column read as it is clamped
    (as DOUBLE, NaN as NULL) but not clamped: the value the clamps change, which the
    diagnosis of the bounds compares with (``dpsql.bound.diagnosis``)."""

    def clamp(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.Column):
            return node
        bounds = analysis.bounds.get(node.name)
        if bounds is None:
            return node
        lo, hi = bounds
        inner = exp.cast(node.copy(), exp.DataType.Type.DOUBLE)
        clamped: exp.Expression = exp.Least(
            this=exp.Greatest(this=inner, expressions=[_number(lo)], ignore_nulls=True),
            expressions=[_number(hi)],
            ignore_nulls=True,
        )
        if not clamp_them:
            clamped = inner
        # NULL stays NULL (GREATEST ignores NULL, so the clamp alone would give the lower
        # bound); NaN counts as NULL (DuckDB orders NaN above +inf: the clamp would give hi).
        missing: exp.Expression = exp.Is(this=node.copy(), expression=exp.Null())
        if analysis.columns[node.name].lower() in _FLOATS:
            missing = exp.Or(this=missing, expression=exp.IsNan(this=node.copy()))
        return exp.Paren(this=exp.If(this=missing, true=exp.Null(), false=clamped))

    return transform(expr, clamp)


def _summed_value(
    expr: exp.Expression, analysis: Analysis, total_sql: Callable[[exp.Expression], str]
) -> str:
    """The raw DOUBLE of a summed value, before its grid clamp.

    A bare column needs no clamp of its own: the grid clamp enforces the same bounds (rounded
    out to the grid), and the NULL and NaN checks are there too. Inside a compound expression
    each bounded column is clamped first, so that the expression sees clamped inputs.
    """
    if isinstance(expr, exp.Column):
        column = expr.sql(dialect=DIALECT)
        if analysis.columns[expr.name].lower() in _FLOATS:
            return column
        return f"CAST({column} AS DOUBLE)"
    return total_sql(exp.cast(_clamp_columns(expr, analysis), exp.DataType.Type.DOUBLE))


def _unclamped_value(
    expr: exp.Expression, analysis: Analysis, total_sql: Callable[[exp.Expression], str]
) -> str | None:
    """The raw DOUBLE of a summed compound expression with its bounded columns not clamped
    (else as ``_summed_value``); None for a bare column, whose raw value no clamp has changed."""
    if isinstance(expr, exp.Column):
        return None
    unclamped = _clamp_columns(expr, analysis, clamp_them=False)
    return total_sql(exp.cast(unclamped, exp.DataType.Type.DOUBLE))


def _number(value: Fraction | int) -> exp.Expression:
    value = Fraction(value)
    if value.denominator == 1:
        return exp.Literal.number(value.numerator)
    # Bounds are read from decimal text, so most are finite decimals; others become a ratio.
    return exp.Div(
        this=exp.cast(exp.Literal.number(value.numerator), exp.DataType.Type.DOUBLE),
        expression=exp.Literal.number(value.denominator),
    )


def _grid_units(raw: str, grid: Grid) -> str:
    """SQL for a raw DOUBLE value on its grid: round(x/g), clamped to [lower, upper]."""
    step = grid.step
    scaled = f"{raw} * {step.denominator}" if step <= 1 else f"{raw} / {step.numerator}"
    clamped = f"LEAST(GREATEST({scaled}, {grid.lower}), {grid.upper})"
    # NULL must stay NULL (DuckDB's GREATEST ignores NULL, so a clamp would turn it into the
    # lower bound) and NaN counts as NULL (DuckDB orders NaN above +inf: it would become hi).
    return (
        f"CASE WHEN {raw} IS NULL OR isnan({raw}) THEN NULL "
        f"ELSE CAST(ROUND({clamped}) AS BIGINT) END"
    )


def _counted(raw: str, expr: exp.Expression, analysis: Analysis) -> str:
    """A counted-only value: NaN counts as NULL here too, as it does where values are summed."""
    if isinstance(expr, exp.Column) and analysis.columns[expr.name].lower() in _FLOATS:
        return f"CASE WHEN isnan({raw}) THEN NULL ELSE {raw} END"
    return raw


def _count_sum(column: str, bounding: Bounding) -> str:
    """The total of a count column of ``_capped`` (each row's count of rows, 0 to C). Over one
    table read directly the total is at most the table's row count, below 2^63 (COUNT(*) is a
    BIGINT on both engines), so it is written as a BIGINT: DuckDB's HUGEINT total cast without
    any possible error, and Spark's SUM of BIGINTs, not of DECIMAL(38,0) (``spark_aggregates.
    _count_total``; its partial sums of counts never pass the total). Over a join or a
    subquery the rows are not one table's: L0 * C * (2^63 - 1) does not fit, so HUGEINT."""
    if bounding.one_table:
        return f"CAST(SUM({column}) AS BIGINT)"
    return f"SUM({column})"


def measurement_sql(spec: MeasurementSpec, bounding: Bounding) -> str:
    """The cross-unit aggregate of one measurement, over ``_capped``."""
    if spec.kind == "rows":
        return _count_sum("_c", bounding)
    if spec.kind == "units":
        if bounding.direct:
            # One row per kept row here, not per (unit, group): count the distinct units, the
            # NULL unit being one unit as everywhere else (COUNT(DISTINCT) skips it).
            return "COUNT(DISTINCT _u) + COALESCE(MAX(CASE WHEN _u IS NULL THEN 1 END), 0)"
        return "COUNT(*)"
    assert spec.value is not None
    i = spec.value
    if spec.kind == "count":
        return _count_sum(f"_c{i}", bounding)
    if spec.kind == "sum":
        return f"SUM(_t{i})"
    if spec.kind == "centred_squares":
        # Σ(x - m)² in units of (g/2)², per unit and group already capped in _capped.
        return f"SUM(_r{i})"
    grid = bounding.values[i].grid
    assert grid is not None
    # Centred sum in units of g/2: each row contributes 2·x - (lower + upper).
    return f"SUM(2 * _t{i} - _c{i} * CAST({grid.centre_units} AS HUGEINT))"


def _centred(i: int, bounding: Bounding) -> str:
    """A row's centred value ``2·v - (lower + upper)`` in units of g/2; within ±width."""
    grid = bounding.values[i].grid
    assert grid is not None
    return f"2 * _v{i} - {grid.centre_units}"


def _capped_sum(i: int, c: int, grid: Grid) -> str:
    """The unit's sum in grid units with at most C rows counted: S when n <= C, else
    round(C·S/n) clamped to [C·lower, C·upper], all in exact HUGEINT arithmetic.

    In DOUBLE, S (up to n·2^52) and the bounds C·lower, C·upper (up to 2^72) are rounded, and a
    unit could move a total by a grid unit more than the plan's sensitivity. Exact: with
    q = floor(S/n) and r = S - q·n in [0, n), round(C·S/n) = C·q + floor((2·C·r + n) / (2·n)).
    DuckDB's // truncates towards zero and % takes the dividend's sign, hence the correction.
    """
    s, n = f"CAST(_s{i} AS HUGEINT)", f"CAST(_n{i} AS HUGEINT)"
    q = f"({s} // {n} - CASE WHEN {s} % {n} < 0 THEN 1 ELSE 0 END)"
    r = f"({s} - {q} * {n})"
    scaled = f"({c} * {q} + (2 * {c} * {r} + {n}) // (2 * {n}))"
    low, high = f"CAST({c * grid.lower} AS HUGEINT)", f"CAST({c * grid.upper} AS HUGEINT)"
    return f"CASE WHEN _n{i} <= {c} THEN {s} ELSE LEAST(GREATEST({scaled}, {low}), {high}) END"


def _capped_squares(i: int, bounding: Bounding) -> str:
    """The unit's sum of squared centred values, in units of (g/2)², within [0, C·width²].

    With n <= C rows it is exact (each square is at most width²); with more, it is scaled to
    round(Q·C/n) in exact integer arithmetic and clamped, so that one unit moves one group's
    total by at most C·width² whatever its rows.
    """
    grid = bounding.values[i].grid
    assert grid is not None
    c = bounding.max_rows
    cap = c * grid.width**2
    scaled = f"CASE WHEN _n{i} <= {c} THEN _q{i} ELSE (_q{i} * {c} + _n{i} // 2) // _n{i} END"
    return f"LEAST(GREATEST({scaled}, 0), CAST({cap} AS HUGEINT))"


def _listed(i: int, value: ValueSpec) -> str:
    """Per unit and group, the value's non-NULL grid units (a quantile) or distinct values."""
    distinct = "DISTINCT " if value.role == "distinct" else ""
    return f"list({distinct}_v{i}) FILTER (WHERE _v{i} IS NOT NULL) AS _l{i}"


def _capped_list(i: int, c: int) -> str:
    """At most C of a unit's listed values, evenly spaced in sorted order: a function of the
    unit's own rows only, so one unit still moves a group by at most C values."""
    step = f"GREATEST((len(_l{i}) + {c - 1}) // {c}, 1)"
    # A list of at most C values is kept whole: no sort needed (the slice would keep it all).
    return (
        f"CASE WHEN len(_l{i}) <= {c} THEN _l{i} "
        f"ELSE list_slice(list_sort(_l{i}), 1, len(_l{i}), {step}) END AS _l{i}"
    )


def _list_measure(j: int, spec: MeasurementSpec, keys: list[str], direct: bool) -> str:
    """The cross-unit aggregate of a listed value: a histogram of grid units for a quantile's
    exponential mechanism, or the number of distinct values."""
    assert spec.value is not None
    i = spec.value
    agg = "histogram(_b)" if spec.kind == "quantile" else "COUNT(DISTINCT _b)"
    key_list = "".join(f"{k}, " for k in keys)
    group = f" GROUP BY {', '.join(keys)}" if keys else ""
    if direct:
        # Each unit has at most C rows per group: its list would be all its values, whole.
        values = f"SELECT {key_list}_v{i} AS _b FROM _capped WHERE _v{i} IS NOT NULL"
    else:
        values = f"SELECT {key_list}unnest(_l{i}) AS _b FROM _capped"
    return f"_x{j} AS (SELECT {key_list}{agg} AS _h FROM ({values}){group})"


def _direct(keys: list[str], bounding: Bounding, squared: list[int], weighted: bool) -> str:
    """``_capped`` when no per-(unit, group) bound can bind: one row per kept row (or per kept
    (unit, keys) row and its copies ``_w``), with the columns the cross-unit aggregate reads;
    nothing is capped or scaled."""
    columns = ["_u", *keys, "_w AS _c" if weighted else "1 AS _c"]
    for i, v in enumerate(bounding.values):
        if v.listed:
            columns.append(f"_v{i}")
            continue
        columns.append(f"CASE WHEN _v{i} IS NULL THEN 0 ELSE 1 END AS _c{i}")
        if v.grid is not None:
            columns.append(f"CAST(COALESCE(_v{i}, 0) AS HUGEINT) AS _t{i}")
    for i in squared:
        centred = f"CAST({_centred(i, bounding)} AS HUGEINT)"
        columns.append(f"CASE WHEN _v{i} IS NULL THEN 0 ELSE {centred} * {centred} END AS _r{i}")
    return f"SELECT {', '.join(columns)} FROM _vals"
