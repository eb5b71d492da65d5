"""The backend messages of the PostgreSQL protocol 3.0: one encoder per message the server sends.

Every encoder returns one complete message, ``Byte1 type``, ``Int32 length`` (counting itself,
not the type) and the body, laid out as the PostgreSQL documentation gives it (chapter
"Frontend/Backend Protocol", section "Message Formats").

Encoders raise ``ValueError`` on arguments no message can carry (a NUL inside a C string, a
count beyond Int16): those are server bugs, not client errors. ``error_response`` and
``notice_response`` never raise on their text, since they are the last word on a failure.
``frames`` cuts encoded messages into the bounded pieces a worker sends to the event loop.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable, Iterator, Sequence

_INT16_MAX = 0x7FFF


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


def frames(parts: Iterable[bytes], size: int) -> Iterator[bytes]:
    """``parts`` joined and cut into pieces of at most ``size`` bytes (the last may be
    shorter), without joining them whole: one DataRow may be larger than a frame.

    >>> [len(f) for f in frames([b"a" * 5, b"b" * 12, b"c"], 8)]
    [8, 8, 2]
    """
    pending = bytearray()
    for part in parts:
        view = memoryview(part)
        if pending:
            room = size - len(pending)
            pending += view[:room]
            view = view[room:]
            if len(pending) < size:
                continue
            yield bytes(pending)
            pending = bytearray()
        while len(view) >= size:
            yield bytes(view[:size])
            view = view[size:]
        pending += view
    if pending:
        yield bytes(pending)
