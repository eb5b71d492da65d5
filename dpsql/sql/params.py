"""Bind ``?`` parameters on the AST, as literal nodes: values are never pasted into SQL text.

A string parameter becomes one string literal node whatever it contains, so
``"x' OR 1=1 --"`` is compared as that exact string and cannot change the query's shape.

Values are bounded before they become literals, as the query text is: a number has at most
``MAX_NUMBER_DIGITS`` significant digits and lies within the range of a double (the interval
arithmetic of the bounds reads literals exactly, and ``1e999999999`` would expand to a billion
digits), and the strings of one query hold at most ``MAX_PARAMETER_TEXT`` characters together.
"""

from __future__ import annotations

import datetime as dt
import math
import sys
from collections.abc import Sequence
from decimal import Decimal

from sqlglot import exp

from dpsql.errors import ParameterError
from dpsql.sql.parse import MAX_QUERY_LENGTH

# DuckDB's widest exact numbers (DECIMAL(38), HUGEINT) hold 38 digits.
MAX_NUMBER_DIGITS = 38
LARGEST_DOUBLE = Decimal(repr(sys.float_info.max))
# A query's parameters may add as much text as the query itself may have.
MAX_PARAMETER_TEXT = MAX_QUERY_LENGTH


def literal_for(value: object, position: int) -> exp.Expression:
    """The AST literal for one parameter value."""
    if value is None:
        return exp.Null()
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int):
        # Compared, not printed: str() of a 5,000-digit integer raises ValueError.
        if abs(value) >= 10**MAX_NUMBER_DIGITS:
            raise ParameterError(f"parameter {position} has more than {MAX_NUMBER_DIGITS} digits")
        return exp.Literal.number(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ParameterError(f"parameter {position} must be a finite number")
        return exp.Literal.number(repr(value))
    if isinstance(value, Decimal):
        if not value.is_finite():  # NaN, sNaN (is_finite does not signal), infinities
            raise ParameterError(f"parameter {position} must be a finite number")
        # Read off the tuple, never expanded: Decimal("1e999999999") is one digit long.
        digits, adjusted = len(value.as_tuple().digits), value.adjusted()
        if (
            digits > MAX_NUMBER_DIGITS
            or (value and not -400 <= adjusted <= 400)
            or (abs(value) > LARGEST_DOUBLE)
        ):
            raise ParameterError(
                f"parameter {position} must have at most {MAX_NUMBER_DIGITS} digits and lie "
                "within the range of a double"
            )
        # A zero may carry any exponent ("0e15625820"): written out, it is "0" (reading the
        # text back as a Fraction would expand 10**15625820).
        return exp.Literal.number(str(value) if value else "0")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: no engine or client can carry it
            raise ParameterError(f"parameter {position} is not valid Unicode text") from None
        return exp.Literal.string(value)
    if isinstance(value, dt.datetime):
        return exp.cast(exp.Literal.string(value.isoformat(sep=" ")), exp.DataType.Type.TIMESTAMP)
    if isinstance(value, dt.date):
        return exp.cast(exp.Literal.string(value.isoformat()), exp.DataType.Type.DATE)
    raise ParameterError(
        f"parameter {position} has an unsupported type {type(value).__name__}; use None, bool, "
        "int, float, Decimal, str, date or datetime"
    )


def bind_parameters(select: exp.Select, params: Sequence[object] | None) -> exp.Select:
    """A copy of ``select`` with each ``?`` replaced, in order, by the matching parameter."""
    if params is not None and (isinstance(params, str | bytes) or not isinstance(params, Sequence)):
        raise ParameterError("parameters must be a sequence (qmark style), e.g. a tuple")
    values = list(params or ())
    bound = select.copy()
    # Depth-first pre-order visits the nodes of a SELECT in the order they are written, which
    # is the order users number their parameters by.
    found = list(bound.find_all(exp.Placeholder, bfs=False))
    placeholders = [p for p in found if not p.this]
    named = [p for p in found if p.this]
    if named:
        raise ParameterError("only ? (qmark) parameters are supported")
    if len(placeholders) != len(values):
        raise ParameterError(
            f"the query has {len(placeholders)} parameter marker(s) but {len(values)} "
            "value(s) were given"
        )
    text = sum(len(v) for v in values if isinstance(v, str))
    if text > MAX_PARAMETER_TEXT:
        raise ParameterError(
            f"the string parameters hold more than {MAX_PARAMETER_TEXT} characters together"
        )
    for i, (node, value) in enumerate(zip(placeholders, values, strict=True), start=1):
        node.replace(literal_for(value, i))
    return bound
