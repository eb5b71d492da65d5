"""Constant date arithmetic with INTERVAL, folded into the date it gives before validation.

``DATE '1998-12-01' - INTERVAL '90' DAY`` (TPC-H writes its date ranges so) reads no data: it
is replaced by ``DATE '1998-09-02'``, computed here as DuckDB computes it (a month or year
added to a day past the end of the target month gives that month's last day). Only a date
literal (``DATE '...'`` or ``CAST('...' AS DATE)``) plus or minus an interval of a whole number
of days, weeks, months or years is folded; any other INTERVAL stays and is refused by
``dpsql.sql.validate`` as before. DuckDB types the unfolded expression as a TIMESTAMP at
midnight: beside a DATE it compares alike, so a filter selects the same rows.

>>> import sqlglot
>>> tree = sqlglot.parse_one("SELECT 1 FROM t WHERE d < DATE '1995-01-31' + INTERVAL '1' MONTH")
>>> fold_intervals(tree).sql("duckdb")
"SELECT 1 FROM t WHERE d < CAST('1995-02-28' AS DATE)"
"""

from __future__ import annotations

import calendar
import datetime as dt
import re

from sqlglot import exp

from dpsql.policy.blocks import iso_date
from dpsql.sql.tree import transform

_UNITS = {"DAY": "day", "DAYS": "day", "WEEK": "week", "WEEKS": "week", "MONTH": "month",
          "MONTHS": "month", "YEAR": "year", "YEARS": "year"}  # fmt: skip
_AMOUNT = re.compile(r"^\s*([+-]?\d{1,6})\s*$")


def _date(node: exp.Expression) -> dt.date | None:
    """The date of a date literal, else None."""
    if not (isinstance(node, exp.Cast) and node.to.is_type(exp.DataType.Type.DATE)):
        return None
    literal = node.this
    if not (isinstance(literal, exp.Literal) and literal.is_string):
        return None
    return iso_date(str(literal.this))


def _interval(node: exp.Expression) -> tuple[int, str] | None:
    """(amount, unit) of ``INTERVAL 'n' UNIT`` with n a whole number, else None."""
    if not isinstance(node, exp.Interval):
        return None
    unit = node.args.get("unit")
    amount = node.this
    if unit is None or not isinstance(amount, exp.Literal):
        return None
    name = _UNITS.get(unit.name.upper())
    match = _AMOUNT.match(str(amount.this))
    if name is None or match is None:
        return None
    return int(match.group(1)), name


def _shifted(day: dt.date, amount: int, unit: str) -> dt.date:
    """``day`` plus ``amount`` units, as DuckDB adds an interval to a date; OverflowError or
    ValueError outside years 1 to 9999."""
    if unit in ("day", "week"):
        return day + dt.timedelta(days=amount * (7 if unit == "week" else 1))
    months = day.year * 12 + (day.month - 1) + amount * (12 if unit == "year" else 1)
    year, month = divmod(months, 12)
    last = calendar.monthrange(year, month + 1)[1] if 1 <= year <= 9999 else 0
    return dt.date(year, month + 1, min(day.day, last) if last else day.day)


def _folded(node: exp.Expression) -> exp.Expression:
    if not isinstance(node, exp.Add | exp.Sub):
        return node
    # Its operands first: a chain (DATE + INTERVAL 1 YEAR - INTERVAL 1 DAY) folds inside out.
    left, right = _folded(node.this), _folded(node.expression)
    if left is not node.this or right is not node.expression:
        node = node.__class__(this=left, expression=right)
    day, interval = _date(node.this), _interval(node.expression)
    if isinstance(node, exp.Add) and (day is None or interval is None):
        day, interval = _date(node.expression), _interval(node.this)  # INTERVAL + DATE
    if day is None or interval is None:
        return node
    amount, unit = interval
    try:
        result = _shifted(day, -amount if isinstance(node, exp.Sub) else amount, unit)
    except (OverflowError, ValueError):
        return node  # left as written: refused as any INTERVAL is
    return exp.cast(exp.Literal.string(result.isoformat()), exp.DataType.Type.DATE)


def fold_intervals(select: exp.Expression) -> exp.Expression:
    """``select`` with every constant date ± INTERVAL replaced by its date (module docstring)."""
    return transform(select, _folded)


__all__ = ["fold_intervals"]
