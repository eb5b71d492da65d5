"""The policy's numbers: exact rationals from users' text, and the limits on them.

Privacy parameters and value bounds are exact rationals parsed from their decimal text, so that
``0.01`` is exactly 1/100 (``Fraction(0.01)`` is slightly above it, and a budget check on it
would be off by one query in a hundred). ``to_fraction`` bounds a number's size before any exact
arithmetic on it; ``check_epsilon`` and ``check_delta`` check a privacy parameter's range, and
``Exact`` is the policy models' field type for such a number.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from fractions import Fraction
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer

from dpsql.errors import ParameterError

__all__ = [
    "LARGEST_NUMBER",
    "MAX_ABS_BOUND",
    "MAX_CONTRIBUTION_BOUND",
    "MAX_NUMBER_BITS",
    "MAX_NUMBER_TEXT",
    "MAX_QUERY_EPSILON",
    "MAX_TOTAL_EPSILON",
    "SMALLEST_NUMBER",
    "Exact",
    "check_delta",
    "check_epsilon",
    "decimal_up",
    "to_fraction",
]

# A per-query epsilon above this is refused as absurd: at epsilon 20 one answer may change odds
# by a factor of e^20 ~ 5e8, which protects nothing. Totals may be larger (many queries).
MAX_QUERY_EPSILON = Fraction(20)
# A per-query rho above this is refused as absurd (it certifies epsilon > 20 at any delta).
MAX_QUERY_RHO = Fraction(10)
MAX_TOTAL_EPSILON = Fraction(10_000)
# Contribution bounds above this are almost surely a typo and make noise useless.
MAX_CONTRIBUTION_BOUND = 1_000_000
# Bounds beyond 2**52 in magnitude lose exactness when the engine clamps in DOUBLE.
MAX_ABS_BOUND = Fraction(2**52)


# Numbers from users are read as exact rationals, so their size is bounded before any exact
# arithmetic: Fraction("1e999999999") computes 10**999999999 (minutes of CPU, gigabytes of
# memory), and a float conversion of a huge integer raises OverflowError far downstream.
MAX_NUMBER_TEXT = 100  # characters (or significant digits) of one number
MAX_NUMBER_BITS = 2048  # bits of an integer, or of a Fraction's numerator and denominator
# A nonzero number lies within [1e-300, 1e300] in magnitude: beyond, no float the accountants
# and samplers compute with can hold it (5e-324 is a denormal, 1e309 overflows).
SMALLEST_NUMBER = Fraction(1, 10**300)
LARGEST_NUMBER = Fraction(10**300)
_SPACES = " \t\n\r\f\v"
_DECIMAL_TEXT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_RATIO_TEXT = re.compile(r"[+-]?[0-9]+/[0-9]+")
_RANGE = "0 or between 1e-300 and 1e300 in magnitude"


def to_fraction(value: object, name: str) -> Fraction:
    """An exact rational from decimal text, an integer, a Decimal, a Fraction or a float.

    A float is read through its shortest round-trip decimal text (``repr``), so ``0.01`` gives
    exactly 1/100: the number the user wrote, not the binary double nearest to it. Text is
    ASCII decimal notation (``0.5``, ``1e-6``) or a ratio of integers (``1/3``), at most
    ``MAX_NUMBER_TEXT`` characters; a nonzero value must lie within [1e-300, 1e300] in
    magnitude. Every check runs before any exact arithmetic on the value, and the message names
    ``name``, never the value.
    """
    if isinstance(value, bool):
        raise ParameterError(f"{name} must be a number, not a boolean")
    if isinstance(value, Fraction):
        if max(value.numerator.bit_length(), value.denominator.bit_length()) > MAX_NUMBER_BITS:
            raise ParameterError(f"{name} must be {_RANGE}")
        result = value
    elif isinstance(value, int):
        if value.bit_length() > MAX_NUMBER_BITS:
            raise ParameterError(f"{name} must be {_RANGE}")
        result = Fraction(value)
    elif isinstance(value, Decimal):
        result = _from_decimal(value, name)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ParameterError(f"{name} must be a finite number")
        result = _from_decimal(Decimal(repr(value)), name)
    elif isinstance(value, str):
        result = _from_text(value, name)
    else:
        raise ParameterError(f"{name} must be a number")
    if result != 0 and not SMALLEST_NUMBER <= abs(result) <= LARGEST_NUMBER:
        raise ParameterError(f"{name} must be {_RANGE}")
    return result


def _from_decimal(value: Decimal, name: str) -> Fraction:
    if not value.is_finite():  # NaN, sNaN (is_finite does not signal) and the infinities
        raise ParameterError(f"{name} must be a finite number")
    # adjusted() reads the exponent without expanding it; a few hundred digits then convert
    # at once, and the exact range check follows.
    if value and (len(value.as_tuple().digits) > MAX_NUMBER_TEXT or abs(value.adjusted()) > 400):
        raise ParameterError(f"{name} must be {_RANGE}")
    return Fraction(value)


def _from_text(value: str, name: str) -> Fraction:
    text = value.strip(_SPACES)
    if len(text) > MAX_NUMBER_TEXT:
        raise ParameterError(f"{name} must be a number of at most {MAX_NUMBER_TEXT} characters")
    # The grammar is ASCII on purpose: Python's own parsers also take other scripts' digits
    # ("١"), underscores ("1_0") and words ("Infinity"), which no SQL or TOML reader would.
    if _DECIMAL_TEXT.fullmatch(text):
        return _from_decimal(Decimal(text), name)
    if _RATIO_TEXT.fullmatch(text):
        numerator, denominator = text.split("/")
        if int(denominator) == 0:
            raise ParameterError(f"{name} must not divide by zero")
        return Fraction(int(numerator), int(denominator))
    raise ParameterError(f"{name} must be a decimal number (e.g. 0.5 or 1e-6) or a ratio (1/3)")


def check_epsilon(value: object, name: str, cap: Fraction) -> Fraction:
    """A positive, finite epsilon no larger than ``cap``."""
    eps = to_fraction(value, name)
    if eps <= 0:
        raise ParameterError(f"{name} must be positive")
    if eps > cap:
        raise ParameterError(f"{name} must be at most {cap}")
    return eps


def check_delta(value: object, name: str) -> Fraction:
    """A delta in [0, 1)."""
    delta = to_fraction(value, name)
    if not 0 <= delta < 1:
        raise ParameterError(f"{name} must be in [0, 1)")
    return delta


def _exact(value: Any) -> Fraction:
    try:
        return to_fraction(value, "value")
    except ParameterError as exc:
        raise ValueError(str(exc)) from None


Exact = Annotated[
    Fraction,
    BeforeValidator(_exact),
    PlainSerializer(str, return_type=str),
]


def exact(value: Fraction | None) -> str | None:
    """An exact rational as text: an integer or a finite decimal as such, otherwise ``p/q``."""
    if value is None:
        return None
    if value.denominator == 1:
        return str(value.numerator)
    den, twos, fives = value.denominator, 0, 0
    while den % 2 == 0:
        den, twos = den // 2, twos + 1
    while den % 5 == 0:
        den, fives = den // 5, fives + 1
    if den != 1:
        return str(value)
    places = max(twos, fives)
    scaled = abs(value) * 10**places
    assert scaled.denominator == 1  # a terminating decimal: the loops above prove it
    digits = str(scaled.numerator).rjust(places + 1, "0")
    sign = "-" if value < 0 else ""
    return f"{sign}{digits[:-places]}.{digits[-places:]}"


def decimal_up(x: Fraction | float, digits: int) -> Fraction:
    """``x`` > 0 rounded up to ``digits`` significant decimal digits, as an exact rational: a
    cost that prints as a short decimal and is never below the figure it was read from."""
    value = Fraction(x)
    shift = digits - 1 - math.floor(math.log10(value))
    scale = Fraction(10) ** shift
    return Fraction(math.ceil(value * scale)) / scale


def decimal_text(value: Fraction) -> str:
    """An exact number as a decimal (1/5 as 0.2, 1/1000000 as 0.000001); one that has no finite
    decimal also in its exact form (``0.333333 (exactly 1/3)``)."""
    text = exact(value) or ""
    return text if "/" not in text else f"{float(value):.6g} (exactly {value})"
