"""Arithmetic: + - * in DuckDB's integer types (try_* inside TRY), IEEE division, exact
integer // and %, negation and ABS.
"""

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
    case_when,
    cast_to,
    double_literal,
    fn,
    int_bits,
    is_null,
    literal_type,
    literal_value,
    operand,
    small_literal_type,
    strict,
    try_cast_to,
)
from dpsql.engine.spark.types import (
    CAPACITY,
    INT_BY_RANK,
    INT_RANK,
    is_decimal,
    is_float,
    is_int,
    is_num,
)
from dpsql.sql.validate import describe

# -- arithmetic ---------------------------------------------------------------------------------

_TRY_OPS: dict[type[exp.Expression], str] = {
    exp.Add: "TRY_ADD",
    exp.Sub: "TRY_SUBTRACT",
    exp.Mul: "TRY_MULTIPLY",
}


def _operand_types(a: Lowered, b: Lowered) -> tuple[str, str]:
    ta = b.type if a.type == "NULL" else a.type
    tb = a.type if b.type == "NULL" else b.type
    return ta, tb


def _int_result(a: Lowered, a_node: exp.Expression, b: Lowered, b_node: exp.Expression) -> str:
    """DuckDB's type of integer arithmetic: the wider operand's, an integer literal taking the
    other side's type when it fits (``smallint_col + 1`` is SMALLINT)."""
    types = []
    for side, node in ((a, a_node), (b, b_node)):
        value = literal_value(node)
        if value is not None and side.type in INT_RANK and value == value.to_integral_value():
            types.append(small_literal_type(value))
        elif side.type == "NULL":
            continue
        else:
            types.append(side.type)
    return INT_BY_RANK[max(INT_RANK[t] for t in types)] if types else "INTEGER"


def _spark_int(e: Lowered, node: exp.Expression) -> str:
    """The integer type Spark gives ``e``: an integer literal is INT (or wider)."""
    value = literal_value(node)
    if value is not None and e.type in INT_RANK:
        return literal_type(value, str(int(value)))
    return e.type


def arithmetic(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    a, b = lw.expr(node.this, ctx), lw.expr(node.expression, ctx)
    ta, tb = _operand_types(a, b)
    fails = strict("arithmetic", a, b)
    if not (is_num(ta) and is_num(tb)):
        raise refuse(f"{describe(node)} of {ta} and {tb}")
    if is_float(ta) or is_float(tb):
        # Floating arithmetic never raises on either engine (it overflows to infinity).
        result = "DOUBLE" if "DOUBLE" in (ta, tb) else "FLOAT"
        left, right = operand(a.node), operand(b.node)
        if result == "FLOAT":  # Spark would compute a FLOAT with a DECIMAL in DOUBLE
            left = (
                left
                if is_float(ta) or ta in ("TINYINT", "SMALLINT", "INTEGER", "BIGINT")
                else cast_to(a.node, result)
            )
            right = (
                right
                if is_float(tb) or tb in ("TINYINT", "SMALLINT", "INTEGER", "BIGINT")
                else cast_to(b.node, result)
            )
        return Lowered(node.__class__(this=left, expression=right), result, fails)
    if is_decimal(ta) or is_decimal(tb):
        # Spark and DuckDB size decimal results differently (and overflow at other points).
        raise refuse("arithmetic on DECIMAL values")
    result = _int_result(a, node.this, b, node.expression)
    left, right = _int_operands(a, node.this, b, node.expression, result)
    bits = None
    if a.bits is not None and b.bits is not None:
        bits = a.bits + b.bits if isinstance(node, exp.Mul) else max(a.bits, b.bits) + 1
    if bits is not None and bits <= CAPACITY[result]:
        # Within the type on any data (e.g. an INTEGER column widened to HUGEINT, plus 1): it
        # cannot overflow on either engine.
        return Lowered(node.__class__(this=left, expression=right), result, fails, bits)
    if ctx.in_try:
        # Integer overflow raises on Spark as on DuckDB; inside TRY it must give NULL instead.
        return Lowered(fn(_TRY_OPS[type(node)], left, right), result, True)
    return Lowered(node.__class__(this=left, expression=right), result, fails)


def _int_operands(
    a: Lowered, a_node: exp.Expression, b: Lowered, b_node: exp.Expression, result: str
) -> tuple[exp.Expression, exp.Expression]:
    """The operands of integer arithmetic so that Spark computes it in ``result``, DuckDB's
    type (an integer literal is INT on Spark; beside a SMALLINT, DuckDB makes it SMALLINT)."""
    sa, sb = _spark_int(a, a_node), _spark_int(b, b_node)
    if result == "HUGEINT":
        if "HUGEINT" in (sa, sb):  # DECIMAL(38, 0) with any integer stays DECIMAL(38, 0)
            return operand(a.node), operand(b.node)
        return cast_to(a.node, result), cast_to(b.node, result)
    natural = INT_BY_RANK[max(INT_RANK.get(sa, 3), INT_RANK.get(sb, 3))]
    if natural == result:
        return operand(a.node), operand(b.node)
    left = operand(a.node) if sa == result else cast_to(a.node, result)
    right = operand(b.node) if sb == result else cast_to(b.node, result)
    return left, right


def _ieee_divide(a: exp.Expression, b: exp.Expression) -> exp.Expression:
    """a / b on doubles as DuckDB computes it: IEEE, x / ±0 is ±inf (by the signs) and 0 / 0
    NaN, where Spark raises (ANSI) or gives NULL."""
    zero = exp.Literal.number(0)
    negative_zero = exp.EQ(this=cast_to(b, "VARCHAR"), expression=exp.Literal.string("-0.0"))
    positive = exp.GT(this=a, expression=zero.copy())
    nan = exp.Or(this=fn("ISNAN", a), expression=exp.EQ(this=a, expression=zero.copy()))
    by_zero = case_when(
        (is_null(a), cast_to(exp.Null(), "DOUBLE")),
        (nan, double_literal(NAN)),
        (
            exp.NEQ(this=exp.Paren(this=positive), expression=exp.Paren(this=negative_zero)),
            double_literal(INF),
        ),
        default=double_literal(NINF),
    )
    return case_when(
        (exp.EQ(this=b, expression=zero), by_zero), default=exp.Div(this=a, expression=b)
    )


def divide(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    a, b = lw.expr(node.this, ctx), lw.expr(node.expression, ctx)
    ta, tb = _operand_types(a, b)
    if not (is_num(ta) and is_num(tb)):
        raise refuse(f"/ of {ta} and {tb}")
    fails = strict("/", a, b)
    result = "FLOAT" if ta == tb == "FLOAT" else "DOUBLE"
    # DuckDB's / is floating division on every numeric type (integers included).
    left = operand(a.node) if is_float(ta) else cast_to(a.node, "DOUBLE")
    right = operand(b.node) if is_float(tb) else cast_to(b.node, "DOUBLE")
    divisor = literal_value(node.expression)
    if divisor is not None and divisor != 0:
        out: exp.Expression = exp.Div(this=left, expression=right)  # a non-zero literal
    else:
        out = _ieee_divide(left, right)
    return Lowered(out if result == "DOUBLE" else cast_to(out, "FLOAT"), result, fails)


def _nonzero_divisor(node: exp.Expression) -> bool:
    """A divisor that cannot be zero: a non-zero literal, or NULLIF(d, 0) (as dpsql's
    totality rewrite writes every divisor of // and %)."""
    value = literal_value(node)
    if value is not None:
        return value != 0
    while isinstance(node, exp.Paren):
        node = node.this
    return isinstance(node, exp.Nullif) and literal_value(node.expression) == 0


def int_div_mod(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    a, b = lw.expr(node.this, ctx), lw.expr(node.expression, ctx)
    ta, tb = _operand_types(a, b)
    if not (is_num(ta) and is_num(tb)):
        raise refuse(f"{describe(node)} of {ta} and {tb}")
    fails = strict(describe(node), a, b)
    safe = _nonzero_divisor(node.expression)
    mod = isinstance(node, exp.Mod)
    if is_float(ta) or is_float(tb):
        result = "FLOAT" if ta == tb == "FLOAT" else "DOUBLE"
        left = operand(a.node) if is_float(ta) else cast_to(a.node, "DOUBLE")
        right = operand(b.node) if is_float(tb) else cast_to(b.node, "DOUBLE")
        if mod:
            # DuckDB's % on doubles is fmod, NaN for a zero divisor (Spark raises there).
            fmod = case_when(
                (is_null(left), cast_to(exp.Null(), "DOUBLE")),
                (exp.EQ(this=right, expression=exp.Literal.number(0)), double_literal(NAN)),
                default=exp.Mod(this=left, expression=right),
            )
            return Lowered(fmod, result, fails)
        # DuckDB's // on doubles is plain division, failing on a zero divisor like Spark's /.
        if ctx.in_try and not safe:
            return Lowered(fn("TRY_DIVIDE", left, right), result, True)
        return Lowered(exp.Div(this=left, expression=right), result, fails)
    if is_decimal(ta) or is_decimal(tb):
        raise refuse(f"{describe(node)} on DECIMAL values")
    result = _int_result(a, node.this, b, node.expression)
    left, right = _int_operands(a, node.this, b, node.expression, result)
    if mod:
        # Integer % truncates (the result takes the dividend's sign) on both engines, and its
        # result is smaller than the divisor: it cannot overflow, only fail on a zero divisor.
        bits = None if a.bits is None or b.bits is None else min(a.bits, b.bits)
        if ctx.in_try and not safe:
            return Lowered(fn("TRY_MOD", left, right), result, True)
        return Lowered(exp.Mod(this=left, expression=right), result, fails, bits)
    # Integer // truncates towards zero on DuckDB. Spark's div on decimals returns a BIGINT
    # that wraps silently past 2^63: the quotient is computed exactly in decimals instead, as
    # (a - a % b) / b, which divides exactly (a DECIMAL(38, 6) holds 32 integer digits; beyond,
    # Spark raises, or with try_divide gives NULL). Within BIGINT, Spark's div is exact and
    # raises on overflow (MIN div -1) as DuckDB does.
    # |a // b| <= |a|, and only MIN // -1 leaves the type: safe when a is within its capacity.
    bits = a.bits
    fits = bits is not None and bits <= CAPACITY[result]
    if result != "HUGEINT" and (not ctx.in_try or (safe and fits)):
        div = exp.IntDiv(this=left, expression=right)
        return Lowered(div if result == "BIGINT" else cast_to(div, result), result, fails, bits)
    big_a = operand(a.node) if a.type == "HUGEINT" else cast_to(a.node, "HUGEINT")
    big_b = operand(b.node) if b.type == "HUGEINT" else cast_to(b.node, "HUGEINT")
    # A quotient below 2^106 (< 10^32) fits the DECIMAL(38, 6) of Spark's division.
    if ctx.in_try and not (safe and bits is not None and bits <= 106):
        rest = fn("TRY_MOD", big_a, big_b)
        quotient = fn("TRY_DIVIDE", exp.Sub(this=big_a, expression=rest), big_b)
        return Lowered(try_cast_to(quotient, result), result, True)
    rest = exp.Mod(this=big_a, expression=big_b)
    quotient = exp.Div(this=exp.Paren(this=exp.Sub(this=big_a, expression=rest)), expression=big_b)
    out = cast_to(quotient, "HUGEINT")
    if result == "HUGEINT":
        return Lowered(out, result, fails, bits)
    if ctx.in_try:  # MIN // -1 leaves the type: NULL, as DuckDB's error inside TRY
        return Lowered(try_cast_to(out, result), result, True)
    return Lowered(cast_to(out, result), result, fails, bits)


def negate(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    value = literal_value(node)
    if value is not None:
        text = str(node.this.this) if isinstance(node.this, exp.Literal) else None
        if text is not None:
            t = literal_type(value, "-" + text)
            return Lowered(exp.Neg(this=exp.Literal.number(text)), t, bits=int_bits(value, t))
    a = lw.expr(node.this, ctx)
    if not is_num(a.type) and a.type != "NULL":
        raise refuse(f"- of {a.type}")
    negated = _negated_in_try(a, ctx)
    if negated is not None:
        return Lowered(negated, a.type, True)
    return Lowered(exp.Neg(this=operand(a.node)), a.type, a.fails, a.bits)


def _negated_in_try(a: Lowered, ctx: Context) -> exp.Expression | None:
    """``-a`` as ``try_subtract(0, a)`` where it can overflow inside TRY (-MIN of an integer
    type whose range the value may fill): NULL there, as DuckDB's error under TRY; None where
    plain negation cannot raise."""
    fits = a.bits is not None and a.bits <= CAPACITY.get(a.type, 0)
    if is_int(a.type) and ctx.in_try and not fits:
        return fn("TRY_SUBTRACT", cast_to(exp.Literal.number(0), a.type), a.node)
    return None


def absolute(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    a = lw.expr(node.this, ctx)
    if not is_num(a.type) and a.type != "NULL":
        raise refuse(f"ABS of {a.type}")
    negated = _negated_in_try(a, ctx)
    if negated is not None:
        out = case_when(
            (exp.LT(this=operand(a.node), expression=exp.Literal.number(0)), negated),
            default=a.node,
        )
        return Lowered(out, a.type, True)
    return Lowered(fn("ABS", a.node), a.type, a.fails, a.bits)
