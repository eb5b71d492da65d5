"""The PostgreSQL frontend/backend protocol, version 3.0: framing, messages and types.

Pure functions over bytes, plus two coroutines that read one frame from an
``asyncio.StreamReader``. Nothing here knows about sessions or privacy; the server composes
these pieces. Layouts follow the PostgreSQL documentation, chapter "Frontend/Backend
Protocol", sections "Message Flow" and "Message Formats".

This module is the protocol's one public face (the server reads it as
``from dpsql.interfaces.pgwire import protocol as pg``); the code lives in four modules, one concept
each:

- ``dpsql.interfaces.pgwire.frontend_messages``: reading frames and parsing what the client sends,
and the
  errors of malformed input, ``ProtocolError`` and its subclass ``ParameterValueError``;
- ``dpsql.interfaces.pgwire.backend_messages``: encoding what the server sends;
- ``dpsql.interfaces.pgwire.pgtypes``: type OIDs, DuckDB type names to them, values to PostgreSQL's
text;
- ``dpsql.interfaces.pgwire.parameters``: Bind parameters to Python values.
"""

from __future__ import annotations

from dpsql.interfaces.pgwire.backend_messages import (
    authentication_ok,
    authentication_sasl,
    authentication_sasl_continue,
    authentication_sasl_final,
    backend_key_data,
    bind_complete,
    close_complete,
    command_complete,
    data_row,
    empty_query_response,
    error_response,
    frames,
    negotiate_protocol_version,
    no_data,
    notice_response,
    parameter_description,
    parameter_status,
    parse_complete,
    portal_suspended,
    ready_for_query,
    row_description,
)
from dpsql.interfaces.pgwire.frontend_messages import (
    MAX_MESSAGE,
    PROTOCOL_VERSION,
    CancelRequest,
    GSSENCRequest,
    ParameterValueError,
    ProtocolError,
    SSLRequest,
    Startup,
    expand_formats,
    parse_bind,
    parse_close,
    parse_describe,
    parse_execute,
    parse_parse,
    parse_password,
    parse_query,
    parse_sasl_initial,
    parse_sasl_response,
    read_message,
    read_startup,
)
from dpsql.interfaces.pgwire.parameters import decode_param
from dpsql.interfaces.pgwire.pgtypes import encode_text, pg_type

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
    "frames",
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
