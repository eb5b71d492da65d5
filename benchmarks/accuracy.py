"""Each output's ± in a query beside its ± asked alone, under the split rules of a query's
budget (``SET dpsql.split``): ``min_max_ratio`` (the default) and ``min_total_variance`` (the
old default, once called ``optimal``).

    python benchmarks/accuracy.py                  # about 2 s
    python benchmarks/accuracy.py --mechanism gaussian
    python benchmarks/accuracy.py --intervals      # quantile intervals: about 1 min

Three data sets, written in a temporary folder and generated here (none was used to choose the
rule):

* ``hospital``: 20,000 visits of 2,995 patients in 6 wards over 12 months, cost log-normal and
  capped at 100,000; the policy of a new user (docs/policy.md): L0 = 3, C = 5, cost in
  [0, 100000], epsilon 0.25 per query;
* ``retail``: 60,000 purchases of 9,000 customers in 4 regions, amount in [0, 500] and items in
  [1, 20]; L0 = 2, C = 10, epsilon 1;
* ``sensors``: 40,000 readings of 800 sensors at 5 sites, temperature in [-40, 60] (a lower
  bound below 0) and humidity in [0, 100]; L0 = 1, C = 50, epsilon 0.5.

For each query, each output's ± (the release's half-width at 95%, noise only, the median over
its groups) is printed beside the ± of the same aggregate asked alone (same GROUP BY, same
epsilon), and their ratio, with k the query's measurements: the default keeps each ratio at
most k (√k under zCDP), where the old rule can give a count a sliver of the budget. Beside
them, the median absolute error of each output against the true value (the bounding's bias
included), over the groups. Every release is a fresh one (charged to a large test budget).

``--intervals``: the interval of each order statistic (``MEDIAN``, ``QUANTILE_CONT(x, 0.9)``,
``MIN``, ``MAX``) beside its true error, on tables of one row per unit (L0 = C = 1) of five
shapes generated here (uniform, log-normal, bimodal, heavy ties: three values, all values
equal), x in [0, 1000], at n = 200, 2,000, 20,000 and 200,000 units and epsilon 1 (one query per
aggregate, a fresh release each, ``--repeats`` times): the median width hi − lo, the median
|released − true| (the true quantile of the rows, numpy's inverted CDF), their ratio, and the
share of releases whose interval held the truth (the construction guarantees 0.95).
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import numpy.typing as npt

from dpsql.policy import load_policy
from dpsql.session.session import Session

SPLITS = ("min_max_ratio", "min_total_variance")


@dataclass(frozen=True)
class DataSet:
    name: str
    sql: str  # a SELECT over range() that writes the table visits
    unit: str
    l0: int
    c: int
    epsilon: str
    columns: dict[str, dict[str, Any]]
    queries: tuple[str, ...]


HOSPITAL = DataSet(
    "hospital",
    """SELECT (i * 7919) % 2995 AS patient_id,
              (['emergency', 'surgery', 'maternity', 'cardiology', 'oncology', 'geriatrics'])
                  [1 + (i * 31 + (i * 7919) % 2995) % 6] AS ward,
              DATE '2026-01-01' + INTERVAL ((i * 13) % 12) MONTH AS month,
              LEAST(exp(7.5 + 1.2 * sqrt(-2 * ln(((i * 2654435761) % 1000003 + 1) / 1000004.0))
                    * cos(6.283185307 * ((i * 40503) % 65521) / 65521.0)), 100000)::DOUBLE
                  AS cost
       FROM range(20000) t(i)""",
    "patient_id",
    3,
    5,
    "0.25",
    {
        "cost": {"lower": 0, "upper": 100000},
        "ward": {
            "public_values": [
                "emergency",
                "surgery",
                "maternity",
                "cardiology",
                "oncology",
                "geriatrics",
            ]
        },
    },
    (
        "SELECT ward, COUNT(*), AVG(cost) FROM visits GROUP BY ward",
        "SELECT COUNT(*), SUM(cost), AVG(cost) FROM visits",
        "SELECT ward, COUNT(*), SUM(cost), STDDEV(cost) FROM visits GROUP BY ward",
    ),
)
RETAIL = DataSet(
    "retail",
    """SELECT (i * 104729) % 9000 AS customer_id,
              (['north', 'south', 'east', 'west'])[1 + (i * 17) % 4] AS region,
              ((i * 7907) % 50000) / 100.0 AS amount,
              1 + (i * 37) % 20 AS items
       FROM range(60000) t(i)""",
    "customer_id",
    2,
    10,
    "1",
    {
        "amount": {"lower": 0, "upper": 500},
        "items": {"lower": 1, "upper": 20},
        "region": {"public_values": ["north", "south", "east", "west"]},
    },
    (
        "SELECT region, COUNT(*), AVG(amount), AVG(items) FROM visits GROUP BY region",
        "SELECT COUNT(*), SUM(amount), SUM(items) FROM visits",
    ),
)
SENSORS = DataSet(
    "sensors",
    """SELECT i % 800 AS sensor_id,
              (['a', 'b', 'c', 'd', 'e'])[1 + (i % 800) % 5] AS site,
              -10 + ((i * 7919) % 5000) / 100.0 AS temperature,
              ((i * 104729) % 10000) / 100.0 AS humidity
       FROM range(40000) t(i)""",
    "sensor_id",
    1,
    50,
    "0.5",
    {
        "temperature": {"lower": -40, "upper": 60},
        "humidity": {"lower": 0, "upper": 100},
        "site": {"public_values": ["a", "b", "c", "d", "e"]},
    },
    (
        "SELECT site, COUNT(*), AVG(temperature), VARIANCE(humidity) FROM visits GROUP BY site",
        "SELECT COUNT(*), SUM(temperature), AVG(humidity) FROM visits",
    ),
)
DATA_SETS = (HOSPITAL, RETAIL, SENSORS)


def session(folder: Path, data: DataSet) -> tuple[Session, duckdb.DuckDBPyConnection]:
    path = folder / f"{data.name}.parquet"
    con = duckdb.connect(":memory:")
    con.execute(f"CREATE TABLE visits AS {data.sql}")
    con.execute(f"COPY visits TO '{path}' (FORMAT PARQUET)")
    policy = load_policy(
        {
            "dataset": {"id": data.name, "data_version": "1"},
            "data": {"tables": {"visits": str(path)}},
            "budget": {
                "epsilon": "10000",
                "delta": "0.000001",
                "query_epsilon": data.epsilon,
                "query_delta": "0.00000001",
            },
            "tables": {
                "visits": {
                    "privacy_unit": data.unit,
                    "max_groups_per_unit": data.l0,
                    "max_rows_per_unit_per_group": data.c,
                    "columns": data.columns,
                }
            },
        },
        base_dir=folder,
    )
    return Session(policy), con


def _median(values: Sequence[float | None]) -> float:
    known = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(known) if known else math.nan


def _keys(sql: str) -> str:
    """The query's GROUP BY keys as a SELECT prefix ("" without GROUP BY)."""
    if " GROUP BY " not in sql:
        return ""
    return sql.split(" GROUP BY ")[1] + ", "


def _outputs(sql: str) -> list[str]:
    inner = sql.split("SELECT ", 1)[1].split(" FROM ", 1)[0]
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(inner):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(inner[start:i].strip())
            start = i + 1
    parts.append(inner[start:].strip())
    keys = _keys(sql).rstrip(", ")
    return [p for p in parts if p != keys]


def _truth(con: duckdb.DuckDBPyConnection, sql: str) -> list[tuple[Any, ...]]:
    order = " ORDER BY 1" if _keys(sql) else ""
    return con.execute(sql.replace("VARIANCE(", "VAR_SAMP(") + order).fetchall()


def query_lines(s: Session, con: duckdb.DuckDBPyConnection, sql: str, mechanism: str) -> list[str]:
    keys = _keys(sql)
    nkeys = 1 if keys else 0
    tail = sql[sql.index(" FROM ") :]
    truth = _truth(con, sql)
    lines = []
    alone: dict[str, float] = {}
    for out in _outputs(sql):
        single = f"SELECT {keys}{out}{tail}"
        released = s.execute(single, mechanism=mechanism, fresh=True)
        alone[out] = _median([r[nkeys] for r in released.accuracy])
    for split in SPLITS:
        plan = s.plan(sql, mechanism=mechanism, split=split)
        k = len(plan.measurements)
        released = s.execute(sql, mechanism=mechanism, split=split, fresh=True)
        for i, out in enumerate(_outputs(sql)):
            col = nkeys + i
            hw = _median([r[col] for r in released.accuracy])
            errors = [
                abs(float(r[col]) - float(t[col]))
                for r, t in zip(released.rows, truth, strict=False)
                if r[col] is not None and t[col] is not None
            ]
            ratio = hw / alone[out] if alone[out] else math.nan
            lines.append(
                f"| {split} | {out} | {k} | {hw:,.4g} | {alone[out]:,.4g} | {ratio:.2f}x | "
                f"{_median(errors):,.4g} |"
            )
    return lines


SHAPES = ("uniform", "lognormal", "bimodal", "ties", "equal")
SIZES = (200, 2_000, 20_000, 200_000)
ORDERS = (("MEDIAN(x)", 0.5), ("QUANTILE_CONT(x, 0.9)", 0.9), ("MIN(x)", 0.0), ("MAX(x)", 1.0))


def shape_values(
    shape: str, n: int, rng: np.random.Generator, upper: float = 1000.0
) -> npt.NDArray[np.float64]:
    """n values in [0, upper] of one shape (also ``tests/release/test_quantile_intervals.py``'s
    data: drawn on [0, 1000], then scaled)."""
    if shape == "uniform":
        x = rng.uniform(0, 1000, n)
    elif shape == "lognormal":
        x = rng.lognormal(4.0, 1.0, n)
    elif shape == "bimodal":
        x = np.where(rng.random(n) < 0.7, rng.normal(200, 20, n), rng.normal(800, 40, n))
    elif shape == "ties":
        x = rng.choice(np.array([100.0, 100.0, 100.0, 300.0, 900.0]), n)
    else:
        x = np.full(n, 437.0)
    x = np.clip(np.round(x, 1), 0, 1000) * (upper / 1000.0)
    return np.asarray(x, dtype=np.float64)


def interval_lines(folder: Path, repeats: int) -> list[str]:
    """One line per (shape, n, aggregate): width, error, coverage (module docstring)."""
    rng = np.random.default_rng(20261206)
    lines = []
    for shape in SHAPES:
        for n in SIZES:
            x = shape_values(shape, n, rng)
            path = folder / f"{shape}_{n}.parquet"
            con = duckdb.connect()
            con.register("t", {"u": np.arange(n, dtype=np.int64), "x": x})
            con.execute(f"COPY (SELECT * FROM t) TO '{path}' (FORMAT PARQUET)")
            con.close()
            policy = load_policy(
                {
                    "dataset": {"id": f"{shape}-{n}", "data_version": "1"},
                    "data": {"tables": {"t": str(path)}},
                    "budget": {"epsilon": "10000", "delta": "1e-6", "query_epsilon": "1",
                               "query_delta": "0", "diagnose": False},
                    "tables": {"t": {"privacy_unit": "u", "max_groups_per_unit": 1,
                                     "max_rows_per_unit_per_group": 1,
                                     "columns": {"x": {"lower": 0, "upper": 1000}}}},
                },
                base_dir=folder,
            )  # fmt: skip
            s = Session(policy)
            try:
                for agg, p in ORDERS:
                    truth = float(np.quantile(x, p, method="inverted_cdf"))
                    widths, errors, held = [], [], 0
                    for _ in range(repeats):
                        result = s.execute(f"SELECT {agg} FROM t", fresh=True)
                        ((value,),), ((interval,),) = result.rows, result.accuracy
                        assert isinstance(interval, tuple)
                        widths.append(interval[1] - interval[0])
                        errors.append(abs(float(value) - truth))
                        held += interval[0] <= truth <= interval[1]
                    width, error = statistics.median(widths), statistics.median(errors)
                    ratio = f"{width / error:.1f}x" if error > 0 else "-"
                    lines.append(
                        f"| {shape} | {n:,} | {agg} | {truth:,.4g} | {width:,.4g} | "
                        f"{error:,.4g} | {ratio} | {held / repeats:.2f} |"
                    )
            finally:
                s.close()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mechanism", choices=("laplace", "gaussian"), default="laplace")
    parser.add_argument("--intervals", action="store_true", help="quantile intervals instead")
    parser.add_argument("--repeats", type=int, default=20, help="releases per interval cell")
    args = parser.parse_args()
    start = time.perf_counter()
    if args.intervals:
        with tempfile.TemporaryDirectory() as tmp:
            print("| shape | units | aggregate | truth | median width | median error | "
                  "width / error | coverage |")  # fmt: skip
            print("|---|---|---|---|---|---|---|---|")
            for line in interval_lines(Path(tmp), args.repeats):
                print(line)
        print(f"({time.perf_counter() - start:.1f} s)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        for data in DATA_SETS:
            s, con = session(Path(tmp), data)
            try:
                print(
                    f"\n### {data.name}: L0 = {data.l0}, C = {data.c}, epsilon {data.epsilon}, "
                    f"{args.mechanism}\n"
                )
                for sql in data.queries:
                    print(f"`{sql}`\n")
                    print("| split | output | k | ± | ± alone | ratio | median error |")
                    print("|---|---|---|---|---|---|---|")
                    for line in query_lines(s, con, sql, args.mechanism):
                        print(line)
                    print()
            finally:
                s.close()
                con.close()
    print(f"({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
