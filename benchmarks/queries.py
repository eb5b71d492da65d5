"""The benchmark workload: synthetic data, the queries, and a HAND-WRITTEN bounded SQL for each.

The hand-written SQL ("(b)" in ``run.py``) is the yardstick for dpsql's generated SQL: it applies
exactly the bounds of DESIGN.md section 3 (same power-of-two grid, same clamp, per-unit
pre-aggregation, at most L0 groups per unit ranked by ``hash(unit, key, salt)`` with the
session's salt, C-capping with the scaled-and-clamped sum) and must return the same integer
totals as dpsql's bounded query before noise, but it is written the way a person would write it
for this one table: no TRY wrappers, no chain of five CTEs, ranking in the same SELECT as the
per-unit GROUP BY. ``tests/engine/test_benchmark_sql.py`` checks the equality.

Grid rule (DESIGN.md section 3, ``dpsql/bound/grid.py``): for bounds [lo, hi] the step is
g = 2^(floor(log2(hi - lo)) - 20); a value x becomes round(clamp(x, lo, hi) / g) (an integer,
half away from zero as DuckDB's ROUND), NaN and NULL become NULL. Sums are in units of g; the
centred sum of AVG in units of g/2: sum over capped rows of 2·t - n'·(lo + hi)/g.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import duckdb
import numpy as np

REGIONS = ("central", "east", "north", "south", "west")
SPEND_BOUNDS = (0, 200)
AGE_BOUNDS = (18, 90)
L0 = 2  # max_groups_per_unit
C = 10  # max_rows_per_unit_per_group
GRID_BITS = 20


# -- data -------------------------------------------------------------------------------------


def rows_per_unit(n_rows: int, n_units: int, rng: np.random.Generator) -> np.ndarray:
    """Skewed contributions summing to exactly ``n_rows``: most units 1-10 rows, 1% heavy.

    Heavy units draw 50-800 rows (like ``examples/make_data.py``), so C and L0 bind; the counts
    are then rescaled to the requested total, every unit keeping at least one row.
    """
    if not 1 <= n_units <= n_rows:
        raise ValueError("need 1 <= units <= rows")
    counts = rng.integers(1, 11, size=n_units).astype(np.float64)
    heavy = rng.random(n_units) < 0.01
    counts[heavy] = rng.integers(50, 801, size=int(heavy.sum()))
    scaled = np.maximum(1, np.floor(counts * (n_rows / counts.sum()))).astype(np.int64)
    short = n_rows - int(scaled.sum())
    if short > 0:  # floor lost fewer than n_units rows: one more for `short` random units
        scaled[rng.choice(n_units, size=short, replace=False)] += 1
    elif short < 0:  # max(1, .) added rows: take them back from the largest units
        order = np.argsort(-scaled, kind="stable")
        i = 0
        while short < 0:
            j = order[i % n_units]
            if scaled[j] > 1:
                scaled[j] -= 1
                short += 1
            i += 1
    assert int(scaled.sum()) == n_rows
    return scaled


def write_visits(path: Path, n_rows: int, n_units: int, seed: int = 20261129) -> None:
    """Write a ``visits`` Parquet file (user_id, region, age, spend, day) with exactly n_rows.

    Deterministic for a given seed. Each unit has a home region visited 80% of the time, an
    age, and log-normal spends with a tail above the clamp; rows are ordered by (user_id, day).
    """
    rng = np.random.default_rng(seed)
    counts = rows_per_unit(n_rows, n_units, rng)
    user_id = np.repeat(np.arange(1, n_units + 1, dtype=np.int64), counts)
    home = rng.choice(len(REGIONS), size=n_units, p=[0.1, 0.2, 0.3, 0.25, 0.15]).astype(np.int8)
    region = np.repeat(home, counts)
    away = rng.random(n_rows) < 0.2
    region[away] = rng.integers(0, len(REGIONS), size=int(away.sum()), dtype=np.int8)
    age = np.repeat(rng.integers(18, 86, size=n_units, dtype=np.int32), counts)
    spend = np.round(rng.lognormal(mean=3.0, sigma=1.0, size=n_rows), 2)
    day = rng.integers(0, 365, size=n_rows, dtype=np.int16)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    con = duckdb.connect(":memory:")
    try:
        con.register(
            "src",
            {"user_id": user_id, "region": region, "age": age, "spend": spend, "day": day},
        )
        names = "[" + ", ".join(f"'{r}'" for r in REGIONS) + "]"
        con.execute(
            f"""COPY (SELECT user_id, {names}[region + 1] AS region, age, spend,
                             DATE '2026-01-01' + CAST(day AS INTEGER) AS day
                      FROM src ORDER BY user_id, day)
                TO '{tmp}' (FORMAT PARQUET)"""
        )
    finally:
        con.close()
    tmp.replace(path)


# -- bounds -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bounds:
    """The public numbers the hand-written SQL enforces (the policy's, and the session salt)."""

    salt: int
    l0: int = L0
    c: int = C
    lo: int = SPEND_BOUNDS[0]
    hi: int = SPEND_BOUNDS[1]

    @property
    def step(self) -> Fraction:
        """g = 2^(floor(log2(hi - lo)) - 20), the documented grid rule."""
        return Fraction(2) ** (math.floor(math.log2(self.hi - self.lo)) - GRID_BITS)

    @property
    def lo_units(self) -> int:
        return math.floor(self.lo / self.step)

    @property
    def hi_units(self) -> int:
        return math.ceil(self.hi / self.step)

    def value(self, column: str) -> str:
        """A value on the grid as a BIGINT; NULL for NULL and NaN."""
        g = self.step
        scaled = f"* {g.denominator}" if g <= 1 else f"/ {g.numerator}"
        return (
            f"CASE WHEN NOT isnan({column}) THEN CAST(ROUND(LEAST(GREATEST({column}, {self.lo}), "
            f"{self.hi}) {scaled}) AS BIGINT) END"
        )

    def capped_sum(self, n: str, s: str) -> str:
        """A unit's sum after capping at C rows: exact if n <= C, else scaled and clamped."""
        c = self.c
        return (
            f"CASE WHEN {n} <= {c} THEN {s} ELSE CAST(LEAST(GREATEST(ROUND(CAST({s} AS DOUBLE) "
            f"* {c} / {n}), {c * self.lo_units}), {c * self.hi_units}) AS BIGINT) END"
        )


def _regions() -> str:
    return ", ".join(f"'{r}'" for r in REGIONS)


def _domain() -> str:
    return "(VALUES " + ", ".join(f"('{r}')" for r in REGIONS) + ") AS d(region)"


def _filled(measures: str, source: str) -> str:
    """Aggregate ``source`` per region, then give every public region a row (0 if absent)."""
    names = [m.rsplit(" AS ", 1)[1] for m in _split(measures)]
    out = ", ".join(f"COALESCE(a.{n}, 0) AS {n}" for n in names)
    return (
        f"SELECT d.region, {out} FROM {_domain()} "
        f"LEFT JOIN (SELECT region, {measures} FROM {source} GROUP BY region) AS a "
        "ON a.region = d.region"
    )


def _split(measures: str) -> list[str]:
    """Split a select list on its top-level commas."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(measures):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(measures[start:i].strip())
            start = i + 1
    return [*parts, measures[start:].strip()]


def _ranked(b: Bounds) -> str:
    """Keep at most L0 of a unit's groups, by the salted hash of (unit, key).

    In its own SELECT over the per-unit aggregate: in the same SELECT as the GROUP BY it is
    about 10% slower in DuckDB 2.0 (measured at 10M rows).
    """
    return (
        f"), per_unit AS (SELECT * FROM grouped QUALIFY row_number() OVER (PARTITION BY "
        f"user_id ORDER BY hash(user_id, region, CAST({b.salt} AS BIGINT))) <= {b.l0}"
    )


# -- the hand-written bounded SQL, one function per query --------------------------------------


def count_by_region(b: Bounds) -> str:
    return f"""
        WITH grouped AS (
            SELECT user_id, region, COUNT(*) AS n
            FROM visits
            WHERE region IN ({_regions()})
            GROUP BY user_id, region
            {_ranked(b)}
        )
        {_filled("SUM(LEAST(n, " + str(b.c) + ")) AS n_rows", "per_unit")}"""


def sum_by_region(b: Bounds) -> str:
    return f"""
        WITH grouped AS (
            SELECT user_id, region, COUNT(v) AS n, SUM(v) AS s
            FROM (SELECT user_id, region, {b.value("spend")} AS v
                  FROM visits WHERE region IN ({_regions()}))
            GROUP BY user_id, region
            {_ranked(b)}
        )
        {_filled(f"SUM({b.capped_sum('n', 's')}) AS total", "per_unit")}"""


def avg_by_region_age30(b: Bounds) -> str:
    mid = b.lo_units + b.hi_units  # the centre in units of g/2
    return f"""
        WITH grouped AS (
            SELECT user_id, region, COUNT(v) AS n, SUM(v) AS s
            FROM (SELECT user_id, region, {b.value("spend")} AS v
                  FROM visits WHERE age >= 30 AND region IN ({_regions()}))
            GROUP BY user_id, region
            {_ranked(b)}
        ),
        capped AS (
            SELECT region, LEAST(n, {b.c}) AS n, {b.capped_sum("n", "s")} AS t FROM per_unit
        )
        {_filled(f"SUM(2 * t - n * {mid}) AS centred, SUM(n) AS n_values", "capped")}"""


def count_sum_total(b: Bounds) -> str:
    return f"""
        SELECT COALESCE(SUM(LEAST(n, {b.c})), 0) AS n_rows, COALESCE(SUM(t), 0) AS total
        FROM (SELECT COUNT(*) AS n, {b.capped_sum("COUNT(v)", "SUM(v)")} AS t
              FROM (SELECT user_id, {b.value("spend")} AS v FROM visits)
              GROUP BY user_id)"""


@dataclass(frozen=True)
class BenchQuery:
    name: str
    sql: str  # what the analyst sends to dpsql, and (a): the same SQL straight on DuckDB
    kinds: tuple[str, ...]  # dpsql's measurements, in the order (b) returns them
    keyed: bool  # True: the first column of (b) is the region
    bounded: Callable[[Bounds], str]  # (b)


QUERIES: tuple[BenchQuery, ...] = (
    BenchQuery(
        "count_by_region",
        "SELECT region, COUNT(*) AS n FROM visits GROUP BY region",
        ("rows",),
        True,
        count_by_region,
    ),
    BenchQuery(
        "sum_by_region",
        "SELECT region, SUM(spend) AS total FROM visits GROUP BY region",
        ("sum",),
        True,
        sum_by_region,
    ),
    BenchQuery(
        "avg_age30_by_region",
        "SELECT region, AVG(spend) AS avg FROM visits WHERE age >= 30 GROUP BY region",
        ("centred", "count"),
        True,
        avg_by_region_age30,
    ),
    BenchQuery(
        "count_sum_total",
        "SELECT COUNT(*) AS n, SUM(spend) AS total FROM visits",
        ("rows", "sum"),
        False,
        count_sum_total,
    ),
)


def policy_dict(data: Path, epsilon: str = "10000") -> dict[str, Any]:
    """The benchmark policy (load with ``dpsql.policy.load_policy``): L0=2, C=10, spend [0,200]."""
    return {
        "dataset": {"id": f"bench-{data.stem}", "data_version": "1"},
        "data": {"tables": {"visits": str(data.resolve())}},
        "budget": {
            "epsilon": epsilon,
            "delta": "0.000001",
            "query_epsilon": "1",
            "query_delta": "0.00000001",
        },
        "tables": {
            "visits": {
                "privacy_unit": "user_id",
                "max_groups_per_unit": L0,
                "max_rows_per_unit_per_group": C,
                "columns": {
                    "age": {"lower": AGE_BOUNDS[0], "upper": AGE_BOUNDS[1]},
                    "spend": {"lower": SPEND_BOUNDS[0], "upper": SPEND_BOUNDS[1]},
                    "region": {"public_values": list(REGIONS)},
                },
            }
        },
    }


def totals(rows: list[tuple[Any, ...]], keyed: bool) -> dict[Any, tuple[int, ...]]:
    """Rows of (key?, measurement...) as {key or None: integer totals}, for comparisons."""
    if keyed:
        return {r[0]: tuple(int(v or 0) for v in r[1:]) for r in rows}
    (row,) = rows  # no GROUP BY: exactly one row
    return {None: tuple(int(v or 0) for v in row)}
