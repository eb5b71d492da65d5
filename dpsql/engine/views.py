"""The SQL that makes the policy's files the engine's tables, before the connection is locked.

A Parquet file is read as it is; a CSV file through a view that reads every column as text and
casts it to the policy's declared type, so that no row can make a query fail or touch another
row (``_csv_view``). Declared types apply to CSV tables only (``_check_declared_types``). Names
and paths are quoted here (``_quote``, ``_string``), never interpolated raw.
"""

from __future__ import annotations

from pathlib import Path

from dpsql.errors import PolicyError
from dpsql.policy import Policy


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


_MAX_HEADER = 1 << 20


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
