"""Speed of the wider SQL surface (joins, CTEs, subqueries, quantiles, COUNT(DISTINCT col), the
row cap R) beside raw DuckDB, in the same run.

    python benchmarks/breadth.py                 # 100k and 1M rows (about 2-3 minutes, 2 cores)
    python benchmarks/breadth.py --full          # also 10M rows (the self-join alone: minutes)
    python benchmarks/breadth.py --rows 100000 --repeats 9
    python benchmarks/breadth.py --profile       # + EXPLAIN ANALYZE hot spots of (b)

Data: the synthetic ``visits`` table of ``queries.write_visits`` (rows/10 units, skewed
contributions, generated into ``benchmarks/data/`` when missing) under ``queries.policy_dict``
(L0 = 2, C = 10, spend in [0, 200], age in [18, 90], public regions; total epsilon 10,000), plus
a public lookup ``zones(region, zone)`` written here: two rows, both for ``north``, so an inner
join keeps north's rows only and duplicates each of them (the zones are public values).

Each query is timed three ways, interleaved (median wall time over the repeats after a warm-up):

* (a) raw: the analyst's SQL text straight on a plain DuckDB connection over the same files
  (no privacy at all; DuckDB's own optimizations apply, e.g. MIN/MAX from Parquet statistics,
  COUNT pushed through a join);
* (b) generated: dpsql's bounded SQL (``plan.engine_sql``) run by the session's engine, the
  salt bound as ``$salt`` as in a real answer (``session.engine.run(plan.engine_sql)``);
* (c) dpsql: ``session.execute(sql, fresh=True, **options)`` end to end: parse, validate,
  analyze, plan, bind check, charge, the bounded SQL, noise (or the exponential mechanism) and
  post-processing.

A query whose warm-up takes over ``HEAVY_SECONDS`` counts its warm-up as a sample and takes
``HEAVY_REPEATS`` samples in all (the self-join at 1M rows). Results are printed as Markdown
tables and written as JSON into ``benchmarks/results/``. ``--profile`` adds, per query at the
largest size, the three most expensive operators of (b) from DuckDB's ``EXPLAIN ANALYZE`` on a
separate connection (salt bound to 7).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from dpsql.policy import load_policy
from dpsql.session.session import Session

sys.path.insert(0, str(Path(__file__).resolve().parent))
from queries import policy_dict, write_visits
from run import write_results

HERE = Path(__file__).resolve().parent
UNITS_PER_ROW = 10
DEFAULT_ROWS = (100_000, 1_000_000)
FULL_ROWS = (*DEFAULT_ROWS, 10_000_000)
ZONES = (("north", "N1"), ("north", "N2"))
HEAVY_SECONDS = 2.0
HEAVY_REPEATS = 3
PROFILE_SALT = 7
VARIANTS = ("raw", "generated", "dpsql")


@dataclass(frozen=True)
class BreadthQuery:
    name: str
    sql: str  # the analyst's SQL: sent to dpsql, and run as is for (a)
    options: tuple[tuple[str, object], ...] = ()  # per-query dpsql options (none for (a))

    @property
    def kwargs(self) -> dict[str, object]:
        return dict(self.options)


QUERIES: tuple[BreadthQuery, ...] = (
    BreadthQuery(
        "join_public_by_zone",
        "SELECT zone, COUNT(*) AS n, SUM(spend) AS total "
        "FROM visits JOIN zones ON visits.region = zones.region GROUP BY zone",
    ),
    BreadthQuery(
        "self_join_by_region",
        "SELECT a.region, COUNT(*) AS n FROM visits a JOIN visits b "
        "ON a.user_id = b.user_id GROUP BY a.region",
    ),
    BreadthQuery(
        "cte_per_unit",
        "WITH t AS (SELECT user_id, COUNT(*) AS n, AVG(spend) AS a FROM visits GROUP BY user_id) "
        "SELECT COUNT(*) AS units, SUM(LEAST(n, 5)) AS visits5, AVG(a) AS mean_spend FROM t",
    ),
    BreadthQuery(
        "subquery_row_level",
        "SELECT region, COUNT(*) AS n, SUM(s2) AS total FROM "
        "(SELECT user_id, region, spend * 2 AS s2 FROM visits WHERE age >= 30) AS q "
        "GROUP BY region",
    ),
    BreadthQuery(
        "count_distinct_age",
        "SELECT region, COUNT(DISTINCT age) AS ages FROM visits GROUP BY region",
    ),
    BreadthQuery(
        "median_by_region",
        "SELECT region, MEDIAN(spend) AS median FROM visits GROUP BY region",
    ),
    BreadthQuery("quantile_90", "SELECT QUANTILE_CONT(spend, 0.9) AS p90 FROM visits"),
    BreadthQuery("min_max", "SELECT MIN(age) AS youngest, MAX(spend) AS top FROM visits"),
    BreadthQuery("count_by_region", "SELECT region, COUNT(*) AS n FROM visits GROUP BY region"),
    BreadthQuery(
        "count_by_region_R5",
        "SELECT region, COUNT(*) AS n FROM visits GROUP BY region",
        (("max_rows_per_unit", 5),),
    ),
)
ROW_CAP_PAIR = ("count_by_region_R5", "count_by_region")  # (with R, without R)


# -- data -------------------------------------------------------------------------------------


def visits_file(data_dir: Path, n_rows: int) -> Path:
    """The ``visits`` file of ``run.py`` (same name and seed), generated when missing."""
    path = data_dir / f"visits_{n_rows}.parquet"
    if not path.exists():
        start = time.perf_counter()
        write_visits(path, n_rows, max(1, n_rows // UNITS_PER_ROW))
        print(f"generated {path} ({n_rows:,} rows) in {time.perf_counter() - start:.1f} s")
    return path


def zones_file(data_dir: Path) -> Path:
    """The public lookup, rewritten on every run (it is tiny)."""
    path = data_dir / "zones.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    values = ", ".join(f"('{region}', '{zone}')" for region, zone in ZONES)
    con = duckdb.connect(":memory:")
    try:
        con.execute(
            f"COPY (SELECT * FROM (VALUES {values}) AS z(region, zone)) "
            f"TO '{path}' (FORMAT PARQUET)"
        )
    finally:
        con.close()
    return path


def policy(visits: Path, zones: Path) -> dict[str, Any]:
    """``queries.policy_dict`` plus the public ``zones`` table (its zones public values)."""
    raw = policy_dict(visits)
    raw["data"]["tables"]["zones"] = str(zones.resolve())
    zone_values = sorted({zone for _, zone in ZONES})
    raw["tables"]["zones"] = {"public": True, "columns": {"zone": {"public_values": zone_values}}}
    return raw


def plain_connection(visits: Path, zones: Path) -> duckdb.DuckDBPyConnection:
    """A plain in-memory DuckDB with the same views as dpsql's engine (default threads)."""
    con = duckdb.connect(":memory:")
    con.execute(f"CREATE VIEW visits AS SELECT * FROM read_parquet('{visits.resolve()}')")
    con.execute(f"CREATE VIEW zones AS SELECT * FROM read_parquet('{zones.resolve()}')")
    return con


# -- timing -----------------------------------------------------------------------------------


def seconds(fn: Callable[[], object]) -> tuple[float, float]:
    """Wall time and process CPU time (all DuckDB threads) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def bench_query(
    q: BreadthQuery,
    session: Session,
    raw: duckdb.DuckDBPyConnection,
    n_rows: int,
    repeats: int,
) -> dict[str, Any]:
    plan = session.plan(q.sql, None, **q.kwargs)
    runs: dict[str, Callable[[], object]] = {
        "raw": lambda: raw.execute(q.sql).fetchall(),
        "generated": lambda: session.engine.run(plan.engine_sql),
        "dpsql": lambda: session.execute(q.sql, None, fresh=True, **q.kwargs),
    }
    wall: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    warm = {name: seconds(fn) for name, fn in runs.items()}  # page cache, Parquet metadata
    heavy = max(w for w, _ in warm.values()) > HEAVY_SECONDS
    if heavy:  # a multi-second run is not distorted by a cold start: the warm-up counts
        for name, (w, c) in warm.items():
            wall[name].append(w)
            cpu[name].append(c)
    for _ in range(min(repeats, HEAVY_REPEATS) - 1 if heavy else repeats):
        for name, fn in runs.items():
            w, c = seconds(fn)
            wall[name].append(w)
            cpu[name].append(c)
    row: dict[str, Any] = {
        "rows": n_rows,
        "query": q.name,
        "sql": q.sql,
        "options": q.kwargs,
        "measurements": [m.spec.kind for m in plan.measurements],
        "bounds": {"L0": plan.max_groups, "C": plan.max_rows, "R": plan.options.max_rows_per_unit},
        "samples": len(wall["raw"]),
    }
    row.update({f"{name}_ms": ms(s) for name, s in wall.items()})
    row.update({f"{name}_cpu_ms": ms(s) for name, s in cpu.items()})
    row["samples_ms"] = {name: [round(x * 1e3, 3) for x in s] for name, s in wall.items()}
    row["cpu_samples_ms"] = {name: [round(x * 1e3, 3) for x in s] for name, s in cpu.items()}
    return row


def bench_size(visits: Path, zones: Path, n_rows: int, repeats: int) -> list[dict[str, Any]]:
    session = Session(load_policy(policy(visits, zones)))
    raw = plain_connection(visits, zones)
    results = []
    try:
        for q in QUERIES:
            row = bench_query(q, session, raw, n_rows, repeats)
            results.append(row)
            print(
                f"  {n_rows:>10,} {q.name:<20} (a) {row['raw_ms']:8.1f}  "
                f"(b) {row['generated_ms']:8.1f}  (c) {row['dpsql_ms']:8.1f} ms",
                flush=True,
            )
    finally:
        session.close()
        raw.close()
    return results


# -- EXPLAIN ANALYZE hot spots ----------------------------------------------------------------


def _operators(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("children", ()):
        yield from _operators(child)


def _describe(op: dict[str, Any]) -> str:
    info = op.get("extra_info", {})
    parts = []
    for key in ("Groups", "Aggregates", "Conditions", "Join Type", "Function", "Projections"):
        value = info.get(key)
        if value:
            text = ", ".join(value) if isinstance(value, list) else str(value)
            parts.append(f"{key}: {text}")
    detail = "; ".join(parts)
    return detail if len(detail) <= 90 else detail[:87] + "..."


def hot_spots(visits: Path, zones: Path, sql: str, top: int = 3) -> list[str]:
    """The ``top`` operators of ``sql`` by time (EXPLAIN ANALYZE, JSON), on a new connection."""
    con = plain_connection(visits, zones)
    try:
        params = {"salt": PROFILE_SALT} if "$salt" in sql else None
        profile = json.loads(
            con.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params).fetchall()[0][1]
        )
    finally:
        con.close()
    ops = [op for root in profile["operator"] for op in _operators(root)]
    total = sum(float(op.get("timing", 0.0)) for op in ops) or 1.0
    ops.sort(key=lambda op: -float(op.get("timing", 0.0)))
    return [
        f"{float(op['timing']) * 1e3:8.1f} ms ({float(op['timing']) / total:4.0%}) "
        f"{op['name']} -> {int(op.get('intermediate_rows', 0)):,} rows  {_describe(op)}"
        for op in ops[:top]
    ]


def print_profiles(visits: Path, zones: Path, n_rows: int) -> None:
    session = Session(load_policy(policy(visits, zones)))
    try:
        print(
            f"\nEXPLAIN ANALYZE hot spots of (b), {n_rows:,} rows (operator time summed over "
            "threads, and its share of all operators)"
        )
        for q in QUERIES:
            plan = session.plan(q.sql, None, **q.kwargs)
            print(f"{q.name}:")
            for line in hot_spots(visits, zones, plan.engine_sql):
                print("  " + line)
    finally:
        session.close()


# -- output -----------------------------------------------------------------------------------


def print_tables(results: list[dict[str, Any]]) -> None:
    head = (
        f"| {'rows':>10} | {'query':<20} | {'(a) raw ms':>10} | {'(b) gen ms':>10} | "
        f"{'(c) dpsql ms':>12} | {'(b)/(a)':>8} | {'(c)/(a)':>8} | {'(c)-(b) ms':>10} | "
        f"{'CPU (b)/(a)':>11} |"
    )
    cells = head.split("|")[1:-1]  # Markdown: the first two columns left, numbers right
    rule = "|" + "|".join("-" * (len(c) - 1) + (":" if i > 1 else "-") for i, c in enumerate(cells))
    rule += "|"
    print("\n" + head + "\n" + rule)
    for r in results:
        print(
            f"| {r['rows']:>10,} | {r['query']:<20} | {r['raw_ms']:>10.1f} | "
            f"{r['generated_ms']:>10.1f} | {r['dpsql_ms']:>12.1f} | "
            f"{r['generated_ms'] / r['raw_ms']:>7.1f}x | {r['dpsql_ms'] / r['raw_ms']:>7.1f}x | "
            f"{r['dpsql_ms'] - r['generated_ms']:>10.1f} | "
            f"{r['generated_cpu_ms'] / max(r['raw_cpu_ms'], 1e-3):>10.1f}x |"
        )
    with_r, without_r = ROW_CAP_PAIR
    by_key = {(r["rows"], r["query"]): r for r in results}
    print("\nrow cap R = 5 against the same query without R (median wall time):")
    for n in sorted({r["rows"] for r in results}):
        a, b = by_key.get((n, with_r)), by_key.get((n, without_r))
        if a is None or b is None:
            continue
        print(
            f"  {n:>10,} rows: (b) {a['generated_ms']:.1f} / {b['generated_ms']:.1f} ms = "
            f"{a['generated_ms'] / b['generated_ms']:.2f}x; (c) {a['dpsql_ms']:.1f} / "
            f"{b['dpsql_ms']:.1f} ms = {a['dpsql_ms'] / b['dpsql_ms']:.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="also 10M rows")
    parser.add_argument("--rows", type=int, nargs="+", help="table sizes (default 100k and 1M)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="EXPLAIN ANALYZE hot spots of (b)")
    parser.add_argument("--data-dir", type=Path, default=HERE / "data")
    parser.add_argument("--results-dir", type=Path, default=HERE / "results")
    args = parser.parse_args()
    sizes = args.rows or (FULL_ROWS if args.full else DEFAULT_ROWS)
    started = dt.datetime.now(dt.UTC)
    print(f"{os.cpu_count()} CPUs, DuckDB {duckdb.__version__}, median of {args.repeats}")
    zones = zones_file(args.data_dir)
    results = []
    for n in sizes:
        results += bench_size(visits_file(args.data_dir, n), zones, n, args.repeats)
    print_tables(results)
    if args.profile:
        print_profiles(visits_file(args.data_dir, max(sizes)), zones, max(sizes))
    write_results(
        args.results_dir, "breadth", started, args.repeats, results, load_average=os.getloadavg()
    )


if __name__ == "__main__":
    main()
