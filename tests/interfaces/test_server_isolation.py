"""One connection of ``dpsql serve`` cannot stall the others.

The event loop that every connection shares only frames messages, authenticates and passes
requests to each connection's own worker process. These tests hold it to that: a statement
that takes seconds to plan keeps only its own connection busy; an over-long text is refused
before anything parses it, free of charge; a timeout and a cancel end like any engine failure
after the charge; a worker killed mid-statement takes down only its own connection. Real psql
and psycopg clients, real DuckDB, real worker processes; helpers in tests/server_fixtures.py.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from time import perf_counter
from typing import Any

import psycopg
import pytest
from server_fixtures import (
    Dataset,
    Served,
    alive,
    charges,
    connect,
    error_fields,
    frame,
    psql,
    raw_login,
    read_backend,
    records,
    servers,
    start_psql,
    wait_until,
    write_dataset,
    write_policy,
    write_users,
)

from dpsql import errors
from dpsql.accounting.ledger.ledger import Ledger
from dpsql.interfaces.pgwire.config import Limits
from dpsql.interfaces.pgwire.statements import (
    HEALTH_CHECK,
    PROBE,
    SHOW,
    TRANSACTION,
    engine_failure,
)
from dpsql.session.session import Session

COUNT = "SELECT COUNT(*) FROM visits WHERE age > %s"


# Free and slow in the worker: a catalog query counting a three-way cross join of pg_proc
# (3.7e10 rows), which DuckDB takes seconds over (6 s on a 2-core machine) and charges nothing.
SLOW = "SELECT COUNT(*) FROM pg_catalog.pg_proc a, pg_catalog.pg_proc b, pg_catalog.pg_proc c"
# A statement of the slowest kind to plan that the text limits admit (an IN list of 3,900
# values, just under 4,000 expression nodes: about 0.4 s of pure-Python planning).
SLOWER = "EXPLAIN VERBOSE SELECT COUNT(*) FROM visits WHERE age IN ({})".format(
    ", ".join(str(i) for i in range(3900))
)
# Cheap to plan, long to run: 3,000 rows times 5**10 rows of a public table, ~100 s in DuckDB.
LONG_RUN = "SELECT COUNT(*) FROM visits, " + ", ".join(f"regions AS r{i}" for i in range(10))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    return write_dataset(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def users(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_users(tmp_path_factory.mktemp("users") / "users.json")


@pytest.fixture
def serve(tmp_path: Path, dataset: Dataset, users: Path) -> Iterator[Callable[..., Served]]:
    """A factory of servers with their own ledger and ``Limits``, stopped after the test."""
    with servers(tmp_path, dataset, users) as make:
        yield make


@contextlib.contextmanager
def nothing_charged(ledger: Path) -> Iterator[None]:
    before = records(ledger)
    yield
    assert records(ledger) == before


class Running:
    """A statement run by psycopg in a thread: its outcome, and whether it has come back."""

    def __init__(
        self, port: int, user: str, sql: str, params: Any = None, conn: Any = None
    ) -> None:
        self.conn = conn if conn is not None else connect(port, user)
        self.result: list[tuple[Any, ...]] | None = None
        self.error: psycopg.Error | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(sql, params), daemon=True)
        self.thread.start()

    def _run(self, sql: str, params: Any) -> None:
        try:
            self.result = self.conn.execute(sql, params).fetchall()
        except psycopg.Error as exc:
            self.error = exc
        finally:
            self.done.set()

    def finish(self, timeout: float = 120.0) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the statement never ended"
        self.conn.close()


# -- one slow statement, one connection -----------------------------------------------------


def test_a_slow_statement_keeps_only_its_own_connection_busy(
    serve: Callable[..., Served],
) -> None:
    served = serve()
    assert len(SLOW.encode()) < Limits().max_statement  # within the limits
    a = Running(served.port, "alice", SLOW)
    try:
        wait_until(served.busy, "alice's statement runs")
        # While it runs: a new connection authenticates, bob's query is charged and answered,
        # psql's too, and alice's statement has still not come back.
        with connect(served.port, "bob") as bob:
            (answer,) = bob.execute(COUNT, [30]).fetchall()
        out = psql(served.port, "bob", "SELECT COUNT(*) FROM visits WHERE age > 31;")
        b_first = not a.done.is_set()
        still_busy = served.busy()
    finally:
        a.finish()
    assert b_first and still_busy, "bob's answers waited for alice's statement"
    assert isinstance(answer[0], int)
    assert out.returncode == 0, out.stderr
    int(out.stdout)
    assert a.error is None, a.error
    assert a.result == [(3331**3,)]
    assert [(r.analyst, r.payload["query"][-2:]) for r in charges(served.ledger)] == [
        ("bob", "30"),
        ("bob", "31"),
    ]
    Ledger(served.ledger).verify()


# -- the length limit ---------------------------------------------------------------------------


def test_an_over_long_text_is_refused_before_parsing(serve: Callable[..., Served]) -> None:
    served = serve(max_statement=1000)
    code = "54000"
    with nothing_charged(served.ledger):
        # psql: the text one byte over; the same text one byte shorter gets through.
        query = "SELECT COUNT(*) FROM visits WHERE age > 40" + " " * 958 + ";"
        assert len(query.encode()) == 1001
        refused = psql(served.port, "alice", f"\\set VERBOSITY verbose\n{query}\n")
        assert refused.returncode == 3
        assert re.search(
            rf"^ERROR:  {code}: the statement text is 1001 bytes, more than this server's limit "
            r"of 1000$",
            refused.stderr,
            re.MULTILINE,
        ), refused.stderr
        # psycopg, through Parse: the same error, and the connection goes on.
        with connect(served.port, "alice") as conn:
            with pytest.raises(psycopg.errors.ProgramLimitExceeded) as info:
                conn.execute(query.replace("> 40", "> %s"), [41])
            assert info.value.sqlstate == code
            assert conn.execute("SELECT current_user").fetchone() == ("alice",)
            # Several statements in one message (psycopg's simple protocol): the message's
            # whole text is what the limit measures.
            with pytest.raises(psycopg.errors.ProgramLimitExceeded):
                conn.execute(";".join(["SELECT 1"] * 120))
            assert conn.execute(";".join(["SELECT 1"] * 100)).fetchone() == (1,)
        # Before parsing, and before decoding: a text that is not even UTF-8 (which the worker
        # would refuse as a protocol violation, closing the connection) gets the same ERROR.
        with raw_login(served.port, "alice") as sock:
            sock.sendall(frame(b"Q", b"\xff" * 1001 + b"\0"))
            kinds = [read_backend(sock) for _ in range(2)]
            assert kinds[0][0] == b"E" and kinds[1] == (b"Z", b"I")
            assert error_fields(kinds[0][1])["C"] == code
            body = b"\0" + b"\xff" * 1001 + b"\0" + struct.pack("!H", 0)
            sock.sendall(frame(b"P", body) + frame(b"S", b""))
            kinds = [read_backend(sock) for _ in range(2)]
            assert kinds[0][0] == b"E" and kinds[1] == (b"Z", b"I")
            assert error_fields(kinds[0][1])["C"] == code
    out = psql(served.port, "alice", query[:-2] + ";\n")
    assert out.returncode == 0, out.stderr
    assert len(charges(served.ledger)) == 1


def test_the_default_limit_refuses_a_megabyte_before_parsing(serve: Callable[..., Served]) -> None:
    """The attack this limit answers: a frame of almost 1 MiB of slow-to-plan SQL."""
    served = serve()
    text = ("SELECT COUNT(*) FROM visits WHERE COALESCE(" + "age, " * 200_000)[: (1 << 20) - 8]
    with nothing_charged(served.ledger), connect(served.port, "alice") as conn:
        with pytest.raises(psycopg.errors.ProgramLimitExceeded):
            conn.execute(text)
        assert conn.execute("SELECT current_user").fetchone() == ("alice",)


# -- timeouts, cancels, killed workers ------------------------------------------------------


def assert_engine_failure(error: psycopg.Error | None, severity: str = "ERROR") -> None:
    """The SQLSTATE and message of an engine failure after the charge, whatever the code is."""
    assert error is not None, "the statement was not cut off"
    code, message = engine_failure()
    assert (error.sqlstate, error.diag.message_primary) == (code, message)
    assert error.diag.severity == severity


def test_the_cut_message_is_the_engines(dataset: Dataset, tmp_path: Path) -> None:
    """A cut-off statement borrows the text of the engine's own failure: they must agree."""
    policy, _ = write_policy(tmp_path, dataset)
    session = Session(policy, "alice")
    try:
        timer = threading.Timer(0.2, session.engine.interrupt)
        timer.start()
        with pytest.raises(errors.EngineError) as info:
            session.engine.run("SELECT COUNT(*) FROM range(1000000000000)")
        timer.join()
    finally:
        session.close()
    assert str(info.value) == errors.ENGINE_FAILURE


def test_a_timeout_interrupts_the_engine(serve: Callable[..., Served]) -> None:
    served = serve(statement_timeout=1.0)
    with connect(served.port, "alice") as conn:
        began = perf_counter()
        with pytest.raises(psycopg.Error) as info:
            conn.execute(LONG_RUN)
        assert perf_counter() - began < 30  # interrupted, not run to its end (~100 s)
        assert_engine_failure(info.value)
        assert conn.execute(COUNT, [42]).fetchone() is not None  # the connection goes on
    # The cut query was charged before the engine ran, and its charge stands.
    assert [r.payload["query"] for r in charges(served.ledger)] == [LONG_RUN, COUNT % 42]
    Ledger(served.ledger).verify()


def test_a_cancel_request_interrupts_the_engine(serve: Callable[..., Served]) -> None:
    """psql's Ctrl-C (SIGINT) sends a CancelRequest on a connection of its own."""
    served = serve()
    process = start_psql(served.port, "alice", LONG_RUN, args=("-X", "-v", "VERBOSITY=verbose"))
    try:
        wait_until(lambda: len(charges(served.ledger)) == 1, "the long query is charged")
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    code, message = engine_failure()
    assert f"ERROR:  {code}: {message}\n" in stderr, stderr
    with connect(served.port, "alice") as conn:
        assert conn.execute(COUNT, [43]).fetchone() is not None
    assert [r.payload["query"] for r in charges(served.ledger)] == [LONG_RUN, COUNT % 43]
    Ledger(served.ledger).verify()


def test_a_worker_that_does_not_stop_is_killed_alone(serve: Callable[..., Served]) -> None:
    """A worker that does not answer an interrupt (pure-Python work, which never looks at one;
    here a worker stopped by SIGSTOP, so that the test never races its timing) is killed after
    the grace: its connection ends with the engine failure's error, and no one else notices."""
    served = serve(statement_timeout=1.0, interrupt_grace=0.5)
    server = served.server.server
    assert server is not None
    with connect(served.port, "bob") as bob:
        bob.execute(COUNT, [44]).fetchone()
        before = {c.worker._process.pid for c in server.connections.values() if c.worker}
        alice = connect(served.port, "alice")  # her worker, found before her statement runs
        (worker,) = [c.worker for c in server.connections.values()
                     if c.worker and c.worker._process.pid not in before]  # fmt: skip
        pid = worker._process.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        a = Running(served.port, "alice", SLOWER, conn=alice)
        a.finish(timeout=30)
        assert_engine_failure(a.error, severity="FATAL")
        assert a.conn.closed
        assert worker.killed
        wait_until(lambda: not alive(pid), "the killed worker is gone")
        # bob's connection, opened before, goes on; so do new ones.
        assert bob.execute(COUNT, [45]).fetchone() is not None
    out = psql(served.port, "alice", "SELECT COUNT(*) FROM visits WHERE age > 46;")
    assert out.returncode == 0, out.stderr
    assert [r.payload["query"][-2:] for r in charges(served.ledger)] == ["44", "45", "46"]
    Ledger(served.ledger).verify()


def test_shutdown_cuts_a_statement_that_outlasts_the_drain(
    serve: Callable[..., Served],
) -> None:
    served = serve()
    a = Running(served.port, "alice", LONG_RUN)
    try:
        wait_until(lambda: len(charges(served.ledger)) == 1, "the long query is charged")
        began = perf_counter()
        served.server.stop(grace=0.5)
        assert perf_counter() - began < 15
    finally:
        a.finish(timeout=30)
    assert a.error is not None and a.error.sqlstate == "57P01", a.error
    assert [r.payload["query"] for r in charges(served.ledger)] == [LONG_RUN]
    Ledger(served.ledger).verify()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", served.port), timeout=2).close()


# -- the patterns the server matches statements with ----------------------------------------


@pytest.mark.parametrize(
    ("pattern", "head"),
    [
        (TRANSACTION, "BEGIN"),
        (SHOW, "SHOW x"),
        (HEALTH_CHECK, "SELECT 1"),
        (PROBE, "SELECT current_user"),
    ],
    ids=["transaction", "show", "health-check", "probe"],
)
def test_statement_patterns_fail_in_linear_time(pattern: re.Pattern[str], head: str) -> None:
    """``\\s*;?\\s*$`` tries every split of a run of spaces between its two ``\\s*``: such a
    statement of 20,000 spaces took a second to refuse, holding the interpreter lock. One
    pass must do; a second for 100,000 spaces is a generous bound."""
    began = perf_counter()
    assert pattern.match(head + " " * 100_000 + "(") is None
    assert perf_counter() - began < 1.0
    assert pattern.match(head + " " * 1000 + ";  ") is not None
