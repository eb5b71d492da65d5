"""Interval arithmetic: the range of a row-level expression from the bounds of its columns.

The result bounds an aggregate's argument, so that ``SUM(spend * 2)`` or
``SUM(CASE WHEN age > 30 THEN spend ELSE 0 END)`` get a finite sensitivity. The rewrite also
clamps the expression's value to this interval per row, so a mistake here could cost accuracy
but never privacy: the sensitivity always follows the clamp that the engine applies.
``None`` stands for an infinite end.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction

from sqlglot import exp

End = Fraction | None


@dataclass(frozen=True)
class Interval:
    """A closed interval ``[lower, upper]``; ``None`` ends are unbounded."""

    lower: End
    upper: End
    integral: bool = False  # every value is an integer (the grid may then be 1)

    @property
    def finite(self) -> bool:
        return self.lower is not None and self.upper is not None


UNBOUNDED = Interval(None, None)


def _add(a: End, b: End) -> End:
    return None if a is None or b is None else a + b


def _neg(a: End) -> End:
    return None if a is None else -a


def _hull(parts: list[Interval]) -> Interval:
    lows = [p.lower for p in parts]
    highs = [p.upper for p in parts]
    return Interval(
        None if None in lows else min(x for x in lows if x is not None),
        None if None in highs else max(x for x in highs if x is not None),
        all(p.integral for p in parts),
    )


def _mul(a: Interval, b: Interval) -> Interval:
    integral = a.integral and b.integral
    if a.finite and b.finite:
        assert a.lower is not None and a.upper is not None
        assert b.lower is not None and b.upper is not None
        products = [x * y for x in (a.lower, a.upper) for y in (b.lower, b.upper)]
        return Interval(min(products), max(products), integral)
    for const, other in ((a, b), (b, a)):
        if const.finite and const.lower == const.upper:
            c = const.lower
            assert c is not None
            if c == 0:
                return Interval(Fraction(0), Fraction(0), True)
            lo, hi = (other.lower, other.upper) if c > 0 else (other.upper, other.lower)
            return Interval(
                None if lo is None else lo * c, None if hi is None else hi * c, integral
            )
    return UNBOUNDED


def _constant(node: exp.Expression) -> Fraction | None:
    if isinstance(node, exp.Literal) and not node.is_string:
        try:
            return Fraction(str(node.this))
        except (ValueError, ZeroDivisionError):
            return None
    if isinstance(node, exp.Neg):
        inner = _constant(node.this)
        return None if inner is None else -inner
    if isinstance(node, exp.Paren):
        return _constant(node.this)
    return None


def _round_out(iv: Interval) -> Interval:
    lo = None if iv.lower is None else Fraction(math.floor(iv.lower))
    hi = None if iv.upper is None else Fraction(math.ceil(iv.upper))
    return Interval(lo, hi, True)


def _abs(iv: Interval) -> Interval:
    lo, hi = iv.lower, iv.upper
    if lo is not None and lo >= 0:
        return iv
    if hi is not None and hi <= 0:
        return Interval(_neg(hi), _neg(lo), iv.integral)
    top = None if lo is None or hi is None else max(-lo, hi)
    return Interval(Fraction(0), top, iv.integral)


def _least(parts: list[Interval]) -> Interval:
    lows = [p.lower for p in parts]
    highs = [p.upper for p in parts if p.upper is not None]
    return Interval(
        None if None in lows else min(x for x in lows if x is not None),
        min(highs) if highs else None,
        all(p.integral for p in parts),
    )


def _greatest(parts: list[Interval]) -> Interval:
    flipped = [Interval(_neg(p.upper), _neg(p.lower), p.integral) for p in parts]
    least = _least(flipped)
    return Interval(_neg(least.upper), _neg(least.lower), least.integral)


ColumnBounds = Callable[[exp.Column], Interval]

# Functions whose value lies in a fixed integer range whatever their argument (NULL aside).
_FIXED_RANGES: dict[type[exp.Expression], tuple[int, int | None]] = {
    exp.Length: (0, None),
    exp.Sign: (-1, 1),
    exp.Month: (1, 12),
    exp.Day: (1, 31),
    exp.DayOfWeek: (0, 6),
    exp.Quarter: (1, 4),
    exp.Hour: (0, 23),
    exp.Minute: (0, 59),
}


def interval_of(node: exp.Expression, column: ColumnBounds) -> Interval:
    """The range of ``node`` over all rows, given the range of each column.

    NULL branches contribute nothing: an aggregate skips NULL values.
    """
    const = _constant(node)
    if const is not None:
        return Interval(const, const, const.denominator == 1)
    if isinstance(node, exp.Column):
        return column(node)
    if isinstance(node, exp.Paren):
        return interval_of(node.this, column)
    if isinstance(node, exp.Neg):
        inner = interval_of(node.this, column)
        return Interval(_neg(inner.upper), _neg(inner.lower), inner.integral)
    return _compound(node, column)


def _compound(node: exp.Expression, column: ColumnBounds) -> Interval:
    def sub(n: exp.Expression) -> Interval:
        return interval_of(n, column)

    if isinstance(node, exp.Add):
        a, b = sub(node.this), sub(node.expression)
        return Interval(_add(a.lower, b.lower), _add(a.upper, b.upper), a.integral and b.integral)
    if isinstance(node, exp.Sub):
        a, b = sub(node.this), sub(node.expression)
        return Interval(
            _add(a.lower, _neg(b.upper)), _add(a.upper, _neg(b.lower)), a.integral and b.integral
        )
    if isinstance(node, exp.Mul):
        return _mul(sub(node.this), sub(node.expression))
    if isinstance(node, exp.Div):
        divisor = _constant(node.expression)
        if divisor is None or divisor == 0:
            return UNBOUNDED
        scaled = _mul(sub(node.this), Interval(1 / divisor, 1 / divisor))
        return Interval(scaled.lower, scaled.upper, False)
    if isinstance(node, exp.Case | exp.If):
        return _branches(node, column)
    if isinstance(node, exp.Coalesce):
        return _hull([sub(node.this), *(sub(e) for e in node.expressions)])
    if isinstance(node, exp.Least):
        return _least([sub(node.this), *(sub(e) for e in node.expressions)])
    if isinstance(node, exp.Greatest):
        return _greatest([sub(node.this), *(sub(e) for e in node.expressions)])
    if isinstance(node, exp.Abs):
        return _abs(sub(node.this))
    if isinstance(node, exp.Round | exp.Floor | exp.Ceil | exp.Trunc):
        return _round_out(sub(node.this))
    fixed = _FIXED_RANGES.get(type(node))
    if fixed is not None:
        return Interval(Fraction(fixed[0]), None if fixed[1] is None else Fraction(fixed[1]), True)
    if isinstance(node, exp.Cast | exp.TryCast):
        inner = sub(node.this)
        to = node.to
        if to.is_type(*exp.DataType.INTEGER_TYPES):
            return _round_out(inner)
        if to.is_type(*exp.DataType.REAL_TYPES):
            return inner
    return UNBOUNDED


def _branches(node: exp.Expression, column: ColumnBounds) -> Interval:
    if isinstance(node, exp.If):
        values = [node.args.get("true"), node.args.get("false")]
    else:
        values = [branch.args.get("true") for branch in node.args.get("ifs") or []]
        values.append(node.args.get("default"))
    parts = [
        interval_of(v, column) for v in values if v is not None and not isinstance(v, exp.Null)
    ]
    if not parts:
        return Interval(Fraction(0), Fraction(0), True)
    return _hull(parts)


def declared_bounds(
    bounds: Mapping[str, tuple[Fraction, Fraction]], integral: Mapping[str, bool]
) -> ColumnBounds:
    """A ``ColumnBounds`` from the policy's per-column bounds (column names lower-case)."""

    def column(node: exp.Column) -> Interval:
        name = node.name.lower()
        found = bounds.get(name)
        if found is None:
            return Interval(None, None, integral.get(name, False))
        lo, hi = found
        # Clamping an integer column to fractional bounds yields fractional values.
        whole = integral.get(name, False) and lo.denominator == 1 and hi.denominator == 1
        return Interval(lo, hi, whole)

    return column
