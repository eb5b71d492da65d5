"""Numeric and text functions: ISNAN, ISINF, ROUND, FLOOR and CEIL; LENGTH, ||, CONCAT, LIKE,
SUBSTRING, TRIM, STARTS_WITH and CONTAINS.
"""

from __future__ import annotations

from decimal import Decimal

from sqlglot import exp

from dpsql.engine.spark.dialect import _refuse
from dpsql.engine.spark.lowerer import _handles, _Lowerer
from dpsql.engine.spark.nodes import (
    _E,
    _INF,
    _case,
    _cast,
    _Ctx,
    _double,
    _fn,
    _is_null,
    _number,
    _p,
)
from dpsql.engine.spark.types import _is_float, _is_int, _is_num
from dpsql.sql.validate import describe

# -- numeric and text functions -----------------------------------------------------------------


def _float_arg(lw: _Lowerer, node: exp.Expression, ctx: _Ctx, what: str) -> _E:
    a = lw.expr(node, ctx)
    if not _is_num(a.type) and a.type != "NULL":
        raise _refuse(f"{what} of {a.type}")
    return a


@_handles(exp.IsNan)
def _isnan(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    a = _float_arg(lw, node.this, ctx, "ISNAN")
    # Spark's isnan(NULL) is false, DuckDB's NULL: spelled out.
    out = _case((_is_null(a.node), exp.Null()), default=_fn("ISNAN", a.node))
    return _E(out, "BOOLEAN", a.fails)


@_handles(exp.IsInf)
def _isinf(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    a = _float_arg(lw, node.this, ctx, "ISINF")
    out = exp.EQ(this=_fn("ABS", a.node), expression=_double(_INF))
    return _E(out, "BOOLEAN", a.fails)


@_handles(exp.Round)
def _round(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    decimals = node.args.get("decimals")
    if decimals is not None and _number(decimals) != 0:
        # DuckDB rounds x * 10^d in binary, Spark the decimal text: they differ (1.005).
        raise _refuse("ROUND to a number of decimals")
    a = _float_arg(lw, node.this, ctx, "ROUND")
    # Halves round away from zero on both engines (Spark rounds the double's shortest decimal
    # text, which lies on the same side of every half as the double); NaN and the
    # infinities stay as they are.
    return _E(_fn("ROUND", a.node), a.type, a.fails)


@_handles(exp.Floor, exp.Ceil)
def _floor_ceil(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    if node.args.get("decimals") is not None:
        raise _refuse(f"{describe(node)} to a number of decimals")
    a = _float_arg(lw, node.this, ctx, describe(node))
    if _is_int(a.type):
        return a
    if not _is_float(a.type):
        return _E(_fn(node.key.upper(), a.node), a.type, a.fails)
    # DuckDB's FLOOR of a double is a double; Spark's a BIGINT (saturating). Below 2^52,
    # x - x % 1 (fmod: exact, with x's sign) is x truncated, exactly; one less for a negative x
    # with a fraction. Beyond 2^52, and for NaN and the infinities, x is its own floor.
    x = a.node if isinstance(node, exp.Floor) else exp.Neg(this=_p(a.node))
    big = exp.Or(
        this=exp.GTE(this=_fn("ABS", x), expression=_double("4503599627370496.0")),
        expression=_fn("ISNAN", x),
    )
    truncated = exp.Paren(
        this=exp.Sub(this=_p(x), expression=exp.Mod(this=_p(x), expression=_double("1.0")))
    )
    floor = _case(
        (big, x),
        (
            exp.LT(this=_p(x), expression=truncated),
            exp.Sub(this=truncated.copy(), expression=_double("1.0")),
        ),
        default=truncated.copy(),
    )
    out = floor if isinstance(node, exp.Floor) else exp.Neg(this=exp.Paren(this=floor))
    return _E(out, a.type, a.fails)


@_handles(exp.Length)
def _length(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    a = lw.expr(node.this, ctx)
    if a.type.startswith("LIST("):
        # array_size is NULL for a NULL list, as DuckDB's LENGTH (size() may give -1); BIGINT
        # as on DuckDB.
        return _E(_cast(_fn("ARRAY_SIZE", a.node), "BIGINT"), "BIGINT", a.fails, 31)
    if a.type in ("VARCHAR", "NULL"):
        # Characters (code points) on both engines.
        return _E(_cast(_fn("CHAR_LENGTH", a.node), "BIGINT"), "BIGINT", a.fails, 31)
    raise _refuse(f"LENGTH of {a.type}")


def _text(lw: _Lowerer, node: exp.Expression, ctx: _Ctx, what: str) -> _E:
    a = lw.expr(node, ctx)
    if a.type not in ("VARCHAR", "NULL"):
        # DuckDB formats numbers as text unlike Spark (1e+20, 1.0E20).
        raise _refuse(f"{what} of a {a.type} value")
    return a


@_handles(exp.DPipe)
def _dpipe(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    a, b = _text(lw, node.this, ctx, "||"), _text(lw, node.expression, ctx, "||")
    return _E(exp.DPipe(this=_p(a.node), expression=_p(b.node)), "VARCHAR", lw.strict("||", a, b))


@_handles(exp.Concat)
def _concat(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    args = [_text(lw, e, ctx, "CONCAT") for e in node.expressions]
    lw.absorbing("CONCAT", *args)
    # DuckDB's CONCAT skips NULL arguments, as Spark's concat_ws does (Spark's concat is NULL).
    return _E(_fn("CONCAT_WS", exp.Literal.string(""), *(a.node for a in args)), "VARCHAR")


@_handles(exp.Like)
def _like(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    a = _text(lw, node.this, ctx, "LIKE")
    pattern = node.expression
    if not (isinstance(pattern, exp.Literal) and pattern.is_string) or "\\" in str(pattern.this):
        # Spark's LIKE escapes with a backslash by default, DuckDB's does not.
        raise _refuse("LIKE with a pattern that is not a literal without backslashes")
    if node.args.get("escape"):
        raise _refuse("LIKE ... ESCAPE")
    return _E(
        exp.Like(this=_p(a.node), expression=exp.Literal.string(pattern.this)), "BOOLEAN", a.fails
    )


@_handles(exp.Substring)
def _substring(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    a = _text(lw, node.this, ctx, "SUBSTRING")
    start, length = node.args.get("start"), node.args.get("length")
    s = _number(start) if start is not None else None
    n = _number(length) if length is not None else Decimal(0)
    if s is None or n is None or s < 1 or n < 0 or length is None:
        # The engines read a start at or below 0 and a negative length differently.
        raise _refuse("SUBSTRING with a start or length that is not a positive literal")
    out = _fn("SUBSTRING", a.node, exp.Literal.number(int(s)), exp.Literal.number(int(n)))
    return _E(out, "VARCHAR", a.fails)


@_handles(exp.SHA2)
def _sha2(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    # A sample's PRF (dpsql.analyze.sample): SHA-256 of text, lowercase hex on both engines
    # (DuckDB's sha256, Spark's sha2(..., 256)) of the same UTF-8 bytes.
    length = node.args.get("length")
    if not (isinstance(length, exp.Literal) and str(length.this) == "256"):
        raise _refuse("SHA2 of another length than 256")
    a = _text(lw, node.this, ctx, "SHA256")
    return _E(_fn("SHA2", a.node, exp.Literal.number(256)), "VARCHAR", a.fails)


@_handles(exp.Left)
def _left(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    a = _text(lw, node.this, ctx, "LEFT")
    n = _number(node.expression)
    if n is None or n < 0 or n != int(n):
        raise _refuse("LEFT with a length that is not a literal integer >= 0")
    out = _fn("SUBSTRING", a.node, exp.Literal.number(1), exp.Literal.number(int(n)))
    return _E(out, "VARCHAR", a.fails)


@_handles(exp.Trim)
def _trim(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    if node.args.get("expression") is not None or node.args.get("position"):
        raise _refuse("TRIM of given characters or one side")
    a = _text(lw, node.this, ctx, "TRIM")
    return _E(_fn("TRIM", a.node), "VARCHAR", a.fails)  # spaces, on both engines


@_handles(exp.StartsWith, exp.Contains)
def _starts_contains(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    a = _text(lw, node.this, ctx, describe(node))
    b = _text(lw, node.expression, ctx, describe(node))
    name = "STARTSWITH" if isinstance(node, exp.StartsWith) else "CONTAINS"
    return _E(_fn(name, a.node, b.node), "BOOLEAN", lw.strict(name, a, b))
