"""Check-and-charge is atomic across processes: 8 processes x 200 queries into one durable ledger
whose budget admits only 500 of the 1600 never overspend, and the ledger's charges are exactly the
fresh answers that were returned.

Atomicity, not durability, is what this test proves, so the ledger lives in memory-backed storage
(``/dev/shm``) where there is one: an fsync there costs nothing, which keeps 1600 queries within
the time of a unit test. ``benchmarks/ledger.py`` measures the durable cost on disk.
"""

from __future__ import annotations

import queue
import shutil
import tempfile
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from test_ledger import COUNT, charges_in, ledger_policy, open_session, worker_context

from dpsql.accounting.ledger.ledger import Ledger
from dpsql.accounting.ledger.store import create_ledger
from dpsql.errors import BudgetExceededError
from dpsql.policy import load_policy

PROCESSES = 8
QUERIES = 200
CAP = Fraction(5)
COST = Fraction(1, 100)  # the cap admits exactly CAP / COST = 500 of the 1600


def _worker(raw: dict[str, Any], start: Any, out: Any) -> None:
    """One client process: its own Session, QUERIES cheap queries; reports what it got."""
    seqs: list[int] = []
    refusals = 0
    session = open_session(raw)
    try:
        start.wait(timeout=60)  # contend together, after every process has opened its session
        for _ in range(QUERIES):
            try:
                result = session.execute(COUNT, epsilon="0.01", fresh=True)
            except BudgetExceededError:
                refusals += 1
                continue
            assert result.rows and result.charge is not None
            seqs.append(result.charge.seq)
    finally:
        session.close()
    out.put((seqs, refusals))


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    shm = Path("/dev/shm")
    if not shm.is_dir():
        yield tmp_path
        return
    path = Path(tempfile.mkdtemp(prefix="dpsql-ledger-", dir=shm))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_concurrent_processes_never_overspend_and_every_charge_is_an_answer(
    folder: Path,
) -> None:
    raw = ledger_policy(folder, epsilon=str(CAP))
    path = folder / "ledger.db"
    create_ledger(load_policy(raw))
    ctx = worker_context()
    start, out = ctx.Barrier(PROCESSES), ctx.Queue()
    began = time.monotonic()
    workers = [ctx.Process(target=_worker, args=(raw, start, out)) for _ in range(PROCESSES)]
    for w in workers:
        w.start()
    results: list[tuple[list[int], int]] = []
    while len(results) < PROCESSES:  # fail fast if a worker dies instead of reporting
        try:
            results.append(out.get(timeout=1))
        except queue.Empty:
            assert all(w.exitcode in (None, 0) for w in workers), "a worker failed"
            assert time.monotonic() - began < 300, "the workers hang"
    for w in workers:
        w.join(timeout=30)
        assert w.exitcode == 0
    elapsed = time.monotonic() - began

    answered = [seq for seqs, _ in results for seq in seqs]
    refused = sum(r for _, r in results)
    assert len(answered) + refused == PROCESSES * QUERIES  # no other outcome (no lost query)
    charges = charges_in(path)
    # The guarantee stays within the cap, exactly (rationals from the ledger itself) ...
    spent = sum((epsilon for _, _, epsilon in charges), Fraction(0))
    assert spent <= CAP
    assert all(epsilon == COST for _, _, epsilon in charges)
    # ... the ledger holds exactly the fresh answers actually returned, one charge each ...
    assert sorted(answered) == [seq for seq, _, _ in charges]
    assert len(charges) == len(answered)
    # ... and, every query costing the same, the budget was filled to the cap and no further.
    assert len(answered) == CAP / COST
    assert Ledger(path).verify() >= len(charges)  # with the release records of the cache
    session = open_session(raw)
    assert session.budget().epsilon_spent == spent
    session.close()
    assert elapsed < 120, f"{elapsed:.1f} s"
