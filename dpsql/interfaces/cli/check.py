"""``dpsql check``: the owner's report on the policy's data files, with a cron-usable status.

It reads the files the policy names (``dpsql.engine.check``) and says, per table: files that
cannot be read, schema mismatches with the policy, undeclared columns, and each CSV line the
engines drop or field they read as NULL, with line number, column and reason. Nothing is
charged and no ledger is needed: it releases nothing, and it is a command of the owner's
machine only (no analyst interface imports it; ``tests/house/test_layout.py``).

Exit status: 0 when nothing is found beyond notes, ``EXIT_FINDINGS`` (1) when rows are dropped
or fields NULLed or columns shown undeclared (the data serves, not quite as written), the
policy's code (7) when a connection would be refused (a file unreadable, a mismatch) or the
policy itself is invalid. ``--quiet`` prints nothing when the status is 0, as cron expects.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import click

from dpsql.accounting.ledger.blocks import block_list
from dpsql.engine.check.csv_lines import CsvScan
from dpsql.engine.check.data import DataCheck, TableCheck, check_data
from dpsql.errors import PolicyError
from dpsql.interfaces.cli.context import EXIT_CODES, EXIT_OK, Config, pass_config
from dpsql.interfaces.cli.ledger import open_ledger
from dpsql.policy.files import DATABASE

__all__ = ["EXIT_FINDINGS", "check_command", "status_code"]

EXIT_FINDINGS = 1  # the data serves, but not quite as written: rows dropped, fields NULL
_WHAT = {"dropped": "dropped", "null": "NULL", "ignored": "ignored", "changed": "changed"}


def status_code(check: DataCheck) -> int:
    """The exit status of a check: 0, ``EXIT_FINDINGS``, or PolicyError's code."""
    severity = check.severity
    if severity == "error":
        return EXIT_CODES[PolicyError]
    return EXIT_FINDINGS if severity == "warning" else EXIT_OK


@click.command("check")
@click.option(
    "--lines",
    "limit",
    type=click.IntRange(0, 1_000_000),
    default=20,
    show_default=True,
    help="How many CSV line findings to list per table (all are counted).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of text.")
@click.option("--quiet", is_flag=True, help="Print nothing when nothing is found (for cron).")
@pass_config
@click.pass_context
def check_command(
    ctx: click.Context, config: Config, limit: int, as_json: bool, quiet: bool
) -> None:
    """Check the policy's data files (owners): unreadable files, schema mismatches,
    undeclared columns, and the CSV lines dropped or NULLed, with line, column and reason.
    Exit status 0 when clean, 1 on findings, 7 when a connection would be refused."""
    policy = config.policy(ledger=False)
    blocks = None
    if policy.data.blocks and policy.ledger is not None:
        ledger = open_ledger(policy)  # the blocks registered, for their check
        try:
            blocks = block_list(ledger.records())
        finally:
            ledger.close()
    check = check_data(policy, limit=limit, blocks=blocks)
    code = status_code(check)
    if not (quiet and code == EXIT_OK):
        if as_json:
            click.echo(json.dumps(_document(policy.dataset.id, check, code), indent=2))
        else:
            click.echo("\n".join(_text(policy.dataset.id, check, code)))
    ctx.exit(code)


def _title(table: TableCheck) -> str:
    name = "the database file" if table.table == DATABASE else f"table {table.table}"
    kind = {"csv": "CSV", "parquet": "Parquet", "database": "DuckDB",
            "blocks": "Parquet block"}[table.source]  # fmt: skip
    return f"{name} ({kind}, {table.path})" if table.path is not None else f"{name} ({kind}s)"


def _scan_line(scan: CsvScan) -> str:
    parts = [f"{scan.lines:,} line(s)", f"{scan.rows:,} row(s)"]
    if scan.empty:
        parts.append(f"{scan.empty:,} empty")
    if scan.headers:
        parts.append(f"{scan.headers:,} repeated header line(s)")
    return ", ".join(parts)


def _text(dataset: str, check: DataCheck, code: int) -> list[str]:
    lines = [f"dpsql check: data set {dataset}"]
    for table in check.tables:
        scan = table.scan
        head = _title(table)
        if scan is not None:
            head += f": {_scan_line(scan)}"
        if table.severity is None and not table.findings:
            head += "; ok"
        lines.append(head)
        lines += [f"  {f.severity}: {f.message}" for f in table.findings]
        if scan is None or not scan.counts:
            continue
        for found in scan.listed:
            where = f"line {found.line}" + (f", column {found.column}" if found.column else "")
            lines.append(f"  {where}: {_WHAT[found.what]}: {found.reason}")
        more = sum(scan.counts.values()) - len(scan.listed)
        if more:
            lines.append(f"  ... and {more:,} more (--lines N lists more)")
        lines += [f"  warning: {summary}" for summary in _summaries(scan)]
    worst = check.severity
    verdict = {
        None: "clean",
        "note": "clean (notes only)",
        "warning": "findings",
        "error": "errors: the policy cannot be served as written",
    }[worst]
    lines.append(f"result: {verdict} (exit status {code})")
    return lines


_NOUNS = {
    "dropped": "line(s) dropped",
    "null": "field(s) read as NULL",
    "changed": "field(s) read otherwise than written",
    "ignored": "line(s) with text ignored",
}


def _summaries(scan: CsvScan) -> list[str]:
    """One line per kind of finding: how many, and why (by column), the commonest first."""
    grouped: dict[str, list[str]] = defaultdict(list)
    totals: dict[str, int] = defaultdict(int)
    ranked = sorted(scan.counts.items(), key=lambda item: (-item[1], item[0][1] or "", item[0]))
    for (what, column, reason), count in ranked:
        totals[what] += count
        grouped[what].append(f"{count:,} × {column + ': ' if column else ''}{reason}")
    return [f"{totals[w]:,} {_NOUNS[w]}: {'; '.join(grouped[w])}" for w in _NOUNS if w in grouped]


def _document(dataset: str, check: DataCheck, code: int) -> dict[str, Any]:
    tables = []
    for table in check.tables:
        item: dict[str, Any] = {
            "table": table.table,
            "source": table.source,
            "path": str(table.path),
            "severity": table.severity,
            "columns": table.columns,
            "findings": [{"severity": f.severity, "message": f.message} for f in table.findings],
        }
        scan = table.scan
        if scan is not None:
            item["lines"] = {
                "total": scan.lines,
                "rows": scan.rows,
                "empty": scan.empty,
                "repeated_headers": scan.headers,
            }
            item["counts"] = [
                {"what": w, "column": c, "reason": r, "count": n}
                for (w, c, r), n in sorted(scan.counts.items(), key=lambda i: -i[1])
            ]
            item["listed"] = [
                {"line": f.line, "what": f.what, "column": f.column, "reason": f.reason}
                for f in scan.listed
            ]
        tables.append(item)
    return {"dataset": dataset, "status": check.severity or "clean", "exit": code, "tables": tables}
