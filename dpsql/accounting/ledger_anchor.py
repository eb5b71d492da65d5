"""The ledger's anchor file: the head of the chain, kept outside the ledger.

The chain alone cannot notice a truncated tail, an older copy put back, or a deleted file: the
head of the chain is therefore also written *outside* the ledger, to an anchor file (by default
beside it; put it on storage the ledger's writers cannot roll back). The anchor has two slots,
written in turn in place with one sync each (``_write_anchor``), so a torn write leaves the
previous head.
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

from dpsql.accounting.ledger_chain import _identity_digest, canonical
from dpsql.accounting.ledger_files import _reason
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


# The anchor holds two fixed slots, written in turn in place (slot seq % 2) with one fdatasync:
# a write torn by a crash spoils only its own slot, and the other still holds an earlier head
# of the same chain, which the ledger extends (consistent, as after a crash before the write).
_SLOT = 512


def _slot(data: Mapping[str, Any]) -> bytes:
    """One anchor slot: the anchor's canonical JSON with its own digest, padded to _SLOT."""
    body = dict(data)
    body["check"] = hashlib.sha256(canonical(body).encode()).hexdigest()
    text = canonical(body).encode()
    if len(text) >= _SLOT:
        raise LedgerError("the ledger's anchor does not fit its slot")
    return text + b" " * (_SLOT - 1 - len(text)) + b"\n"


def _parse_slot(part: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(part.decode("utf-8"))
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    check = data.pop("check", None)
    if check != hashlib.sha256(canonical(data).encode()).hexdigest():
        return None  # torn or altered: the other slot decides
    seq = data.get("seq")
    return data if isinstance(seq, int) and not isinstance(seq, bool) else None


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
        if len(text) == 2 * _SLOT and text[_SLOT - 1 : _SLOT] == b"\n":
            slots = [d for d in (_parse_slot(text[:_SLOT]), _parse_slot(text[_SLOT:])) if d]
            if not slots:
                raise LedgerError("the ledger's anchor is malformed: fail closed")
            return max(slots, key=lambda d: int(d["seq"]))
        data = json.loads(text.decode("utf-8"))  # an anchor written before the slots
    except (OSError, ValueError):
        raise LedgerError(f"the ledger's anchor {path} cannot be read: fail closed") from None
    if not isinstance(data, dict):
        raise LedgerError("the ledger's anchor is malformed: fail closed")
    return data


def _write_anchor(path: Path, data: Mapping[str, Any]) -> None:
    """Write the anchor's slot for ``data["seq"]`` in place and fdatasync it; the first time (or
    over an anchor of the older single-JSON form) replace the file atomically with both slots:
    write, fsync, rename, fsync the folder."""
    slot = _slot(data)
    try:
        # O_NONBLOCK: a FIFO put in the anchor's place fails the open instead of hanging it.
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        fd = None
    except OSError as exc:
        raise LedgerError(
            f"the ledger's anchor {path} could not be written: {_reason(exc)}"
        ) from None
    if fd is not None:
        try:
            info = os.fstat(fd)
            if stat.S_ISREG(info.st_mode) and info.st_size == 2 * _SLOT:
                os.pwrite(fd, slot, (int(data["seq"]) % 2) * _SLOT)
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


def read_anchor(path: Path) -> dict[str, Any]:
    """The anchor's newest valid head (``ledger_id``, ``identity``, ``seq``, ``head``)."""
    return _read_anchor(path)
