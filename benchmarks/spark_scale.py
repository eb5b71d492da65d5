"""dpsql on local Spark beside hand-written bounded Spark SQL, raw Spark and dpsql on DuckDB.

Run: ``python benchmarks/spark_scale.py`` (10M and 50M rows), ``--large`` (also 100M),
``--sizes N ...``, ``--repeats K`` (after one warm-up; default 3 up to 10M rows, and
``--repeats-large``, default 1, above), ``--queries count sum ...``, ``--variants spark_hand
spark_dpsql ...``, ``--report JSON ...`` (print earlier results; run nothing). The data are
``scale.py``'s (``scale.write_data``: rows/5 units, skewed contributions), under its (L0, C)
contract: L0 = 2 groups per unit, C = 10 rows per unit and group.

The queries: ``scale.py``'s (by default those by the public key region, distinct units, a public
date part and a CASE; see ``DEFAULT_QUERIES``) and two of this benchmark's own, with private
keys, on which dpsql runs partition selection (its bounded query returns per key the capped
totals and the number of kept (unit, group) pairs, the distinct-unit count that selection
thresholds, and only the keys some kept unit has):

* ``private_key_age``: ``SELECT age, COUNT(*) FROM visits GROUP BY age`` (age has bounds in the
  policy, no public domain);
* ``join_zone``: ``SELECT zone, COUNT(*), SUM(spend) FROM visits JOIN regions USING (region)
  GROUP BY zone``: an inner join with the public table ``regions`` (region -> one of three
  zones, ``regions_file``: written next to the data file, declared ``public = true`` in the
  policy of this query only), whose zone column declares no domain. dpsql bounds the joined
  rows as it bounds one table's (each is one visit with its zone attached).

Four variants, each (size, variant, query) in its own process (Spark's driver memory is fixed
when its JVM starts, and each peak memory is then the query's own):

* ``spark_raw``: the analyst's SQL straight on Spark (``spark.sql(sql).collect()``);
* ``spark_hand``: a hand-written bounded Spark SQL (``hand_spark``): the semantics of
  ``scale.hand_l0c`` in Spark's dialect (per (unit, group) pre-aggregation, every unit's
  groups ranked by ``xxhash64(unit, keys..., CAST(salt AS BIGINT))`` with the keys as
  tie-breakers and L0 kept, the C cap in exact DECIMAL(38,0) integers). A public key's rows
  are filtered to its domain and every key of the domain gets a row; a private key is not
  filtered, and its totals are per key that kept (unit, group) pairs have, with their count
  (``COUNT(*)`` of the capped pairs); the join's hand SQL reads the same join (``FROM visits
  JOIN regions USING (region)``) and bounds its rows the same way. It must return dpsql's
  pre-noise totals exactly: checked on every run (column "same") and by
  ``tests/engine/test_benchmark_spark_sql.py``;
* ``spark_dpsql``: ``Session.execute(sql, fresh=True)`` end to end with ``[engine] name =
  "spark"`` (parse, plan, the bind checks and Spark's analysis, charge, the bounded query,
  noise), its salt set to the hand SQL's so both keep the same groups;
* ``duckdb_dpsql``: the same on DuckDB (the policy's default engine and memory limit).

Every Spark variant runs on the same local Spark: ``master = local[2]``, 8 shuffle partitions,
a 12 GiB driver, the settings dpsql pins (ANSI mode, UTC, no UI). Memory: the Python process's
peak RSS (``ru_maxrss``) and the Spark JVM's (``VmHWM`` in ``/proc/<pid>/status`` of the java
process under the worker: in local mode it is the driver and the executors). CPU: the Python
process's plus the JVM's (``/proc/<pid>/stat``), so that "CPU d/hand" counts Spark's threads.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import math
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pyarrow as pa
import pyarrow.parquet as pq
from queries import REGIONS, Bounds
from scale import (
    L0,
    SALT,
    C,
    Key,
    ScaleQuery,
    _fill,
    _median,
    _rows,
    _spread,
    bernstein_measures,
    data_file,
    measures_of,
    policy_dict,
    totals,
)
from scale import QUERIES as SCALE_QUERIES

HERE = Path(__file__).resolve().parent
CONTRACT = "L0C"
MASTER = "local[2]"
SPARK_CONF = {"spark.sql.shuffle.partitions": "8", "spark.driver.memory": "12g"}

# The public table of the join: each region's zone, three of them, so that a unit that visits
# regions of all three zones has more than L0 = 2 groups
ZONES = {"central": "inland", "east": "coast", "north": "upland", "south": "coast",
         "west": "upland"}  # fmt: skip
JOIN = "visits JOIN regions USING (region)"
# Keys without a public domain: dpsql runs partition selection on them (age has only bounds in
# the policy; the zone is a column of a public table that declares no domain)
AGE = Key("age", None)
ZONE = Key("zone", None)
# This benchmark's own queries beside scale.py's: a GROUP BY a private key, and a join with a
# public table grouped by its (private) column. dpsql measures the kept (unit, group) pairs per
# group ("units") besides the aggregates: partition selection's distinct-unit counts.
QUERIES: tuple[ScaleQuery, ...] = (
    *SCALE_QUERIES,
    ScaleQuery("private_key_age", "SELECT age, COUNT(*) FROM visits GROUP BY age",
               "SELECT age, COUNT(*) FROM visits GROUP BY age", (AGE,), ("rows", "units")),
    ScaleQuery("join_zone", f"SELECT zone, COUNT(*), SUM(spend) FROM {JOIN} GROUP BY zone",
               f"SELECT zone, COUNT(*), SUM(spend) FROM {JOIN} GROUP BY zone", (ZONE,),
               ("rows", "sum", "units"), value=True, source=JOIN),
)  # fmt: skip
# The queries that this benchmark runs by default: each aggregate by the public key region,
# distinct units, the two other kinds of public key (a date part, a CASE), a private key and a
# join
DEFAULT_QUERIES = (
    "count", "sum", "avg", "count_distinct_unit", "stddev", "region_month", "case_histogram",
    "private_key_age", "join_zone",
)  # fmt: skip
VARIANTS = ("spark_raw", "spark_hand", "spark_dpsql", "duckdb_dpsql")
SMALL = 10_000_000  # up to this size, --repeats runs after the warm-up; above, --repeats-large


# -- the hand-written bounded Spark SQL ---------------------------------------------------------


def _hashed(i: int, key: Key) -> str:
    """A key as the keyed hash reads it: dpsql keeps DuckDB's types, where a date part such as
    month() is a BIGINT (Spark's month() is an INT, whose xxhash64 differs). A column's own type
    is the same on both (age: INTEGER, INT)."""
    if key.domain is not None and all(isinstance(v, int) for v in key.domain):
        return f"CAST(k{i} AS BIGINT)"
    return f"k{i}"


def hand_spark(q: ScaleQuery, b: Bounds) -> str:
    """The (L0, C) contract by hand in Spark SQL (``scale.hand_l0c``'s semantics): per (unit,
    group) pre-aggregation, every unit's groups ranked by a salted xxhash64 (keys break ties) and
    L0 kept, C rows per group (sums scaled by C/n in exact DECIMAL(38,0) integers, clamped)."""
    mid = b.lo_units + b.hi_units
    keys = [f"k{i}" for i in range(len(q.keys))]
    group = ", ".join(["user_id", *keys])
    aggs = ["COUNT(*) AS n"]
    source = f"({_rows(q, b)})"
    if q.value:
        d = f"CAST(2 * v - {mid} AS DECIMAL(38, 0))"
        aggs += [
            "COUNT(v) AS nv",
            "COALESCE(SUM(CAST(v AS DECIMAL(38, 0))), 0) AS s",
            f"COALESCE(SUM({d} * {d}), 0) AS q",
        ]
        source = f"(SELECT *, {b.value('spend')} AS v FROM {source})"
    grouped = f"SELECT {group}, {', '.join(aggs)} FROM {source} GROUP BY {group}"
    if keys:
        hashed = ", ".join(["user_id", *(_hashed(i, k) for i, k in enumerate(q.keys))])
        grouped = (
            f"SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY user_id ORDER BY "
            f"xxhash64({hashed}, CAST({b.salt} AS BIGINT)), {', '.join(keys)}) AS w "
            f"FROM ({grouped})) WHERE w <= {L0}"
        )
    cols = [*keys, f"LEAST(n, {C}) AS c"]
    if q.value:
        # s >= 0 (lo = 0), so DIV (truncating) is the floor: round(C·s/n) half up
        scaled = f"({C} * 2 * s + nv) DIV (2 * nv)"
        width = b.hi_units - b.lo_units
        cols += [
            f"LEAST(nv, {C}) AS cv",
            f"CASE WHEN nv <= {C} THEN s ELSE LEAST(GREATEST({scaled}, {C * b.lo_units}), "
            f"{C * b.hi_units}) END AS t",
            f"LEAST(GREATEST(CASE WHEN nv <= {C} THEN q ELSE ({C} * q + nv DIV 2) DIV nv END, "
            f"0), {C * width * width}) AS r",
        ]
    capped = f"(SELECT {', '.join(cols)} FROM ({grouped}))"
    measures = {
        "rows": "SUM(c)",
        "units": "COUNT(*)",
        "count": "SUM(cv)",
        "sum": "SUM(t)",
        "centred": f"SUM(2 * t - cv * {mid})",
        "centred_squares": "SUM(r)",
        **(bernstein_measures(b.hi_units - b.lo_units, "cv", "t", "r", mid) if q.value else {}),
    }
    return _fill(q, measures_of(q, measures), capped)


# -- the public table, the policies -------------------------------------------------------------


def regions_file(data: Path) -> Path:
    """The public ``regions`` table (region, zone) next to the data file ``data``, written if
    it is not there."""
    path = data.parent / "regions.parquet"
    if not path.exists():
        table = pa.table({"region": list(REGIONS), "zone": [ZONES[r] for r in REGIONS]})
        tmp = path.with_suffix(".tmp")
        pq.write_table(table, str(tmp))
        tmp.replace(path)
    return path


def reads_regions(q: ScaleQuery) -> bool:
    return "regions" in q.source.split()


# Set by ``--no-diagnosis`` for the workers (each a process of its own): dpsql runs without its
# default diagnosis, which Spark computes in a second statement (it shares no rows between two).
NO_DIAGNOSIS = "SPARK_SCALE_NO_DIAGNOSIS"


def bench_policy(path: Path, *, regions: bool = False) -> dict[str, Any]:
    """scale.py's (L0, C) policy; with ``regions``, also the public table ``regions`` (declared
    ``public = true``, its zone without a domain: a private key). Only the queries that join it
    have it, so that the others run on the same policy as before."""
    policy = policy_dict(path, CONTRACT)
    if os.environ.get(NO_DIAGNOSIS):  # ``--no-diagnosis``: the answer alone, as the hand SQL
        policy["budget"]["diagnose"] = False
    if regions:
        policy["data"]["tables"]["regions"] = str(regions_file(path).resolve())
        policy["tables"]["regions"] = {"public": True}
    return policy


# -- Spark, and what the worker measures --------------------------------------------------------


def spark_policy(
    path: Path, conf: dict[str, str] | None = None, *, regions: bool = False
) -> dict[str, Any]:
    """The (L0, C) policy (``bench_policy``) with ``[engine] name = "spark"``."""
    policy = bench_policy(path, regions=regions)
    settings = SPARK_CONF if conf is None else conf
    policy["engine"] = {"name": "spark", "master": MASTER, "conf": dict(settings)}
    return policy


def spark_session(conf: dict[str, str] | None = None) -> Any:
    """A local Spark session as dpsql's Spark engine starts one: the same master and settings,
    the settings dpsql pins, and no progress bars or logs."""
    from pyspark.sql import SparkSession  # noqa: PLC0415

    from dpsql.policy.engine import SPARK_PINNED  # noqa: PLC0415

    builder = SparkSession.builder.appName("dpsql").master(MASTER)
    settings = {"spark.ui.showConsoleProgress": "false", **(conf or SPARK_CONF), **SPARK_PINNED}
    for name, value in settings.items():
        builder = builder.config(name, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("OFF")
    return session


def _java_pids() -> list[int]:
    """The java processes under this one (the Spark JVM that pyspark launched)."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :]
        parents[int(entry.name)] = int(rest.split()[1])
        names[int(entry.name)] = name
    mine, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - mine
        mine |= frontier
    return sorted(p for p in mine if names.get(p) == "java")


def _jvm_cpu(pids: list[int]) -> float:
    """User + system CPU seconds of these processes (all their threads)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return total


def _jvm_peak_mib(pids: list[int]) -> float | None:
    """The JVMs' peak resident set (VmHWM), summed; None without a JVM."""
    if not pids:
        return None
    peak = 0.0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                peak += int(line.split()[1]) / 1024
    return peak


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(path: Path, variant: str, name: str, repeats: int) -> dict[str, Any]:
    q = next(q for q in QUERIES if q.name == name)
    bounds = Bounds(salt=SALT)
    extra: dict[str, Any] = {}
    seen: list[list[tuple[Any, ...]]] = []  # every run's rows (dpsql's: the bounded query's)
    engine_walls: list[float] = []  # dpsql: the time in the engine's run, per run
    fn: Callable[[], object]
    if variant.endswith("_dpsql"):
        from dpsql.bound.together import split  # noqa: PLC0415
        from dpsql.policy import load_policy  # noqa: PLC0415
        from dpsql.session.session import Session  # noqa: PLC0415

        regions = reads_regions(q)
        spec = (
            spark_policy(path, regions=regions)
            if variant == "spark_dpsql"
            else bench_policy(path, regions=regions)
        )
        session = Session(load_policy(spec))
        session.engine.salt = SALT  # the hand SQL's salt: both must keep the same groups
        engine_run = session.engine.run

        def run_and_keep(sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
            t0 = time.perf_counter()
            names, rows = engine_run(sql)
            engine_walls.append(time.perf_counter() - t0)
            if sql == plan.engine_sql:  # the bounded query (not the diagnosis's histogram)
                seen.append(rows)
            elif plan.diagnosis is not None and sql == plan.diagnosis.together_sql:
                seen.append(split(rows, plan.diagnosis.width)[0])  # the two as one statement
            return names, rows

        session.engine.run = run_and_keep  # type: ignore[method-assign]
        plan = session.plan(q.sql)
        kinds = tuple(m.spec.kind for m in plan.measurements)
        assert kinds == q.kinds, f"{name}: dpsql measures {kinds}, the hand SQL {q.kinds}"
        extra["skipped"] = list(plan.skipped)

        def fn() -> object:
            return session.execute(q.sql, fresh=True)

    else:
        spark = spark_session()
        spark.read.parquet(str(path)).createOrReplaceTempView("visits")
        if reads_regions(q):
            spark.read.parquet(str(regions_file(path))).createOrReplaceTempView("regions")
        sql = q.raw if variant == "spark_raw" else hand_spark(q, bounds)

        def fn() -> object:
            rows = [tuple(r) for r in spark.sql(sql).collect()]
            seen.append(rows)
            return rows

    jvm = _java_pids()
    before = _rss_mib()
    walls, cpus = [], []
    for i in range(repeats + 1):
        t0, c0, j0 = time.perf_counter(), time.process_time(), _jvm_cpu(jvm)
        fn()
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0 + _jvm_cpu(jvm) - j0
        if i:  # the first run warms up: the JVM's code, the OS page cache
            walls.append(wall)
            cpus.append(cpu)
    assert len(seen) == repeats + 1, f"{name}: {len(seen)} results for {repeats + 1} runs"
    kept = [totals(rows, len(q.keys)) for rows in seen]
    result = {
        "walls": walls,
        "cpus": cpus,
        "engine_walls": engine_walls[1:],
        "rss_before_mib": before,
        "peak_rss_mib": _rss_mib(),
        "jvm_peak_mib": _jvm_peak_mib(jvm),
        "totals": kept[0] if kept and variant != "spark_raw" else None,
        "stable": all(t == kept[0] for t in kept),  # every run gave the same totals
        "load": os.getloadavg()[0],
        **extra,
    }
    if jvm:
        from pyspark import SparkContext  # noqa: PLC0415

        context = SparkContext._active_spark_context
        if context is not None:
            context.stop()
    return result


# -- the driver ---------------------------------------------------------------------------------


def measure(path: Path, variant: str, name: str, repeats: int, timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", str(path), variant, name, str(repeats)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": [f"timed out after {timeout:.0f} s"]}
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-3:] or ["failed"]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run(
    sizes: list[int],
    repeats: tuple[int, int],
    *,
    names: list[str],
    data_dir: Path,
    variants: list[str],
    timeout: float,
) -> list[dict[str, Any]]:
    results = []
    for n in sizes:
        path = data_file(data_dir, n)
        regions_file(path)
        reps = repeats[0] if n <= SMALL else repeats[1]
        for q in QUERIES:
            if q.name not in names:
                continue
            row: dict[str, Any] = {"rows": n, "query": q.name, "repeats": reps}
            for variant in VARIANTS:
                if variant in variants:
                    row[variant] = measure(path, variant, q.name, reps, timeout)
            hand, ours = row.get("spark_hand", {}), row.get("spark_dpsql", {})
            row["same"] = (
                hand.get("totals") is not None
                and hand.get("totals") == ours.get("totals")
                and bool(hand.get("stable"))
                and bool(ours.get("stable"))
            )
            results.append(row)
            print(_line(row), flush=True)
    return results


def _ms(r: dict[str, Any]) -> float:
    return _median(r.get("walls", [])) * 1e3


def _cpu(r: dict[str, Any]) -> float:
    return _median(r.get("cpus", [])) * 1e3


def _gib(r: dict[str, Any], key: str) -> float:
    value = r.get(key)
    return math.nan if value is None else float(value) / 1024


def _cell(r: dict[str, Any]) -> str:
    if "error" in r:
        return "error"
    return f"{_ms(r):7.0f} {_spread(r.get('walls', [])):>4}"


def _line(row: dict[str, Any]) -> str:
    raw, hand = row.get("spark_raw", {}), row.get("spark_hand", {})
    ours, duck = row.get("spark_dpsql", {}), row.get("duckdb_dpsql", {})
    cells = [
        f"{row['rows']:>11,}", f"{row['query']:<19}", _cell(raw), _cell(hand), _cell(ours),
        _cell(duck), f"{_median(ours.get('engine_walls', [])) * 1e3 / _ms(ours):4.0%}",
        f"{_ms(ours) / _ms(hand):5.2f}x", f"{_cpu(ours) / _cpu(hand):5.2f}x",
        f"{_ms(ours) / _ms(raw):5.2f}x", f"{_ms(ours) / _ms(duck):5.2f}x",
        "yes" if row["same"] else "NO",
        f"{_gib(raw, 'jvm_peak_mib'):4.2f}", f"{_gib(hand, 'jvm_peak_mib'):4.2f}",
        f"{_gib(ours, 'jvm_peak_mib'):4.2f}", f"{_gib(ours, 'peak_rss_mib'):4.2f}",
        f"{_gib(duck, 'peak_rss_mib'):4.2f}",
    ]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


HEADER = (
    "| rows | query | spark raw ms | spark hand ms | spark dpsql ms | duckdb dpsql ms "
    "| dpsql in engine | d/hand "
    "| CPU d/hand | d/raw | d/duckdb | same | JVM peak GiB raw | JVM hand | JVM dpsql "
    "| Python dpsql | duckdb dpsql GiB |\n|" + "---|" * 17
)


def growth(results: list[dict[str, Any]]) -> list[str]:
    """Per query and variant: the time ratio between consecutive sizes over the rows' ratio
    (1.0 is linear; above 1 grows faster than the data)."""
    lines = ["", "growth (time ratio / rows ratio, to the previous size)"]
    sizes = sorted({r["rows"] for r in results})
    for a, b in itertools.pairwise(sizes):
        for q in QUERIES:
            ra = next((r for r in results if r["rows"] == a and r["query"] == q.name), None)
            rb = next((r for r in results if r["rows"] == b and r["query"] == q.name), None)
            if ra is None or rb is None:
                continue
            parts = [
                f"{v} {_ms(rb.get(v, {})) / _ms(ra.get(v, {})) / (b / a):.2f}" for v in VARIANTS
            ]
            lines.append(f"  {a:,} -> {b:,} ({b / a:.1f}x) {q.name:<19} " + ", ".join(parts))
    return lines


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        path, variant, name, repeats = sys.argv[2:6]
        print(json.dumps(worker(Path(path), variant, name, int(repeats))))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000_000, 50_000_000])
    parser.add_argument("--large", action="store_true", help="also 100M rows")
    parser.add_argument("--repeats", type=int, default=3, help="after a warm-up, up to 10M rows")
    parser.add_argument("--repeats-large", type=int, default=1, help="the same above 10M rows")
    parser.add_argument("--queries", nargs="+", default=list(DEFAULT_QUERIES),
                        choices=[q.name for q in QUERIES])  # fmt: skip
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--data-dir", type=Path, default=HERE / "data")
    parser.add_argument("--results-dir", type=Path, default=HERE / "results")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per process")
    parser.add_argument(
        "--no-diagnosis",
        action="store_true",
        help="dpsql without its default diagnosis (budget.diagnose = false)",
    )
    parser.add_argument("--report", type=Path, nargs="+", metavar="JSON",
                        help="print earlier results' table and growth; run nothing")  # fmt: skip
    args = parser.parse_args()
    if args.no_diagnosis:
        os.environ[NO_DIAGNOSIS] = "1"
    if args.report:
        results = [r for f in args.report for r in json.loads(f.read_text())["results"]]
        print(HEADER)
        for row in sorted(
            results, key=lambda r: (r["rows"], [q.name for q in QUERIES].index(r["query"]))
        ):
            print(_line(row))
        for line in growth(results):
            print(line)
        return
    sizes = sorted(set(args.sizes + ([100_000_000] if args.large else [])))
    started = dt.datetime.now(dt.UTC)
    import duckdb  # noqa: PLC0415
    import pyspark  # noqa: PLC0415

    print(
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}, pyspark {pyspark.__version__} "
        f"({MASTER}, {SPARK_CONF}), DuckDB {duckdb.__version__}; median of {args.repeats} "
        f"after a warm-up up to {SMALL:,} rows, of {args.repeats_large} above"
    )
    print(HEADER)
    results = run(sizes, (args.repeats, args.repeats_large), names=args.queries,
                  data_dir=args.data_dir, variants=args.variants, timeout=args.timeout)  # fmt: skip
    for line in growth(results):
        print(line)
    print(f"load at the end {os.getloadavg()[0]:.2f}")
    from run import write_results  # noqa: PLC0415  (run.py imports dpsql)

    write_results(args.results_dir, "spark_scale", started, args.repeats, results,
                  pyspark=pyspark.__version__, master=MASTER, conf=SPARK_CONF)  # fmt: skip


if __name__ == "__main__":
    main()
