"""The public domains a GROUP BY key expression has by its form (a bare column's is the policy's).

A CASE whose every branch is a literal has the values it writes; a fixed date part (month,
weekday, hour, ...) of any date column has every value of that part; the year or date_trunc of
a column whose policy declares its ``date_range`` has every value in that range. Rows outside a
public key's domain are dropped before bounding.
"""

from __future__ import annotations

import datetime as dt
from fractions import Fraction

from sqlglot import exp

from dpsql.analyze.scope import Relation
from dpsql.policy import PublicValue


def _case_literals(expr: exp.Expression) -> tuple[PublicValue, ...] | None:
    """The values of a CASE whose every branch is a literal (the keys the query writes)."""
    if not isinstance(expr, exp.Case):
        return None
    branches = [b.args.get("true") for b in expr.args.get("ifs") or []]
    default = expr.args.get("default")
    values: list[PublicValue] = []
    for branch in [*branches, default]:
        if branch is None or isinstance(branch, exp.Null):
            value: PublicValue = None
        elif isinstance(branch, exp.Literal):
            value = branch.this if branch.is_string else _number(str(branch.this))
        elif isinstance(branch, exp.Boolean):
            value = bool(branch.this)
        else:
            return None
        if value not in values:
            values.append(value)
    return tuple(values)


# Date parts whose values are public whatever the data: every month, weekday, hour, ...
_FIXED_PARTS: dict[str, range] = {
    "month": range(1, 13),
    "quarter": range(1, 5),
    "dayofweek": range(7),
    "dow": range(7),
    "day": range(1, 32),
    "hour": range(24),
    "minute": range(60),
}
_PART_OF: dict[type[exp.Expression], str] = {
    exp.Month: "month",
    exp.Quarter: "quarter",
    exp.DayOfWeek: "dayofweek",
    exp.Day: "day",
    exp.Hour: "hour",
    exp.Minute: "minute",
    exp.Year: "year",
}
_TRUNC_UNITS = ("day", "month", "quarter", "year")


def _date_domain(expr: exp.Expression, relation: Relation) -> tuple[PublicValue, ...] | None:
    """The public domain of a date key: a fixed part (month, weekday, ...) of any date column,
    or date_trunc/year of a column whose policy declares its ``date_range``. Rows outside the
    domain are dropped before bounding, like those of any public key."""
    part: str | None = None
    column: exp.Expression | None = None
    if isinstance(expr, exp.Extract):
        part, column = expr.this.name.lower(), expr.expression
    elif type(expr) in _PART_OF:
        part, column = _PART_OF[type(expr)], expr.this
    if part is not None and isinstance(column, exp.Column):
        if part in _FIXED_PARTS:
            return tuple(_FIXED_PARTS[part])
        first_last = _declared_dates(column, relation)
        if part == "year" and first_last is not None:
            return tuple(range(first_last[0].year, first_last[1].year + 1))
        return None
    if isinstance(expr, exp.TimestampTrunc | exp.DateTrunc) and isinstance(expr.this, exp.Column):
        unit = expr.args.get("unit")
        first_last = _declared_dates(expr.this, relation)
        name = unit.name.lower() if unit is not None else ""
        if first_last is None or name not in _TRUNC_UNITS:
            return None
        return tuple(_truncated(name, *first_last))
    return None


def _declared_dates(column: exp.Column, relation: Relation) -> tuple[dt.date, dt.date] | None:
    col = relation.columns.get(column.name)
    if col is None or col.spec is None or col.spec.date_range is None:
        return None
    first, last = col.spec.date_range
    as_date = [d.date() if isinstance(d, dt.datetime) else d for d in (first, last)]
    return as_date[0], as_date[1]


def _truncated(unit: str, first: dt.date, last: dt.date) -> list[PublicValue]:
    """Every value of date_trunc(unit, d) for d in [first, last] (DuckDB returns TIMESTAMP)."""
    if unit == "day":
        start = first
    else:
        months = {"month": 1, "quarter": 3, "year": 12}[unit]
        month = (first.month - 1) // months * months + 1
        start = dt.date(first.year, month, 1)
    values: list[PublicValue] = []
    current = start
    while current <= last:
        values.append(dt.datetime(current.year, current.month, current.day))
        if unit == "day":
            current += dt.timedelta(days=1)
        else:
            step = {"month": 1, "quarter": 3, "year": 12}[unit]
            index = current.year * 12 + current.month - 1 + step
            current = dt.date(index // 12, index % 12 + 1, 1)
    return values


def _number(text: str) -> int | float:
    value = Fraction(text)
    return int(value) if value.denominator == 1 else float(value)
