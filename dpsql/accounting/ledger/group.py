"""Group commit: one sync of the WAL and one anchor write for every record committed before it.

A synced record is committed without waiting for the disk (SQLite's ``synchronous=NORMAL``, under
the ledger's locks, so that every decision still sees every record before it), and then waits
here, with the locks released, until some thread of this process has synced the WAL and anchored
a head at or after it. The first to arrive syncs and anchors the newest record committed so far;
threads that commit while it does so wait for it, then one of them does the same for all of them
(PostgreSQL's and InnoDB's group commit: Helland et al., "Group Commit Timers and High Volume
Transaction Systems", 1987). A charge's caller releases nothing before ``wait`` returns, so a
record lost in a crash was never answered; records are in the WAL in ledger order, so the sync
that makes one durable makes every record before it durable too.

The threads of one process share the group of a ledger file and its anchor (``group_for``:
every ``Ledger`` open on both, one per connection). Across processes, a record's sync is
skipped when the anchor, read under the file lock that its writers hold through their sync,
already names a head at or after it: the process that wrote that head synced the WAL first,
and the WAL is in ledger order.

If the sync or the anchor write fails, the thread that tried raises (``LedgerError``) and the
others try again for themselves: nobody returns for a record that is not on disk and anchored.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable

__all__ = ["GroupSync", "group_for", "in_background"]


class GroupSync:
    """Which records this process has synced and anchored, and who is syncing now."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._busy = False
        self._done = 0  # every record up to this seq is on disk and anchored (by this process)
        self._newest = (0, "")  # the newest record committed here: (seq, hash)

    def wait(self, seq: int, head: str, sync: Callable[[int, str], None]) -> None:
        """Return once record ``seq`` (whose hash is ``head``), committed, is on disk and
        anchored. ``sync(seq, head)`` syncs the WAL, then anchors that record as the head: it is
        given the newest record any thread of this process has committed (every one before it
        was committed before, by some process, and is in the WAL in ledger order)."""
        with self._cond:
            if seq > self._newest[0]:
                self._newest = (seq, head)
            while self._busy and self._done < seq:
                self._cond.wait()
            if self._done >= seq:
                return
            self._busy = True
            last = self._newest
        done = 0
        try:
            sync(*last)
            done = last[0]
        finally:
            with self._cond:
                self._busy = False
                self._done = max(self._done, done)
                self._cond.notify_all()


def in_background(sync: Callable[[], None]) -> None:
    """Start ``sync`` (a record's wait in its group) on a thread of its own, so that the disk
    syncs while the caller works (``Ledger.append``'s ``wait=False``). Its failure is dropped
    here: the caller's own wait (``Ledger.on_disk``) finds the record not yet on disk, syncs
    again itself, and raises what fails then."""

    def run() -> None:
        with contextlib.suppress(Exception):  # the caller's wait syncs again, and raises it
            sync()

    # A thread that cannot start (memory, the process's limits) leaves the sync to the caller.
    with contextlib.suppress(RuntimeError, MemoryError):
        threading.Thread(target=run, name="dpsql-ledger-sync", daemon=True).start()


class _Groups:
    """Every ledger's group in this process, by its file's (device, inode) and its anchor."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.lock = threading.Lock()
        self.by_file: dict[tuple[int, int, str], GroupSync] = {}


_GROUPS = _Groups()


def group_for(file: tuple[int, int], anchor: str) -> GroupSync:
    """The group of the ledger file ``file`` (its device and inode) anchored at ``anchor`` (its
    real path) in this process: a head one of them anchors is every one's head."""
    with _GROUPS.lock:
        key = (*file, anchor)
        group = _GROUPS.by_file.get(key)
        if group is None:
            group = _GROUPS.by_file[key] = GroupSync()
        return group


# A forked child starts afresh: another thread may have held the lock at the fork, and the
# parent's threads, syncing or waiting, are not the child's.
os.register_at_fork(after_in_child=_GROUPS.reset)
