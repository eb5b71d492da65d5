"""Fresh queries per second with 1, 2 and 4 processes answering on one durable ledger.

Each process opens its own ``Session`` on the same policy (the 100k-row data of ``run.py``, a
durable ledger made by ``dpsql init`` in a fresh folder) and, after a common start, answers
``--queries`` fresh queries (``Session.execute(sql, fresh=True)``: the plan reused, the filter's
check and the charge in one transaction under the ledger's inter-process lock, the engine, noise
and the durable release record). Beside it, in the same run: the same processes each with an
in-memory ledger (no sharing, no durability), the rate the machine gives without the shared
ledger. Queries per second are the total answered over the wall time from the start to the last
process's end.

    python benchmarks/processes.py [--queries 200] [--dir PATH]

This is how several ``dpsql serve`` processes, or several batch jobs, share one budget: each
names the same ``[ledger]`` in its policy (docs/accounting.md, "Several processes").
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from queries import policy_dict
from run import data_file

from dpsql.accounting.ledger.store import create_ledger
from dpsql.policy import load_policy
from dpsql.session.session import Session

HERE = Path(__file__).resolve().parent
SQL = "SELECT region, COUNT(*) AS n FROM visits GROUP BY region"


def _policy(data: Path, ledger: Path | None) -> dict[str, Any]:
    raw = policy_dict(data, epsilon="10000")
    raw["budget"]["query_epsilon"] = "0.001"
    if ledger is not None:
        raw["ledger"] = {"path": str(ledger)}
    return raw


def _worker(raw: dict[str, Any], n: int, start: Any, done: Any) -> None:
    session = Session(load_policy(raw))
    session.execute(SQL, fresh=True)  # warm: the plan, the engine, the imports
    start.wait()
    for _ in range(n):
        session.execute(SQL, fresh=True)
    done.put(time.perf_counter())
    session.close()


def rate(raw: dict[str, Any], processes: int, n: int) -> float:
    ctx = mp.get_context("forkserver")
    start, done = ctx.Barrier(processes + 1), ctx.Queue()
    workers = [ctx.Process(target=_worker, args=(raw, n, start, done)) for _ in range(processes)]
    for w in workers:
        w.start()
    start.wait()
    begun = time.perf_counter()
    ends = [done.get() for _ in workers]
    for w in workers:
        w.join()
    return processes * n / (max(ends) - begun)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=200, help="per process")
    parser.add_argument("--dir", type=Path, default=None, help="where the ledger lives")
    args = parser.parse_args()
    data = data_file(HERE / "data", 100_000)
    print(f"fresh queries per second, {args.queries} per process: {SQL}")
    print("processes | one durable ledger | in-memory ledger each")
    for processes in (1, 2, 4):
        with tempfile.TemporaryDirectory(dir=args.dir) as folder:
            ledger = Path(folder) / "ledger.db"
            durable = _policy(data, ledger)
            create_ledger(load_policy(durable)).close()
            shared = rate(durable, processes, args.queries)
            session = Session(load_policy(durable))
            charges = sum(1 for r in session.filter.store.records() if r.kind == "charge")
            session.close()
            # warm-ups included: every answered query is one charge in the shared ledger
            assert charges == processes * (args.queries + 1), charges
        alone = rate(_policy(data, None), processes, args.queries)
        print(f"{processes:>9} | {shared:18.1f} | {alone:21.1f}", flush=True)


if __name__ == "__main__":
    main()
