"""CASE-like expressions: CASE, IF, COALESCE, NULLIF, LEAST and GREATEST, typed as DuckDB types
their branches.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.engine.spark.dialect import refuse
from dpsql.engine.spark.logic import comparable
from dpsql.engine.spark.nodes import (
    Context,
    Lowered,
    Lowering,
    absorbing,
    case_when,
    max_bits,
    strict,
)
from dpsql.engine.spark.types import is_int, unify
from dpsql.sql.validate import describe


def _branches(values: list[Lowered], what: str) -> tuple[str, list[exp.Expression]]:
    """The result type of CASE-like branches: DuckDB's, which Spark's widening of the same
    numeric types gives too (INT with DECIMAL(38, 0) is DECIMAL(38, 0), INT with DOUBLE is
    DOUBLE); mixed kinds are refused by ``unify``."""
    return unify([v.type for v in values], what), [v.node for v in values]


def case_expression(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    if node.args.get("this") is not None:
        raise refuse("CASE with an operand")
    conds, values = [], []
    for branch in node.args.get("ifs") or []:
        cond = lw.expr(branch.this, ctx)
        if cond.type not in ("BOOLEAN", "NULL"):
            raise refuse(f"a CASE condition of type {cond.type}")
        conds.append(cond)
        values.append(lw.expr(branch.args["true"], ctx))
    default = node.args.get("default")
    values.append(lw.expr(default, ctx) if default is not None else Lowered(exp.Null(), "NULL"))
    # A NULL condition takes the next branch: an error there would not reach the TRY. A branch
    # is only evaluated where it is taken, on both engines.
    absorbing("a CASE condition", *conds)
    t, nodes = _branches(values, "CASE")
    out = case_when(
        *[(c.node, v) for c, v in zip(conds, nodes[:-1], strict=True)], default=nodes[-1]
    )
    return Lowered(out, t, strict("CASE", *values), max_bits(*values) if is_int(t) else None)


def if_expression(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    cond = lw.expr(node.this, ctx)
    if cond.type not in ("BOOLEAN", "NULL"):
        raise refuse(f"an IF condition of type {cond.type}")
    absorbing("an IF condition", cond)
    true = lw.expr(node.args["true"], ctx)
    false_node = node.args.get("false")
    false = lw.expr(false_node, ctx) if false_node is not None else Lowered(exp.Null(), "NULL")
    t, (x, y) = _branches([true, false], "IF")
    return Lowered(
        case_when((cond.node, x), default=y),
        t,
        strict("IF", true, false),
        max_bits(true, false) if is_int(t) else None,
    )


def coalesce(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    args = [lw.expr(node.this, ctx), *(lw.expr(e, ctx) for e in node.expressions)]
    # Every argument but the last can turn into the next one's value: absorbing; the last is
    # evaluated only where all the others are NULL (on both engines), and its NULL is the
    # result.
    absorbing("COALESCE", *args[:-1])
    t, nodes = _branches(args, "COALESCE")
    return Lowered(
        exp.Coalesce(this=nodes[0], expressions=nodes[1:]),
        t,
        args[-1].fails,
        max_bits(*args) if is_int(t) else None,
    )


def nullif(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    a, b = lw.expr(node.this, ctx), lw.expr(node.expression, ctx)
    absorbing("NULLIF", b)  # NULLIF(a, NULL) is a
    left, right = comparable(a, node.this, b, node.expression, "NULLIF")
    return Lowered(exp.Nullif(this=left, expression=right), a.type, a.fails, a.bits)


def least_greatest(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    args = [lw.expr(node.this, ctx), *(lw.expr(e, ctx) for e in node.expressions)]
    # Both engines skip NULL arguments (LEAST(NULL, 1) is 1) and order NaN above +inf, so the
    # bounded query's clamps map NULL to the bound, and NaN to the upper one, alike.
    absorbing(describe(node), *args)
    for a in args:
        if a.type.startswith("?") or a.type.startswith("LIST") or a.type in ("HASH", "PARAM"):
            raise refuse(f"{describe(node)} of {a.type.lstrip('?')}")
    t, nodes = _branches(args, describe(node))
    return Lowered(
        node.__class__(this=nodes[0], expressions=nodes[1:]),
        t,
        bits=max_bits(*args) if is_int(t) else None,
    )
