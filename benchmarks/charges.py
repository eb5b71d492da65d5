"""Durable charge time against the ledger's length: 10^3, 10^4 and 10^5 records.

For each length, a fresh ledger is filled with that many valid charge records (``fill``: one
transaction of records chained and anchored exactly as ``Ledger.append`` chains them, so that
every record verifies; it bypasses the filter and exists for benchmarks only). A new ``Ledger``
then opens it (verifying the whole chain) and a ``Budget`` folds it, untimed; then
``--repeats`` single charges are timed one by one and the median reported, in ms. Each charge
is the whole check-and-charge: the write lock, ``BEGIN IMMEDIATE``, bringing the ledger and the
filter's tallies up to the tail, the decision, the ``synchronous=FULL`` commit and the fsynced
anchor. Rows, in the same run:

* **durable Budget.charge, basic** and **rdp** filters (the RDP filter's union over 46 orders);
* **bare SQLite INSERT (FULL)**: one ~400-byte row per ``BEGIN IMMEDIATE`` transaction into a WAL
  table that already holds that many rows, over one kept connection: the storage's floor;
* **dp_accounting RDP compose + get_epsilon**: the in-memory decision of Google's accountant at
  that history length (no storage), the reference for the RDP decision alone;
* **fsync of a 4 KiB write**: the disk's own sync latency, in the same folder and run (a 4 KiB
  ``os.write`` then ``os.fsync`` on one open file, repeated).

Each cell is the median and the 95th percentile (nearest rank) of the timed repeats; the last
line divides the durable basic charge's p95 by the fsync's p95.

    python benchmarks/charges.py [--repeats 20] [--dir PATH] [--lengths 1000,10000,100000]

``--dir`` chooses the storage (default: a temporary folder beside this file, on disk); a
memory-backed one (``/dev/shm``) shows the cost without the fsyncs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

from dp_accounting import dp_event, rdp

from dpsql.accounting.budget.build import budget_for
from dpsql.accounting.ledger.anchor import _anchor, _write_anchor
from dpsql.accounting.ledger.chain import canonical, record_hash
from dpsql.accounting.ledger.ledger import Ledger
from dpsql.accounting.ledger.store import budget_caps
from dpsql.mechanisms.event_kinds import composite_to_json
from dpsql.mechanisms.events import Composite
from dpsql.mechanisms.gaussian_events import DiscreteGaussian
from dpsql.policy import BudgetSpec

LENGTHS = (1_000, 10_000, 100_000)
# A small discrete Gaussian (calibrated to epsilon 1e-3, delta 1e-12): 10^5 of them fit.
EVENT = Composite(
    (DiscreteGaussian(Fraction(10**8), Fraction(1), Fraction(1, 1000), Fraction(1, 10**12)),)
)
SPECS = {
    "basic": BudgetSpec(epsilon=Fraction(1000), delta=Fraction(1, 10**5)),
    "rdp": BudgetSpec(epsilon=Fraction(1000), delta=Fraction(1, 10**5), accountant="rdp"),
}


def fill(path: Path, n: int, accountant: str, cycle: Sequence[Composite] = (EVENT,)) -> None:
    """Append ``n`` charge records (the composites of ``cycle`` in turn) in one transaction,
    chained and anchored as ``Ledger.append`` does (``record_hash``, ``canonical``, the anchor):
    a ledger whose every record verifies, made in seconds rather than n fsyncs. No filter
    decides: benchmarks only."""
    ledger = Ledger(path)
    last = ledger.records()[-1]
    prev, seq, rows = last.hash, last.seq, []
    events = [composite_to_json(c) for c in cycle]
    for i in range(n):
        seq += 1
        when = time.time()
        composite = cycle[i % len(cycle)]
        payload = {"query": f"SELECT COUNT(*) FROM visits -- {i}", "event": events[i % len(cycle)],
                   "epsilon": str(composite.epsilon), "delta": str(composite.delta),
                   "accountant": accountant}  # fmt: skip
        body = canonical(payload)
        digest = record_hash(prev, (seq, when, "charge", "bench", body))
        rows.append((seq, when, "charge", "bench", body, prev, digest))
        prev = digest
    con = sqlite3.connect(path, isolation_level=None)
    try:
        con.execute("BEGIN IMMEDIATE")
        con.executemany("INSERT INTO records VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
        con.execute("COMMIT")
    finally:
        con.close()
    _write_anchor(ledger.anchor, _anchor(ledger.identity, seq, prev))
    ledger.close()


def durable(folder: Path, n: int, accountant: str, repeats: int) -> list[float]:
    path = folder / f"{accountant}-{n}.db"
    Ledger.create(path, "bench", budget=budget_caps(SPECS[accountant]))
    fill(path, n, accountant)
    budget = budget_for("bench", SPECS[accountant], Ledger(path))
    budget.charge(EVENT, "SELECT warm-up", "bench")
    samples = []
    for i in range(repeats):
        began = time.perf_counter()
        budget.charge(EVENT, f"SELECT timed {i}", "bench")
        samples.append((time.perf_counter() - began) * 1e3)
    return samples


def bare(folder: Path, n: int, repeats: int) -> list[float]:
    path = folder / f"bare-{n}.db"
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=FULL")
    con.execute("CREATE TABLE t (seq INTEGER PRIMARY KEY, payload TEXT)")
    payload = "x" * 400  # about the size of a charge record's payload
    con.execute("BEGIN")
    con.executemany("INSERT INTO t (payload) VALUES (?)", ((payload,) for _ in range(n)))
    con.execute("COMMIT")
    samples = []
    for _ in range(repeats):
        began = time.perf_counter()
        con.execute("BEGIN IMMEDIATE")
        con.execute("INSERT INTO t (payload) VALUES (?)", (payload,))
        con.execute("COMMIT")
        samples.append((time.perf_counter() - began) * 1e3)
    con.close()
    return samples


def reference(n: int, repeats: int) -> list[float]:
    """dp_accounting's RDP accountant after n events: compose one more, read epsilon."""
    sigma = float(EVENT.events[0].sigma2) ** 0.5  # type: ignore[union-attr]
    acc = rdp.RdpAccountant()
    acc.compose(dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(sigma), n))
    samples = []
    for _ in range(repeats):
        began = time.perf_counter()
        acc.compose(dp_event.GaussianDpEvent(sigma))
        acc.get_epsilon(1e-6)
        samples.append((time.perf_counter() - began) * 1e3)
    return samples


def fsyncs(folder: Path, repeats: int) -> list[float]:
    """The disk's sync latency: a 4 KiB write then fsync, ``repeats`` times on one file."""
    fd = os.open(folder / "fsync.bin", os.O_CREAT | os.O_WRONLY, 0o600)
    block = b"x" * 4096
    samples = []
    try:
        for _ in range(repeats):
            began = time.perf_counter()
            os.write(fd, block)
            os.fsync(fd)
            samples.append((time.perf_counter() - began) * 1e3)
    finally:
        os.close(fd)
    return samples


def p95(samples: list[float]) -> float:
    """The 95th percentile, nearest rank."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def table(folder: Path, lengths: tuple[int, ...], repeats: int) -> str:
    rows = {
        "durable Budget.charge, basic": [durable(folder, n, "basic", repeats) for n in lengths],
        "durable Budget.charge, rdp": [durable(folder, n, "rdp", repeats) for n in lengths],
        "bare SQLite INSERT (FULL)": [bare(folder, n, repeats) for n in lengths],
        "dp_accounting RDP (memory)": [reference(n, repeats) for n in lengths],
    }
    sync = fsyncs(folder, repeats)
    rows["fsync of a 4 KiB write"] = [sync for _ in lengths]
    head = f"{'ms per charge (median / p95)':<30} | " + " | ".join(f"{n:>15,}" for n in lengths)
    lines = [head, "-" * len(head)]
    for name, values in rows.items():
        cells = [f"{statistics.median(v):6.3f} / {p95(v):6.3f}" for v in values]
        lines.append(f"{name:<30} | " + " | ".join(cells))
    ratios = [p95(v) / p95(sync) for v in rows["durable Budget.charge, basic"]]
    lines.append(f"{'basic p95 / fsync p95':<30} | " + " | ".join(f"{r:14.2f}x" for r in ratios))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    args = parser.parse_args()
    lengths = tuple(int(x) for x in args.lengths.split(","))
    with tempfile.TemporaryDirectory(dir=args.dir or Path(__file__).parent) as folder:
        text = table(Path(folder), lengths, args.repeats)
    where = f" --dir {args.dir}" if args.dir else ""
    if lengths != LENGTHS:
        where += f" --lengths {args.lengths}"
    command = f"python benchmarks/charges.py --repeats {args.repeats}{where}"
    print(f"{dt.date.today().isoformat()}, {command}")
    print(text)


if __name__ == "__main__":
    main()
