"""Answers of ``dpsql serve`` are capped in size, streamed in bounded frames, and dropped when
their client does not read.

Each test runs a real server (a background thread, port 0, real worker processes) over the
test data set, with real clients (psycopg, psql, a raw socket). The large answers are catalog
queries that call no function (a cross join of catalog relations): free, and answered whatever
list of catalog functions the server admits. Helpers live in tests/server_fixtures.py.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
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
    wait_until,
    write_dataset,
    write_users,
)

from dpsql.interfaces.pgwire import answers
from dpsql.interfaces.pgwire.catalog import Catalog
from dpsql.interfaces.pgwire.statements import AnswerRows, AnswerTooLarge, engine_failure

# About 450 bytes a row, and no catalog function called (only catalog relations are read).
WIDE = "SELECT a.*, b.* FROM pg_catalog.pg_proc a, pg_catalog.pg_proc b LIMIT {}"
SMALL = "SELECT relname FROM pg_catalog.pg_class ORDER BY relname"
COUNT = "SELECT COUNT(*) FROM visits WHERE age > %s"
GROUPS = "SELECT region, COUNT(*) FROM visits GROUP BY region"
PICKLE_OVERHEAD = 200  # bytes of a frame's tuple around its wire bytes


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


# -- the cap ---------------------------------------------------------------------------------


def test_an_answer_over_the_cap_is_refused_and_the_connection_stays(
    serve: Callable[..., Served],
) -> None:
    served = serve(max_answer=64 << 10)
    before = records(served.ledger)
    with connect(served.port, "alice") as conn:
        with pytest.raises(psycopg.Error) as info:
            conn.execute(WIDE.format(1000)).fetchall()
        assert info.value.sqlstate == "54000"
        message = info.value.diag.message_primary or ""
        assert "limit of 65536 bytes" in message and "nothing was charged" in message
        # The same connection goes on: a catalog answer under the cap, then a DP query.
        assert len(conn.execute(SMALL).fetchall()) > 0
        assert conn.execute(COUNT, [40]).fetchone() is not None
    assert [r.payload["query"] for r in charges(served.ledger)] == [COUNT % 40]
    assert records(served.ledger)[: len(before)] == before
    # psql sends the simple protocol: the same refusal, and the next statement is answered.
    out = psql(served.port, "bob", f"{WIDE.format(1000)};\n", args=("-X", "-A", "-t"))
    assert "ERROR:  the answer is over this server's limit of 65536 bytes" in out.stderr
    out = psql(served.port, "bob", f"{WIDE.format(1000)};\n{SMALL};\n", args=("-X", "-A", "-t"))
    assert out.stdout.split() == sorted(out.stdout.split()) != []


def test_a_streamed_answer_over_the_cap_ends_with_the_error(serve: Callable[..., Served]) -> None:
    """A simple query's catalog answer is sent as it is fetched: past the cap, the rows sent are
    followed by the error (as PostgreSQL's errors after rows are), the statements after it do
    not run, and the connection answers the next query."""
    served = serve(max_answer=64 << 10, frame_bytes=4096)
    sock = raw_login(served.port, "alice")
    try:
        sock.sendall(frame(b"Q", f"{WIDE.format(1000)}; {SMALL}".encode() + b"\0"))
        seen: list[tuple[bytes, bytes]] = []
        while not seen or seen[-1][0] != b"Z":
            seen.append(read_backend(sock))
        kinds = [kind for kind, _ in seen]
        assert kinds[0] == b"T" and kinds[-2:] == [b"E", b"Z"] and b"C" not in kinds
        assert 0 < kinds.count(b"D") < 1000
        fields = error_fields(seen[-2][1])
        assert fields["C"] == "54000" and "nothing was charged" in fields["M"]
        sock.sendall(frame(b"Q", SMALL.encode() + b"\0"))
        kinds = []
        while not kinds or kinds[-1] != b"Z":
            kinds.append(read_backend(sock)[0])
        assert kinds[0] == b"T" and kinds[-2:] == [b"C", b"Z"] and b"E" not in kinds
    finally:
        sock.close()


def test_a_cancel_cuts_a_streamed_answer(serve: Callable[..., Served]) -> None:
    """A cancel request reaches the catalog's fetch of the next batch: the stream ends with
    the error of a statement cut off, after the rows sent, and the connection goes on."""
    served = serve(frame_bytes=4096, max_answer=64 << 20)
    sock = raw_login(served.port, "alice")
    try:
        assert served.server.server is not None
        ((pid, connection),) = served.server.server.connections.items()
        sock.sendall(frame(b"Q", WIDE.format(20_000).encode() + b"\0"))
        assert read_backend(sock)[0] == b"T"
        assert read_backend(sock)[0] == b"D"
        with socket.create_connection(("127.0.0.1", served.port), timeout=10) as cancel:
            cancel.sendall(struct.pack("!iiii", 16, 80877102, pid, connection.key))
        seen: list[tuple[bytes, bytes]] = []
        while not seen or seen[-1][0] != b"Z":
            seen.append(read_backend(sock))
        kinds = [kind for kind, _ in seen]
        assert kinds[-2:] == [b"E", b"Z"] and b"C" not in kinds
        assert kinds.count(b"D") < 20_000 - 1
        fields = error_fields(seen[-2][1])
        assert (fields["S"], fields["C"], fields["M"]) == ("ERROR", *engine_failure())
        sock.sendall(frame(b"Q", SMALL.encode() + b"\0"))
        kinds = []
        while not kinds or kinds[-1] != b"Z":
            kinds.append(read_backend(sock)[0])
        assert kinds[-2:] == [b"C", b"Z"]
    finally:
        sock.close()


def test_a_charged_answer_over_the_cap_states_that_its_charge_stands(
    serve: Callable[..., Served],
) -> None:
    """Refused after the charge (its rows are known only once released): the charge stands,
    and the error says so with its cost; served again from the cache, it is free."""
    served = serve(max_answer=64)  # five released groups are more than 64 bytes of rows
    with connect(served.port, "alice") as conn:
        with pytest.raises(psycopg.Error) as info:
            conn.execute(GROUPS).fetchall()
        assert info.value.sqlstate == "54000"
        message = info.value.diag.message_primary or ""
        assert "the charge stands (epsilon 0.01, delta 0)" in message, message
        assert [r.payload["query"] for r in charges(served.ledger)] == [GROUPS]
        with pytest.raises(psycopg.Error) as again:
            conn.execute(GROUPS).fetchall()
        assert "nothing was charged" in (again.value.diag.message_primary or "")
        assert len(charges(served.ledger)) == 1
        assert conn.execute(COUNT, [41]).fetchone() is not None  # one row fits


def test_the_cap_stops_a_catalog_answer_while_it_is_fetched() -> None:
    """Counted per batch of rows as they are fetched: a refused answer is never whole in the
    worker (one analyst's free answer held 100 MB)."""
    catalog = Catalog({"visits": {"user_id": "BIGINT", "region": "VARCHAR"}})
    rows = AnswerRows(16 << 10)
    batches: list[int] = []

    def take(columns: Any, batch: Any) -> None:
        batches.append(len(batch))
        for row in batch:
            rows.add([str(v).encode() for v in row])

    try:
        with pytest.raises(AnswerTooLarge, match="nothing was charged"):
            catalog.stream(WIDE.format(50_000), None, take)
    finally:
        catalog.close()
    assert batches == [1024]  # of the 49 batches of the whole answer, the first only
    assert rows.size > rows.cap and sum(map(len, rows.rows)) <= rows.cap


@pytest.mark.parametrize("stream", [True, False])
def test_catalog_answers_are_fetched_and_encoded_at_low_priority(
    monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    """Every catalog batch is fetched and encoded on a worker thread of lowered priority: ten
    clients asking for the largest free answer must yield the CPU to other connections'
    statements. The first batches at nice +10; once the answer is past ``BULK_BYTES``, the
    rest in the idle class, on a second thread (an unprivileged thread cannot raise its own
    priority back)."""
    base = os.getpriority(os.PRIO_PROCESS, 0)
    seen: list[tuple[int, int, int]] = []
    encode = answers._values

    def spy(row: Any, oids: Any) -> Any:
        policy = os.sched_getscheduler(0)
        seen.append((threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0), policy))
        return encode(row, oids)

    monkeypatch.setattr(answers, "_values", spy)
    monkeypatch.setattr(answers, "BULK_BYTES", 100_000)  # a batch of 1,024 rows is ~400 KB
    catalog = Catalog({"visits": {"user_id": "BIGINT", "region": "VARCHAR"}})
    try:
        answer = answers.catalog_answer(catalog, WIDE.format(3000), None, 64 << 20, stream=stream)
        assert len(list(answer.rows)) == 3000
    finally:
        catalog.close()
    assert len(seen) == 3000
    assert threading.get_native_id() not in {tid for tid, _, _ in seen}
    first, rest = seen[:1024], seen[1024:]
    assert {(nice, policy) for _, nice, policy in first} == {
        (min(19, base + answers.NICE), os.SCHED_OTHER)
    }
    assert {(nice, policy) for _, nice, policy in rest} == {(19, os.SCHED_IDLE)}
    assert {tid for tid, _, _ in first}.isdisjoint({tid for tid, _, _ in rest})


# -- frames ----------------------------------------------------------------------------------


def test_frames_are_bounded_and_answers_whole(serve: Callable[..., Served]) -> None:
    small = serve(frame_bytes=4096)
    default = serve()
    with connect(small.port, "alice") as a, connect(default.port, "alice") as b:
        framed = a.execute(WIDE.format(2000)).fetchall()
        assert framed == b.execute(WIDE.format(2000)).fetchall()
        assert len(framed) == 2000
        worker = small.connection(a.info.backend_pid).worker
        assert worker is not None
        assert 4096 < worker.largest_frame <= 4096 + PICKLE_OVERHEAD
        assert a.execute(COUNT, [42]).fetchone() is not None  # a DP answer, through frames
        worker = default.connection(b.info.backend_pid).worker
        assert worker is not None
        assert worker.largest_frame <= (64 << 10) + PICKLE_OVERHEAD


def test_a_portal_pages_through_frames(serve: Callable[..., Served]) -> None:
    """Execute with a row limit: PortalSuspended after each page, whatever the frames."""
    served = serve(frame_bytes=512)
    sock = raw_login(served.port, "alice")
    try:
        query = WIDE.format(30).encode() + b"\0"
        sock.sendall(
            frame(b"P", b"\0" + query + b"\0\0")
            + frame(b"B", b"\0\0" + b"\0\0" + b"\0\0" + b"\0\0")
            + frame(b"E", b"\0" + (20).to_bytes(4, "big"))
            + frame(b"E", b"\0" + (20).to_bytes(4, "big"))
            + frame(b"S", b"")
        )
        kinds: list[bytes] = []
        while not kinds or kinds[-1] != b"Z":
            kind, body = read_backend(sock)
            assert kind not in (b"E", b""), error_fields(body)
            kinds.append(kind)
        assert kinds == [b"1", b"2", *[b"D"] * 20, b"s", *[b"D"] * 10, b"C", b"Z"]
    finally:
        sock.close()


# -- a client that does not read ---------------------------------------------------------------


def test_a_client_that_does_not_read_is_dropped(
    serve: Callable[..., Served], caplog: pytest.LogCaptureFixture
) -> None:
    frame_bytes = 16 << 10  # under asyncio's own high-water mark, so that the server's shows
    served = serve(write_timeout=1.5, max_answer=64 << 20, frame_bytes=frame_bytes)
    reader = raw_login(served.port, "alice")
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    with caplog.at_level(logging.INFO, logger="dpsql.interfaces.pgwire"):
        assert served.server.server is not None
        (pid,) = served.server.server.connections
        connection = served.connection(pid)
        # About 25 MB, far more than the sockets' buffers hold: the server must wait for it.
        reader.sendall(frame(b"Q", WIDE.format(60_000).encode() + b"\0"))
        wait_until(lambda: connection.busy, "the answer is being sent")
        worker = connection.worker
        assert worker is not None
        worker_pid = worker._process.pid
        held, deadline = 0, time.monotonic() + 30
        with connect(served.port, "bob") as other:
            while pid in served.server.server.connections:
                assert time.monotonic() < deadline, "the client that does not read is kept"
                # Another analyst is served while the first one's answer waits.
                assert other.execute(COUNT, [43]).fetchone() is not None
                held = max(held, connection.writer.transport.get_write_buffer_size())
                assert worker._queue.qsize() <= 3  # two frames read ahead, and an event
                time.sleep(0.05)
            assert other.execute(SMALL).fetchall()
        wait_until(lambda: not alive(worker_pid), "the worker of the dropped client is gone")
    # What the loop held for it: under the high-water mark plus the frame written on top.
    assert 0 < held <= 2 * frame_bytes + 1024
    assert worker.largest_frame <= frame_bytes + PICKLE_OVERHEAD
    dropped = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert dropped == [f"pid {pid} dropped: its client read nothing for 1.5 s"]
    assert not any("pg_proc" in r.getMessage() for r in caplog.records)
    reader.close()
