"""Arithmetic: + - * in DuckDB's integer types (try_* inside TRY), IEEE division, exact
integer // and %, negation and ABS.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.engine.spark.dialect import _refuse
from dpsql.engine.spark.lowerer import _handles, _Lowerer
from dpsql.engine.spark.nodes import (
    _E,
    _INF,
    _NAN,
    _NINF,
    _case,
    _cast,
    _Ctx,
    _double,
    _fn,
    _int_bits,
    _is_null,
    _literal_type,
    _number,
    _p,
    _small_literal_type,
    _try_cast,
)
from dpsql.engine.spark.types import (
    _CAPACITY,
    _INT_BY_RANK,
    _INT_RANK,
    _is_decimal,
    _is_float,
    _is_int,
    _is_num,
)
from dpsql.sql.validate import describe

# -- arithmetic ---------------------------------------------------------------------------------

_TRY_OPS: dict[type[exp.Expression], str] = {
    exp.Add: "TRY_ADD",
    exp.Sub: "TRY_SUBTRACT",
    exp.Mul: "TRY_MULTIPLY",
}


def _operand_types(a: _E, b: _E) -> tuple[str, str]:
    ta = b.type if a.type == "NULL" else a.type
    tb = a.type if b.type == "NULL" else b.type
    return ta, tb


def _int_result(a: _E, a_node: exp.Expression, b: _E, b_node: exp.Expression) -> str:
    """DuckDB's type of integer arithmetic: the wider operand's, an integer literal taking the
    other side's type when it fits (``smallint_col + 1`` is SMALLINT)."""
    types = []
    for side, node in ((a, a_node), (b, b_node)):
        value = _number(node)
        if value is not None and side.type in _INT_RANK and value == value.to_integral_value():
            types.append(_small_literal_type(value))
        elif side.type == "NULL":
            continue
        else:
            types.append(side.type)
    return _INT_BY_RANK[max(_INT_RANK[t] for t in types)] if types else "INTEGER"


def _spark_int(e: _E, node: exp.Expression) -> str:
    """The integer type Spark gives ``e``: an integer literal is INT (or wider)."""
    value = _number(node)
    if value is not None and e.type in _INT_RANK:
        return _literal_type(value, str(int(value)))
    return e.type


@_handles(exp.Add, exp.Sub, exp.Mul)
def _arith(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    a, b = lw.expr(node.this, ctx), lw.expr(node.expression, ctx)
    ta, tb = _operand_types(a, b)
    fails = lw.strict("arithmetic", a, b)
    if not (_is_num(ta) and _is_num(tb)):
        raise _refuse(f"{describe(node)} of {ta} and {tb}")
    if _is_float(ta) or _is_float(tb):
        # Floating arithmetic never raises on either engine (it overflows to infinity).
        result = "DOUBLE" if "DOUBLE" in (ta, tb) else "FLOAT"
        left, right = _p(a.node), _p(b.node)
        if result == "FLOAT":  # Spark would compute a FLOAT with a DECIMAL in DOUBLE
            left = (
                left
                if _is_float(ta) or ta in ("TINYINT", "SMALLINT", "INTEGER", "BIGINT")
                else _cast(a.node, result)
            )
            right = (
                right
                if _is_float(tb) or tb in ("TINYINT", "SMALLINT", "INTEGER", "BIGINT")
                else _cast(b.node, result)
            )
        return _E(node.__class__(this=left, expression=right), result, fails)
    if _is_decimal(ta) or _is_decimal(tb):
        # Spark and DuckDB size decimal results differently (and overflow at other points).
        raise _refuse("arithmetic on DECIMAL values")
    result = _int_result(a, node.this, b, node.expression)
    left, right = _int_operands(a, node.this, b, node.expression, result)
    bits = None
    if a.bits is not None and b.bits is not None:
        bits = a.bits + b.bits if isinstance(node, exp.Mul) else max(a.bits, b.bits) + 1
    if bits is not None and bits <= _CAPACITY[result]:
        # Within the type on any data (e.g. an INTEGER column widened to HUGEINT, plus 1): it
        # cannot overflow on either engine.
        return _E(node.__class__(this=left, expression=right), result, fails, bits)
    if ctx.in_try:
        # Integer overflow raises on Spark as on DuckDB; inside TRY it must give NULL instead.
        return _E(_fn(_TRY_OPS[type(node)], left, right), result, True)
    return _E(node.__class__(this=left, expression=right), result, fails)


def _int_operands(
    a: _E, a_node: exp.Expression, b: _E, b_node: exp.Expression, result: str
) -> tuple[exp.Expression, exp.Expression]:
    """The operands of integer arithmetic so that Spark computes it in ``result``, DuckDB's
    type (an integer literal is INT on Spark; beside a SMALLINT, DuckDB makes it SMALLINT)."""
    sa, sb = _spark_int(a, a_node), _spark_int(b, b_node)
    if result == "HUGEINT":
        if "HUGEINT" in (sa, sb):  # DECIMAL(38, 0) with any integer stays DECIMAL(38, 0)
            return _p(a.node), _p(b.node)
        return _cast(a.node, result), _cast(b.node, result)
    natural = _INT_BY_RANK[max(_INT_RANK.get(sa, 3), _INT_RANK.get(sb, 3))]
    if natural == result:
        return _p(a.node), _p(b.node)
    left = _p(a.node) if sa == result else _cast(a.node, result)
    right = _p(b.node) if sb == result else _cast(b.node, result)
    return left, right


def _ieee_divide(a: exp.Expression, b: exp.Expression) -> exp.Expression:
    """a / b on doubles as DuckDB computes it: IEEE, x / ±0 is ±inf (by the signs) and 0 / 0
    NaN, where Spark raises (ANSI) or gives NULL."""
    zero = exp.Literal.number(0)
    negative_zero = exp.EQ(this=_cast(b, "VARCHAR"), expression=exp.Literal.string("-0.0"))
    positive = exp.GT(this=a, expression=zero.copy())
    nan = exp.Or(this=_fn("ISNAN", a), expression=exp.EQ(this=a, expression=zero.copy()))
    by_zero = _case(
        (_is_null(a), _cast(exp.Null(), "DOUBLE")),
        (nan, _double(_NAN)),
        (
            exp.NEQ(this=exp.Paren(this=positive), expression=exp.Paren(this=negative_zero)),
            _double(_INF),
        ),
        default=_double(_NINF),
    )
    return _case((exp.EQ(this=b, expression=zero), by_zero), default=exp.Div(this=a, expression=b))


@_handles(exp.Div)
def _divide(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    a, b = lw.expr(node.this, ctx), lw.expr(node.expression, ctx)
    ta, tb = _operand_types(a, b)
    if not (_is_num(ta) and _is_num(tb)):
        raise _refuse(f"/ of {ta} and {tb}")
    fails = lw.strict("/", a, b)
    result = "FLOAT" if ta == tb == "FLOAT" else "DOUBLE"
    # DuckDB's / is floating division on every numeric type (integers included).
    left = _p(a.node) if _is_float(ta) else _cast(a.node, "DOUBLE")
    right = _p(b.node) if _is_float(tb) else _cast(b.node, "DOUBLE")
    divisor = _number(node.expression)
    if divisor is not None and divisor != 0:
        out: exp.Expression = exp.Div(this=left, expression=right)  # a non-zero literal
    else:
        out = _ieee_divide(left, right)
    return _E(out if result == "DOUBLE" else _cast(out, "FLOAT"), result, fails)


def _nonzero_divisor(node: exp.Expression) -> bool:
    """A divisor that cannot be zero: a non-zero literal, or NULLIF(d, 0) (as dpsql's
    totality rewrite writes every divisor of // and %)."""
    value = _number(node)
    if value is not None:
        return value != 0
    while isinstance(node, exp.Paren):
        node = node.this
    return isinstance(node, exp.Nullif) and _number(node.expression) == 0


@_handles(exp.IntDiv, exp.Mod)
def _int_div_mod(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    a, b = lw.expr(node.this, ctx), lw.expr(node.expression, ctx)
    ta, tb = _operand_types(a, b)
    if not (_is_num(ta) and _is_num(tb)):
        raise _refuse(f"{describe(node)} of {ta} and {tb}")
    fails = lw.strict(describe(node), a, b)
    safe = _nonzero_divisor(node.expression)
    mod = isinstance(node, exp.Mod)
    if _is_float(ta) or _is_float(tb):
        result = "FLOAT" if ta == tb == "FLOAT" else "DOUBLE"
        left = _p(a.node) if _is_float(ta) else _cast(a.node, "DOUBLE")
        right = _p(b.node) if _is_float(tb) else _cast(b.node, "DOUBLE")
        if mod:
            # DuckDB's % on doubles is fmod, NaN for a zero divisor (Spark raises there).
            fmod = _case(
                (_is_null(left), _cast(exp.Null(), "DOUBLE")),
                (exp.EQ(this=right, expression=exp.Literal.number(0)), _double(_NAN)),
                default=exp.Mod(this=left, expression=right),
            )
            return _E(fmod, result, fails)
        # DuckDB's // on doubles is plain division, failing on a zero divisor like Spark's /.
        if ctx.in_try and not safe:
            return _E(_fn("TRY_DIVIDE", left, right), result, True)
        return _E(exp.Div(this=left, expression=right), result, fails)
    if _is_decimal(ta) or _is_decimal(tb):
        raise _refuse(f"{describe(node)} on DECIMAL values")
    result = _int_result(a, node.this, b, node.expression)
    left, right = _int_operands(a, node.this, b, node.expression, result)
    if mod:
        # Integer % truncates (the result takes the dividend's sign) on both engines, and its
        # result is smaller than the divisor: it cannot overflow, only fail on a zero divisor.
        bits = None if a.bits is None or b.bits is None else min(a.bits, b.bits)
        if ctx.in_try and not safe:
            return _E(_fn("TRY_MOD", left, right), result, True)
        return _E(exp.Mod(this=left, expression=right), result, fails, bits)
    # Integer // truncates towards zero on DuckDB. Spark's div on decimals returns a BIGINT
    # that wraps silently past 2^63: the quotient is computed exactly in decimals instead, as
    # (a - a % b) / b, which divides exactly (a DECIMAL(38, 6) holds 32 integer digits; beyond,
    # Spark raises, or with try_divide gives NULL). Within BIGINT, Spark's div is exact and
    # raises on overflow (MIN div -1) as DuckDB does.
    # |a // b| <= |a|, and only MIN // -1 leaves the type: safe when a is within its capacity.
    bits = a.bits
    fits = bits is not None and bits <= _CAPACITY[result]
    if result != "HUGEINT" and (not ctx.in_try or (safe and fits)):
        div = exp.IntDiv(this=left, expression=right)
        return _E(div if result == "BIGINT" else _cast(div, result), result, fails, bits)
    big_a = _p(a.node) if a.type == "HUGEINT" else _cast(a.node, "HUGEINT")
    big_b = _p(b.node) if b.type == "HUGEINT" else _cast(b.node, "HUGEINT")
    # A quotient below 2^106 (< 10^32) fits the DECIMAL(38, 6) of Spark's division.
    if ctx.in_try and not (safe and bits is not None and bits <= 106):
        rest = _fn("TRY_MOD", big_a, big_b)
        quotient = _fn("TRY_DIVIDE", exp.Sub(this=big_a, expression=rest), big_b)
        return _E(_try_cast(quotient, result), result, True)
    rest = exp.Mod(this=big_a, expression=big_b)
    quotient = exp.Div(this=exp.Paren(this=exp.Sub(this=big_a, expression=rest)), expression=big_b)
    out = _cast(quotient, "HUGEINT")
    if result == "HUGEINT":
        return _E(out, result, fails, bits)
    if ctx.in_try:  # MIN // -1 leaves the type: NULL, as DuckDB's error inside TRY
        return _E(_try_cast(out, result), result, True)
    return _E(_cast(out, result), result, fails, bits)


@_handles(exp.Neg)
def _neg(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    value = _number(node)
    if value is not None:
        text = str(node.this.this) if isinstance(node.this, exp.Literal) else None
        if text is not None:
            t = _literal_type(value, "-" + text)
            return _E(exp.Neg(this=exp.Literal.number(text)), t, bits=_int_bits(value, t))
    a = lw.expr(node.this, ctx)
    if not _is_num(a.type) and a.type != "NULL":
        raise _refuse(f"- of {a.type}")
    negated = _negated_in_try(a, ctx)
    if negated is not None:
        return _E(negated, a.type, True)
    return _E(exp.Neg(this=_p(a.node)), a.type, a.fails, a.bits)


def _negated_in_try(a: _E, ctx: _Ctx) -> exp.Expression | None:
    """``-a`` as ``try_subtract(0, a)`` where it can overflow inside TRY (-MIN of an integer
    type whose range the value may fill): NULL there, as DuckDB's error under TRY; None where
    plain negation cannot raise."""
    fits = a.bits is not None and a.bits <= _CAPACITY.get(a.type, 0)
    if _is_int(a.type) and ctx.in_try and not fits:
        return _fn("TRY_SUBTRACT", _cast(exp.Literal.number(0), a.type), a.node)
    return None


@_handles(exp.Abs)
def _abs(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    a = lw.expr(node.this, ctx)
    if not _is_num(a.type) and a.type != "NULL":
        raise _refuse(f"ABS of {a.type}")
    negated = _negated_in_try(a, ctx)
    if negated is not None:
        out = _case(
            (exp.LT(this=_p(a.node), expression=exp.Literal.number(0)), negated), default=a.node
        )
        return _E(out, a.type, True)
    return _E(_fn("ABS", a.node), a.type, a.fails, a.bits)
