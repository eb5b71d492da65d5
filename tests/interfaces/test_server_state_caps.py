"""The per-connection state of ``dpsql serve`` is capped: prepared statements, portals and SET
values. Past a cap the message is refused with SQLSTATE 53400 (configuration_limit_exceeded),
nothing is charged, the connection goes on, and closing (Close, DEALLOCATE, RESET) makes room."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from server_fixtures import (
    ServerThread,
    connect,
    error_fields,
    frame,
    psql,
    raw_login,
    read_backend,
    records,
    write_dataset,
    write_policy,
    write_users,
)

from dpsql.interfaces.pgwire.config import Limits

CAPS = Limits(
    max_connections=8,
    statement_timeout=30.0,
    max_prepared=5,
    max_portals=3,
    max_state_bytes=200_000,
    max_settings=4,
    max_setting_value=64,
)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    folder = tmp_path_factory.mktemp("caps")
    data = write_dataset(folder / "data", 300)
    policy, _ = write_policy(folder / "policy", data)
    with ServerThread(policy, write_users(folder / "users.json"), limits=CAPS) as server:
        yield server


@pytest.fixture
def unchanged_ledger(served: ServerThread) -> Iterator[None]:
    ledger = Path(served.policy.ledger.path)  # type: ignore[union-attr]
    before = records(ledger)
    yield
    assert records(ledger) == before


def _prepare(conn: psycopg.Connection[object], name: str, sql: str = "SELECT 1") -> str | None:
    result = conn.pgconn.prepare(name.encode(), sql.encode())
    return None if not result.error_message else result.error_field(0x43).decode()  # type: ignore[union-attr]


@pytest.mark.usefixtures("unchanged_ledger")
def test_prepared_statements_are_capped_and_deallocate_frees_room(served: ServerThread) -> None:
    with connect(served.port, "alice") as conn:
        assert [_prepare(conn, f"s{i}") for i in range(CAPS.max_prepared)] == [None] * 5
        assert _prepare(conn, "one_too_many") == "53400"
        assert _prepare(conn, "s0", "SELECT 2") is None  # a name again replaces its own
        assert _prepare(conn, "") is None  # the unnamed statement is always there
        conn.execute("DEALLOCATE s0")
        assert _prepare(conn, "room") is None
        assert _prepare(conn, "no_room") == "53400"
        conn.execute("DEALLOCATE ALL")
        assert [_prepare(conn, f"t{i}") for i in range(CAPS.max_prepared)] == [None] * 5
        assert conn.execute("SELECT current_user").fetchone() == ("alice",)


@pytest.mark.usefixtures("unchanged_ledger")
def test_psycopg_prepared_statements_run_under_the_cap(served: ServerThread) -> None:
    """psycopg prepares a query run often, and deallocates the least used past its own
    ``prepared_max``: set under the server's cap, it runs any number of distinct queries."""
    with connect(served.port, "alice", prepare_threshold=0) as conn:
        conn.prepared_max = CAPS.max_prepared - 1  # it prepares the next before it deallocates
        for i in range(3 * CAPS.max_prepared):
            assert conn.execute(f"SELECT {i}", prepare=True).fetchone() == (i,)


@pytest.mark.usefixtures("unchanged_ledger")
def test_state_bytes_are_capped(served: ServerThread) -> None:
    text = "SELECT 1" + " " * 90_000  # under the statement length limit
    with connect(served.port, "alice") as conn:
        results = [_prepare(conn, f"big{i}", text) for i in range(CAPS.max_prepared)]
        assert results[:2] == [None] * 2 and results[2] == "53400"


def _bind(portal: str) -> bytes:
    """Bind the prepared statement ``p`` to a named portal, no parameters, text results."""
    return frame(b"B", portal.encode() + b"\0p\0" + struct.pack("!hhh", 0, 0, 0))


def _replies(sock: socket.socket) -> list[tuple[bytes, bytes]]:
    seen = []
    while (message := read_backend(sock))[0] not in (b"Z", b""):
        seen.append(message)
    return seen


@pytest.mark.usefixtures("unchanged_ledger")
def test_named_portals_are_capped_and_close_frees_room(served: ServerThread) -> None:
    """The JDBC driver's named portals (a fetch size), over the raw protocol."""
    sock = raw_login(served.port, "alice")
    try:
        sock.sendall(frame(b"P", b"p\0SELECT 1\0\0\0") + frame(b"S", b""))
        assert [k for k, _ in _replies(sock)] == [b"1"]
        for i in range(CAPS.max_portals):
            sock.sendall(_bind(f"c{i}") + frame(b"S", b""))
            assert [k for k, _ in _replies(sock)] == [b"2"]
        sock.sendall(_bind("one_too_many") + frame(b"S", b""))
        ((kind, body),) = _replies(sock)
        assert kind == b"E" and error_fields(body)["C"] == "53400"
        sock.sendall(frame(b"C", b"Pc0\0") + _bind("room") + frame(b"S", b""))
        assert [k for k, _ in _replies(sock)] == [b"3", b"2"]
        sock.sendall(_bind("") + frame(b"E", b"\0" + struct.pack("!i", 0)) + frame(b"S", b""))
        assert [k for k, _ in _replies(sock)] == [b"2", b"D", b"C"]  # unnamed: not counted
        # Close of a prepared statement frees its room as DEALLOCATE does.
        prepare = [frame(b"P", f"s{i}\0SELECT 1\0\0\0".encode()) for i in range(5)]
        sock.sendall(b"".join(prepare) + frame(b"S", b""))
        ((kind, body),) = [m for m in _replies(sock) if m[0] != b"1"]
        assert kind == b"E" and error_fields(body)["C"] == "53400"  # p and s0..s3: five
        sock.sendall(frame(b"C", b"Sp\0") + prepare[4] + frame(b"S", b""))
        assert [k for k, _ in _replies(sock)] == [b"3", b"1"]
    finally:
        sock.close()


@pytest.mark.usefixtures("unchanged_ledger")
def test_settings_are_capped_and_reset_frees_room(served: ServerThread) -> None:
    with connect(served.port, "alice") as conn:
        for name in ("application_name", "extra_float_digits", "dpsql.confidence", "search_path"):
            conn.execute(f"SET {name} = '1'" if "." not in name else f"SET {name} = 0.9")
        with pytest.raises(psycopg.Error) as info:
            conn.execute("SET statement_timeout = 0")
        assert info.value.sqlstate == "53400"
        conn.execute("SET application_name = 'again'")  # a name already SET
        conn.execute("RESET extra_float_digits")
        conn.execute("SET statement_timeout = 0")
        with pytest.raises(psycopg.Error) as info:
            conn.execute("SET application_name = '" + "x" * 65 + "'")
        assert info.value.sqlstate == "53400"
        assert "x" * 10 not in str(info.value)  # the value is never quoted back
        conn.execute("RESET ALL")
        conn.execute("SET lock_timeout TO 0")


def test_psql_sees_the_setting_cap(served: ServerThread) -> None:
    out = psql(served.port, "alice", "SET application_name = '" + "y" * 100 + "';\n")
    assert out.returncode != 0 and "longer than 64 characters" in out.stderr
