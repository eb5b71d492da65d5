"""What the durable ledger adds to a fresh query, beside the disk's own fsync latency.

Two sessions on the same 100k-row data and policy (``run.py``'s), one whose budget lives in a
durable ledger (``dpsql init`` in a folder on disk: the charge committed, synced and anchored,
the release committed unsynced), one in memory. Each repeat runs one fresh query in each, in
turn (``execute(sql, fresh=True)``: plan reused, charge, engine, noise, release), and times
both; the difference of the two is what durability adds over the engine and the rest of the
pipeline. In the same run, the disk's own sync latency: a 4 KiB write then ``fsync``, in the
same folder, between the queries. Cells: median and 95th percentile (nearest rank).

    python benchmarks/durable_query.py [--repeats 400] [--dir PATH]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import tempfile
import time
from pathlib import Path

from charges import p95
from queries import policy_dict
from run import HERE, data_file

from dpsql.accounting.ledger.store import create_ledger
from dpsql.policy import load_policy
from dpsql.session.session import Session

QUERY = "SELECT region, COUNT(*) FROM visits GROUP BY region"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=400)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    raw = policy_dict(data_file(HERE / "data", 100_000), epsilon="10000")
    with tempfile.TemporaryDirectory(dir=args.dir or HERE) as folder:
        durable = dict(raw, ledger={"path": str(Path(folder) / "ledger.db")})
        create_ledger(load_policy(durable)).close()
        sessions = {"durable": Session(load_policy(durable)), "memory": Session(load_policy(raw))}
        fd = os.open(Path(folder) / "fsync.bin", os.O_CREAT | os.O_WRONLY, 0o600)
        times: dict[str, list[float]] = {"durable": [], "memory": [], "fsync": []}
        try:
            for session in sessions.values():  # warm-up: the plan, the file, the code paths
                session.execute(QUERY, epsilon="0.001", fresh=True)
            for _ in range(args.repeats):
                for name, session in sessions.items():
                    began = time.perf_counter()
                    session.execute(QUERY, epsilon="0.001", fresh=True)
                    times[name].append((time.perf_counter() - began) * 1e3)
                began = time.perf_counter()
                os.write(fd, b"x" * 4096)
                os.fsync(fd)
                times["fsync"].append((time.perf_counter() - began) * 1e3)
        finally:
            os.close(fd)
            for session in sessions.values():
                session.close()
    where = f" --dir {args.dir}" if args.dir else ""
    print(f"{dt.date.today().isoformat()}, python benchmarks/durable_query.py "
          f"--repeats {args.repeats}{where}")  # fmt: skip
    print(f"{'ms':<32} | {'median':>7} | {'p95':>7}")
    for name, label in (("durable", "fresh query, durable ledger"),
                        ("memory", "fresh query, ledger in memory"),
                        ("fsync", "fsync of a 4 KiB write")):  # fmt: skip
        print(f"{label:<32} | {statistics.median(times[name]):7.3f} | {p95(times[name]):7.3f}")
    added = [d - m for d, m in zip(times["durable"], times["memory"], strict=True)]
    print(f"{'durable - memory, per pair':<32} | {statistics.median(added):7.3f} | "
          f"{p95(added):7.3f}")  # fmt: skip
    ratio = (p95(times["durable"]) - p95(times["memory"])) / p95(times["fsync"])
    print(f"(durable p95 - memory p95) / fsync p95: {ratio:.2f}x")


if __name__ == "__main__":
    main()
