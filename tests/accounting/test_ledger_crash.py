"""Crash safety: query processes killed with SIGKILL at random points. After every restart, every
answer that was returned has a committed charge for the same query, the ledger verifies (an anchor
left behind the ledger by a kill between the commit and the anchor write is consistent), and the
spent budget never goes down."""

from __future__ import annotations

import os
import random
import signal
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from test_ledger import charges_in, ledger_policy, open_session, worker_context

from dpsql.accounting.ledger import ledger as ledger_module
from dpsql.accounting.ledger.anchor import anchor_path
from dpsql.accounting.ledger.ledger import Ledger
from dpsql.accounting.ledger.store import create_ledger
from dpsql.policy import load_policy

ROUNDS = 5
WORKERS = 3


def _worker(raw: dict[str, Any], log: str, first: int) -> None:
    """Query in a loop; write "seq<TAB>query" the moment an answer is returned (one write(2)
    of one line with O_APPEND: a kill leaves whole lines only)."""
    session = open_session(raw)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    k = first
    while True:
        result = session.execute(
            f"SELECT COUNT(*) FROM visits WHERE age > {k % 70}", epsilon="0.01", fresh=True
        )
        assert result.rows and result.charge is not None
        os.write(fd, f"{result.charge.seq}\t{result.charge.query}\n".encode())
        k += 1


def _answers(logs: list[Path]) -> list[tuple[int, str]]:
    out = []
    for log in logs:
        if log.exists():
            for line in log.read_text().splitlines():
                seq, query = line.split("\t")
                out.append((int(seq), query))
    return out


def _spent_after_restart(raw: dict[str, Any]) -> Fraction:
    session = open_session(raw)  # a fresh Session opens and verifies the whole ledger
    try:
        spent = session.budget().epsilon_spent
    finally:
        session.close()
    assert Ledger(Path(raw["ledger"]["path"])).verify() > 0
    return spent


def test_killed_query_processes_leave_every_answer_charged(tmp_path: Path) -> None:
    raw = ledger_policy(tmp_path, epsilon="1000")
    path = tmp_path / "ledger.db"
    create_ledger(load_policy(raw))
    ctx = worker_context()
    rng = random.Random(os.urandom(8))
    logs: list[Path] = []
    spent = [Fraction(0)]
    for round_ in range(ROUNDS):
        batch = [tmp_path / f"answers-{round_}-{i}.log" for i in range(WORKERS)]
        logs += batch
        workers = [
            ctx.Process(target=_worker, args=(raw, str(log), 1000 * i), daemon=True)
            for i, log in enumerate(batch)
        ]
        for w in workers:
            w.start()
        deadline = time.monotonic() + 60
        for w, log in zip(workers, batch, strict=True):
            # Once this worker is answering, kill it at a random point of its loop.
            while not (log.exists() and log.stat().st_size) and time.monotonic() < deadline:
                assert w.exitcode is None, "a worker failed before answering"
                time.sleep(0.02)
            time.sleep(rng.uniform(0, 0.4))
            assert w.pid is not None
            os.kill(w.pid, signal.SIGKILL)
        for w in workers:
            w.join(timeout=30)
            assert w.exitcode == -signal.SIGKILL  # killed, not failed

        charged = {seq: (query, epsilon) for seq, query, epsilon in charges_in(path)}
        answers = _answers(logs)
        assert answers, "no worker answered before it was killed"
        for seq, query in answers:
            assert charged.get(seq) == (query, Fraction(1, 100)), (seq, query)
        now = _spent_after_restart(raw)
        assert now == sum((e for _, e in charged.values()), Fraction(0))
        assert now >= spent[-1] + Fraction(len(answers) - len(_answers(logs[:-WORKERS])), 100)
        spent.append(now)
    assert spent == sorted(spent)


def _charge_then_die(raw: dict[str, Any]) -> None:
    """A process killed (SIGKILL) after its charge committed, before its anchor was written."""

    def die(path: Path, data: Any) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    session = open_session(raw)
    ledger_module._write_anchor = die
    session.execute("SELECT COUNT(*) FROM visits", epsilon="0.01", fresh=True)


@pytest.mark.parametrize("kills", [1, 2])
def test_a_kill_between_the_commit_and_the_anchor_is_tolerated(tmp_path: Path, kills: int) -> None:
    raw = ledger_policy(tmp_path, epsilon="1000")
    path = tmp_path / "ledger.db"
    create_ledger(load_policy(raw))
    session = open_session(raw)
    session.execute("SELECT COUNT(*) FROM visits", epsilon="0.01", fresh=True)
    session.close()
    anchored = anchor_path(path).read_text()
    ctx = worker_context()
    for _ in range(kills):
        child = ctx.Process(target=_charge_then_die, args=(raw,))
        child.start()
        child.join(timeout=60)
        assert child.exitcode == -signal.SIGKILL
    assert anchor_path(path).read_text() == anchored  # the anchor is behind the ledger
    assert len(charges_in(path)) == 1 + kills  # the charges committed: budget lost, not privacy
    assert _spent_after_restart(raw) == Fraction(1 + kills, 100)
    session = open_session(raw)  # the next append catches the anchor up
    result = session.execute("SELECT COUNT(*) FROM visits", epsilon="0.01", fresh=True)
    session.close()
    assert result.charge is not None
    assert anchor_path(path).read_text() != anchored
    assert Ledger(path).verify() >= result.charge.seq
