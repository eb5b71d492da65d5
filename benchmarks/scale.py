"""Scale on one machine: dpsql beside hand-written bounded SQL and raw DuckDB, 5M to 100M rows.

Run: ``python benchmarks/scale.py`` (5M and 20M rows), ``--large`` (also 50M and 100M),
``--sizes 5000000 ...``, ``--repeats K``, ``--queries count sum ...``. Every (size, variant,
query) runs in its own process, so that its peak memory is its own. Up to 20M rows, the
processes of one query (every size and variant) stay alive together, run once to warm up, then
K rounds in which each runs once: a drift of the machine over the minutes of a run then hits
both sizes and every variant alike, instead of the growth from 5M to 20M rows, and each round
pairs the two sizes (the growth's range over rounds is printed). Larger sizes run once each,
cold, one process at a time (their memory would not fit side by side). Data: rows/5
units (1M units at 5M rows), skewed contributions (``queries.rows_per_unit``: most units 1-10
rows, 1% with 50-800, rescaled), written in chunks of units so that 100M rows need little
memory to write. Before each table, the data's share of units over each cap (and of rows held by
units over R) is printed. ``--light`` writes and reads other data, where no unit exceeds any cap
(at most min(R, C) rows, in at most L0 regions; asserted): what the caps cost where they cut
nothing.

Two contracts, each with its own hand-written bounded SQL that must return dpsql's pre-noise
totals exactly (checked on every run, column "same"):

* **R**: a total row cap of R = 10 rows per unit and nothing else (C and L0 are then R, BigQuery's
  ``max_rows_contributed``): the hand SQL keeps each unit's first R rows in the order of a salted
  hash of the row (``ROW_NUMBER() OVER (PARTITION BY user_id ORDER BY hash(...))``, as a peer
  harness would), then aggregates the clamped values.
* **L0C**: L0 = 2 groups per unit, C = 10 rows per unit and group: the hand SQL pre-aggregates
  per (unit, group), ranks every unit's groups by a salted hash and keeps L0, caps each at C
  rows (sums scaled to C/n and clamped), then aggregates.

dpsql is ``Session.execute(sql, fresh=True)`` end to end (parse, plan, bind checks, charge,
bounded query, noise); its salt is set to the hand SQL's so both keep the same rows. Raw is the
analyst's SQL straight on DuckDB. All three use the same DuckDB memory limit and threads.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import math
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from queries import AGE_BOUNDS, REGIONS, SPEND_BOUNDS, Bounds, rows_per_unit

HERE = Path(__file__).resolve().parent
R = 10
L0 = 2
C = 10
UNITS_PER_ROW = 5
CHUNK_UNITS = 500_000
MEMORY_LIMIT = "50%"  # the policy's default (docs/policy.md): the same for every variant
SALT = 4242424242
MONTHS = tuple(range(1, 13))
BUCKETS = ("high", "low", "mid")
BUCKET = "CASE WHEN spend < 10 THEN 'low' WHEN spend < 50 THEN 'mid' ELSE 'high' END"


# -- data -------------------------------------------------------------------------------------


def light_rows_per_unit(n_rows: int, n_units: int, rng: np.random.Generator) -> np.ndarray:
    """Rows per unit for ``--light``: 1 to ``min(R, C)`` each, summing to exactly ``n_rows``
    (units drawn from 1-9, then moved by one row at a time within [1, min(R, C)])."""
    top = min(R, C)
    counts = rng.integers(1, 10, size=n_units).astype(np.int64)
    short = n_rows - int(counts.sum())
    while short != 0:
        step = 1 if short > 0 else -1
        room = np.flatnonzero(counts < top) if step > 0 else np.flatnonzero(counts > 1)
        take = rng.choice(room, size=min(abs(short), len(room)), replace=False)
        counts[take] += step
        short -= step * len(take)
    return counts


def write_data(path: Path, n_rows: int, seed: int = 20261201, *, light: bool = False) -> None:
    """``visits`` (user_id, region, age, spend, day) with exactly ``n_rows`` rows, ordered by
    (user_id, day), written chunk by chunk of units. ``light``: no unit exceeds any cap (at most
    min(R, C) rows, in at most L0 regions: a home and one other), which is asserted."""
    n_units = n_rows // UNITS_PER_ROW
    rng = np.random.default_rng(seed)
    counts = (light_rows_per_unit if light else rows_per_unit)(n_rows, n_units, rng)
    assert not light or (int(counts.max()) <= min(R, C) and L0 >= 2)
    tmp = path.with_suffix(".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    names = np.array(REGIONS, dtype=object)
    writer: pq.ParquetWriter | None = None
    try:
        for start in range(0, n_units, CHUNK_UNITS):
            part = counts[start : start + CHUNK_UNITS]
            rows = int(part.sum())
            units = np.arange(start + 1, start + 1 + len(part), dtype=np.int64)
            home = rng.choice(len(REGIONS), size=len(part), p=[0.1, 0.2, 0.3, 0.25, 0.15])
            region = np.repeat(home, part)
            away = rng.random(rows) < 0.2
            if light:  # one other region per unit: at most two groups
                other = np.repeat(rng.integers(0, len(REGIONS), size=len(part)), part)
                region[away] = other[away]
            else:
                region[away] = rng.integers(0, len(REGIONS), size=int(away.sum()))
            day = rng.integers(0, 365, size=rows).astype(np.int32)
            user = np.repeat(units, part)
            order = np.lexsort((day, user))
            table = pa.table(
                {
                    "user_id": user[order],
                    "region": pa.array(names[region[order]], type=pa.string()),
                    "age": np.repeat(rng.integers(18, 86, size=len(part)), part)[order].astype(
                        np.int32
                    ),
                    "spend": np.round(rng.lognormal(3.0, 1.0, size=rows), 2)[order],
                    "day": pa.array(
                        np.datetime64("2026-01-01") + day[order].astype("timedelta64[D]"),
                        type=pa.date32(),
                    ),
                }
            )
            if writer is None:
                writer = pq.ParquetWriter(str(tmp), table.schema)
            writer.write_table(table, row_group_size=1 << 20)
    finally:
        if writer is not None:
            writer.close()
    tmp.replace(path)


def data_file(directory: Path, n_rows: int, *, light: bool = False) -> Path:
    path = directory / f"scale-{'light-' if light else ''}{n_rows}.parquet"
    if not path.exists():
        print(f"writing {n_rows:,} rows to {path}", flush=True)
        write_data(path, n_rows, light=light)
    return path


def heavy_share(path: Path) -> dict[str, float]:
    """What the caps cut in the data file: the share of units over R rows, over L0 regions, and
    with more than C rows in some region, and the share of rows those over R hold."""
    con = duckdb.connect(":memory:")
    per_unit = (
        f"SELECT user_id, SUM(n) AS t, COUNT(*) AS g, MAX(n) AS m FROM (SELECT user_id, region, "
        f"COUNT(*) AS n FROM read_parquet('{path}') GROUP BY ALL) GROUP BY user_id"
    )
    row = con.execute(
        f"SELECT AVG(CAST(t > {R} AS DOUBLE)), AVG(CAST(g > {L0} AS DOUBLE)), "
        f"AVG(CAST(m > {C} AS DOUBLE)), SUM(CASE WHEN t > {R} THEN t ELSE 0 END) / SUM(t) "
        f"FROM ({per_unit})"
    ).fetchone()
    con.close()
    assert row is not None
    names = ("units_over_R", "units_over_L0", "units_over_C", "rows_of_units_over_R")
    return dict(zip(names, (float(v) for v in row), strict=True))


def policy_dict(data: Path, contract: str, memory_limit: str = MEMORY_LIMIT) -> dict[str, Any]:
    table: dict[str, Any] = {
        "privacy_unit": "user_id",
        "columns": {
            "age": {"lower": AGE_BOUNDS[0], "upper": AGE_BOUNDS[1]},
            "spend": {"lower": SPEND_BOUNDS[0], "upper": SPEND_BOUNDS[1]},
            "region": {"public_values": list(REGIONS)},
            "day": {"date_range": [dt.date(2026, 1, 1), dt.date(2026, 12, 31)]},
        },
    }
    if contract == "R":
        table["max_rows_per_unit"] = R
    else:
        table.update(max_groups_per_unit=L0, max_rows_per_unit_per_group=C)
    return {
        "dataset": {"id": f"scale-{data.stem}"},
        "data": {"tables": {"visits": str(data.resolve())}},
        "budget": {
            "epsilon": "10000",
            "delta": "0.000001",
            "query_epsilon": "1",
            "query_delta": "0.00000001",
        },
        "tables": {"visits": table},
        "engine": {"memory_limit": memory_limit},
    }


# -- the queries and their hand-written bounded SQL --------------------------------------------


@dataclass(frozen=True)
class Key:
    expr: str  # over the query's source (the visits table, or a join of it)
    domain: tuple[Any, ...] | None  # None: a private key (dpsql selects its groups)


REGION = Key("region", REGIONS)
MONTH = Key("month(day)", MONTHS)
CASE_KEY = Key(BUCKET, BUCKETS)


@dataclass(frozen=True)
class ScaleQuery:
    name: str
    sql: str  # what the analyst sends to dpsql
    raw: str  # the same question straight on DuckDB, scanning the data
    keys: tuple[Key, ...]
    kinds: tuple[str, ...]  # dpsql's measurements, in its order
    where: str | None = None
    value: bool = False  # reads spend
    source: str = "visits"  # the FROM of the hand SQL (a join: its public table by hand too)


QUERIES: tuple[ScaleQuery, ...] = (
    ScaleQuery("count", "SELECT region, COUNT(*) FROM visits GROUP BY region",
               "SELECT region, COUNT(*) FROM visits GROUP BY region", (REGION,), ("rows",)),
    ScaleQuery("sum", "SELECT region, SUM(spend) FROM visits GROUP BY region",
               "SELECT region, SUM(spend) FROM visits GROUP BY region", (REGION,), ("sum",),
               value=True),
    ScaleQuery("avg", "SELECT region, AVG(spend) FROM visits GROUP BY region",
               "SELECT region, AVG(spend) FROM visits GROUP BY region", (REGION,),
               ("centred", "count"), value=True),
    ScaleQuery("count_distinct_unit", "SELECT COUNT(DISTINCT user_id) FROM visits",
               "SELECT COUNT(DISTINCT user_id) FROM visits", (), ("units",)),
    ScaleQuery("where", "SELECT region, COUNT(*), SUM(spend) FROM visits WHERE age >= 30 "
               "GROUP BY region", "SELECT region, COUNT(*), SUM(spend) FROM visits "
               "WHERE age >= 30 GROUP BY region", (REGION,), ("rows", "sum"), "age >= 30",
               value=True),
    ScaleQuery("region_month", "SELECT region, month(day) AS m, COUNT(*) FROM visits "
               "GROUP BY region, m", "SELECT region, month(day) AS m, COUNT(*) FROM visits "
               "GROUP BY region, m", (REGION, MONTH), ("rows",)),
    ScaleQuery("case_histogram", f"SELECT {BUCKET} AS b, COUNT(*) FROM visits GROUP BY b",
               f"SELECT {BUCKET} AS b, COUNT(*) FROM visits GROUP BY b", (CASE_KEY,),
               ("rows",)),
    ScaleQuery("stddev", "SELECT region, STDDEV(spend) FROM visits GROUP BY region",
               "SELECT region, STDDEV(spend) FROM visits GROUP BY region", (REGION,),
               ("bernstein", "bernstein", "bernstein"), value=True),
)  # fmt: skip


def bernstein_measures(w: int, cv: str, t: str, r: str, mid: int) -> dict[str, str]:
    """A variance's three Bernstein coordinates (dpsql.bound.values.bernstein) from a cell's
    count ``cv``, grid sum ``t`` and centred sum of squares ``r``: S = 2t - cv·mid, b0 and b2
    floored at 0, b1 the rest of 4w²·cv."""
    s = f"(2 * {t} - {cv} * {mid})"
    b0 = f"GREATEST({w * w} * {cv} - {2 * w} * {s} + {r}, 0)"
    b2 = f"GREATEST({w * w} * {cv} + {2 * w} * {s} + {r}, 0)"
    return {"bernstein0": f"SUM({b0})", "bernstein1": f"SUM({4 * w * w} * {cv} - {b0} - {b2})",
            "bernstein2": f"SUM({b2})"}  # fmt: skip


def measures_of(q: ScaleQuery, measures: dict[str, str]) -> list[str]:
    """The SQL of each of ``q``'s measurements, in dpsql's order (a Bernstein vector's three
    coordinates in turn)."""
    out, part = [], 0
    for kind in q.kinds:
        name = kind
        if kind == "bernstein":
            name, part = f"bernstein{part}", part + 1
        out.append(measures[name])
    return out


def _lit(v: Any) -> str:
    return f"'{v}'" if isinstance(v, str) else str(v)


def _rows(q: ScaleQuery, b: Bounds) -> str:
    """Each row's unit, keys (public ones inside their domains) and grid value."""
    cols = ["user_id"] + [f"{k.expr} AS k{i}" for i, k in enumerate(q.keys)]
    if q.value:
        cols.append("spend")
    tests = [
        f"{k.expr} IN ({', '.join(map(_lit, k.domain))})" for k in q.keys if k.domain is not None
    ]
    if q.where:
        tests.append(q.where)
    where = f" WHERE {' AND '.join(tests)}" if tests else ""
    return f"SELECT {', '.join(cols)} FROM {q.source}{where}"


def _fill(q: ScaleQuery, measures: list[str], source: str) -> str:
    """Aggregate ``source`` per key and give every public key combination a row (private keys:
    the groups that some kept unit has, as dpsql's bounded query returns them before selection)."""
    keys = [f"k{i}" for i in range(len(q.keys))]
    names = [f"m{j}" for j in range(len(measures))]
    select = ", ".join(f"{m} AS {n}" for m, n in zip(measures, names, strict=True))
    if not keys:
        return f"SELECT {', '.join(f'COALESCE({m}, 0)' for m in measures)} FROM {source}"
    domains_of = [k.domain for k in q.keys if k.domain is not None]
    if not domains_of:
        return f"SELECT {', '.join(keys)}, {select} FROM {source} GROUP BY {', '.join(keys)}"
    assert len(domains_of) == len(keys), f"{q.name}: public and private keys together"
    domains = " CROSS JOIN ".join(
        f"(VALUES {', '.join(f'({_lit(v)})' for v in domain)}) AS d{i}(k{i})"
        for i, domain in enumerate(domains_of)
    )
    on = " AND ".join(f"a.{k} = d{i}.{k}" for i, k in enumerate(keys))
    out = ", ".join(
        [f"d{i}.{k}" for i, k in enumerate(keys)] + [f"COALESCE(a.{n}, 0)" for n in names]
    )
    return (
        f"SELECT {out} FROM {domains} LEFT JOIN (SELECT {', '.join(keys)}, {select} "
        f"FROM {source} GROUP BY {', '.join(keys)}) AS a ON {on}"
    )


def hand_r(q: ScaleQuery, b: Bounds) -> str:
    """The R contract by hand: R rows per unit by salted hash, then the clamped aggregate."""
    mid = b.lo_units + b.hi_units
    hashed = ["user_id", *(f"k{i}" for i in range(len(q.keys)))] + (["spend"] if q.value else [])
    kept = (
        f"SELECT * FROM ({_rows(q, b)}) QUALIFY ROW_NUMBER() OVER (PARTITION BY user_id "
        f"ORDER BY hash({', '.join(hashed)}, CAST({b.salt} AS BIGINT))) <= {R}"
    )
    v = f"CAST({b.value('spend')} AS HUGEINT)" if q.value else "NULL"
    source = f"(SELECT *, {v} AS v FROM ({kept}))"
    measures = {
        "rows": "COUNT(*)",
        "units": "COUNT(DISTINCT user_id)",
        "count": "COUNT(v)",
        "sum": "SUM(v)",
        "centred": f"SUM(2 * v - {mid})",
        "centred_squares": f"SUM((2 * v - {mid}) * (2 * v - {mid}))",
        # Per row: ((w - a)², 2(w² - a²), (w + a)²), a = 2v - mid (NULL rows add nothing).
        **bernstein_measures(
            b.hi_units - b.lo_units,
            "CASE WHEN v IS NULL THEN 0 ELSE 1 END",
            "COALESCE(v, 0)",
            f"COALESCE((2 * v - {mid}) * (2 * v - {mid}), 0)",
            mid,
        ),
    }
    return _fill(q, measures_of(q, measures), source)


def hand_l0c(q: ScaleQuery, b: Bounds) -> str:
    """The (L0, C) contract by hand: per (unit, group) pre-aggregation, L0 groups per unit by a
    salted hash, C rows per group (sums scaled by C/n in exact integers, then clamped)."""
    mid = b.lo_units + b.hi_units
    keys = [f"k{i}" for i in range(len(q.keys))]
    v = f"CAST({b.value('spend')} AS HUGEINT)" if q.value else "NULL"
    group = ", ".join(["user_id", *keys])
    grouped = (
        f"SELECT {group}, COUNT(*) AS n, COUNT(v) AS nv, COALESCE(SUM(v), 0) AS s, "
        f"COALESCE(SUM((2 * v - {mid}) * (2 * v - {mid})), 0) AS q "
        f"FROM (SELECT *, {v} AS v FROM ({_rows(q, b)})) GROUP BY {group}"
    )
    if keys:
        grouped = (
            f"SELECT * FROM ({grouped}) QUALIFY ROW_NUMBER() OVER (PARTITION BY user_id "
            f"ORDER BY hash({group}, CAST({b.salt} AS BIGINT))) <= {L0}"
        )
    width = b.hi_units - b.lo_units
    scaled = f"({C} * s * 2 + nv) // (2 * nv)"  # round(C·s/n), s >= 0 here
    t = (
        f"CASE WHEN nv <= {C} THEN s ELSE LEAST(GREATEST({scaled}, {C * b.lo_units}), "
        f"{C * b.hi_units}) END"
    )
    r = (
        f"LEAST(GREATEST(CASE WHEN nv <= {C} THEN q ELSE (q * {C} + nv // 2) // nv END, 0), "
        f"{C * width * width})"
    )
    capped = (
        f"(SELECT {''.join(k + ', ' for k in keys)}LEAST(n, {C}) AS c, LEAST(nv, {C}) AS cv, "
        f"{t} AS t, {r} AS r FROM ({grouped}))"
    )
    measures = {
        "rows": "SUM(c)",
        "units": "COUNT(*)",
        "count": "SUM(cv)",
        "sum": "SUM(t)",
        "centred": f"SUM(2 * t - cv * {mid})",
        "centred_squares": "SUM(r)",
        **bernstein_measures(width, "cv", "t", "r", mid),
    }
    return _fill(q, measures_of(q, measures), capped)


def totals(rows: list[tuple[Any, ...]], n_keys: int) -> dict[str, list[int]]:
    return {repr(tuple(r[:n_keys])): [int(v or 0) for v in r[n_keys:]] for r in rows}


# -- one measurement, in its own process --------------------------------------------------------


def _rss_mib() -> float:
    """This process's peak RSS. ``VmHWM`` is its own address space's high-water mark;
    ``ru_maxrss`` would also count the driver's memory at the fork before the exec."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(path: Path, contract: str, variant: str, name: str, *, memory_limit: str) -> None:
    """Serve runs of one (size, variant, query) until told to end: ``run`` on standard input
    runs the query once and answers its wall and CPU seconds; ``end`` answers the totals of the
    first run and the process's peak RSS. The driver keeps one such process per (size, variant)
    and interleaves their runs, so that a drift of the machine hits every cell alike."""
    q = next(q for q in QUERIES if q.name == name)
    bounds = Bounds(salt=SALT)
    totals_seen: dict[str, list[int]] | None = None
    extra: dict[str, Any] = {}
    if variant == "dpsql":
        # Imported here: the raw and hand workers' memory holds no dpsql.
        from dpsql.bound.together import split  # noqa: PLC0415
        from dpsql.policy import load_policy  # noqa: PLC0415
        from dpsql.session.session import Session  # noqa: PLC0415

        session = Session(load_policy(policy_dict(path, contract, memory_limit)))
        session.engine.salt = SALT  # the hand SQL's salt: both must keep the same rows
        engine_run = session.engine.run
        seen: list[list[tuple[Any, ...]]] = []

        def run_and_keep(sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
            names, rows = engine_run(sql)
            if sql == plan.engine_sql:  # the bounded query (not the diagnosis's histogram)
                seen.append(rows)
            elif plan.diagnosis is not None and sql == plan.diagnosis.together_sql:
                seen.append(split(rows, plan.diagnosis.width)[0])  # the two as one statement
            return names, rows

        session.engine.run = run_and_keep  # type: ignore[method-assign]
        plan = session.plan(q.sql)
        kinds = tuple(m.spec.kind for m in plan.measurements)
        assert kinds == q.kinds, f"{name}: dpsql measures {kinds}, the hand SQL {q.kinds}"

        def fn() -> object:
            return session.execute(q.sql, fresh=True)

        extra["skipped"] = list(plan.skipped)
    else:
        con = duckdb.connect(":memory:", config={"memory_limit": memory_limit})
        con.execute(f"CREATE VIEW visits AS SELECT * FROM read_parquet('{path}')")
        sql = {"raw": q.raw, "hand": (hand_r if contract == "R" else hand_l0c)(q, bounds)}[variant]

        def fn() -> object:
            return con.execute(sql).fetchall()

    before = _rss_mib()
    for command in sys.stdin:
        if command.strip() != "run":
            break
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if totals_seen is None:
            if variant == "dpsql":
                totals_seen = totals(seen[-1], len(q.keys))
            elif variant == "hand":
                assert isinstance(out, list)
                totals_seen = totals(out, len(q.keys))
        print(json.dumps({"wall": wall, "cpu": cpu}), flush=True)
    print(json.dumps({"rss_before_mib": before, "peak_rss_mib": _rss_mib(),
                      "totals": totals_seen, **extra}), flush=True)  # fmt: skip


# -- the driver ---------------------------------------------------------------------------------

VARIANTS = (("R", "raw"), ("R", "hand"), ("R", "dpsql"), ("L0C", "hand"), ("L0C", "dpsql"))
INTERLEAVED_ROWS = 20_000_000  # sizes up to this run interleaved; larger ones one cold run each


class Worker:
    """One (size, variant, query) in its own process, so that its peak memory is its own."""

    def __init__(self, path: Path, contract: str, variant: str, name: str, memory_limit: str):
        cmd = [sys.executable, __file__, "--worker", str(path), contract, variant, name,
               memory_limit]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.walls: list[float] = []
        self.cpus: list[float] = []
        self.error: str | None = None

    def _ask(self, command: str) -> dict[str, Any] | None:
        if self.error is not None:
            return None
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            assert self.proc.stderr is not None
            self.error = (self.proc.stderr.read().strip().splitlines() or ["failed"])[-1]
            return None
        answer: dict[str, Any] = json.loads(line)
        return answer

    def run(self, *, keep: bool = True) -> None:
        answer = self._ask("run")
        if answer is not None and keep:
            self.walls.append(answer["wall"])
            self.cpus.append(answer["cpu"])

    def end(self) -> dict[str, Any]:
        answer = self._ask("end") or {}
        self.proc.wait()
        if self.error is not None:
            return {"error": [self.error]}
        return {"walls": self.walls, "cpus": self.cpus, **answer}


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _spread(xs: list[float]) -> str:
    if len(xs) < 2:
        return "-"
    return f"±{(max(xs) - min(xs)) / 2 / statistics.median(xs) * 100:.0f}%"


def _merge(outs: list[dict[str, Any]]) -> dict[str, Any]:
    """Cold runs of one (size, variant), each in its own process: their times in round order,
    the largest peak, the first run's totals (and every run's must agree)."""
    if any("error" in out for out in outs):
        return next(out for out in outs if "error" in out)
    assert all(out["totals"] == outs[0]["totals"] for out in outs), "cold runs disagree"
    return {**outs[0], "walls": [w for out in outs for w in out["walls"]],
            "cpus": [c for out in outs for c in out["cpus"]],
            "peak_rss_mib": max(out["peak_rss_mib"] for out in outs)}  # fmt: skip


def _label(contract: str, variant: str) -> str:
    return f"{contract}_{variant}" if variant != "raw" else "raw"


def _row(n: int, name: str, cells: dict[str, dict[str, Any]]) -> dict[str, Any]:
    row: dict[str, Any] = {"rows": n, "query": name, **cells}
    for contract in ("R", "L0C"):
        hand = row.get(f"{contract}_hand", {})
        ours = row.get(f"{contract}_dpsql", {})
        row[f"{contract}_same"] = hand.get("totals") is not None and hand.get("totals") == ours.get(
            "totals"
        )
    return row


def run(
    sizes: list[int],
    repeats: int,
    names: list[str],
    data_dir: Path,
    memory_limit: str,
    *,
    variants: list[str],
    cold_rounds: int = 1,
    light: bool = False,
) -> list[dict[str, Any]]:
    """Per query: every (size, variant) up to ``INTERLEAVED_ROWS`` in a process of its own, all
    alive together, warmed up once, then ``repeats`` rounds in which each runs once (the order
    rotating from round to round); larger sizes in ``cold_rounds`` rounds of one cold run of
    each (size, variant), each in a new process, one process at a time."""
    paths = {n: data_file(data_dir, n, light=light) for n in sizes}
    for n, path in paths.items():
        share = heavy_share(path)
        print(f"{n:,} rows: " + ", ".join(f"{k} {v:.2%}" for k, v in share.items()), flush=True)
        assert not light or not any(share.values()), "--light data with a unit over a cap"
    cells = [(c, v) for c, v in VARIANTS if _label(c, v) in variants]
    small = [n for n in sizes if n <= INTERLEAVED_ROWS]
    results = []
    for q in QUERIES:
        if q.name not in names:
            continue
        if small:
            workers = {(n, _label(c, v)): Worker(paths[n], c, v, q.name, memory_limit)
                       for n in small for c, v in cells}  # fmt: skip
            order = list(workers.values())
            for w in order:
                w.run(keep=repeats == 0)
            for i in range(repeats):
                for w in order[i % len(order) :] + order[: i % len(order)]:
                    w.run()
            ended = {key: w.end() for key, w in workers.items()}
            for n in small:
                row = _row(n, q.name, {label: out for (m, label), out in ended.items() if m == n})
                results.append(row)
                print(_line(row), flush=True)
        large = [n for n in sizes if n not in small]
        runs: dict[tuple[int, str], list[dict[str, Any]]] = {}
        for _ in range(cold_rounds if large else 0):
            for n in large:
                for c, v in cells:
                    w = Worker(paths[n], c, v, q.name, memory_limit)
                    w.run()
                    runs.setdefault((n, _label(c, v)), []).append(w.end())
        for n in large:
            row = _row(n, q.name, {label: _merge(outs) for (m, label), outs in runs.items()
                                   if m == n})  # fmt: skip
            results.append(row)
            print(_line(row), flush=True)
    results.sort(key=lambda r: (r["rows"], [x.name for x in QUERIES].index(r["query"])))
    return results


def _ms(r: dict[str, Any]) -> float:
    return _median(r.get("walls", [])) * 1e3


def _cpu(r: dict[str, Any]) -> float:
    return _median(r.get("cpus", [])) * 1e3


def _gib(r: dict[str, Any]) -> float:
    return float(r.get("peak_rss_mib", math.nan)) / 1024


def _line(row: dict[str, Any]) -> str:
    raw, rh, rd = row.get("raw", {}), row.get("R_hand", {}), row.get("R_dpsql", {})
    lh, ld = row.get("L0C_hand", {}), row.get("L0C_dpsql", {})
    cells = [
        f"{row['rows']:>11,}", f"{row['query']:<19}", f"{_ms(raw):7.0f}",
        f"{_ms(rh):7.0f}", f"{_ms(rd):7.0f} {_spread(rd.get('walls', [])):>4}",
        f"{_ms(rd) / _ms(rh):5.2f}x", f"{_cpu(rd) / _cpu(rh):5.2f}x", f"{_ms(rd) / _ms(raw):6.1f}x",
        "yes" if row["R_same"] else "NO",
        f"{_ms(lh):7.0f}", f"{_ms(ld):7.0f} {_spread(ld.get('walls', [])):>4}",
        f"{_ms(ld) / _ms(lh):5.2f}x", f"{_cpu(ld) / _cpu(lh):5.2f}x", f"{_ms(ld) / _ms(raw):6.1f}x",
        "yes" if row["L0C_same"] else "NO",
        f"{_gib(raw):4.2f}", f"{_gib(rh):4.2f}", f"{_gib(rd):4.2f}", f"{_gib(lh):4.2f}",
        f"{_gib(ld):4.2f}",
    ]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


HEADER = (
    "| rows | query | raw ms | R hand ms | R dpsql ms | R d/hand | R CPU d/hand | R d/raw | same "
    "| L0C hand ms | L0C dpsql ms | L0C d/hand | L0C CPU d/hand | L0C d/raw | same | peak GiB raw "
    "| R hand | R dpsql | L0C hand | L0C dpsql |\n|" + "---|" * 20
)


def _growth(a: dict[str, Any], b: dict[str, Any]) -> str:
    """The ratio of the medians, and where both sizes ran interleaved (as many runs each, run
    i of both in round i) the range of the per-round ratios."""
    ratio = f"{_ms(b) / _ms(a):.2f}x"
    wa, wb = a.get("walls", []), b.get("walls", [])
    if len(wa) > 1 and len(wa) == len(wb):
        rounds = [y / x for x, y in zip(wa, wb, strict=True)]
        ratio += f" [{min(rounds):.2f}-{max(rounds):.2f}]"
    return ratio


def growth(results: list[dict[str, Any]]) -> list[str]:
    """Time ratio between consecutive sizes, per query and variant, beside the data ratio."""
    lines = ["", "growth (time ratio to the previous size, [range over the paired rounds]; "
             "data ratio in the first column)"]  # fmt: skip
    sizes = sorted({r["rows"] for r in results})
    for a, b in itertools.pairwise(sizes):
        for q in QUERIES:
            ra = next((r for r in results if r["rows"] == a and r["query"] == q.name), None)
            rb = next((r for r in results if r["rows"] == b and r["query"] == q.name), None)
            if ra is None or rb is None:
                continue
            parts = [f"{k} {_growth(ra.get(k, {}), rb.get(k, {}))}" for k in
                     ("raw", "R_hand", "R_dpsql", "L0C_hand", "L0C_dpsql")]  # fmt: skip
            parts += [_relative_growth(ra, rb, c) for c in ("R", "L0C")]
            lines.append(f"  {a:,} -> {b:,} ({b / a:.1f}x) {q.name:<19} " + ", ".join(parts))
    return lines


def _relative_growth(ra: dict[str, Any], rb: dict[str, Any], contract: str) -> str:
    """dpsql's growth over the hand SQL's, as the ratio of their medians over paired rounds
    (round i of both sizes), with a 90% bootstrap interval over the rounds: above 1.0 only
    where the interval is, dpsql grows faster than the hand SQL beyond the noise."""
    runs = [
        r.get(f"{contract}_{v}", {}).get("walls", []) for r in (ra, rb) for v in ("dpsql", "hand")
    ]
    if len({len(w) for w in runs}) != 1 or len(runs[0]) < 3:
        return f"{contract} d/hand -"
    ours = [y / x for x, y in zip(runs[0], runs[2], strict=True)]
    theirs = [y / x for x, y in zip(runs[1], runs[3], strict=True)]
    rng = random.Random(0)
    k = len(ours)
    boot = []
    for _ in range(2000):
        pick = [rng.randrange(k) for _ in range(k)]
        boot.append(_median([ours[i] for i in pick]) / _median([theirs[i] for i in pick]))
    boot.sort()
    point = _median(ours) / _median(theirs)
    return f"{contract} d/hand {point:.2f} [{boot[100]:.2f}-{boot[1899]:.2f}]"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        path, contract, variant, name, limit = sys.argv[2:7]
        worker(Path(path), contract, variant, name, memory_limit=limit)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[5_000_000, 20_000_000])
    parser.add_argument("--large", action="store_true", help="also 50M and 100M rows")
    parser.add_argument("--repeats", type=int, default=5, help="rounds, after one warm-up run")
    parser.add_argument(
        "--cold-rounds", type=int, default=1, help="rounds of cold runs above 20M rows"
    )
    parser.add_argument("--queries", nargs="+", default=[q.name for q in QUERIES])
    parser.add_argument("--data-dir", type=Path, default=HERE / "data")
    parser.add_argument("--results-dir", type=Path, default=HERE / "results")
    parser.add_argument("--memory-limit", default=MEMORY_LIMIT, help="DuckDB's, for all variants")
    parser.add_argument("--variants", nargs="+", help="e.g. R_dpsql L0C_hand (default: all)")
    parser.add_argument("--light", action="store_true",
                        help="data where no unit exceeds any cap (asserted)")  # fmt: skip
    args = parser.parse_args()
    sizes = sorted(set(args.sizes + ([50_000_000, 100_000_000] if args.large else [])))
    started = dt.datetime.now(dt.UTC)
    print(
        f"{os.cpu_count()} CPUs, DuckDB {duckdb.__version__}, memory limit {args.memory_limit}, "
        f"median of {args.repeats} interleaved rounds after a warm-up ({args.cold_rounds} "
        f"round(s) of cold runs above {INTERLEAVED_ROWS:,} rows)"
    )
    print(HEADER)
    labels = ["raw", "R_hand", "R_dpsql", "L0C_hand", "L0C_dpsql"]
    results = run(sizes, args.repeats, args.queries, args.data_dir, args.memory_limit,
                  variants=args.variants or labels, cold_rounds=args.cold_rounds,
                  light=args.light)  # fmt: skip
    for line in growth(results):
        print(line)
    from run import write_results  # noqa: PLC0415  (run.py imports dpsql)

    write_results(args.results_dir, "scale", started, args.repeats, results)


if __name__ == "__main__":
    main()
