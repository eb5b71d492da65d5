"""A synthetic PostgreSQL catalog for the clients of ``dpsql serve``, built from the policy alone.

SQLAlchemy, pandas, psql's ``\\d`` and BI tools ask the server about itself before they ask
anything else: ``select pg_catalog.version()``, ``pg_class`` joined with ``pg_attribute``,
``information_schema.columns``. dpsql answers these from a DuckDB connection of its own that
holds one **empty** table per table of the policy, with the columns and types the engine reads
from the files' schemas or the policy's declared types (never from rows), and nothing else: no
data attached, no file readable (``enable_external_access = false``), its configuration locked.
DuckDB's own ``pg_catalog`` and ``information_schema`` views over that connection are the answer;
size and statistics fields are those of empty tables (``reltuples = 0``, no ``pg_stats`` rows,
``pg_*_size() = 0``), constants whatever the data.

This module is that connection (:class:`Catalog`). Which statements it answers, and how they are
rewritten for DuckDB, is ``dpsql.interfaces.pgwire.catalog_rewrite`` (``catalog_sql``, re-exported
here); the relations and functions it provides are listed in
``dpsql.interfaces.pgwire.catalog_objects``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any

import duckdb

from dpsql import errors
from dpsql.interfaces.pgwire import protocol as pg

_MEMORY = "64MB"  # a catalog of empty tables needs little; a hostile join gets no more


def wire_type(duckdb_type: str) -> str:
    """The DuckDB type whose PostgreSQL type is the one ``dpsql serve`` sends for values of
    ``duckdb_type`` (``protocol.pg_type``): the catalog describes columns as they arrive.

    >>> [wire_type(t) for t in ("UTINYINT", "HUGEINT", "DECIMAL(18,3)", "INTEGER[]", "JSON")]
    ['SMALLINT', 'DECIMAL(38,0)', 'DECIMAL(18,3)', 'VARCHAR', 'VARCHAR']
    """
    name = " ".join(duckdb_type.upper().split())
    if name.startswith(("DECIMAL", "NUMERIC")) and "(" in name:
        return name
    oid, _ = pg.pg_type(name)
    return _WIRE_TYPES.get(oid, "VARCHAR")


_WIRE_TYPES = {
    16: "BOOLEAN", 17: "BLOB", 20: "BIGINT", 21: "SMALLINT", 23: "INTEGER", 25: "VARCHAR",
    700: "REAL", 701: "DOUBLE", 1082: "DATE", 1083: "TIME", 1114: "TIMESTAMP",
    1184: "TIMESTAMPTZ", 1186: "INTERVAL", 1266: "TIMETZ", 1700: "DECIMAL(38,0)", 2950: "UUID",
}  # fmt: skip
# PostgreSQL's names for the types above (DuckDB's format_type gives its own, e.g. int8);
# DuckDB's typmod of a DECIMAL(p, s) is p * 1000 + s.
# PostgreSQL's quote_ident (psql's tab completion calls it): a name as it may be written in SQL,
# in double quotes unless it is a plain lower-case identifier (keywords aside).
_QUOTE_IDENT = """
CREATE TEMP MACRO dpsql_quote_ident(x) AS CASE
    WHEN regexp_full_match(x, '[a-z_][a-z0-9_$]*') THEN x
    ELSE '"' || replace(x, '"', '""') || '"' END
"""
# PostgreSQL's quote_literal (format's %L): a text in single quotes, NULL stays NULL.
_QUOTE_LITERAL = """
CREATE TEMP MACRO dpsql_quote_literal(x) AS '''' || replace(x, '''', '''''') || ''''
"""
# information_schema._pg_expandarray(a) (the JDBC driver's key and index columns): each element
# of a with its 1-based position, as (x, n); the rewrite unnests it.
_EXPAND_ARRAY = """
CREATE TEMP MACRO dpsql_expandarray(a) AS list_transform(a, lambda x, i: {'x': x, 'n': i})
"""
_FORMAT_TYPE = """
CREATE TEMP MACRO dpsql_format_type(t, m) AS CASE t
    WHEN 16 THEN 'boolean' WHEN 17 THEN 'bytea' WHEN 20 THEN 'bigint' WHEN 21 THEN 'smallint'
    WHEN 23 THEN 'integer' WHEN 25 THEN 'text' WHEN 700 THEN 'real'
    WHEN 701 THEN 'double precision' WHEN 1043 THEN 'character varying' WHEN 1082 THEN 'date'
    WHEN 1083 THEN 'time without time zone' WHEN 1114 THEN 'timestamp without time zone'
    WHEN 1184 THEN 'timestamp with time zone' WHEN 1186 THEN 'interval'
    WHEN 1266 THEN 'time with time zone' WHEN 2950 THEN 'uuid'
    WHEN 1700 THEN CASE WHEN m IS NULL OR m < 0 THEN 'numeric'
        ELSE 'numeric(' || (m // 1000) || ',' || (m % 1000) || ')' END
    ELSE format_type(t, m) END
"""


class Catalog:
    """The empty tables of a policy in a DuckDB connection of their own, answering catalog
    queries; ``tables`` maps each exposed table to its columns and DuckDB types."""

    def __init__(self, tables: Mapping[str, Mapping[str, str]]):
        self._lock = threading.Lock()
        self._con = duckdb.connect(
            ":memory:",
            config={
                "enable_external_access": False,
                "autoload_known_extensions": False,
                "autoinstall_known_extensions": False,
                "memory_limit": _MEMORY,
                "threads": 1,
            },
        )
        for table, columns in tables.items():
            body = ", ".join(f"{_quote(c)} {wire_type(t)}" for c, t in columns.items())
            self._con.execute(f"CREATE TABLE main.{_quote(table)} ({body})")
        self._con.execute(_FORMAT_TYPE)
        self._con.execute(_QUOTE_IDENT)
        self._con.execute(_QUOTE_LITERAL)
        self._con.execute(_EXPAND_ARRAY)
        self._con.execute("SET lock_configuration = true")

    def answer(
        self, sql: str, params: Sequence[object] | None
    ) -> tuple[list[tuple[str, str]], list[tuple[Any, ...]]]:
        """The columns (name, DuckDB type) and rows of a catalog query."""
        described: list[tuple[str, str]] = []
        rows: list[tuple[Any, ...]] = []

        def take(columns: Sequence[tuple[str, str]], batch: Sequence[tuple[Any, ...]]) -> None:
            described[:] = columns
            rows.extend(batch)

        self.stream(sql, params, take)
        return described, rows

    def stream(
        self,
        sql: str,
        params: Sequence[object] | None,
        take: Callable[[Sequence[tuple[str, str]], Sequence[tuple[Any, ...]]], None],
    ) -> None:
        """Run a catalog query and hand its columns (name, DuckDB type) and its rows to
        ``take``, one batch at a time as they are fetched: ``take`` stops the query (by raising)
        before the rest of an answer over the server's byte cap is fetched."""
        for columns, batch in self.batches(sql, params):
            take(columns, batch)

    def batches(
        self, sql: str, params: Sequence[object] | None
    ) -> Generator[tuple[list[tuple[str, str]], list[tuple[Any, ...]]], None, None]:
        """The columns and each batch of rows of a catalog query, fetched as they are asked
        for: the connection is held until the last is read or the iterator is closed."""
        with self._lock:
            try:
                cursor = self._con.execute(sql, list(params) if params else None)
                columns = [(str(d[0]), str(d[1])) for d in cursor.description or []]
                left = _MAX_ROWS
                while True:
                    batch = cursor.fetchmany(min(_BATCH, left))
                    yield columns, batch
                    left -= len(batch)
                    if len(batch) < _BATCH or left <= 0:
                        return
            except duckdb.InterruptException:
                raise errors.UnsupportedQueryError("the catalog query was interrupted") from None
            except duckdb.Error as exc:
                # The catalog holds no data: its messages quote only the query and the schema.
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise errors.UnsupportedQueryError(f"catalog query: {first[:300]}") from None

    def interrupt(self) -> None:
        """Takes no lock: a running query holds it."""
        with contextlib.suppress(duckdb.Error):
            self._con.interrupt()

    def close(self) -> None:
        with self._lock:
            self._con.close()


_MAX_ROWS = 100_000  # a catalog answer is small; a cross join of catalog views is cut here
_BATCH = 1024  # rows fetched at a time: the server's byte cap is checked after each batch


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


__all__ = ["Catalog", "wire_type"]
