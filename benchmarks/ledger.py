"""Charges per second under contention: 1, 2, 4 and 8 processes charging into one durable ledger.

Each configuration starts from a fresh ledger in ``--dir`` (default: a temporary folder on the
disk beside this file, not tmpfs: durability costs fsyncs). Every process opens its own
``Ledger`` and ``Budget`` (basic filter) and, after a common start barrier, makes its share of
``--charges`` charges of a fixed discrete Laplace event (epsilon 1e-6, a cap that never binds):
each charge is the whole check-and-charge (the filter's decision on every committed charge, the
immediate transaction, ``synchronous=FULL`` commit, anchor write). Rows, in the same run:

* **durable Budget.charge**: the above, wall time from the barrier until the last process is done;
* **bare SQLite INSERT**: the same processes, each inserting one row per ``BEGIN IMMEDIATE``
  transaction into a WAL table with ``synchronous=FULL`` over one connection it keeps open: the
  floor that the storage allows;
* **in-memory Budget.charge**: one process, ``MemoryLedger`` (no durability; resets on exit).

The filter decides on the whole committed history, so a rate depends on the ledger's length: every
configuration makes the same number of charges into an empty ledger.

    python benchmarks/ledger.py [--charges 800] [--dir PATH]
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing
import sqlite3
import tempfile
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

from dpsql.accounting.budget.build import budget_for
from dpsql.accounting.ledger.ledger import Ledger
from dpsql.accounting.ledger.store import MemoryLedger, budget_caps
from dpsql.mechanisms.events import Composite
from dpsql.mechanisms.laplace_events import DiscreteLaplace
from dpsql.policy import BudgetSpec

PROCESSES = (1, 2, 4, 8)
EVENT = Composite((DiscreteLaplace(Fraction(10**6), Fraction(1), "COUNT(*)"),))
SPEC = BudgetSpec(epsilon=Fraction(10), delta=Fraction(0))
README = Path(__file__).with_name("README.md")


def _charge(path: str, n: int, start: Any) -> None:
    budget = budget_for("bench", SPEC, Ledger(Path(path)))
    start.wait()
    for i in range(n):
        budget.charge(EVENT, f"SELECT COUNT(*) FROM visits -- {i}", "bench")


def _insert(path: str, n: int, start: Any) -> None:
    con = sqlite3.connect(path, timeout=60, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=FULL")
    payload = "x" * 400  # about the size of a charge record's payload
    start.wait()
    for _ in range(n):
        con.execute("BEGIN IMMEDIATE")
        con.execute("INSERT INTO t (payload) VALUES (?)", (payload,))
        con.execute("COMMIT")
    con.close()


def _contended(target: Any, path: Path, processes: int, total: int) -> float:
    """Charges per second of ``processes`` running ``target`` (each its share of ``total``)."""
    ctx = multiprocessing.get_context("forkserver")
    start = ctx.Barrier(processes + 1)
    share = total // processes
    workers = [ctx.Process(target=target, args=(str(path), share, start)) for _ in range(processes)]
    for w in workers:
        w.start()
    start.wait()
    began = time.perf_counter()
    for w in workers:
        w.join()
        if w.exitcode != 0:
            raise RuntimeError(f"a worker failed (exit code {w.exitcode})")
    return share * processes / (time.perf_counter() - began)


def _memory(total: int) -> float:
    budget = budget_for("bench", SPEC, MemoryLedger())
    began = time.perf_counter()
    for i in range(total):
        budget.charge(EVENT, f"SELECT COUNT(*) FROM visits -- {i}", "bench")
    return total / (time.perf_counter() - began)


def measure(folder: Path, total: int) -> list[tuple[str, list[float | None]]]:
    durable: list[float | None] = []
    bare: list[float | None] = []
    for n in PROCESSES:
        ledger = folder / f"ledger-{n}.db"
        Ledger.create(ledger, "bench", budget=budget_caps(SPEC))
        durable.append(_contended(_charge, ledger, n, total))
        assert len(Ledger(ledger).records()) == total // n * n + 1  # record 1: the budget
        table = folder / f"bare-{n}.db"
        con = sqlite3.connect(table)
        con.execute("CREATE TABLE t (seq INTEGER PRIMARY KEY, payload TEXT)")
        con.close()
        bare.append(_contended(_insert, table, n, total))
    memory: list[float | None] = [_memory(total), None, None, None]
    return [
        ("durable Budget.charge", durable),
        ("bare SQLite INSERT (FULL)", bare),
        ("in-memory Budget.charge", memory),
    ]


def table(rows: list[tuple[str, list[float | None]]], total: int) -> str:
    head = f"{'charges per second':<27} | " + " | ".join(f"{n:>4} proc" for n in PROCESSES)
    lines = [head, "-" * len(head)]
    for name, rates in rows:
        cells = " | ".join(f"{r:>9,.0f}" if r is not None else f"{'':>9}" for r in rates)
        lines.append(f"{name:<27} | {cells}")
    lines.append(f"\n{total} charges per configuration, each into a fresh ledger")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--charges", type=int, default=800)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["dpsql.accounting.budget.build"])
    with tempfile.TemporaryDirectory(dir=args.dir or Path(__file__).parent) as folder:
        text = table(measure(Path(folder), args.charges), args.charges)
    print(f"{dt.date.today().isoformat()}, python benchmarks/ledger.py --charges {args.charges}")
    print(text)


if __name__ == "__main__":
    main()
