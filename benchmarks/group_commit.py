"""Durable charges under contention, with group commit: latency per charge and charges per second.

P processes (forkserver), each with T threads, charge one fresh durable ledger after a common
start barrier; every thread opens its own ``Ledger`` and ``Budget`` (basic filter), as separate
connections do, and makes ``--charges`` charges of a fixed discrete Laplace event (a cap that never
binds). A charge is the whole check-and-charge: the write lock, the catch-up and the decision, the
commit, then the sync of the WAL and the anchor's head, shared by every record committed before
it (``dpsql/accounting/ledger/group.py``). Each cell gives the per-charge latency (median and
95th percentile, nearest rank, over every charge of the configuration), the charges per second
from the barrier until the last thread is done, and the WAL syncs dpsql ran per charge.

Beside it, in the same invocation and interleaved with it configuration by configuration:
``--before DIR`` runs the same workers on the code checked out in DIR (a commit before group
commit: each charge syncs its own commit and its anchor under the write lock), and the disk's
own sync latency (a 4 KiB write then ``fsync``, in the same folder) is measured before each
configuration.

    python benchmarks/group_commit.py [--charges 100] [--before DIR] [--dir PATH]
"""

from __future__ import annotations

import argparse
import datetime as dt
import fcntl
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

from charges import fsyncs, p95

import dpsql.accounting.ledger.ledger as ledger_module
from dpsql.accounting.budget.build import budget_for
from dpsql.accounting.ledger.ledger import Ledger
from dpsql.accounting.ledger.store import budget_caps
from dpsql.mechanisms.events import Composite
from dpsql.mechanisms.laplace_events import DiscreteLaplace
from dpsql.policy import BudgetSpec

CONFIGS = ((1, 1), (2, 1), (4, 1), (8, 1), (1, 4), (2, 4))  # (processes, threads each)
HERE = Path(__file__).resolve().parent


def _thread(path: str, n: int, start: Any, out: list[float]) -> None:

    event = Composite((DiscreteLaplace(Fraction(10**6), Fraction(1), "COUNT(*)"),))
    budget = budget_for("bench", BudgetSpec(epsilon=Fraction(10), delta=Fraction(0)),
                        Ledger(Path(path)))  # fmt: skip
    start.wait()
    for i in range(n):
        began = time.perf_counter()
        budget.charge(event, f"SELECT COUNT(*) FROM visits -- {i}", "bench")
        out.append((time.perf_counter() - began) * 1e3)


def _emulate(delay: float, serial: str | None) -> None:
    """A slower disk: ``delay`` ms added to each of dpsql's own syncs (a charge's commit and
    anchor both are, since group commit; not SQLite's own, so not the code before it); and
    ``serial``: every append under one more lock, held through its syncs, across processes
    (groups of one, as before group commit, with the very same syncs)."""
    if delay:
        real = os.fdatasync

        def slow(fd: int) -> None:
            real(fd)
            time.sleep(delay / 1e3)

        os.fdatasync = slow
    if serial is not None:
        append = ledger_module.Ledger.append

        def serialised(self: Any, *args: Any, **kwargs: Any) -> Any:
            fd = os.open(serial, os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                return append(self, *args, **kwargs)
            finally:
                os.close(fd)

        ledger_module.Ledger.append = serialised  # type: ignore[method-assign]


def _process(path: str, shape: tuple[int, int, float, str | None], start: Any, queue: Any) -> None:
    """One process: ``threads`` threads charging; reports latencies and the WAL syncs run."""
    threads, n, delay, serial = shape
    _emulate(delay, serial)

    syncs = [0]
    original = getattr(ledger_module, "_sync_wal", None)
    if original is not None:  # the code before group commit has none on a charge's path

        def counted(p: Path) -> None:
            syncs[0] += 1
            original(p)

        ledger_module._sync_wal = counted  # type: ignore[attr-defined,assignment]
    local = threading.Barrier(threads + 1)
    outs: list[list[float]] = [[] for _ in range(threads)]
    workers = [
        threading.Thread(target=_thread, args=(path, n, local, outs[i])) for i in range(threads)
    ]
    for w in workers:
        w.start()
    start.wait()
    local.wait()
    for w in workers:
        w.join()
    queue.put({"latencies": [x for o in outs for x in o], "syncs": syncs[0]})


def run_config(
    folder: str, config: tuple[int, int, int], delay: float = 0, serial: bool = False
) -> dict[str, Any]:
    """One configuration on a fresh ledger, with whatever dpsql is on the path."""
    processes, threads, n = config

    path = Path(folder) / f"ledger-{processes}x{threads}-{time.monotonic_ns()}.db"
    spec = BudgetSpec(epsilon=Fraction(10), delta=Fraction(0))
    Ledger.create(path, "bench", budget=budget_caps(spec)).close()
    ctx = multiprocessing.get_context("forkserver")
    start, queue = ctx.Barrier(processes + 1), ctx.Queue()
    lock = str(path) + ".serial" if serial else None
    workers = [
        ctx.Process(target=_process, args=(str(path), (threads, n, delay, lock), start, queue))
        for _ in range(processes)
    ]
    for w in workers:
        w.start()
    start.wait()
    began = time.perf_counter()
    results = [queue.get() for _ in workers]
    wall = time.perf_counter() - began
    for w in workers:
        w.join()
        if w.exitcode != 0:
            raise RuntimeError(f"a worker failed (exit code {w.exitcode})")
    total = processes * threads * n
    assert Ledger(path).verify() == total + 1  # record 1: the budget
    latencies = [x for r in results for x in r["latencies"]]
    return {"latencies": latencies, "rate": total / wall,
            "syncs": sum(r["syncs"] for r in results) / total}  # fmt: skip


def _measure(
    code: Path, folder: Path, config: tuple[int, int, int], delay: float, serial: bool
) -> dict[str, Any]:
    """One configuration in a fresh interpreter whose dpsql is the one in ``code``."""
    env = dict(os.environ, PYTHONPATH=str(code))
    processes, threads, n = config
    args = [sys.executable, str(HERE / "group_commit.py"), "--config",
            f"{processes},{threads},{n},{delay},{int(serial)}", "--dir", str(folder)]  # fmt: skip
    out = subprocess.run(args, env=env, check=True, capture_output=True, text=True, cwd=code)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--charges", type=int, default=100, help="per thread")
    parser.add_argument("--before", type=Path, default=None)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--delay", type=float, default=0.0, help="ms added to each sync")
    parser.add_argument("--config", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.config:  # a child: one configuration, printed as JSON
        p, t, n, delay, serial = args.config.split(",")
        multiprocessing.get_context("forkserver").set_forkserver_preload(
            ["dpsql.accounting.budget.build"]
        )
        config = (int(p), int(t), int(n))
        result = run_config(str(args.dir), config, float(delay), serial == "1")
        print(json.dumps(result))
        return
    runs = [("grouped", HERE.parent, False), ("serial", HERE.parent, True)]
    if args.before and not args.delay:
        runs.append(("before", args.before.resolve(), False))
    lines = [f"{'P x T':<6} | {'code':<7} | {'ms per charge (median / p95)':>28} | "
             f"{'charges/s':>9} | {'WAL syncs/charge':>16} | {'fsync p95':>9}"]  # fmt: skip
    lines.append("-" * len(lines[0]))
    with tempfile.TemporaryDirectory(dir=args.dir or HERE) as folder:
        for processes, threads in CONFIGS:
            sync = p95(fsyncs(Path(folder), 200))
            for name, code, serial in runs:
                config = (processes, threads, args.charges)
                r = _measure(code, Path(folder), config, args.delay, serial)
                lat = r["latencies"]
                syncs = f"{r['syncs']:.2f}" if name != "before" else "1 (FULL)"
                lines.append(
                    f"{processes} x {threads:<2} | {name:<7} | "
                    f"{statistics.median(lat):12.3f} / {p95(lat):12.3f} | {r['rate']:9,.0f} | "
                    f"{syncs:>16} | {sync:9.3f}"
                )
    before = f" --before {args.before}" if args.before else ""
    delay = f" --delay {args.delay:g}" if args.delay else ""
    print(f"{dt.date.today().isoformat()}, python benchmarks/group_commit.py "
          f"--charges {args.charges}{before}{delay}")  # fmt: skip
    print("\n".join(lines))


if __name__ == "__main__":
    main()
