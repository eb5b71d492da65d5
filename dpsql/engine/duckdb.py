"""DuckDB, opened read-only and locked down, running only SQL that dpsql generated.

The connection reaches the policy's tables and nothing else: a DuckDB file is opened read-only;
Parquet and CSV files become views; then external access is switched off (except for exactly
those files), extensions are never loaded or installed, and the configuration is locked, so no
SQL can read other files, ATTACH databases or change settings. The analyst's SQL never gets here
anyway: it is validated against an allow-list and rewritten first; this is the second wall.

Engine error text is never passed on: DuckDB quotes offending data values in its messages.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import duckdb

from dpsql.errors import EngineError, PolicyError, UnsupportedQueryError
from dpsql.policy import Policy
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


# One process opens a database file once: DuckDB shares the instance between connections to a
# path, and its locked configuration with it. Each engine takes its own cursor on it.
_DATABASES: dict[tuple[str, str, tuple[str, ...]], duckdb.DuckDBPyConnection] = {}
_DATABASES_LOCK = threading.Lock()


def _shared_database(
    path: Path, config: Mapping[str, str | bool | int | float | list[str]],
    files: Mapping[str, Path],
) -> duckdb.DuckDBPyConnection:  # fmt: skip
    key = (str(path), str(config.get("memory_limit")), tuple(sorted(map(str, files.values()))))
    with _DATABASES_LOCK:
        base = _DATABASES.get(key)
        if base is None:
            base = duckdb.connect(str(path), read_only=True, config=dict(config))
            _lock_down(base, files)
            _DATABASES[key] = base
        return base.cursor()


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
        if memory_limit is not None:
            # A per-connection cap when many sessions share one process (dpsql serve).
            config["memory_limit"] = memory_limit
        try:
            files = {name: policy.resolve(p) for name, p in policy.data.tables.items()}
            for name, path in files.items():
                if not path.exists():
                    raise PolicyError(f"data.tables.{name} does not exist: {path}")
            if policy.data.database is not None:
                path = policy.resolve(policy.data.database)
                if not path.exists():
                    raise PolicyError(f"data.database does not exist: {path}")
                self._con = _shared_database(path, config, files)
            else:
                self._con = duckdb.connect(":memory:", config=config)
                _lock_down(self._con, files)
            for name, path in files.items():
                reader = "read_parquet" if path.suffix.lower() == ".parquet" else "read_csv"
                source = f"{reader}({_string(str(path))})"
                self._con.execute(f"CREATE TEMP VIEW {_quote(name)} AS SELECT * FROM {source}")
            self.catalog = self._read_catalog()
        except duckdb.Error as exc:
            raise PolicyError(f"cannot open the policy's data ({type(exc).__name__})") from None

    def _read_catalog(self) -> Mapping[str, Mapping[str, str]]:
        rows = self._con.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns"
        ).fetchall()
        catalog: dict[str, dict[str, str]] = {}
        for table, column, dtype in rows:
            catalog.setdefault(str(table).lower(), {})[str(column).lower()] = str(dtype)
        return catalog

    def check(self, sql: str) -> list[str]:
        """Bind ``sql`` without reading data (DESCRIBE) and return its column types.

        Binding reads no rows, so this decision depends on the query and schema only; it runs
        before the charge, so a query the engine cannot even plan costs nothing.
        """
        with self._lock:
            try:
                rows = self._con.execute("DESCRIBE " + sql, self._parameters(sql)).fetchall()
                # EXPLAIN also runs the optimizer, which folds constants and can raise (a date
                # beyond the TIMESTAMP range, an unsigned cast losing information): on any data,
                # so it is refused here rather than failing after the charge.
                self._con.execute("EXPLAIN " + sql, self._parameters(sql)).fetchall()
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
        with self._lock:
            self._con.close()
