"""A notebook of 20 queries on one table: one connection for all of them, against each run cold.

The data and the policy are ``scale.py``'s (rows/5 units, skewed contributions; the R or the
(L0, C) contract), at ``--rows`` rows. Twenty fresh queries (``NOTEBOOK``: counts, sums,
averages, a standard deviation and distinct units, by region, month, a CASE bucket or nothing,
with and without a WHERE) run two ways, interleaved round by round:

* **one connection**: one ``Session`` opened once, then the 20 queries in order
  (``execute(sql, fresh=True)``: each charged and run afresh, nothing served from the cache);
* **cold**: for each query, a new ``Session`` (the policy loaded, the engine opened on the data
  file, the budget's store opened), the query, the session closed; the same process, so the
  operating system's page cache is as warm as for the other.

Each cell is the median over ``--repeats`` rounds of the whole notebook's wall time; the
ratio is one connection over cold. Beside them, in the same rounds, the 20 raw queries on one
DuckDB connection (no bounds, no noise): the engine's own floor.

    python benchmarks/notebook.py [--rows 5000000] [--contract R] [--repeats 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import time
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import MEMORY_LIMIT, data_file, policy_dict

from dpsql.policy import load_policy
from dpsql.session.session import Session

BUCKET = "CASE WHEN spend < 10 THEN 'low' WHEN spend < 50 THEN 'mid' ELSE 'high' END"
NOTEBOOK = (
    "SELECT COUNT(*) FROM visits",
    "SELECT region, COUNT(*) FROM visits GROUP BY region",
    "SELECT region, SUM(spend) FROM visits GROUP BY region",
    "SELECT region, AVG(spend) FROM visits GROUP BY region",
    "SELECT COUNT(DISTINCT user_id) FROM visits",
    "SELECT month(day) AS m, COUNT(*) FROM visits GROUP BY m",
    "SELECT region, month(day) AS m, COUNT(*) FROM visits GROUP BY region, m",
    f"SELECT {BUCKET} AS b, COUNT(*) FROM visits GROUP BY b",
    "SELECT region, STDDEV(spend) FROM visits GROUP BY region",
    "SELECT SUM(spend) FROM visits",
    "SELECT AVG(age) FROM visits",
    "SELECT region, AVG(age) FROM visits GROUP BY region",
    "SELECT region, COUNT(*), SUM(spend) FROM visits WHERE age >= 30 GROUP BY region",
    "SELECT region, COUNT(*) FROM visits WHERE age < 30 GROUP BY region",
    "SELECT month(day) AS m, SUM(spend) FROM visits GROUP BY m",
    "SELECT month(day) AS m, AVG(spend) FROM visits WHERE region = 'north' GROUP BY m",
    "SELECT COUNT(*) FROM visits WHERE spend > 100",
    "SELECT region, COUNT(DISTINCT user_id) FROM visits GROUP BY region",
    f"SELECT {BUCKET} AS b, AVG(age) FROM visits GROUP BY b",
    "SELECT region, STDDEV(age) FROM visits GROUP BY region",
)


def warm(policy: dict[str, object]) -> float:
    began = time.perf_counter()
    session = Session(load_policy(policy))
    try:
        for sql in NOTEBOOK:
            session.execute(sql, fresh=True)
    finally:
        session.close()
    return time.perf_counter() - began


def cold(policy: dict[str, object]) -> float:
    began = time.perf_counter()
    for sql in NOTEBOOK:
        session = Session(load_policy(policy))
        try:
            session.execute(sql, fresh=True)
        finally:
            session.close()
    return time.perf_counter() - began


def raw(path: Path) -> float:
    con = duckdb.connect()
    con.execute(f"CREATE VIEW visits AS SELECT * FROM read_parquet('{path}')")
    began = time.perf_counter()
    for sql in NOTEBOOK:
        con.execute(sql).fetchall()
    con.close()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--contract", choices=["R", "L0C"], default="R")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    path = data_file(Path(__file__).resolve().parent / "data", args.rows)
    policy = policy_dict(path, args.contract, MEMORY_LIMIT)
    warm(policy)  # a warm-up: the file in the page cache, every code path imported
    rounds: dict[str, list[float]] = {"one connection": [], "cold": [], "raw DuckDB": []}
    for _ in range(args.repeats):
        rounds["one connection"].append(warm(policy))
        rounds["cold"].append(cold(policy))
        rounds["raw DuckDB"].append(raw(path))
    print(f"{dt.date.today().isoformat()}, python benchmarks/notebook.py --rows {args.rows} "
          f"--contract {args.contract} --repeats {args.repeats}")  # fmt: skip
    print(f"{'20 queries':<16} | {'seconds (median)':>16} | {'min - max':>15}")
    for name, values in rounds.items():
        print(f"{name:<16} | {statistics.median(values):16.2f} | "
              f"{min(values):6.2f} - {max(values):6.2f}")  # fmt: skip
    ratio = statistics.median(rounds["one connection"]) / statistics.median(rounds["cold"])
    print(f"one connection / cold: {ratio:.2f}x")


if __name__ == "__main__":
    main()
