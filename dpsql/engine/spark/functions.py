"""Numeric and text functions: ISNAN, ISINF, ROUND, FLOOR and CEIL; LENGTH, ||, CONCAT, LIKE,
SUBSTRING, TRIM, STARTS_WITH and CONTAINS.
"""

from __future__ import annotations

from decimal import Decimal

from sqlglot import exp

from dpsql.engine.spark.dialect import refuse
from dpsql.engine.spark.nodes import (
    INF,
    Context,
    Lowered,
    Lowering,
    absorbing,
    case_when,
    cast_to,
    double_literal,
    fn,
    is_null,
    literal_value,
    operand,
    strict,
)
from dpsql.engine.spark.types import is_float, is_int, is_num
from dpsql.sql.validate import describe

# -- numeric and text functions -----------------------------------------------------------------


def float_arg(lw: Lowering, node: exp.Expression, ctx: Context, what: str) -> Lowered:
    a = lw.expr(node, ctx)
    if not is_num(a.type) and a.type != "NULL":
        raise refuse(f"{what} of {a.type}")
    return a


def isnan(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    a = float_arg(lw, node.this, ctx, "ISNAN")
    # Spark's isnan(NULL) is false, DuckDB's NULL: spelled out.
    out = case_when((is_null(a.node), exp.Null()), default=fn("ISNAN", a.node))
    return Lowered(out, "BOOLEAN", a.fails)


def isinf(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    a = float_arg(lw, node.this, ctx, "ISINF")
    out = exp.EQ(this=fn("ABS", a.node), expression=double_literal(INF))
    return Lowered(out, "BOOLEAN", a.fails)


def round_number(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    decimals = node.args.get("decimals")
    if decimals is not None and literal_value(decimals) != 0:
        # DuckDB rounds x * 10^d in binary, Spark the decimal text: they differ (1.005).
        raise refuse("ROUND to a number of decimals")
    a = float_arg(lw, node.this, ctx, "ROUND")
    # Halves round away from zero on both engines (Spark rounds the double's shortest decimal
    # text, which lies on the same side of every half as the double); NaN and the
    # infinities stay as they are.
    return Lowered(fn("ROUND", a.node), a.type, a.fails)


def floor_ceil(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    if node.args.get("decimals") is not None:
        raise refuse(f"{describe(node)} to a number of decimals")
    a = float_arg(lw, node.this, ctx, describe(node))
    if is_int(a.type):
        return a
    if not is_float(a.type):
        return Lowered(fn(node.key.upper(), a.node), a.type, a.fails)
    # DuckDB's FLOOR of a double is a double; Spark's a BIGINT (saturating). Below 2^52,
    # x - x % 1 (fmod: exact, with x's sign) is x truncated, exactly; one less for a negative x
    # with a fraction. Beyond 2^52, and for NaN and the infinities, x is its own floor.
    x = a.node if isinstance(node, exp.Floor) else exp.Neg(this=operand(a.node))
    big = exp.Or(
        this=exp.GTE(this=fn("ABS", x), expression=double_literal("4503599627370496.0")),
        expression=fn("ISNAN", x),
    )
    truncated = exp.Paren(
        this=exp.Sub(
            this=operand(x), expression=exp.Mod(this=operand(x), expression=double_literal("1.0"))
        )
    )
    floor = case_when(
        (big, x),
        (
            exp.LT(this=operand(x), expression=truncated),
            exp.Sub(this=truncated.copy(), expression=double_literal("1.0")),
        ),
        default=truncated.copy(),
    )
    out = floor if isinstance(node, exp.Floor) else exp.Neg(this=exp.Paren(this=floor))
    return Lowered(out, a.type, a.fails)


def length(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    a = lw.expr(node.this, ctx)
    if a.type.startswith("LIST("):
        # array_size is NULL for a NULL list, as DuckDB's LENGTH (size() may give -1); BIGINT
        # as on DuckDB.
        return Lowered(cast_to(fn("ARRAY_SIZE", a.node), "BIGINT"), "BIGINT", a.fails, 31)
    if a.type in ("VARCHAR", "NULL"):
        # Characters (code points) on both engines.
        return Lowered(cast_to(fn("CHAR_LENGTH", a.node), "BIGINT"), "BIGINT", a.fails, 31)
    raise refuse(f"LENGTH of {a.type}")


def _text(lw: Lowering, node: exp.Expression, ctx: Context, what: str) -> Lowered:
    a = lw.expr(node, ctx)
    if a.type not in ("VARCHAR", "NULL"):
        # DuckDB formats numbers as text unlike Spark (1e+20, 1.0E20).
        raise refuse(f"{what} of a {a.type} value")
    return a


def pipe_concat(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    a, b = _text(lw, node.this, ctx, "||"), _text(lw, node.expression, ctx, "||")
    return Lowered(
        exp.DPipe(this=operand(a.node), expression=operand(b.node)),
        "VARCHAR",
        strict("||", a, b),
    )


def concat(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    args = [_text(lw, e, ctx, "CONCAT") for e in node.expressions]
    absorbing("CONCAT", *args)
    # DuckDB's CONCAT skips NULL arguments, as Spark's concat_ws does (Spark's concat is NULL).
    return Lowered(fn("CONCAT_WS", exp.Literal.string(""), *(a.node for a in args)), "VARCHAR")


def like(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    a = _text(lw, node.this, ctx, "LIKE")
    pattern = node.expression
    if not (isinstance(pattern, exp.Literal) and pattern.is_string) or "\\" in str(pattern.this):
        # Spark's LIKE escapes with a backslash by default, DuckDB's does not.
        raise refuse("LIKE with a pattern that is not a literal without backslashes")
    if node.args.get("escape"):
        raise refuse("LIKE ... ESCAPE")
    return Lowered(
        exp.Like(this=operand(a.node), expression=exp.Literal.string(pattern.this)),
        "BOOLEAN",
        a.fails,
    )


def substring(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    a = _text(lw, node.this, ctx, "SUBSTRING")
    start, length = node.args.get("start"), node.args.get("length")
    s = literal_value(start) if start is not None else None
    n = literal_value(length) if length is not None else Decimal(0)
    if s is None or n is None or s < 1 or n < 0 or length is None:
        # The engines read a start at or below 0 and a negative length differently.
        raise refuse("SUBSTRING with a start or length that is not a positive literal")
    out = fn("SUBSTRING", a.node, exp.Literal.number(int(s)), exp.Literal.number(int(n)))
    return Lowered(out, "VARCHAR", a.fails)


def sha2(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    # A sample's PRF (dpsql.analyze.sample): SHA-256 of text, lowercase hex on both engines
    # (DuckDB's sha256, Spark's sha2(..., 256)) of the same UTF-8 bytes.
    length = node.args.get("length")
    if not (isinstance(length, exp.Literal) and str(length.this) == "256"):
        raise refuse("SHA2 of another length than 256")
    a = _text(lw, node.this, ctx, "SHA256")
    return Lowered(fn("SHA2", a.node, exp.Literal.number(256)), "VARCHAR", a.fails)


def left(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    a = _text(lw, node.this, ctx, "LEFT")
    n = literal_value(node.expression)
    if n is None or n < 0 or n != int(n):
        raise refuse("LEFT with a length that is not a literal integer >= 0")
    out = fn("SUBSTRING", a.node, exp.Literal.number(1), exp.Literal.number(int(n)))
    return Lowered(out, "VARCHAR", a.fails)


def trim(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    if node.args.get("expression") is not None or node.args.get("position"):
        raise refuse("TRIM of given characters or one side")
    a = _text(lw, node.this, ctx, "TRIM")
    return Lowered(fn("TRIM", a.node), "VARCHAR", a.fails)  # spaces, on both engines


def starts_contains(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    a = _text(lw, node.this, ctx, describe(node))
    b = _text(lw, node.expression, ctx, describe(node))
    name = "STARTSWITH" if isinstance(node, exp.StartsWith) else "CONTAINS"
    return Lowered(fn(name, a.node, b.node), "BOOLEAN", strict(name, a, b))
