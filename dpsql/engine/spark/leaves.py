"""Leaves: parentheses, columns, literals, the query's parameters (the salt and a sample's
secret) and TRY, whose inside is lowered so that nothing raises.
"""

from __future__ import annotations

from dataclasses import replace

from sqlglot import exp

from dpsql.analyze.sample import SAMPLE_PARAMETER
from dpsql.bound.specs import SALT_PARAMETER
from dpsql.engine.spark.dialect import refuse
from dpsql.engine.spark.nodes import (
    Context,
    Lowered,
    Lowering,
    col,
    int_bits,
    literal_type,
    literal_value,
)
from dpsql.engine.spark.types import TYPE_BITS


def paren(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    inner = lw.expr(node.this, ctx)
    return replace(inner, node=exp.Paren(this=inner.node))


def column(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    """A column of one of the relations in FROM (``ctx.sources``), qualified by its alias where
    the query reads several."""
    assert isinstance(node, exp.Column)
    if isinstance(node.this, exp.Star):
        raise refuse("* outside the SELECT list")
    name = node.name.lower()
    table = node.table.lower() if node.table else None
    if node.args.get("db") or node.args.get("catalog"):
        raise refuse("a column qualified by schema")
    found = [s for s in ctx.sources if (s.alias == table if table else True) and name in s.columns]
    if table is None and len(found) > 1:
        found = [s for s in found if s.star] or found
    if len(found) != 1:
        raise refuse(f"the column {name}, {'unknown' if not found else 'ambiguous'} here,")
    source = found[0]
    qualify = table is not None or (ctx.qualified and len(ctx.sources) > 1)
    t = source.columns[name]
    return Lowered(col(name, source.alias if qualify else None), t, bits=TYPE_BITS.get(t))


def literal(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    assert isinstance(node, exp.Literal)
    if node.is_string:
        return Lowered(exp.Literal.string(node.this), "VARCHAR")
    value = literal_value(node)
    if value is None or not value.is_finite():
        raise refuse("this number literal")
    t = literal_type(value, str(node.this))
    if t == "HUGEINT" and abs(value) >= 10**38:
        raise refuse("an integer literal of more than 38 digits")  # beyond DECIMAL(38, 0)
    return Lowered(exp.Literal.number(node.this), t, bits=int_bits(value, t))


def null(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    return Lowered(exp.Null(), "NULL")


def boolean(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    return Lowered(exp.Boolean(this=bool(node.this)), "BOOLEAN")


def parameter(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    # The parameters of a bounded query are its secrets, bound by the engine (the text never
    # holds them): the salt as :salt, a sample's secret (32 hex digits) as :sample.
    if node.name == SAMPLE_PARAMETER:
        return Lowered(exp.Placeholder(this=SAMPLE_PARAMETER), "VARCHAR")
    if node.name != SALT_PARAMETER:
        raise refuse("a query parameter other than the salt and the sample's secret")
    return Lowered(exp.Placeholder(this=SALT_PARAMETER), "PARAM")


def try_expression(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    # DuckDB's TRY turns any error inside into NULL; Spark has no such catch-all, so the inside
    # is lowered so that nothing raises and every stand-in NULL reaches this point.
    inner = lw.expr(node.this, replace(ctx, in_try=True))
    return Lowered(inner.node, inner.type)
