"""The dispatch table of the lowering: which function lowers each kind of node of the bounded
query (``HANDLERS``, by sqlglot class) and each function sqlglot parses as an anonymous call
(``FUNCTIONS``, by upper-case name), as sqlglot's generators map each class to its SQL
(``TRANSFORMS``).

``lowerer.Lowerer.expr`` reads these tables, and nothing else makes a node lowerable: a node
whose exact class (or anonymous function's name) is not listed is refused, naming the
construct. A new construct is one function in the module of its kind and one entry here.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.engine.spark import (
    aggregates,
    arith,
    branches,
    casts,
    dates,
    functions,
    histogram,
    leaves,
    lists,
    logic,
    sums,
)
from dpsql.engine.spark.nodes import FunctionHandler, Handler

HANDLERS: dict[type[exp.Expression], Handler] = {
    # leaves
    exp.Paren: leaves.paren,
    exp.Column: leaves.column,
    exp.Literal: leaves.literal,
    exp.Null: leaves.null,
    exp.Boolean: leaves.boolean,
    exp.Placeholder: leaves.parameter,
    exp.Parameter: leaves.parameter,
    exp.Try: leaves.try_expression,
    # casts
    exp.Cast: casts.cast,
    exp.TryCast: casts.try_cast,
    # arithmetic
    exp.Add: arith.arithmetic,
    exp.Sub: arith.arithmetic,
    exp.Mul: arith.arithmetic,
    exp.Div: arith.divide,
    exp.IntDiv: arith.int_div_mod,
    exp.Mod: arith.int_div_mod,
    exp.Neg: arith.negate,
    exp.Abs: arith.absolute,
    # comparisons and logic
    exp.EQ: logic.compare,
    exp.NEQ: logic.compare,
    exp.GT: logic.compare,
    exp.GTE: logic.compare,
    exp.LT: logic.compare,
    exp.LTE: logic.compare,
    exp.NullSafeEQ: logic.null_safe_compare,
    exp.NullSafeNEQ: logic.null_safe_compare,
    exp.And: logic.connective,
    exp.Or: logic.connective,
    exp.Not: logic.negation,
    exp.Is: logic.is_test,
    exp.In: logic.in_test,
    exp.Between: logic.between,
    # CASE-like expressions
    exp.Case: branches.case_expression,
    exp.If: branches.if_expression,
    exp.Coalesce: branches.coalesce,
    exp.Nullif: branches.nullif,
    exp.Least: branches.least_greatest,
    exp.Greatest: branches.least_greatest,
    # numeric and text functions
    exp.IsNan: functions.isnan,
    exp.IsInf: functions.isinf,
    exp.Round: functions.round_number,
    exp.Floor: functions.floor_ceil,
    exp.Ceil: functions.floor_ceil,
    exp.Length: functions.length,
    exp.DPipe: functions.pipe_concat,
    exp.Concat: functions.concat,
    exp.Like: functions.like,
    exp.Substring: functions.substring,
    exp.SHA2: functions.sha2,
    exp.Left: functions.left,
    exp.Trim: functions.trim,
    exp.StartsWith: functions.starts_contains,
    exp.Contains: functions.starts_contains,
    # dates
    exp.Year: dates.date_part("year"),
    exp.Month: dates.date_part("month"),
    exp.Day: dates.date_part("day"),
    exp.Quarter: dates.date_part("quarter"),
    exp.Hour: dates.date_part("hour"),
    exp.Minute: dates.date_part("minute"),
    exp.DayOfWeek: dates.date_part("dayofweek"),
    exp.Extract: dates.extract,
    exp.TimestampTrunc: dates.date_trunc,
    exp.DateTrunc: dates.date_trunc,
    # lists
    exp.ArraySort: lists.list_sort,
    # aggregates, windows, UNNEST
    exp.Count: aggregates.count,
    exp.Sum: aggregates.integer_sum,
    exp.Min: aggregates.min_max,
    exp.Max: aggregates.min_max,
    exp.Filter: aggregates.aggregate_filter,
    exp.ArrayAgg: aggregates.array_agg,
    exp.ArgMin: aggregates.arg_min,
    exp.Explode: aggregates.unnest,
    exp.Window: aggregates.window,
}

FUNCTIONS: dict[str, FunctionHandler] = {
    "HASH": lists.hash_function,
    "LIST_SLICE": lists.list_slice,
    # Aggregates: FSUM and FAVG as DuckDB writes them, _DPSQL_HISTOGRAM as the lowering's own
    # rewrite of HISTOGRAM writes it (``histogram.rewrite_histogram``).
    "FSUM": sums.fsum,
    "FAVG": sums.favg,
    "_DPSQL_HISTOGRAM": histogram.collect_histogram,
}
