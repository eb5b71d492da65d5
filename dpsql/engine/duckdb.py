"""DuckDB, opened read-only and locked down, running only SQL that dpsql generated.

The connection reaches the policy's tables and nothing else: a DuckDB file is opened read-only;
Parquet and CSV files become views; then external access is switched off (except for exactly
those files), extensions are never loaded or installed, and the configuration is locked, so no
SQL can read other files, ATTACH databases or change settings. The analyst's SQL never gets here
anyway: it is validated against an allow-list and rewritten first; this is the second wall.

Engine error text is never passed on: DuckDB quotes offending data values in its messages.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import stat
import tempfile
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import duckdb
import sqlglot
from sqlglot import exp

from dpsql.errors import CHECK_OUT_OF_MEMORY, EngineError, PolicyError, UnsupportedQueryError
from dpsql.policy import Policy
from dpsql.sql.cells import key_query
from dpsql.sql.rewrite import SALT_PARAMETER

log = logging.getLogger("dpsql")


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _lock_down(con: duckdb.DuckDBPyConnection, files: Mapping[str, Path]) -> None:
    """Only the policy's files may be read, and no setting may change afterwards."""
    allowed = ", ".join(_string(str(p)) for p in files.values())
    con.execute(f"SET allowed_paths = [{allowed}]")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


_MAX_HEADER = 1 << 20
_MAX_KEPT_DOMAINS = 256  # key domains a session keeps, the oldest dropped first


def _csv_header(path: Path, delimiter: str) -> list[str]:
    """The column names of a CSV file: its first line, split on the delimiter."""
    try:
        with open(path, "rb") as handle:
            line = handle.readline(_MAX_HEADER + 1)
    except OSError:
        raise PolicyError(f"cannot read the CSV file {path}") from None
    if len(line) > _MAX_HEADER or not line.endswith(b"\n"):
        raise PolicyError(f"the CSV file {path} has no header line of at most 1 MiB")
    try:
        names = line.decode("utf-8-sig").rstrip("\r\n").split(delimiter)
    except UnicodeDecodeError:
        raise PolicyError(f"the header line of the CSV file {path} is not UTF-8") from None
    names = [n.strip() for n in names]
    if not all(names) or len({n.lower() for n in names}) != len(names):
        raise PolicyError(f"the header line of {path} has empty or repeated column names")
    return names


def _csv_view(policy: Policy, name: str, path: Path) -> str:
    """A CSV table read so that no row can make a query fail or touch another row.

    Every column is read as VARCHAR (never sniffed: DuckDB infers types from a sample of rows,
    and one row that does not parse then fails the whole query, after the charge) and cast to
    the policy's declared type with TRY_CAST. The dialect is fixed: one physical line is one
    row, split on ``data.csv_delimiter`` with no quoting, so an unbalanced quote cannot swallow
    the lines after it; a line with too few fields, invalid UTF-8 or over the line size limit is
    dropped on its own (``ignore_errors``), a per-row rule; extra fields are ignored. Strict mode
    stays off: with it, a carriage return inside one line fails the whole read.
    """
    delimiter = policy.data.csv_delimiter
    names = _csv_header(path, delimiter)
    spec = policy.tables.get(name)
    declared = {c: col.type for c, col in (spec.columns.items() if spec else ()) if col.type}
    unknown = sorted(set(declared) - {n.lower() for n in names})
    if unknown:
        raise PolicyError(f"tables.{name}.columns.{unknown[0]}.type names no column of {path}")
    columns = ", ".join(f"{_string(n)}: 'VARCHAR'" for n in names)
    reader = (
        f"read_csv({_string(str(path))}, header = true, auto_detect = false, "
        f"columns = {{{columns}}}, delim = {_string(delimiter)}, quote = '', escape = '', "
        "ignore_errors = true, strict_mode = false, null_padding = false)"
    )
    items = []
    for n in names:
        ctype = declared.get(n.lower())
        value = f"TRY_CAST({_quote(n)} AS {ctype})" if ctype else _quote(n)
        items.append(f"{value} AS {_quote(n)}")
    return f"SELECT {', '.join(items)} FROM {reader}"


def _check_declared_types(policy: Policy) -> None:
    """A declared column type applies to CSV tables, whose files carry no types of their own."""
    csv = {n for n, p in policy.data.tables.items() if p.suffix.lower() == ".csv"}
    for name, spec in policy.tables.items():
        for column, col in spec.columns.items():
            if col.type is not None and name not in csv:
                raise PolicyError(
                    f"tables.{name}.columns.{column}.type applies to CSV tables only; the types "
                    "of Parquet and DuckDB tables come from their files"
                )


# One process opens a database file once: DuckDB shares the instance between connections to a
# path, and its locked configuration with it. Each engine takes its own cursor on it, and the
# instance is closed with the last engine that uses it, so the file is released (the owner can
# then open it read-write in the same process).
_DatabaseKey = tuple[str, tuple[tuple[str, str], ...], tuple[str, ...]]
_DATABASES: dict[_DatabaseKey, tuple[duckdb.DuckDBPyConnection, int]] = {}
_DATABASES_LOCK = threading.Lock()


def _shared_database(
    path: Path, config: Mapping[str, str | bool | int | float | list[str]],
    files: Mapping[str, Path],
) -> tuple[_DatabaseKey, duckdb.DuckDBPyConnection]:  # fmt: skip
    settings = tuple(sorted((k, str(v)) for k, v in config.items()))
    key = (str(path), settings, tuple(sorted(map(str, files.values()))))
    with _DATABASES_LOCK:
        base, users = _DATABASES.get(key, (None, 0))
        if base is None:
            base = duckdb.connect(str(path), read_only=True, config=dict(config))
            _lock_down(base, files)
        cursor = base.cursor()
        _DATABASES[key] = (base, users + 1)
        return key, cursor


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
        base, users = _DATABASES.get(key, (None, 0))
        if base is None:
            return
        if users > 1:
            _DATABASES[key] = (base, users - 1)
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


class DuckDBEngine:
    """One locked-down DuckDB connection over the policy's data; thread-safe by a lock."""

    def __init__(self, policy: Policy, salt: int, memory_limit: str | None = None):
        self._lock = threading.Lock()
        # The secret salt of the keyed hash that picks a unit's groups, bound as $salt.
        self.salt = salt
        config: dict[str, str | bool | int | float | list[str]] = {
            "autoload_known_extensions": False,
            "autoinstall_known_extensions": False,
        }
        # Past its memory cap DuckDB spills to disk (hash tables, sorts, windows): a query on
        # data larger than memory runs slower instead of exhausting the machine. A per-connection
        # cap (dpsql serve) replaces the policy's.
        spec = policy.engine
        config["memory_limit"] = memory_limit if memory_limit is not None else spec.memory_limit
        config["temp_directory"] = str(
            policy.resolve(spec.temp_directory) if spec.temp_directory else _spill_directory()
        )
        if spec.threads is not None:
            config["threads"] = spec.threads
        _check_declared_types(policy)
        shared: _DatabaseKey | None = None
        self._views: list[str] = []  # the statements that made the tables' views
        try:
            files = {name: policy.resolve(p) for name, p in policy.data.tables.items()}
            for name, path in files.items():
                if not path.exists():
                    raise PolicyError(f"data.tables.{name} does not exist: {path}")
            if policy.data.database is not None:
                path = policy.resolve(policy.data.database)
                if not path.exists():
                    raise PolicyError(f"data.database does not exist: {path}")
                shared, self._con = _shared_database(path, config, files)
            else:
                self._con = duckdb.connect(":memory:", config=config)
                _lock_down(self._con, files)
            for name, path in files.items():
                if path.suffix.lower() == ".parquet":
                    view = f"SELECT * FROM read_parquet({_string(str(path))})"
                else:
                    view = _csv_view(policy, name, path)
                self._views.append(f"CREATE TEMP VIEW {_quote(name)} AS {view}")
                self._con.execute(self._views[-1])
            self.catalog = self._read_catalog()
            self.collations = self._read_collations(set(files))
        except (duckdb.Error, PolicyError) as exc:
            if hasattr(self, "_con"):
                _release(shared, [self._con], [])
            if isinstance(exc, PolicyError):
                raise
            raise PolicyError(f"cannot open the policy's data ({type(exc).__name__})") from None
        # Constants (a cell's key) are evaluated on a connection that holds no data at all, so
        # what they give cannot depend on the data (DESIGN.md section 4).
        self._scratch = duckdb.connect(":memory:", config=config)
        _lock_down(self._scratch, {})
        self._domains: dict[str, list[tuple[Any, ...]]] = {}
        self._checkers: list[_Checker] = []  # at most one, made by the first check_soon
        self._closed = weakref.finalize(
            self, _release, shared, [self._con, self._scratch], self._checkers
        )

    def _read_catalog(self) -> Mapping[str, Mapping[str, str]]:
        rows = self._con.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns"
        ).fetchall()
        catalog: dict[str, dict[str, str]] = {}
        for table, column, dtype in rows:
            catalog.setdefault(str(table).lower(), {})[str(column).lower()] = str(dtype)
        return catalog

    def _read_collations(self, files: set[str]) -> dict[tuple[str, str], str]:
        """(table, column) -> collation, from the DDL DuckDB keeps for a database file's tables
        (neither DESCRIBE nor information_schema shows a collation). Where it cannot be read (a
        view of the database file may inherit one from its query, a DDL sqlglot cannot parse),
        every column is marked ``?``, unknown: its cells are not keyed."""
        collations: dict[tuple[str, str], str] = {}
        tables = self._con.execute("SELECT table_name, sql FROM duckdb_tables()").fetchall()
        views = self._con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal")
        unknown = {str(v).lower() for (v,) in views.fetchall()} - files
        for name, ddl in tables:
            try:
                tree = sqlglot.parse_one(str(ddl), read="duckdb")
            except sqlglot.errors.ParseError:
                unknown.add(str(name).lower())
                continue
            for column in tree.find_all(exp.ColumnDef):
                for constraint in column.args.get("constraints") or []:
                    if isinstance(constraint.kind, exp.CollateColumnConstraint):
                        key = (str(name).lower(), column.name.lower())
                        collations[key] = constraint.kind.this.name.lower()
        for table in unknown:
            collations.update({(table, c): "?" for c in self.catalog.get(table, {})})
        return collations

    def cell_key(self, table: str, column: str, literal_sql: str) -> str | None:
        """The key of the cell ``column = literal`` pins: the literal cast to the column's type,
        in normal form, as the engine renders it (``dpsql.sql.cells``); None when it cannot be
        keyed (not a value of the type, or an unknown collation): the query then composes
        sequentially. Evaluated on a connection without data."""
        collation = self.collations.get((table, column))
        query = key_query(literal_sql, self.catalog[table][column], collation)
        if query is None:
            return None
        with self._lock:
            try:
                row = self._scratch.execute(query).fetchone()
            except duckdb.Error:
                return None
        return None if row is None or row[0] is None else str(row[0])

    def key_domain(self, probe: str) -> list[str | None]:
        """The distinct values of a public key domain in the key's type and collation, as the
        engine's text (``dpsql.sql.domains.probe_sql``). The probe's private branch reads no
        rows (``WHERE false``), so the answer depends on the query and the schema only, and is
        kept: a year of days costs some 20 ms to probe, on every plan of the query."""
        with self._lock:
            rows = self._domains.get(probe)
            if rows is None:
                try:
                    rows = self._con.execute(probe).fetchall()
                except duckdb.Error as exc:
                    log.info("engine rejected a key domain: %s", type(exc).__name__)
                    raise UnsupportedQueryError(
                        "the engine cannot type the public domain of a GROUP BY key"
                    ) from None
                if len(self._domains) >= _MAX_KEPT_DOMAINS:
                    self._domains.pop(next(iter(self._domains)))
                self._domains[probe] = rows
        if not all(exact for _, exact in rows):
            raise UnsupportedQueryError(
                "a GROUP BY key's type has values the engine cannot write back exactly; "
                "cast the key to a simpler type"
            )
        return [None if text is None else str(text) for text, _ in rows]

    def check(self, sql: str, types: bool = True) -> list[str]:
        """Bind and plan ``sql`` without reading data and return its column types (DESCRIBE;
        with ``types=False`` an empty list, and no DESCRIBE: the plan binds everything it does).

        Binding reads no rows, so this decision depends on the query and schema only; it runs
        before the charge, so a query the engine cannot even plan costs nothing.
        """
        with self._lock:
            return self._check_on(self._con, sql, types)

    def check_soon(self, sql: str, types: bool = True) -> Callable[[], list[str]]:
        """Start ``check(sql, types)`` in the engine's worker thread, on a second connection
        with the same views, and return a function that waits for its outcome: the same types,
        or the same error, as ``check``. The caller does other work meanwhile (a batch file
        plans its next statement while the engine plans this one)."""
        with self._lock:
            if not self._checkers:
                self._checkers.append(_Checker(self._con, self._views))
            checker = self._checkers[0]
        future = checker.pool.submit(self._check_on, checker.con, sql, types)
        return future.result

    def _check_on(self, con: duckdb.DuckDBPyConnection, sql: str, types: bool) -> list[str]:
        rows: list[tuple[Any, ...]] = []
        try:
            if types:
                rows = con.execute("DESCRIBE " + sql, self._parameters(sql)).fetchall()
            # EXPLAIN also runs the optimizer, which folds constants and can raise (a date
            # beyond the TIMESTAMP range, an unsigned cast losing information): on any data,
            # so it is refused here rather than failing after the charge. In JSON: the same
            # planning, without the box drawing (2 ms of a grouped query's 6). PREPARE is not
            # enough: over a Parquet view it skips the fold that raises.
            con.execute("EXPLAIN (FORMAT json) " + sql, self._parameters(sql)).fetchall()
        except duckdb.OutOfMemoryException:
            # Binding reads no rows: the memory ran out in this process, whatever the data.
            log.warning("engine out of memory at bind time")
            raise UnsupportedQueryError(CHECK_OUT_OF_MEMORY) from None
        except duckdb.Error as exc:
            log.info("engine rejected a bounded query at bind time: %s", type(exc).__name__)
            raise UnsupportedQueryError(
                "the engine cannot type-check this query (e.g. a function applied to a "
                "column of the wrong type)"
            ) from None
        return [str(row[1]) for row in rows]

    def describe(self, sql: str) -> list[tuple[str, str]]:
        """The output column names and types of a SELECT, by binding it (no rows are read)."""
        with self._lock:
            try:
                rows = self._con.execute("DESCRIBE " + sql, self._parameters(sql)).fetchall()
            except duckdb.Error as exc:
                log.info("engine rejected a relation at bind time: %s", type(exc).__name__)
                raise UnsupportedQueryError(
                    "the engine cannot type-check this join or subquery (e.g. a function "
                    "applied to a column of the wrong type, or columns of different types "
                    "compared)"
                ) from None
        return [(str(row[0]).lower(), str(row[1])) for row in rows]

    def _parameters(self, sql: str) -> dict[str, int] | None:
        return {SALT_PARAMETER: self.salt} if f"${SALT_PARAMETER}" in sql else None

    def run(self, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run generated SQL; any failure becomes the one generic ``EngineError``.

        Whether the engine fails, and how (an engine error, an interrupt, out of memory in
        DuckDB or in Python while the rows are fetched), can depend on the data: the error's
        message is the same for every cause, and the cause (the exception's class name) goes
        only to ``EngineError.cause``, for the session to record for the data owner.
        """
        with self._lock:
            try:
                cursor = self._con.execute(sql, self._parameters(sql))
                names = [d[0] for d in cursor.description or []]
                return names, cursor.fetchall()
            except Exception as exc:  # every cause gets the one error
                # The engine's message may quote data values: log the class only.
                log.warning("engine failure after charge: %s", type(exc).__name__)
                raise EngineError(cause=type(exc).__name__) from None

    def interrupt(self) -> None:
        """Stop the running query (a statement timeout or a client's cancel request); it then
        fails with an EngineError, and its charge stands. Takes no lock: a query holds it."""
        with contextlib.suppress(duckdb.Error):
            self._con.interrupt()

    def close(self) -> None:
        """Close the connections and release the data files; a second call does nothing."""
        with self._lock:
            self._closed()
