"""DuckDB, opened read-only and locked down, running only SQL that dpsql generated.

The connection reaches the policy's tables and nothing else: a DuckDB file is opened read-only;
Parquet and CSV files become views; then external access is switched off (except for exactly
those files), extensions are never loaded or installed, and the configuration is locked, so no
SQL can read other files, ATTACH databases or change settings. The analyst's SQL never gets here
anyway: it is validated against an allow-list and rewritten first; this is the second wall.

Engine error text is never passed on: DuckDB quotes offending data values in its messages.

This module holds :class:`DuckDBEngine`; the SQL of the tables' views is
``dpsql.engine.duckdb.views``, and the lock-down, the database instance one process shares, the
check worker's connection, their release and the spill folder are
``dpsql.engine.duckdb.connections``.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import duckdb
import sqlglot
from sqlglot import exp

from dpsql.analyze.cells import key_query
from dpsql.analyze.sample import SAMPLE_PARAMETER
from dpsql.bound.rewrite import parse_bounded
from dpsql.bound.specs import SALT_PARAMETER
from dpsql.engine.duckdb.blocks import bind_blocks
from dpsql.engine.duckdb.connections import (
    DISABLED_OPTIMIZERS,
    _Checker,
    _DatabaseKey,
    _lock_down,
    _release,
    _shared_database,
    _spill_directory,
)
from dpsql.engine.duckdb.snapshots import remove, snapshot
from dpsql.engine.duckdb.views import (
    _check_declared_types,
    _csv_view,
    _quote,
    _string,
    block_source,
)
from dpsql.errors import CHECK_OUT_OF_MEMORY, EngineError, PolicyError, UnsupportedQueryError
from dpsql.policy import PERIOD_COLUMN, Policy
from dpsql.policy.blocks import BlockList
from dpsql.policy.exposure import hides, visible_columns
from dpsql.policy.files import FileIdentity, FileSet, identify

__all__ = ["DuckDBEngine"]

log = logging.getLogger("dpsql")
_MAX_KEPT_DOMAINS = 256  # key domains a session keeps, the oldest dropped first


def _allocation_failed(exc: BaseException) -> bool:
    """Whether a DuckDB error reports a failed allocation rather than the query's fault."""
    text = str(exc).lower()
    return "bad_alloc" in text or "out of memory" in text or "failed to allocate" in text


def _close(
    key: _DatabaseKey | None,
    connections: Sequence[duckdb.DuckDBPyConnection],
    checkers: list[_Checker],
    links: list[Path],
) -> None:
    """Release the connections (``_release``), then the snapshot links their views read."""
    _release(key, connections, checkers)
    remove(links)


class DuckDBEngine:
    """One locked-down DuckDB connection over the policy's data; thread-safe by a lock."""

    name = "duckdb"
    # A diagnosed query runs as one statement, its relation materialised once
    # (dpsql.bound.together): about half the time of two scans on joined tables.
    shares_rows = True

    def __init__(
        self,
        policy: Policy,
        salt: int,
        memory_limit: str | None = None,
        schemas: Mapping[str, Sequence[tuple[str, str]]] | None = None,
        blocks: BlockList | None = None,
    ):
        """The policy's tables from their files; or, with ``schemas`` (table -> (column, DuckDB
        type)), empty tables of those columns and nothing else: a shadow that binds, types and
        probes the bounded queries another engine runs (``dpsql.engine.spark.engine``).
        ``blocks``: the registered blocks of the tables made of blocks, bound now as listed."""
        self._lock = threading.Lock()
        # The secret salt of the keyed hash that picks a unit's groups, bound as $salt.
        self.salt = salt
        config: dict[str, str | bool | int | float | list[str]] = {
            "autoload_known_extensions": False,
            "autoinstall_known_extensions": False,
            # DuckDB folds expressions from the files' column statistics, and Parquet's min and
            # max leave NaN out: with a max of 201, isnan(x) became false and NaN > 200 true on
            # every row, so one unit's value decided how another unit's NaN was bounded (the
            # sensitivity broke; tests/bound/test_nan_statistics.py). Every row is computed. The
            # same statistics skip row groups under a filter pushed into the scan (a bare x > 200
            # keeps a NaN only where another row of its row group exceeds 200): the bounded
            # query's WHERE is TRY(...) IS TRUE, which is never pushed (the same tests).
            # And a speed choice, the same rows either way: DuckDB rewrites ROW_NUMBER() <= k
            # into a top-k heap per partition, 25% slower than the window on L0's ranking of
            # millions of units of a few groups (benchmarks/README.md, "top-k rewrite").
            "disabled_optimizers": DISABLED_OPTIMIZERS,
        }
        # Past its memory cap DuckDB spills to disk (hash tables, sorts, windows): a query on
        # data larger than memory runs slower instead of exhausting the machine. A per-connection
        # cap (dpsql serve) replaces the policy's.
        spec = policy.engine
        config["memory_limit"] = memory_limit if memory_limit is not None else spec.memory_limit
        config["temp_directory"] = str(
            policy.resolve(spec.temp_directory) if spec.temp_directory else _spill_directory()
        )
        if spec.max_spill is not None:
            config["max_temp_directory_size"] = spec.max_spill
        if spec.threads is not None:
            config["threads"] = spec.threads
        _check_declared_types(policy)
        self._shared: _DatabaseKey | None = None  # a database file this process shares
        self._bound: list[FileIdentity] = []  # the files bound, as they were (none: a shadow)
        self._file_columns: dict[str, dict[str, str]] = {}  # tables with columns hidden: all
        self._links: list[Path] = []  # the snapshot links the views read, removed at close
        self._views: list[str] = []  # the statements that made the tables' views
        try:
            if schemas is None:
                names = self._open_files(policy, config, blocks or BlockList())
            else:
                self._con = duckdb.connect(":memory:", config=config)
                _lock_down(self._con, {})
                for name, columns in schemas.items():
                    listed = ", ".join(f"{_quote(c)} {t}" for c, t in columns)
                    self._views.append(f"CREATE TEMP TABLE {_quote(name)} ({listed})")
                    self._con.execute(self._views[-1])
                names = set(schemas)
            self.catalog = self._read_catalog()
            self.collations = self._read_collations(names)
            self.files = replace(
                FileSet.of(self._bound).with_schemas(self.catalog),
                blocks=(blocks or BlockList()).token(policy.data.blocks),
            )
        except (duckdb.Error, PolicyError) as exc:
            remove(self._links)
            if hasattr(self, "_con"):
                _release(self._shared, [self._con], [])
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
            self, _close, self._shared, [self._con, self._scratch], self._checkers, self._links
        )

    def _open_files(
        self,
        policy: Policy,
        config: dict[str, str | bool | int | float | list[str]],
        blocks: BlockList,
    ) -> set[str]:
        """``self._con`` over the policy's files (a shared database file, Parquet and CSV views,
        the active blocks of each table made of blocks), locked down; the names of the views."""
        files = {name: policy.resolve(p) for name, p in policy.data.tables.items()}
        # Each file's identity before it is read (a regular file, or a PolicyError: a FIFO
        # would hang the reader); checked again before each charge (dpsql.policy.files).
        bound = [identify(name, path) for name, path in files.items()]
        in_blocks: list[FileIdentity] = []  # the blocks' files, linked by bind_blocks
        made_of_blocks = bind_blocks(policy, blocks, in_blocks, self._links)
        if policy.data.database is not None:
            # Its instance reads the file it opened whatever the path names later; the files
            # beside it are read by their paths (the instance's allowed paths are shared).
            path = policy.resolve(policy.data.database)
            self._shared, self._con, database = _shared_database(path, config, files)
            bound.append(database)
        else:
            # Each file read through a link to the very file bound (dpsql.engine.duckdb.snapshots)
            for identity in bound:
                link = snapshot(identity)
                if link is not None:
                    self._links.append(link)
                    files[identity.table] = link
            self._con = duckdb.connect(":memory:", config=config)
            readable = [*files.values(), *(p for parts in made_of_blocks.values()
                                           for paths, _, _ in parts for p in paths)]  # fmt: skip
            _lock_down(self._con, {str(i): p for i, p in enumerate(readable)})
        for name, parts in made_of_blocks.items():
            # The table of a person-within-period unit keeps each row's period (never shown in
            # the catalog, ``_read_catalog``): the bounded query pairs it with the person.
            period = policy.periods is not None and policy.periods.table == name
            source = block_source(policy.data.blocks[name].period, parts, period)
            shown = self._shown(policy, name, source)
            if period and shown != "*":
                shown += f", {_quote(PERIOD_COLUMN)}"
            self._views.append(f"CREATE TEMP VIEW {_quote(name)} AS SELECT {shown} FROM {source}")
            self._con.execute(self._views[-1])
        for name, path in files.items():
            if path.suffix.lower() == ".parquet":
                reader = f"read_parquet({_string(str(path))})"
                view = f"SELECT {self._shown(policy, name, reader)} FROM {reader}"
            else:
                view = _csv_view(policy, name, path)
            self._views.append(f"CREATE TEMP VIEW {_quote(name)} AS {view}")
            self._con.execute(self._views[-1])
        self._bound = bound + in_blocks
        return set(files) | set(made_of_blocks) | self._hide_in_database(policy, set(files))

    def _shown(self, policy: Policy, name: str, source: str, database: bool = False) -> str:
        """The select list of a table's view: ``*``, or its declared columns only (a column the
        policy does not name is hidden: dpsql.policy.exposure)."""
        if not hides(policy, name, database):
            return "*"  # no DESCRIBE: a Parquet footer is read only when columns may be hidden
        rows = self._con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()
        shown = visible_columns(policy, name, [str(r[0]) for r in rows], database)
        if shown is not None:  # every column, for the owner's check at connect only
            self._file_columns[name] = {str(r[0]).lower(): str(r[1]) for r in rows}
        return "*" if shown is None else ", ".join(map(_quote, shown)) or "NULL AS _none"

    def _hide_in_database(self, policy: Policy, files: set[str]) -> set[str]:
        """Each table of the database file that the policy declares and that holds a column it
        does not: a view of the same name over the declared columns (a temporary view comes
        first in DuckDB's search path). The names of those views."""
        tables = self._con.execute(
            "SELECT database_name, schema_name, table_name FROM duckdb_tables() WHERE NOT temporary"
        ).fetchall()
        wrapped: set[str] = set()
        for database, schema, table in tables:
            name = str(table).lower()
            if name in files or name not in policy.tables or name in wrapped:
                continue
            source = ".".join(_quote(str(part)) for part in (database, schema, table))
            shown = self._shown(policy, name, source, database=True)
            if shown != "*":
                self._views.append(
                    f"CREATE TEMP VIEW {_quote(name)} AS SELECT {shown} FROM {source}"
                )
                self._con.execute(self._views[-1])
                wrapped.add(name)
        return wrapped

    @property
    def file_catalog(self) -> Mapping[str, Mapping[str, str]]:
        """``catalog`` with the columns it hides (dpsql.policy.exposure): what the files hold,
        for the owner's check of the policy at connect (a typo's suggestion), never a query."""
        return {**self.catalog, **self._file_columns}

    def _read_catalog(self) -> Mapping[str, Mapping[str, str]]:
        rows = self._con.execute(
            "SELECT table_catalog, table_name, column_name, data_type "
            "FROM information_schema.columns"
        ).fetchall()
        # A temporary view hides a database table of its name (its declared columns only).
        views = {str(t).lower() for c, t, _, _ in rows if c == "temp"}
        catalog: dict[str, dict[str, str]] = {}
        for where, table, column, dtype in rows:
            if str(column).lower() == PERIOD_COLUMN:
                continue  # the period of a person-within-period unit: no column of the data
            if where == "temp" or str(table).lower() not in views:
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
        in normal form, as the engine renders it (``dpsql.analyze.cells``); None when it cannot be
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
        engine's text (``dpsql.analyze.domains.probe_sql``). The probe's private branch reads no
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
            if _allocation_failed(exc):
                # At a process memory limit an allocation can fail in any class of DuckDB's
                # errors (std::bad_alloc); binding reads no rows, so it is the process's.
                log.warning("engine out of memory at bind time (%s)", type(exc).__name__)
                raise UnsupportedQueryError(CHECK_OUT_OF_MEMORY) from None
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

    def shown_sql(self, sql: str) -> str:
        """The bounded SQL pretty-printed; the salt stays the parameter ``$salt``."""
        return parse_bounded(sql).sql(dialect="duckdb", pretty=True)

    def _parameters(self, sql: str) -> dict[str, int | str] | None:
        params: dict[str, int | str] = {}
        if f"${SALT_PARAMETER}" in sql:
            params[SALT_PARAMETER] = self.salt
        if f"${SAMPLE_PARAMETER}" in sql:
            # A unit-level sample's secret: 128 bits from the OS CSPRNG, fresh for this run
            # only, never stored or shown (dpsql.analyze.sample).
            params[SAMPLE_PARAMETER] = secrets.token_hex(16)
        return params or None

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
