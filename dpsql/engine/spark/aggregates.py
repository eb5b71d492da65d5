"""Aggregates, windows and UNNEST: COUNT, exact integer SUM, MIN and MAX, FILTER, sorted
lists, ARG_MIN by the keyed hash, and windows ordered totally by the hash.
"""

from __future__ import annotations

from dataclasses import replace

from sqlglot import exp

from dpsql.engine.spark.dialect import SparkOut, refuse
from dpsql.engine.spark.lists import keyed_hash
from dpsql.engine.spark.nodes import (
    Context,
    Lowered,
    Lowering,
    aggregate_context,
    case_when,
    cast_to,
    fn,
    is_null,
)
from dpsql.engine.spark.types import INT_RANK, element_type, is_int, norm_type
from dpsql.sql.validate import describe

# -- aggregates, windows, UNNEST --------------------------------------------------------------


def count(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    inner = aggregate_context(ctx, "COUNT")
    arg = node.this
    if arg is None or isinstance(arg, exp.Star):
        return Lowered(exp.Count(this=exp.Star()), "BIGINT", bits=63)
    if isinstance(arg, exp.Distinct):
        if len(arg.expressions) != 1:
            raise refuse("COUNT(DISTINCT ...) of several values")
        a = lw.expr(arg.expressions[0], inner)
        if a.type.startswith("?") or a.type.startswith("MAP"):
            raise refuse(f"COUNT(DISTINCT ...) of {a.type.lstrip('?')}")
        # Both engines count -0.0 with 0.0 and every NaN as one value.
        return Lowered(exp.Count(this=exp.Distinct(expressions=[a.node])), "BIGINT", bits=63)
    a = lw.expr(arg, inner)
    return Lowered(exp.Count(this=a.node), "BIGINT", bits=63)


def _sum_of(a: Lowered) -> exp.Expression:
    if is_int(a.type):
        # DuckDB sums integers in HUGEINT; Spark's SUM of BIGINT raises past 2^63: exact
        # decimals instead.
        arg = a.node if a.type == "HUGEINT" else cast_to(a.node, "HUGEINT")
        return exp.Sum(this=arg)
    # A floating SUM depends on the order of the rows on Spark; the bounded query has none.
    raise refuse(f"SUM of {a.type} values")


def count_total(lw: Lowering, node: exp.Cast, ctx: Context) -> Lowered | None:
    """``CAST(SUM(x) AS BIGINT)`` of an integer x, as a SUM of BIGINTs (None: another CAST).

    DuckDB sums exactly and its CAST fails only if the total leaves BIGINT; Spark's SUM of
    BIGINTs fails (ANSI mode) if any partial sum does. The two agree where no partial sum can
    leave BIGINT, which holds where the planner writes this: totals of non-negative row counts
    of one table (``dpsql.bound.values._count_sum``), never above its row count; elsewhere Spark
    could fail where DuckDB answers, never answer otherwise. No other part of the bounded query
    writes a CAST around a SUM (an analyst's SUM inside a subquery is a column of its own,
    ``dpsql.analyze.per_unit``): ``tests/bound/test_breadth_golden.py`` checks both."""
    total = node.this
    if type(node) is not exp.Cast or not isinstance(total, exp.Sum):
        return None
    if norm_type(node.to.sql("duckdb")) != "BIGINT" or isinstance(total.this, exp.Distinct):
        return None
    inner = aggregate_context(ctx, "SUM")
    a = lw.expr(total.this, inner)
    if not is_int(a.type):
        return None
    # A HUGEINT count (a weight summed per unit, R's path) is a non-negative term of the total:
    # at most the total, so it fits BIGINT too.
    term = a.node if INT_RANK[a.type] <= INT_RANK["BIGINT"] else cast_to(a.node, "BIGINT")
    return Lowered(exp.Sum(this=term), "BIGINT", bits=63)


def integer_sum(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    inner = aggregate_context(ctx, "SUM")
    if isinstance(node.this, exp.Distinct):
        raise refuse("SUM(DISTINCT ...)")
    return Lowered(_sum_of(lw.expr(node.this, inner)), "HUGEINT")


def min_max(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    inner = aggregate_context(ctx, describe(node))
    if node.expressions:
        raise refuse(f"{describe(node)} of several values")
    a = lw.expr(node.this, inner)
    if a.type.startswith("?") or a.type.startswith("LIST") or a.type.startswith("MAP"):
        raise refuse(f"{describe(node)} of {a.type.lstrip('?')}")
    # Both engines order NaN above every number and text by its bytes.
    return Lowered(node.__class__(this=a.node), a.type)


def _not_null_test(cond: exp.Expression, value: exp.Expression) -> bool:
    """Whether the FILTER ``cond`` keeps only rows where ``value`` is not NULL."""
    while isinstance(cond, exp.Paren):
        cond = cond.this
    if isinstance(cond, exp.And):
        return _not_null_test(cond.this, value) or _not_null_test(cond.expression, value)
    target = value.sql("duckdb")
    if isinstance(cond, exp.Not) and isinstance(cond.this, exp.Is):
        inner = cond.this
        return isinstance(inner.expression, exp.Null) and inner.this.sql("duckdb") == target
    return False


def aggregate_filter(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    where = node.expression
    assert isinstance(where, exp.Where)
    agg = node.this
    inner = aggregate_context(ctx, "FILTER")
    cond = lw.boolean(where.this, inner, "FILTER")
    if isinstance(agg, exp.ArrayAgg):
        distinct = isinstance(agg.this, exp.Distinct)
        value = agg.this.expressions[0] if distinct else agg.this
        if distinct and len(agg.this.expressions) != 1:
            raise refuse("ARRAY_AGG(DISTINCT ...) of several values")
        if not _not_null_test(where.this, value):
            # Spark's collect_list drops NULLs, DuckDB's list keeps them.
            raise refuse("ARRAY_AGG without a FILTER that drops NULL values")
        a = lw.expr(value, inner)
        if a.type.startswith("?") or a.type.startswith("LIST") or a.type.startswith("MAP"):
            raise refuse(f"ARRAY_AGG of {a.type.lstrip('?')}")
        collected: exp.Expression = exp.Filter(
            this=fn("COLLECT_LIST", a.node), expression=exp.Where(this=cond.node)
        )
        if distinct:
            # array_distinct counts -0.0 with 0.0 and every NaN as one value, as DuckDB's
            # list(DISTINCT ...) does (collect_set keeps two NaNs).
            collected = fn("ARRAY_DISTINCT", collected)
        # Sorted: the list's order cannot depend on the order rows arrive in (DuckDB's list
        # order is arbitrary too; what reads it sorts it or counts it).
        listed = fn("ARRAY_SORT", collected)
        # DuckDB's list of no rows is NULL, Spark's an empty array.
        none = exp.EQ(
            this=exp.Filter(
                this=exp.Count(this=exp.Star()), expression=exp.Where(this=cond.node.copy())
            ),
            expression=exp.Literal.number(0),
        )
        return Lowered(case_when((none, exp.Null()), default=listed), f"LIST({a.type})")
    lowered = lw.expr(agg, ctx)
    if not isinstance(lowered.node, exp.Count | exp.Sum | exp.Min | exp.Max):
        raise refuse(f"FILTER on {describe(agg)}")
    return Lowered(
        exp.Filter(this=lowered.node, expression=exp.Where(this=cond.node)), lowered.type
    )


def array_agg(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    raise refuse("ARRAY_AGG without a FILTER that drops NULL values")


def arg_min(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    inner = aggregate_context(ctx, "ARG_MIN")
    order = node.expression
    if not (isinstance(order, exp.Anonymous) and order.name.upper() == "HASH"):
        raise refuse("ARG_MIN by anything but the keyed hash")
    a = lw.expr(node.this, inner)
    hashed, _ = keyed_hash(lw, order, inner)
    if a.type.startswith("?") or a.type.startswith("LIST") or a.type.startswith("MAP"):
        raise refuse(f"ARG_MIN of {a.type.lstrip('?')}")
    # DuckDB's arg_min skips rows whose value is NULL; ties of the hash are broken by the value
    # itself, so the order is total and the pick cannot depend on the order rows arrive in.
    key = case_when((is_null(a.node), exp.Null()), default=fn("STRUCT", hashed.node, a.node))
    return Lowered(fn("MIN_BY", a.node, key), a.type)


def unnest(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    if not ctx.generators:
        raise refuse("UNNEST outside the SELECT list")
    a = lw.expr(node.this, replace(ctx, generators=False, aggregates=False, windows=False))
    # One row per element; none for a NULL or empty list, on both engines.
    return Lowered(exp.Explode(this=a.node), element_type(a.type))


def _ordered(lw: Lowering, item: exp.Ordered, ctx: Context) -> tuple[exp.Ordered, Lowered]:
    a = lw.expr(item.this, ctx)
    desc = bool(item.args.get("desc"))
    nulls_first = item.args.get("nulls_first")
    if nulls_first is None:
        nulls_first = False  # DuckDB's default: NULLS LAST, ascending or descending
    # Spark's default is NULLS FIRST ascending: DuckDB's order is spelled out.
    return exp.Ordered(this=a.node, desc=desc, nulls_first=bool(nulls_first)), a


def window(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    if not ctx.windows:
        raise refuse("a window function here")
    if node.args.get("alias") or node.args.get("first") is not None:
        raise refuse("a named window")
    row_ctx = replace(ctx, aggregates=False, windows=False, generators=False, in_try=False)
    func = node.this
    if isinstance(func, exp.DenseRank) and not node.args.get("spec"):
        # Tied rows rank alike: a function of the ordering values alone, never of the order
        # a stage reads rows in (the groups' numbering of dpsql.bound.selection).
        order = node.args.get("order")
        ranked = exp.Window(
            this=exp.DenseRank(),
            partition_by=[lw.expr(p, row_ctx).node for p in node.args.get("partition_by") or []],
            order=exp.Order(expressions=[
                _ordered(lw, o, row_ctx)[0] for o in (order.expressions if order else [])
            ]),
            over="OVER",
        )  # fmt: skip
        return Lowered(ranked, "BIGINT")
    if isinstance(func, exp.RowNumber):
        call: exp.Expression = exp.RowNumber()
        result = "BIGINT"
    elif isinstance(func, exp.Sum) and not isinstance(func.this, exp.Distinct):
        call = _sum_of(lw.expr(func.this, row_ctx))
        result = "HUGEINT"
    else:
        raise refuse(f"the window function {describe(func)}")
    partition = [lw.expr(p, row_ctx) for p in node.args.get("partition_by") or []]
    order = node.args.get("order")
    items = list(order.expressions) if order is not None else []
    if not items or not (
        isinstance(items[0].this, exp.Anonymous) and items[0].this.name.upper() == "HASH"
    ):
        # Only the keyed hash makes a unit's ranking a function of its own rows; anything
        # else could tie, and ties are broken arbitrarily (differently by a recomputed stage).
        raise refuse("a window not ordered by the keyed hash")
    lowered = [_ordered(lw, item, row_ctx)[0] for item in items]
    _, hash_args = keyed_hash(lw, items[0].this, row_ctx)
    seen = {o.this.sql(dialect=SparkOut) for o in lowered} | {
        p.node.sql(dialect=SparkOut) for p in partition
    }
    for arg in hash_args:
        text = arg.node.sql(dialect=SparkOut)
        if text not in seen:
            # The hash's own arguments break its ties: rows that still tie are identical in
            # every column the ranking reads, so the order is total.
            lowered.append(exp.Ordered(this=arg.node.copy(), desc=False, nulls_first=False))
            seen.add(text)
    spec = node.args.get("spec")
    out = exp.Window(
        this=call,
        partition_by=[p.node for p in partition],
        order=exp.Order(expressions=lowered),
        over="OVER",
    )
    if spec is not None:
        if str(spec.args.get("kind") or "").upper() != "ROWS":
            # A RANGE frame groups peers: ties again.
            raise refuse("a window frame other than ROWS")
        out.set(
            "spec",
            exp.WindowSpec(
                **{
                    k: (v.copy() if isinstance(v, exp.Expression) else v)
                    for k, v in spec.args.items()
                }
            ),
        )
    return Lowered(out, result)
