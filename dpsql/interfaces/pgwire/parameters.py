"""Bind parameters of the PostgreSQL protocol 3.0 as Python values.

``decode_param`` reads a parameter by its type OID: in text format after PostgreSQL's input
functions (surrounding spaces skipped, any unambiguous prefix of a boolean word, the same range
checks; dates and timestamps in ISO 8601 only), in binary format after their receive functions.

A value that does not decode is a ``ParameterValueError`` with PostgreSQL's SQLSTATE for the
case (22P02, 22003, 22007, 22008, 22021, 22023, 22P03, 0A000): an ordinary error, after which
the connection may stay open. A format code other than text or binary is a ``ProtocolError``.
"""

from __future__ import annotations

import math
import re
import struct
import uuid
from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal

from dpsql.interfaces.pgwire.frontend_messages import ParameterValueError, ProtocolError
from dpsql.interfaces.pgwire.pgtypes import (
    _BOOL,
    _BPCHAR,
    _BYTEA,
    _DATE,
    _FLOAT4,
    _FLOAT8,
    _INT2,
    _INT4,
    _INT8,
    _NAME,
    _NUMERIC,
    _TEXT,
    _TIME,
    _TIMESTAMP,
    _TIMESTAMPTZ,
    _UNKNOWN_LITERAL,
    _UUID,
    _VARCHAR,
    _to_float4,
)


def decode_param(data: bytes | None, fmt: int, oid: int) -> object:
    """A Bind parameter as a Python value, by format code (0 text, 1 binary) and type OID.

    Text: bool, int2/int4/int8, float4/float8, numeric, date, time, timestamp, timestamptz
    (naive input is read as UTC), uuid and bytea (hex or escape format) are converted;
    every other OID (text, varchar, unknown, interval, ...) gives the string. Binary: the
    same types except interval, plus text, varchar, name and bpchar.
    Raises ``ParameterValueError`` for a value that does not decode, or a binary value of a
    type not handled here, and ``ProtocolError`` for a format code other than 0 or 1.
    """
    if data is None:
        return None
    if fmt == 0:
        return _decode_text(_param_text(data), oid)
    if fmt == 1:
        return _decode_binary(data, oid)
    raise ProtocolError(f"unsupported format code: {fmt}")


def _param_text(data: bytes) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ParameterValueError("parameter is not valid UTF-8", "22021") from exc
    if "\0" in text:
        raise ParameterValueError("parameter contains a NUL character", "22021")
    return text


_INTEGER_TEXT = re.compile(r"\s*[+-]?[0-9]+\s*", re.ASCII)
# One way only to read each digit: "[0-9]+\.?[0-9]*" could split a run of digits anywhere, and
# a 20,000-digit parameter that does not match took 7 seconds to refuse.
_NUMBER_TEXT = re.compile(
    r"\s*+(?:[+-]?(?:[0-9]++(?:\.[0-9]*+)?|\.[0-9]++)(?:[eE][+-]?[0-9]++)?|nan|[+-]?inf(?:inity)?)"
    r"\s*+",
    re.IGNORECASE | re.ASCII,
)
_SPACE = " \t\n\r\f\v"  # what C's isspace() takes, and PostgreSQL's input functions skip
_INT_RANGES = {_INT2: ("smallint", 16), _INT4: ("integer", 32), _INT8: ("bigint", 64)}
_TRUE_WORDS = ("true", "yes", "on", "1")
_FALSE_WORDS = ("false", "no", "off", "0")


def _decode_text(text: str, oid: int) -> object:
    parser = _TEXT_PARSERS.get(oid)
    return text if parser is None else parser(text)


def _text_bool(text: str) -> bool:
    word = text.strip(_SPACE).lower()
    # PostgreSQL's boolin takes any unambiguous prefix ("t", "ye", "of"), but "o" alone
    # could be "on" or "off".
    if word and word != "o":
        if any(full.startswith(word) for full in _TRUE_WORDS):
            return True
        if any(full.startswith(word) for full in _FALSE_WORDS):
            return False
    raise ParameterValueError("invalid input syntax for type boolean")


def _text_int(oid: int) -> Callable[[str], int]:
    name, bits = _INT_RANGES[oid]

    def parse(text: str) -> int:
        if not _INTEGER_TEXT.fullmatch(text):
            raise ParameterValueError(f"invalid input syntax for type {name}")
        digits = text.strip(_SPACE).lstrip("+-").lstrip("0") or "0"
        if len(digits) > 20:  # and int() refuses 4,300 digits or more
            raise ParameterValueError(f"value is out of range for type {name}", "22003")
        return _in_range(-int(digits) if "-" in text else int(digits), name, bits)

    return parse


def _in_range(value: int, name: str, bits: int) -> int:
    if not -(1 << (bits - 1)) <= value < 1 << (bits - 1):
        raise ParameterValueError(f"value is out of range for type {name}", "22003")
    return value


def _text_float(oid: int) -> Callable[[str], float]:
    name = "real" if oid == _FLOAT4 else "double precision"

    def parse(text: str) -> float:
        if not _NUMBER_TEXT.fullmatch(text):
            raise ParameterValueError(f"invalid input syntax for type {name}")
        value = float(text)
        if oid == _FLOAT4:
            value = _to_float4(value)
        special = text.strip(_SPACE).lstrip("+-").lower() in ("nan", "inf", "infinity")
        mantissa = re.split("[eE]", text, maxsplit=1)[0]
        underflow = value == 0 and any(digit in mantissa for digit in "123456789")
        if not special and (math.isinf(value) or underflow):
            raise ParameterValueError(f"value is out of range for type {name}", "22003")
        return value

    return parse


def _text_numeric(text: str) -> Decimal:
    if not _NUMBER_TEXT.fullmatch(text):
        raise ParameterValueError("invalid input syntax for type numeric")
    value = Decimal(text.strip(_SPACE))
    # PostgreSQL's limits; they also keep "1e999999999" from printing a billion digits.
    exponent = value.as_tuple().exponent
    if value.is_finite() and (value.adjusted() >= 131072 or int(exponent) < -16383):
        raise ParameterValueError("value is out of range for type numeric", "22003")
    return value


_CLOCK_TEXT = re.compile(
    r"([0-9]{1,2}):([0-9]{2})(?::([0-9]{2})(?:\.([0-9]+))?)?\s*(?:Z|[+-][0-9]{1,2}(?::?[0-9]{2})?)?",
    re.IGNORECASE | re.ASCII,
)
_UUID_TEXT = re.compile(r"(\{)?[0-9a-fA-F]{4}(?:-?[0-9a-fA-F]{4}){7}(?(1)\})")


def _text_timestamp(text: str) -> datetime:
    text, round_up = _round_fraction(text.strip(_SPACE))
    try:
        stamp = datetime.fromisoformat(text)
        return stamp + timedelta(microseconds=1) if round_up else stamp
    except (ValueError, OverflowError) as exc:
        raise ParameterValueError(
            "invalid input syntax for a date or timestamp (ISO 8601 expected)", "22007"
        ) from exc


_LONG_FRACTION = re.compile(r"(\.[0-9]{6})([0-9]+)")


def _round_fraction(text: str) -> tuple[str, bool]:
    """Cut a fraction of a second to microseconds; whether to add one to round it instead."""
    match = _LONG_FRACTION.search(text)
    if match is None:
        return text, False
    return text[: match.end(1)] + text[match.end() :], match[2][0] >= "5"


def _text_date(text: str) -> date:
    return _text_timestamp(text).date()


def _text_naive_timestamp(text: str) -> datetime:
    # timestamp without time zone ignores a zone in its input, as PostgreSQL does.
    return _text_timestamp(text).replace(tzinfo=None)


def _text_aware_timestamp(text: str) -> datetime:
    stamp = _text_timestamp(text)
    return stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=UTC)


def _text_time(text: str) -> time:
    # time without time zone ignores a zone in its input, as PostgreSQL does.
    text, round_up = _round_fraction(text.strip(_SPACE))
    match = _CLOCK_TEXT.fullmatch(text)
    if match is None:
        raise ParameterValueError("invalid input syntax for type time", "22007")
    micro = int((match[4] or "").ljust(6, "0"))
    try:
        clock = time(int(match[1]), int(match[2]), int(match[3] or 0), micro)
    except ValueError as exc:
        raise ParameterValueError("time parameter out of range", "22008") from exc
    if round_up:
        later = datetime.combine(date.min, clock) + timedelta(microseconds=1)
        if later.date() != date.min:  # 24:00:00 exists in PostgreSQL, not in Python
            raise ParameterValueError("time parameter out of range", "22008")
        clock = later.time()
    return clock


def _text_uuid(text: str) -> uuid.UUID:
    if not _UUID_TEXT.fullmatch(text.strip(_SPACE)):
        raise ParameterValueError("invalid input syntax for type uuid")
    return uuid.UUID(text.strip(_SPACE))


_BYTEA_ESCAPE = re.compile(rb"\\(\\|[0-3][0-7]{2})")


def _text_bytea(text: str) -> bytes:
    if text.startswith("\\x"):
        try:
            return bytes.fromhex(text[2:])
        except ValueError as exc:
            raise ParameterValueError("invalid hexadecimal data for type bytea", "22023") from exc
    raw = text.encode("utf-8")
    if b"\\" in _BYTEA_ESCAPE.sub(b"", raw):  # a backslash that starts no valid escape
        raise ParameterValueError("invalid input syntax for type bytea")
    return _BYTEA_ESCAPE.sub(_unescape_byte, raw)


def _unescape_byte(match: re.Match[bytes]) -> bytes:
    code = match[1]
    return b"\\" if code == b"\\" else bytes([int(code, 8)])


_TEXT_PARSERS: dict[int, Callable[[str], object]] = {
    _BOOL: _text_bool,
    _INT2: _text_int(_INT2),
    _INT4: _text_int(_INT4),
    _INT8: _text_int(_INT8),
    _FLOAT4: _text_float(_FLOAT4),
    _FLOAT8: _text_float(_FLOAT8),
    _NUMERIC: _text_numeric,
    _DATE: _text_date,
    _TIME: _text_time,
    _TIMESTAMP: _text_naive_timestamp,
    _TIMESTAMPTZ: _text_aware_timestamp,
    _UUID: _text_uuid,
    _BYTEA: _text_bytea,
}

_PG_EPOCH = datetime(2000, 1, 1)
_BINARY_NUMBERS = {_INT2: "!h", _INT4: "!i", _INT8: "!q", _FLOAT4: "!f", _FLOAT8: "!d"}
_BINARY_TEXT = (_TEXT, _VARCHAR, _NAME, _BPCHAR, _UNKNOWN_LITERAL)


def _decode_binary(data: bytes, oid: int) -> object:
    if oid in _BINARY_NUMBERS:
        fmt = _BINARY_NUMBERS[oid]
        _expect_size(data, struct.calcsize(fmt), oid)
        return struct.unpack(fmt, data)[0]
    if oid == _BOOL:
        _expect_size(data, 1, oid)
        return data != b"\0"
    if oid in _BINARY_TEXT:
        return _param_text(data)
    if oid == _BYTEA:
        return bytes(data)
    if oid == _NUMERIC:
        return _binary_numeric(data)
    if oid == _UUID:
        _expect_size(data, 16, oid)
        return uuid.UUID(bytes=data)
    if oid in (_DATE, _TIME, _TIMESTAMP, _TIMESTAMPTZ):
        return _binary_datetime(data, oid)
    raise ParameterValueError(
        f"binary format is not supported for parameters of type OID {oid}; use text format",
        "0A000",
    )


def _expect_size(data: bytes, size: int, oid: int) -> None:
    if len(data) != size:
        raise ParameterValueError(
            f"incorrect binary data format: type OID {oid} takes {size} bytes, not {len(data)}",
            "22P03",
        )


_NUMERIC_SIGNS = {0x0000: 0, 0x4000: 1}
_NUMERIC_SPECIALS = {0xC000: "NaN", 0xD000: "Infinity", 0xF000: "-Infinity"}


def _binary_numeric(data: bytes) -> Decimal:
    bad = ParameterValueError("incorrect binary data format for type numeric", "22P03")
    if len(data) < 8:
        raise bad
    ndigits, weight, sign, dscale = struct.unpack_from("!hhHh", data)
    if ndigits < 0 or dscale < 0 or len(data) != 8 + 2 * ndigits:
        raise bad
    if sign in _NUMERIC_SPECIALS:
        return Decimal(_NUMERIC_SPECIALS[sign])
    groups = struct.unpack_from(f"!{ndigits}H", data, 8)
    if sign not in _NUMERIC_SIGNS or any(group > 9999 for group in groups):
        raise bad
    digits = "".join(f"{group:04d}" for group in groups) or "0"
    exponent = 4 * (weight + 1 - ndigits)  # digits * 10**exponent is the value
    if exponent > -dscale:
        digits += "0" * (exponent + dscale)
    elif exponent < -dscale:  # digits hidden by dscale are truncated, as numeric_recv does
        digits = digits[: len(digits) - (-dscale - exponent)] or "0"
    return Decimal((_NUMERIC_SIGNS[sign], tuple(int(d) for d in digits), -dscale))


def _binary_datetime(data: bytes, oid: int) -> object:
    _expect_size(data, 4 if oid == _DATE else 8, oid)
    (count,) = struct.unpack("!i" if oid == _DATE else "!q", data)
    out_of_range = ParameterValueError("date or time parameter out of range", "22008")
    if oid == _TIME:
        if not 0 <= count < 86_400_000_000:  # 24:00:00 exists in PostgreSQL, not in Python
            raise out_of_range
        seconds, microsecond = divmod(count, 1_000_000)
        minutes, second = divmod(seconds, 60)
        return time(minutes // 60, minutes % 60, second, microsecond)
    try:
        if oid == _DATE:
            return _PG_EPOCH.date() + timedelta(days=count)
        stamp = _PG_EPOCH + timedelta(microseconds=count)
    except OverflowError as exc:  # beyond Python's years 1 to 9999, or +-infinity
        raise out_of_range from exc
    return stamp.replace(tzinfo=UTC) if oid == _TIMESTAMPTZ else stamp
