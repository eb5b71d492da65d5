"""The durable ledger: an append-only, hash-chained, anchored record of every privacy decision.

SQLite in WAL mode with ``synchronous=FULL``: a commit is on disk when it returns, several
processes may share the file, and a transaction is atomic (a record of post-processing only may
be appended unsynced: ``Ledger.append``). Every record is chained to the one
before it by its SHA-256 (``ledger_chain``), and the chain's head is also written outside the
ledger, to an anchor file (``ledger_anchor``; the other files beside it: ``ledger_files``).
Opening the ledger checks the whole chain against the anchor and fails closed on any mismatch.
This module holds the ``Ledger`` and re-exports the names once defined here.

Threat model: this detects accidental corruption and tampering by anyone who can change the
ledger file but not also rewrite the anchor consistently (recomputing a valid chain needs no
secret, so an attacker who controls both files can forge both). It never resets the budget: a
missing, truncated, corrupted or tampered ledger stops all answering with ``LedgerError``.

Check-and-charge is one ``BEGIN IMMEDIATE`` transaction: the caller's decision runs on the
records committed so far by every process, so concurrent clients can never together overspend.

Cost: one SQLite connection per Ledger and process; an append reads and hashes only the records
appended since the last look, O(1) amortised in the history's length (``ledger_catch_up``: how,
and the trade-off of its full comparisons).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from dpsql.accounting.ledger.anchor import (
    MAX_TAIL,
    _anchor,
    _anchored_seq,
    _read_anchor,
    _write_anchor,
    _write_tail,
    anchor_path,
)
from dpsql.accounting.ledger.catch_up import CatchUp, _data_version
from dpsql.accounting.ledger.chain import (
    GENESIS,
    Record,
    _chain,
    _identity_digest,
    canonical,
    record_hash,
)
from dpsql.accounting.ledger.files import (
    _connect,
    _exists,
    _file_id,
    _file_lock,
    _reason,
    _sidecars,
    _sync_wal,
)
from dpsql.accounting.ledger.group import group_for, in_background
from dpsql.errors import BudgetExceededError, LedgerError

__all__ = ["BUDGET_RECORD", "FORMAT", "Ledger"]

FORMAT = 1
# The first record of every ledger: the budget's caps, its deciding filter and the filter's
# fixed parameters, written by ``dpsql init``. Sessions take the caps from it, never from the
# policy they were opened with (a policy that disagrees is refused), so editing a policy file
# cannot raise the cap of a ledger; only recorded owner acts (``budget_add``) can.
BUDGET_RECORD = "budget"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS records (
    seq INTEGER PRIMARY KEY,
    time REAL NOT NULL,
    kind TEXT NOT NULL,
    analyst TEXT,
    payload TEXT NOT NULL,
    prev TEXT NOT NULL,
    hash TEXT NOT NULL
);
"""


class Ledger(CatchUp):
    """A ledger file and its anchor. Thread-safe; safe across processes."""

    durable = True

    def __init__(self, path: Path, anchor: Path | None = None):
        self.path = Path(path)
        self.anchor = Path(anchor) if anchor is not None else anchor_path(self.path)
        self._anchor_real = os.path.realpath(self.anchor)  # which group commits with this one
        self._lock = threading.Lock()
        self._cache: list[Record] = []
        self._rows: list[tuple[Any, ...]] = []  # the raw rows of _cache, as verified
        # One connection per Ledger and process, used under _lock only (hence shared across
        # threads); a forked child opens its own (SQLite forbids carrying one across fork).
        self._con: sqlite3.Connection | None = None
        self._pid = 0
        self._file: tuple[int, int] | None = None  # (device, inode) of the file verified
        self._version = -1  # PRAGMA data_version after this Ledger's last read or commit
        self._checked = 0  # records verified by the last full recheck
        self._failed: str | None = None  # why the history stopped verifying, once it has
        self._size = 0  # the file's size at the last check of its tail on disk
        try:
            self.identity = self._open()  # verifies the whole chain against the anchor
        except LedgerError:
            self._drop()  # a ledger that failed to open holds no connection (nor SQLite's maps)
            raise

    # -- creation and opening -------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        path: Path,
        dataset: str,
        anchor: Path | None = None,
        *,
        budget: Mapping[str, Any],
        by: str | None = None,
    ) -> Ledger:
        """``dpsql init``: a new ledger for ``dataset`` whose first record is ``budget`` (the
        caps and the filter, see ``BUDGET_RECORD``); refuses to overwrite anything."""
        path, anchor = Path(path), Path(anchor) if anchor is not None else anchor_path(Path(path))
        if _exists(path) or _exists(anchor):
            raise LedgerError(f"refusing to create a ledger over an existing file: {path}")
        identity = {
            "ledger_id": secrets.token_hex(16),
            "dataset": dataset,
            "format": str(FORMAT),
            "created": repr(time.time()),
            # The secret salt of the keyed hash that picks a unit's groups, shared by every
            # session of the data set so that cached and fresh answers bound the same rows.
            "salt": str(secrets.randbits(62)),
        }
        when = time.time()
        body = canonical(dict(budget))
        digest = record_hash(GENESIS, (1, when, BUDGET_RECORD, by, body))
        try:
            # The ledger holds the salt and every query and answer: readable by its owner only.
            path.touch(mode=0o600, exist_ok=False)
            path.chmod(0o600)
            con = _connect(path)
            try:
                con.executescript(_SCHEMA)
                # One transaction: a ledger never exists without its budget record.
                with con:
                    con.executemany("INSERT INTO meta VALUES (?, ?)", list(identity.items()))
                    con.execute(
                        "INSERT INTO records VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (1, when, BUDGET_RECORD, by, body, GENESIS, digest),
                    )
            finally:
                con.close()
            _write_anchor(anchor, _anchor(identity, 1, digest))
            anchor.chmod(0o600)
        except (OSError, sqlite3.Error, LedgerError) as exc:
            # Nothing was recorded yet: remove what this call made, so init can run again.
            if not isinstance(exc, FileExistsError):
                for made in (path, anchor, *_sidecars(path)):
                    with contextlib.suppress(OSError):
                        made.unlink()
            raise LedgerError(f"cannot create the ledger {path}: {_reason(exc)}") from None
        return cls(path, anchor)

    def _open(self) -> dict[str, str]:
        if not _exists(self.anchor):
            raise LedgerError(f"the ledger's anchor is missing: {self.anchor}; run dpsql init")
        if not _exists(self.path):
            raise LedgerError("the ledger file is missing while its anchor exists: fail closed")
        try:
            con = self._connection()
            identity = dict(con.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.Error:
            self._drop()
            raise LedgerError(f"the ledger file {self.path} cannot be read: fail closed") from None
        anchor = _read_anchor(self.anchor)
        if identity.get("ledger_id") != anchor.get("ledger_id"):
            raise LedgerError("the ledger does not match its anchor (another ledger's file?)")
        # The identity (data set, secret salt) is outside the chain; the anchor holds its digest.
        if _identity_digest(identity) != anchor.get("identity"):
            raise LedgerError("the ledger's identity differs from its anchor: fail closed")
        self._cache, self._rows = _chain(self._read(con, 1), [], [])
        self._version, self._checked = _data_version(con), len(self._cache)
        self._check(self._cache, anchor)
        return identity

    # -- connections ----------------------------------------------------------------------------
    def _connection(self) -> sqlite3.Connection:
        """This process's connection, opened on first use (and again after a fork or a failed
        write); the file it opened is remembered, so that a file put in its place is noticed."""
        if self._con is None or self._pid != os.getpid():
            # A connection inherited over fork is abandoned, never closed: closing it could
            # release the parent's locks (SQLite, "How To Corrupt", section 2.6).
            try:
                self._con, self._pid = _connect(self.path), os.getpid()
            except sqlite3.Error:
                self._con = None
                raise LedgerError(
                    f"the ledger file {self.path} cannot be opened: fail closed"
                ) from None
            self._file = _file_id(self.path)
            self._version = -1  # unknown: the next read rechecks everything
        elif _file_id(self.path) != self._file:
            # The path now names another file (deleted, replaced by a copy): this connection
            # still sees the old one, whose chain would verify. Fail closed.
            raise LedgerError("the ledger file was replaced or removed under a running session")
        return self._con

    def _drop(self) -> None:
        """Forget the connection after a failure: the next call opens a fresh one."""
        if self._con is not None and self._pid == os.getpid():
            with contextlib.suppress(sqlite3.Error):
                self._con.close()
        self._con = None

    def _read(self, con: sqlite3.Connection, first: int) -> list[tuple[Any, ...]]:
        try:
            rows = con.execute("SELECT * FROM records WHERE seq >= ? ORDER BY seq", (first,))
            return [tuple(r) for r in rows.fetchall()]
        except sqlite3.Error:
            self._drop()
            raise LedgerError(f"the ledger file {self.path} cannot be read: fail closed") from None

    # -- verification ---------------------------------------------------------------------------
    def _recheck(self) -> None:
        """The whole history compared byte for byte with what was verified, over a connection of
        its own (a long-lived one could answer from pages it cached before an edit)."""
        try:
            fresh = _connect(self.path)
            try:
                rows = [tuple(r) for r in fresh.execute("SELECT * FROM records ORDER BY seq")]
            finally:
                fresh.close()
        except sqlite3.Error:
            raise LedgerError(f"the ledger file {self.path} cannot be read: fail closed") from None
        known = len(self._rows)
        if rows[:known] != self._rows:
            raise LedgerError("the ledger's history changed under a running session")
        _chain(rows[known:], self._cache, self._rows)
        self._checked = len(self._cache)

    def verify(self) -> int:
        """Check the whole chain against the anchor, hashing every record again over a new
        connection; returns the number of records."""
        try:
            con = _connect(self.path)
            try:
                rows = [tuple(r) for r in con.execute("SELECT * FROM records ORDER BY seq")]
            finally:
                con.close()
        except sqlite3.Error:
            raise LedgerError(f"the ledger file {self.path} cannot be read: fail closed") from None
        records, _ = _chain(rows, [], [])
        self._check(records, _read_anchor(self.anchor))
        return len(records)

    # -- reading and appending ------------------------------------------------------------------
    def records(self) -> list[Record]:
        with self._lock:
            return list(self._refresh())

    def records_since(self, count: int) -> list[Record]:
        """The records after the first ``count``: O(new records), for readers that fold."""
        with self._lock:
            return self._refresh()[count:]

    def _refresh(self) -> list[Record]:
        """The records, reading only those appended (by any process) since the last call."""
        self._catch_up(self._connection())
        return self._cache

    def append(
        self,
        kind: str,
        payload: Mapping[str, Any],
        analyst: str | None = None,
        decide: Callable[[list[Record]], None] | None = None,
        *,
        synced: bool = True,
        wait: bool = True,
    ) -> Record:
        """Append one record in one immediate transaction.

        ``wait=False`` returns once a synced record is committed (decided, and counted by
        every later decision of any process), before it is on disk: the caller must then call
        ``on_disk(record.seq)`` before it releases anything (``Pipeline.run``: the engine works
        while the disk syncs).

        ``decide`` sees every record committed so far (by any process; it must not change the
        list) and may raise, e.g. ``BudgetExceededError``: then nothing is written. A failed
        write raises ``LedgerError`` and nothing is released.

        ``synced=False`` is for a record of post-processing only (a release kept for the cache,
        a re-serve): committed without waiting for the disk, and named in the anchor's tail
        slot, also unsynced (``ledger_anchor``), instead of its head. A crash may lose it, and
        only a suffix of such records: the WAL is appended in order, and the next synced commit
        (by any process) syncs it whole. Losing one costs a fresh charge when the query comes
        again, never privacy (DESIGN: a crash after the charge loses budget); an edit of one is
        caught by the tail like any other. A charge is always synced and anchored, and so is a
        record past the tail's MAX_TAIL or while the tail does not name every record after the
        head.
        """
        body = canonical(dict(payload))
        with self._lock, _file_lock(self.path):
            self._check_size(self.path)  # before anything opens the file to write
            try:
                con = self._connection()
                # SQLite, WAL mode: a NORMAL commit is durable at the next sync of the WAL, which
                # a synced record waits for after the locks (``ledger_group``: group commit).
                con.execute("PRAGMA synchronous=NORMAL")
                con.execute("BEGIN IMMEDIATE")
            except sqlite3.Error:
                self._drop()
                raise LedgerError(
                    f"the ledger {self.path} cannot be opened for writing; nothing was released"
                ) from None
            try:
                anchor = self._caught_up(con)  # every record verified before the decision
                if decide is not None:
                    decide(self._cache)
                base, tail = self._tail_before(anchor)
                seq = len(self._cache) + 1
                prev = self._cache[-1].hash if self._cache else GENESIS
                when = time.time()
                digest = record_hash(prev, (seq, when, kind, analyst, body))
                heads = [r.hash for r in self._cache[base:]] + [digest]
                # Unsynced only if the tail already names every record after the head: a
                # record it does not name (a process killed before anchoring it, perhaps a
                # charge) must come under the head, where its loss is an error, not the tail.
                lazy = (
                    not synced
                    and tail is not None
                    and base + len(tail) == len(self._cache)
                    and len(heads) <= MAX_TAIL
                )
                con.execute(
                    "INSERT INTO records VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (seq, when, kind, analyst, body, prev, digest),
                )
                con.execute("COMMIT")
            except (BudgetExceededError, LedgerError):
                with contextlib.suppress(sqlite3.Error):
                    con.execute("ROLLBACK")
                raise
            except sqlite3.Error:
                with contextlib.suppress(sqlite3.Error):
                    con.execute("ROLLBACK")
                self._drop()
                raise LedgerError(
                    f"the ledger {self.path} could not record this; nothing was released"
                ) from None
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    con.execute("ROLLBACK")
                raise
            finally:
                with contextlib.suppress(sqlite3.Error):
                    con.execute("PRAGMA synchronous=FULL")
            record = Record(seq, when, kind, analyst, json.loads(body), prev, digest)
            self._cache.append(record)
            self._rows.append((seq, when, kind, analyst, body, prev, digest))
            if lazy:  # the tail slot, written under the locks that ordered the records it names
                self._anchor_after(record, base, heads)
                return record
        # The locks released: records committed meanwhile by other threads share this sync.
        self._anchor_after(record, base, None, wait=wait)
        return record

    def on_disk(self, seq: int) -> None:
        """Return once record ``seq``, committed, is on disk and anchored (``append``'s
        ``wait=False``); at once where it already is."""
        with self._lock:
            record = self._cache[seq - 1]
        self._anchor_after(record, 0, None)

    def _caught_up(self, con: sqlite3.Connection) -> dict[str, Any]:
        """Under the write lock, before a record is added: every record committed by any
        process read and verified (``_catch_up``: the tail always, the whole history on its
        schedule), checked against the anchor, and the tail on disk, not only as this
        connection has it cached (a ledger truncated under an open session fails closed at
        its next record); the anchor read."""
        self._catch_up(con)
        anchor = _read_anchor(self.anchor)
        self._check(self._cache, anchor)
        self._check_disk(self.path)
        return anchor

    def _anchor_after(
        self, record: Record, base: int, tail: list[str] | None, *, wait: bool = True
    ) -> None:
        """Anchor a committed record: in the tail (``tail``, unsynced, under the locks) or at
        the head, after a sync of the WAL shared with every record committed before it
        (``ledger_group``; outside the locks). A crash before this leaves the anchor behind the
        ledger, which is consistent (the chain extends the anchored head) and is caught up next
        time. The head is never ahead of what is on disk (a crash would then fail every later
        session closed): the WAL is synced before the head is written."""
        if tail is not None:
            _write_tail(self.anchor, self.identity["ledger_id"], base, tail, sync=False)
            return
        if not wait:  # the disk syncs while the caller works; ``on_disk`` waits for it
            in_background(lambda: self._anchor_after(record, base, None))
            return
        assert self._file is not None  # set when the connection that committed it was opened
        group = group_for(self._file, self._anchor_real)
        group.wait(record.seq, record.hash, self._sync_and_anchor)

    def _sync_and_anchor(self, seq: int, head: str) -> None:
        """Sync the WAL, which holds every record up to ``seq`` (committed before), then anchor
        that record (hash ``head``) as the head, under the file lock that orders the anchor's
        writers; skipped where another process did both past it (``ledger_group``)."""
        if _anchored_seq(self.anchor) >= seq:
            with _file_lock(self.path):  # its writer holds the lock through the anchor's sync
                return
        _sync_wal(self.path)
        with _file_lock(self.path):
            _write_anchor(self.anchor, _anchor(self.identity, seq, head))

    def _tail_before(self, anchor: Mapping[str, Any]) -> tuple[int, list[str] | None]:
        """The anchored head's seq and the tail after it (None: an anchor of the older form,
        without a tail slot), under the write lock, before a record is added. A tail naming
        records a crash lost is first shrunk, synced, to those still present: else the record
        about to take a lost one's seq would disagree with it."""
        base, tail = int(anchor["seq"]), anchor.get("tail")
        if tail is not None and base + len(tail) > len(self._cache):
            tail = tail[: len(self._cache) - base]
            _write_tail(self.anchor, self.identity["ledger_id"], base, tail, sync=True)
        return base, tail

    def close(self) -> None:
        """Close this process's connection (a later call opens a new one)."""
        with self._lock:
            self._drop()

    def export(self) -> Iterator[dict[str, Any]]:
        for r in self.records():
            yield {
                "seq": r.seq,
                "time": r.time,
                "kind": r.kind,
                "analyst": r.analyst,
                "payload": r.payload,
                "prev": r.prev,
                "hash": r.hash,
            }
