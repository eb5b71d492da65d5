"""The SQL that makes the policy's files the engine's tables, before the connection is locked.

A Parquet file is read as it is; a CSV file through a view that reads its raw lines and applies
the rules of ``dpsql.engine.csv_text`` (the same on Spark), so that no row can make a query fail
or touch another row (``_csv_view``). Declared types apply to CSV tables only
(``_check_declared_types``). Names and paths are quoted here (``_quote``, ``_string``), never
interpolated raw.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path

from dpsql.engine.csv_text import (
    CUT,
    READER_BUFFER_BYTES,
    READER_LINE_BYTES,
    CsvType,
    csv_type,
    field_count,
    field_sql,
    line_conditions,
    split_fields,
    value_sql,
)
from dpsql.errors import PolicyError
from dpsql.policy import PERIOD_COLUMN, Policy
from dpsql.policy.exposure import visible_columns


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


_MAX_HEADER = 1 << 20


def _csv_header(path: Path, delimiter: str) -> tuple[str, list[str]]:
    """The header line of a CSV file (its first line, up to a newline or carriage return, without
    a byte order mark) and the column names it gives, split on the delimiter."""
    try:
        with open(path, "rb") as handle:
            start = handle.read(_MAX_HEADER + 1)
    except OSError:
        raise PolicyError(f"cannot read the CSV file {path}") from None
    ends = [i for i in (start.find(b"\n"), start.find(b"\r")) if i >= 0]
    if not ends or min(ends) > _MAX_HEADER:
        raise PolicyError(f"the CSV file {path} has no header line of at most 1 MiB")
    try:
        line = start[: min(ends)].decode("utf-8-sig")
    except UnicodeDecodeError:
        raise PolicyError(f"the header line of the CSV file {path} is not UTF-8") from None
    if "\x00" in line or CUT in line:  # no column name holds them; CUT would cut the line
        raise PolicyError(f"the header line of {path} holds a NUL or U+FFFF character")
    names = [n.strip() for n in line.split(delimiter)]
    if not all(names) or len({n.lower() for n in names}) != len(names):
        raise PolicyError(f"the header line of {path} has empty or repeated column names")
    return line, names


def csv_columns(policy: Policy, name: str, path: Path) -> tuple[str, list[str], dict[str, CsvType]]:
    """A CSV table's header line, its column names, and the declared columns' readings (keyed
    by lower-case name); a declared type without a grammar is refused here, on both engines."""
    line, names = _csv_header(path, policy.data.csv_delimiter)
    spec = policy.tables.get(name)
    declared = {c: col.type for c, col in (spec.columns.items() if spec else ()) if col.type}
    unknown = sorted(set(declared) - {n.lower() for n in names})
    if unknown:
        raise PolicyError(f"tables.{name}.columns.{unknown[0]}.type names no column of {path}")
    kinds: dict[str, CsvType] = {}
    for column, text in sorted(declared.items()):
        kind = csv_type(text)
        if kind is None:
            raise PolicyError(
                f"tables.{name}.columns.{column}.type {text} has no text form dpsql reads from "
                "a CSV file: declare BOOLEAN, an integer type, FLOAT, DOUBLE, DECIMAL(p,s), "
                "DATE, TIMESTAMP or VARCHAR, or convert the file to Parquet"
            )
        kinds[column] = kind
    return line, names, kinds


def _csv_view(policy: Policy, name: str, path: Path) -> str:
    """A CSV table read so that no row can make a query fail or touch another row, and so that
    Spark reads the same rows from it (the rules are ``dpsql.engine.csv_text``'s).

    DuckDB's CSV reader reads raw lines only: one column, split on a noncharacter (U+FFFF), with
    no quoting (an unbalanced quote cannot swallow the lines after it), nothing sniffed (DuckDB
    infers types from a sample of rows, and one row that does not parse then fails the whole
    query, after the charge), every newline and carriage return ending a line (``new_line``:
    with the default, a file whose first line ends in CRLF loses the text after a lone carriage
    return). It drops a line that is not UTF-8 (``ignore_errors``); strict mode stays off (with
    it, a carriage return inside a line fails the whole read). Its line cap is far above the
    rule's: it counts the empty lines before a line into that line's size, so at its own cap a
    run of empty lines would drop the next row. The rest is SQL: the lines' rules, the split on
    ``data.csv_delimiter`` and each column's grammar and cast.
    """
    line, names, kinds = csv_columns(policy, name, path)
    reader = (
        f"read_csv({_string(str(path))}, header = false, auto_detect = false, "
        f"columns = {{'line': 'VARCHAR'}}, delim = {_string(CUT)}, quote = '', escape = '', "
        "new_line = '\\n', ignore_errors = true, strict_mode = false, null_padding = false, "
        f"max_line_size = {READER_LINE_BYTES}, buffer_size = {READER_BUFFER_BYTES})"
    )
    where = " AND ".join(line_conditions("duckdb", "line", line))
    fields = split_fields("duckdb", "line", policy.data.csv_delimiter)
    items = []
    shown = visible_columns(policy, name, names)  # undeclared columns hidden (policy.exposure)
    for i, n in enumerate(names, start=1):
        if shown is not None and n not in shown:
            continue
        value = value_sql("duckdb", field_sql("duckdb", "_csv._fields", i), kinds.get(n.lower()))
        items.append(f"{value} AS {_quote(n)}")
    return (
        f"SELECT {', '.join(items)} FROM (SELECT {fields} AS _fields FROM {reader} "
        f"WHERE {where}) AS _csv WHERE {field_count('duckdb', '_csv._fields')} >= {len(names)}"
    )


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


# The column naming each row's file in a table made of blocks' scan (never a table's column:
# registering refuses a file that has it, dpsql.session.blocks), dropped from the view.
BLOCK_FILE = "_dpsql_file"


def block_source(
    period: str, blocks: Sequence[tuple[Sequence[Path], dt.date, dt.date]], keep: bool = False
) -> str:
    """A table made of blocks as one relation: one scan of every block's files, keeping only
    the rows whose period column lies in their own block's period [start, end) (a row outside
    it, or with no period, is no row of the table), so that a query whose WHERE excludes a
    block's period reads none of its rows and is answered alike after more blocks come
    (``dpsql.session.blocks``). The blocks' columns are the same (checked when each is
    registered); DuckDB's scan of a list of files matches them by name. One scan with a
    per-file bound, not a UNION of a scan per block: at 96 blocks the union took 20 ms to bind
    against 2.6 ms (benchmarks/README.md, "Tables made of blocks against their number")."""
    column = _quote(period)
    files = [(path, start, end) for paths, start, end in blocks for path in paths]
    listed = ", ".join(_string(str(p)) for p, _, _ in files)
    starts = " ".join(f"WHEN {_string(str(p))} THEN DATE '{a.isoformat()}'" for p, a, _ in files)
    ends = " ".join(f"WHEN {_string(str(p))} THEN DATE '{b.isoformat()}'" for p, _, b in files)
    name = _quote(BLOCK_FILE)
    # ``keep``: each row's period, its block's start (PERIOD_COLUMN), which a person-within-
    # period unit pairs with the person (dpsql.policy.periods); a function of the row's own
    # period value, since active blocks never overlap.
    kept = f", CASE {name} {starts} END AS {_quote(PERIOD_COLUMN)}" if keep else ""
    return (
        f"(SELECT * EXCLUDE ({name}){kept} FROM read_parquet([{listed}], filename = "
        f"{_string(BLOCK_FILE)}) WHERE {column} >= CASE {name} {starts} END "
        f"AND {column} < CASE {name} {ends} END)"
    )
