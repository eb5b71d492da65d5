"""The owner's check of the policy's data: every file read, every malformation said.

A connection refuses the first thing it cannot serve (a missing file, a column the policy names
and the file lacks) and reads the rest silently: a CSV line that breaks a rule is no row, a field
that does not parse is NULL, a column the policy never names is shown or hidden by its rule.
That is right for the analyst, who must learn nothing from it, and not enough for the owner.
``check_data`` reads everything the policy names, on the owner's machine, and reports it all:

- files the policy names that cannot be read (missing, not a regular file, unreadable, not
  Parquet, a CSV header dpsql refuses), each an error: a connection would be refused;
- schema mismatches with the policy (``dpsql.policy.schema.schema_mismatches``: a table or
  column the policy names that the data lacks; a declared type on a table that is not CSV;
  bounds on a column that is not numeric; a date range on one that is no date), each an error;
- undeclared columns: a warning when analysts see them by default, a note when the owner chose
  (``expose_undeclared`` set) or they are hidden;
- a CSV file's dropped lines and NULLed fields, with line number, column and reason
  (``dpsql.engine.check.csv_lines``), each a warning.

- for a table made of blocks, each active block the caller read from the ledger: its files
  still the ones registered (else an error), and its rows outside the block's period (a
  warning: they are no rows of the table).

It reads files only (the blocks are given it): no ledger, no budget, nothing released. It is
the owner's tool: the CLI's ``dpsql check`` runs it, and no analyst interface imports it
(``tests/house/test_layout.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import duckdb

from dpsql.engine.check.csv_lines import CsvScan, scan_csv
from dpsql.engine.duckdb.views import csv_columns
from dpsql.errors import PolicyError
from dpsql.policy import Policy
from dpsql.policy.blocks import Block, BlockList
from dpsql.policy.exposure import hides
from dpsql.policy.files import DATABASE, regular_file
from dpsql.policy.schema import schema_mismatches

__all__ = ["DataCheck", "Finding", "Severity", "TableCheck", "check_data"]

Severity = Literal["error", "warning", "note"]
_ORDER: dict[Severity, int] = {"note": 0, "warning": 1, "error": 2}
_NUMERIC = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "FLOAT", "DOUBLE", "DECIMAL")
_DATED = ("DATE", "TIMESTAMP")


@dataclass(frozen=True)
class Finding:
    """One thing found about a table or file, in the policy's words (never a data value)."""

    severity: Severity
    message: str


@dataclass
class TableCheck:
    """One table: where it is read from, its columns as the file gives them, what was found."""

    table: str  # a table name, or DATABASE for the database file itself
    source: str  # "csv", "parquet", "database"
    path: Path | None
    # lower-case name -> type (the database file: empty); None: the file cannot be read
    columns: dict[str, str] | None = None
    scan: CsvScan | None = None
    findings: list[Finding] = field(default_factory=list)

    def add(self, severity: Severity, message: str) -> None:
        self.findings.append(Finding(severity, message))

    @property
    def severity(self) -> Severity | None:
        levels = [f.severity for f in self.findings]
        if self.scan is not None and self.scan.counts:
            levels.append("warning")
        return _worst(levels)


@dataclass
class DataCheck:
    """Every table's check, in the policy's order (the database file first when there is one)."""

    tables: list[TableCheck]

    @property
    def severity(self) -> Severity | None:
        """The worst finding: an error (a connection would be refused), a warning (rows dropped
        or NULLed, columns shown undeclared), a note; None when nothing was found."""
        return _worst([s for s in (t.severity for t in self.tables) if s is not None])


def _worst(levels: list[Severity]) -> Severity | None:
    worst: Severity | None = None
    for level in levels:
        if worst is None or _ORDER[level] > _ORDER[worst]:
            worst = level
    return worst


def check_data(policy: Policy, limit: int = 50, blocks: BlockList | None = None) -> DataCheck:
    """Check every data file and table ``policy`` names; ``limit``: how many CSV line
    findings to list per table (all are counted); ``blocks``: the blocks the ledger lists, for
    the tables made of blocks (``dpsql.engine.check.blocks``)."""
    checks: list[TableCheck] = []
    catalog: dict[str, dict[str, str]] = {}
    if policy.data.database is not None:
        base = TableCheck(DATABASE, "database", policy.resolve(policy.data.database))
        checks.append(base)
        catalog.update(_database(policy, base))
    for name, relative in policy.data.tables.items():
        path = policy.resolve(relative)
        csv = path.suffix.lower() == ".csv"
        check = TableCheck(name, "csv" if csv else "parquet", path)
        checks.append(check)
        try:
            regular_file(path, f"data.tables.{name}")
            with open(path, "rb"):
                pass
        except (PolicyError, OSError) as exc:
            reason = str(exc) if isinstance(exc, PolicyError) else f"cannot open {path}"
            check.add("error", reason)
            continue
        if csv:
            _csv(policy, check, limit)
        else:
            _parquet(check)
        if check.columns is not None:
            catalog[name] = check.columns
    if policy.data.blocks:
        found, columns = _check_blocks(policy, blocks)
        checks += found
        catalog.update(columns)
    _compare(policy, checks, catalog)
    return DataCheck(checks)


def _database(policy: Policy, base: TableCheck) -> dict[str, dict[str, str]]:
    """The database file's tables (lower-case name -> column -> type), read-only."""
    assert base.path is not None
    try:
        regular_file(base.path, DATABASE)
        con = duckdb.connect(str(base.path), read_only=True)
    except PolicyError as exc:
        base.add("error", str(exc))
        return {}
    except duckdb.Error as exc:
        base.add(
            "error",
            f"{DATABASE} is not a DuckDB database dpsql can open "
            f"({type(exc).__name__}): {base.path}",
        )
        return {}
    try:
        rows = con.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns "
            "WHERE table_catalog = current_database() ORDER BY table_name, ordinal_position"
        ).fetchall()
    finally:
        con.close()
    base.columns = {}  # readable (its tables are the catalog's)
    tables: dict[str, dict[str, str]] = {}
    for table, column, dtype in rows:
        tables.setdefault(str(table).lower(), {})[str(column).lower()] = str(dtype)
    for name in sorted(set(tables) - set(policy.tables) - set(policy.data.tables)):
        base.add("note", f"the table {name} is not declared under [tables]: no query reads it")
    return tables


def _parquet(check: TableCheck) -> None:
    assert check.path is not None
    quoted = "'" + str(check.path).replace("'", "''") + "'"
    con = duckdb.connect(":memory:")
    try:
        rows = con.execute(f"DESCRIBE SELECT * FROM read_parquet({quoted})").fetchall()
    except duckdb.Error as exc:
        check.add(
            "error",
            f"data.tables.{check.table} cannot be read as Parquet "
            f"({type(exc).__name__}): {check.path}",
        )
        return
    finally:
        con.close()
    check.columns = {str(r[0]).lower(): str(r[1]) for r in rows}


def _csv(policy: Policy, check: TableCheck, limit: int) -> None:
    assert check.path is not None
    try:
        header, names, kinds = csv_columns(policy, check.table, check.path)
    except PolicyError as exc:  # a header dpsql refuses, a type without a grammar
        check.add("error", str(exc))
        return
    if policy.engine.name == "spark":  # the Spark engine refuses these at open
        for column, kind in sorted(kinds.items()):
            if kind.spark is None:
                check.add(
                    "error",
                    f"tables.{check.table}.columns.{column}.type {kind.duckdb} "
                    "has no Spark type of the same values: declare another type or use "
                    'engine.name = "duckdb"',
                )
    check.columns = {
        n.lower(): kinds[n.lower()].duckdb if n.lower() in kinds else "VARCHAR" for n in names
    }
    check.scan = scan_csv(check.path, policy.data.csv_delimiter, header, names, kinds, limit=limit)


def _compare(
    policy: Policy, checks: list[TableCheck], catalog: Mapping[str, Mapping[str, str]]
) -> None:
    """The policy against what the files hold: mismatches (errors), undeclared columns."""
    by_table = {c.table: c for c in checks}
    base = by_table.get(DATABASE)
    for table, message in schema_mismatches(policy, catalog):
        target = by_table.get(table, base)
        if target is not None and target.columns is not None:  # else its file's error says it
            target.add("error", message)
    for name, spec in policy.tables.items():
        columns = catalog.get(name)
        if columns is None:
            continue
        target = by_table.get(name) or base
        assert target is not None
        source = "csv" if name in policy.data.tables and target.source == "csv" else ""
        for cname, col in spec.columns.items():
            dtype = columns.get(cname.lower())
            if dtype is None:
                continue
            if col.type is not None and source != "csv":
                target.add(
                    "error",
                    f"tables.{name}.columns.{cname}.type applies to CSV "
                    "tables only; this table's types come from its file",
                )
            bare = dtype.upper().lstrip("U")
            if col.lower is not None and not bare.startswith(_NUMERIC):
                target.add(
                    "error",
                    f"tables.{name}.columns.{cname} has bounds, but the column "
                    f"is {dtype}: bounds clamp numbers only",
                )
            if col.date_range is not None and not dtype.upper().startswith(_DATED):
                target.add(
                    "error",
                    f"tables.{name}.columns.{cname} has a date_range, but the column is {dtype}",
                )
        if spec.public:
            continue  # every column of a public table is shown, by the owner's declaration
        declared = {spec.privacy_unit, *spec.columns, *spec.constant_per_unit,
                    *policy.path_columns(name)}  # fmt: skip
        undeclared = [c for c in columns if c not in declared]
        if not undeclared:
            continue
        listed = ", ".join(undeclared)
        in_files = name in policy.data.tables or name in policy.data.blocks
        if hides(policy, name, database=not in_files):
            target.add("note", f"undeclared column(s), hidden from analysts: {listed}")
        elif spec.expose_undeclared:
            target.add("note", f"undeclared column(s), shown (expose_undeclared): {listed}")
        else:
            target.add(
                "warning",
                f"undeclared column(s), shown to analysts by default: {listed}; declare "
                f"them, or set tables.{name}.expose_undeclared",
            )
    for name in policy.data.tables:
        if name not in policy.tables:
            by_table[name].add(
                "note", f"the table {name} is not declared under [tables]: no query reads it"
            )


# -- tables made of blocks ---------------------------------------------------------------------


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _check_block(policy: Policy, block: Block, check: TableCheck) -> None:
    for registered in block.files:
        try:
            info = regular_file(registered.path, f"a file of block {block.id}")
        except Exception as exc:
            check.add("error", str(exc))
            return
        if not registered.same_file(info):
            check.add(
                "error",
                f"a file of block {block.id} changed since it was registered "
                f"({registered.path}); register a block that replaces it",
            )
            return
    column = '"' + policy.data.blocks[block.table].period.replace('"', '""') + '"'
    files = ", ".join(_literal(str(f.path)) for f in block.files)
    inside = (f"{column} >= DATE '{block.start.isoformat()}' AND "
              f"{column} < DATE '{block.end.isoformat()}'")  # fmt: skip
    con = duckdb.connect(":memory:")
    try:
        rows, outside = con.execute(
            f"SELECT COUNT(*), COUNT(*) FILTER (WHERE ({inside}) IS NOT TRUE) "
            f"FROM read_parquet([{files}])"
        ).fetchone() or (0, 0)
    except duckdb.Error as exc:
        check.add("error", f"block {block.id} cannot be read ({type(exc).__name__})")
        return
    finally:
        con.close()
    if outside:
        check.add(
            "warning",
            f"block {block.id}: {outside:,} of its {rows:,} row(s) lie outside its period "
            f"{block.start.isoformat()} to {block.end.isoformat()} (or have no "
            f"{policy.data.blocks[block.table].period}): they are no rows of the table",
        )


def _check_blocks(
    policy: Policy, blocks: BlockList | None
) -> tuple[list[TableCheck], dict[str, dict[str, str]]]:
    """A check per active block of each table made of blocks, and each such table's columns
    (those its blocks were registered with); ``blocks`` None: the ledger was not read.

    For each active block: its files are still the ones registered (else a connection is
    refused: an error), and how many of their rows lie outside the block's period or have no
    period value (a warning: they are no rows of the table, ``dpsql.engine.duckdb.views.
    block_source``, and an owner who put them there meant something else)."""
    checks: list[TableCheck] = []
    catalog: dict[str, dict[str, str]] = {}
    for name in policy.data.blocks:
        active = blocks.active(name) if blocks is not None else ()
        if not active:
            none = TableCheck(name, "blocks", None, columns={})
            none.add("note", f"the table {name} has no block registered: no query reads it yet")
            checks.append(none)
            continue
        for block in active:
            check = TableCheck(name, "blocks", block.files[0].path, columns=dict(block.columns))
            check.add("note", f"block {block.id}: {block.start.isoformat()} to "
                              f"{block.end.isoformat()}, {len(block.files)} file(s)")  # fmt: skip
            _check_block(policy, block, check)
            checks.append(check)
        catalog[name] = dict(active[0].columns)
    return checks, catalog
