"""Lists and the keyed hash: list_sort, list_slice with a step, DuckDB's salted hash as
xxhash64, and the dispatch of the functions sqlglot does not know (``_anonymous``).
"""

from __future__ import annotations

from dataclasses import replace

from sqlglot import exp

from dpsql.engine.spark.dialect import _refuse
from dpsql.engine.spark.histogram import _histogram
from dpsql.engine.spark.lowerer import _handles, _Lowerer
from dpsql.engine.spark.nodes import _E, _Ctx, _fn, _number, _p
from dpsql.engine.spark.sums import _float_sum
from dpsql.engine.spark.types import _elem, _is_int
from dpsql.sql.validate import describe

# -- lists and the keyed hash --------------------------------------------------------------------


@_handles(exp.ArraySort)
def _list_sort(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    if node.args.get("expression") is not None:
        raise _refuse("LIST_SORT with a sort order")
    a = lw.expr(node.this, ctx)
    _elem(a.type)
    # Ascending, NULLs last, -0.0 beside 0.0 and NaN last: DuckDB's list_sort order.
    return _E(_fn("ARRAY_SORT", a.node), a.type, a.fails)


def _positive_step(node: exp.Expression) -> bool:
    """A list_slice step that is at least 1 on any data: a positive literal, or GREATEST of
    anything and a positive literal (as dpsql writes it)."""
    value = _number(node)
    if value is not None:
        return value >= 1 and value == value.to_integral_value()
    while isinstance(node, exp.Paren):
        node = node.this
    return isinstance(node, exp.Greatest) and any(
        (v := _number(e)) is not None and v >= 1 for e in [node.this, *node.expressions]
    )


def _list_slice(lw: _Lowerer, node: exp.Anonymous, ctx: _Ctx) -> _E:
    args = node.expressions
    if len(args) != 4:
        raise _refuse("LIST_SLICE without a step")
    lst, begin, end, step = args
    inner = lst.this if isinstance(lst, exp.ArraySort) else lst  # sorting keeps the length
    same_list = isinstance(end, exp.Length) and end.this.sql("duckdb") == inner.sql("duckdb")
    if _number(begin) != 1 or not same_list or not _positive_step(step):
        raise _refuse("LIST_SLICE other than from 1 to the list's length by a positive step")
    a, s = lw.expr(lst, ctx), lw.expr(step, ctx)
    if not _is_int(s.type):
        raise _refuse(f"LIST_SLICE by a step of type {s.type}")
    # Elements 1, 1 + step, ... of the list: those at a 0-based index divisible by the step
    # (Spark has no slice with a step).
    index = exp.to_identifier("_dpsql_i")
    keep = exp.EQ(
        this=exp.Mod(this=exp.column("_dpsql_i"), expression=_p(s.node)),
        expression=exp.Literal.number(0),
    )
    lam = exp.Lambda(this=keep, expressions=[exp.to_identifier("_dpsql_e"), index])
    return _E(_fn("FILTER", a.node, lam), a.type, lw.strict("LIST_SLICE", a, s))


def _hash(lw: _Lowerer, node: exp.Anonymous, ctx: _Ctx) -> tuple[_E, list[_E]]:
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
        raise _refuse("HASH without the secret salt as its last argument")
    for a in args[:-1]:
        if a.type.startswith("?") or a.type.startswith("MAP") or a.type in ("HASH", "PARAM"):
            raise _refuse(f"HASH of a {a.type.lstrip('?')} value")
    return _E(_fn("XXHASH64", *(a.node for a in args)), "HASH"), args[:-1]


_AGGREGATE_ANON = frozenset({"FSUM", "FAVG", "_DPSQL_HISTOGRAM"})


@_handles(exp.Anonymous)
def _anonymous(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    assert isinstance(node, exp.Anonymous)
    name = node.name.upper()
    if name == "HASH":
        return _hash(lw, node, ctx)[0]
    if name == "LIST_SLICE":
        return _list_slice(lw, node, ctx)
    if name in _AGGREGATE_ANON:
        if not ctx.aggregates:
            raise _refuse(f"the aggregate {name} here")
        inner = replace(ctx, aggregates=False, windows=False, generators=False, in_try=False)
        if name == "_DPSQL_HISTOGRAM":
            return _histogram(lw, node, inner)
        return _float_sum(lw, node, inner, average=name == "FAVG")
    raise _refuse(describe(node))
