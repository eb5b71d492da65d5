"""Apache Spark as the engine: the same bounded queries, lowered to Spark SQL, on a cluster.

The privacy logic never depends on the engine (DESIGN.md section 7). What this module adds:

- a Spark session per process (``session.classic_session``) with the settings the guarantees
  need pinned (ANSI mode, so an overflow raises instead of wrapping; UTC; no UI, which would show
  query text) and Spark's own logs off (its messages quote SQL text and data values); or, with
  ``remote``, a client of a Spark Connect server (``session.connect_session``), whose static
  settings only the server sets;
- every engine's own session (classic: ``newSession``; Spark Connect: a new server session),
  whose pinned settings are set where a session can set them and then read back, each of them:
  an engine whose Spark differs refuses to open (``session.pin_settings``), so it never runs
  without ANSI mode;
- the policy's tables as temporary views of that isolated session: Parquet as stored, CSV
  as raw lines through the rules and grammars DuckDB's view applies (``dpsql.engine.csv_text``),
  never ``inferSchema``, so that a CSV gives the same rows on both engines;
- a *shadow*: a DuckDB connection holding empty tables of the very schema Spark reads (mapped
  to DuckDB's types, ``duckdb_type``). The analysis, the key-domain probes, the cells' keys and
  the first check bind there, reading no rows, exactly as on DuckDB, so both engines answer the
  same queries and take the same decisions before the charge;
- the check before the charge also has Spark analyze the lowered query (``spark.sql`` resolves
  and types it without running a job), so a query Spark cannot run is refused for free;
- running the lowered query (``dpsql.engine.spark.lower``) with the salt bound as a named
  parameter, in a job group (on Spark Connect: under an operation tag) that ``interrupt``
  cancels; the rows come back in the Python types DuckDB gives for the same columns
  (``_as_duckdb``), so noise and publishing are unchanged;
- ``connect_server_command``: a Spark Connect server from pyspark's own install, with the
  settings dpsql pins, as the tests start one (docs/engines.md).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import secrets
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from functools import lru_cache
from pathlib import Path
from typing import Any

from dpsql.analyze.sample import SAMPLE_PARAMETER
from dpsql.bound.specs import SALT_PARAMETER
from dpsql.engine.csv_text import (
    CUT,
    READER_LINE_BYTES,
    field_count,
    field_sql,
    line_conditions,
    spark_string,
    split_fields,
    value_sql,
)
from dpsql.engine.duckdb.engine import DuckDBEngine
from dpsql.engine.duckdb.views import csv_columns
from dpsql.engine.spark.lower import lower
from dpsql.engine.spark.session import classic_session, connect_session, pin_settings
from dpsql.errors import EngineError, NotSupportedOnEngineError, PolicyError
from dpsql.policy import Policy
from dpsql.policy.exposure import visible_columns
from dpsql.policy.files import FileIdentity, FileSet, identify

__all__ = ["SparkEngine", "duckdb_type"]

log = logging.getLogger("dpsql")

# Spark's simple type names -> DuckDB's. A column of any other type (arrays, maps, structs,
# intervals, variants) is left out of the catalog: a query naming it is refused as unknown.
_TYPES = {
    "tinyint": "TINYINT",
    "smallint": "SMALLINT",
    "int": "INTEGER",
    "bigint": "BIGINT",
    "float": "FLOAT",
    "double": "DOUBLE",
    "string": "VARCHAR",
    "boolean": "BOOLEAN",
    "date": "DATE",
    # Spark's TIMESTAMP is an instant shown in the session's zone (pinned to UTC)
    "timestamp": "TIMESTAMP WITH TIME ZONE",
    "timestamp_ntz": "TIMESTAMP",
    "binary": "BLOB",
}


def duckdb_type(spark_type: str) -> str | None:
    """DuckDB's name of a Spark type (its ``simpleString()``), or None when it has none here."""
    name = spark_type.strip().lower()
    if name in _TYPES:
        return _TYPES[name]
    if name.startswith("decimal(") and name.endswith(")"):
        precision, _, scale = name[len("decimal(") : -1].partition(",")
        if precision.strip().isdigit() and scale.strip().isdigit():
            return f"DECIMAL({int(precision)},{int(scale)})"
    if name.startswith(("varchar(", "char(")):
        return "VARCHAR"
    return None


# Hadoop's line reader skips, unread, a line longer than this (the text source passes its
# options to Hadoop's configuration).
_MAX_LINE_OPTION = "mapreduce.input.linerecordreader.line.maxlength"


class SparkEngine:
    """The policy's tables in Spark, with a DuckDB shadow of their schema for binding."""

    name = "spark"
    # Spark inlines a CTE read twice (no materialisation): the query and its diagnosis run
    # as two statements, as one would cost the same scans.
    shares_rows = False

    def __init__(self, policy: Policy, salt: int):
        if policy.data.database is not None:
            raise PolicyError(
                'data.database is a DuckDB file: engine.name = "spark" reads Parquet and CSV '
                "files (data.tables)"
            )
        if policy.data.blocks:
            raise PolicyError(
                'data.blocks: tables made of blocks are read by engine.name = "duckdb" only'
            )
        self.salt = salt
        self._lock = threading.Lock()
        self._group: str | None = None  # the running query's job group (or tag), for interrupt
        self._views: list[str] = []
        self._remote = policy.engine.remote is not None
        self._stopped = False  # a Spark Connect session, once released
        # Temporary views and settings of their own: engines in one process do not meet.
        if policy.engine.remote is not None:
            self._session = connect_session(policy.engine.remote)  # a server session of its own
        else:
            self._session = classic_session(policy.engine).newSession()
        schemas: dict[str, list[tuple[str, str]]] = {}
        self._bound: list[FileIdentity] = []  # the files bound, as they were
        self._file_columns: dict[str, dict[str, str]] = {}  # tables with columns hidden: all
        try:
            for name, value in policy.engine.conf.items():
                with contextlib.suppress(Exception):  # a static setting keeps Spark's value
                    self._session.conf.set(name, value)
            # Last, so that nothing after it changes them: a new session starts from the
            # context's (or server's) settings, which may differ from the pinned ones.
            pin_settings(self._session)
            frames = {
                n: self._read(policy, n, policy.resolve(p)) for n, p in policy.data.tables.items()
            }
            for name, identifier in policy.data.catalog.items():
                # A catalog table has the schema the catalog stores for it.
                frames[name] = self._session.table(_quoted(identifier))
            for name, read in frames.items():
                frame = self._hide(policy, name, read)
                frame.createOrReplaceTempView(name)
                self._views.append(name)
                schemas[name] = [
                    (field.name, mapped)
                    for field in frame.schema.fields
                    if (mapped := duckdb_type(field.dataType.simpleString())) is not None
                ]
        except PolicyError:
            self.close()
            raise
        except Exception as exc:  # also a Spark Connect server that cannot be reached
            self.close()
            cause = type(exc).__name__
            raise PolicyError(f"cannot open the policy's data in Spark ({cause})") from None
        self._shadow = DuckDBEngine(policy, salt, schemas=schemas)
        self.files = FileSet.of(self._bound).with_schemas(self._shadow.catalog)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpsql-spark-check")

    def _hide(self, policy: Policy, name: str, frame: Any) -> Any:
        """The table's frame over the columns the policy declares, unless it shows every one
        (``dpsql.policy.exposure``: as DuckDB's views)."""
        shown = visible_columns(policy, name, frame.columns)
        if shown is None:
            return frame
        self._file_columns[name] = {
            f.name.lower(): duckdb_type(f.dataType.simpleString()) or "?"
            for f in frame.schema.fields
        }
        return frame.select(*["`" + c.replace("`", "``") + "`" for c in shown])

    def _read(self, policy: Policy, name: str, path: Path) -> Any:
        # A regular file (or a PolicyError), whose identity each charge checks again.
        self._bound.append(identify(name, path))
        reader = self._session.read
        if path.suffix.lower() == ".parquet":
            return reader.parquet(str(path))  # the types stored in the file's footer
        # CSV: the raw lines, never the CSV reader (it drops a line with more fields than the
        # schema, reads a NUL as a quote, decodes bad UTF-8 to U+FFFD and cannot tell the file's
        # first line from a repeat of it), then the rules and grammars DuckDB's view applies
        # (dpsql.engine.csv_text), so that the same file gives the same rows on both engines.
        line, names, kinds = csv_columns(policy, name, path)
        for column, kind in kinds.items():
            if kind.spark is None:  # a Spark type of other values would change the totals
                raise PolicyError(
                    f"tables.{name}.columns.{column}.type {kind.duckdb} has no Spark type of "
                    'the same values: declare another type or use engine.name = "duckdb"'
                )
        # Hadoop skips a line beyond this many bytes unread: one line's memory is bounded.
        lines = reader.option(_MAX_LINE_OPTION, str(READER_LINE_BYTES + 1)).text(str(path))
        cut = f"substring_index(value, {spark_string(CUT)}, 1) AS _line"  # as DuckDB's read
        frame = lines.selectExpr(cut).where(" AND ".join(line_conditions("spark", "_line", line)))
        split = split_fields("spark", "_line", policy.data.csv_delimiter)
        frame = frame.selectExpr(f"{split} AS _fields").where(
            f"{field_count('spark', '_fields')} >= {len(names)}"  # a short line: no row
        )
        items = []
        for i, n in enumerate(names, start=1):
            quoted = "`" + n.replace("`", "``") + "`"
            value = value_sql("spark", field_sql("spark", "_fields", i), kinds.get(n.lower()))
            items.append(f"{value} AS {quoted}")
        return frame.selectExpr(*items)

    # -- what reads no rows: the shadow, as on DuckDB -------------------------------------------
    @property
    def catalog(self) -> Mapping[str, Mapping[str, str]]:
        return self._shadow.catalog

    @property
    def file_catalog(self) -> Mapping[str, Mapping[str, str]]:
        return {**self._shadow.catalog, **self._file_columns}

    @property
    def collations(self) -> Mapping[tuple[str, str], str]:
        return self._shadow.collations

    def cell_key(self, table: str, column: str, literal_sql: str) -> str | None:
        return self._shadow.cell_key(table, column, literal_sql)

    def key_domain(self, probe: str) -> list[str | None]:
        return self._shadow.key_domain(probe)

    def describe(self, sql: str) -> list[tuple[str, str]]:
        return self._shadow.describe(sql)

    def lowered(self, sql: str) -> str:
        """The Spark SQL of a bounded query (``dpsql.engine.spark.lower``)."""
        return _lowered(sql, _frozen(self._shadow.catalog))

    def check(self, sql: str, types: bool = True) -> list[str]:
        """As on DuckDB (the shadow binds and plans it), then Spark analyzes the lowered query:
        it resolves names and types without running a job or reading a row."""
        found = self._shadow.check(sql, types)
        text = self.lowered(sql)
        try:
            self._session.sql(text, args=self._args(text)).schema  # noqa: B018  (analysis only)
        except Exception as exc:
            log.info("Spark rejected a bounded query at analysis: %s", type(exc).__name__)
            raise NotSupportedOnEngineError(
                "Spark cannot analyze the lowered query; nothing was charged"
            ) from None
        return found

    def check_soon(self, sql: str, types: bool = True) -> Callable[[], list[str]]:
        return self._pool.submit(self.check, sql, types).result

    def _args(self, text: str) -> dict[str, int | str]:
        args: dict[str, int | str] = {}
        if f":{SALT_PARAMETER}" in text:
            args[SALT_PARAMETER] = self.salt
        if f":{SAMPLE_PARAMETER}" in text:
            # A unit-level sample's secret: fresh for this run only (dpsql.analyze.sample).
            args[SAMPLE_PARAMETER] = secrets.token_hex(16)
        return args

    def shown_sql(self, sql: str) -> str:
        """The Spark SQL that runs; the salt is the named parameter ``:salt``."""
        return self.lowered(sql)

    def run(self, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run the lowered query; any failure is the one generic ``EngineError`` (its cause, the
        exception's class, for the owner only), as on DuckDB."""
        text = self.lowered(sql)
        types = [t for _, t in self._shadow.describe(sql)]
        with self._lock:
            group = uuid.uuid4().hex
            try:
                self._group = group
                if self._remote:
                    # Spark Connect has no job groups: the operations this thread starts in
                    # this session carry the tag, which interruptTag cancels on the server.
                    self._session.addTag(group)
                else:
                    self._session.sparkContext.setJobGroup(group, "dpsql", interruptOnCancel=True)
                frame = self._session.sql(text, args=self._args(text))
                names = list(frame.columns)
                rows = [tuple(row) for row in frame.collect()]
            except Exception as exc:  # every cause gets the one error
                log.warning("engine failure after charge: %s", type(exc).__name__)
                raise EngineError(cause=type(exc).__name__) from None
            finally:
                self._group = None
                if self._remote:
                    with contextlib.suppress(Exception):
                        self._session.removeTag(group)
        return names, [_as_duckdb(row, types) for row in rows]

    def interrupt(self) -> None:
        """Cancel the running query's jobs; it then fails with an EngineError. Before the query
        starts this does nothing: a caller repeats it until the query ends."""
        group = self._group
        if group is None:
            return
        with contextlib.suppress(Exception):  # the query ended meanwhile, the session closed
            if self._remote:
                self._session.interruptTag(group)
            else:
                self._session.sparkContext.cancelJobGroup(group)

    def close(self) -> None:
        """Drop the engine's views and close its shadow; the process's Spark session stays for
        the next engine, while a Spark Connect engine releases its server session (with its
        views and settings). A second call does nothing."""
        for name in self._views:
            with contextlib.suppress(Exception):
                self._session.catalog.dropTempView(name)
        self._views = []
        if self._remote and not self._stopped:
            self._stopped = True
            with contextlib.suppress(Exception):  # a server that is gone has nothing to release
                self._session.stop()
        if hasattr(self, "_shadow"):
            self._shadow.close()
        if hasattr(self, "_pool"):
            self._pool.shutdown(wait=False, cancel_futures=True)


def _quoted(identifier: str) -> str:
    """A catalog name as Spark reads it, each part quoted (the policy allows plain ones only)."""
    return ".".join(f"`{part}`" for part in identifier.split("."))


def _frozen(catalog: Mapping[str, Mapping[str, str]]) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    """The catalog as a cache key, each table's columns in the table's order: ``SELECT *``
    lowers to that order, which is DuckDB's and the order of the types ``run`` converts by."""
    return tuple((t, tuple(cols.items())) for t, cols in sorted(catalog.items()))


@lru_cache(maxsize=256)
def _lowered(sql: str, catalog: tuple[tuple[str, tuple[Any, ...]], ...]) -> str:
    """Lowering is a function of the text and the schema: kept by both."""
    return lower(sql, {table: dict(columns) for table, columns in catalog})


_INTEGERS = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UBIGINT", "UINTEGER")


def _as_duckdb(row: Sequence[Any], types: Sequence[str]) -> tuple[Any, ...]:
    """A Spark row in the Python types DuckDB returns for the same columns: exact integers for
    integer columns (Spark gives DECIMAL(38,0) sums as Decimal), dates for DATE keys."""
    out = []
    for value, kind in zip(row, types, strict=True):
        out.append(_value(value, kind.upper()))
    return tuple(out)


def _value(value: Any, kind: str) -> Any:
    if value is None:
        return None
    if kind in _INTEGERS and isinstance(value, Decimal):
        if value != value.to_integral_value():
            raise EngineError(cause="NonIntegralTotal")  # an exact integer total, or nothing
        return int(value)
    if kind == "DATE" and isinstance(value, dt.datetime):
        return value.date()
    if kind.endswith("[]") and isinstance(value, list):
        return [_value(v, kind[:-2]) for v in value]
    if kind.startswith("MAP(") and isinstance(value, dict):
        inner = kind[4:-1].split(",", maxsplit=1)[0].strip()
        return {_value(k, inner): int(v) for k, v in value.items()}
    return value
