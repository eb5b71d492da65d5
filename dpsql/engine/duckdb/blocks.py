"""The files of the tables made of blocks, as an engine binds them when it connects.

A table under ``data.blocks`` is the union of its active blocks (``dpsql.accounting.ledger.
blocks``): the engine binds each block's files as registered, through a link to the very file
(``dpsql.engine.duckdb.snapshots``), and reads them through one view that keeps each block's
rows within its period (``dpsql.engine.duckdb.views.block_source``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path

import duckdb

from dpsql.engine.duckdb.snapshots import snapshot
from dpsql.errors import DataChangedError, PolicyError
from dpsql.policy import Policy
from dpsql.policy.blocks import BlockList
from dpsql.policy.files import FileIdentity, identify, regular_file

__all__ = ["bind_blocks", "parquet_columns"]


def bind_blocks(
    policy: Policy, blocks: BlockList, bound: list[FileIdentity], links: list[Path]
) -> dict[str, list[tuple[list[Path], dt.date, dt.date]]]:
    """Each table made of blocks that has any: its active blocks' files (links to the very
    files registered, ``snapshots``) and periods. A file that is no longer the one
    registered is refused: a block is never rewritten, a correction replaces it."""
    out: dict[str, list[tuple[list[Path], dt.date, dt.date]]] = {}
    for name in policy.data.blocks:
        for block in blocks.active(name):
            paths = []
            for registered in block.files:
                info = regular_file(registered.path, f"block {block.id} of table {name}")
                if not registered.same_file(info):
                    raise DataChangedError(
                        f"a file of block {block.id} of table {name} changed since it was "
                        "registered; a block is never rewritten: register a new block that "
                        "replaces it (dpsql blocks replace)"
                    )
                now = identify(name, registered.path, info)
                bound.append(now)
                link = snapshot(now)
                if link is not None:
                    links.append(link)
                paths.append(link or registered.path)
            out.setdefault(name, []).append((paths, block.start, block.end))
    return out


def parquet_columns(paths: Sequence[Path], table: str) -> tuple[tuple[str, str], ...]:
    """The columns (name, DuckDB type) every file's Parquet footer declares, alike in each;
    a file whose columns differ, or that is not Parquet, is refused naming the file."""
    con = duckdb.connect(":memory:", config={"autoload_known_extensions": False,
                                              "autoinstall_known_extensions": False})  # fmt: skip
    try:
        found: tuple[tuple[str, str], ...] | None = None
        for path in paths:
            literal = "'" + str(path).replace("'", "''") + "'"
            try:
                rows = con.execute(f"DESCRIBE SELECT * FROM read_parquet({literal})").fetchall()
            except duckdb.Error:
                raise PolicyError(f"a file of the block for table {table} cannot be read as "
                                  f"Parquet: {path}") from None  # fmt: skip
            columns = tuple(sorted((str(r[0]).lower(), str(r[1])) for r in rows))
            if found is not None and columns != found:
                raise PolicyError(f"the files of a block of table {table} declare different "
                                  f"columns: {path}")  # fmt: skip
            found = columns
        assert found is not None
        return found
    finally:
        con.close()
