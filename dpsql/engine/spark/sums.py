"""FSUM and FAVG on Spark: Neumaier's compensated sum of the values in order of magnitude."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlglot import exp

from dpsql.engine.spark.dialect import _refuse
from dpsql.engine.spark.nodes import _E, _INF, _NAN, _NINF, _case, _cast, _Ctx, _double, _fn
from dpsql.engine.spark.types import _is_num

if TYPE_CHECKING:
    from dpsql.engine.spark.lowerer import _Lowerer


def _float_sum(lw: _Lowerer, node: exp.Anonymous, ctx: _Ctx, average: bool) -> _E:
    """DuckDB's FSUM and FAVG: Neumaier's compensated sum (Kahan-Babuska; FAVG divides it by
    the count), a NaN or +inf with -inf giving NaN, otherwise an infinity winning, a finite sum
    that overflows staying infinite. DuckDB adds the values in the order they arrive; here they
    are added in order of magnitude (then value): a result that cannot depend on the order
    rows arrive in, so a recomputed stage gives the same, and that equals DuckDB's wherever its
    compensated sum is exact (small values first keep it so)."""
    if len(node.expressions) != 1:
        raise _refuse(f"{node.name.upper()} of several arguments")
    a = lw.expr(node.expressions[0], ctx)
    if not _is_num(a.type):
        raise _refuse(f"{node.name.upper()} of {a.type}")
    x = a.node if a.type == "DOUBLE" else _cast(a.node, "DOUBLE")
    inf, ninf = _double(_INF), _double(_NINF)
    finite = exp.Not(
        this=exp.Paren(
            this=exp.Or(this=_fn("ISNAN", x), expression=exp.EQ(this=_fn("ABS", x), expression=inf))
        )
    )
    by_size = _fn(
        "NAMED_STRUCT", exp.Literal.string("m"), _fn("ABS", x), exp.Literal.string("v"), x
    )
    values = _fn(
        "ARRAY_SORT",
        exp.Filter(this=_fn("COLLECT_LIST", by_size), expression=exp.Where(this=finite)),
    )
    s, c = exp.column("s", "_dpsql_a"), exp.column("c", "_dpsql_a")
    v = exp.column("v", "_dpsql_e")
    t = exp.Paren(this=exp.Add(this=s, expression=v))
    low = _case(
        # Past the largest double the sum stays infinite (its compensation is dropped).
        (exp.EQ(this=_fn("ABS", t), expression=inf), _double("0.0")),
        (
            exp.GTE(this=_fn("ABS", s), expression=_fn("ABS", v)),
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
        this=_fn("NAMED_STRUCT", exp.Literal.string("s"), t, exp.Literal.string("c"), low),
        expressions=[exp.to_identifier("_dpsql_a"), exp.to_identifier("_dpsql_e")],
    )
    zero = _double("0.0")
    start = _fn("NAMED_STRUCT", exp.Literal.string("s"), zero, exp.Literal.string("c"), zero.copy())
    finish = exp.Lambda(
        this=exp.Add(this=s.copy(), expression=c.copy()),
        expressions=[exp.to_identifier("_dpsql_a")],
    )
    total: exp.Expression = _fn("AGGREGATE", values, start, step, finish)
    if average:  # FAVG is FSUM / COUNT; an infinite or NaN sum stays what it is
        total = exp.Div(this=total, expression=_cast(exp.Count(this=x), "DOUBLE"))
    nan = _fn("BOOL_OR", _fn("ISNAN", x))
    pos = _fn("BOOL_OR", exp.EQ(this=x, expression=inf))
    neg = _fn("BOOL_OR", exp.EQ(this=x, expression=ninf))
    out = _case(
        (
            exp.EQ(this=exp.Count(this=x), expression=exp.Literal.number(0)),
            _cast(exp.Null(), "DOUBLE"),
        ),
        (
            exp.Or(this=nan, expression=exp.Paren(this=exp.And(this=pos, expression=neg))),
            _double(_NAN),
        ),
        (pos, inf),
        (neg, ninf),
        default=total,
    )
    return _E(out, "DOUBLE")
