"""The ledger's records and their hash chain.

Every record (a charge, a release, a cache re-serve, a budget top-up or allocation) carries the
SHA-256 of its canonical JSON and of the record before it, so editing or dropping any record
breaks the chain. ``_chain`` verifies rows read from the file as the continuation of the records
verified so far; the ledger's identity, which is outside the chain, is hashed for its anchor
(``_identity_digest``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dpsql.errors import LedgerError

__all__ = ["GENESIS", "Record", "canonical", "record_hash"]

GENESIS = "0" * 64


@dataclass(frozen=True)
class Record:
    """One ledger record; ``payload`` is plain JSON data."""

    seq: int
    time: float
    kind: str
    analyst: str | None
    payload: Mapping[str, Any]
    prev: str
    hash: str


def canonical(data: Any) -> str:
    """The canonical JSON of ``data``: sorted keys, no spaces, exact."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def record_hash(prev: str, fields: tuple[int, float, str, str | None, str]) -> str:
    """SHA-256 of the previous hash and the record's (seq, time, kind, analyst, payload)."""
    seq, when, kind, analyst, payload = fields
    body = canonical([prev, seq, repr(when), kind, analyst, payload])
    return hashlib.sha256(body.encode()).hexdigest()


def _chain(
    rows: list[tuple[Any, ...]], records: list[Record], raw: list[tuple[Any, ...]]
) -> tuple[list[Record], list[tuple[Any, ...]]]:
    """Verify ``rows`` as the continuation of the verified ``records`` (their raw rows ``raw``)
    and append them to both lists in place; raises LedgerError on the first broken link."""
    prev = records[-1].hash if records else GENESIS
    for expected, (seq, when, kind, analyst, payload, link, digest) in enumerate(
        rows, len(records) + 1
    ):
        if seq != expected or link != prev:
            raise LedgerError(f"the ledger's chain is broken at record {expected}")
        if record_hash(prev, (seq, when, kind, analyst, payload)) != digest:
            raise LedgerError(f"ledger record {seq} was altered")
        try:
            body = json.loads(payload)
        # A chain forged over a payload that is not JSON, or nests past json's recursion limit.
        except (TypeError, ValueError, RecursionError):
            raise LedgerError(f"ledger record {seq} is malformed: fail closed") from None
        records.append(Record(seq, when, kind, analyst, body, link, digest))
        raw.append((seq, when, kind, analyst, payload, link, digest))
        prev = digest
    return records, raw


def _identity_digest(identity: Mapping[str, str]) -> str:
    return hashlib.sha256(canonical(dict(identity)).encode()).hexdigest()
