"""What one ``dpsql serve`` connection does with its statements, inside its worker process.

The event loop that every connection shares only frames messages, authenticates and refuses
texts over the length limit; each message that carries SQL or points at it (Query, Parse,
Bind, Describe, Execute, Close) comes here as its raw body, in the connection's own process,
and what goes back is a :class:`Step`: the encoded backend messages for the client. Decoding
the body, splitting statements, parsing, planning, charging, running, decoding parameters and
rewriting ``$n`` markers all happen here, because each costs time that grows with the text
(sqlglot is pure Python): on the loop, one analyst's long statement stopped every connection.

Besides the Session's statements, a few are answered here with fixed, public values (see
``dpsql.interfaces.pgwire.statements``): transaction control, client settings, catalog probes, and
the owner's ``SHOW dpsql.report`` and ``SHOW dpsql.ledger``. A statement cut off by an interrupt
(the statement timeout, a cancel request) fails with the error of any engine failure after the
charge, whatever it was doing then.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from dpsql import errors
from dpsql.interfaces.pgwire import protocol as pg
from dpsql.interfaces.pgwire.answers import catalog_answer
from dpsql.interfaces.pgwire.catalog import Catalog
from dpsql.interfaces.pgwire.catalog_rewrite import catalog_sql
from dpsql.interfaces.pgwire.config import Limits
from dpsql.interfaces.pgwire.logs import limited
from dpsql.interfaces.pgwire.state_caps import StateCaps
from dpsql.interfaces.pgwire.statements import (
    CLIENT_SET,
    DEALLOCATE,
    HEALTH_CHECK,
    ISOLATION,
    OWNER_ONLY,
    PROBE,
    SAVEPOINT,
    SERVER_VERSION,
    SHOW,
    TRANSACTION,
    Answer,
    AnswerRows,
    ConnectionLimitExceeded,
    InFailedTransaction,
    InsufficientPrivilege,
    engine_failure,
    numbered_to_qmark,
    public_settings,
    qmark_to_numbered,
    sqlstate,
    text_table,
    to_answer,
)
from dpsql.session.session import Session
from dpsql.sql.split import split_statements

log = logging.getLogger("dpsql.interfaces.pgwire")


@dataclass(frozen=True)
class Step:
    """The outcome of one statement, or of one extended-protocol message."""

    wire: bytes  # backend messages for the client, encoded
    failed: bool = False  # it ended with an ErrorResponse (the last message of ``wire``)
    fatal: bool = False  # a protocol violation: the connection ends after ``wire``


class _Cut(Exception):  # noqa: N818 - control flow inside the worker, never a user error
    """A statement of an interrupted request: it does not start, or its answer is dropped."""


@dataclass
class Backend:
    """One connection's statement state: its Session, prepared statements and portals."""

    session: Session
    user: str
    role: str
    database: str
    interrupted: Callable[[], bool]  # whether the running request was interrupted
    status: str = "I"  # the transaction status reported in ReadyForQuery
    statements: dict[str, tuple[str, list[int]]] = field(default_factory=dict)
    portals: dict[str, tuple[str, list[object]]] = field(default_factory=dict)
    results: dict[str, Answer] = field(default_factory=dict)
    sent: dict[str, int] = field(default_factory=dict)  # portal -> rows already sent
    catalog: Catalog | None = None  # the synthetic catalog, made at the first catalog query
    catalog_of: object = None  # the engine it was made from (a new one: blocks registered)
    limits: Limits = field(default_factory=Limits)  # state caps, answer cap, frame size
    caps: StateCaps = field(init=False)  # what the connection holds, under its caps

    def __post_init__(self) -> None:
        self.caps = StateCaps(self.limits)

    def interrupt_catalog(self) -> None:
        """Stop a running catalog query (the statement timeout, a cancel request)."""
        if self.catalog is not None:
            self.catalog.interrupt()

    def close(self) -> None:
        if self.catalog is not None:
            self.catalog.close()

    def handle(self, kind: bytes, body: bytes, status: str) -> Iterator[Step]:
        """The steps of one frontend message; ``status`` is the connection's transaction
        status before it, ``self.status`` the one after."""
        self.status = status
        try:
            if kind == b"Q":
                yield from self._simple(body)
            else:
                yield from self._extended(kind, body)
        except pg.ProtocolError as exc:  # malformed input: FATAL 08P01, then the loop closes
            message = pg.error_response("08P01", f"protocol violation: {exc}", severity="FATAL")
            yield Step(message, failed=True, fatal=True)

    # -- the simple query protocol ---------------------------------------------------------
    def _simple(self, body: bytes) -> Iterator[Step]:
        query = pg.parse_query(body)
        try:
            pieces = [p.text for p in split_statements(query)] if query.strip() else []
        except errors.DpsqlError as exc:
            yield self._failure(exc)
            return
        if not pieces:
            yield Step(pg.empty_query_response())
        for piece in pieces:
            try:
                answer = self._statement(piece, None, stream=True)
            except Exception as exc:  # every failure is answered; the first stops the rest
                yield self._failure(exc)
                return
            if not (yield from self._answer_steps(answer, describe=True)):
                return

    def _failure(self, exc: BaseException) -> Step:
        if self.interrupted():
            code, message = engine_failure()
        elif isinstance(exc, InsufficientPrivilege):
            code, message = "42501", str(exc)
        elif isinstance(exc, InFailedTransaction):
            code, message = "25P02", str(exc)
        elif isinstance(exc, ConnectionLimitExceeded):
            code, message = "53400", str(exc)
        elif isinstance(exc, errors.DpsqlError):
            code, message = sqlstate(exc), str(exc)
        elif isinstance(exc, pg.ParameterValueError):
            code, message = exc.sqlstate, str(exc)  # a bad parameter value: 22P02, 22003, ...
        else:
            # Never a raw message: it could quote a data value.
            log.error("unexpected %s in a statement", type(exc).__name__)
            code, message = "XX000", "internal error; see the server log"
        if self.status == "T":
            self.status = "E"
        # One line per failure would let a client fill the log: a flood is rate-limited.
        limited(log, logging.INFO, "statement failed with %s (%s)", code, type(exc).__name__)
        return Step(pg.error_response(code, message), failed=True)

    def _answer_steps(
        self, answer: Answer, describe: bool, limit: int = 0, portal: str | None = None
    ) -> Generator[Step, None, bool]:
        """The answer's messages in steps of at most ``frame_bytes``, and whether it was sent
        whole. The loop takes the next step only once the client has read the last, so a
        streamed answer's rows are fetched only as fast as the client reads them (a whole
        answer in one step held every byte of it in the process every connection shares). A
        streamed answer that fails midway (over the cap, interrupted) ends with its error
        after the rows sent, as PostgreSQL's do."""
        head: list[bytes] = []
        start = self.sent.get(portal, 0) if portal is not None else 0
        if answer.notice and start == 0:  # once per answer, not once per page of a portal
            head.append(pg.notice_response(answer.notice))
        if describe and answer.columns is not None:
            head.append(pg.row_description(answer.columns))
        failure: list[Step] = []

        def parts() -> Iterator[bytes]:
            yield from head
            if not isinstance(answer.rows, list):  # streamed: the simple protocol only
                count = 0
                try:
                    for row in answer.rows:
                        count += 1
                        yield row
                except Exception as exc:
                    failure.append(self._failure(exc))
                    return
                yield pg.command_complete(f"{answer.tag} {count}")
                return
            end = len(answer.rows)
            if limit and end - start > limit:
                end = start + limit
                if portal is not None:
                    self.sent[portal] = end
                tail = pg.portal_suspended()
            else:
                tail = pg.command_complete(answer.tag) if answer.tag else pg.empty_query_response()
            yield from itertools.islice(answer.rows, start, end)
            yield tail

        for chunk in pg.frames(parts(), self.limits.frame_bytes):
            yield Step(chunk)
        if failure:
            yield failure[0]
        return not failure

    # -- one statement ----------------------------------------------------------------------
    def _statement(self, sql: str, params: Sequence[object] | None, stream: bool = False) -> Answer:
        if self.interrupted():
            raise _Cut("the request was interrupted")
        if self.status == "E" and not (TRANSACTION.match(sql) or SAVEPOINT.match(sql)):
            raise InFailedTransaction(
                "current transaction is aborted, commands ignored until end of transaction block"
            )
        answer = self._run(sql, params, stream)
        # Cut off means cut off, even if the engine finished before the interrupt reached it:
        # the client sees the same error whichever came first. A charge made stands, and a
        # released answer is in the cache, free to ask for again.
        if self.interrupted():
            raise _Cut("the request was interrupted")
        return answer

    def _run(self, sql: str, params: Sequence[object] | None, stream: bool = False) -> Answer:
        text = sql.strip().rstrip(";").strip()
        if not text:
            return Answer(None, [], "")
        savepoint = SAVEPOINT.match(text)
        if savepoint:
            word = savepoint.group(1).upper().split()[0]
            if word == "ROLLBACK":
                self.status = "T"  # back to the savepoint: the block is usable again
            return Answer(None, [], "ROLLBACK" if word == "ROLLBACK" else word)
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
        deallocate = DEALLOCATE.match(text)
        if deallocate:
            return self._deallocate(deallocate.group(1))
        self.caps.count_setting(text)
        client_set = CLIENT_SET.match(text)
        if client_set:
            if client_set.group(3).lower() in ("role", "session_authorization", "authorization"):
                raise InsufficientPrivilege(
                    "the role is the authenticated user's; it cannot change"
                )
            # A client setting (extra_float_digits, application_name, ...): accepted, ignored.
            return Answer(None, [], client_set.group(1).upper())
        cap = self.limits.max_answer
        if HEALTH_CHECK.match(text):  # SELECT 1: no data involved; an integer, as PostgreSQL's
            one = pg.data_row([text.split()[1].rstrip(";").encode()])
            return Answer((("?column?", 23, 4),), [one], "SELECT 1")
        settings = public_settings(self.user, self.database)
        if ISOLATION.match(text):  # SQLAlchemy asks on connect
            return text_table("transaction_isolation", [settings["transaction_isolation"]], cap)
        show = SHOW.match(text)
        if show:
            name = show.group(1).lower()
            if name == "all":  # the public constants only: never a path of the server machine
                rows = AnswerRows(cap)
                for key, value in settings.items():
                    if key != "database":
                        rows.add([key.encode(), value.encode(), b""])
                columns = (("name", 25, -1), ("setting", 25, -1), ("description", 25, -1))
                return Answer(columns, rows.rows, f"SHOW {len(settings) - 1}")
            if name in OWNER_ONLY:
                return self._owner_only(name)
            if name in settings:
                return text_table(name, [settings[name]], cap)
            if not name.startswith("dpsql."):
                raise errors.UnsupportedQueryError(f"unrecognized configuration parameter {name}")
        probe = PROBE.match(text)
        if probe:
            return _probe(probe.group(1).lower(), settings, cap)
        duck = catalog_sql(qmark_to_numbered(text) if params else text, settings)
        if duck is not None:  # reads catalog relations only: the empty schema answers it
            sql, used = duck
            values = list(params or ())
            if any(i >= len(values) for i in used):
                raise errors.ParameterError("a $n parameter has no bound value")
            return self._catalog_answer(sql, [values[i] for i in used], stream)
        return to_answer(self.session.execute(text, params or None), cap)

    def _catalog_answer(
        self, sql: str, params: Sequence[object] | None, stream: bool = False
    ) -> Answer:
        """A catalog query's answer: ``stream``, rows fetched as the client reads them (a
        simple query); otherwise whole, for a portal's Executes to page through."""
        # Blocks registered since: the tables and columns of the engine that binds them.
        self.session.refresh_blocks()
        if self.catalog is not None and self.catalog_of is not self.session.engine:
            self.catalog = None  # a portal still paging through its answer keeps it open
        if self.catalog is None:
            policy, engine = self.session.policy, self.session.engine
            self.catalog_of = engine
            # The policy's tables, with the types the engine read from the files' schemas (or
            # the policy's declared CSV types): never a value of a row.
            self.catalog = Catalog(
                {t: engine.catalog[t] for t in policy.tables if t in engine.catalog}
            )
        cap = self.limits.max_answer
        return catalog_answer(self.catalog, sql, params, cap, stream=stream)

    def _owner_only(self, name: str) -> Answer:
        cap = self.limits.max_answer
        if self.role != "owner":
            raise InsufficientPrivilege(f"SHOW {name} is reserved to the data owner")
        if name == "dpsql.ledger":
            store = self.session.filter.store
            verified = store.verify() if hasattr(store, "verify") else len(store.records())
            return text_table(name, [f"ledger verified: {verified} record(s)"], cap)
        from dpsql.interfaces.report.markdown import render_markdown  # noqa: PLC0415
        from dpsql.interfaces.report.report import build_report  # noqa: PLC0415

        report = build_report(self.session.policy, self.session.filter)
        return text_table(name, render_markdown(report).splitlines(), cap)

    # -- the extended protocol --------------------------------------------------------------
    def _extended(self, kind: bytes, body: bytes) -> Iterator[Step]:
        try:
            steps: Iterator[Step]
            if kind == b"E":
                portal, limit = pg.parse_execute(body)
                answer = self._portal_answer(portal)
                steps = self._answer_steps(answer, describe=False, limit=limit, portal=portal)
            else:
                steps = iter((Step(self._extended_wire(kind, body)),))
        except pg.ParameterValueError as exc:
            yield self._failure(exc)
            return
        except pg.ProtocolError:
            raise
        except Exception as exc:  # answered; the loop skips to the next Sync
            yield self._failure(exc)
            return
        yield from steps

    def _extended_wire(self, kind: bytes, body: bytes) -> bytes:
        if kind == b"P":
            name, query, oids = pg.parse_parse(body)
            self.caps.hold("S", name, len(body))
            self.statements[name] = (query, oids)
            return pg.parse_complete()
        if kind == b"B":
            return self._bind(body)
        if kind == b"D":
            which, name = pg.parse_describe(body)
            if which == "S":
                return self._describe_statement(name)
            answer = self._portal_answer(name)
            return pg.row_description(answer.columns) if answer.columns is not None else (
                pg.no_data()
            )  # fmt: skip
        if kind == b"C":
            which, name = pg.parse_close(body)
            if which == "S":
                self.statements.pop(name, None)
            else:
                self.portals.pop(name, None)
                self.results.pop(name, None)
            self.caps.free(which, name)
            return pg.close_complete()
        raise pg.ProtocolError(f"unexpected message type {kind!r}")

    def _bind(self, body: bytes) -> bytes:
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
        self.caps.hold("P", portal, len(body))
        self.portals[portal] = (query, params)
        self.results.pop(portal, None)
        self.sent.pop(portal, None)
        return pg.bind_complete()

    def _deallocate(self, name: str) -> Answer:
        if name.upper() == "ALL":
            self.statements.clear()
            self.caps.free("S")
            return Answer(None, [], "DEALLOCATE ALL")
        if name.startswith('"'):
            name = name[1:-1].replace('""', '"')
        if name not in self.statements:
            raise errors.ParameterError(f"prepared statement {name!r} does not exist")
        del self.statements[name]
        self.caps.free("S", name)
        return Answer(None, [], "DEALLOCATE")

    def _describe_statement(self, name: str) -> bytes:
        if name not in self.statements:
            raise errors.ParameterError(f"prepared statement {name!r} does not exist")
        query, oids = self.statements[name]
        _, order = numbered_to_qmark(query)
        count = max([len(oids), *(i + 1 for i in order)]) if (oids or order) else 0
        types = [oids[i] if i < len(oids) and oids[i] else 25 for i in range(count)]
        # The result's columns are known only once the statement runs (its plan depends on the
        # parameters): describe it as returning rows of unknown shape later, at Describe portal.
        return pg.parameter_description(types) + pg.no_data()

    def _portal_answer(self, portal: str) -> Answer:
        """The portal's answer, computed (and charged) once, at its first Describe or Execute."""
        if portal in self.results:
            return self.results[portal]
        if portal not in self.portals:
            raise errors.ParameterError(f"portal {portal!r} does not exist")
        query, params = self.portals[portal]
        text, order = numbered_to_qmark(query)
        if any(i >= len(params) or i < 0 for i in order):
            raise errors.ParameterError("a $n parameter has no bound value")
        answer = self._statement(text, [params[i] for i in order])
        self.results[portal] = answer
        return answer


def _probe(name: str, settings: Mapping[str, str], cap: int) -> Answer:
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
        return text_table("current_setting", [settings[key]], cap)
    return text_table(name.rstrip("()"), [values[name]], cap)
