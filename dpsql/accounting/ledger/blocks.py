"""Tables made of blocks in the ledger: the records that register them, and what they retire.

The owner registers each block of a table under ``data.blocks`` as a ledger record
(``BLOCK_RECORD``, written by ``dpsql.session.blocks``; the block: ``dpsql.policy.blocks``), so
that every process and server reads the same list (``block_list``). ``retired``: the release
records that read a block a correction replaced or the owner removed, never served again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dpsql.accounting.ledger.chain import Record
from dpsql.policy.blocks import Block, BlockList

__all__ = ["BLOCK_KINDS", "BLOCK_RECORD", "BLOCK_REMOVAL", "block_list", "retired"]

BLOCK_RECORD = "block"
# A block removed without a replacement (data the owner no longer keeps): ``{table, id}``.
BLOCK_REMOVAL = "block_removal"
BLOCK_KINDS = (BLOCK_RECORD, BLOCK_REMOVAL)


def block_list(records: Sequence[Record]) -> BlockList:
    registered = tuple(Block.of(r.payload, r.seq) for r in records if r.kind == BLOCK_RECORD)
    removed = tuple((str(r.payload["table"]), str(r.payload["id"]), r.seq)
                    for r in records if r.kind == BLOCK_REMOVAL)  # fmt: skip
    return BlockList(registered, removed)


def retired(
    records: Sequence[Record], blocks: BlockList
) -> list[tuple[Record, list[tuple[str, str]]]]:
    """Each release record that read a replaced or removed block, and the (table, id) of those
    blocks: never served again."""
    gone = blocks.gone
    out = []
    for record in records:
        read: Mapping[str, Sequence[str]] = record.payload.get("blocks") or {}
        if record.kind in BLOCK_KINDS or not isinstance(read, Mapping):
            continue
        hit = [(t, b) for t, ids in sorted(read.items()) for b in ids if (t, b) in gone]
        if hit:
            out.append((record, hit))
    return out
