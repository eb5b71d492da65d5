"""Tables made of blocks: a block, and the list of a table's blocks.

A table the policy declares under ``data.blocks`` is the union of its blocks: each a set of
Parquet files holding the rows of one period [start, end) of the table's period column, which
the owner registers in the ledger as the data grow (``dpsql.session.blocks``; the records:
``dpsql.accounting.ledger.blocks``). A block holds each file's identity (``dpsql.policy.files``)
and the columns its footer declares, and the block it replaces, if any.

A block is never rewritten: a correction is a new block that names the one it replaces. The
list (``BlockList``) is the registered blocks less the replaced ones, in registration order; a
release keyed by a replaced block's id is never served again (no plan reads that id). Nothing
here reads a row.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpsql.policy.files import FileIdentity

__all__ = ["BLOCK_ID", "Block", "BlockList", "iso_date"]

# A block's id: the owner's name for it (a month, a batch number), printed in plans and reports.
BLOCK_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def iso_date(text: str) -> dt.date | None:
    """A date written YYYY-MM-DD (the one spelling DuckDB and Python read alike), else None."""
    if not _DATE.match(text):
        return None
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        return None


def _identity(f: FileIdentity) -> dict[str, Any]:
    return {"path": str(f.path), "device": f.device, "inode": f.inode, "size": f.size,
            "mtime_ns": f.mtime_ns}  # fmt: skip


@dataclass(frozen=True)
class Block:
    """One registered block: its files hold the rows of ``table`` whose period column lies in
    [start, end); the engine keeps only those (``dpsql.engine.duckdb.views``)."""

    table: str
    id: str
    start: dt.date
    end: dt.date  # exclusive
    files: tuple[FileIdentity, ...]
    columns: tuple[tuple[str, str], ...]  # (name, DuckDB type) as the files' footers declare
    replaces: str | None = None
    seq: int = 0  # the ledger record's sequence number

    def payload(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "id": self.id,
            "start": self.start.isoformat(),
            "end": self.end.isoformat(),
            "files": [_identity(f) for f in self.files],
            "columns": [list(c) for c in self.columns],
            "replaces": self.replaces,
        }

    @classmethod
    def of(cls, p: Mapping[str, Any], seq: int) -> Block:
        """The block a ledger record's payload registers (``payload``'s form)."""
        files = tuple(
            FileIdentity(str(p["table"]), Path(f["path"]), int(f["device"]), int(f["inode"]),
                         int(f["size"]), int(f["mtime_ns"]))
            for f in p["files"]
        )  # fmt: skip
        start, end = iso_date(str(p["start"])), iso_date(str(p["end"]))
        assert start is not None and end is not None  # written by Block.payload
        columns = tuple((str(n), str(t)) for n, t in p["columns"])
        replaces = p.get("replaces")
        return cls(str(p["table"]), str(p["id"]), start, end, files, columns,
                   None if replaces is None else str(replaces), seq)  # fmt: skip

    def overlaps(self, other: Block) -> bool:
        return self.start < other.end and other.start < self.end


@dataclass(frozen=True)
class BlockList:
    """Every block registered, in order, and the blocks removed without a replacement (the
    owner's retention: (table, id, record)); the active ones (neither replaced nor removed)."""

    registered: tuple[Block, ...] = ()
    removed: tuple[tuple[str, str, int], ...] = ()

    @property
    def replaced(self) -> dict[tuple[str, str], Block]:
        """(table, id) of each replaced block -> the block that replaced it."""
        return {(b.table, b.replaces): b for b in self.registered if b.replaces is not None}

    @property
    def gone(self) -> set[tuple[str, str]]:
        """(table, id) of every block no plan reads any more: replaced or removed."""
        return set(self.replaced) | {(t, i) for t, i, _ in self.removed}

    def active(self, table: str) -> tuple[Block, ...]:
        gone = self.gone
        return tuple(b for b in self.registered if b.table == table and (table, b.id) not in gone)

    def token(self, tables: Iterable[str]) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """What a plan over ``tables`` depends on: each one's active blocks (their records)."""
        return tuple((t, tuple(b.seq for b in self.active(t))) for t in sorted(tables))
