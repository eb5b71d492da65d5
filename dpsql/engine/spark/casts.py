"""Casts: CAST and TRY_CAST as DuckDB computes them (``cast``, ``try_cast``), and the casts of
literals checked when the query is lowered (``constant_cast``).
"""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal, InvalidOperation

from sqlglot import exp

from dpsql.engine.spark.aggregates import count_total
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
    literal_value,
    operand,
    try_cast_to,
)
from dpsql.engine.spark.types import (
    INT_RANGE,
    INT_RANK,
    is_decimal,
    is_float,
    is_int,
    norm_type,
    spark_type,
)

_DATE_TEXT = re.compile(r"\d{4}-\d{2}-\d{2}")
_INT_TEXT = re.compile(r"\s*[+-]?\d{1,40}\s*")
_DECIMAL_TEXT = re.compile(r"\s*[+-]?\d{1,38}(\.\d{1,38})?\s*")
_TIMESTAMP_TEXT = re.compile(r"\d{4}-\d{2}-\d{2}( \d{2}:\d{2}:\d{2}(\.\d{1,6})?)?")


def _clamp_range(node: exp.Expression) -> tuple[Decimal, Decimal] | None:
    """The range [lo, hi] a DuckDB expression cannot leave on any data: ROUND of, or,
    LEAST(GREATEST(x, lo), hi) (or GREATEST(LEAST(x, hi), lo)) with number literals, which on
    both engines skip NULL and map NaN and the infinities into the range (NaN is above every
    number on both)."""
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Round) and node.args.get("decimals") is None:
        return _clamp_range(node.this)
    if isinstance(node, exp.Least | exp.Greatest) and len(node.expressions) == 1:
        outer = literal_value(node.expressions[0])
        inner = node.this
        while isinstance(inner, exp.Paren):
            inner = inner.this
        other = exp.Greatest if isinstance(node, exp.Least) else exp.Least
        if outer is None or not isinstance(inner, other) or len(inner.expressions) != 1:
            return None
        bound = literal_value(inner.expressions[0])
        if bound is None:
            return None
        if isinstance(node, exp.Least):  # LEAST(GREATEST(x, lo), hi) lies in [min(lo, hi), hi]
            return min(bound, outer), outer
        return outer, max(bound, outer)  # GREATEST(LEAST(x, hi), lo) in [lo, max(lo, hi)]
    return None


def _is_round(node: exp.Expression) -> bool:
    while isinstance(node, exp.Paren):
        node = node.this
    return isinstance(node, exp.Round) and node.args.get("decimals") is None


# Doubles at or beyond these do not fit in the integer type; BIGINT's upper end 2^63 is exact
# as a double, and Spark casts 2^63 to 2^63 - 1 instead of failing: compared strictly.
_DOUBLE_LIMITS = {
    "TINYINT": ("-128.0", "127.0", False),
    "SMALLINT": ("-32768.0", "32767.0", False),
    "INTEGER": ("-2147483648.0", "2147483647.0", False),
    "BIGINT": ("-9223372036854775808.0", "9223372036854775808.0", True),
}


def _cast_value(lw: Lowering, node: exp.Cast, ctx: Context, total: bool) -> Lowered:
    """CAST (``total``: TRY_CAST, NULL where DuckDB's cast would fail)."""
    target = norm_type(node.to.sql("duckdb"))
    if target.startswith("?"):
        raise refuse(f"a cast to {target[1:]}")
    source = lw.expr(node.this, ctx)
    s = source.type
    may_fail = not total and ctx.in_try  # a failing CAST inside TRY: DuckDB's error is NULL
    if s == "PARAM":
        if target != "BIGINT":
            raise refuse("the salt cast to another type than BIGINT")
        return Lowered(exp.Cast(this=source.node, to=spark_type("BIGINT")), "BIGINT")
    if s == target and target != "HUGEINT":
        return source
    if s == target:  # CAST(x AS INT128) of a HUGEINT: kept, as written
        return Lowered(cast_to(source.node, target), target, source.fails, source.bits)
    if s == "NULL":
        return Lowered(cast_to(exp.Null(), target), target)
    literal = constant_cast(source, node.this, target)
    if literal is not None:
        return literal
    widening = (
        (is_int(s) and is_int(target) and INT_RANK[s] <= INT_RANK[target])
        or (is_int(s) and is_float(target))
        or (s == "FLOAT" and target == "DOUBLE")
        or (is_decimal(s) and target == "DOUBLE")
        or (s == "BOOLEAN" and (is_int(target) or target == "VARCHAR"))
        or (is_int(s) and target in ("VARCHAR", "BOOLEAN"))
        or (s == "DATE" and target in ("TIMESTAMP", "VARCHAR"))
        or (s == "TIMESTAMP" and target == "DATE")
    )
    if widening:
        # Exact on both engines (integers, booleans and dates print alike), cannot fail.
        bits = source.bits if is_int(s) or s == "BOOLEAN" else None
        return Lowered(
            cast_to(source.node, target), target, source.fails, bits if is_int(target) else None
        )
    if is_int(s) and is_int(target):
        if not (ctx.in_try or total):
            raise refuse(f"a narrowing cast from {s} to {target} outside TRY")
        # Out of range: NULL, as DuckDB's TRY_CAST (or the error TRY catches).
        return Lowered(try_cast_to(source.node, target), target, source.fails or may_fail)
    if is_float(s) and is_int(target) and target != "HUGEINT":
        guarded = ctx.in_try or total
        return _float_to_int(source, node.this, target, guarded=guarded, may_fail=may_fail)
    if is_decimal(s) and is_int(target) and (ctx.in_try or total):
        # DuckDB rounds a decimal half away from zero when it casts it to an integer, as
        # Spark's ROUND does; Spark's cast alone would truncate.
        rounded = fn("ROUND", source.node)
        return Lowered(try_cast_to(rounded, target), target, source.fails or may_fail)
    raise refuse(f"a cast from {s.lstrip('?')} to {target}")


def constant_cast(source: Lowered, original: exp.Expression, target: str) -> Lowered | None:
    """A cast of a literal, checked here: it would fail on any data or on none."""
    if isinstance(original, exp.Literal) and original.is_string:
        text = str(original.this)
        if target == "VARCHAR":
            return Lowered(exp.Literal.string(text), "VARCHAR")
        if target == "DATE" and _DATE_TEXT.fullmatch(text):
            try:
                dt.date.fromisoformat(text)
            except ValueError:
                raise refuse("a cast of an invalid date literal") from None
            return Lowered(cast_to(exp.Literal.string(text), "DATE"), "DATE")
        if target == "TIMESTAMP" and _TIMESTAMP_TEXT.fullmatch(text):
            try:
                dt.datetime.fromisoformat(text)
            except ValueError:
                raise refuse("a cast of an invalid timestamp literal") from None
            return Lowered(cast_to(exp.Literal.string(text), "TIMESTAMP"), "TIMESTAMP")
        if is_float(target):
            special = {"inf": INF, "+inf": INF, "infinity": INF, "-inf": NINF,
                       "-infinity": NINF, "nan": NAN}  # fmt: skip
            name = special.get(text.strip().lower())
            if name is None:
                try:
                    name = repr(float(Decimal(text.strip())))
                except InvalidOperation:
                    raise refuse("a cast of a text literal that is not a number") from None
            return Lowered(exp.Cast(this=exp.Literal.string(name), to=spark_type(target)), target)
        if target == "BOOLEAN" and text.lower() in ("true", "false"):
            return Lowered(exp.Boolean(this=text.lower() == "true"), "BOOLEAN")
        if is_int(target) and _INT_TEXT.fullmatch(text):
            # A key domain's canonical text cast back to the key's type (dpsql.analyze.domains).
            number = exp.Literal.number(str(Decimal(text.strip())))
            return constant_cast(Lowered(number, "HUGEINT"), number, target)
        if is_decimal(target) and _DECIMAL_TEXT.fullmatch(text):
            precision, scale = (int(x) for x in target[8:-1].split(","))
            fixed = Decimal(text.strip())
            exponent = fixed.as_tuple().exponent
            assert isinstance(exponent, int)
            if exponent < -scale or abs(fixed) >= Decimal(10) ** (precision - scale):
                raise refuse(f"a cast of a text literal to {target} that it does not fit")
            return Lowered(cast_to(exp.Literal.number(str(fixed)), target), target)
        raise refuse(f"a cast of a text literal to {target}")
    value = literal_value(original)
    if value is None:
        return None
    if is_int(target):
        lo, hi = INT_RANGE[target]
        if value != value.to_integral_value() or not lo <= value <= hi:
            raise refuse(f"a cast of a number literal to {target} that it does not fit")
        return Lowered(cast_to(source.node, target), target)
    if is_float(target) or (target == "VARCHAR" and is_int(source.type)):
        return Lowered(cast_to(source.node, target), target)
    return None


def _float_to_int(
    source: Lowered, original: exp.Expression, target: str, *, guarded: bool, may_fail: bool
) -> Lowered:
    """A double cast to an integer type. DuckDB rounds half to even (Spark's cast truncates:
    BROUND first); out of range (NaN, the infinities) it fails: NULL with TRY_CAST."""
    lo, hi = INT_RANGE[target]
    rounded = source.node if _is_round(original) else fn("BROUND", source.node)
    clamp = _clamp_range(original)
    exact = 2**53  # a double holds every integer up to 2^53 exactly
    if clamp is not None and max(lo, -exact) <= clamp[0] and clamp[1] <= min(hi, exact):
        # Clamped to literal bounds that the type holds (and a double holds exactly): no value,
        # NaN or infinity included, can make this cast fail on either engine.
        bound = max(abs(clamp[0]), abs(clamp[1]))
        return Lowered(cast_to(rounded, target), target, source.fails, int(bound).bit_length())
    if not guarded:
        raise refuse("a cast of a floating value to an integer type that is not clamped first")
    low, high, strict = _DOUBLE_LIMITS[target]
    r = operand(rounded)
    above = exp.GTE(this=r, expression=double_literal(low))
    below = (exp.LT if strict else exp.LTE)(this=r, expression=double_literal(high))
    # NaN passes >= (it is above every number) and fails the upper test: NULL, as on DuckDB.
    in_range = case_when((exp.And(this=above, expression=below), cast_to(rounded, target)))
    return Lowered(in_range, target, source.fails or may_fail)


def cast(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    assert isinstance(node, exp.Cast)
    counted = count_total(lw, node, ctx)  # a total of counts, in BIGINT
    return counted if counted is not None else _cast_value(lw, node, ctx, total=False)


def try_cast(lw: Lowering, node: exp.Expression, ctx: Context) -> Lowered:
    assert isinstance(node, exp.Cast)
    return _cast_value(lw, node, ctx, total=True)
