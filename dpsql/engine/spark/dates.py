"""Dates: date parts (YEAR, EXTRACT, ...) as DuckDB numbers them (``date_part`` makes the handler
of each function that takes one part), and date_trunc."""

from __future__ import annotations

from sqlglot import exp

from dpsql.engine.spark.dialect import refuse
from dpsql.engine.spark.nodes import (
    Context,
    Handler,
    Lowered,
    Lowering,
    case_when,
    cast_to,
    fn,
    is_null,
)

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


def _date_part(lw: Lowering, part: str, arg: exp.Expression, ctx: Context) -> Lowered:
    a = lw.expr(arg, ctx)
    if a.type not in ("DATE", "TIMESTAMP", "NULL"):
        raise refuse(f"{part} of a {a.type} value")
    name = _PARTS.get(part)
    if name is None:
        raise refuse(f"the date part {part}")
    if name in ("HOUR", "MINUTE") and a.type == "DATE":
        # A DATE is at midnight on DuckDB; Spark would convert it through the session's zone.
        return Lowered(
            case_when(
                (is_null(a.node), cast_to(exp.Null(), "BIGINT")),
                default=cast_to(exp.Literal.number(0), "BIGINT"),
            ),
            "BIGINT",
            a.fails,
        )
    out: exp.Expression = fn(name, a.node)
    if name == "DAYOFWEEK":
        # DuckDB counts Sunday as 0, Spark as 1.
        out = exp.Sub(this=out, expression=exp.Literal.number(1))
    # DuckDB's date parts are BIGINT, Spark's INT.
    return Lowered(cast_to(out, "BIGINT"), "BIGINT", a.fails, 31)


def date_part(part: str) -> Handler:
    """The handler of a function of one date that gives its ``part`` (YEAR(d), the year)."""

    def handler(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
        return _date_part(lw, part, node.this, ctx)

    return handler


def extract(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    return _date_part(lw, node.this.name.lower(), node.expression, ctx)


_TRUNC = {
    "year": "YEAR", "years": "YEAR", "quarter": "QUARTER", "quarters": "QUARTER",
    "month": "MONTH", "months": "MONTH", "day": "DAY", "days": "DAY", "hour": "HOUR",
    "hours": "HOUR", "minute": "MINUTE", "minutes": "MINUTE", "second": "SECOND",
    "seconds": "SECOND", "millisecond": "MILLISECOND", "milliseconds": "MILLISECOND",
    "microsecond": "MICROSECOND", "microseconds": "MICROSECOND",
}  # fmt: skip


def date_trunc(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    unit = node.args.get("unit")
    name = _TRUNC.get(unit.name.lower() if unit is not None else "")
    if name is None:
        raise refuse(f"date_trunc to {unit.name.lower() if unit is not None else 'this unit'}")
    a = lw.expr(node.this, ctx)
    if a.type == "DATE":
        # DuckDB's date_trunc of a DATE is a TIMESTAMP (midnight); Spark's trunc keeps a DATE,
        # cast to TIMESTAMP_NTZ without any time zone. Below a day, the date itself.
        if name in ("YEAR", "QUARTER", "MONTH"):
            out = cast_to(fn("TRUNC", a.node, exp.Literal.string(name)), "TIMESTAMP")
        else:
            out = cast_to(a.node, "TIMESTAMP")
        return Lowered(out, "TIMESTAMP", a.fails)
    if a.type == "TIMESTAMP":
        # Spark's date_trunc returns a TIMESTAMP in the session's zone, pinned to UTC by
        # dpsql: cast back to the zone-less TIMESTAMP_NTZ, the same wall-clock value.
        out = cast_to(fn("DATE_TRUNC", exp.Literal.string(name), a.node), "TIMESTAMP")
        return Lowered(out, "TIMESTAMP", a.fails)
    raise refuse(f"date_trunc of a {a.type} value")
