"""``dpsql serve``: a PostgreSQL-wire (protocol v3) proxy in front of dpsql's Session.

The server process holds the policy, the data and the ledger; analysts reach it only through
the network, authenticated by SCRAM-SHA-256 against the users file the data owner manages
(``dpsql users``), optionally over TLS. Each connection gets its own :class:`Session` under the
authenticated name, so every charge is recorded against that name and that analyst's share.
No privacy logic lives here: every statement goes to the same Session core as the in-process
interfaces; this module only speaks the protocol, authenticates, maps errors to SQLSTATEs,
answers the few catalog probes clients send, and bounds each connection's resources.

Both the simple query protocol and the extended one (Parse/Bind/Describe/Execute/Sync) are
supported, so drivers that bind parameters server-side (psycopg, JDBC) work unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import signal
import ssl
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from dpsql import errors
from dpsql.policy import Policy
from dpsql.server import protocol as pg
from dpsql.server.auth import AuthenticationFailed, ScramExchange, User, load_users
from dpsql.server.statements import (
    BUDGET_EXHAUSTED,
    CLIENT_SET,
    HEALTH_CHECK,
    OWNER_ONLY,
    PROBE,
    SERVER_VERSION,
    SHOW,
    TRANSACTION,
    Answer,
    InFailedTransaction,
    InsufficientPrivilege,
    numbered_to_qmark,
    public_settings,
    sqlstate,
    text_table,
    to_answer,
)
from dpsql.session import Session
from dpsql.sql.split import split_statements

log = logging.getLogger("dpsql.server")
T = TypeVar("T")


@dataclass(frozen=True)
class Limits:
    """Per-connection resource bounds."""

    max_connections: int = 64
    max_message: int = 1 << 20  # bytes of one protocol message (a query is at most 100,000)
    statement_timeout: float = 300.0  # seconds; the charge of a query cut off stands
    idle_timeout: float = 3600.0  # seconds without a message before the connection closes
    auth_timeout: float = 30.0  # seconds to complete the startup and authentication
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


# -- one connection ------------------------------------------------------------------------------


class Connection:
    """One client: startup, authentication, then statements until Terminate."""

    def __init__(
        self,
        server: DpsqlServer,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ):
        self.server = server
        self.reader = reader
        self.writer = writer
        self.session: Session | None = None
        self.user: User | None = None
        self.database = ""
        self.pid = secrets.randbelow(2**31 - 1) + 1
        self.key = secrets.randbits(31)
        self.status = "I"  # transaction status reported in ReadyForQuery
        self.statements: dict[str, tuple[str, list[int]]] = {}
        self.portals: dict[str, tuple[str, list[object]]] = {}
        self.results: dict[str, Answer] = {}
        self.sent: dict[str, int] = {}  # portal -> rows already sent
        self.busy = False
        self.cancelled = False  # a CancelRequest interrupted the running statement

    # -- plumbing ------------------------------------------------------------------------------
    async def send(self, *messages: bytes) -> None:
        for message in messages:
            self.writer.write(message)
        await self.writer.drain()

    async def call(self, fn: Callable[[], T], timeout: float | None = None) -> T:
        """Run blocking Session work in the server's thread pool, with a time limit."""
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self.server.executor, fn)
        self.busy = True
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            if self.session is not None:
                self.session.engine.interrupt()
            with contextlib.suppress(Exception):
                await future  # the engine stops at its next check; wait for the thread
            raise
        finally:
            self.busy = False

    # -- startup -------------------------------------------------------------------------------
    async def startup(self) -> bool:  # noqa: PLR0915 - the startup sequence, in order
        """TLS negotiation, the startup message and SCRAM; False when the connection ends."""
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
                return False
            break
        if message.version != 196608:  # protocol 3.0
            await self.fatal("0A000", "only protocol version 3.0 is supported")
            return False
        if self.server.config.require_tls and not tls:
            await self.fatal("28000", "this server requires TLS (sslmode=require)")
            return False
        username = message.params.get("user", "")
        self.database = message.params.get("database", username)
        await self.send(pg.authentication_sasl(["SCRAM-SHA-256"]))
        exchange = ScramExchange(self.server.users, username)
        try:
            kind, body = await pg.read_message(self.reader, self.server.config.limits.max_message)
            if kind == b"":
                return False  # the client hung up to ask for a password (psql does): no attempt
            if kind != b"p":
                raise AuthenticationFailed("expected a SASL response")
            mechanism, first = pg.parse_sasl_initial(body)
            if mechanism != "SCRAM-SHA-256":
                raise AuthenticationFailed("unsupported SASL mechanism")
            await self.send(pg.authentication_sasl_continue(exchange.client_first(first)))
            kind, body = await pg.read_message(self.reader, self.server.config.limits.max_message)
            if kind != b"p":
                raise AuthenticationFailed("expected a SASL response")
            final = exchange.client_final(pg.parse_sasl_response(body))
        except (AuthenticationFailed, pg.ProtocolError):
            log.warning("authentication failed for user %r", username[:63])
            await self.fatal("28P01", f'password authentication failed for user "{username[:63]}"')
            return False
        user = exchange.user
        assert user is not None
        self.user = user
        await self.send(pg.authentication_sasl_final(final), pg.authentication_ok())
        # One Session per connection, under the authenticated name: charges and shares are
        # that analyst's (the ledger records the name).
        policy, memory = self.server.config.policy, self.server.config.limits.memory_limit
        try:
            self.session = await self.call(lambda: Session(policy, user.name, memory))
        except errors.DpsqlError as exc:
            log.error("cannot open a session for %s: %s", user.name, type(exc).__name__)
            await self.fatal(sqlstate(exc), str(exc))
            return False
        log.info("user %s (%s) connected, pid %d", user.name, user.role, self.pid)
        settings = public_settings(user, self.database)
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
        return True

    async def fatal(self, code: str, message: str) -> None:
        with contextlib.suppress(ConnectionError):
            await self.send(pg.error_response(code, message, severity="FATAL"))

    # -- statements ----------------------------------------------------------------------------
    def run(self, sql: str, params: Sequence[object] | None) -> Answer:
        """One statement (blocking; in the thread pool). Raises DpsqlError."""
        assert self.session is not None and self.user is not None
        text = sql.strip().rstrip(";").strip()
        if not text:
            return Answer(None, [], "")
        match = TRANSACTION.match(text)
        if match:
            word = match.group(1).upper().split()[0]
            # Every statement is read-only and answered at once: transactions are no-ops, but
            # their state is reported so that drivers that open them stay in step.
            if word in ("BEGIN", "START"):
                self.status = "T"
                return Answer(None, [], "BEGIN")
            self.status = "I"
            return Answer(None, [], "ROLLBACK" if word in ("ROLLBACK", "ABORT") else "COMMIT")
        client_set = CLIENT_SET.match(text)
        if client_set:
            if client_set.group(3).lower() in ("role", "session_authorization", "authorization"):
                raise InsufficientPrivilege(
                    "the role is the authenticated user's; it cannot change"
                )
            # A client setting (extra_float_digits, application_name, ...): accepted, ignored.
            return Answer(None, [], client_set.group(1).upper())
        if HEALTH_CHECK.match(text):
            return text_table("?column?", [text.split()[1]])  # SELECT 1: no data involved
        settings = public_settings(self.user, self.database)
        show = SHOW.match(text)
        if show:
            name = show.group(1).lower()
            if name in OWNER_ONLY:
                return self._owner_only(name)
            if name in settings:
                return text_table(name, [settings[name]])
            if not name.startswith("dpsql."):
                raise errors.UnsupportedQueryError(f"unrecognized configuration parameter {name}")
        probe = PROBE.match(text)
        if probe:
            return self._probe(probe.group(1).lower(), settings)
        return to_answer(self.session.execute(text, params or None))

    def _owner_only(self, name: str) -> Answer:
        assert self.session is not None and self.user is not None
        if self.user.role != "owner":
            raise InsufficientPrivilege(f"SHOW {name} is reserved to the data owner")
        if name == "dpsql.ledger":
            store = self.session.filter.store
            verified = store.verify() if hasattr(store, "verify") else len(store.records())
            return text_table(name, [f"ledger verified: {verified} record(s)"])
        from dpsql.interfaces.report import build_report, render_markdown  # noqa: PLC0415

        report = build_report(self.session.policy, self.session.filter)
        return text_table(name, render_markdown(report).splitlines())

    @staticmethod
    def _probe(name: str, settings: Mapping[str, str]) -> Answer:
        values = {
            "version()": f"PostgreSQL {SERVER_VERSION}",
            "current_database()": settings["database"],
            "current_schema()": "main",
            "current_user": settings["session_authorization"],
            "session_user": settings["session_authorization"],
        }
        if name.startswith("current_setting("):
            key = name[len("current_setting('") : -2]
            if key not in settings:
                raise errors.UnsupportedQueryError(f"unrecognized configuration parameter {key}")
            return text_table("current_setting", [settings[key]])
        return text_table(name.rstrip("()"), [values[name]])

    async def statement(self, sql: str, params: Sequence[object] | None) -> Answer:
        if self.status == "E" and not TRANSACTION.match(sql):
            raise InFailedTransaction(
                "current transaction is aborted, commands ignored until end of transaction block"
            )
        self.cancelled = False
        return await self.call(
            lambda: self.run(sql, params), self.server.config.limits.statement_timeout
        )

    async def error(self, exc: BaseException) -> None:
        if isinstance(exc, InsufficientPrivilege):
            code, message = "42501", str(exc)
        elif isinstance(exc, InFailedTransaction):
            code, message = "25P02", str(exc)
        elif isinstance(exc, errors.EngineError) and self.cancelled:
            code, message = "57014", "canceling statement due to user request; its charge stands"
        elif isinstance(exc, errors.DpsqlError):
            code, message = sqlstate(exc), str(exc)
        elif isinstance(exc, TimeoutError):
            code = "57014"
            message = "canceling statement due to statement timeout; a charge already made stands"
        elif isinstance(exc, pg.ProtocolError):
            # A bad parameter value (22P02, ...) is an ordinary error; other violations 08P01.
            code, message = exc.sqlstate, f"{exc}"
        else:
            # Never a raw message: it could quote a data value.
            log.error("unexpected %s in a statement", type(exc).__name__)
            code, message = "XX000", "internal error; see the server log"
        if self.status == "T":
            self.status = "E"
        log.info("statement failed with %s (%s)", code, type(exc).__name__)
        await self.send(pg.error_response(code, message))

    async def simple(self, body: bytes) -> None:
        query = pg.parse_query(body)
        try:
            pieces = [p.text for p in split_statements(query)] if query.strip() else []
        except errors.DpsqlError as exc:
            await self.error(exc)
            await self.send(pg.ready_for_query(self.status))
            return
        if not pieces:
            await self.send(pg.empty_query_response())
        for piece in pieces:
            try:
                answer = await self.statement(piece, None)
            except (errors.DpsqlError, TimeoutError) as exc:
                await self.error(exc)
                break
            await self.send_answer(answer, describe=True)
        await self.send(pg.ready_for_query(self.status))

    async def send_answer(self, answer: Answer, describe: bool, limit: int = 0,
                          portal: str | None = None) -> None:  # fmt: skip
        messages: list[bytes] = []
        start = self.sent.get(portal, 0) if portal is not None else 0
        if answer.notice and start == 0:  # once per answer, not once per page of a portal
            messages.append(pg.notice_response(answer.notice))
        if describe and answer.columns is not None:
            messages.append(pg.row_description(answer.columns))
        rows = answer.rows[start:]
        if limit and len(rows) > limit:
            messages.extend(pg.data_row(r) for r in rows[:limit])
            if portal is not None:
                self.sent[portal] = start + limit
            messages.append(pg.portal_suspended())
        else:
            messages.extend(pg.data_row(r) for r in rows)
            messages.append(pg.command_complete(answer.tag) if answer.tag else
                            pg.empty_query_response())  # fmt: skip
        await self.send(*messages)

    # -- extended protocol ---------------------------------------------------------------------
    async def extended(self, kind: bytes, body: bytes) -> None:
        if kind == b"P":
            name, query, oids = pg.parse_parse(body)
            self.statements[name] = (query, oids)
            await self.send(pg.parse_complete())
        elif kind == b"B":
            portal, name, formats, values, _result_formats = pg.parse_bind(body)
            if name not in self.statements:
                raise errors.ParameterError(f"prepared statement {name!r} does not exist")
            query, oids = self.statements[name]
            params = [
                pg.decode_param(
                    v,
                    formats[i] if len(formats) > 1 else (formats[0] if formats else 0),
                    oids[i] if i < len(oids) else 0,
                )
                for i, v in enumerate(values)
            ]
            self.portals[portal] = (query, params)
            self.results.pop(portal, None)
            self.sent.pop(portal, None)
            await self.send(pg.bind_complete())
        elif kind == b"D":
            which, name = pg.parse_describe(body)
            if which == "S":
                await self.describe_statement(name)
            else:
                answer = await self.portal_answer(name)
                await self.send(
                    pg.row_description(answer.columns) if answer.columns is not None
                    else pg.no_data()
                )  # fmt: skip
        elif kind == b"E":
            portal, limit = pg.parse_execute(body)
            answer = await self.portal_answer(portal)
            await self.send_answer(answer, describe=False, limit=limit, portal=portal)
        elif kind == b"C":
            which, name = pg.parse_close(body)
            if which == "S":
                self.statements.pop(name, None)
            else:
                self.portals.pop(name, None)
                self.results.pop(name, None)
            await self.send(pg.close_complete())
        elif kind == b"H":
            await self.writer.drain()
        else:
            raise pg.ProtocolError(f"unexpected message type {kind!r}")

    async def describe_statement(self, name: str) -> None:
        if name not in self.statements:
            raise errors.ParameterError(f"prepared statement {name!r} does not exist")
        query, oids = self.statements[name]
        _, order = numbered_to_qmark(query)
        count = max([len(oids), *(i + 1 for i in order)]) if (oids or order) else 0
        types = [oids[i] if i < len(oids) and oids[i] else 25 for i in range(count)]
        # The result's columns are known only once the statement runs (its plan depends on the
        # parameters): describe it as returning rows of unknown shape later, at Describe portal.
        await self.send(pg.parameter_description(types), pg.no_data())

    async def portal_answer(self, portal: str) -> Answer:
        """The portal's answer, computed (and charged) once, at its first Describe or Execute."""
        if portal in self.results:
            return self.results[portal]
        if portal not in self.portals:
            raise errors.ParameterError(f"portal {portal!r} does not exist")
        query, params = self.portals[portal]
        text, order = numbered_to_qmark(query)
        if any(i >= len(params) or i < 0 for i in order):
            raise errors.ParameterError("a $n parameter has no bound value")
        answer = await self.statement(text, [params[i] for i in order])
        self.results[portal] = answer
        return answer

    # -- main loop -----------------------------------------------------------------------------
    async def serve(self) -> None:
        limits = self.server.config.limits
        try:
            if not await asyncio.wait_for(self.startup(), limits.auth_timeout):
                return
            failed = False  # in the extended protocol, skip to Sync after an error
            while True:
                kind, body = await asyncio.wait_for(
                    pg.read_message(self.reader, limits.max_message), limits.idle_timeout
                )
                if kind in (b"X", b""):
                    return
                if kind == b"Q":
                    failed = False
                    await self.simple(body)
                elif kind == b"S":
                    failed = False
                    await self.send(pg.ready_for_query(self.status))
                elif failed:
                    continue
                else:
                    try:
                        await self.extended(kind, body)
                    except (errors.DpsqlError, TimeoutError, pg.ParameterValueError) as exc:
                        await self.error(exc)
                        failed = True
        except pg.ProtocolError as exc:
            await self.fatal("08P01", f"protocol violation: {exc}")
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            await self.close()

    async def close(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            await asyncio.get_running_loop().run_in_executor(self.server.executor, session.close)
            log.info("pid %d closed", self.pid)
        with contextlib.suppress(Exception):
            self.writer.close()
            await self.writer.wait_closed()


# -- the server ------------------------------------------------------------------------------------


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
        # Fail fast, before listening: the data, the ledger and the engine limits must open.
        Session(config.policy, None, config.limits.memory_limit).close()
        self.tls_context = _tls_context(config) if config.tls_cert is not None else None
        self.executor = ThreadPoolExecutor(max_workers=config.limits.max_connections + 4)
        self.connections: dict[int, Connection] = {}
        self._server: asyncio.Server | None = None
        self._slots = asyncio.Semaphore(config.limits.max_connections)
        self._closing = asyncio.Event()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._client, self.config.host, self.config.port, limit=self.config.limits.max_message
        )
        log.info("dpsql serve listening on %s:%d", self.config.host, self.port)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closing.is_set() or self._slots.locked():
            await _refuse(reader, writer, "53300", "too many connections")
            return
        async with self._slots:
            connection = Connection(self, reader, writer)
            self.connections[connection.pid] = connection
            try:
                await connection.serve()
            finally:
                self.connections.pop(connection.pid, None)

    def cancel(self, pid: int, key: int) -> None:
        """A CancelRequest: interrupt that connection's running statement (its charge stands)."""
        connection = self.connections.get(pid)
        if connection is not None and connection.key == key and connection.session is not None:
            connection.cancelled = True
            connection.session.engine.interrupt()

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
        for connection in list(self.connections.values()):
            await connection.fatal("57P01", "terminating connection due to administrator command")
            await connection.close()
        self.executor.shutdown(wait=True, cancel_futures=True)
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


__all__ = ["BUDGET_EXHAUSTED", "DpsqlServer", "Limits", "ServerConfig", "serve", "sqlstate"]
