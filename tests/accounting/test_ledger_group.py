"""Group commit (``dpsql/accounting/ledger/group.py``), and writes lost for want of a sync.

* Concurrent charges straddling the cap: every thread has its own ``Ledger`` and ``Budget`` on one
  file (as separate connections do), the syncs are slowed so that charges commit while a group
  syncs, and the filter admits exactly a set that fits, decided in ledger order counting every
  pending charge; nothing returns before its record is synced and anchored; the groups are
  fewer than the charges.
* Another process's group that synced past a record spares that record's sync.
* Through a session, the engine works while the disk syncs, and nothing leaves before the
  charge is on disk and anchored.
* Crash images built byte by byte: after any sequence of charges (synced) and releases (not),
  the WAL cut at any frame after the last sync dpsql ran (SQLite's frames are checksummed in a
  chain, so losing any unsynced frame loses every frame after it), and the anchor's tail slot as
  last written, as before, or torn. Every such image opens, holds every charge that returned,
  and takes new records.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from conftest import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_ledger import COUNT, ledger_policy, open_session

import dpsql.accounting.ledger.ledger as ledger_module
from dpsql.accounting.budget.build import budget_for
from dpsql.accounting.ledger.anchor import _TAIL, read_anchor
from dpsql.accounting.ledger.ledger import Ledger
from dpsql.accounting.ledger.store import budget_caps, create_ledger
from dpsql.errors import BudgetExceededError
from dpsql.mechanisms.events import Composite
from dpsql.mechanisms.laplace_events import DiscreteLaplace
from dpsql.policy import BudgetSpec, load_policy

SETTINGS = settings(
    max_examples=examples(10),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _event(epsilon: Fraction) -> Composite:
    return Composite((DiscreteLaplace(1 / epsilon, Fraction(1), "COUNT(*)"),))


def _slow_syncs(monkeypatch: pytest.MonkeyPatch, seconds: float) -> list[int]:
    """Slow the WAL's sync so that other charges commit meanwhile; count the syncs."""
    calls: list[int] = []
    real = ledger_module._sync_wal  # type: ignore[attr-defined]

    def slow(path: Path) -> None:
        calls.append(1)
        time.sleep(seconds)
        real(path)

    monkeypatch.setattr(ledger_module, "_sync_wal", slow)
    return calls


def _contend(path: Path, spec: BudgetSpec, costs: list[Fraction]) -> list[int | None]:
    """Each cost charged by its own thread, Ledger and Budget, together; the seq each got (None:
    refused), each checked against the anchor the moment its charge returned."""
    budgets = [budget_for("d", spec, Ledger(path)) for _ in costs]
    start = threading.Barrier(len(costs))
    got: list[int | None] = [None] * len(costs)
    errors: list[BaseException] = []

    def charge(i: int) -> None:
        try:
            start.wait(timeout=60)
            seq = budgets[i].charge(_event(costs[i]), f"q{i}", None).seq
            # Returned: on disk and anchored at the head, before anything could be released.
            assert read_anchor(path.with_name(path.name + ".anchor"))["seq"] >= seq
            got[i] = seq
        except BudgetExceededError:
            pass
        except BaseException as exc:  # reported below: a thread's assert must fail the test
            errors.append(exc)

    threads = [threading.Thread(target=charge, args=(i,)) for i in range(len(costs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    for b in budgets:
        b.store.close()  # type: ignore[union-attr]
    return got


def _new(path: Path, cap: Fraction) -> BudgetSpec:
    spec = BudgetSpec(epsilon=cap, delta=Fraction(0))
    Ledger.create(path, "d", budget=budget_caps(spec)).close()
    return spec


def test_concurrent_charges_straddling_the_cap_admit_what_fits_in_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "ledger.db"
    spec = _new(path, Fraction(1))
    syncs = _slow_syncs(monkeypatch, 0.2)
    got = _contend(path, spec, [Fraction(3, 10)] * 8)  # the cap holds 3 of the 8
    admitted = sorted(s for s in got if s is not None)
    assert admitted == [2, 3, 4]  # record 1 is the budget
    assert Ledger(path).verify() == 4
    # The first charge syncs alone; the two committed while it synced share one sync.
    assert len(syncs) < len(admitted)


@SETTINGS
@given(
    costs=st.lists(st.integers(1, 6).map(lambda n: Fraction(n, 10)), min_size=2, max_size=8),
    cap=st.integers(3, 20).map(lambda n: Fraction(n, 10)),
)
def test_concurrent_charges_never_overspend_nor_refuse_what_fit(
    tmp_path_factory: pytest.TempPathFactory, costs: list[Fraction], cap: Fraction
) -> None:
    path = tmp_path_factory.mktemp("group") / "ledger.db"
    spec = _new(path, cap)
    with pytest.MonkeyPatch.context() as patch:
        _slow_syncs(patch, 0.01)
        got = _contend(path, spec, costs)
    spent = sum((c for c, s in zip(costs, got, strict=True) if s is not None), Fraction(0))
    assert spent <= cap
    # A refusal was decided on a ledger holding at most what it holds now (ledger order).
    assert all(spent + c > cap for c, s in zip(costs, got, strict=True) if s is None)
    seqs = sorted(s for s in got if s is not None)
    assert seqs == list(range(2, 2 + len(seqs)))
    assert Ledger(path).verify() == 1 + len(seqs)


def test_a_record_another_process_synced_and_anchored_is_not_synced_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "ledger.db"
    Ledger.create(path, "d", budget={"epsilon": "1"}).close()
    mine, theirs = Ledger(path), Ledger(path)
    with pytest.MonkeyPatch.context() as patch:  # committed, its sync not yet run
        patch.setattr(mine, "_anchor_after", lambda *args, **kwargs: None)
        first = mine.append("charge", {"i": 0})
    theirs.append("charge", {"i": 1})  # syncs the WAL past ``first``, then anchors its own
    calls = _slow_syncs(monkeypatch, 0)
    mine._sync_and_anchor(first.seq, first.hash)
    assert calls == []
    assert read_anchor(path.with_name(path.name + ".anchor"))["seq"] == first.seq + 1
    # A head is never moved back: anchoring an older record leaves the newer one.
    mine._sync_and_anchor(first.seq, first.hash)
    assert read_anchor(path.with_name(path.name + ".anchor"))["seq"] == first.seq + 1
    mine.close()
    theirs.close()


def test_the_engine_works_while_the_disk_syncs_and_nothing_leaves_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = ledger_policy(tmp_path)
    create_ledger(load_policy(raw)).close()
    path = tmp_path / "ledger.db"
    session = open_session(raw)
    released = threading.Event()
    ran: list[str] = []
    real_sync, real_run = ledger_module._sync_wal, session.engine.run  # type: ignore[attr-defined]

    def held(p: Path) -> None:
        assert released.wait(timeout=60)
        real_sync(p)

    def run(sql: str) -> Any:
        ran.append(sql)
        return real_run(sql)

    monkeypatch.setattr(ledger_module, "_sync_wal", held)
    monkeypatch.setattr(session.engine, "run", run)
    results: list[Any] = []
    worker = threading.Thread(
        target=lambda: results.append(session.execute(COUNT, epsilon="0.5", fresh=True))
    )
    worker.start()
    deadline = time.monotonic() + 60
    while not ran and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert ran  # the bounded query ran while the charge's sync was held
    assert worker.is_alive() and results == []  # and nothing came back
    assert read_anchor(path.with_name(path.name + ".anchor"))["seq"] == 1  # not anchored yet
    released.set()
    worker.join(timeout=60)
    (result,) = results
    assert result.charge is not None and result.rows
    assert read_anchor(path.with_name(path.name + ".anchor"))["seq"] >= result.charge.seq
    session.close()


def test_the_sync_keeps_sqlites_locks_so_no_other_connection_takes_the_wal(tmp_path: Path) -> None:
    """Closing a descriptor of the database file drops every POSIX lock the process holds on it,
    SQLite's included: a connection closing in another process then takes itself for the last
    one, checkpoints and deletes the WAL under the open ledger. The sync must not do that."""
    path = tmp_path / "ledger.db"
    Ledger.create(path, "d", budget={"epsilon": "1"}).close()
    ledger = Ledger(path)
    try:
        ledger.append("charge", {"i": 0})
        record = ledger.append("charge", {"i": 1}, wait=False)
        ledger.on_disk(record.seq)
        other = (
            "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
            "c.execute('SELECT COUNT(*) FROM records').fetchone(); c.close()"
        )
        subprocess.run([sys.executable, "-c", other, str(path)], check=True, timeout=60)
        assert path.with_name(path.name + "-wal").exists()  # still this connection's
        ledger.append("charge", {"i": 2})
    finally:
        ledger.close()
    assert Ledger(path).verify() == 4


# -- crash images --------------------------------------------------------------------------------

_WAL_HEADER, _FRAME_HEADER = 32, 24


class _Disk:
    """What a crash now could leave: the WAL's size at dpsql's last sync of it, and each tail
    slot written since the anchor's last sync (any of which may be what reached the disk)."""

    def __init__(self, path: Path, patch: pytest.MonkeyPatch) -> None:
        self.path, self.anchor = path, path.with_name(path.name + ".anchor")
        self.wal = path.with_name(path.name + "-wal")
        self.synced_wal = 0
        self.tails: list[bytes] = [self._tail()]
        sync_wal, write_anchor = ledger_module._sync_wal, ledger_module._write_anchor  # type: ignore[attr-defined]
        write_tail = ledger_module._write_tail  # type: ignore[attr-defined]

        def synced(p: Path) -> None:
            sync_wal(p)
            self.synced_wal = self.wal.stat().st_size if self.wal.exists() else 0

        def anchored(p: Path, data: Any) -> None:
            write_anchor(p, data)  # the slot, then fdatasync: the whole file is on disk
            self.tails = [self._tail()]

        def tail(p: Path, *args: Any, sync: bool) -> None:
            write_tail(p, *args, sync=sync)
            self.tails = [self._tail()] if sync else [*self.tails, self._tail()]

        patch.setattr(ledger_module, "_sync_wal", synced)
        patch.setattr(ledger_module, "_write_anchor", anchored)
        patch.setattr(ledger_module, "_write_tail", tail)

    def _tail(self) -> bytes:
        return self.anchor.read_bytes()[_TAIL:] if self.anchor.exists() else b""

    def image(self, folder: Path, frames: int, tail: bytes) -> Path:
        """A copy as a crash may leave it: the WAL's first ``frames`` frames, the tail slot
        ``tail``, no shared-memory index (SQLite rebuilds it from the WAL)."""
        folder.mkdir()
        copy = folder / self.path.name
        shutil.copyfile(self.path, copy)
        if self.wal.exists():
            data = self.wal.read_bytes()
            page = int.from_bytes(data[8:12], "big") if len(data) >= _WAL_HEADER else 0
            cut = _WAL_HEADER + frames * (_FRAME_HEADER + page) if frames >= 0 else 0
            copy.with_name(copy.name + "-wal").write_bytes(data[:cut])
        heads = self.anchor.read_bytes()[:_TAIL]
        copy.with_name(copy.name + ".anchor").write_bytes(heads + tail)
        return copy

    def frames(self) -> tuple[int, int]:
        """The frames surely on disk, and all the frames written (-1: not even the header)."""
        if not self.wal.exists() or self.wal.stat().st_size < _WAL_HEADER:
            return -1, -1
        page = int.from_bytes(self.wal.read_bytes()[8:12], "big")

        def count(size: int) -> int:
            return (size - _WAL_HEADER) // (_FRAME_HEADER + page) if size >= _WAL_HEADER else -1

        return count(self.synced_wal), count(self.wal.stat().st_size)


@SETTINGS
@given(kinds=st.lists(st.booleans(), min_size=1, max_size=10), data=st.data())
def test_a_crash_that_loses_unsynced_writes_leaves_a_ledger_that_opens(
    tmp_path_factory: pytest.TempPathFactory, kinds: list[bool], data: st.DataObject
) -> None:
    folder = tmp_path_factory.mktemp("crash")
    path = folder / "ledger.db"
    Ledger.create(path, "d", budget={"epsilon": "1"}).close()
    with pytest.MonkeyPatch.context() as patch:
        disk = _Disk(path, patch)
        ledger = Ledger(path)
        charged = 1  # the budget record, synced at creation
        try:
            for i, charge in enumerate(kinds):
                record = ledger.append("charge" if charge else "release", {"i": i},
                                       synced=charge)  # fmt: skip
                charged = record.seq if charge else charged
            kept_from, written = disk.frames()
            frames = data.draw(st.integers(kept_from, written), label="frames kept")
            torn = b"\0" * 8
            tail = data.draw(st.sampled_from([*disk.tails, torn]), label="tail slot")
            image = disk.image(folder / "image", frames, tail)
        finally:
            ledger.close()
    crashed = Ledger(image)
    try:
        count = crashed.verify()
        assert count >= charged  # every charge that returned is there
        crashed.append("charge", {"after": "crash"})
        crashed.append("release", {"after": "crash"}, synced=False)
    finally:
        crashed.close()
    assert Ledger(image).verify() == count + 2
