"""The ledger's tail read on disk before each record, beside the charge it guards.

Each record a session adds first checks the ledger file on disk (``CatchUp._check_size``: it has
not shrunk; ``CatchUp._check_disk``: its last record, read over a new read-only connection, is
the last one verified), so that a ledger truncated under an open session fails closed at once.
For each history length, a ledger filled as ``charges.py`` fills it, then, in the same run and
interleaved charge by charge (so that a drift of the machine hits both alike):

* **tail check alone**: ``_check_size`` + ``_check_disk`` on the open ledger;
* **durable Budget.charge**: the whole check-and-charge, with the tail check (as it runs);
* **durable Budget.charge, no tail check**: the same with the check switched off (the
  baseline: the code before it).

    python benchmarks/ledger_tail.py [--repeats 40] [--dir PATH] [--lengths 1000,10000,100000]

``--dir`` chooses the storage (default: a temporary folder beside this file, on disk); a
memory-backed one (``/dev/shm``) shows the cost without the fsyncs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import tempfile
import time
from pathlib import Path

from charges import EVENT, SPECS, fill

from dpsql.accounting.budget.build import budget_for
from dpsql.accounting.ledger.ledger import Ledger
from dpsql.accounting.ledger.store import budget_caps

LENGTHS = (1_000, 10_000, 100_000)


def measure(folder: Path, n: int, repeats: int) -> tuple[float, float, float]:
    """Median ms of the tail check, of a charge with it and of a charge without it."""
    path = folder / f"tail-{n}.db"
    Ledger.create(path, "bench", budget=budget_caps(SPECS["basic"]))
    fill(path, n, "basic")
    ledger = Ledger(path)
    budget = budget_for("bench", SPECS["basic"], ledger)
    budget.charge(EVENT, "SELECT warm-up", "bench")
    check, checked, bare = [], [], []
    real_disk, real_size = ledger._check_disk, ledger._check_size
    for i in range(repeats):
        began = time.perf_counter()
        real_size(path)
        real_disk(path)
        check.append((time.perf_counter() - began) * 1e3)
        began = time.perf_counter()
        budget.charge(EVENT, f"SELECT checked {i}", "bench")
        checked.append((time.perf_counter() - began) * 1e3)
        ledger._check_disk = ledger._check_size = lambda _path: None  # type: ignore[method-assign]
        began = time.perf_counter()
        budget.charge(EVENT, f"SELECT bare {i}", "bench")
        bare.append((time.perf_counter() - began) * 1e3)
        del ledger._check_disk, ledger._check_size  # the class's methods again
    ledger.close()
    return statistics.median(check), statistics.median(checked), statistics.median(bare)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    args = parser.parse_args()
    lengths = tuple(int(x) for x in args.lengths.split(","))
    with tempfile.TemporaryDirectory(dir=args.dir or Path(__file__).parent) as folder:
        rows = [measure(Path(folder), n, args.repeats) for n in lengths]
    names = ("tail check alone", "durable Budget.charge", "durable Budget.charge, no tail check")
    head = f"{'ms (median)':<38} | " + " | ".join(f"{n:>9,}" for n in lengths)
    where = f" --dir {args.dir}" if args.dir else ""
    print(f"{dt.date.today().isoformat()}, python benchmarks/ledger_tail.py "
          f"--repeats {args.repeats}{where}")  # fmt: skip
    print(head)
    print("-" * len(head))
    for i, name in enumerate(names):
        print(f"{name:<38} | " + " | ".join(f"{r[i]:9.3f}" for r in rows))


if __name__ == "__main__":
    main()
