"""FSUM and FAVG on Spark (``fsum``, ``favg``): Neumaier's compensated sum of the values in order
of magnitude."""

from __future__ import annotations

from sqlglot import exp

from dpsql.engine.spark.dialect import refuse
from dpsql.engine.spark.nodes import (
    INF,
    NAN,
    NINF,
    Context,
    Lowered,
    Lowering,
    aggregate_context,
    case_when,
    cast_to,
    double_literal,
    fn,
)
from dpsql.engine.spark.types import is_num


def fsum(lw: Lowering, node: exp.Anonymous, ctx: Context) -> Lowered:
    return _float_sum(lw, node, aggregate_context(ctx, "FSUM"), average=False)


def favg(lw: Lowering, node: exp.Anonymous, ctx: Context) -> Lowered:
    return _float_sum(lw, node, aggregate_context(ctx, "FAVG"), average=True)


def _float_sum(lw: Lowering, node: exp.Anonymous, ctx: Context, average: bool) -> Lowered:
    """DuckDB's FSUM and FAVG: Neumaier's compensated sum (Kahan-Babuska; FAVG divides it by
    the count), a NaN or +inf with -inf giving NaN, otherwise an infinity winning, a finite sum
    that overflows staying infinite. DuckDB adds the values in the order they arrive; here they
    are added in order of magnitude (then value): a result that cannot depend on the order
    rows arrive in, so a recomputed stage gives the same, and that equals DuckDB's wherever its
    compensated sum is exact (small values first keep it so)."""
    if len(node.expressions) != 1:
        raise refuse(f"{node.name.upper()} of several arguments")
    a = lw.expr(node.expressions[0], ctx)
    if not is_num(a.type):
        raise refuse(f"{node.name.upper()} of {a.type}")
    x = a.node if a.type == "DOUBLE" else cast_to(a.node, "DOUBLE")
    inf, ninf = double_literal(INF), double_literal(NINF)
    finite = exp.Not(
        this=exp.Paren(
            this=exp.Or(this=fn("ISNAN", x), expression=exp.EQ(this=fn("ABS", x), expression=inf))
        )
    )
    by_size = fn("NAMED_STRUCT", exp.Literal.string("m"), fn("ABS", x), exp.Literal.string("v"), x)
    values = fn(
        "ARRAY_SORT",
        exp.Filter(this=fn("COLLECT_LIST", by_size), expression=exp.Where(this=finite)),
    )
    s, c = exp.column("s", "_dpsql_a"), exp.column("c", "_dpsql_a")
    v = exp.column("v", "_dpsql_e")
    t = exp.Paren(this=exp.Add(this=s, expression=v))
    low = case_when(
        # Past the largest double the sum stays infinite (its compensation is dropped).
        (exp.EQ(this=fn("ABS", t), expression=inf), double_literal("0.0")),
        (
            exp.GTE(this=fn("ABS", s), expression=fn("ABS", v)),
            exp.Add(
                this=c,
                expression=exp.Paren(
                    this=exp.Add(this=exp.Paren(this=exp.Sub(this=s, expression=t)), expression=v)
                ),
            ),
        ),
        default=exp.Add(
            this=c,
            expression=exp.Paren(
                this=exp.Add(this=exp.Paren(this=exp.Sub(this=v, expression=t)), expression=s)
            ),
        ),
    )
    step = exp.Lambda(
        this=fn("NAMED_STRUCT", exp.Literal.string("s"), t, exp.Literal.string("c"), low),
        expressions=[exp.to_identifier("_dpsql_a"), exp.to_identifier("_dpsql_e")],
    )
    zero = double_literal("0.0")
    start = fn("NAMED_STRUCT", exp.Literal.string("s"), zero, exp.Literal.string("c"), zero.copy())
    finish = exp.Lambda(
        this=exp.Add(this=s.copy(), expression=c.copy()),
        expressions=[exp.to_identifier("_dpsql_a")],
    )
    total: exp.Expression = fn("AGGREGATE", values, start, step, finish)
    if average:  # FAVG is FSUM / COUNT; an infinite or NaN sum stays what it is
        total = exp.Div(this=total, expression=cast_to(exp.Count(this=x), "DOUBLE"))
    nan = fn("BOOL_OR", fn("ISNAN", x))
    pos = fn("BOOL_OR", exp.EQ(this=x, expression=inf))
    neg = fn("BOOL_OR", exp.EQ(this=x, expression=ninf))
    out = case_when(
        (
            exp.EQ(this=exp.Count(this=x), expression=exp.Literal.number(0)),
            cast_to(exp.Null(), "DOUBLE"),
        ),
        (
            exp.Or(this=nan, expression=exp.Paren(this=exp.And(this=pos, expression=neg))),
            double_literal(NAN),
        ),
        (pos, inf),
        (neg, ninf),
        default=total,
    )
    return Lowered(out, "DOUBLE")
