"""Several processes on one durable ledger, and the ledger's verification schedule.

- Processes racing at the cap: each brings its incremental filter state up to the ledger's tail
  inside the write lock before deciding, so together they land exactly the charges the deciding
  filter admits one after the other, and never one more.
- An edit far back while other connections keep appending is caught by the periodic full
  recheck (at most as many records later as the history held at the last one), by ``verify()``
  at once, and by every new ``Ledger``.
"""

from __future__ import annotations

import queue
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from test_ledger import worker_context

from dpsql.accounting.budget.build import budget_for
from dpsql.accounting.ledger.ledger import Ledger
from dpsql.accounting.ledger.store import MemoryLedger, budget_caps
from dpsql.accounting.theorems.rdp import RdpFilter
from dpsql.errors import BudgetExceededError, LedgerError
from dpsql.mechanisms.events import Composite, flatten
from dpsql.mechanisms.gaussian_events import DiscreteGaussian
from dpsql.mechanisms.laplace_events import DiscreteLaplace
from dpsql.policy import BudgetSpec

PROCESSES = 4
F = Fraction
SPECS = {
    "basic": {"epsilon": "1", "delta": "0"},
    "rdp": {"epsilon": "1", "delta": "1e-6", "accountant": "rdp"},
}
EVENTS = {
    "basic": Composite((DiscreteLaplace(F(50), F(1)),)),  # epsilon 1/50: 50 fit
    "rdp": Composite((DiscreteGaussian(F(400), F(1), F(1, 10), F(1, 10**9)),)),
}


def _spec(name: str) -> BudgetSpec:
    return BudgetSpec.model_validate(SPECS[name])


def _racer(path: str, name: str, tries: int, start: Any, out: Any) -> None:
    budget = budget_for("visits", _spec(name), Ledger(Path(path)))
    start.wait(timeout=60)
    landed = 0
    for i in range(tries):
        try:
            budget.charge(EVENTS[name], f"SELECT {i}", "ann")
            landed += 1
        except BudgetExceededError:
            pass
    out.put(landed)


def _admissible(name: str) -> int:
    """How many of the event the filter admits one after another, in one process."""
    budget = budget_for("visits", _spec(name), MemoryLedger())
    for n in range(10_000):
        try:
            budget.charge(EVENTS[name], "SELECT", "ann")
        except BudgetExceededError:
            return n
    raise AssertionError("the cap never binds")


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    """Memory-backed storage where there is one: atomicity is tested here, not fsync cost."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        yield tmp_path
        return
    path = Path(tempfile.mkdtemp(prefix="dpsql-scale-", dir=shm))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_processes_racing_at_the_cap_land_exactly_what_the_filter_admits(
    folder: Path, name: str
) -> None:
    path = folder / "ledger.db"
    Ledger.create(path, "visits", budget=budget_caps(_spec(name)))
    admissible = _admissible(name)
    tries = admissible // PROCESSES + 10  # together they ask for 40 more than fit
    ctx = worker_context()
    start, out = ctx.Barrier(PROCESSES), ctx.Queue()
    workers = [
        ctx.Process(target=_racer, args=(str(path), name, tries, start, out))
        for _ in range(PROCESSES)
    ]
    for w in workers:
        w.start()
    began, landed = time.monotonic(), []
    while len(landed) < PROCESSES:
        try:
            landed.append(out.get(timeout=1))
        except queue.Empty:
            assert all(w.exitcode in (None, 0) for w in workers), "a racer failed"
            assert time.monotonic() - began < 240, "the racers hang"
    for w in workers:
        w.join(timeout=30)
        assert w.exitcode == 0
    ledger = Ledger(path)
    charges = [r for r in ledger.records() if r.kind == "charge"]
    assert len(charges) == sum(landed) == admissible
    # The whole ledger, replayed through the stateless filter, is within the cap.
    budget = budget_for("visits", _spec(name), ledger)
    events = flatten([c.event for c in budget.charges])
    if name == "basic":
        assert sum((e.epsilon for e in events), F(0)) <= 1
    else:
        # The default rdp filter: a tenth of delta reserved for partition selection.
        filt = RdpFilter(F(1), F(1, 10**6), approx_delta_cap=F(1, 10**7))
        assert filt.admits(events[:-1], events[-1:])
        assert not filt.admits(events, events[-1:])  # and it was filled: one more would not fit
    assert ledger.verify() == len(charges) + 1  # record 1 is the budget


def _rows(path: Path) -> list[Any]:
    con = sqlite3.connect(path)
    try:
        return con.execute("SELECT seq FROM records").fetchall()
    finally:
        con.close()


def _edit_first_charge(path: Path) -> None:
    con = sqlite3.connect(path)
    try:
        with con:
            con.execute(
                "UPDATE records SET payload = replace(payload, 'SELECT 0', 'SELECT 9') "
                "WHERE seq = 2"
            )
    finally:
        con.close()


def test_an_edit_far_back_made_while_others_append_is_caught_on_schedule(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    Ledger.create(path, "visits", budget={})
    mine, other = Ledger(path), Ledger(path)  # two connections, as two processes
    for i in range(20):
        mine.append("note", {"query": f"SELECT {i}"})
    checked = len(mine.records())  # a full recheck ran at the last doubling, or at open
    other.append("note", {"query": "SELECT other"})
    _edit_first_charge(path)  # in the same window as another connection's append
    with pytest.raises(LedgerError):
        Ledger(path)  # every new Ledger verifies the whole chain
    with pytest.raises(LedgerError):
        mine.verify()  # and so does verify(), at once
    appended = 0
    with pytest.raises(LedgerError):
        for _ in range(2 * checked + 2):
            mine.append("note", {"query": "SELECT later"})
            appended += 1
    # The next full recheck comes before the records since the last one reach its length.
    assert appended <= checked
    with pytest.raises(LedgerError):
        mine.append("note", {"query": "SELECT after"})  # for good


def test_an_edit_far_back_with_no_other_writer_is_caught_on_the_next_write(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.db"
    Ledger.create(path, "visits", budget={})
    mine = Ledger(path)
    for i in range(20):
        mine.append("note", {"query": f"SELECT {i}"})
    _edit_first_charge(path)  # a commit that appends nothing: PRAGMA data_version moves
    for _ in range(3):  # and for good: a later call does not find the history fine again
        with pytest.raises(LedgerError):
            mine.append("note", {"query": "SELECT later"})
        with pytest.raises(LedgerError):
            mine.records()
    assert len(_rows(path)) == 21  # nothing was chained onto the edited history
