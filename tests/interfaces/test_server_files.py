"""Files changed under a running ``dpsql serve``: a data file or the ledger.

* A data file replaced on disk while a connection is open (a column dropped, a truncated file,
  new rows put in by rename) refuses that connection's next query with SQLSTATE 55000
  (``DataChangedError``), nothing charged: the ledger's files are byte for byte what they were.
  A new connection binds the new file and is answered.
* The ledger file truncated under the server refuses the next query (SQLSTATE 58000,
  ``LedgerError``), nothing charged, and every query after it.

Real server (in a thread, a worker process per connection), real psycopg, real DuckDB and
SQLite; helpers in tests/server_fixtures.py.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import psycopg
import pytest
from server_fixtures import ServerThread, connect, write_dataset, write_policy, write_users

from dpsql.interfaces.pgwire.config import Limits

QUERY = "SELECT COUNT(*) FROM visits WHERE age > 30"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ServerThread, Path, Path]]:
    """A server over a data set of its own (its files are changed): (server, ledger, data)."""
    data = write_dataset(tmp_path / "data")
    users = write_users(tmp_path / "users.json")
    policy, ledger = write_policy(tmp_path / "server", data)
    server = ServerThread(policy, users, limits=Limits(max_connections=4)).start()
    try:
        yield server, ledger, data.visits
    finally:
        server.stop()


def _ledger_files(ledger: Path) -> dict[str, bytes]:
    """The ledger's files byte for byte (not SQLite's shared-memory index: readers move it)."""
    paths = (
        ledger,
        ledger.with_name(ledger.name + "-wal"),
        ledger.with_name(ledger.name + ".anchor"),
    )
    return {p.name: p.read_bytes() for p in paths if p.exists()}


def _rewrite(path: Path, select: str) -> None:
    """The owner's refresh: a new Parquet file of ``select`` over the old one, renamed over."""
    fresh = path.with_name("fresh.parquet")
    con = duckdb.connect(":memory:")
    try:
        con.execute(f"COPY ({select.format(old=path)}) TO '{fresh}' (FORMAT PARQUET)")
    finally:
        con.close()
    os.replace(fresh, path)


def _drop_column(path: Path) -> None:
    _rewrite(path, "SELECT user_id, region, spend, day FROM '{old}'")


def _truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def _new_rows(path: Path) -> None:
    _rewrite(path, "SELECT * FROM '{old}' WHERE user_id < 500")


CHANGES: dict[str, Callable[[Path], None]] = {
    "column dropped": _drop_column,
    "truncated": _truncate,
    "new rows by rename": _new_rows,
}


@pytest.mark.parametrize("change", CHANGES.values(), ids=CHANGES.keys())
def test_a_data_file_changed_under_a_connection_is_refused_free(
    served: tuple[ServerThread, Path, Path], change: Callable[[Path], None]
) -> None:
    server, ledger, visits = served
    kept = visits.with_name("kept.parquet")
    shutil.copyfile(visits, kept)
    with connect(server.port, "alice") as conn:
        conn.execute("SET dpsql.fresh = on")  # never an answer the cache holds: a charge each
        conn.execute(QUERY).fetchall()
        change(visits)
        before = _ledger_files(ledger)
        for _ in range(2):  # the statement again (its kept plan) and afresh
            with pytest.raises(psycopg.Error) as refused:
                conn.execute(QUERY, prepare=False).fetchall()
            assert refused.value.sqlstate == "55000"
            assert "table visits" in str(refused.value)
            assert _ledger_files(ledger) == before
        conn.execute("SELECT COUNT(*) FROM purchases").fetchall()  # another table's file: answered
    if change is _new_rows:
        with connect(server.port, "alice") as again:  # a new connection binds the new file
            assert again.execute(QUERY).fetchall()
    else:
        os.replace(kept, visits)  # the owner puts a readable file back; a new connection reads it
        with connect(server.port, "alice") as again:
            assert again.execute(QUERY).fetchall()


def test_a_ledger_truncated_under_the_server_refuses_the_next_query(
    served: tuple[ServerThread, Path, Path],
) -> None:
    server, ledger, _ = served
    with connect(server.port, "alice") as conn:
        conn.execute("SET dpsql.fresh = on")
        for _ in range(2):
            conn.execute(QUERY).fetchall()
        os.truncate(ledger, ledger.stat().st_size // 2)
        after = _ledger_files(ledger)
        for sql in (QUERY, "SELECT COUNT(*) FROM visits WHERE age > 40"):
            with pytest.raises(psycopg.Error) as refused:
                conn.execute(sql).fetchall()
            assert refused.value.sqlstate == "58000"
            assert _ledger_files(ledger) == after


def test_undeclared_columns_of_a_database_file_are_hidden_over_the_wire(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data")
    con = duckdb.connect(str(data.database))
    try:  # a column the policy does not declare, beside those it does
        con.execute("ALTER TABLE purchases ADD COLUMN secret DOUBLE DEFAULT 42")
    finally:
        con.close()
    users = write_users(tmp_path / "users.json")
    policy, ledger = write_policy(tmp_path / "server", data, database=True)
    server = ServerThread(policy, users, limits=Limits(max_connections=4)).start()
    try:
        with connect(server.port, "alice") as conn:
            listed = conn.execute(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_name = 'purchases' ORDER BY ordinal_position"
            ).fetchall()
            assert [c for (c,) in listed] == ["uid", "amount"]
            attributes = conn.execute(
                "SELECT a.attname FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c "
                "ON a.attrelid = c.oid WHERE c.relname = 'purchases' AND a.attnum > 0"
            ).fetchall()
            assert "secret" not in {a for (a,) in attributes} and attributes
            before = _ledger_files(ledger)
            for sql in (
                "SELECT COUNT(*) FROM purchases WHERE secret > 0",
                "SELECT SUM(secret) FROM purchases",
            ):
                with pytest.raises(psycopg.Error) as refused:
                    conn.execute(sql).fetchall()
                assert refused.value.sqlstate == "42703"  # undefined_column
                assert _ledger_files(ledger) == before
            assert conn.execute("SELECT COUNT(*) FROM purchases WHERE amount > 10").fetchall()
    finally:
        server.stop()
