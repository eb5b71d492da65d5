"""``dpsql blocks``: the owner registers, replaces and removes blocks of tables made of blocks.

``add`` registers a new block of a table under ``data.blocks`` (its Parquet files and its
period [START, END)); ``replace`` registers a correction that replaces an active block (every
release that read the old one is retired: never served again); ``remove`` retires a block with
no replacement (data no longer kept); ``list`` prints every block and the charges whose answers
read a block replaced or removed since. Each writes or reads the policy's
ledger (``dpsql.session.blocks``): sessions and servers see a new block before their next
statement. Registering reads each file's footer (its columns), never a row.
"""

from __future__ import annotations

from pathlib import Path

import click

from dpsql.accounting.ledger.blocks import block_list, retired
from dpsql.accounting.ledger.chain import Record
from dpsql.errors import DpsqlError
from dpsql.interfaces.cli.context import Config, pass_config
from dpsql.interfaces.cli.ledger import open_ledger
from dpsql.interfaces.cli.params import TEXT
from dpsql.policy.blocks import BlockList
from dpsql.session.blocks import register, remove
from dpsql.session.session import Session
from dpsql.session.views import release, views_of

__all__ = ["block_lines", "blocks"]

_FILES = click.argument(
    "files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path)
)
_START = click.option(
    "--start", required=True, type=TEXT, help="First day of its period (YYYY-MM-DD)."
)
_END = click.option("--end", required=True, type=TEXT, help="Day after its period (YYYY-MM-DD).")
_BY = click.option("--by", type=TEXT, help="Who registers it (default: --analyst).")


@click.group()
def blocks() -> None:
    """Tables made of blocks: register a block, replace one, list them."""


def _register(  # noqa: PLR0917 - a command's arguments, passed on
    config: Config,
    table: str,
    block: str,
    period: tuple[str, str],
    files: tuple[Path, ...],
    replaces: str | None,
    by: str | None,
) -> None:
    policy = config.policy()
    ledger = open_ledger(policy)
    try:
        # The command's paths are the working folder's, not the policy's.
        paths = [path.absolute() for path in files]
        done = register(policy, ledger, table, block, period=period, paths=paths,
                        replaces=replaces, by=by or config.analyst)  # fmt: skip
    finally:
        ledger.close()
    what = f"replaces block {replaces}" if replaces else "added"
    click.echo(
        f"record {done.seq}: block {done.id} of table {done.table}, {done.start.isoformat()} "
        f"to {done.end.isoformat()}, {len(done.files)} file(s): {what}"
    )
    if policy.periods is not None and policy.periods.table == done.table:
        release_views(config)


def release_views(config: Config) -> None:
    """The values of every view that a new block completes, released as the block arrives
    (``dpsql.session.views.release``; a view not released now is at its next read)."""
    try:
        session = Session(config.policy(), config.analyst)
    except DpsqlError as exc:
        click.echo(f"views: not released now ({type(exc).__name__}); each is at its next read")
        return
    try:
        for view in views_of(session).values():
            try:
                made = release(session, view)
            except DpsqlError as exc:
                click.echo(f"view {view.name}: not released ({type(exc).__name__}: {exc})")
                continue
            if made:
                click.echo(f"view {view.name}: {made} value(s) released")
    finally:
        session.close()


@blocks.command("add")
@click.argument("table", type=TEXT)
@click.argument("block", type=TEXT)
@_FILES
@_START
@_END
@_BY
@pass_config
def add_block(  # noqa: PLR0917 - click passes every option
    config: Config, table: str, block: str, files: tuple[Path, ...], start: str, end: str,
    by: str | None,
) -> None:  # fmt: skip
    """Register BLOCK of TABLE: FILES hold its rows from --start to the day before --end."""
    _register(config, table, block, (start, end), files, None, by)


@blocks.command("replace")
@click.argument("table", type=TEXT)
@click.argument("old", type=TEXT)
@click.argument("block", type=TEXT)
@_FILES
@_START
@_END
@_BY
@pass_config
def replace_block(  # noqa: PLR0917 - click passes every option
    config: Config, table: str, old: str, block: str, files: tuple[Path, ...], start: str,
    end: str, by: str | None,
) -> None:  # fmt: skip
    """Register BLOCK of TABLE as the correction of block OLD (its releases are retired)."""
    _register(config, table, block, (start, end), files, old, by)


@blocks.command("remove")
@click.argument("table", type=TEXT)
@click.argument("block", type=TEXT)
@_BY
@pass_config
def remove_block(config: Config, table: str, block: str, by: str | None) -> None:
    """Remove BLOCK of TABLE without a replacement (its data no longer kept): no query reads it
    again, and its releases are retired; its files may then be deleted."""
    policy = config.policy()
    ledger = open_ledger(policy)
    try:
        seq = remove(policy, ledger, table, block, by or config.analyst)
    finally:
        ledger.close()
    click.echo(f"record {seq}: block {block} of table {table.lower()}: removed")


def block_lines(records: list[Record], listed: BlockList) -> list[str]:
    """Each block (active, replaced or removed) and the charges whose answers read a block
    that is not active any more."""
    gone = listed.replaced
    removed = {(t, i): seq for t, i, seq in listed.removed}
    lines = []
    for b in listed.registered:
        key = (b.table, b.id)
        state = "active"
        if key in gone:
            state = f"replaced by {gone[key].id}"
        elif key in removed:
            state = f"removed (record {removed[key]})"
        fix = f", replaces {b.replaces}" if b.replaces else ""
        lines.append(
            f"{b.table} {b.id}: {b.start.isoformat()} to {b.end.isoformat()}, "
            f"{len(b.files)} file(s), record {b.seq}{fix}; {state}"
        )
    for record, hit in retired(records, listed):
        read = ", ".join(f"{t} {i}" for t, i in hit)
        lines.append(f"retired: record {record.seq} ({record.kind}) read block(s) {read}, gone")
    return lines


@blocks.command("list")
@pass_config
def list_blocks(config: Config) -> None:
    """Every registered block, and the releases retired by a replacement."""
    ledger = open_ledger(config.policy())
    try:
        records = ledger.records()
    finally:
        ledger.close()
    lines = block_lines(records, block_list(records))
    click.echo("\n".join(lines) if lines else "no blocks registered")
