"""The ledger's anchor file: the head of the chain, kept outside the ledger.

The chain alone cannot notice a truncated tail, an older copy put back, or a deleted file: the
head of the chain is therefore also written *outside* the ledger, to an anchor file (by default
beside it; put it on storage the ledger's writers cannot roll back). The anchor has two slots,
written in turn in place with one sync each (``_write_anchor``), so a torn write leaves the
previous head. A third slot, the tail (``_write_tail``), names the records appended unsynced
after that head (post-processing only: ``Ledger.append``), so that an edit of them is caught
while their loss in a crash is not an error.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dpsql.accounting.ledger.chain import _identity_digest, canonical
from dpsql.accounting.ledger.files import _reason
from dpsql.errors import LedgerError

__all__ = ["MAX_ANCHOR_BYTES", "anchor_path", "read_anchor"]


def anchor_path(path: Path) -> Path:
    return path.with_name(path.name + ".anchor")


def _anchor(identity: Mapping[str, str], seq: int, head: str) -> dict[str, Any]:
    """The anchor: which ledger, the digest of its identity, and the head of its chain."""
    return {
        "ledger_id": identity["ledger_id"],
        "identity": _identity_digest(identity),
        "seq": seq,
        "head": head,
    }


# An anchor is a line of JSON of about two hundred bytes; no more than this is ever read (the
# policy names its path, which could be a FIFO or /dev/zero).
MAX_ANCHOR_BYTES = 1 << 16


# The anchor holds two fixed slots, written in turn in place (the one with the older head) with
# one fdatasync: a write torn by a crash spoils only its own slot, and the other still holds an
# earlier head of the same chain, which the ledger extends (consistent, as after a crash before
# the write). A file of two slots or more (an anchor of the older form is one short line).
_SLOT = 512


def _slot(data: Mapping[str, Any]) -> bytes:
    """One anchor slot: the anchor's canonical JSON with its own digest, padded to _SLOT."""
    body = dict(data)
    body["check"] = hashlib.sha256(canonical(body).encode()).hexdigest()
    text = canonical(body).encode()
    if len(text) >= _SLOT:
        raise LedgerError("the ledger's anchor does not fit its slot")
    return text + b" " * (_SLOT - 1 - len(text)) + b"\n"


def _seqs(both: bytes) -> list[int]:
    """The two slots' head seqs (-1 for a torn or invalid one)."""
    return [
        int((_parse_slot(both[i * _SLOT : (i + 1) * _SLOT]) or {}).get("seq", -1)) for i in (0, 1)
    ]


def _older(seqs: list[int]) -> int:
    """The slot a synced write replaces: a torn or invalid one, else the one with the older
    head, so that the other keeps the newest head through a torn write (by seq parity, two
    charges with a release between them would both take one slot)."""
    return 0 if seqs[0] <= seqs[1] else 1


def _parse_slot(part: bytes, field: str = "seq") -> dict[str, Any] | None:
    try:
        data = json.loads(part.decode("utf-8"))
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    check = data.pop("check", None)
    if check != hashlib.sha256(canonical(data).encode()).hexdigest():
        return None  # torn or altered: the other slot decides
    seq = data.get(field)
    return data if isinstance(seq, int) and not isinstance(seq, bool) else None


# The tail slot, after the two: the ledger's id, the synced head's seq it follows ("base") and
# the hashes of the records appended unsynced since, in order; written in place without a sync
# (the next synced write's fdatasync takes it along). A record it names that is present must
# have that hash; one that is absent was lost with the unsynced WAL (or removed: losing a
# post-processing record costs only a fresh charge later). At most MAX_TAIL: the next is synced.
_TAIL = 2 * _SLOT
MAX_TAIL = 4


def _tail_slot(ledger_id: str, base: int, heads: list[str]) -> bytes:
    return _slot({"ledger_id": ledger_id, "base": base, "heads": heads})


def _parse_tail(part: bytes, anchor: Mapping[str, Any]) -> list[str]:
    """The tail's hashes if the slot is whole and follows ``anchor``'s head; else none (a torn
    or stale tail names nothing: a synced write since has moved the head past it)."""
    data = _parse_slot(part, "base")
    if data is None or data.get("ledger_id") != anchor.get("ledger_id"):
        return []
    heads = data.get("heads")
    if data["base"] != anchor.get("seq") or not isinstance(heads, list):
        return []
    if len(heads) > MAX_TAIL or not all(isinstance(h, str) for h in heads):
        return []
    return heads


def _read_anchor(path: Path) -> dict[str, Any]:
    try:
        # Non-blocking, so that a FIFO without a writer cannot hang the open; then only a
        # regular file of at most MAX_ANCHOR_BYTES is read.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise ValueError("not a regular file")
            text = handle.read(MAX_ANCHOR_BYTES + 1)
        if len(text) > MAX_ANCHOR_BYTES:
            raise ValueError("too long")
        # Two slots, and the tail slot once an unsynced record was appended (a crash while
        # the file grew may leave it short: then it names nothing).
        if 2 * _SLOT <= len(text) <= 3 * _SLOT:
            first, second = _parse_slot(text[:_SLOT]), _parse_slot(text[_SLOT : 2 * _SLOT])
            slots = [d for d in (first, second) if d]
            if not slots:
                raise LedgerError("the ledger's anchor is malformed: fail closed")
            newest = max(slots, key=lambda d: int(d["seq"]))
            newest["tail"] = _parse_tail(text[_TAIL:], newest) if len(text) == 3 * _SLOT else []
            return newest
        data = json.loads(text.decode("utf-8"))  # an anchor written before the slots
    except (OSError, ValueError):
        raise LedgerError(f"the ledger's anchor {path} cannot be read: fail closed") from None
    if not isinstance(data, dict):
        raise LedgerError("the ledger's anchor is malformed: fail closed")
    data.pop("tail", None)  # that form has no tail slot (and so no unsynced record)
    return data


def _write_anchor(path: Path, data: Mapping[str, Any]) -> None:
    """Write the anchor's slot for ``data["seq"]`` in place and fdatasync it; the first time (or
    over an anchor of the older single-JSON form) replace the file atomically with both slots:
    write, fsync, rename, fsync the folder."""
    slot = _slot(data)
    try:
        # O_NONBLOCK: a FIFO put in the anchor's place fails the open instead of hanging it.
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
    except FileNotFoundError:
        fd = None
    except OSError as exc:
        raise LedgerError(
            f"the ledger's anchor {path} could not be written: {_reason(exc)}"
        ) from None
    if fd is not None:
        try:
            info = os.fstat(fd)
            if stat.S_ISREG(info.st_mode) and 2 * _SLOT <= info.st_size <= 3 * _SLOT:
                seqs = _seqs(os.pread(fd, 2 * _SLOT, 0))
                if max(seqs) >= data["seq"]:
                    return  # this head or a later one is anchored (by a group synced after)
                os.pwrite(fd, slot, _older(seqs) * _SLOT)
                os.fdatasync(fd)
                return
        except OSError as exc:
            raise LedgerError(
                f"the ledger's anchor {path} could not be written: {_reason(exc)}"
            ) from None
        finally:
            os.close(fd)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as handle:
            handle.write(slot + slot)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise LedgerError(
            f"the ledger's anchor {path} could not be written: {_reason(exc)}"
        ) from None


def _anchored_seq(path: Path) -> int:
    """The seq of the newest head in the anchor's slots; -1 where there is none to read (an
    anchor of the older form, or one that cannot be read: the caller then syncs, and the write
    that follows reports the trouble)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return -1
            both = os.pread(fd, 2 * _SLOT, 0)
        finally:
            os.close(fd)
    except OSError:
        return -1
    return max(_seqs(both)) if len(both) == 2 * _SLOT else -1


def _write_tail(path: Path, ledger_id: str, base: int, heads: list[str], *, sync: bool) -> None:
    """Write the tail slot in place (after ``_read_anchor`` found the slotted form): unsynced
    for a new unsynced record, synced when it must shrink before a record takes the place of
    one it names (a crash lost that one: the tail must not be ahead of the ledger for long)."""
    slot = _tail_slot(ledger_id, base, heads)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError("not a regular file")
            os.pwrite(fd, slot, _TAIL)
            if sync:
                os.fdatasync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise LedgerError(
            f"the ledger's anchor {path} could not be written: {_reason(exc)}"
        ) from None


def read_anchor(path: Path) -> dict[str, Any]:
    """The anchor's newest valid head (``ledger_id``, ``identity``, ``seq``, ``head``) and, in
    the slotted form, ``tail``: the hashes of the unsynced records after it."""
    return _read_anchor(path)
