"""Queries the engine is sure to plan: the pre-charge check can be left out for them.

Before the charge, the engine binds and plans the bounded SQL
(``dpsql.session.planning.check_soon``), so that a query it cannot type, or whose constants its
optimizer refuses to fold, is refused for free instead of failing after its charge. That check reads
no rows: its outcome is a function of the query and the schema, and it exists for the analyst's sake
(a query that cannot run should cost nothing), not for privacy: a query that fails after its charge
has paid for it.

Binding and planning the bounded SQL costs DuckDB 2-5 ms, most of a first execution's overhead.
This module recognises a grammar of queries whose every expression is typed by construction:
one table read directly, aggregates of bare columns of a numeric type (or COUNT), GROUP BY bare
columns, date parts and truncations of DATE or TIMESTAMP columns, or CASE keys with literal
results of one family, and a WHERE made of AND, OR and NOT over comparisons of a bare column
with a literal of the column's own family (number with number, text with text, boolean with
boolean), IN lists, BETWEEN and IS NULL. Nothing in it can fail to bind or to fold: no cast
of a text to a number or date, no function of a constant, no arithmetic.
``tests/analyze/test_binds.py`` generates queries of the grammar under every bounding setting and
requires the engine's check to pass on each, so a grammar that grew too far fails there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from sqlglot import exp

__all__ = ["provably_binds"]

# Signed only: an unsigned column compared with a negative literal is a cast that can fail.
_INTEGERS = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT"}
_FLOATS = {"DOUBLE", "FLOAT", "REAL"}
_NUMBERS = _INTEGERS | _FLOATS
_TEXT = {"VARCHAR"}
_BOOLEAN = {"BOOLEAN"}
# Aggregates of one bare numeric column (COUNT of any column).
_AGGREGATES = (exp.Sum, exp.Avg, exp.Stddev, exp.StddevSamp, exp.StddevPop, exp.Variance,
               exp.VariancePop)  # fmt: skip
_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)
_LARGEST = 1e15  # literals well inside every numeric type's range, exact as doubles


def provably_binds(select: exp.Expression, columns: Mapping[str, str]) -> bool:
    """True if ``select`` (validated, parameters bound) is in the grammar above over a table
    whose columns have the engine types ``columns`` (lower-case names)."""
    if not isinstance(select, exp.Select) or {k for k, v in select.args.items() if v} - _CLAUSES:
        return False
    source = select.args.get("from_") or select.args.get("from")
    if source is None or not isinstance(source.this, exp.Table):
        return False
    table = source.this
    if not isinstance(table.this, exp.Identifier) or set(table.args) - {"this", "alias"}:
        return False
    # A column may be qualified by the alias, or by the name where there is no alias (the
    # engine does not resolve a table's name once it is aliased).
    scope: Columns = {"": columns, table.alias_or_name.lower(): columns}  # by qualifier
    aliases: dict[str, exp.Expression] = {}
    for item in select.expressions:
        node = item.this if isinstance(item, exp.Alias) else item
        if isinstance(item, exp.Alias):
            aliases[item.alias.lower()] = node
        if not (_key(node, scope) or _aggregate(node, scope)):
            return False
    group = select.args.get("group")
    for g in group.expressions if group is not None else ():
        key = g
        if isinstance(g, exp.Column) and not g.table and _column_type(g, scope) is None:
            key = aliases.get(g.name.lower(), g)  # GROUP BY an output's alias
        if not _key(key, scope):
            return False
    where = select.args.get("where")
    return where is None or _predicate(where.this, scope)


# Clauses of a SELECT the grammar allows; HAVING, ORDER BY, LIMIT and OFFSET are
# post-processing, bound on their own over the noisy values.
_CLAUSES = {
    "expressions", "from", "from_", "where", "group", "having", "order", "limit", "offset",
}  # fmt: skip


Columns = Mapping[str, Mapping[str, str]]  # qualifier ("" for none) -> column -> type


def _column_type(node: exp.Expression, columns: Columns) -> str | None:
    """The type of a bare column, unqualified or qualified by the table's name or alias."""
    if not isinstance(node, exp.Column) or not isinstance(node.this, exp.Identifier):
        return None
    if set(node.args) - {"this", "table"} and any(
        node.args.get(k) for k in set(node.args) - {"this", "table"}
    ):
        return None
    return columns.get(node.table.lower(), {}).get(node.name.lower())


_TIMES = {"DATE", "TIMESTAMP"}
_PARTS = (exp.Year, exp.Quarter, exp.Month, exp.Day, exp.DayOfWeek)
_TRUNC_UNITS = {"day", "month", "quarter", "year", "hour", "minute", "second"}


def _key(node: exp.Expression, columns: Columns) -> bool:
    """A GROUP BY key of the grammar: a bare column; a date part or a truncation of a bare
    DATE or TIMESTAMP column (typed, with no constant to fold); or a CASE whose conditions are
    predicates of the grammar and whose results are literals of one family (texts, or
    integers), NULL aside (no branch is cast to another branch's type)."""
    if _column_type(node, columns) is not None:
        return True
    if isinstance(node, (*_PARTS, exp.Hour)):
        kinds = _TIMES if not isinstance(node, exp.Hour) else {"TIMESTAMP"}
        return (_column_type(node.this, columns) or "") in kinds
    if isinstance(node, exp.TimestampTrunc | exp.DateTrunc):
        unit = node.args.get("unit")
        if not isinstance(unit, exp.Var) or unit.name.lower() not in _TRUNC_UNITS:
            return False
        return (
            (_column_type(node.this, columns) or "") in _TIMES
            and set(node.args) <= {"this", "unit", "zone"}
            and node.args.get("zone") is None
        )
    if isinstance(node, exp.Case):
        if node.this is not None:  # CASE x WHEN ...: compares x with each branch's value
            return False
        results = [i.args.get("true") for i in node.args.get("ifs") or []]
        if not results or not all(
            isinstance(i, exp.If) and _predicate(i.this, columns) for i in node.args["ifs"]
        ):
            return False
        if node.args.get("default") is not None:
            results.append(node.args["default"])
        values = [r for r in results if not isinstance(r, exp.Null)]
        texts = all(isinstance(r, exp.Literal) and r.is_string for r in values)
        integers = all(
            isinstance(r, exp.Literal) and r.is_int and abs(int(r.this)) < _LARGEST for r in values
        )
        return bool(values) and (texts or integers)
    return False


def _aggregate(node: exp.Expression, columns: Columns) -> bool:
    if isinstance(node, exp.Count):
        arg = node.this
        if arg is None or isinstance(arg, exp.Star):
            return True
        if isinstance(arg, exp.Distinct):
            return (
                len(arg.expressions) == 1 and _column_type(arg.expressions[0], columns) is not None
            )
        return _column_type(arg, columns) is not None
    if isinstance(node, _AGGREGATES) and not node.args.get("expressions"):
        return (_column_type(node.this, columns) or "") in _NUMBERS
    return False


def _predicate(node: exp.Expression, columns: Columns) -> bool:
    if isinstance(node, exp.Paren):
        return _predicate(node.this, columns)
    if isinstance(node, exp.And | exp.Or):
        return _predicate(node.this, columns) and _predicate(node.expression, columns)
    if isinstance(node, exp.Not):
        return _predicate(node.this, columns)
    if isinstance(node, exp.Is):
        return _column_type(node.this, columns) is not None and isinstance(
            node.expression, exp.Null
        )
    if isinstance(node, _COMPARISONS):
        return _matches(node.this, node.expression, columns)
    if isinstance(node, exp.Between):
        return _matches(node.this, node.args.get("low"), columns) and _matches(
            node.this, node.args.get("high"), columns
        )
    if isinstance(node, exp.In):
        values = node.expressions
        if node.args.get("query") or node.args.get("unnest") or not values:
            return False
        return all(_matches(node.this, v, columns) for v in values)
    return False


def _matches(column: exp.Expression, literal: exp.Expression | None, columns: Columns) -> bool:
    """A bare column and a literal of the same family."""
    kind = _column_type(column, columns)
    if kind is None or literal is None:
        return False
    if kind in _NUMBERS:
        return _number(literal)
    if kind in _TEXT:
        return isinstance(literal, exp.Literal) and literal.is_string
    if kind in _BOOLEAN:
        return isinstance(literal, exp.Boolean)
    return False


def _number(node: exp.Expression) -> bool:
    if isinstance(node, exp.Neg):
        node = node.this
    if not isinstance(node, exp.Literal) or node.is_string:
        return False
    try:
        value = float(node.this)
    except ValueError:
        return False
    return math.isfinite(value) and abs(value) < _LARGEST
