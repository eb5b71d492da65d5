"""Each output's ± in a query beside its ± asked alone, under the split rules of a query's
budget (``SET dpsql.split``): ``min_max_ratio`` (the default) and ``min_total_variance`` (the
old default, once called ``optimal``).

    python benchmarks/accuracy.py                  # about 2 s
    python benchmarks/accuracy.py --mechanism gaussian

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mechanism", choices=("laplace", "gaussian"), default="laplace")
    args = parser.parse_args()
    start = time.perf_counter()
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
