"""Catching up with the ledger file: the records appended since the last look, verified.

Cost: an append reads and hashes only the records appended since the last look, re-reads the
last verified one, and checks the anchor, so it costs O(1) amortised in the history's length.
The whole history is compared byte for byte again at open, in ``verify()``, when another
connection committed something that appended nothing, and once per doubling of the history
(``CatchUp._catch_up``). The trade-off: an edit far back made while other processes append is
caught at the next full comparison, not at the very next charge (docs/accounting.md, "Several
processes on one ledger"); a Ledger that found its history changed refuses everything from then
on. The ``CatchUp`` methods are part of ``dpsql.accounting.ledger.ledger.Ledger``, which keeps the
connections and the full recheck (both open the file through ``ledger_files._connect``).
"""

from __future__ import annotations

import os
import sqlite3
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpsql.accounting.ledger.chain import GENESIS, Record, _chain
from dpsql.errors import LedgerError


class CatchUp:
    """The catching-up part of ``Ledger``: the file's new tail verified, and the anchor's check."""

    _cache: list[Record]
    _rows: list[tuple[Any, ...]]
    _version: int
    _checked: int
    _failed: str | None
    _size: int  # the ledger file's size when last checked: SQLite's main file only grows

    if TYPE_CHECKING:

        def _read(self, con: sqlite3.Connection, first: int) -> list[tuple[Any, ...]]: ...

        def _recheck(self) -> None: ...

    def _catch_up(self, con: sqlite3.Connection) -> None:
        """Bring the verified records up to the file's tail, in O(new records) amortised.

        The last verified row is read again and must be byte for byte what was verified (a
        truncated, rolled back or rewritten tail fails closed); only the newer rows are hashed.
        The whole history is compared again, byte for byte, with what was verified (an edit or
        a drop further back fails closed too) in three cases:

        * when another connection committed something that appended nothing (``PRAGMA
          data_version`` moved but the tail did not grow): dpsql only ever appends, so that is
          an edit, a deletion or a rewrite, caught at once;
        * whenever the records added since the last full recheck reach the number it checked
          (so its O(n) cost is paid once per n new records: O(1) amortised per record);
        * always at open and in ``verify()``.

        The trade-off: while other processes append, an edit further back made in the same
        window is caught at the next full recheck, at most as many records later as the
        history held at the last one; every charge until then is still checked against the
        anchor and its own tail, and ``dpsql ledger verify`` catches it at once.
        """
        if self._failed is not None:
            raise LedgerError(self._failed)  # fail closed for good, not only on one call
        try:
            self._catch_up_checked(con)
        except LedgerError as exc:
            self._failed = str(exc)
            raise

    def _catch_up_checked(self, con: sqlite3.Connection) -> None:
        version = _data_version(con)
        start = len(self._cache)
        rows = self._read(con, max(start, 1))
        if start:
            if not rows or rows[0] != self._rows[-1]:
                raise LedgerError("the ledger's history changed under a running session")
            rows = rows[1:]
        _chain(rows, self._cache, self._rows)
        moved = version != self._version
        self._version = version
        if (moved and not rows) or len(self._cache) - self._checked >= self._checked:
            self._recheck()

    def _check_size(self, path: Path) -> None:
        """The ledger file has not shrunk since the last look (SQLite's main file only grows
        here: no VACUUM). Before the write transaction begins: a connection that may write
        takes a main file it finds empty for a new database, and resets the WAL that still
        holds the records, destroying what the owner needs to see what happened."""
        if self._failed is not None:
            return  # _catch_up raises it
        try:
            size = os.stat(path).st_size
        except OSError:
            raise LedgerError(f"the ledger file {path} cannot be read: fail closed") from None
        if size < self._size:
            self._failed = "the ledger file was truncated under a running session"
            raise LedgerError(self._failed)  # for good, as a history that changed
        self._size = size

    def _check_disk(self, path: Path) -> None:
        """The ledger's tail as the file holds it now, before a record is added: its last
        record, read over a read-only connection of its own, is the last one verified (whose
        chain ``_check`` holds against the anchor).

        The session's own connection may answer from pages it cached: after the file was
        truncated (the records table cut, or the WAL emptied) it kept answering, and charging,
        from them. A new connection has no cache. With ``_check_size``: some 0.2 ms
        (benchmarks/ledger_tail.py), beside the charge's own synced commit."""
        try:
            # Read-only, so that it cannot reset a WAL it finds inconsistent (see _check_size).
            uri = "file:" + urllib.parse.quote(str(path)) + "?mode=ro"
            fresh = sqlite3.connect(uri, uri=True, timeout=60, isolation_level=None)
            try:
                row = fresh.execute("SELECT * FROM records ORDER BY seq DESC LIMIT 1").fetchone()
            finally:
                fresh.close()
        except sqlite3.Error:
            raise LedgerError(f"the ledger file {path} cannot be read: fail closed") from None
        if (tuple(row) if row is not None else None) != (self._rows[-1] if self._rows else None):
            self._failed = "the ledger's tail on disk is not the history verified: fail closed"
            raise LedgerError(self._failed)  # for good, as a history that changed

    @staticmethod
    def _check(records: list[Record], anchor: Mapping[str, Any]) -> None:
        seq = anchor.get("seq", -1)
        if not isinstance(seq, int) or isinstance(seq, bool):
            raise LedgerError("the ledger's anchor is malformed: fail closed")
        if seq > len(records):
            raise LedgerError("the ledger is shorter than its anchor: records were removed")
        head = records[seq - 1].hash if seq > 0 else GENESIS
        if head != anchor.get("head"):
            raise LedgerError("the ledger's history differs from its anchor: fail closed")
        # The unsynced records after the head: each one present must be the one written (an
        # absent one was lost with the unsynced WAL: post-processing only, ledger_anchor).
        for record, written in zip(records[seq:], anchor.get("tail", ()), strict=False):
            if record.hash != written:
                raise LedgerError("the ledger's history differs from its anchor: fail closed")


def _data_version(con: sqlite3.Connection) -> int:
    """SQLite's counter of commits made by *other* connections since this one last looked."""
    try:
        return int(con.execute("PRAGMA data_version").fetchone()[0])
    except sqlite3.Error:
        raise LedgerError("the ledger file cannot be read: fail closed") from None
