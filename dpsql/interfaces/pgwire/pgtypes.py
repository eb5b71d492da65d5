"""PostgreSQL types for ``dpsql serve``: type OIDs, DuckDB type names to them, values to text.

``pg_type`` is the type (OID and size) a DuckDB column is described as in a RowDescription, and
``encode_text`` the text a value of it is sent as. The OIDs here are also the ones
``dpsql.interfaces.pgwire.parameters`` decodes Bind parameters by.

Text output follows PostgreSQL's own output functions (``DateStyle = ISO``,
``IntervalStyle = postgres``): ``float8out`` picks the shortest round-trip digits and prints
fixed notation for decimal exponents in [-4, 15) (float4: [-4, 6)), scientific otherwise;
timestamps drop trailing zeros of the fraction; intervals print only non-zero parts.
"""

from __future__ import annotations

import math
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from fractions import Fraction

import numpy as np

_BOOL, _BYTEA, _INT8, _INT2, _INT4, _TEXT = 16, 17, 20, 21, 23, 25
_FLOAT4, _FLOAT8, _VARCHAR, _DATE, _TIME, _TIMESTAMP = 700, 701, 1043, 1082, 1083, 1114
_TIMESTAMPTZ, _INTERVAL, _TIMETZ, _NUMERIC, _UUID = 1184, 1186, 1266, 1700, 2950
_UNKNOWN, _NAME, _BPCHAR, _UNKNOWN_LITERAL = 0, 19, 1042, 705

_TYPE_BY_NAME: dict[str, tuple[int, int]] = {}
for _names, _type in (
    ("BOOLEAN BOOL LOGICAL", (_BOOL, 1)),
    # Unsigned types map to the narrowest signed type that holds their whole range.
    ("TINYINT INT1 SMALLINT INT2 SHORT UTINYINT", (_INT2, 2)),
    ("INTEGER INT INT4 SIGNED USMALLINT", (_INT4, 4)),
    ("BIGINT INT8 LONG UINTEGER", (_INT8, 8)),
    ("HUGEINT INT128 UBIGINT UHUGEINT DECIMAL NUMERIC VARINT BIGNUM", (_NUMERIC, -1)),
    ("REAL FLOAT4 FLOAT", (_FLOAT4, 4)),
    ("DOUBLE FLOAT8", (_FLOAT8, 8)),
    ("VARCHAR TEXT STRING CHAR BPCHAR", (_TEXT, -1)),
    ("DATE", (_DATE, 4)),
    ("TIMESTAMP DATETIME TIMESTAMP_S TIMESTAMP_MS TIMESTAMP_US TIMESTAMP_NS", (_TIMESTAMP, 8)),
    ("TIMESTAMPTZ", (_TIMESTAMPTZ, 8)),
    ("TIME", (_TIME, 8)),
    ("TIMETZ", (_TIMETZ, 12)),
    ("INTERVAL", (_INTERVAL, 16)),
    ("UUID", (_UUID, 16)),
    ("BLOB BYTEA BINARY VARBINARY", (_BYTEA, -1)),
):
    _TYPE_BY_NAME.update(dict.fromkeys(_names.split(), _type))
_TYPE_BY_NAME["DOUBLE PRECISION"] = (_FLOAT8, 8)
_TYPE_BY_NAME["TIMESTAMP WITH TIME ZONE"] = (_TIMESTAMPTZ, 8)
_TYPE_BY_NAME["TIME WITH TIME ZONE"] = (_TIMETZ, 12)


def pg_type(duckdb_type: str) -> tuple[int, int]:
    """The PostgreSQL ``(type OID, typlen)`` for a DuckDB type name; text for anything else.

    >>> pg_type("DECIMAL(18,3)")
    (1700, -1)
    >>> pg_type("INTEGER[]")
    (25, -1)
    """
    name = " ".join(duckdb_type.upper().split())
    if name.endswith("]"):  # LIST and ARRAY types print as text
        return _TEXT, -1
    base = name.split("(", 1)[0].strip()
    return _TYPE_BY_NAME.get(base, (_TEXT, -1))


def encode_text(value: object, *, oid: int = 0) -> bytes | None:
    """PostgreSQL's text output for a Python value, UTF-8 encoded; ``None`` stays ``None``.

    ``oid`` matters only for floats: with 700 (real) the value prints as a float4, with the
    shortest digits that round-trip in single precision.
    """
    if value is None:
        return None
    if isinstance(value, np.generic):
        value = value.item()
    return _text(value, oid).encode("utf-8")


def _text(value: object, oid: int) -> str:
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _format_float(value, single=oid == _FLOAT4)
    if isinstance(value, Decimal):
        return _format_decimal(value)
    if isinstance(value, datetime):
        clock = _format_clock(value.hour, value.minute, value.second, value.microsecond)
        offset = value.utcoffset()
        zone = "" if offset is None else _format_offset(offset)
        return f"{value.year:04d}-{value.month:02d}-{value.day:02d} {clock}{zone}"
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, time):
        offset = value.utcoffset()
        zone = "" if offset is None else _format_offset(offset)
        return _format_clock(value.hour, value.minute, value.second, value.microsecond) + zone
    if isinstance(value, timedelta):
        return _format_interval(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return "\\x" + bytes(value).hex()
    return str(value)


def _format_float(value: float, single: bool) -> str:
    if single:
        # A value beyond the float4 range is no float4 after all: print it as the double it is.
        rounded = _to_float4(value)
        single = math.isfinite(rounded) or not math.isfinite(value)
        value = rounded if single else value
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    sign, digits, exponent = Decimal(_shortest(value, single)).as_tuple()
    assert isinstance(exponent, int)
    text = "".join(map(str, digits)).rstrip("0")
    display = exponent + len(digits) - 1  # the exponent of the leading digit
    if -4 <= display < (6 if single else 15):
        if display >= 0:
            whole, fraction = text[: display + 1].ljust(display + 1, "0"), text[display + 1 :]
            body = whole + ("." + fraction if fraction else "")
        else:
            body = "0." + "0" * (-display - 1) + text
    else:
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        body = f"{mantissa}e{'-' if display < 0 else '+'}{abs(display):02d}"
    return ("-" if sign else "") + body


def _shortest(value: float, single: bool) -> str:
    """The shortest decimal strictly inside the interval of reals that round to ``value``.

    ``repr`` (and numpy's float32 equivalent) may return a decimal lying exactly halfway to
    a neighbour, which round-half-even reading still maps back. PostgreSQL's Ryu is built
    without STRICTLY_SHORTEST and never prints one, so that a strtod rounding ties another
    way reads the value back too; in that case a longer decimal is printed.
    """
    if single:
        own = np.float32(value)
        text = np.format_float_scientific(own, unique=True, trim="-")
        with np.errstate(all="ignore"):  # the neighbour of the largest float4 is infinite
            below = float(np.nextafter(own, np.float32(-np.inf)))
            above = float(np.nextafter(own, np.float32(np.inf)))
        value = float(own)
    else:
        text = repr(value)
        below, above = math.nextafter(value, -math.inf), math.nextafter(value, math.inf)
    exact = Fraction(value)
    gap_below = exact - Fraction(below) if math.isfinite(below) else Fraction(above) - exact
    gap_above = Fraction(above) - exact if math.isfinite(above) else gap_below
    low, high = exact - gap_below / 2, exact + gap_above / 2
    count = len(Decimal(text).as_tuple().digits)
    while not low < Fraction(Decimal(text)) < high:
        count += 1
        text = f"{value:.{count - 1}e}"  # the nearest decimal with ``count`` digits
    return text


def _to_float4(value: float) -> float:
    """The nearest float4, as a Python float; an infinity when beyond the float4 range."""
    with np.errstate(over="ignore"):
        return float(np.float32(value))


def _format_decimal(value: Decimal) -> str:
    if value.is_nan():
        return "NaN"
    if value.is_infinite():
        return "Infinity" if value > 0 else "-Infinity"
    if value.is_zero():
        value = abs(value)  # numeric has no negative zero
    return format(value, "f")


def _format_clock(hour: int, minute: int, second: int, microsecond: int) -> str:
    text = f"{hour:02d}:{minute:02d}:{second:02d}"
    if microsecond:
        text += "." + f"{microsecond:06d}".rstrip("0")
    return text


def _format_offset(offset: timedelta) -> str:
    seconds = int(offset.total_seconds())
    sign = "-" if seconds < 0 else "+"
    hours, rest = divmod(abs(seconds), 3600)
    minutes, seconds = divmod(rest, 60)
    text = f"{sign}{hours:02d}"
    if minutes or seconds:
        text += f":{minutes:02d}"
    if seconds:
        text += f":{seconds:02d}"
    return text


def _format_interval(value: timedelta) -> str:
    negative = value < timedelta(0)
    size = -value if negative else value
    sign = "-" if negative else ""
    parts = []
    if size.days:
        unit = "day" if size.days == 1 and not negative else "days"
        parts.append(f"{sign}{size.days} {unit}")
    if size.seconds or size.microseconds or not size.days:
        minutes, second = divmod(size.seconds, 60)
        hour, minute = divmod(minutes, 60)
        parts.append(sign + _format_clock(hour, minute, second, size.microseconds))
    return " ".join(parts)
