"""Closing a connection, or dropping the last reference to it, releases the DuckDB file: the
owner can then open the same file read-write in the same process (DuckDB refuses a second
read-write open while any read-only instance of the file is alive)."""

from __future__ import annotations

import gc
from pathlib import Path

import duckdb
import pytest

import dpsql
from dpsql.policy import Policy, load_policy
from dpsql.session.session import Session

ROWS = [(u, "east" if u % 2 else "west", 20 + u % 50, float(u % 200)) for u in range(1, 41)]


def _database(tmp_path: Path) -> Path:
    path = tmp_path / "visits.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE visits (user_id BIGINT, region VARCHAR, age INTEGER, spend DOUBLE)")
    con.executemany("INSERT INTO visits VALUES (?, ?, ?, ?)", [list(r) for r in ROWS])
    con.close()
    return path


def _policy(path: Path) -> Policy:
    return load_policy(
        {
            "dataset": {"id": "files", "data_version": "1"},
            "data": {"database": str(path)},
            "budget": {
                "diagnose": False,
                "epsilon": "10",
                "delta": "0.000001",
                "query_epsilon": "1",
            },
            "tables": {
                "visits": {
                    "privacy_unit": "user_id",
                    "max_groups_per_unit": 1,
                    "max_rows_per_unit_per_group": 1,
                    "columns": {"region": {"public_values": ["east", "west"]}},
                }
            },
        },
        base_dir=path.parent,
    )


QUERY = "SELECT region, COUNT(*) AS n FROM visits GROUP BY region"


def _write(path: Path) -> None:
    """Open the file read-write and write to it: fails while dpsql still holds it."""
    con = duckdb.connect(str(path))
    try:
        con.execute("INSERT INTO visits VALUES (999, 'east', 30, 1.0)")
        assert con.execute("SELECT COUNT(*) FROM visits").fetchone() == (len(ROWS) + 1,)
    finally:
        con.close()


def test_the_file_is_held_while_a_connection_is_open(tmp_path: Path) -> None:
    path = _database(tmp_path)
    connection = dpsql.connect(_policy(path))
    try:
        with pytest.raises(duckdb.Error):
            _write(path)
    finally:
        connection.close()


def test_close_releases_the_file(tmp_path: Path) -> None:
    path = _database(tmp_path)
    connection = dpsql.connect(_policy(path))
    connection.cursor().execute(QUERY).fetchall()
    connection.close()
    _write(path)
    # And dpsql can open it again afterwards, seeing the new row's file.
    again = dpsql.connect(_policy(path))
    try:
        assert len(again.cursor().execute(QUERY).fetchall()) == 2
    finally:
        again.close()


def test_session_close_releases_the_file_of_two_sessions(tmp_path: Path) -> None:
    path = _database(tmp_path)
    policy = _policy(path)
    first, second = Session(policy), Session(policy)  # one shared DuckDB instance
    first.execute(QUERY)
    first.close()
    with pytest.raises(duckdb.Error):
        _write(path)  # the second session still holds it
    second.execute(QUERY)
    second.close()
    second.close()  # closing twice is harmless
    _write(path)


def test_garbage_collection_releases_the_file(tmp_path: Path) -> None:
    path = _database(tmp_path)
    connection = dpsql.connect(_policy(path))
    cursor = connection.cursor()
    cursor.execute(QUERY).fetchall()
    del connection, cursor
    gc.collect()
    _write(path)


def test_an_unused_session_is_collected_without_close(tmp_path: Path) -> None:
    path = _database(tmp_path)
    session = Session(_policy(path))
    session.plan(QUERY)
    del session
    gc.collect()
    _write(path)


def test_no_reference_cycle_keeps_the_engine_alive(tmp_path: Path) -> None:
    path = _database(tmp_path)
    gc.disable()  # only reference counting: a cycle would keep the file open
    try:
        connection = dpsql.connect(_policy(path))
        cursor = connection.cursor()
        cursor.execute(QUERY).fetchall()
        cursor.execute("EXPLAIN " + QUERY)
        del connection, cursor
        _write(path)
    finally:
        gc.enable()


def test_close_releases_the_file_after_checks_in_the_engines_worker(tmp_path: Path) -> None:
    """The worker's second connection (``check_soon``, as a batch file's planning uses) is
    closed with the engine."""
    path = _database(tmp_path)
    session = Session(_policy(path))
    plan = session.plan(QUERY)
    assert session.engine.check_soon(plan.engine_sql)() == session.engine.check(plan.engine_sql)
    session.close()
    _write(path)


def test_garbage_collection_releases_the_file_after_checks_in_the_worker(tmp_path: Path) -> None:
    path = _database(tmp_path)
    session = Session(_policy(path))
    session.engine.check_soon(session.plan(QUERY).engine_sql)()
    del session
    gc.collect()
    _write(path)
