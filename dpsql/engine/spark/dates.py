"""Dates: date parts (YEAR, EXTRACT, ...) as DuckDB numbers them, and date_trunc."""

from __future__ import annotations

from sqlglot import exp

from dpsql.engine.spark.dialect import _refuse
from dpsql.engine.spark.lowerer import _handles, _Lowerer
from dpsql.engine.spark.nodes import _E, _case, _cast, _Ctx, _fn, _is_null

# -- dates ------------------------------------------------------------------------------------

_PARTS = {
    "year": "YEAR",
    "month": "MONTH",
    "day": "DAY",
    "quarter": "QUARTER",
    "hour": "HOUR",
    "minute": "MINUTE",
    "dayofweek": "DAYOFWEEK",
    "dow": "DAYOFWEEK",
    "dayofyear": "DAYOFYEAR",
    "doy": "DAYOFYEAR",
}


def _date_part(lw: _Lowerer, part: str, arg: exp.Expression, ctx: _Ctx) -> _E:
    a = lw.expr(arg, ctx)
    if a.type not in ("DATE", "TIMESTAMP", "NULL"):
        raise _refuse(f"{part} of a {a.type} value")
    name = _PARTS.get(part)
    if name is None:
        raise _refuse(f"the date part {part}")
    if name in ("HOUR", "MINUTE") and a.type == "DATE":
        # A DATE is at midnight on DuckDB; Spark would convert it through the session's zone.
        return _E(
            _case(
                (_is_null(a.node), _cast(exp.Null(), "BIGINT")),
                default=_cast(exp.Literal.number(0), "BIGINT"),
            ),
            "BIGINT",
            a.fails,
        )
    out: exp.Expression = _fn(name, a.node)
    if name == "DAYOFWEEK":
        # DuckDB counts Sunday as 0, Spark as 1.
        out = exp.Sub(this=out, expression=exp.Literal.number(1))
    # DuckDB's date parts are BIGINT, Spark's INT.
    return _E(_cast(out, "BIGINT"), "BIGINT", a.fails, 31)


_DATE_FUNCTIONS: dict[type[exp.Expression], str] = {
    exp.Year: "year",
    exp.Month: "month",
    exp.Day: "day",
    exp.Quarter: "quarter",
    exp.Hour: "hour",
    exp.Minute: "minute",
    exp.DayOfWeek: "dayofweek",
}


@_handles(*_DATE_FUNCTIONS)
def _date_function(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    return _date_part(lw, _DATE_FUNCTIONS[type(node)], node.this, ctx)


@_handles(exp.Extract)
def _extract(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    return _date_part(lw, node.this.name.lower(), node.expression, ctx)


_TRUNC = {
    "year": "YEAR", "years": "YEAR", "quarter": "QUARTER", "quarters": "QUARTER",
    "month": "MONTH", "months": "MONTH", "day": "DAY", "days": "DAY", "hour": "HOUR",
    "hours": "HOUR", "minute": "MINUTE", "minutes": "MINUTE", "second": "SECOND",
    "seconds": "SECOND", "millisecond": "MILLISECOND", "milliseconds": "MILLISECOND",
    "microsecond": "MICROSECOND", "microseconds": "MICROSECOND",
}  # fmt: skip


@_handles(exp.TimestampTrunc, exp.DateTrunc)
def _date_trunc(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    unit = node.args.get("unit")
    name = _TRUNC.get(unit.name.lower() if unit is not None else "")
    if name is None:
        raise _refuse(f"date_trunc to {unit.name.lower() if unit is not None else 'this unit'}")
    a = lw.expr(node.this, ctx)
    if a.type == "DATE":
        # DuckDB's date_trunc of a DATE is a TIMESTAMP (midnight); Spark's trunc keeps a DATE,
        # cast to TIMESTAMP_NTZ without any time zone. Below a day, the date itself.
        if name in ("YEAR", "QUARTER", "MONTH"):
            out = _cast(_fn("TRUNC", a.node, exp.Literal.string(name)), "TIMESTAMP")
        else:
            out = _cast(a.node, "TIMESTAMP")
        return _E(out, "TIMESTAMP", a.fails)
    if a.type == "TIMESTAMP":
        # Spark's date_trunc returns a TIMESTAMP in the session's zone, pinned to UTC by
        # dpsql: cast back to the zone-less TIMESTAMP_NTZ, the same wall-clock value.
        out = _cast(_fn("DATE_TRUNC", exp.Literal.string(name), a.node), "TIMESTAMP")
        return _E(out, "TIMESTAMP", a.fails)
    raise _refuse(f"date_trunc of a {a.type} value")
