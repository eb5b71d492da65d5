"""Allow-list validation of a SELECT's AST: every node type and function must be known (the
aggregate functions are listed in ``dpsql.sql.aggregates``).

Anything not on the list is rejected with ``UnsupportedQueryError`` naming the construct, before
any analysis: unknown functions may read files (``read_csv``), touch settings or raise on data.
The row-level functions here are total in DuckDB or made total by the rewrite (``TRY``), so
whether a query errors never depends on the data.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.errors import UnsupportedQueryError
from dpsql.sql.aggregates import aggregate_nodes, function_of

# Structure of a single-table SELECT.
_STRUCTURE: tuple[type[exp.Expression], ...] = (
    exp.Select,
    exp.From,
    exp.Table,
    exp.TableAlias,
    exp.Where,
    exp.Group,
    exp.Having,
    exp.Order,
    exp.Ordered,
    exp.Limit,
    exp.Offset,
    exp.Column,
    exp.Identifier,
    exp.Alias,
    exp.Star,
    exp.Paren,
    exp.DataType,
    exp.DataTypeParam,
    # Joins, CTEs and FROM-subqueries: dpsql.analyze.relations decides which keep bounding valid.
    exp.Join,
    exp.With,
    exp.CTE,
    exp.Subquery,
)
# Literals and operators.
_OPERATORS: tuple[type[exp.Expression], ...] = (
    exp.Literal,
    exp.Null,
    exp.Boolean,
    exp.Neg,
    exp.Not,
    exp.And,
    exp.Or,
    exp.EQ,
    exp.NEQ,
    exp.GT,
    exp.GTE,
    exp.LT,
    exp.LTE,
    exp.Is,
    exp.In,
    exp.Between,
    exp.Like,
    exp.ILike,
    exp.Add,
    exp.Sub,
    exp.Mul,
    exp.Div,
    exp.IntDiv,
    exp.Mod,
    exp.DPipe,
    exp.Case,
    exp.If,
    exp.Cast,
    exp.TryCast,
)
# Row-level functions: total in DuckDB, or wrapped in TRY by the rewrite.
_FUNCTIONS: tuple[type[exp.Expression], ...] = (
    exp.Coalesce,
    exp.Nullif,
    exp.Abs,
    exp.Round,
    exp.Floor,
    exp.Ceil,
    exp.Sign,
    exp.Trunc,
    exp.Least,
    exp.Greatest,
    exp.Ln,
    exp.Log,
    exp.Sqrt,
    exp.Exp,
    exp.Pow,
    exp.IsNan,
    exp.IsInf,
    exp.Lower,
    exp.Upper,
    exp.Length,
    exp.Substring,
    exp.Trim,
    exp.Concat,
    exp.StartsWith,
    exp.Contains,
    exp.Year,
    exp.Month,
    exp.Day,
    exp.DayOfWeek,
    exp.Extract,
    exp.Var,
    exp.DateTrunc,
    exp.TimestampTrunc,
    exp.Quarter,
    exp.Hour,
    exp.Minute,
)
_DISTINCT = (exp.Distinct,)

# With the aggregate functions answered with noise, listed in ``dpsql.sql.aggregates``; a query
# is checked against that table as it stands (``function_of``), so a test may extend it.
ALLOWED: tuple[type[exp.Expression], ...] = (
    _STRUCTURE + _OPERATORS + _FUNCTIONS + aggregate_nodes() + _DISTINCT
)

# Why some common constructs are refused, in words a user can act on.
_REASONS: dict[type[exp.Expression], str] = {
    exp.Union: "UNION, INTERSECT and EXCEPT are supported only as a FROM-subquery or a CTE; run "
    "the queries separately",
    exp.Window: "window functions are not supported: they release row-level values",
    exp.Rand: "random() is not supported: the only randomness is dpsql's noise",
    exp.Filter: "aggregate FILTER clauses are not supported; use a CASE inside the aggregate",
    exp.Anonymous: "this function is not on dpsql's allow-list",
    exp.Placeholder: "a parameter marker was left unbound",
    exp.Dot: "qualified names (schema.function, catalog probes such as psql's \\d) are not "
    "supported",
}


def _a_relation(node: exp.Expression) -> bool:
    """Whether a set operation is a relation: the body of a FROM-subquery or a CTE (through
    any nesting of set operations and parentheses), never a value (``IN (...)``, a scalar)."""
    parent = node.parent
    while isinstance(parent, exp.SetOperation) or (
        isinstance(parent, exp.Subquery) and isinstance(parent.parent, exp.SetOperation)
    ):
        node, parent = parent, parent.parent
    if isinstance(parent, exp.CTE):
        return True
    return isinstance(parent, exp.Subquery) and isinstance(parent.parent, exp.From | exp.Join)


def describe(node: exp.Expression) -> str:
    """A user-facing name of an AST node: the SQL keyword or function name."""
    if isinstance(node, exp.Anonymous):
        return f"function {str(node.this).upper()}()"
    if isinstance(node, exp.Func):
        return f"function {node.sql_name()}()"
    return node.key.upper()


# Expressions nested deeper than this are refused: the bounded query nests them further, and
# sqlglot's recursive generator and parser must handle the result.
MAX_DEPTH = 32


def _depth(node: exp.Expression) -> int:
    deepest, stack = 0, [(node, 1)]
    while stack:
        current, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in current.iter_expressions())
    return deepest


# date_trunc units and EXTRACT parts that are total on every DATE and TIMESTAMP. DuckDB raises on
# others: 'week' and 'isoyear' truncate the earliest dates out of range (even while planning, from
# the column's statistics), and the time zone parts of a DATE are not implemented.
_TRUNC_UNITS = frozenset(
    {"microsecond", "microseconds", "millisecond", "milliseconds", "second", "seconds",
     "minute", "minutes", "hour", "hours", "day", "days", "month", "months", "quarter",
     "quarters", "year", "years", "decade", "decades", "century", "centuries", "millennium",
     "millennia"}
)  # fmt: skip
_BAD_PARTS = frozenset({"timezone", "timezone_hour", "timezone_minute"})


def _check_date_parts(select: exp.Select) -> None:
    for node in select.find_all(exp.TimestampTrunc, exp.DateTrunc):
        unit = node.args.get("unit")
        name = unit.name.lower() if unit is not None else ""
        if name not in _TRUNC_UNITS:
            raise UnsupportedQueryError(
                f"date_trunc to {name or 'this unit'} is not supported; use day, month, "
                "quarter, year, hour, minute or second"
            )
    for extract in select.find_all(exp.Extract):
        if extract.this.name.lower() in _BAD_PARTS:
            raise UnsupportedQueryError(
                f"EXTRACT({extract.this.name.upper()} ...) is not supported"
            )


# Distinct aggregate calls in one query, and the nodes of their expressions together: planning
# costs grow with each (its bounds, grid and measurements; the bounded SQL the engine checks),
# and EXPLAIN is free, so a query past either is refused on its text alone (benchmarks/
# planning.py measures EXPLAIN's CPU time up to them).
MAX_AGGREGATES = 24
MAX_AGGREGATE_NODES = 320
# Nodes of the whole query (a long IN list, many OR'ed conditions): each pass of planning
# (analysis, totality, the bounded SQL, the cache keys) walks them all.
MAX_NODES = 4000


def _aggregates(select: exp.Select) -> tuple[int, int]:
    """The distinct aggregate calls of ``select`` and their nodes in all."""
    calls = {node.sql(): node for node in select.find_all(exp.AggFunc)}
    return len(calls), sum(sum(1 for _ in node.walk()) for node in calls.values())


def validate(select: exp.Select) -> None:
    """Raise ``UnsupportedQueryError`` at the first node that is not on the allow-list."""
    if _depth(select) > MAX_DEPTH:
        raise UnsupportedQueryError(
            f"the query nests expressions more than {MAX_DEPTH} levels deep"
        )
    if sum(1 for _ in select.walk()) > MAX_NODES:
        raise UnsupportedQueryError(
            f"the query has more than {MAX_NODES:,} expression nodes; split it into smaller queries"
        )
    calls, nodes = _aggregates(select)
    if calls > MAX_AGGREGATES:
        raise UnsupportedQueryError(
            f"the query has more than {MAX_AGGREGATES} distinct aggregates; ask them in "
            "separate queries"
        )
    if nodes > MAX_AGGREGATE_NODES:
        raise UnsupportedQueryError(
            f"the query's aggregates have more than {MAX_AGGREGATE_NODES} expression nodes in "
            "all; ask them in separate queries"
        )
    for node in select.walk():
        assert isinstance(node, exp.Expression)
        if isinstance(node, ALLOWED) or function_of(node) is not None:
            continue
        if isinstance(node, exp.SetOperation) and _a_relation(node):
            continue  # checked by the analysis (dpsql.analyze.setops)
        reason = next((r for t, r in _REASONS.items() if isinstance(node, t)), None)
        name = describe(node)
        if reason is None:
            reason = f"{name} is not supported"
        elif isinstance(node, exp.Anonymous):
            reason = f"{name}: {reason}"
        raise UnsupportedQueryError(reason)
    if select.args.get("distinct"):
        raise UnsupportedQueryError("SELECT DISTINCT is not supported; use GROUP BY")
    _check_date_parts(select)
    for table in select.find_all(exp.Table):
        if table.args.get("db") or table.args.get("catalog"):
            raise UnsupportedQueryError("qualified table names (schema.table) are not supported")
        if not isinstance(table.this, exp.Identifier):
            raise UnsupportedQueryError("table functions are not supported in FROM")
