"""Cache-hit latency beside a fresh answer of the same query, with a durable ledger.

    python benchmarks/cache.py [--repeats 15] [--releases 1 3 10 30 100]

On the example data (examples/data/visits.parquet): each query is answered once, then timed
afresh (``fresh=True``: plan, charge in the ledger, engine, noise, release record) and served
again from the cache (plan, lookup, re-serve record, post-processing), interleaved.

Then, as the releases of one bounded-row definition grow (a count by region released k times,
fresh), the same count asked at another epsilon (derived from all k: their least noisy one or
their inverse-variance combination, ``dpsql.cache.derive.assemble``) beside the exact repeat of
the last release (served as it was), interleaved; medians.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import tomllib
from decimal import Decimal
from pathlib import Path

from dpsql.accounting.ledger.store import create_ledger
from dpsql.policy import load_policy
from dpsql.session.session import Session

ROOT = Path(__file__).resolve().parent.parent
QUERIES = {
    "count_by_region": "SELECT region, COUNT(*) FROM visits GROUP BY region",
    "avg_by_region": "SELECT region, AVG(spend) FROM visits WHERE age >= 30 GROUP BY region",
    "private_keys": "SELECT age // 10 AS decade, COUNT(*) FROM visits GROUP BY 1",
    "total": "SELECT COUNT(*), SUM(spend) FROM visits",
}


def session(folder: Path) -> Session:
    raw = tomllib.loads((ROOT / "examples" / "policy.toml").read_text(), parse_float=Decimal)
    raw["data"]["tables"]["visits"] = str(ROOT / "examples" / "data" / "visits.parquet")
    raw["budget"]["epsilon"] = "10000"
    raw["budget"]["delta"] = "0.5"
    raw["ledger"] = {"path": str(folder / "ledger.sqlite")}
    policy = load_policy(raw, base_dir=folder)
    create_ledger(policy)
    return Session(policy)


def timed(run: Session, sql: str, fresh: bool) -> float:
    start = time.perf_counter()
    result = run.execute(sql, fresh=fresh)
    elapsed = (time.perf_counter() - start) * 1000
    assert (result.charge is not None) == fresh
    return elapsed


def derived(run: Session, counts: list[int], repeats: int) -> None:
    # A filter of its own: releases of the table above are not among the k.
    sql = "SELECT region, COUNT(*) FROM visits WHERE age >= 18 GROUP BY region"
    print(f"\n{'releases':>8} | {'exact hit ms':>12} | {'derived ms':>10} | {'derived/exact':>13}")
    print("-" * 54)
    made = 0
    for k in counts:
        while made < k:
            run.execute(sql, epsilon="0.5", fresh=True)
            made += 1
        exact, other = [], []
        for _ in range(repeats):
            start = time.perf_counter()
            run.execute(sql, epsilon="0.5")
            exact.append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            result = run.execute(sql, epsilon="0.3")
            other.append((time.perf_counter() - start) * 1000)
            assert result.charge is None and "derived from release(s)" in (result.note or "")
        e, d = statistics.median(exact), statistics.median(other)
        print(f"{k:>8} | {e:>12.1f} | {d:>10.1f} | {d / e:>12.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--releases", type=int, nargs="+", default=[1, 3, 10, 30, 100])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        run = session(Path(folder))
        print(f"{'query':<16} | {'fresh ms':>9} | {'cache hit ms':>12} | {'hit/fresh':>9}")
        print("-" * 56)
        for name, sql in QUERIES.items():
            run.execute(sql)
            fresh, hit = [], []
            for _ in range(args.repeats):
                fresh.append(timed(run, sql, True))
                hit.append(timed(run, sql, False))
            f, h = statistics.median(fresh), statistics.median(hit)
            print(f"{name:<16} | {f:>9.1f} | {h:>12.1f} | {h / f:>8.2f}x")
        derived(run, sorted(args.releases), args.repeats)


if __name__ == "__main__":
    main()
