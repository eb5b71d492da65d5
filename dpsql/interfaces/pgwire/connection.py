"""One client of ``dpsql serve``: startup, TLS, SCRAM, then its messages until Terminate.

A connection runs on the event loop that every connection shares, so it does only what costs
the same whatever a client sends: it frames messages (each at most ``max_message`` bytes), runs
TLS and SCRAM, refuses a statement text over ``max_statement`` bytes before anything reads it,
and passes every other message, raw, to the connection's worker process
(``dpsql.interfaces.pgwire.worker``), where the statements are split, parsed, planned, charged and
run (``dpsql.interfaces.pgwire.backend``). A statement that takes a minute to parse then delays only
its own connection. Statement timeouts and cancel requests interrupt the worker; one that does not
stop is killed.

Both the simple query protocol and the extended one (Parse/Bind/Describe/Execute/Sync) are
supported, so drivers that bind parameters server-side (psycopg, JDBC) work unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import ssl
from collections.abc import Mapping
from concurrent.futures import Executor
from typing import Protocol

from dpsql.errors import DpsqlError
from dpsql.interfaces.pgwire import protocol as pg
from dpsql.interfaces.pgwire.auth import AuthenticationFailed, ScramExchange
from dpsql.interfaces.pgwire.backend import Step
from dpsql.interfaces.pgwire.config import ServerConfig
from dpsql.interfaces.pgwire.logs import limited
from dpsql.interfaces.pgwire.statements import (
    PROGRAM_LIMIT_EXCEEDED,
    engine_failure,
    public_settings,
)
from dpsql.interfaces.pgwire.throttle import AddressBuckets, UserBackoff, address_key
from dpsql.interfaces.pgwire.users import User, check_name
from dpsql.interfaces.pgwire.worker import Worker, WorkerFailed, WorkerLost
from dpsql.interfaces.pgwire.worker_process import WorkerSetup, startup_settings

log = logging.getLogger("dpsql.interfaces.pgwire")
# The messages a worker answers; Sync, Flush and Terminate are the loop's own.
_FORWARDED = frozenset((b"Q", b"P", b"B", b"D", b"E", b"C"))


class Host(Protocol):
    """What a connection uses of the server that accepted it (``DpsqlServer``)."""

    @property
    def config(self) -> ServerConfig: ...

    @property
    def users(self) -> Mapping[str, User]: ...

    @property
    def tls_context(self) -> ssl.SSLContext | None: ...

    @property
    def spawner(self) -> Executor: ...

    @property
    def mock_secret(self) -> bytes: ...

    @property
    def buckets(self) -> AddressBuckets: ...

    @property
    def backoff(self) -> UserBackoff: ...

    def cancel(self, pid: int, key: int) -> None: ...

    def start_session(self, connection: Connection) -> bool: ...


class Connection:
    """One client: startup, authentication, then messages until Terminate."""

    def __init__(
        self,
        server: Host,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ):
        self.server = server
        self.reader = reader
        self.writer = writer
        self.worker: Worker | None = None
        self.user: User | None = None
        self.database = ""
        self.options = ""  # the startup packet's options (``-c dpsql.name=value``)
        self.pid = secrets.randbelow(2**31 - 1) + 1
        self.key = secrets.randbits(31)
        self.status = "I"  # transaction status reported in ReadyForQuery
        self.closing = False
        self.address = address_key(writer.get_extra_info("peername"))
        self.arrival = 0  # the server's count of connections when this one came
        self.has_session = False  # holds one of the server's session slots

    @property
    def busy(self) -> bool:
        return self.worker is not None and self.worker.busy

    async def send(self, *messages: bytes) -> None:
        """Write and wait until the transport's buffer is below its high-water mark; a client
        that reads nothing for ``write_timeout`` seconds is dropped (``_Unread``)."""
        for message in messages:
            self.writer.write(message)
        try:
            # A deadline, not a task: ``drain`` below the high-water mark returns at once.
            async with asyncio.timeout(self.server.config.limits.write_timeout):
                await self.writer.drain()
        except TimeoutError:
            raise _Unread from None

    # -- startup -------------------------------------------------------------------------------
    async def startup(self) -> User | None:
        """TLS negotiation, the startup message and SCRAM: the authenticated user, or None when
        the connection ends."""
        tls = False
        while True:
            message = await pg.read_startup(self.reader)
            if isinstance(message, pg.SSLRequest):
                context = self.server.tls_context
                if context is None:
                    await self.send(b"N")
                    continue
                await self.send(b"S")
                await self.writer.start_tls(context)
                tls = True
                continue
            if isinstance(message, pg.GSSENCRequest):
                await self.send(b"N")
                continue
            if isinstance(message, pg.CancelRequest):
                self.server.cancel(message.pid, message.key)
                return None
            break
        if message.version != 196608:  # protocol 3.0
            await self.fatal("0A000", "only protocol version 3.0 is supported")
            return None
        if self.server.config.require_tls and not tls:
            await self.fatal("28000", "this server requires TLS (sslmode=require)")
            return None
        username = message.params.get("user", "")
        self.database = message.params.get("database", username)
        self.options = message.params.get("options", "")
        buckets = self.server.buckets
        if not buckets.take(self.address):
            # Refused before SCRAM runs: no proof of this address is checked until it has a
            # token again, so guesses from one address are at most login_refill a second.
            limited(log, logging.WARNING, "logins from %s refused: too many failures", self.address)
            wait = math.ceil(buckets.wait(self.address))
            await self.fatal(
                "28000", f"too many failed logins from this address; retry in {wait} s"
            )
            return None
        failed = False
        try:
            return await self.authenticate(username)
        except (AuthenticationFailed, pg.ProtocolError):
            failed = True
            self.server.backoff.failed(username[:64])
            limited(log, logging.WARNING, "authentication failed for user %s from %s",
                    _loggable(username), self.address)  # fmt: skip
            await self.fatal("28P01", f'password authentication failed for user "{username[:63]}"')
            return None
        finally:
            if not failed:
                buckets.give_back(self.address)  # a success, or no attempt: the token returns

    async def authenticate(self, username: str) -> User | None:
        """SCRAM-SHA-256: the user, None when the client hangs up before trying (psql does, to
        ask for a password); AuthenticationFailed or ProtocolError when the attempt fails."""
        max_message = self.server.config.limits.max_message
        await self.send(pg.authentication_sasl(["SCRAM-SHA-256"]))
        exchange = ScramExchange(self.server.users, username, mock_secret=self.server.mock_secret)
        kind, body = await pg.read_message(self.reader, max_message)
        if kind == b"":
            return None
        if kind != b"p":
            raise AuthenticationFailed("expected a SASL response")
        mechanism, first = pg.parse_sasl_initial(body)
        if mechanism != "SCRAM-SHA-256":
            raise AuthenticationFailed("unsupported SASL mechanism")
        await self.send(pg.authentication_sasl_continue(exchange.client_first(first)))
        kind, body = await pg.read_message(self.reader, max_message)
        if kind != b"p":
            raise AuthenticationFailed("expected a SASL response")
        # Before the verdict, for a right password too: a wait on failures alone would tell a
        # guesser "wrong" as soon as the answer is late. Known and unknown names wait alike.
        delay = self.server.backoff.delay(username[:64])
        if delay > 0:
            await asyncio.sleep(delay)
        final = exchange.client_final(pg.parse_sasl_response(body))
        user = exchange.user
        assert user is not None
        self.user = user
        await self.send(pg.authentication_sasl_final(final), pg.authentication_ok())
        return user

    async def greet(self, user: User) -> None:
        """The parameters a client expects after authentication, and the first ReadyForQuery."""
        log.info("user %s (%s) connected, pid %d", user.name, user.role, self.pid)
        settings = public_settings(user.name, self.database)
        statuses = [
            pg.parameter_status(name, settings[key])
            for name, key in (
                ("server_version", "server_version"), ("server_encoding", "server_encoding"),
                ("client_encoding", "client_encoding"), ("DateStyle", "datestyle"),
                ("TimeZone", "timezone"), ("integer_datetimes", "integer_datetimes"),
                ("standard_conforming_strings", "standard_conforming_strings"),
                ("is_superuser", "is_superuser"),
                ("session_authorization", "session_authorization"),
                ("application_name", "application_name"),
            )
        ]  # fmt: skip
        await self.send(*statuses, pg.backend_key_data(self.pid, self.key), pg.ready_for_query())

    async def open_worker(self, user: User) -> bool:
        config = self.server.config
        try:
            settings = startup_settings(self.options)
        except DpsqlError as exc:
            await self.fatal("22023", str(exc))
            return False
        setup = WorkerSetup(
            policy=config.policy,
            user=user.name,
            role=user.role,
            database=self.database,
            memory_limit=config.limits.memory_limit,
            settings=settings,
            limits=config.limits,
            log_level=logging.getLogger("dpsql").getEffectiveLevel(),
        )
        spawner, limits = self.server.spawner, config.limits
        try:
            self.worker = await Worker.spawn(
                setup, limits.interrupt_grace, spawner, limits.frame_bytes
            )
        except (OSError, RuntimeError) as exc:  # out of processes or descriptors; shutting down
            log.error("cannot start a worker for pid %d: %s", self.pid, type(exc).__name__)
            await self.fatal("XX000", "internal error; see the server log")
            return False
        try:
            # Its own limit, apart from authentication's: a Spark worker opens a JVM session,
            # which takes seconds, more on a busy machine.
            await asyncio.wait_for(self.worker.ready(), config.limits.open_timeout)
        except TimeoutError:
            log.error("the worker of pid %d did not open its session in time", self.pid)
            await self.fatal(
                "57P03",
                f"the connection's session did not open within {config.limits.open_timeout:g} s",
            )
            return False
        except WorkerFailed as exc:
            await self.fatal(exc.code, str(exc))
            return False
        except WorkerLost:
            log.error("the worker of pid %d ended before its session opened", self.pid)
            await self.fatal("XX000", "internal error; see the server log")
            return False
        return True

    async def fatal(self, code: str, message: str) -> None:
        with contextlib.suppress(ConnectionError):
            await self.send(pg.error_response(code, message, severity="FATAL"))

    # -- statements ----------------------------------------------------------------------------
    def over_limit(self, kind: bytes, body: bytes) -> int | None:
        """The length of the statement text of a Query or Parse body if it is over the limit,
        found with two byte searches and no decoding: nothing else is read before it."""
        if kind == b"Q":
            size = len(body) - 1  # the text and its NUL
        elif kind == b"P":
            name_end = body.find(b"\0")
            text_end = body.find(b"\0", name_end + 1)
            size = (text_end if text_end >= 0 else len(body)) - name_end - 1
        else:
            return None
        return size if size > self.server.config.limits.max_statement else None

    async def refuse(self, size: int) -> None:
        """An over-long statement text: an ordinary error, free of charge and of parsing."""
        limit = self.server.config.limits.max_statement
        if self.status == "T":
            self.status = "E"
        # A flood of over-long texts wrote one line each (53,592 for three floods): rate-limited.
        limited(log, logging.INFO, "statement failed with %s (over the length limit)",
                PROGRAM_LIMIT_EXCEEDED)  # fmt: skip
        await self.send(
            pg.error_response(
                PROGRAM_LIMIT_EXCEEDED,
                f"the statement text is {size} bytes, more than this server's limit of {limit}",
            )
        )

    async def forward(self, kind: bytes, body: bytes) -> bool:
        """Pass one message to the worker and its answers to the client; whether it failed."""
        assert self.worker is not None
        failed = False

        async def emit(step: Step) -> None:
            nonlocal failed
            failed = failed or step.failed
            await self.send(step.wire)
            if step.fatal:
                raise _Fatal

        timeout = self.server.config.limits.statement_timeout
        self.status = await self.worker.request(kind, body, self.status, timeout, emit)
        return failed

    # -- main loop -----------------------------------------------------------------------------
    async def serve(self) -> None:
        limits = self.server.config.limits
        try:
            user = await asyncio.wait_for(self.startup(), limits.auth_timeout)
            if user is None:
                return
            if not self.server.start_session(self):
                # After authentication, as PostgreSQL does: only analysts hold session slots.
                await self.fatal("53300", "too many connections")
                return
            # One worker process and Session per connection, under the authenticated name:
            # charges and shares are that analyst's (the ledger records the name).
            if not await self.open_worker(user):
                return
            # Past the mark, ``send`` waits for the client: the loop holds a frame or two of
            # each connection's answer, not the whole of it (the transport after TLS, if any).
            self.writer.transport.set_write_buffer_limits(high=limits.frame_bytes)
            await self.greet(user)
            failed = False  # in the extended protocol, skip to Sync after an error
            while True:
                kind, body = await asyncio.wait_for(
                    pg.read_message(self.reader, limits.max_message), limits.idle_timeout
                )
                if kind in (b"X", b""):
                    return
                if kind == b"Q":
                    failed = False
                    size = self.over_limit(kind, body)
                    if size is not None:
                        await self.refuse(size)
                    else:
                        await self.forward(kind, body)
                    await self.send(pg.ready_for_query(self.status))
                elif kind == b"S":
                    failed = False
                    await self.send(pg.ready_for_query(self.status))
                elif failed:
                    pass
                elif kind == b"H":
                    await self.writer.drain()
                elif kind not in _FORWARDED:
                    raise pg.ProtocolError(f"unexpected message type {kind!r}")
                elif (size := self.over_limit(kind, body)) is not None:
                    await self.refuse(size)
                    failed = True
                else:
                    failed = await self.forward(kind, body)
                # A client whose messages are already buffered would otherwise be served
                # without a pause until its buffer runs dry: let the other connections in.
                await asyncio.sleep(0)
        except pg.ProtocolError as exc:
            await self.fatal("08P01", f"protocol violation: {exc}")
        except WorkerLost:
            # Killed after an interrupt, or ended on its own: the client sees what an engine
            # failure after the charge shows (a charge already committed stands).
            if not self.closing:
                log.warning("the worker of pid %d was lost mid-statement", self.pid)
                await self.fatal(*engine_failure())
        except _Unread:
            self.drop()
        except (_Fatal, TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            await self.close()

    def drop(self) -> None:
        """A client that left the server's writes unread for ``write_timeout``: its worker is
        stopped and its buffers freed now, not when it reads (one line, no statement text)."""
        timeout = self.server.config.limits.write_timeout
        limited(log, logging.WARNING, "pid %d dropped: its client read nothing for %g s",
                self.pid, timeout)  # fmt: skip
        if self.worker is not None:
            self.worker.kill()
        self.writer.transport.abort()

    async def close(self) -> None:
        self.closing = True
        worker, self.worker = self.worker, None
        if worker is not None:
            await worker.close(self.server.spawner)
            log.info("pid %d closed", self.pid)
        try:
            self.writer.close()
            # A client that does not read would keep a closing transport open for ever.
            async with asyncio.timeout(self.server.config.limits.write_timeout):
                await self.writer.wait_closed()
        except Exception:
            self.writer.transport.abort()


class _Unread(ConnectionError):  # noqa: N818 - an event of the client, like _Fatal
    """The client read nothing of what was sent for ``write_timeout`` seconds."""


def _loggable(name: str) -> str:
    """A user name as the log shows it: quoted if it is a valid name (letters, digits, _ . -),
    else only its length, so that a name sent cannot forge a line or smuggle a password."""
    try:
        return repr(check_name(name))
    except DpsqlError:
        return f"(not a valid name, {len(name)} characters)"


class _Fatal(Exception):  # noqa: N818 - a control-flow signal
    """The worker answered FATAL (a protocol violation): the connection ends."""
