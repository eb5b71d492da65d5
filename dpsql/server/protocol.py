"""The PostgreSQL frontend/backend protocol, version 3.0: framing, messages and types.

Pure functions over bytes, plus two coroutines that read one frame from an
``asyncio.StreamReader``. Nothing here knows about sessions or privacy; the server composes
these pieces. Layouts follow the PostgreSQL documentation, chapter "Frontend/Backend
Protocol", sections "Message Flow" and "Message Formats".

Framing. A startup packet is ``Int32 length`` (counting itself) and a body; every later
frontend message is ``Byte1 type``, ``Int32 length`` (counting itself, not the type) and a
body. Every backend encoder here returns one complete message (type, length, body).

End of stream. ``read_startup`` lets ``asyncio.IncompleteReadError`` propagate when the peer
closes before sending a single byte (a port probe or health check), and ``read_message``
returns ``(b"", b"")`` when the peer closes between two messages (a client that vanishes
without Terminate). A stream that ends *inside* a frame is malformed: ``ProtocolError``.

Errors::

    ProtocolError            malformed input: answer SQLSTATE 08P01, then close
    └── ParameterValueError  a well-framed Bind parameter that does not decode as its type;
                             carries its own ``sqlstate`` (22P02, 22003, 22P03, 0A000, ...),
                             and the connection may stay open

Encoders raise ``ValueError`` on arguments no message can carry (a NUL inside a C string, a
count beyond Int16): those are server bugs, not client errors. ``error_response`` and
``notice_response`` never raise on their text, since they are the last word on a failure.

Text output follows PostgreSQL's own output functions (``DateStyle = ISO``,
``IntervalStyle = postgres``): ``float8out`` picks the shortest round-trip digits and prints
fixed notation for decimal exponents in [-4, 15) (float4: [-4, 6)), scientific otherwise;
timestamps drop trailing zeros of the fraction; intervals print only non-zero parts.
"""

from __future__ import annotations

import asyncio
import math
import re
import struct
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from fractions import Fraction

import numpy as np

__all__ = [
    "MAX_MESSAGE",
    "PROTOCOL_VERSION",
    "CancelRequest",
    "GSSENCRequest",
    "ParameterValueError",
    "ProtocolError",
    "SSLRequest",
    "Startup",
    "authentication_ok",
    "authentication_sasl",
    "authentication_sasl_continue",
    "authentication_sasl_final",
    "backend_key_data",
    "bind_complete",
    "close_complete",
    "command_complete",
    "data_row",
    "decode_param",
    "empty_query_response",
    "encode_text",
    "error_response",
    "expand_formats",
    "negotiate_protocol_version",
    "no_data",
    "notice_response",
    "parameter_description",
    "parameter_status",
    "parse_bind",
    "parse_close",
    "parse_complete",
    "parse_describe",
    "parse_execute",
    "parse_parse",
    "parse_password",
    "parse_query",
    "parse_sasl_initial",
    "parse_sasl_response",
    "pg_type",
    "portal_suspended",
    "read_message",
    "read_startup",
    "ready_for_query",
    "row_description",
]

MAX_MESSAGE = 1 << 20
"""Default cap on the body of one frontend message, in bytes."""

PROTOCOL_VERSION = 3 << 16
"""196608, protocol 3.0: the only version spoken here."""
_CANCEL_CODE = 1234 << 16 | 5678
_SSL_CODE = 1234 << 16 | 5679
_GSSENC_CODE = 1234 << 16 | 5680
_INT16_MAX = 0x7FFF


class ProtocolError(Exception):
    """Malformed input from the client. The server answers SQLSTATE 08P01 and closes."""

    sqlstate: str = "08P01"


class ParameterValueError(ProtocolError):
    """A well-framed parameter value that does not decode as its declared type.

    A subclass of ``ProtocolError`` so that a server catching only ``ProtocolError`` fails
    safe (08P01 and close); a server that catches this first may answer ``sqlstate`` as an
    ordinary error and keep the connection.
    """

    def __init__(self, message: str, sqlstate: str = "22P02") -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


@dataclass(frozen=True)
class Startup:
    """StartupMessage: protocol ``version`` (major << 16 | minor) and the parameters."""

    version: int
    params: dict[str, str]


@dataclass(frozen=True)
class SSLRequest:
    """SSLRequest: the client asks for TLS before the startup message."""


@dataclass(frozen=True)
class GSSENCRequest:
    """GSSENCRequest: the client asks for GSSAPI encryption before the startup message."""


@dataclass(frozen=True)
class CancelRequest:
    """CancelRequest, sent on a fresh connection: the target backend's ``pid`` and ``key``."""

    pid: int
    key: int


# ---------------------------------------------------------------------------------------------
# Reading frames


async def _read_exactly(reader: asyncio.StreamReader, count: int, what: str) -> bytes:
    try:
        return await reader.readexactly(count)
    except asyncio.IncompleteReadError as exc:
        raise ProtocolError(f"incomplete {what}: the connection closed inside it") from exc


async def read_startup(
    reader: asyncio.StreamReader, max_size: int = 10_000
) -> Startup | SSLRequest | GSSENCRequest | CancelRequest:
    """Read the first packet of a connection (or the one after a refused SSL/GSS request).

    ``max_size`` caps the whole packet, length word included (PostgreSQL uses 10,000). A
    startup packet for a major version other than 3 comes back as ``Startup(version, {})``
    with its body uninterpreted, so the server can refuse it with SQLSTATE 0A000; a 3.x
    minor version above 0 comes back parsed (answer NegotiateProtocolVersion or refuse).
    Raises ``asyncio.IncompleteReadError`` if the stream ends before the first byte, and
    ``ProtocolError`` if it ends later, the length is out of range, or a request's body is
    malformed.
    """
    try:
        head = await reader.readexactly(4)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            raise
        raise ProtocolError("incomplete startup packet") from exc
    (length,) = struct.unpack("!i", head)
    if length < 8 or length > max_size:
        raise ProtocolError("invalid length of startup packet")
    body = await _read_exactly(reader, length - 4, "startup packet")
    (code,) = struct.unpack_from("!I", body)
    rest = body[4:]
    if code in (_SSL_CODE, _GSSENC_CODE):
        if rest:
            raise ProtocolError("invalid length of encryption request packet")
        return SSLRequest() if code == _SSL_CODE else GSSENCRequest()
    if code == _CANCEL_CODE:
        if len(rest) != 8:
            raise ProtocolError("invalid length of cancel request packet")
        pid, key = struct.unpack("!iI", rest)
        return CancelRequest(pid, key)
    if code >> 16 != 3:  # another layout (2.0) or an unknown request: left uninterpreted
        return Startup(code, {})
    return Startup(code, _startup_params(rest))


def _startup_params(data: bytes) -> dict[str, str]:
    cursor = _Cursor(data, "startup packet")
    params: dict[str, str] = {}
    while name := cursor.cstring():
        if name in params:
            raise ProtocolError(f"startup packet repeats the parameter {name!r}")
        params[name] = cursor.cstring()
    cursor.finish()
    return params


async def read_message(
    reader: asyncio.StreamReader, max_size: int = MAX_MESSAGE
) -> tuple[bytes, bytes]:
    """Read one frontend message after startup: ``(type byte, body)``.

    Returns ``(b"", b"")`` if the stream ends cleanly between messages. Raises
    ``ProtocolError`` if it ends inside a message, or the length word is below 4 or the body
    above ``max_size`` bytes (the body is not read then: close the connection).
    """
    try:
        head = await reader.readexactly(5)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return b"", b""
        raise ProtocolError("incomplete message from client") from exc
    kind = head[:1]
    (length,) = struct.unpack_from("!i", head, 1)
    if length < 4 or length - 4 > max_size:
        raise ProtocolError(f"invalid message length for message type {kind!r}")
    body = await _read_exactly(reader, length - 4, "message from client")
    return kind, body


# ---------------------------------------------------------------------------------------------
# Frontend message bodies


def _utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"{what}: invalid UTF-8") from exc


class _Cursor:
    """Reads one message body front to back; every read checks the bounds."""

    __slots__ = ("_data", "_pos", "_what")

    def __init__(self, data: bytes, what: str) -> None:
        self._data = data
        self._pos = 0
        self._what = what

    def take(self, count: int) -> bytes:
        if count < 0 or self._pos + count > len(self._data):
            raise ProtocolError(f"{self._what}: field runs past the end of the message")
        chunk = self._data[self._pos : self._pos + count]
        self._pos += count
        return chunk

    def cstring(self) -> str:
        end = self._data.find(b"\0", self._pos)
        if end < 0:
            raise ProtocolError(f"{self._what}: string is not NUL-terminated")
        raw = self._data[self._pos : end]
        self._pos = end + 1
        return _utf8(raw, self._what)

    def unpack(self, fmt: str) -> int:
        (value,) = struct.unpack(fmt, self.take(struct.calcsize(fmt)))
        return int(value)

    def kind(self) -> str:
        byte = self.take(1)
        if byte not in (b"S", b"P"):
            raise ProtocolError(f"{self._what}: target must be 'S' or 'P', not {byte!r}")
        return byte.decode("ascii")

    def finish(self) -> None:
        if self._pos != len(self._data):
            extra = len(self._data) - self._pos
            raise ProtocolError(f"{self._what}: {extra} bytes of trailing data")


def parse_query(body: bytes) -> str:
    """Query ('Q'): the SQL text."""
    cursor = _Cursor(body, "Query message")
    text = cursor.cstring()
    cursor.finish()
    return text


def parse_parse(body: bytes) -> tuple[str, str, list[int]]:
    """Parse ('P'): statement name, query text, parameter type OIDs (0 = unspecified)."""
    cursor = _Cursor(body, "Parse message")
    name = cursor.cstring()
    query = cursor.cstring()
    count = cursor.unpack("!H")
    oids = [cursor.unpack("!I") for _ in range(count)]
    cursor.finish()
    return name, query, oids


def parse_bind(
    body: bytes,
) -> tuple[str, str, list[int], list[bytes | None], list[int]]:
    """Bind ('B'): portal, statement, parameter format codes, values, result format codes.

    Format codes are returned as sent (zero, one, or one per item; see ``expand_formats``);
    each is checked to be 0 (text) or 1 (binary), and the parameter format count is checked
    against the parameter count. A value is ``None`` for SQL NULL (length -1).
    """
    cursor = _Cursor(body, "Bind message")
    portal = cursor.cstring()
    statement = cursor.cstring()
    param_formats = _format_codes(cursor)
    count = cursor.unpack("!H")
    if len(param_formats) not in (0, 1, count):
        raise ProtocolError(
            f"Bind message has {len(param_formats)} parameter formats but {count} parameters"
        )
    values: list[bytes | None] = []
    for _ in range(count):
        size = cursor.unpack("!i")
        if size < -1:
            raise ProtocolError(f"Bind message: invalid parameter length {size}")
        values.append(None if size == -1 else cursor.take(size))
    result_formats = _format_codes(cursor)
    cursor.finish()
    return portal, statement, param_formats, values, result_formats


def _format_codes(cursor: _Cursor) -> list[int]:
    codes = [cursor.unpack("!h") for _ in range(cursor.unpack("!H"))]
    for code in codes:
        if code not in (0, 1):
            raise ProtocolError(f"unsupported format code: {code}")
    return codes


def expand_formats(codes: Sequence[int], count: int) -> list[int]:
    """One format code per item: none means all text, one applies to all, else one each."""
    if len(codes) == 0:
        return [0] * count
    if len(codes) == 1:
        return [codes[0]] * count
    if len(codes) != count:
        raise ProtocolError(f"{len(codes)} format codes given for {count} items")
    return list(codes)


def _parse_target(body: bytes, what: str) -> tuple[str, str]:
    """'S' (prepared statement) or 'P' (portal), and the name: Describe's and Close's body."""
    cursor = _Cursor(body, what)
    kind = cursor.kind()
    name = cursor.cstring()
    cursor.finish()
    return kind, name


def parse_describe(body: bytes) -> tuple[str, str]:
    """Describe ('D'): 'S' (prepared statement) or 'P' (portal), and the name."""
    return _parse_target(body, "Describe message")


def parse_execute(body: bytes) -> tuple[str, int]:
    """Execute ('E'): portal and row limit; 0 means all rows (a negative limit reads as 0)."""
    cursor = _Cursor(body, "Execute message")
    portal = cursor.cstring()
    max_rows = cursor.unpack("!i")
    cursor.finish()
    return portal, max(max_rows, 0)


def parse_close(body: bytes) -> tuple[str, str]:
    """Close ('C'): 'S' (prepared statement) or 'P' (portal), and the name."""
    return _parse_target(body, "Close message")


def parse_sasl_initial(body: bytes) -> tuple[str, bytes]:
    """SASLInitialResponse ('p'): mechanism and initial response (b"" if none was sent)."""
    cursor = _Cursor(body, "SASLInitialResponse message")
    mechanism = cursor.cstring()
    size = cursor.unpack("!i")
    if size < -1:
        raise ProtocolError(f"SASLInitialResponse message: invalid length {size}")
    data = b"" if size == -1 else cursor.take(size)
    cursor.finish()
    return mechanism, data


def parse_sasl_response(body: bytes) -> bytes:
    """SASLResponse ('p'): the mechanism's data, the whole body."""
    return bytes(body)


def parse_password(body: bytes) -> str:
    """PasswordMessage ('p'): the password text."""
    cursor = _Cursor(body, "PasswordMessage")
    password = cursor.cstring()
    cursor.finish()
    return password


# ---------------------------------------------------------------------------------------------
# Backend messages


def _message(kind: bytes, body: bytes = b"") -> bytes:
    if len(body) > 0x7FFFFFFF - 4:
        raise ValueError("message body too large for the Int32 length word")
    return kind + struct.pack("!i", len(body) + 4) + body


def _cstring(text: str) -> bytes:
    raw = text.encode("utf-8")
    if b"\0" in raw:
        raise ValueError("a protocol string cannot contain NUL")
    return raw + b"\0"


def _int16_count(items: Sequence[object], what: str) -> bytes:
    if len(items) > _INT16_MAX:
        raise ValueError(f"too many {what} for one message: {len(items)}")
    return struct.pack("!h", len(items))


def authentication_ok() -> bytes:
    """AuthenticationOk: the client is authenticated."""
    return _message(b"R", struct.pack("!i", 0))


def authentication_sasl(mechanisms: Sequence[str]) -> bytes:
    """AuthenticationSASL: the SASL mechanisms offered, in order of preference."""
    names = b"".join(_cstring(name) for name in mechanisms)
    return _message(b"R", struct.pack("!i", 10) + names + b"\0")


def authentication_sasl_continue(data: bytes) -> bytes:
    """AuthenticationSASLContinue: a server challenge (server-first-message for SCRAM)."""
    return _message(b"R", struct.pack("!i", 11) + data)


def authentication_sasl_final(data: bytes) -> bytes:
    """AuthenticationSASLFinal: the outcome data (server-final-message for SCRAM)."""
    return _message(b"R", struct.pack("!i", 12) + data)


def parameter_status(name: str, value: str) -> bytes:
    """ParameterStatus: a run-time parameter the client should know (e.g. server_version)."""
    return _message(b"S", _cstring(name) + _cstring(value))


def backend_key_data(pid: int, key: int) -> bytes:
    """BackendKeyData: the process id (Int32) and the secret cancel key (unsigned 32 bits)."""
    return _message(b"K", struct.pack("!iI", pid, key))


def negotiate_protocol_version(newest_minor: int, unrecognized: Sequence[str]) -> bytes:
    """NegotiateProtocolVersion: the newest 3.x minor served and the options not understood."""
    names = b"".join(_cstring(name) for name in unrecognized)
    return _message(b"v", struct.pack("!ii", newest_minor, len(unrecognized)) + names)


def ready_for_query(status: str = "I") -> bytes:
    """ReadyForQuery: 'I' idle, 'T' in a transaction block, 'E' in a failed one."""
    if status not in ("I", "T", "E"):
        raise ValueError(f"transaction status must be 'I', 'T' or 'E', not {status!r}")
    return _message(b"Z", status.encode("ascii"))


def row_description(columns: Sequence[tuple[str, int, int]]) -> bytes:
    """RowDescription for text-format columns ``(name, type OID, type size)``.

    No source table (table OID 0, attribute 0) and no type modifier (-1).
    """
    fields = [
        _cstring(name) + struct.pack("!IhIhih", 0, 0, oid, size, -1, 0)
        for name, oid, size in columns
    ]
    return _message(b"T", _int16_count(columns, "columns") + b"".join(fields))


def data_row(values: Sequence[bytes | None]) -> bytes:
    """DataRow: one value per column, ``None`` for SQL NULL."""
    parts = [_int16_count(values, "columns")]
    for value in values:
        if value is None:
            parts.append(struct.pack("!i", -1))
        else:
            parts.append(struct.pack("!i", len(value)))
            parts.append(value)
    return _message(b"D", b"".join(parts))


def command_complete(tag: str) -> bytes:
    """CommandComplete with its tag, e.g. ``SELECT 3``."""
    return _message(b"C", _cstring(tag))


_SQLSTATE = re.compile(r"[0-9A-Z]{5}")


def _safe_field(code: bytes, text: str) -> bytes:
    # Error text may quote anything; it must still reach the client, so NUL is replaced
    # rather than refused, and unencodable characters become U+FFFD.
    raw = text.replace("\0", "\ufffd").encode("utf-8", "replace")
    return code + raw + b"\0"


def _fields(
    severity: str, sqlstate: str, message: str, detail: str | None, hint: str | None
) -> bytes:
    if not _SQLSTATE.fullmatch(sqlstate):
        raise ValueError(f"not an SQLSTATE: {sqlstate!r}")
    parts = [
        _safe_field(b"S", severity),
        _safe_field(b"V", severity),
        _safe_field(b"C", sqlstate),
        _safe_field(b"M", message),
    ]
    if detail is not None:
        parts.append(_safe_field(b"D", detail))
    if hint is not None:
        parts.append(_safe_field(b"H", hint))
    return b"".join(parts) + b"\0"


def error_response(
    sqlstate: str,
    message: str,
    severity: str = "ERROR",
    detail: str | None = None,
    hint: str | None = None,
) -> bytes:
    """ErrorResponse with fields S and V (severity), C (SQLSTATE), M, and optionally D and H."""
    return _message(b"E", _fields(severity, sqlstate, message, detail, hint))


def notice_response(message: str, sqlstate: str = "00000") -> bytes:
    """NoticeResponse with severity NOTICE."""
    return _message(b"N", _fields("NOTICE", sqlstate, message, None, None))


def empty_query_response() -> bytes:
    """EmptyQueryResponse: the query string held no statement."""
    return _message(b"I")


def parse_complete() -> bytes:
    """ParseComplete."""
    return _message(b"1")


def bind_complete() -> bytes:
    """BindComplete."""
    return _message(b"2")


def close_complete() -> bytes:
    """CloseComplete."""
    return _message(b"3")


def no_data() -> bytes:
    """NoData: the statement or portal returns no rows."""
    return _message(b"n")


def portal_suspended() -> bytes:
    """PortalSuspended: Execute's row limit was reached before the portal's end."""
    return _message(b"s")


def parameter_description(oids: Sequence[int]) -> bytes:
    """ParameterDescription: one type OID per parameter of a prepared statement."""
    count = _int16_count(oids, "parameters")
    return _message(b"t", count + b"".join(struct.pack("!I", oid) for oid in oids))


# ---------------------------------------------------------------------------------------------
# Types: DuckDB type names to PostgreSQL OIDs, values to text, parameters to values

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
