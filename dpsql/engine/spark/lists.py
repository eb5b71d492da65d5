"""Lists and the keyed hash: list_sort, list_slice with a step, and DuckDB's salted hash as
xxhash64 (``keyed_hash``, which the rankings of ``aggregates`` order by too).
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.engine.spark.dialect import refuse
from dpsql.engine.spark.nodes import Context, Lowered, Lowering, fn, literal_value, operand, strict
from dpsql.engine.spark.types import element_type, is_int

# -- lists and the keyed hash --------------------------------------------------------------------


def list_sort(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    if node.args.get("expression") is not None:
        raise refuse("LIST_SORT with a sort order")
    a = lw.expr(node.this, ctx)
    element_type(a.type)
    # Ascending, NULLs last, -0.0 beside 0.0 and NaN last: DuckDB's list_sort order.
    return Lowered(fn("ARRAY_SORT", a.node), a.type, a.fails)


def _positive_step(node: exp.Expression) -> bool:
    """A list_slice step that is at least 1 on any data: a positive literal, or GREATEST of
    anything and a positive literal (as dpsql writes it)."""
    value = literal_value(node)
    if value is not None:
        return value >= 1 and value == value.to_integral_value()
    while isinstance(node, exp.Paren):
        node = node.this
    return isinstance(node, exp.Greatest) and any(
        (v := literal_value(e)) is not None and v >= 1 for e in [node.this, *node.expressions]
    )


def list_slice(lw: Lowering, node: exp.Anonymous, ctx: Context) -> Lowered:
    args = node.expressions
    if len(args) != 4:
        raise refuse("LIST_SLICE without a step")
    lst, begin, end, step = args
    inner = lst.this if isinstance(lst, exp.ArraySort) else lst  # sorting keeps the length
    same_list = isinstance(end, exp.Length) and end.this.sql("duckdb") == inner.sql("duckdb")
    if literal_value(begin) != 1 or not same_list or not _positive_step(step):
        raise refuse("LIST_SLICE other than from 1 to the list's length by a positive step")
    a, s = lw.expr(lst, ctx), lw.expr(step, ctx)
    if not is_int(s.type):
        raise refuse(f"LIST_SLICE by a step of type {s.type}")
    # Elements 1, 1 + step, ... of the list: those at a 0-based index divisible by the step
    # (Spark has no slice with a step).
    index = exp.to_identifier("_dpsql_i")
    keep = exp.EQ(
        this=exp.Mod(this=exp.column("_dpsql_i"), expression=operand(s.node)),
        expression=exp.Literal.number(0),
    )
    lam = exp.Lambda(this=keep, expressions=[exp.to_identifier("_dpsql_e"), index])
    return Lowered(fn("FILTER", a.node, lam), a.type, strict("LIST_SLICE", a, s))


def keyed_hash(lw: Lowering, node: exp.Anonymous, ctx: Context) -> tuple[Lowered, list[Lowered]]:
    """DuckDB's keyed hash, hash(a, ..., CAST($salt AS BIGINT)), as Spark's xxhash64 of the
    same arguments: a 64-bit hash keyed by the secret salt on either engine (they differ, so
    the engines keep different rows where a cap binds). Also returns the arguments."""
    args = [lw.expr(e, ctx) for e in node.expressions]
    last = node.expressions[-1] if node.expressions else None
    salted = isinstance(last, exp.Cast) and isinstance(last.this, exp.Placeholder | exp.Parameter)
    if not salted or any(
        isinstance(e.this, exp.Placeholder | exp.Parameter)
        for e in node.expressions[:-1]
        if isinstance(e, exp.Cast)
    ):
        # Unsalted, anyone could compute which rows a unit keeps.
        raise refuse("HASH without the secret salt as its last argument")
    for a in args[:-1]:
        if a.type.startswith("?") or a.type.startswith("MAP") or a.type in ("HASH", "PARAM"):
            raise refuse(f"HASH of a {a.type.lstrip('?')} value")
    return Lowered(fn("XXHASH64", *(a.node for a in args)), "HASH"), args[:-1]


def hash_function(lw: Lowering, node: exp.Anonymous, ctx: Context) -> Lowered:
    """HASH as the query writes it (``keyed_hash`` without its arguments)."""
    return keyed_hash(lw, node, ctx)[0]
