"""The settings of ``dpsql serve``: :class:`ServerConfig` and its per-connection :class:`Limits`.

What the server serves (the policy) and to whom (the users file), where it listens, whether it
speaks TLS, and the bounds each connection is held to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dpsql.policy import Policy


@dataclass(frozen=True)
class Limits:
    """Per-connection resource bounds, and the bounds on logins."""

    max_connections: int = 64  # authenticated connections (each a worker process)
    # Connections not yet authenticated: a pool of their own, so that sockets that never log in
    # cannot take the sessions' slots; when it is full, a new connection drops the oldest one
    # of the address that holds the most.
    max_unauthenticated: int = 256
    max_message: int = 1 << 20  # bytes of one protocol message
    # Bytes of one statement text (a Query message's, a Parse's), refused before any parsing.
    max_statement: int = 100_000
    statement_timeout: float = 300.0  # seconds; the charge of a query cut off stands
    interrupt_grace: float = 2.0  # seconds a worker has to stop after an interrupt
    idle_timeout: float = 3600.0  # seconds without a message before the connection closes
    auth_timeout: float = 10.0  # seconds to complete the startup and authentication
    # Failed logins per client address: a token bucket of ``login_burst`` tokens refilled at
    # ``login_refill`` a second; an address without a token is refused before SCRAM (28000).
    login_burst: int = 10
    login_refill: float = 1.0
    # The longest wait before a proof is checked, imposed on every attempt on a user name that
    # recently failed repeatedly (0: no wait). It must stay well under ``auth_timeout``.
    login_delay_cap: float = 2.0
    # seconds for a connection's worker to open its session and engine (a Spark one: a JVM's)
    open_timeout: float = 300.0
    memory_limit: str = "1GB"  # the DuckDB memory cap of each connection's engine
    # -- per-connection statement state (prepared statements, portals, SET values) -------------
    # Each is held in the connection's worker until the client frees it (Close, DEALLOCATE,
    # RESET), so without a cap one client grew a worker without bound (3,000 prepared statements:
    # 155 to 415 MB). Past a cap a message is refused with SQLSTATE 53400, nothing else changes.
    max_prepared: int = 1000  # named prepared statements held at once
    max_portals: int = 100  # named portals held at once
    # bytes of statement text and bound parameter values held by the prepared statements and
    # portals together (each one is also under max_statement and max_message)
    max_state_bytes: int = 32 << 20
    max_settings: int = 64  # distinct names given a value by SET on one connection
    max_setting_value: int = 4096  # characters of one SET value
    # -- answers: capped in size, streamed in bounded frames, dropped when unread -------------
    # Bytes of one answer's DataRow messages, counted while its rows are fetched and encoded;
    # past it the statement is refused with SQLSTATE 54000 (``statements.AnswerTooLarge``).
    max_answer: int = 16 << 20
    # Bytes of one frame from a worker to the event loop, and the high-water mark of each
    # client's transport buffer: the loop holds a few frames of a connection, never an answer.
    frame_bytes: int = 64 << 10
    # Seconds the server waits for a client to read what it was sent; then the connection is
    # dropped, its worker stopped and its buffers freed.
    write_timeout: float = 30.0


@dataclass
class ServerConfig:
    policy: Policy
    users_file: Path
    host: str = "127.0.0.1"
    port: int = 5433
    tls_cert: Path | None = None
    tls_key: Path | None = None
    require_tls: bool = False
    limits: Limits = field(default_factory=Limits)
