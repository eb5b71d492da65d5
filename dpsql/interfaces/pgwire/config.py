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
    """Per-connection resource bounds."""

    max_connections: int = 64
    max_message: int = 1 << 20  # bytes of one protocol message
    # Bytes of one statement text (a Query message's, a Parse's), refused before any parsing.
    max_statement: int = 100_000
    statement_timeout: float = 300.0  # seconds; the charge of a query cut off stands
    interrupt_grace: float = 2.0  # seconds a worker has to stop after an interrupt
    idle_timeout: float = 3600.0  # seconds without a message before the connection closes
    auth_timeout: float = 30.0  # seconds to complete the startup and authentication
    # seconds for a connection's worker to open its session and engine (a Spark one: a JVM's)
    open_timeout: float = 300.0
    memory_limit: str = "1GB"  # the DuckDB memory cap of each connection's engine


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
