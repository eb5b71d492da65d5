"""The report's section on tables made of blocks: each block, what read it, what was retired.

For the owner: every registered block (``dpsql.accounting.ledger.blocks``) with its period, its
files and whether a correction replaced it; the charges whose answers read it (their ledger
records keep the blocks they read, ``dpsql.session.plans.ledger_details``); and the charges
retired by a replacement (never served again).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dpsql.accounting.ledger.blocks import block_list, retired
from dpsql.accounting.ledger.chain import Record

__all__ = ["blocks_data", "md_blocks"]


def blocks_data(records: Sequence[Record]) -> list[dict[str, Any]]:
    """Each registered block, in order, as JSON-ready data."""
    listed = block_list(records)
    gone = listed.replaced
    removed = {(t, i): seq for t, i, seq in listed.removed}
    readers: dict[tuple[str, str], list[int]] = {}
    for record in records:
        read = record.payload.get("blocks") if record.kind == "charge" else None
        for table, ids in (read or {}).items():
            for block in ids:
                readers.setdefault((table, block), []).append(record.seq)
    retired_by: dict[tuple[str, str], list[int]] = {}
    for record, hit in retired(records, listed):
        for key in hit:
            retired_by.setdefault(key, []).append(record.seq)
    return [
        {
            "table": b.table,
            "id": b.id,
            "start": b.start.isoformat(),
            "end": b.end.isoformat(),
            "files": len(b.files),
            "record": b.seq,
            "replaces": b.replaces,
            "replaced_by": gone[(b.table, b.id)].id if (b.table, b.id) in gone else None,
            "removed_by_record": removed.get((b.table, b.id)),
            "read_by_charges": readers.get((b.table, b.id), []),
            "retired_charges": retired_by.get((b.table, b.id), []),
        }
        for b in listed.registered
    ]


def md_blocks(data: dict[str, Any]) -> list[str]:
    """The Markdown section, when the data set has tables made of blocks."""
    found = data.get("blocks")
    if found is None:
        return []
    out = ["## Blocks", ""]
    if not found:
        return [*out, "No block is registered yet."]
    out.append("| table | block | period | files | record | state | read by charges |")
    out.append("|---|---|---|---|---|---|---|")
    for b in found:
        state = "active" if b["replaced_by"] is None else f"replaced by {b['replaced_by']}"
        if b.get("removed_by_record") is not None:
            state = f"removed (record {b['removed_by_record']})"
        if b["retired_charges"]:
            state += " (retired charges " + ", ".join(map(str, b["retired_charges"])) + ")"
        readers = ", ".join(map(str, b["read_by_charges"])) or "none"
        out.append(
            f"| {b['table']} | {b['id']} | {b['start']} to {b['end']} | {b['files']} | "
            f"{b['record']} | {state} | {readers} |"
        )
    return out
