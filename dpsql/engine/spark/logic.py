"""Comparisons and logic: =, <=> (IS NOT DISTINCT FROM), AND, OR, NOT, IS, IN and BETWEEN over
operands of one kind.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.engine.spark.casts import constant_cast
from dpsql.engine.spark.dialect import refuse
from dpsql.engine.spark.functions import float_arg
from dpsql.engine.spark.nodes import (
    Context,
    Lowered,
    Lowering,
    absorbing,
    fn,
    is_null,
    operand,
    strict,
)
from dpsql.engine.spark.types import type_kind
from dpsql.sql.validate import describe

# -- comparisons and logic ----------------------------------------------------------------------


def comparable(
    a: Lowered, a_node: exp.Expression, b: Lowered, b_node: exp.Expression, what: str
) -> tuple[exp.Expression, exp.Expression]:
    """The operands of a comparison, of one kind: numbers (each engine widens them the same
    way), text, dates, timestamps, booleans. A text literal next to a date is cast here, once
    it is checked to be a date (Spark and DuckDB parse other texts differently)."""
    ka, kb = type_kind(a.type), type_kind(b.type)
    if ka == kb == "HASH":
        # Two keyed hashes (``dpsql.bound.pivot``'s ranking of a unit's key combinations): ordered
        # as Spark's ranking windows order them, by xxhash64's signed BIGINT. Each engine ranks
        # by its own hash (docs/engines.md), so only the order within one engine matters.
        return operand(a.node), operand(b.node)
    if "NULL" in (ka, kb) or ka == kb:
        if (
            ka.startswith("?")
            or ka.startswith("LIST")
            or ka.startswith("MAP")
            or ka in ("HASH", "PARAM")
        ):
            raise refuse(f"{what} of {ka.lstrip('?')} values")
        return operand(a.node), operand(b.node)
    for text_side, other, text_node in ((a, b, a_node), (b, a, b_node)):
        if (
            text_side.type == "VARCHAR"
            and other.type in ("DATE", "TIMESTAMP")
            and isinstance(text_node, exp.Literal)
        ):
            cast = constant_cast(text_side, text_node, other.type)
            assert cast is not None
            if text_side is a:
                return cast.node, operand(b.node)
            return operand(a.node), cast.node
    raise refuse(f"{what} of {a.type} and {b.type}")


def compare(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    # NaN equals NaN and lies above every number on both engines; NULL gives NULL (strict).
    a, b = lw.expr(node.this, ctx), lw.expr(node.expression, ctx)
    left, right = comparable(a, node.this, b, node.expression, describe(node))
    return Lowered(node.__class__(this=left, expression=right), "BOOLEAN", strict("=", a, b))


def null_safe_compare(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    a, b = lw.expr(node.this, ctx), lw.expr(node.expression, ctx)
    absorbing("IS [NOT] DISTINCT FROM", a, b)
    left, right = comparable(a, node.this, b, node.expression, "IS NOT DISTINCT FROM")
    # IS NOT DISTINCT FROM is Spark's <=> (NULL <=> NULL is true); rows without a unit are one
    # unit in every ranking and join (dpsql.bound.caps).
    out: exp.Expression = exp.NullSafeEQ(this=left, expression=right)
    if isinstance(node, exp.NullSafeNEQ):
        out = exp.Not(this=exp.Paren(this=out))
    return Lowered(out, "BOOLEAN")


def _null_or_nan(node: exp.Expression) -> exp.Expression | None:
    """The x of ``x IS NULL OR ISNAN(x)`` (as the bounded query tests a missing value)."""
    left, right = node.this, node.expression
    if not (isinstance(node, exp.Or) and isinstance(left, exp.Is)):
        return None
    if not (isinstance(right, exp.IsNan) and isinstance(left.expression, exp.Null)):
        return None
    tested: exp.Expression = right.this
    return tested if left.this.sql("duckdb") == tested.sql("duckdb") else None


def connective(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    tested = _null_or_nan(node)
    if tested is not None:
        # ISNAN(NULL) is NULL on DuckDB, false on Spark; after "x IS NULL OR" either is TRUE.
        x = float_arg(lw, tested, ctx, "ISNAN")
        absorbing("IS NULL", x)
        test = exp.Or(this=is_null(x.node), expression=fn("ISNAN", x.node))
        return Lowered(test, "BOOLEAN")
    a, b = lw.expr(node.this, ctx), lw.expr(node.expression, ctx)
    for side in (a, b):
        if side.type not in ("BOOLEAN", "NULL"):
            raise refuse(f"{describe(node)} of a {side.type} value")
    # FALSE AND NULL is FALSE: a NULL standing for an error would not reach the TRY.
    absorbing(describe(node), a, b)
    return Lowered(node.__class__(this=operand(a.node), expression=operand(b.node)), "BOOLEAN")


def negation(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    a = lw.expr(node.this, ctx)
    if a.type not in ("BOOLEAN", "NULL"):
        raise refuse(f"NOT of a {a.type} value")
    return Lowered(exp.Not(this=operand(a.node)), "BOOLEAN", a.fails)


def is_test(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    a = lw.expr(node.this, ctx)
    absorbing("IS", a)
    right = node.expression
    if isinstance(right, exp.Null):
        return Lowered(exp.Is(this=operand(a.node), expression=exp.Null()), "BOOLEAN")
    if isinstance(right, exp.Boolean) and a.type in ("BOOLEAN", "NULL"):
        return Lowered(
            exp.Is(this=operand(a.node), expression=exp.Boolean(this=bool(right.this))), "BOOLEAN"
        )
    raise refuse("IS with something other than NULL, TRUE or FALSE")


def in_test(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    a = lw.expr(node.this, ctx)
    if node.args.get("unnest") or node.args.get("field"):
        raise refuse("IN UNNEST")
    query = node.args.get("query")
    if query is not None:
        body, columns = lw.query(query.this if isinstance(query, exp.Subquery) else query, ctx.ctes)
        if len(columns) != 1:
            raise refuse("IN over a subquery of several columns")
        (t,) = columns.values()
        comparable(a, node.this, Lowered(exp.Null(), t), exp.Null(), "IN")  # one kind, or refused
        return Lowered(
            exp.In(this=operand(a.node), query=exp.Subquery(this=body)), "BOOLEAN", a.fails
        )
    items = [lw.expr(e, ctx) for e in node.expressions]
    absorbing("IN", *items)
    values = []
    for item, original in zip(items, node.expressions, strict=True):
        _, right = comparable(a, node.this, item, original, "IN")
        values.append(right)
    return Lowered(exp.In(this=operand(a.node), expressions=values), "BOOLEAN", a.fails)


def between(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    a = lw.expr(node.this, ctx)
    low, high = lw.expr(node.args["low"], ctx), lw.expr(node.args["high"], ctx)
    absorbing("BETWEEN", low, high)
    left, lo = comparable(a, node.this, low, node.args["low"], "BETWEEN")
    _, hi = comparable(a, node.this, high, node.args["high"], "BETWEEN")
    return Lowered(exp.Between(this=left, low=lo, high=hi), "BOOLEAN", a.fails)
