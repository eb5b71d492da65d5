"""A data file replaced under an open session is refused before the charge; a file that is not a
regular file is refused when the session binds it.

The session binds each table to its file when it connects (``dpsql.policy.files``): the file's
device, inode, size and modification time, and the columns it holds. A query's files are checked
against them when it is planned and before its charge, so that a refresh without a new
``data_version`` (a column dropped, a truncated file, new rows put in by rename) costs nothing:
the query is refused with ``DataChangedError``, naming the table, and the ledger is byte for
byte what it was. A new connection binds the new files and answers. Real DuckDB, a real durable
ledger, real files changed on disk.
"""

from __future__ import annotations

import os
import shutil
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pytest
from conftest import write_parquet

from dpsql.accounting.ledger.store import create_ledger
from dpsql.errors import DataChangedError, PolicyError
from dpsql.policy import Policy, load_policy
from dpsql.policy.files import DATABASE
from dpsql.session.session import Session

SCHEMA = (("user_id", "BIGINT"), ("region", "VARCHAR"), ("age", "INTEGER"))
ROWS = [(u, ("east", "west")[u % 2], 20 + u % 50) for u in range(60) for _ in range(2)]
QUERY = "SELECT COUNT(*), AVG(age) FROM visits"


def _policy(folder: Path, version: str = "1", data: dict[str, Any] | None = None) -> Policy:
    tables = {
        "visits": {
            "privacy_unit": "user_id",
            "max_groups_per_unit": 1,
            "max_rows_per_unit_per_group": 5,
            "columns": {"age": {"lower": 0, "upper": 100}},
        },
        "others": {
            "privacy_unit": "user_id",
            "max_groups_per_unit": 1,
            "max_rows_per_unit_per_group": 5,
        },
    }
    files = {"visits": str(folder / "visits.parquet"), "others": str(folder / "others.parquet")}
    return load_policy(
        {
            "dataset": {"id": "files", "data_version": version},
            "data": data if data is not None else {"tables": files},
            "ledger": {"path": str(folder / "ledger.db")},
            "budget": {"diagnose": False, "epsilon": "10", "delta": "0.000001",
                       "query_epsilon": "1"},
            "tables": tables,
        },
        base_dir=folder,
    )  # fmt: skip


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    write_parquet(tmp_path / "visits.parquet", ROWS, SCHEMA)
    write_parquet(tmp_path / "others.parquet", ROWS, SCHEMA)
    create_ledger(_policy(tmp_path))
    return tmp_path


def _ledger_bytes(folder: Path) -> dict[str, bytes]:
    """The ledger's files (its SQLite file, WAL and anchor), byte for byte; not SQLite's
    shared-memory index, whose read marks any reader moves."""
    names = ("ledger.db", "ledger.db-wal", "ledger.db.anchor")
    return {n: (folder / n).read_bytes() for n in names if (folder / n).exists()}


def _replace(path: Path, rows: list[tuple[Any, ...]], schema: tuple[tuple[str, str], ...]) -> None:
    """The owner's refresh done right: a new file written beside, then renamed over."""
    fresh = path.with_name("fresh-" + path.name)
    write_parquet(fresh, rows, schema)
    os.replace(fresh, path)


def _drop_column(path: Path) -> None:
    _replace(path, [r[:2] for r in ROWS], SCHEMA[:2])


def _truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def _new_rows(path: Path) -> None:
    _replace(path, ROWS[:30], SCHEMA)


def _same_bytes_new_file(path: Path) -> None:
    fresh = path.with_name("copy-" + path.name)
    shutil.copyfile(path, fresh)
    os.replace(fresh, path)


def _appended(path: Path) -> None:
    with open(path, "ab") as handle:
        handle.write(b"\0" * 16)


def _touched(path: Path) -> None:
    info = path.stat()
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000_000))


def _removed(path: Path) -> None:
    path.unlink()


CHANGES: dict[str, Callable[[Path], None]] = {
    "column dropped, by rename": _drop_column,
    "truncated in place": _truncate,
    "same schema, new rows, by rename": _new_rows,
    "same bytes, another file": _same_bytes_new_file,
    "bytes appended in place": _appended,
    "modification time moved": _touched,
    "removed": _removed,
}


@pytest.mark.parametrize("change", CHANGES.values(), ids=CHANGES.keys())
def test_a_changed_file_is_refused_before_the_charge(
    folder: Path, change: Callable[[Path], None]
) -> None:
    session = Session(_policy(folder))
    try:
        assert session.execute(QUERY).charge is not None
        change(folder / "visits.parquet")
        before = _ledger_bytes(folder)
        # The statement planned before (its kept plan skips planning) and a new one alike.
        for sql in (QUERY, "SELECT COUNT(*) FROM visits WHERE age > 30"):
            with pytest.raises(DataChangedError) as refused:
                session.execute(sql, fresh=True)
            assert "table visits" in str(refused.value)
            assert "nothing was charged" in str(refused.value)
            assert _ledger_bytes(folder) == before
        with pytest.raises(DataChangedError):
            session.execute("EXPLAIN SELECT COUNT(*) FROM visits WHERE age > 40")
        # A query on a table whose file did not change is answered: its own files only.
        assert session.execute("SELECT COUNT(*) FROM others").charge is not None
    finally:
        session.close()


def test_a_new_connection_reads_the_new_file(folder: Path) -> None:
    session = Session(_policy(folder))
    try:
        session.execute(QUERY)
        _new_rows(folder / "visits.parquet")
        with pytest.raises(DataChangedError):
            session.execute(QUERY, fresh=True)
    finally:
        session.close()
    for version in ("1", "2"):  # reconnected, and with the new data version the owner declares
        again = Session(_policy(folder, version))
        try:
            assert again.execute(QUERY, fresh=True).charge is not None
        finally:
            again.close()


def test_an_answer_the_cache_holds_is_served_without_reading_the_file(folder: Path) -> None:
    session = Session(_policy(folder))
    try:
        first = session.execute(QUERY)
        assert first.charge is not None
        _drop_column(folder / "visits.parquet")
        again = session.execute(QUERY)  # post-processing of the release: no file is read
        assert again.cached_from is not None and again.charge is None
    finally:
        session.close()


def test_a_csv_file_replaced_is_refused(folder: Path) -> None:
    csv = folder / "visits.csv"
    csv.write_text("user_id,region,age\n" + "".join(f"{u},{r},{a}\n" for u, r, a in ROWS))
    data = {"tables": {"visits": str(csv), "others": str(folder / "others.parquet")}}
    policy = _policy(folder, data=data)
    tables = dict(policy.tables)
    columns = {"age": {"lower": 0, "upper": 100, "type": "INTEGER"}}
    tables["visits"] = tables["visits"].model_copy(
        update={"columns": {k: policy.tables["visits"].columns[k].model_copy(update=v)
                            for k, v in columns.items()}}
    )  # fmt: skip
    session = Session(policy.model_copy(update={"tables": tables}))
    try:
        session.execute(QUERY)
        fresh = folder / "fresh.csv"
        fresh.write_text("user_id,region\n1,east\n")
        os.replace(fresh, csv)
        before = _ledger_bytes(folder)
        with pytest.raises(DataChangedError, match="table visits"):
            session.execute(QUERY, fresh=True)
        assert _ledger_bytes(folder) == before
    finally:
        session.close()


def test_a_database_file_replaced_is_refused(folder: Path) -> None:
    database = folder / "warehouse.duckdb"

    def write(path: Path, rows: int) -> None:
        con = duckdb.connect(str(path))
        try:
            con.execute(
                "CREATE TABLE visits AS SELECT (i % 40)::BIGINT AS user_id, 'east' AS region, "
                f"(20 + i % 50)::INTEGER AS age FROM range({rows}) t(i)"
            )
            con.execute("CREATE TABLE others AS SELECT * FROM visits")
        finally:
            con.close()

    write(database, 100)
    session = Session(_policy(folder, data={"database": str(database)}))
    try:
        assert session.engine.files.tables == (DATABASE,)
        session.execute(QUERY)
        write(folder / "fresh.duckdb", 10)
        os.replace(folder / "fresh.duckdb", database)
        before = _ledger_bytes(folder)
        with pytest.raises(DataChangedError, match="database file"):
            session.execute(QUERY, fresh=True)
        assert _ledger_bytes(folder) == before
    finally:
        session.close()


# -- a file that is not a regular file ----------------------------------------------------------


def _opened_within(policy: Policy, seconds: float, unblock: Path | None) -> BaseException | None:
    """Open a Session in a thread; the error it raised, or a failure if it hung (then the FIFO
    ``unblock`` gets a writer, so that the thread ends)."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            Session(policy).close()
            outcome.append(None)
        except BaseException as exc:  # handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        if unblock is not None:
            fd = os.open(unblock, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
        thread.join(10)
        pytest.fail("opening a session waited on a file that is not a regular file")
    return outcome[0]


def _special(folder: Path, kind: str) -> tuple[Path, Path | None]:
    if kind == "fifo":
        os.mkfifo(folder / "pipe.parquet")
        return folder / "pipe.parquet", folder / "pipe.parquet"
    if kind == "directory":
        (folder / "dir.parquet").mkdir()
        return folder / "dir.parquet", None
    if kind == "device":
        return Path("/dev/zero"), None
    os.mkfifo(folder / "pipe")
    (folder / "link.parquet").symlink_to(folder / "pipe")
    return folder / "link.parquet", folder / "pipe"


@pytest.mark.parametrize("kind", ["fifo", "directory", "device", "link to a fifo"])
def test_a_file_that_is_not_regular_is_refused(folder: Path, kind: str) -> None:
    path, unblock = _special(folder, kind)
    if kind == "device":
        # A device needs a name the policy allows: .parquet or .csv; a link gives it one.
        (folder / "zero.csv").symlink_to(path)
        path = folder / "zero.csv"
    data = {"tables": {"visits": str(path), "others": str(folder / "others.parquet")}}
    error = _opened_within(_policy(folder, data=data), 20, unblock)
    assert isinstance(error, PolicyError), error
    assert "data.tables.visits is not a regular file" in str(error)


def test_a_database_that_is_not_a_regular_file_is_refused(folder: Path) -> None:
    os.mkfifo(folder / "pipe.duckdb")
    assert stat.S_ISFIFO(os.stat(folder / "pipe.duckdb").st_mode)
    error = _opened_within(
        _policy(folder, data={"database": str(folder / "pipe.duckdb")}), 20, folder / "pipe.duckdb"
    )
    assert isinstance(error, PolicyError), error
    assert "data.database is not a regular file" in str(error)


def test_the_engine_reads_the_file_it_bound_until_it_closes(folder: Path) -> None:
    """A refresh renamed over the path between the check and the engine's read: the engine
    still reads the file bound (a snapshot link), never the new one nor a failure."""
    session = Session(_policy(folder))
    engine = session.engine
    links = list(engine._links)  # type: ignore[attr-defined]
    try:
        assert len(links) == 2 and all(link.exists() for link in links)
        assert all(stat.S_IMODE(os.stat(link.parent).st_mode) == 0o700 for link in links)
        count = "SELECT COUNT(*), MIN(age) FROM visits"
        before = engine.run(count)[1]
        _drop_column(folder / "visits.parquet")  # age is gone from the path's file
        assert engine.run(count)[1] == before
    finally:
        session.close()
    assert not any(link.exists() for link in links)
