"""The ledger's files on disk, beside the SQLite database itself.

Opening the ledger's SQLite connection (``_connect``), looking a path up (``_exists``),
SQLite's files beside a WAL database (``_sidecars``), the identity of the file a session
verified (``_file_id``), the lock file that serializes writers across processes
(``_file_lock``), syncing what a commit made with NORMAL wrote (``_sync_wal``), and why an
operation on a file failed, in the OS's or SQLite's words and never with any content
(``_reason``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from dpsql.errors import LedgerError


def _file_id(path: Path) -> tuple[int, int]:
    try:
        info = os.stat(path)
    except OSError:
        raise LedgerError(
            "the ledger file is missing under a running session: fail closed"
        ) from None
    return info.st_dev, info.st_ino


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Serialize writers across processes (SQLite's lock covers the file, this the anchor)."""
    lock = path.with_name(path.name + ".lock")
    try:
        fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o600)
    except OSError as exc:
        raise LedgerError(
            f"the ledger's lock file {lock} cannot be opened: {_reason(exc)}"
        ) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            raise LedgerError(
                f"the ledger's lock file {lock} cannot be locked: {_reason(exc)}"
            ) from None
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _sync_wal(path: Path) -> None:
    """Sync the ledger's WAL, for commits made with NORMAL that must be on disk before the
    anchor names them: what SQLite's synchronous=FULL syncs at a commit (``fdatasync``, as
    SQLite's own: it also writes the file's size, all that reading the data back needs).

    Never the database file: closing a descriptor of it drops every POSIX lock this process
    holds on it, SQLite's included (SQLite, "How To Corrupt An SQLite Database File", 2.2), and
    another connection closing elsewhere would then take itself for the last one and delete
    the WAL under this one (tests/accounting/test_ledger_group.py). Nor is it needed: SQLite
    syncs the file after every checkpoint, before the WAL frames it copied can be overwritten.
    A missing WAL has had its frames checkpointed into the file, and synced, by the last
    connection that closed."""
    name = path.with_name(path.name + "-wal")
    try:
        fd = os.open(name, os.O_RDONLY)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise LedgerError(f"the ledger {name} could not be synced: {_reason(exc)}") from None
    try:
        os.fdatasync(fd)
    except OSError as exc:
        raise LedgerError(f"the ledger {name} could not be synced: {_reason(exc)}") from None
    finally:
        os.close(fd)


def _exists(path: Path) -> bool:
    """Whether ``path`` exists; a path that cannot even be looked up is a LedgerError."""
    try:
        return path.exists()
    except OSError as exc:
        raise LedgerError(f"cannot look up {path}: {_reason(exc)}") from None


def _sidecars(path: Path) -> tuple[Path, ...]:
    """SQLite's files beside a WAL database."""
    return tuple(path.with_name(path.name + suffix) for suffix in ("-wal", "-shm"))


def _reason(exc: BaseException) -> str:
    """Why an operation on a file failed, without any content: the OS's words, or SQLite's."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    if isinstance(exc, sqlite3.Error):
        return "SQLite cannot open or write it"
    return str(exc) if isinstance(exc, LedgerError) else type(exc).__name__


def _connect(path: Path) -> sqlite3.Connection:
    # check_same_thread off: a Ledger's connection is used under its lock by whichever thread
    # holds it (the server's worker threads share one Ledger).
    con = sqlite3.connect(str(path), timeout=60, isolation_level=None, check_same_thread=False)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=FULL")
    return con
