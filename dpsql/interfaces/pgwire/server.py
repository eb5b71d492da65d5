"""``dpsql serve``: a PostgreSQL-wire (protocol v3) proxy in front of dpsql's Session.

The server process holds the policy, the data and the ledger; analysts reach it only through
the network, authenticated by SCRAM-SHA-256 against the users file the data owner manages
(``dpsql users``), optionally over TLS. Each connection gets its own :class:`Session` under the
authenticated name, so every charge is recorded against that name and that analyst's share.
No privacy logic lives here: every statement goes to the same Session core as the in-process
interfaces.

This module is the listening server, :class:`DpsqlServer`: it holds the users, the TLS context
and the thread that starts and reaps the worker processes, admits connections (below), routes
cancel requests, and shuts down gracefully.

Admission has two pools. A connection not yet authenticated takes a slot of its own pool
(``max_unauthenticated``) for at most ``auth_timeout`` seconds; only an authenticated one takes
a session slot (``max_connections``), so sockets that never log in cannot lock the analysts
out. When the first pool is full, a new connection drops the oldest unauthenticated one of the
address that holds the most: a flood from one address evicts its own sockets, not another
client's login in progress. Failed logins are throttled per address and per user name
(``dpsql.interfaces.pgwire.throttle``).

What one connection does is ``dpsql.interfaces.pgwire.connection``; the settings are
``dpsql.interfaces.pgwire.config``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import ssl
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

from dpsql import errors
from dpsql.interfaces.pgwire import protocol as pg
from dpsql.interfaces.pgwire.config import ServerConfig
from dpsql.interfaces.pgwire.connection import Connection
from dpsql.interfaces.pgwire.logs import limited, quiet_sqlglot
from dpsql.interfaces.pgwire.mock_secret import load_mock_secret
from dpsql.interfaces.pgwire.throttle import AddressBuckets, UserBackoff
from dpsql.interfaces.pgwire.users import load_users
from dpsql.interfaces.pgwire.worker import start_forkserver
from dpsql.session.session import Session

log = logging.getLogger("dpsql.interfaces.pgwire")


class DpsqlServer:
    """The listening server: connections, TLS, users, graceful shutdown."""

    def __init__(self, config: ServerConfig):
        if config.policy.ledger is None:
            raise errors.PolicyError(
                "dpsql serve needs a durable [ledger] in the policy: every connection must "
                "charge the same budget (create it with dpsql init)"
            )
        self.config = config
        self.users = load_users(config.users_file)
        # Persistent, so that an unknown name's mock salt is as stable as a real user's across
        # restarts: a salt that changes at a restart marks the name as unknown.
        self.mock_secret = load_mock_secret(config.users_file)
        quiet_sqlglot()
        # Fail fast, before listening: the data, the ledger and the engine limits must open.
        Session(config.policy, None, config.limits.memory_limit).close()
        self.tls_context = _tls_context(config) if config.tls_cert is not None else None
        start_forkserver()
        # Starting and reaping worker processes block for a moment: one thread does both, so
        # that multiprocessing's bookkeeping is never touched by two threads at once.
        self.spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpsql-workers")
        self.connections: dict[int, Connection] = {}
        self._server: asyncio.Server | None = None
        limits = config.limits
        self.buckets = AddressBuckets(limits.login_burst, limits.login_refill)
        self.backoff = UserBackoff(limits.login_delay_cap)
        # Unauthenticated connections by address, each oldest first, with their tasks.
        self._pending: dict[str, OrderedDict[Connection, asyncio.Task[None] | None]] = {}
        self._pending_count = 0
        self._arrivals = itertools.count()
        self._sessions = 0
        self._closing = asyncio.Event()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        host, port = self.config.host, self.config.port
        try:
            self._server = await asyncio.start_server(
                self._client, host, port, limit=self.config.limits.max_message
            )
        except OSError as exc:  # a port in use, an address not of this machine, a port < 1024
            # asyncio wraps the bind error's text; the errno's own words are the reason.
            text = os.strerror(exc.errno) if exc.errno and exc.errno > 0 else exc.strerror
            reason = (text or type(exc).__name__).lower()
            raise errors.InputError(f"cannot listen on {host}:{port}: {reason}") from None
        log.info("dpsql serve listening on %s:%d", self.config.host, self.port)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closing.is_set():
            await _refuse(reader, writer, "53300", "too many connections")
            return
        connection = Connection(self, reader, writer)
        connection.arrival = next(self._arrivals)
        if self._pending_count >= self.config.limits.max_unauthenticated:
            self._evict()
        self._pending.setdefault(connection.address, OrderedDict())[connection] = (
            asyncio.current_task()
        )
        self._pending_count += 1
        self.connections[connection.pid] = connection
        try:
            await connection.serve()
        finally:
            self._unpend(connection)
            if connection.has_session:
                self._sessions -= 1
            self.connections.pop(connection.pid, None)

    def _unpend(self, connection: Connection) -> asyncio.Task[None] | None:
        queue = self._pending.get(connection.address)
        if queue is None or connection not in queue:
            return None
        task = queue.pop(connection)
        self._pending_count -= 1
        if not queue:
            del self._pending[connection.address]
        return task

    def _evict(self) -> None:
        """Drop the oldest unauthenticated connection of the address that holds the most."""
        queue = max(self._pending.values(), key=lambda q: (len(q), -next(iter(q)).arrival))
        oldest = next(iter(queue))
        task = self._unpend(oldest)
        limited(log, logging.WARNING, "too many unauthenticated connections: dropped one from %s",
                oldest.address)  # fmt: skip
        oldest.writer.transport.abort()
        if task is not None:
            task.cancel()

    def start_session(self, connection: Connection) -> bool:
        """``connection`` has authenticated: move it from its pool to a session slot, or False
        if every session slot is taken."""
        self._unpend(connection)
        if self._sessions >= self.config.limits.max_connections:
            return False
        self._sessions += 1
        connection.has_session = True
        return True

    def cancel(self, pid: int, key: int) -> None:
        """A CancelRequest: interrupt that connection's running statement (its charge stands)."""
        connection = self.connections.get(pid)
        if connection is not None and connection.key == key and connection.worker is not None:
            connection.worker.interrupt()

    async def shutdown(self, grace: float = 30.0) -> None:
        """Stop accepting, let running statements finish (up to ``grace`` seconds), close every
        connection. A charge is committed before its query runs, so none is ever lost."""
        self._closing.set()
        if self._server is not None:
            self._server.close()
        deadline = asyncio.get_running_loop().time() + grace
        while any(c.busy for c in self.connections.values()):
            if asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.05)
        # A statement still running is cut off: closing its connection kills its worker.
        for connection in list(self.connections.values()):
            await connection.fatal("57P01", "terminating connection due to administrator command")
            await connection.close()
        self.spawner.shutdown(wait=True)
        log.info("dpsql serve stopped")

    async def run_until_signal(self) -> None:
        """Serve until SIGTERM or SIGINT, then shut down cleanly."""
        await self.start()
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await self.shutdown()


async def _refuse(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, code: str, message: str
) -> None:
    """Refuse a connection after reading its startup (declining TLS), so that the client reads
    the error as an error and not as a failed TLS handshake."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(5):
            while isinstance(await pg.read_startup(reader), pg.SSLRequest | pg.GSSENCRequest):
                writer.write(b"N")
                await writer.drain()
        writer.write(pg.error_response(code, message, severity="FATAL"))
        await writer.drain()
    with contextlib.suppress(Exception):
        writer.close()


def _tls_context(config: ServerConfig) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(str(config.tls_cert), str(config.tls_key or config.tls_cert))
    except (OSError, ssl.SSLError) as exc:
        raise errors.PolicyError(
            f"cannot load the TLS certificate or key ({type(exc).__name__})"
        ) from None
    return context


def serve(config: ServerConfig) -> None:
    """Run the server in this process until SIGTERM (what ``dpsql serve`` does)."""
    asyncio.run(DpsqlServer(config).run_until_signal())


__all__ = ["DpsqlServer", "serve"]
