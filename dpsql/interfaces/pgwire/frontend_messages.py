"""The frontend messages of the PostgreSQL protocol 3.0: reading frames and parsing bodies.

What a client sends, laid out as the PostgreSQL documentation gives it (chapter
"Frontend/Backend Protocol", section "Message Formats"): the startup packet, or a request that
comes in its place (SSLRequest, GSSENCRequest, CancelRequest), then typed messages whose bodies
the ``parse_*`` functions take apart, every read checked against the bounds of the body.

Framing. A startup packet is ``Int32 length`` (counting itself) and a body; every later
frontend message is ``Byte1 type``, ``Int32 length`` (counting itself, not the type) and a
body.

End of stream. ``read_startup`` lets ``asyncio.IncompleteReadError`` propagate when the peer
closes before sending a single byte (a port probe or health check), and ``read_message``
returns ``(b"", b"")`` when the peer closes between two messages (a client that vanishes
without Terminate). A stream that ends *inside* a frame is malformed: ``ProtocolError``.

Errors::

    ProtocolError            malformed input: answer SQLSTATE 08P01, then close
    └── ParameterValueError  a well-framed Bind parameter that does not decode as its type;
                             carries its own ``sqlstate`` (22P02, 22003, 22P03, 0A000, ...),
                             and the connection may stay open

``ParameterValueError`` is raised while decoding Bind parameters
(``dpsql.interfaces.pgwire.parameters``); it is defined here, with its parent.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Sequence
from dataclasses import dataclass

MAX_MESSAGE = 1 << 20
"""Default cap on the body of one frontend message, in bytes."""

PROTOCOL_VERSION = 3 << 16
"""196608, protocol 3.0: the only version spoken here."""
_CANCEL_CODE = 1234 << 16 | 5678
_SSL_CODE = 1234 << 16 | 5679
_GSSENC_CODE = 1234 << 16 | 5680


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
