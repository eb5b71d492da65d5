"""The engine's connections and what one process shares between them.

``_lock_down`` lets a connection read the policy's files only and freezes its configuration. A
database file is opened once per process and shared between engines (``_shared_database``);
``_Checker`` is the second connection and worker thread of ``DuckDBEngine.check_soon``;
``_release`` closes an engine's connections and the shared instance with its last user; and
``_spill_directory`` is the private folder every engine spills to.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import duckdb

from dpsql.engine.duckdb.views import _string
from dpsql.policy.files import DATABASE, FileIdentity, identify

# The optimizers every engine connection runs without (``DuckDBEngine.__init__`` says why).
DISABLED_OPTIMIZERS = "statistics_propagation,top_n_window_elimination"


def _lock_down(con: duckdb.DuckDBPyConnection, files: Mapping[str, Path]) -> None:
    """Only the policy's files may be read, and no setting may change afterwards."""
    allowed = ", ".join(_string(str(p)) for p in files.values())
    con.execute(f"SET allowed_paths = [{allowed}]")
    con.execute("SET enable_external_access = false")
    # DuckDB draws a progress bar on the terminal for a query past 2 s: not on dpsql's shell or
    # a server's log. A connection's own setting, inherited by its cursors.
    con.execute("SET enable_progress_bar = false")
    con.execute("SET lock_configuration = true")


# One process opens a database file once: DuckDB shares the instance between connections to a
# path, and its locked configuration with it. Each engine takes its own cursor on it, and the
# instance is closed with the last engine that uses it, so the file is released (the owner can
# then open it read-write in the same process).
# The instance keeps the identity of the file it opened (DuckDB reads that file, even after
# the path names another): an engine that shares it binds that identity, not the path's now.
_DatabaseKey = tuple[str, tuple[tuple[str, str], ...], tuple[str, ...]]
_DATABASES: dict[_DatabaseKey, tuple[duckdb.DuckDBPyConnection, int, FileIdentity]] = {}
_DATABASES_LOCK = threading.Lock()


def _shared_database(
    path: Path, config: Mapping[str, str | bool | int | float | list[str]],
    files: Mapping[str, Path],
) -> tuple[_DatabaseKey, duckdb.DuckDBPyConnection, FileIdentity]:  # fmt: skip
    settings = tuple(sorted((k, str(v)) for k, v in config.items()))
    key = (str(path), settings, tuple(sorted(map(str, files.values()))))
    with _DATABASES_LOCK:
        entry = _DATABASES.get(key)
        if entry is None:
            identity = identify(DATABASE, path)  # a regular file, before DuckDB opens it
            base = duckdb.connect(str(path), read_only=True, config=dict(config))
            _lock_down(base, files)
            users = 0
        else:
            base, users, identity = entry
        cursor = base.cursor()
        _DATABASES[key] = (base, users + 1, identity)
        return key, cursor, identity


_WORKER = "dpsql-check"


class _Checker:
    """A second connection to an engine's database, with its views, and one worker thread that
    runs checks on it (``DuckDBEngine.check_soon``): DuckDB releases the interpreter while it
    binds and plans, so the caller's Python work goes on meanwhile."""

    def __init__(self, con: duckdb.DuckDBPyConnection, views: Sequence[str]):
        self.con = con.cursor()
        for statement in views:
            self.con.execute(statement)
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=_WORKER)

    def close(self) -> None:
        # A collection that happens to run in the worker itself cannot wait for it; it is idle
        # then (a running check holds the engine, so the engine is not garbage yet).
        idle = threading.current_thread().name.startswith(_WORKER)
        self.pool.shutdown(wait=not idle, cancel_futures=True)
        with contextlib.suppress(duckdb.Error):
            self.con.close()


def _release(
    key: _DatabaseKey | None,
    connections: Sequence[duckdb.DuckDBPyConnection],
    checkers: list[_Checker],
) -> None:
    """Close an engine's connections (its checker's first), and the shared instance with its
    last user. Called by ``close`` or, for an engine never closed, when it is garbage-collected
    (weakref.finalize: it holds no reference to the engine, so it cannot keep it alive)."""
    for checker in checkers:
        checker.close()
    for con in connections:
        with contextlib.suppress(duckdb.Error):
            con.close()
    if key is None:
        return
    with _DATABASES_LOCK:
        entry = _DATABASES.get(key)
        if entry is None:
            return
        base, users, identity = entry
        if users > 1:
            _DATABASES[key] = (base, users - 1, identity)
            return
        del _DATABASES[key]
    with contextlib.suppress(duckdb.Error):
        base.close()


_SPILL: list[str] = []


def _spill_directory() -> str:
    """Where the engine spills: ``<pid>`` inside one private folder per user (mode 0700, owned by
    the user, not a link) under the system's temporary directory; not the working directory
    (DuckDB's default), which may be read-only or shared. DuckDB creates the ``<pid>`` folder
    only when it first spills; it is removed at exit."""
    with _DATABASES_LOCK:
        if _SPILL:
            return _SPILL[0]
        parent = Path(tempfile.gettempdir()) / f"dpsql-spill-{os.getuid()}"
        try:
            parent.mkdir(mode=0o700, exist_ok=True)
            info = os.lstat(parent)
            private = (
                stat.S_ISDIR(info.st_mode)
                and info.st_uid == os.getuid()
                and info.st_mode & 0o077 == 0
            )
        except OSError:
            private = False
        if not private:  # someone else's, or a link: a fresh folder of our own instead
            parent = Path(tempfile.mkdtemp(prefix="dpsql-spill-"))
        folder = str(parent / str(os.getpid()))
        atexit.register(shutil.rmtree, folder, True)
        _SPILL[:] = [folder]
        return folder
