"""HISTOGRAM on Spark: the SELECT rewritten to count each value first (``rewrite_histogram``),
then one sorted map per group (``collect_histogram``).
"""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp

from dpsql.engine.spark.dialect import refuse
from dpsql.engine.spark.nodes import (
    Context,
    Lowered,
    Lowering,
    aggregate_context,
    case_when,
    fn,
    is_null,
)


def rewrite_histogram(sel: exp.Select, fresh: Callable[[str], str]) -> exp.Select:
    """``SELECT keys, HISTOGRAM(b) FROM src GROUP BY keys`` (a map of value -> count, which
    Spark lacks) as ``SELECT keys, _DPSQL_HISTOGRAM(b, n) FROM (SELECT keys, b, COUNT(*) AS n
    FROM src GROUP BY keys, b) GROUP BY keys``: each value's count first, then one map per key."""
    group = sel.args.get("group")
    keys = list(group.expressions) if group is not None else []
    if not all(isinstance(k, exp.Column) for k in keys):
        raise refuse("HISTOGRAM grouped by an expression")
    key_names = [k.name.lower() for k in keys]
    histogram: exp.Anonymous | None = None
    outputs: list[exp.Expression] = []
    for item in sel.expressions:
        inner = item.this if isinstance(item, exp.Alias) else item
        if isinstance(inner, exp.Anonymous) and inner.name.upper() == "HISTOGRAM":
            if histogram is not None:
                raise refuse("two HISTOGRAMs in one SELECT")
            histogram = inner
            outputs.append(item)
        elif isinstance(inner, exp.Column) and inner.name.lower() in key_names:
            outputs.append(item)
        else:
            raise refuse("HISTOGRAM next to other aggregates")
    assert histogram is not None
    if len(histogram.expressions) != 1 or not isinstance(histogram.expressions[0], exp.Column):
        raise refuse("HISTOGRAM of an expression")
    if sel.args.get("having") or sel.args.get("qualify") or sel.args.get("distinct"):
        raise refuse("HISTOGRAM with HAVING, QUALIFY or DISTINCT")
    value = histogram.expressions[0].name.lower()
    if value in key_names:
        raise refuse("HISTOGRAM of a grouping key")
    count, alias = fresh("n"), fresh("h")
    inner_select = exp.Select(
        expressions=[*[k.copy() for k in keys], histogram.expressions[0].copy(),
                     exp.Alias(this=exp.Count(this=exp.Star()), alias=exp.to_identifier(count))]
    )  # fmt: skip
    for arg in ("from_", "joins", "where"):
        if sel.args.get(arg) is not None:
            inner_select.set(
                arg, sel.args[arg].copy() if arg != "joins" else [j.copy() for j in sel.args[arg]]
            )
    inner_select.set(
        "group", exp.Group(expressions=[*[k.copy() for k in keys], histogram.expressions[0].copy()])
    )
    outer_items: list[exp.Expression] = []
    for item in outputs:
        inner = item.this if isinstance(item, exp.Alias) else item
        if inner is histogram:
            agg = exp.Anonymous(
                this="_DPSQL_HISTOGRAM", expressions=[exp.column(value), exp.column(count)]
            )
            outer_items.append(
                exp.Alias(this=agg, alias=item.args["alias"].copy())
                if isinstance(item, exp.Alias)
                else agg
            )
        else:
            ref = exp.column(inner.name)
            outer_items.append(
                exp.Alias(this=ref, alias=item.args["alias"].copy())
                if isinstance(item, exp.Alias)
                else ref
            )
    outer = exp.Select(expressions=outer_items)
    outer.set(
        "from_",
        exp.From(
            this=exp.Subquery(
                this=inner_select, alias=exp.TableAlias(this=exp.to_identifier(alias))
            )
        ),
    )
    if keys:
        outer.set("group", exp.Group(expressions=[exp.column(n) for n in key_names]))
    return outer  # (a WITH of ``sel`` is lowered by ``query``, around it)


def collect_histogram(lw: Lowering, node: exp.Anonymous, ctx: Context) -> Lowered:
    """The map value -> count of one group, from the counts per value (``rewrite_histogram``):
    sorted by value (a deterministic map), NULL values left out and NULL with no value, as
    DuckDB's HISTOGRAM."""
    inner = aggregate_context(ctx, "_DPSQL_HISTOGRAM")
    value, count = (lw.expr(e, inner) for e in node.expressions)
    entry = case_when(
        (is_null(value.node), exp.Null()), default=fn("STRUCT", value.node, count.node)
    )
    entries = fn("MAP_FROM_ENTRIES", fn("ARRAY_SORT", fn("COLLECT_LIST", entry)))
    none = exp.EQ(this=exp.Count(this=value.node), expression=exp.Literal.number(0))
    return Lowered(case_when((none, exp.Null()), default=entries), f"MAP({value.type},BIGINT)")
