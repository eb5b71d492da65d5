"""End-to-end latency of dpsql against the raw aggregate and a hand-written bounded SQL.

Run: ``python benchmarks/run.py`` (100k and 10M rows), ``--quick`` (100k only), ``--rows N ...``,
``--repeats R``. Data is generated into ``benchmarks/data/`` when missing (rows/10 units, skewed
contributions; see ``queries.write_visits``); results are printed and written as JSON into
``benchmarks/results/``. For every query of ``queries.QUERIES``, each figure is the median wall
time over the repeats (after one warm-up; the three are interleaved so drift hits all alike):

* dpsql: ``Session.execute(sql, fresh=True)`` end to end, repeated: the session reuses the
  plan it kept for the text (parse, validate, analyze, plan and the engine's bind checks ran
  once), then the filter check, the charge, the bounded query in DuckDB, noise and
  post-processing run every time. ``overhead.py`` splits a first and a repeated execution into
  stages.
* (a) raw: the analyst's SQL straight on DuckDB (no privacy at all).
* (b) hand: the hand-written bounded SQL of ``queries.py``: the same bounds, the same numbers
  (checked on every run against dpsql's own bounded query), written for this table by hand.

The target is dpsql within 1.3x of (b) at 10M rows. "CPU d/(b)" is the same ratio on process
CPU time (all DuckDB threads), much less sensitive to other load on the machine. A second table
splits dpsql's time into stages (plan incl. check, check alone, the generated SQL alone in
dpsql's engine, release).
(a) and (b) run on a plain in-memory DuckDB connection with the same Parquet view and the same
default thread count as dpsql's engine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb

from dpsql.policy import load_policy
from dpsql.release.post import release
from dpsql.session.session import Session

sys.path.insert(0, str(Path(__file__).resolve().parent))
from queries import QUERIES, Bounds, policy_dict, totals, write_visits

HERE = Path(__file__).resolve().parent
TARGET = 1.3  # dpsql / (b) at 10M rows
TARGET_ROWS = 10_000_000
UNITS_PER_ROW = 10  # 1M units for 10M rows


def data_file(data_dir: Path, n_rows: int) -> Path:
    path = data_dir / f"visits_{n_rows}.parquet"
    if not path.exists():
        start = time.perf_counter()
        write_visits(path, n_rows, max(1, n_rows // UNITS_PER_ROW))
        print(f"generated {path} ({n_rows:,} rows) in {time.perf_counter() - start:.1f} s")
    return path


def seconds(fn: Callable[[], object]) -> tuple[float, float]:
    """Wall time and process CPU time (all DuckDB threads) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def bench_size(path: Path, n_rows: int, repeats: int) -> list[dict[str, Any]]:
    session = Session(load_policy(policy_dict(path)))
    planner = Session(session.policy)
    raw = duckdb.connect(":memory:")
    raw.execute(f"CREATE VIEW visits AS SELECT * FROM read_parquet('{path}')")
    bounds = Bounds(salt=session.engine.salt)
    results = []
    for q in QUERIES:
        plan = session.plan(q.sql)
        grids = {e.grid.step for e in plan.estimates if e.grid is not None}
        assert grids <= {bounds.step}, f"grid {grids} != documented rule {bounds.step}"
        kinds = tuple(m.spec.kind for m in plan.measurements)
        assert kinds == q.kinds, f"{q.name}: dpsql measures {kinds}, (b) computes {q.kinds}"
        generated = plan.bounded_sql
        hand = q.bounded(bounds)
        _, ours = session.engine.run(generated)
        match = totals(ours, q.keyed) == totals(raw.execute(hand).fetchall(), q.keyed)

        runs: dict[str, Callable[[], object]] = {
            # fresh: a release served from the cache would not run the engine at all
            "dpsql": lambda q=q: session.execute(q.sql, fresh=True),
            "raw": lambda q=q: raw.execute(q.sql).fetchall(),
            "hand": lambda hand=hand: raw.execute(hand).fetchall(),
            # stages of dpsql, for the breakdown
            # a first plan of the text, in a second session (this one would reuse its plan)
            "plan": lambda q=q: (planner._plans.clear(), planner.plan(q.sql)),
            "check": lambda sql=generated: session.engine.check(sql),
            "engine": lambda sql=generated: session.engine.run(sql),
            "release": lambda plan=plan, rows=ours: release(plan, rows),
        }
        samples: dict[str, list[float]] = {name: [] for name in runs}
        cpu: dict[str, list[float]] = {name: [] for name in runs}
        for fn in runs.values():
            fn()  # warm-up: OS page cache, Parquet metadata, imports
        for _ in range(repeats):
            for name, fn in runs.items():
                wall, used = seconds(fn)
                samples[name].append(wall)
                cpu[name].append(used)
        row: dict[str, Any] = {"rows": n_rows, "query": q.name, "sql": q.sql, "match": match}
        row.update({f"{name}_ms": ms(s) for name, s in samples.items()})
        row.update({f"{name}_cpu_ms": ms(s) for name, s in cpu.items()})
        row["cpu_samples_ms"] = {name: [round(x * 1e3, 3) for x in s] for name, s in cpu.items()}
        row["samples_ms"] = {name: [round(x * 1e3, 3) for x in s] for name, s in samples.items()}
        results.append(row)
        print(f"  {n_rows:>10,} {q.name:<20} dpsql {row['dpsql_ms']:8.1f} ms", flush=True)
    session.close()
    planner.close()
    raw.close()
    return results


def print_tables(results: list[dict[str, Any]]) -> None:
    head = (
        f"{'rows':>10} | {'query':<20} | {'dpsql ms':>9} | {'(a) raw':>8} | {'(b) hand':>8} | "
        f"{'dpsql/(a)':>9} | {'dpsql/(b)':>9} | {'CPU d/(b)':>9} | {'dpsql-(b) ms':>12} | "
        f"{'same':>4}"
    )
    print("\n" + head + "\n" + "-" * len(head))
    for r in results:
        print(
            f"{r['rows']:>10,} | {r['query']:<20} | {r['dpsql_ms']:>9.1f} | {r['raw_ms']:>8.1f} | "
            f"{r['hand_ms']:>8.1f} | {r['dpsql_ms'] / r['raw_ms']:>8.2f}x | "
            f"{r['dpsql_ms'] / r['hand_ms']:>8.2f}x | "
            f"{r['dpsql_cpu_ms'] / r['hand_cpu_ms']:>8.2f}x | "
            f"{r['dpsql_ms'] - r['hand_ms']:>12.1f} | "
            f"{'yes' if r['match'] else 'NO':>4}"
        )
    head = (
        f"{'rows':>10} | {'query':<20} | {'plan+check':>10} | {'check':>6} | "
        f"{'generated SQL':>13} | {'(b) hand':>8} | {'gen/(b)':>7} | {'release':>7}"
    )
    print("\ndpsql stages (wall ms; plan+check = session.plan; generated SQL = engine.run alone)")
    print(head + "\n" + "-" * len(head))
    for r in results:
        print(
            f"{r['rows']:>10,} | {r['query']:<20} | {r['plan_ms']:>10.2f} | "
            f"{r['check_ms']:>6.2f} | {r['engine_ms']:>13.1f} | {r['hand_ms']:>8.1f} | "
            f"{r['engine_ms'] / r['hand_ms']:>6.2f}x | {r['release_ms']:>7.2f}"
        )
    big = [r for r in results if r["rows"] >= TARGET_ROWS]
    if big:
        worst = max(r["dpsql_ms"] / r["hand_ms"] for r in big)
        worst_cpu = max(r["dpsql_cpu_ms"] / r["hand_cpu_ms"] for r in big)
        verdict = "meets" if worst <= TARGET else "MISSES"
        print(
            f"\nworst dpsql/(b) at >= {TARGET_ROWS:,} rows: {worst:.2f}x wall ({verdict} "
            f"{TARGET}x), {worst_cpu:.2f}x CPU"
        )
    if not all(r["match"] for r in results):
        print("WARNING: (b) does not return dpsql's pre-noise totals for some query")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100k rows only")
    parser.add_argument("--rows", type=int, nargs="+", help="table sizes (default 100k and 10M)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--data-dir", type=Path, default=HERE / "data")
    parser.add_argument("--results-dir", type=Path, default=HERE / "results")
    args = parser.parse_args()
    sizes = [100_000] if args.quick else (args.rows or [100_000, TARGET_ROWS])
    started = dt.datetime.now(dt.UTC)
    print(f"{os.cpu_count()} CPUs, DuckDB {duckdb.__version__}, median of {args.repeats}")
    results = []
    for n in sizes:
        results += bench_size(data_file(args.data_dir, n), n, args.repeats)
    print_tables(results)
    write_results(args.results_dir, "run", started, args.repeats, results)


def write_results(
    directory: Path,
    name: str,
    started: dt.datetime,
    repeats: int,
    results: list[dict[str, Any]],
    **extra: object,
) -> Path:
    """Write ``results`` with the machine and versions to ``directory/NAME-<started>.json``."""
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / f"{name}-{started:%Y%m%dT%H%M%SZ}.json"
    meta = {
        "started": started.isoformat(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "duckdb": duckdb.__version__,
        "repeats": repeats,
        **extra,
    }
    out.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    print(f"results written to {out}")
    return out


if __name__ == "__main__":
    main()
