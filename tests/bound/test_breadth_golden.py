"""Golden rewrite tests for the wider SQL surface, each executed on DuckDB.

Covered: private x public joins (INNER with a lookup that fans out, LEFT from the private side,
SEMI, ANTI, CROSS), a private self-join on the unit, two private tables of one unit domain,
row-level CTEs and FROM-subqueries with derived columns, a per-unit pre-aggregation CTE,
quantiles (MEDIAN, QUANTILE_CONT, MIN, MAX), COUNT(DISTINCT col), the total row cap R and date
keys (``month(day)``, ``date_trunc('month', day)`` over a declared ``date_range``).

For every ``tests/bound/golden_breadth/NAME.sql`` (and the options its :class:`Case` gives):

1. the bounded SQL of ``session.plan(sql)`` must equal ``NAME.bounded.sql`` exactly
   (``DPSQL_UPDATE_GOLDEN=1`` rewrites them; the salt is bound as ``$salt``, so the text is
   stable);
2. the bounded SQL runs on a small hand-made data set and its pre-noise totals must equal a
   plain-Python reference: the join, filter, fan-out and per-unit bounding re-implemented here
   row by row. That data set keeps every unit within L0 groups (which groups the keyed hash
   would keep is the one thing the reference cannot know), while C binds for several units;
3. on a data set where one unit exceeds every bound, removing a unit moves no group's total by
   more than the plan's per-group bound, touches at most L0 groups and, summed over groups,
   stays within the L1 sensitivity (and within R times the per-row bound when R is set). For a
   quantile, the exponential mechanism's scores are recomputed here from the histograms.

Refusals (RIGHT/FULL joins, private tables joined off the unit or across unit domains, LIMIT in
a subquery, a per-unit subquery not grouped by the unit, a quantile order outside [0, 1]) must
raise a typed error and charge nothing.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import random
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import sqlglot
from conftest import write_parquet
from sqlglot import exp

from dpsql.engine.duckdb.engine import DuckDBEngine
from dpsql.errors import QueryError, UnsupportedQueryError
from dpsql.mechanisms.quantile_score import quantile_scores
from dpsql.plan.aggregates.quantiles import sides
from dpsql.plan.plans import Measurement, Plan
from dpsql.policy import Policy, load_policy
from dpsql.session.session import Session
from dpsql.sql.parse import DIALECT

GOLDEN = Path(__file__).parent / "golden_breadth"
UPDATE = os.environ.get("DPSQL_UPDATE_GOLDEN") == "1"

# Bounds of the visits table; purchases declares looser ones, so a join takes these (the
# smallest each table declares).
L0 = 2
C = 3
REGIONS = ("central", "east", "north", "south", "west")
DATE_RANGE = (dt.date(2024, 1, 1), dt.date(2024, 12, 31))

Row = dict[str, Any]
Key = tuple[Any, ...]

VISITS_SCHEMA = (
    ("user_id", "BIGINT"),
    ("region", "VARCHAR"),
    ("age", "INTEGER"),
    ("spend", "DOUBLE"),
    ("day", "DATE"),
    ("item", "VARCHAR"),
)
PURCHASES_SCHEMA = (("user_id", "BIGINT"), ("amount", "DOUBLE"))
DEVICES_SCHEMA = (("user_id", "BIGINT"), ("seconds", "DOUBLE"))
# A public lookup: north maps to two zones (a join fans out), south to none (an inner join
# drops it).
ZONES = (("east", "E"), ("west", "W"), ("north", "N"), ("north", "E"), ("central", "N"))
ZONES_SCHEMA = (("region", "VARCHAR"), ("zone", "VARCHAR"))
TIERS = (("lo", 0.0), ("hi", 100.0))
TIERS_SCHEMA = (("tier", "VARCHAR"), ("threshold", "DOUBLE"))
# Normalised tables of the person domain: people is the root (its unit user_id), baskets reach it
# through user_id, lines through their basket and on through the basket's user (unit_path).
PEOPLE_SCHEMA = (("user_id", "BIGINT"), ("segment", "VARCHAR"))
BASKETS_SCHEMA = (("basket_id", "BIGINT"), ("user_id", "BIGINT"), ("channel", "VARCHAR"))
LINES_SCHEMA = (("basket_id", "BIGINT"), ("product", "VARCHAR"), ("price", "DOUBLE"))
SEGMENTS = ("a", "b", "c")
CHANNELS = ("shop", "web")
PRODUCTS = ("p1", "p2", "p3")


@dataclass(frozen=True)
class Data:
    """The private tables' rows, as tuples in schema order."""

    visits: tuple[tuple[Any, ...], ...]
    purchases: tuple[tuple[Any, ...], ...]
    people: tuple[tuple[Any, ...], ...] = ()
    baskets: tuple[tuple[Any, ...], ...] = ()
    lines: tuple[tuple[Any, ...], ...] = ()

    def without(self, unit: int | None) -> Data:
        """The neighbouring data set: every resolved row of ``unit`` removed. Its rows of the
        tables that hold the unit (visits, purchases, and people, the root of the paths), so
        that no basket or line resolves to it any more; a basket or line that also reaches
        another unit (a key listed twice) keeps that unit's resolved row (docs/privacy.md)."""
        return Data(
            tuple(r for r in self.visits if r[0] != unit),
            tuple(r for r in self.purchases if r[0] != unit),
            tuple(r for r in self.people if r[0] != unit),
            self.baskets,
            self.lines,
        )


def write_world(directory: Path, data: Data, max_rows_per_unit: int | None = None) -> Policy:
    """Parquet files for every table and the policy over them."""
    directory.mkdir(parents=True, exist_ok=True)
    write_parquet(directory / "visits.parquet", data.visits, VISITS_SCHEMA)
    write_parquet(directory / "purchases.parquet", data.purchases, PURCHASES_SCHEMA)
    write_parquet(directory / "devices.parquet", [(1, 60.0)], DEVICES_SCHEMA)
    write_parquet(directory / "zones.parquet", ZONES, ZONES_SCHEMA)
    write_parquet(directory / "tiers.parquet", TIERS, TIERS_SCHEMA)
    write_parquet(directory / "people.parquet", data.people, PEOPLE_SCHEMA)
    write_parquet(directory / "baskets.parquet", data.baskets, BASKETS_SCHEMA)
    write_parquet(directory / "lines.parquet", data.lines, LINES_SCHEMA)
    visits: dict[str, Any] = {
        "privacy_unit": "user_id",
        "unit_domain": "person",
        "max_groups_per_unit": L0,
        "max_rows_per_unit_per_group": C,
        "columns": {
            "age": {"lower": 18, "upper": 90},
            "spend": {"lower": 0, "upper": 200},
            "region": {"public_values": list(REGIONS)},
            "day": {"date_range": list(DATE_RANGE)},
        },
    }
    if max_rows_per_unit is not None:
        visits["max_rows_per_unit"] = max_rows_per_unit
    names = ("visits", "purchases", "devices", "zones", "tiers", "people", "baskets", "lines")
    return load_policy(
        {
            "dataset": {"id": "breadth", "data_version": "1"},
            "data": {"tables": {n: f"{n}.parquet" for n in names}},
            "budget": {
                "diagnose": False,
                "epsilon": "10",
                "delta": "0.000001",
                "query_epsilon": "1",
                "query_delta": "0.00000001",
            },
            "tables": {
                "visits": visits,
                "purchases": {
                    "privacy_unit": "user_id",
                    "unit_domain": "person",
                    "max_groups_per_unit": L0 + 1,
                    "max_rows_per_unit_per_group": C + 2,
                    "columns": {"amount": {"lower": 0, "upper": 100}},
                },
                "devices": {
                    "privacy_unit": "user_id",
                    "unit_domain": "device",
                    "max_groups_per_unit": L0,
                    "max_rows_per_unit_per_group": C,
                    "columns": {"seconds": {"lower": 0, "upper": 3600}},
                },
                "zones": {"public": True, "columns": {"zone": {"public_values": ["E", "N", "W"]}}},
                "people": {
                    "privacy_unit": "user_id",
                    "unit_domain": "person",
                    "max_groups_per_unit": L0,
                    "max_rows_per_unit_per_group": C,
                    "columns": {"segment": {"public_values": list(SEGMENTS)}},
                },
                "baskets": {
                    "unit_path": ["user_id -> people.user_id"],
                    "max_groups_per_unit": L0,
                    "max_rows_per_unit_per_group": C,
                    "columns": {"channel": {"public_values": list(CHANNELS)}},
                },
                "lines": {
                    "unit_path": ["basket_id -> baskets.basket_id", "user_id -> people.user_id"],
                    "max_groups_per_unit": L0,
                    "max_rows_per_unit_per_group": C,
                    "columns": {
                        "product": {"public_values": list(PRODUCTS)},
                        "price": {"lower": 0, "upper": 50},
                    },
                },
                # The tier domain is read from the public table itself.
                "tiers": {
                    "public": True,
                    "columns": {"tier": {"public_values_from": "tiers.tier"}},
                },
            },
        },
        base_dir=directory,
    )


# -- SQL semantics in plain Python -----------------------------------------------------------


def value(x: Any) -> Any:
    """A value as the bounded query sees it: NULL and NaN are both missing."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return None
    return x


def sql_ge(a: float | None, b: float | None) -> bool:
    """DuckDB's ``a >= b`` in a WHERE: NULL is not true; NaN is above every number."""
    if a is None or b is None:
        return False
    if math.isnan(a):
        return True
    if math.isnan(b):
        return False
    return a >= b


def round_half_away(x: float) -> int:
    """DuckDB's ROUND on DOUBLE: halves away from zero."""
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


@dataclass(frozen=True)
class HandGrid:
    """DESIGN.md section 3's grid, computed by hand: g = 2^(floor(log2(hi - lo)) - bits), at
    least 1 for an integer range; bounds g·floor(lo/g) and g·ceil(hi/g)."""

    lo: Fraction
    hi: Fraction
    integral: bool
    bits: int = 20

    @property
    def step(self) -> Fraction:
        width = self.hi - self.lo
        k = 0
        while Fraction(2) ** k > width:
            k -= 1
        while Fraction(2) ** (k + 1) <= width:
            k += 1
        g = Fraction(2) ** (k - self.bits)
        return max(g, Fraction(1)) if self.integral else g

    @property
    def lower(self) -> int:
        return math.floor(self.lo / self.step)

    @property
    def upper(self) -> int:
        return math.ceil(self.hi / self.step)

    def units(self, x: float) -> int:
        if math.isinf(x):
            return self.upper if x > 0 else self.lower
        scaled = min(max(Fraction(x) / self.step, Fraction(self.lower)), Fraction(self.upper))
        return round_half_away(float(scaled))


def grid(lo: int, hi: int, integral: bool = False, bits: int = 20) -> HandGrid:
    return HandGrid(Fraction(lo), Fraction(hi), integral, bits)


def evenly(values: Sequence[Any], c: int) -> list[Any]:
    """At most ``c`` of a unit's sorted values, evenly spaced: every step-th from the first."""
    step = max(math.ceil(len(values) / c), 1)
    return list(values)[::step]


@dataclass(frozen=True)
class Ref:
    """The reference meaning of one measurement: its kind, the row value it reads, its grid
    and, for a quantile, its order."""

    kind: str  # rows | count | units | sum | centred | quantile | distinct
    value: Callable[[Row], Any] | None = None
    grid: HandGrid | None = None
    p: Fraction | None = None

    def per_row(self) -> int:
        """How far one row can move one group's total, in the measurement's integer units."""
        if self.kind in ("rows", "count", "distinct", "units"):
            return 1
        assert self.grid is not None
        g = self.grid
        if self.kind == "sum":
            return max(abs(g.lower), abs(g.upper))
        if self.kind == "centred":
            return g.upper - g.lower
        assert self.p is not None
        a, b = self.p.numerator, self.p.denominator
        return max(a, b - a)

    def unit(self) -> Fraction:
        if self.kind in ("rows", "count", "distinct", "units"):
            return Fraction(1)
        assert self.grid is not None
        return self.grid.step / 2 if self.kind == "centred" else self.grid.step

    def contribution(self, rows: Sequence[Row], c: int) -> Any:
        """One unit's bounded contribution to one group, from its rows in that group."""
        if self.kind == "rows":
            return min(len(rows), c)
        if self.kind == "units":
            return 1
        assert self.value is not None
        xs = [x for x in (value(self.value(r)) for r in rows) if x is not None]
        if self.kind == "count":
            return min(len(xs), c)
        if self.kind == "distinct":
            return set(evenly(sorted(set(xs)), c))
        assert self.grid is not None
        g = self.grid
        units = [g.units(x) for x in xs]
        if self.kind == "quantile":
            return Counter(evenly(sorted(units), c))
        s = sum(units)
        if len(units) <= c:
            t = s
        else:  # the unit looks like C rows of its own mean, rounded back to the grid
            t = min(max(round_half_away(float(s) * c / len(units)), c * g.lower), c * g.upper)
        if self.kind == "sum":
            return t
        return 2 * t - min(len(units), c) * (g.lower + g.upper)

    def empty(self) -> Any:
        return {"quantile": Counter(), "distinct": set()}.get(self.kind, 0)

    def finish(self, total: Any) -> Any:
        if self.kind == "distinct":
            return len(total)
        if self.kind == "quantile":
            return dict(total)
        return total


def combine(a: Any, b: Any) -> Any:
    if isinstance(a, set):
        return a | b
    return a + b


# -- the relations, row by row ---------------------------------------------------------------

VISIT_COLUMNS = tuple(name for name, _ in VISITS_SCHEMA)


def visits(d: Data) -> list[Row]:
    return [{**dict(zip(VISIT_COLUMNS, r, strict=True)), "_u": r[0]} for r in d.visits]


def purchases(d: Data) -> list[Row]:
    return [{"user_id": r[0], "amount": r[1]} for r in d.purchases]


def zones_of(region: str | None) -> list[str | None]:
    return [z for r, z in ZONES if region is not None and r == region]


def inner_zone(d: Data) -> list[Row]:
    return [{**v, "zone": z} for v in visits(d) for z in zones_of(v["region"])]


def left_zone(d: Data) -> list[Row]:
    return [{**v, "zone": z} for v in visits(d) for z in (zones_of(v["region"]) or [None])]


def semi_zone(d: Data) -> list[Row]:
    return [v for v in visits(d) if zones_of(v["region"])]


def anti_zone(d: Data) -> list[Row]:
    return [v for v in visits(d) if not zones_of(v["region"])]


def cross_tiers(d: Data) -> list[Row]:
    return [
        {**v, "tier": t, "threshold": th}
        for v in visits(d)
        for t, th in TIERS
        if sql_ge(v["spend"], th)
    ]


def self_join(d: Data) -> list[Row]:
    """Every pair of rows of one unit: a unit with n rows becomes n² rows."""
    by_unit: dict[int, list[Row]] = defaultdict(list)
    for v in visits(d):
        by_unit[v["_u"]].append(v)
    return [
        {"a": a, "b": b, "_u": unit} for unit, rows in by_unit.items() for a in rows for b in rows
    ]


def with_purchases(d: Data) -> list[Row]:
    ps = purchases(d)
    return [{**v, "amount": p["amount"]} for v in visits(d) for p in ps if p["user_id"] == v["_u"]]


def doubled(x: float | None) -> float | None:
    return None if x is None else x * 2


def cte_rows(d: Data) -> list[Row]:
    return [
        {"_u": v["_u"], "region": v["region"], "s2": doubled(v["spend"])}
        for v in visits(d)
        if v["age"] is not None and v["age"] >= 30
    ]


def subquery_rows(d: Data) -> list[Row]:
    # IS NOT NULL keeps NaN: it is a value in SQL, only the bounded aggregates treat it as NULL.
    return [{"_u": v["_u"], "s2": doubled(v["spend"])} for v in visits(d) if v["spend"] is not None]


def sql_avg(xs: Sequence[float]) -> float:
    """AVG over non-NULL doubles; NaN where SQL's is NaN (a NaN, or +inf with -inf). Exact
    agreement matters only on the hand-made data, whose values are small."""
    try:
        return math.fsum(xs) / len(xs)
    except (ValueError, OverflowError):
        return math.nan


def per_unit_rows(d: Data) -> list[Row]:
    """One row per unit: its row count and the AVG of its spend (NaN if any spend is NaN)."""
    by_unit: dict[int, list[Row]] = defaultdict(list)
    for v in visits(d):
        by_unit[v["_u"]].append(v)
    out = []
    for unit, rows in by_unit.items():
        spends = [v["spend"] for v in rows if v["spend"] is not None]
        avg = sql_avg(spends) if spends else None
        out.append({"_u": unit, "n": len(rows), "a": avg})
    return out


# Units through foreign keys: a path is an inner join (NULL never equal), one resolved row per
# root row reached; a join along a key also requires the two sides' units equal, except along
# the first link of the child's path, where the child row takes the parent row's unit.


def resolved_baskets(d: Data) -> list[Row]:
    return [
        {"basket_id": b, "user_id": u, "channel": ch, "_u": p}
        for b, u, ch in d.baskets
        for p, _ in d.people
        if u is not None and u == p
    ]


def resolved_lines(d: Data) -> list[Row]:
    baskets = resolved_baskets(d)
    return [
        {"basket_id": b, "product": product, "price": price, "_u": r["_u"]}
        for b, product, price in d.lines
        for r in baskets
        if b is not None and b == r["basket_id"]
    ]


def lines_baskets(d: Data) -> list[Row]:
    """``lines JOIN baskets`` along the lines' first link: each line with each resolved basket
    row of its id, whose unit the joined row takes (dpsql.analyze.path_joins)."""
    return [
        {"basket_id": b, "product": product, "price": price, "_u": r["_u"],
         "channel": r["channel"], "user_id": r["user_id"]}
        for b, product, price in d.lines
        for r in resolved_baskets(d)
        if b is not None and b == r["basket_id"]
    ]  # fmt: skip


def lines_baskets_people(d: Data) -> list[Row]:
    """... then ``JOIN people`` along the baskets' first link: the lines and the baskets as
    they are, each joined row the person row's."""
    return [
        {"basket_id": b, "product": product, "price": price, "channel": channel,
         "user_id": u, "segment": segment, "_u": p}
        for b, product, price in d.lines
        for basket, u, channel in d.baskets
        if b is not None and b == basket
        for p, segment in d.people
        if u is not None and u == p
    ]  # fmt: skip


def baskets_right_lines(d: Data) -> list[Row]:
    """``lines RIGHT JOIN baskets``: every resolved basket row, with its unit's lines of its id
    or, without any, once with NULL line columns."""
    lines = resolved_lines(d)
    out = []
    for b in resolved_baskets(d):
        matched = [
            {**b, "product": line["product"], "price": line["price"]}
            for line in lines
            if line["basket_id"] == b["basket_id"] and line["_u"] == b["_u"]
        ]
        out += matched or [{**b, "product": None, "price": None}]
    return out


def visits_full_purchases(d: Data) -> list[Row]:
    """``visits FULL JOIN purchases`` on the unit: pairs of one unit's rows, and each row that
    meets none alone, carrying its own unit (NULL for a row without one)."""
    vs, ps = visits(d), purchases(d)
    out = []
    for v in vs:
        matched = [p for p in ps if v["_u"] is not None and p["user_id"] == v["_u"]]
        out += [{**v, "amount": p["amount"]} for p in matched] or [{**v, "amount": None}]
    for p in ps:
        if not any(v["_u"] is not None and v["_u"] == p["user_id"] for v in vs):
            out.append({"spend": None, "amount": p["amount"], "_u": p["user_id"]})
    return out


def union_all(d: Data) -> list[Row]:
    return [
        *({"x": v["spend"], "_u": v["_u"]} for v in visits(d)),
        *({"x": p["amount"], "_u": p["user_id"]} for p in purchases(d)),
        *({"x": line["price"], "_u": line["_u"]} for line in resolved_lines(d)),
    ]


def set_key(x: Any) -> tuple[Any, ...]:
    """A value as a set operation compares it: NULL equals NULL, NaN equals NaN."""
    if x is None:
        return ("NULL",)
    if isinstance(x, float) and math.isnan(x):
        return ("NaN",)
    return (x,)


def unit_values(rows: Sequence[tuple[Any, ...]]) -> dict[tuple[Any, ...], Row]:
    """Each distinct (unit, value) of a table's first two columns, as a row."""
    return {(set_key(r[0]), set_key(r[1])): {"_u": r[0], "x": r[1]} for r in rows}


def set_operation(word: str) -> Callable[[Data], list[Row]]:
    def rows(d: Data) -> list[Row]:
        left = unit_values([(r[0], r[3]) for r in d.visits])  # (user_id, spend)
        right = unit_values(d.purchases)  # (user_id, amount)
        if word == "UNION":
            return list({**right, **left}.values())
        if word == "INTERSECT":
            return [row for k, row in left.items() if k in right]
        return [row for k, row in left.items() if k not in right]

    return rows


def region_key(r: Row) -> Key:
    return (r["region"],)


def month_key(r: Row) -> Key:
    return (r["day"].month if r["day"] is not None else None,)


def trunc_key(r: Row) -> Key:
    day = r["day"]
    return (dt.datetime(day.year, day.month, 1) if day is not None else None,)


def channel_key(r: Row) -> Key:
    return (r["channel"],)


def basket(r: Row) -> Any:
    return r["basket_id"]


def spend(r: Row) -> Any:
    return r["spend"]


def age(r: Row) -> Any:
    return r["age"]


SPEND = grid(0, 200)
PRICE = grid(0, 50)
AGE = grid(18, 90, integral=True)
AMOUNT = grid(0, 100)
DOUBLED = grid(0, 400)  # spend * 2 with spend in [0, 200], by interval arithmetic
SPEND_Q = grid(0, 200, bits=10)
AGE_Q = grid(18, 90, integral=True, bits=10)
DOUBLED_Q = grid(0, 400, bits=10)
REGION_DOMAIN = [(r,) for r in REGIONS]
MONTHS = [(m,) for m in range(1, 13)]
MONTH_STARTS = [(dt.datetime(2024, m, 1),) for m in range(1, 13)]


@dataclass(frozen=True)
class Case:
    """A golden query: its Python meaning and the effective bounds its plan must have."""

    relation: Callable[[Data], list[Row]]
    refs: tuple[Ref, ...]  # one per aggregate; ``measured`` one per measurement
    key: Callable[[Row], Key] = lambda r: ()
    domain: Sequence[Key] | None = None
    options: Mapping[str, object] = field(default_factory=dict)
    bounds: tuple[int, int] = (1, C)  # (L0, C) of the plan
    # The heavy unit of the exceeding data set has > L0 groups and > C rows per group here.
    exceeds: bool = True
    # Measurements the heavy unit moves by exactly their L1 sensitivity (beyond COUNT(*)).
    tight: tuple[int, ...] = ()


def per_measurement(case: Case) -> tuple[Ref, ...]:
    """One reference per measurement of the plan: a quantile is measured with its interval's
    ends (``dpsql.plan.aggregates.quantiles``), which read the same histogram."""
    out: list[Ref] = []
    for ref in case.refs:
        out.append(ref)
        if ref.kind == "quantile":
            assert ref.p is not None
            out.extend([ref] * len(sides(ref.p)))
    return tuple(out)


CASES: dict[str, Case] = {
    "join_public_inner": Case(
        inner_zone,
        (Ref("rows"), Ref("sum", spend, SPEND)),
        key=lambda r: (r["zone"],),
        domain=[("E",), ("N",), ("W",)],
        bounds=(L0, C),
    ),
    "join_public_left": Case(
        left_zone,
        (Ref("rows"), Ref("count", lambda r: r["zone"])),
        key=region_key,
        domain=REGION_DOMAIN,
        bounds=(L0, C),
    ),
    "join_public_semi": Case(
        semi_zone,
        (Ref("rows"), Ref("sum", spend, SPEND)),
        key=region_key,
        domain=REGION_DOMAIN,
        bounds=(L0, C),
    ),
    "join_public_anti": Case(
        anti_zone, (Ref("rows"), Ref("centred", age, AGE), Ref("count", age, AGE))
    ),
    "join_public_cross": Case(
        cross_tiers,
        (Ref("rows"), Ref("sum", spend, SPEND)),
        key=lambda r: (r["tier"],),
        domain=[("lo",), ("hi",)],
        bounds=(L0, C),
    ),
    "self_join_count": Case(
        self_join, (Ref("rows"),), options={"max_rows_per_unit_per_group": 10}, bounds=(1, 10)
    ),
    "self_join_comma": Case(
        self_join, (Ref("rows"),), options={"max_rows_per_unit_per_group": 10}, bounds=(1, 10)
    ),
    "self_join_grouped": Case(
        self_join,
        (Ref("rows"), Ref("sum", lambda r: r["b"]["spend"], SPEND)),
        key=lambda r: (r["a"]["region"],),
        domain=REGION_DOMAIN,
        bounds=(L0, C),
    ),
    "join_private_unit_domain": Case(
        with_purchases,
        (Ref("rows"), Ref("sum", lambda r: r["amount"], AMOUNT)),
        key=region_key,
        domain=REGION_DOMAIN,
        bounds=(L0, C),
    ),
    "cte_row_level": Case(
        cte_rows,
        (
            Ref("sum", lambda r: r["s2"], DOUBLED),
            Ref("centred", lambda r: r["s2"], DOUBLED),
            Ref("count", lambda r: r["s2"], DOUBLED),
        ),
        key=region_key,
        domain=REGION_DOMAIN,
        bounds=(L0, C),
    ),
    "subquery_derived": Case(
        subquery_rows,
        (
            Ref("rows"),
            Ref("sum", lambda r: r["s2"], DOUBLED),
            Ref("quantile", lambda r: r["s2"], DOUBLED_Q, Fraction(1)),
        ),
    ),
    "cte_per_unit": Case(
        per_unit_rows,
        (
            Ref("rows"),
            Ref("sum", lambda r: min(r["n"], 5), grid(0, 5, integral=True)),
            Ref("centred", lambda r: r["a"], SPEND),
            Ref("count", lambda r: r["a"], SPEND),
        ),
        bounds=(1, 1),  # grouped by the unit alone: one row per unit, so C' = 1
        exceeds=False,  # one row per unit: the clamp LEAST(n, 5) is what bounds it
    ),
    "quantiles": Case(
        visits,
        (
            Ref("quantile", spend, SPEND_Q, Fraction(1, 2)),
            Ref("quantile", spend, SPEND_Q, Fraction(9, 10)),
            Ref("quantile", age, AGE_Q, Fraction(0)),
            Ref("quantile", age, AGE_Q, Fraction(1)),
        ),
        key=region_key,
        domain=REGION_DOMAIN,
        bounds=(L0, C),
    ),
    "count_distinct_grouped": Case(
        visits,
        (Ref("distinct", lambda r: r["item"]), Ref("units")),
        key=region_key,
        domain=REGION_DOMAIN,
        bounds=(L0, C),
        tight=(0, 1),
    ),
    # Counts over few public keys: L0's ranking per unit in one row (dpsql.bound.pivot)
    "count_by_region": Case(
        visits,
        (Ref("rows"), Ref("count", lambda r: r["age"]), Ref("units")),
        key=region_key,
        domain=REGION_DOMAIN,
        bounds=(L0, C),
    ),
    "count_distinct_ungrouped": Case(
        visits, (Ref("distinct", lambda r: r["item"]), Ref("distinct", age)), tight=(0,)
    ),
    "row_cap": Case(
        visits,
        (Ref("rows"), Ref("sum", spend, SPEND)),
        key=region_key,
        domain=REGION_DOMAIN,
        options={"max_rows_per_unit": 2},
        bounds=(2, 2),  # L0' = min(L0, R), C' = min(C, R)
    ),
    "date_month": Case(
        visits,
        (Ref("rows"), Ref("sum", spend, SPEND)),
        key=month_key,
        domain=MONTHS,
        bounds=(L0, C),
    ),
    "date_trunc_month": Case(
        visits, (Ref("rows"),), key=trunc_key, domain=MONTH_STARTS, bounds=(L0, C)
    ),
    # Units through foreign keys (unit_path), joins along the declared keys, outer joins of
    # private relations and set operations.
    "path_two_links": Case(
        resolved_lines,
        (Ref("rows"), Ref("sum", lambda r: r["price"], PRICE), Ref("distinct", basket)),
        key=lambda r: (r["product"],),
        domain=[(x,) for x in PRODUCTS],
        bounds=(L0, C),
    ),
    "path_join_key": Case(
        lines_baskets,
        (Ref("rows"), Ref("sum", lambda r: r["price"], PRICE)),
        key=channel_key,
        domain=[(x,) for x in CHANNELS],
        bounds=(L0, C),
    ),
    "path_join_chain": Case(
        lines_baskets_people,
        (Ref("rows"), Ref("sum", lambda r: r["price"], PRICE)),
        key=lambda r: (r["segment"],),
        domain=[(x,) for x in SEGMENTS],
        bounds=(L0, C),
    ),
    # The same chain written with commas: the WHERE's key equalities are the joins' ON.
    "path_comma_chain": Case(
        lines_baskets_people,
        (Ref("rows"), Ref("sum", lambda r: r["price"], PRICE)),
        key=lambda r: (r["segment"],),
        domain=[(x,) for x in SEGMENTS],
        bounds=(L0, C),
    ),
    "path_right_join": Case(
        baskets_right_lines,
        (
            Ref("rows"),
            Ref("count", lambda r: r["price"]),
            Ref("sum", lambda r: r["price"], PRICE),
        ),
        key=channel_key,
        domain=[(x,) for x in CHANNELS],
        bounds=(L0, C),
    ),
    "full_join_units": Case(
        visits_full_purchases,
        (Ref("rows"), Ref("count", spend), Ref("sum", lambda r: r["amount"], AMOUNT)),
    ),
    "union_all_units": Case(union_all, (Ref("rows"), Ref("sum", lambda r: r["x"], SPEND))),
    "set_union": Case(
        set_operation("UNION"),
        (Ref("rows"), Ref("count", lambda r: r["x"]), Ref("sum", lambda r: r["x"], SPEND)),
    ),
    "set_intersect": Case(
        set_operation("INTERSECT"),
        (Ref("rows"), Ref("sum", lambda r: r["x"], SPEND), Ref("units")),
    ),
    "set_except": Case(
        set_operation("EXCEPT"),
        (Ref("rows"), Ref("count", lambda r: r["x"]), Ref("sum", lambda r: r["x"], SPEND)),
    ),
}
# Its reference depends on which rows the keyed hash keeps: checked by its own tests below.
HASH_DEPENDENT = {"row_cap"}
NAMES = sorted(CASES)


def sql_of(name: str) -> str:
    return (GOLDEN / f"{name}.sql").read_text()


def reference(case: Case, data: Data, l0: int, c: int) -> dict[Key, list[Any]]:
    """Per released key, per measurement: the bounded pre-noise total."""
    groups: dict[tuple[Any, Key], list[Row]] = defaultdict(list)
    for r in case.relation(data):
        key = case.key(r)
        if case.domain is not None and key not in case.domain:
            continue  # rows outside a public domain are dropped before bounding
        groups[(r["_u"], key)].append(r)
    per_unit = Counter(u for u, _ in groups)
    # The hand-made data keep every unit within L0 groups: no hash decides what is kept.
    assert max(per_unit.values()) <= l0
    totals: dict[Key, list[Any]] = {}
    for (_, key), rows in groups.items():
        acc = totals.setdefault(key, [ref.empty() for ref in per_measurement(case)])
        for j, ref in enumerate(per_measurement(case)):
            acc[j] = combine(acc[j], ref.contribution(rows, c))
    for key in case.domain or []:
        totals.setdefault(key, [ref.empty() for ref in per_measurement(case)])
    return {
        k: [ref.finish(v) for ref, v in zip(per_measurement(case), vs, strict=True)]
        for k, vs in totals.items()
    }


def measured(plan: Plan, engine_rows: Sequence[Sequence[Any]]) -> dict[Key, list[Any]]:
    """The engine's bounded totals, per key; a missing total reads as 0 (an empty histogram)."""
    n_keys = len(plan.analysis.keys)
    out: dict[Key, list[Any]] = {}
    for row in engine_rows:
        key = tuple(row[:n_keys])
        assert key not in out
        totals: list[Any] = []
        for m, v in zip(plan.measurements, row[n_keys:], strict=True):
            if m.spec.kind == "quantile":
                totals.append({int(k): int(n) for k, n in (v or {}).items()})
            else:
                totals.append(int(v) if v is not None else 0)
        out[key] = totals
    return out


def run_plan(engine: DuckDBEngine, plan: Plan) -> dict[Key, list[Any]]:
    names, rows = engine.run(plan.engine_sql)
    n_keys = len(plan.analysis.keys)
    assert names == [f"_k{i}" for i in range(n_keys)] + [
        f"_m{j}" for j in range(len(plan.measurements))
    ]
    return measured(plan, rows)


def with_ctes(plan: Plan, select: str) -> str:
    """``select`` over the plan's own CTEs (to read an intermediate step)."""
    ctes = ", ".join(cte.sql(dialect=DIALECT) for cte in plan.bounded.ctes)
    return f"WITH {ctes} {select}"


# -- data sets -------------------------------------------------------------------------------

D = dt.date
NAN = math.nan

# user_id, region, age, spend, day, item. Every unit stays within L0 = 2 groups under every
# grouping of CASES; C = 3 binds for unit 1 (five rows in east), in the joins and the self-join.
WITHIN = Data(
    visits=(
        (1, "east", 25, 10.5, D(2024, 1, 5), "a"),
        (1, "east", 25, 20.25, D(2024, 1, 9), "b"),
        (1, "east", 26, None, D(2024, 2, 1), "a"),
        (1, "east", 26, 100.0, D(2024, 2, 3), "c"),
        (1, "east", 26, 7.0, D(2024, 2, 3), "d"),
        (2, "west", 40, 30.0, D(2024, 3, 5), "a"),
        (2, "west", 41, 199.75, D(2024, 3, 6), "e"),
        (2, "east", 41, 0.0, D(2024, 4, 6), None),
        (3, "north", 61, 50.5, D(2024, 5, 1), "b"),  # north: two zones, the join fans out
        (3, "north", 61, 12.125, D(2024, 5, 2), "b"),
        (3, "north", 61, NAN, D(2024, 5, 3), "f"),
        (4, "south", 90, 150.0, D(2024, 6, 1), "a"),  # south: no zone
        (4, "south", 90, 149.5, D(2024, 6, 1), "g"),
        (5, None, 33, 60.0, D(2024, 7, 1), "a"),  # NULL region: outside every domain
        (5, "central", 18, 200.0, D(2024, 7, 2), "h"),
        (6, "west", 55, 80.0, D(2023, 12, 31), "a"),  # outside the declared date range
        (6, "west", 55, 81.0, D(2025, 1, 1), "b"),
        (6, "west", 55, 82.0, D(2024, 12, 15), "c"),
        (7, "central", None, 5.5, None, "i"),
    ),
    purchases=(
        (1, 5.0),
        (1, 7.5),
        (2, 10.0),
        (2, 20.0),
        (2, 30.0),
        (2, 40.0),
        (9, 99.0),  # a unit with no visits
        (1, 7.0),  # one of unit 1's spends: the set operations match it
        (1, None),  # and a NULL one (a set operation's NULL equals NULL)
        (4, 150.0),  # unit 4's spend too
        (6, 81.5),
    ),
    # user_id, segment: unit 2's root row twice (each of its baskets resolves twice); z outside
    # the domain; a row without a unit (no key reaches it).
    people=((1, "a"), (2, "b"), (2, "b"), (3, "c"), (4, "a"), (5, "z"), (None, "a")),
    # basket_id, user_id, channel: basket 13 listed for units 3 and 4; 14 of no person; 15 of
    # NULL; 18 without lines (the RIGHT JOIN keeps it).
    baskets=(
        (10, 1, "web"),
        (11, 1, "web"),
        (12, 2, "shop"),
        (13, 3, "web"),
        (13, 4, "shop"),
        (14, 9, "web"),
        (15, None, "shop"),
        (16, 5, "fax"),
        (17, 4, None),
        (18, 3, "shop"),
    ),
    # basket_id, product, price: unit 1 has four p1 lines (C = 3 binds); basket 13's lines are
    # units 3's and 4's; dangling and NULL baskets are dropped.
    lines=(
        (10, "p1", 5.0),
        (10, "p1", 7.5),
        (10, "p2", 12.0),
        (11, "p1", 49.5),
        (11, "p1", 3.0),
        (12, "p2", 20.0),
        (12, "p3", None),
        (13, "p3", 60.0),
        (13, "p1", NAN),
        (17, "p1", 1.0),
        (14, "p1", 9.0),
        (15, "p2", 9.0),
        (None, "p1", 2.0),
        (99, "p1", 2.0),
        (16, "p9", 4.0),
        (16, "p2", -3.0),
    ),
)

SPECIAL = [1e300, -1e300, math.inf, -math.inf, NAN, None, -5.0, 250.0, 0.1, 199.99999]
DAYS = [D(2023, 12, 31), *(D(2024, m, m) for m in range(1, 13)), D(2025, 1, 1)]
ITEMS = [f"i{k:02d}" for k in range(16)]
HEAVY = 1


def exceeding(seed: int = 20261205) -> Data:
    """Unit 1 exceeds every bound: every region (and keys outside the domain), every month, far
    more than C rows per group, values far outside the bounds; the others are random."""
    rng = random.Random(seed)  # test data only; no privacy noise is drawn here
    rows: list[tuple[Any, ...]] = []
    for region in [*REGIONS, "mars", None]:
        for i, day in enumerate(DAYS):
            x = SPECIAL[(i + len(rows)) % len(SPECIAL)] if i % 2 else rng.uniform(-50, 300)
            item = f"h{len(rows):03d}"  # values no other unit has: COUNT(DISTINCT) moves
            rows.append((HEAVY, region, rng.choice([None, 5, 17, 30, 45, 95, 200]), x, day, item))
    for unit in range(2, 40):
        for _ in range(rng.randint(1, 12 if unit > 2 else 30)):
            rows.append(
                (
                    unit,
                    rng.choice([*REGIONS, "mars", None]),
                    rng.choice([None, *range(10, 101, 9)]),
                    rng.choice([*SPECIAL, *(rng.uniform(-20, 230) for _ in range(10))]),
                    rng.choice([None, *DAYS]),
                    rng.choice([None, *ITEMS]),
                )
            )
    bought: list[tuple[int, float | None]] = [
        (HEAVY, x if x is not None else 1.0) for x in SPECIAL * 3
    ]
    for unit in [*range(2, 40, 2), 50]:
        bought += [(unit, rng.choice([*SPECIAL, rng.uniform(-10, 120)])) for _ in range(4)]
    return Data(tuple(rows), tuple(bought), *relational(seed))


def relational(seed: int) -> tuple[tuple[tuple[Any, ...], ...], ...]:
    """People, baskets and lines where unit 1 exceeds every bound: its root row listed under
    every segment (each of its rows resolves five times), baskets of every channel and lines
    of every product, far more than C, at values far outside the bounds. The other units'
    baskets share ids (a key listed for two units), and baskets and lines have dangling and
    NULL keys."""
    rng = random.Random(seed * 7 + 1)  # test data only; its own stream: visits stay the same
    people = [(HEAVY, s) for s in (*SEGMENTS, "zz", None)]
    people += [
        (u, rng.choice([*SEGMENTS, None]))
        for u in range(2, 40)
        for _ in range(rng.choice([1, 1, 2]))
    ]
    people.append((None, "a"))
    heavy = [(1000 + k, HEAVY, ch) for k, ch in enumerate([*CHANNELS, "fax", None] * 3)]
    baskets = heavy + [
        (rng.randint(0, 60), rng.choice([*range(2, 40), 77, None]),
         rng.choice([*CHANNELS, "fax", None]))
        for _ in range(90)
    ]  # fmt: skip
    lines = [
        (b, product, rng.choice([*SPECIAL, rng.uniform(-10, 80)]))
        for b, _, _ in heavy
        for product in [*PRODUCTS, "p9", None]
        for _ in range(4)
    ]
    lines += [
        (rng.choice([*range(0, 62), None]), rng.choice([*PRODUCTS, "p9", None]),
         rng.choice([*SPECIAL, rng.uniform(-10, 80)]))
        for _ in range(300)
    ]  # fmt: skip
    return tuple(people), tuple(baskets), tuple(lines)


# -- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def within(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    session = Session(write_world(tmp_path_factory.mktemp("within"), WITHIN))
    yield session
    session.close()


@dataclass
class Neighbours:
    """The exceeding data set, and engines over it with one unit removed (same salt)."""

    session: Session
    data: Data
    engines: dict[int, DuckDBEngine]


@pytest.fixture(scope="module")
def neighbours(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Neighbours]:
    data = exceeding()
    session = Session(write_world(tmp_path_factory.mktemp("exceeding"), data))
    engines = {
        unit: DuckDBEngine(
            write_world(tmp_path_factory.mktemp(f"without_{unit}"), data.without(unit)),
            session.engine.salt,  # the same salt: other units keep the same groups
        )
        for unit in (HEAVY, 2, 50)
    }
    yield Neighbours(session, data, engines)
    for engine in engines.values():
        engine.close()
    session.close()


def plan_of(session: Session, name: str) -> Plan:
    return session.plan(sql_of(name), None, **CASES[name].options)


# -- 1. golden text --------------------------------------------------------------------------


def test_every_golden_input_has_a_case() -> None:
    inputs = sorted(
        p.name[: -len(".sql")] for p in GOLDEN.glob("*.sql") if ".bounded." not in p.name
    )
    assert inputs == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_bounded_sql_matches_golden(name: str, within: Session) -> None:
    plan = plan_of(within, name)
    bounded = plan.bounded_sql + "\n"
    path = GOLDEN / f"{name}.bounded.sql"
    if UPDATE:
        path.write_text(bounded)
    assert path.exists(), f"missing {path.name}; run with DPSQL_UPDATE_GOLDEN=1"
    assert bounded == path.read_text()
    # The golden text is what the engine runs, and it never holds the salt itself.
    normal = sqlglot.parse_one(plan.engine_sql, read=DIALECT).sql(dialect=DIALECT)
    assert sqlglot.parse_one(path.read_text(), read=DIALECT).sql(dialect=DIALECT) == normal
    assert str(within.engine.salt) not in bounded


def _count_totals(plan: Plan) -> list[exp.Cast]:
    """The CASTs around a SUM in the bounded query (Spark sums them in BIGINT)."""
    tree = sqlglot.parse_one(plan.engine_sql, read=DIALECT)
    return [c for c in tree.find_all(exp.Cast) if type(c) is exp.Cast and c.this.key == "sum"]


@pytest.mark.parametrize("name", NAMES)
def test_totals_of_counts_are_bigint_over_one_table_only(name: str, within: Session) -> None:
    """A CAST around a SUM is the planner's total of a count column of ``_capped``, in BIGINT,
    and only over one table read directly, whose row count bounds it (``values._count_sum``):
    Spark's lowering relies on that (``spark_aggregates._count_total``)."""
    plan = plan_of(within, name)
    totals = _count_totals(plan)
    for cast in totals:
        assert cast.to.sql(DIALECT) == "BIGINT"
        column = cast.this.this
        assert isinstance(column, exp.Column) and re.fullmatch(r"_c\d*", column.name)
    counted = any(m.kind in ("rows", "count") for m in plan.bounding.measurements)
    assert bool(totals) == (plan.analysis.base and counted), name


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT COUNT(*) FROM (SELECT user_id, CAST(SUM(age) AS BIGINT) AS s FROM visits "
        "GROUP BY user_id) AS p WHERE s > 100",
        "SELECT CAST(SUM(age) AS BIGINT) AS s, CAST(COUNT(*) AS BIGINT) AS n FROM visits",
    ],
)
def test_an_analysts_cast_of_a_sum_is_not_a_total_of_counts(sql: str, within: Session) -> None:
    try:
        plan = within.plan(sql, None)
    except QueryError:
        return  # refused: nothing reaches an engine
    for cast in _count_totals(plan):
        column = cast.this.this
        assert isinstance(column, exp.Column) and re.fullmatch(r"_c\d*", column.name)


# -- 2. plan figures and pre-noise totals against the Python reference ----------------------


@pytest.mark.parametrize("name", NAMES)
def test_plan_bounds_and_grids(name: str, within: Session) -> None:
    """Kinds, grids (interval arithmetic for derived columns) and per-group bounds, by hand."""
    case = CASES[name]
    plan = plan_of(within, name)
    l0, c = case.bounds
    assert (plan.max_groups, plan.max_rows) == (l0, c)
    r = case.options.get("max_rows_per_unit")
    assert [m.spec.kind for m in plan.measurements] == [ref.kind for ref in per_measurement(case)]
    for m, ref in zip(plan.measurements, per_measurement(case), strict=True):
        assert m.groups == l0
        assert m.unit == ref.unit(), m.label
        per_group = 1 if ref.kind == "units" else c * ref.per_row()
        assert m.per_group == per_group, m.label
        if r is None or ref.kind == "units":
            assert m.row_bound is None
            assert m.sensitivity == l0 * per_group
        else:
            assert isinstance(r, int)
            assert m.row_bound == r * ref.per_row()
            assert m.sensitivity == min(l0 * per_group, r * ref.per_row())
        if ref.kind == "quantile":
            assert m.spec.p == ref.p
            assert m.grid is not None and ref.grid is not None
            assert (m.grid.step, m.grid.lower, m.grid.upper) == (
                ref.grid.step,
                ref.grid.lower,
                ref.grid.upper,
            )


@pytest.mark.parametrize(
    ("name", "column", "bounds"),
    [
        ("cte_row_level", "s2", (0, 400)),  # spend * 2, spend in [0, 200]
        ("subquery_derived", "s2", (0, 400)),
        ("cte_per_unit", "a", (0, 200)),  # AVG(spend) per unit stays within spend's bounds
        ("cte_per_unit", "n", None),  # COUNT(*) per unit has no upper bound: clamp it
    ],
)
def test_derived_column_bounds_come_from_interval_arithmetic(
    name: str, column: str, bounds: tuple[int, int] | None, within: Session
) -> None:
    analysis = plan_of(within, name).analysis
    assert analysis.bounds.get(column) == (None if bounds is None else tuple(map(Fraction, bounds)))


@pytest.mark.parametrize("name", [n for n in NAMES if n not in HASH_DEPENDENT])
def test_bounded_totals_match_python_reference(name: str, within: Session) -> None:
    case = CASES[name]
    plan = plan_of(within, name)
    got = run_plan(within.engine, plan)
    assert got == reference(case, WITHIN, *case.bounds)


def test_reference_sees_the_fan_out_and_the_caps() -> None:
    """The reference data do exercise what the golden queries are about (a test of the test)."""
    assert len(self_join(WITHIN)) == sum(
        n * n for n in Counter(r[0] for r in WITHIN.visits).values()
    )
    north = [r for r in inner_zone(WITHIN) if r["region"] == "north"]
    assert len(north) == 2 * sum(1 for r in WITHIN.visits if r[1] == "north")
    assert len(semi_zone(WITHIN)) < len(inner_zone(WITHIN)) < len(left_zone(WITHIN))
    # NaN passes spend >= threshold in DuckDB: the NaN row is in both tiers.
    assert sum(1 for r in cross_tiers(WITHIN) if r["spend"] != r["spend"]) == 2
    east = reference(CASES["self_join_grouped"], WITHIN, L0, 1000)[("east",)]
    assert east[0] > reference(CASES["self_join_grouped"], WITHIN, L0, C)[("east",)][0]


# -- 3. neighbour invariants on data that exceed every bound --------------------------------


def score_table(histogram: Mapping[int, int], lower: int, upper: int, p: Fraction) -> list[int]:
    """The quantile score of every candidate c, lower..upper (DESIGN.md: the exponential
    mechanism's utility), written out directly: max(b·#{x<c} - a·n, a·n - b·#{x<=c}, 0)."""
    a, b = p.numerator, p.denominator
    n = sum(histogram.values())
    below = 0
    scores = []
    for c in range(lower, upper + 1):
        at = histogram.get(c, 0)
        scores.append(max(b * below - a * n, a * n - b * (below + at), 0))
        below += at
    return scores


def movement(m: Measurement, a: Any, b: Any) -> int:
    """How far one measurement of one group moved between two neighbouring data sets."""
    if m.spec.kind != "quantile":
        return abs(int(a) - int(b))
    assert m.grid is not None and m.spec.p is not None
    g = m.grid
    for h in (a, b):
        assert all(g.lower <= k <= g.upper and n > 0 for k, n in h.items())
    # The histograms differ by at most C' values of the removed unit ...
    values_moved = sum(abs(a.get(k, 0) - b.get(k, 0)) for k in set(a) | set(b))
    assert values_moved <= m.per_group // max(
        m.spec.p.numerator, m.spec.p.denominator - m.spec.p.numerator
    )
    # ... and so every score moves by at most the per-group bound.
    sa = score_table(a, g.lower, g.upper, m.spec.p)
    sb = score_table(b, g.lower, g.upper, m.spec.p)
    assert sa == [int(s) for s in quantile_scores(a, g.lower, g.upper, m.spec.p)]
    return max(abs(x - y) for x, y in zip(sa, sb, strict=True))


def check_neighbours(
    plan: Plan, full: dict[Key, list[Any]], less: dict[Key, list[Any]]
) -> list[int]:
    """Per measurement, the total movement across groups; asserts every bound on the way."""
    keys = set(full) | set(less)
    touched: set[Key] = set()
    totals = []
    for j, m in enumerate(plan.measurements):
        zero: Any = {} if m.spec.kind == "quantile" else 0
        total = 0
        for key in keys:
            move = movement(
                m, full[key][j] if key in full else zero, less[key][j] if key in less else zero
            )
            assert move <= m.per_group, (m.label, key, move, m.per_group)
            if move:
                touched.add(key)
            total += move
        assert total <= m.sensitivity, (m.label, total, m.sensitivity)
        if m.row_bound is not None:
            assert total <= m.row_bound, (m.label, total, m.row_bound)
        totals.append(total)
    assert len(touched) <= plan.max_groups
    return totals


@pytest.mark.parametrize("name", NAMES)
def test_removing_a_unit_moves_totals_within_the_bounds(name: str, neighbours: Neighbours) -> None:
    case = CASES[name]
    plan = plan_of(neighbours.session, name)
    full = run_plan(neighbours.session.engine, plan)
    heavy_rows = [r for r in case.relation(neighbours.data) if r["_u"] == HEAVY]
    per_group = Counter(
        k for k in map(case.key, heavy_rows) if case.domain is None or k in case.domain
    )
    l0, c = case.bounds
    if case.exceeds:
        # The heavy unit does exceed the bounds here: more groups than L0, more rows than C.
        assert len(per_group) >= min(l0 + 1, len(case.domain or [()]))
        assert min(per_group.values()) > c
    moved = {}
    for unit, engine in neighbours.engines.items():
        less = run_plan(engine, plan)
        moved[unit] = check_neighbours(plan, full, less)
    kinds = [m.spec.kind for m in plan.measurements]
    if case.exceeds and "rows" in kinds:
        # Tight: with every group over C, the heavy unit moves the row count by exactly
        # min(L0·C, R) (it keeps L0 groups of C rows, or R rows).
        r = case.options.get("max_rows_per_unit")
        assert isinstance(r, int | None)
        expected = l0 * c if r is None else min(l0 * c, r)
        assert moved[HEAVY][kinds.index("rows")] == expected
    for j in case.tight:
        assert moved[HEAVY][j] == plan.measurements[j].sensitivity, plan.measurements[j].label


def test_self_join_fan_out_is_capped(neighbours: Neighbours) -> None:
    """A unit with n rows has n² rows after the self-join; bounded, it adds at most L0·C."""
    n = sum(1 for r in neighbours.data.visits if r[0] == HEAVY)
    assert sum(1 for r in self_join(neighbours.data) if r["_u"] == HEAVY) == n * n
    plan = plan_of(neighbours.session, "self_join_count")
    full = run_plan(neighbours.session.engine, plan)[()][0]
    less = run_plan(neighbours.engines[HEAVY], plan)[()][0]
    assert full - less == plan.max_groups * plan.max_rows == 10
    assert plan.measurements[0].sensitivity == 10


# -- the total row cap R ---------------------------------------------------------------------


def rows_per_unit(session: Session, plan: Plan) -> dict[int, int]:
    _, rows = session.engine.run(with_ctes(plan, "SELECT _u, COUNT(*) FROM _rows GROUP BY _u"))
    return {int(u): int(n) for u, n in rows}


@pytest.mark.parametrize("data_set", ["within", "exceeding"])
def test_row_cap_keeps_r_rows_per_unit(
    data_set: str, within: Session, neighbours: Neighbours
) -> None:
    """After the cap a unit with <= R rows keeps all of them, one with more exactly R."""
    session, data = (
        (within, WITHIN) if data_set == "within" else (neighbours.session, neighbours.data)
    )
    case = CASES["row_cap"]
    plan = plan_of(session, "row_cap")
    r = case.options["max_rows_per_unit"]
    assert isinstance(r, int)
    # Rows outside the public domain are dropped before the cap, so they use none of R.
    eligible = Counter(row["_u"] for row in case.relation(data) if case.key(row) in REGION_DOMAIN)
    assert max(eligible.values()) > r
    assert rows_per_unit(session, plan) == {u: min(n, r) for u, n in eligible.items()}
    # Without the cap, every eligible row is there.
    uncapped = session.plan(sql_of("row_cap"))
    assert rows_per_unit(session, uncapped) == dict(eligible)


def test_row_cap_totals_within_reference(within: Session) -> None:
    """What does not depend on which rows the hash keeps: with C' = L0' = R, every kept row is
    counted, so the count sums to Σ min(n, R); units with <= R rows count exactly."""
    case = CASES["row_cap"]
    plan = plan_of(within, "row_cap")
    r = case.options["max_rows_per_unit"]
    assert isinstance(r, int) and plan.max_rows == plan.max_groups == r
    got = run_plan(within.engine, plan)
    rows = [row for row in case.relation(WITHIN) if case.key(row) in REGION_DOMAIN]
    n = Counter(row["_u"] for row in rows)
    assert sum(v[0] for v in got.values()) == sum(min(k, r) for k in n.values())
    small = replace(case, relation=lambda d: [row for row in rows if n[row["_u"]] <= r])
    exact = reference(small, WITHIN, L0, C)
    for key, (count, total) in got.items():
        low_count, low_total = exact[key]
        # Each unit over the cap keeps at most min(its rows in the group, R) rows there.
        in_group = Counter(row["_u"] for row in rows if n[row["_u"]] > r and case.key(row) == key)
        extra = sum(min(k, r) for k in in_group.values())
        assert low_count <= count <= low_count + extra
        # Spend is non-negative: the over-cap units can only add to a group's sum.
        assert low_total <= total <= low_total + extra * SPEND.upper


def test_row_cap_from_the_policy_matches_the_option(tmp_path: Path) -> None:
    session = Session(write_world(tmp_path, WITHIN, max_rows_per_unit=2))
    try:
        from_policy = session.plan(sql_of("row_cap"))
        from_option = session.plan(sql_of("row_cap"), max_rows_per_unit=2)
    finally:
        session.close()
    assert from_policy.bounded_sql == from_option.bounded_sql
    assert (GOLDEN / "row_cap.bounded.sql").read_text() == from_policy.bounded_sql + "\n"
    assert [m.sensitivity for m in from_policy.measurements] == [
        m.sensitivity for m in from_option.measurements
    ]


# -- refusals --------------------------------------------------------------------------------

REFUSED = {
    "right_join": "SELECT COUNT(*) FROM visits RIGHT JOIN zones ON visits.region = zones.region",
    "full_join": "SELECT COUNT(*) FROM visits FULL JOIN zones ON visits.region = zones.region",
    "private_on_the_outer_side": (
        "SELECT COUNT(*) FROM zones LEFT JOIN visits ON visits.region = zones.region"
    ),
    "self_join_off_the_unit": (
        "SELECT COUNT(*) FROM visits a JOIN visits b ON a.region = b.region"
    ),
    "private_join_unit_to_other_column": (
        "SELECT COUNT(*) FROM visits JOIN purchases ON visits.age = purchases.user_id"
    ),
    "private_join_unit_or_other": (
        "SELECT COUNT(*) FROM visits a JOIN visits b "
        "ON a.user_id = b.user_id OR a.region = b.region"
    ),
    "private_cross_join": "SELECT COUNT(*) FROM visits CROSS JOIN purchases",
    "different_unit_domains": (
        "SELECT COUNT(*) FROM visits JOIN devices ON visits.user_id = devices.user_id"
    ),
    "subquery_limit": "SELECT COUNT(*) FROM (SELECT user_id, spend FROM visits LIMIT 10) AS q",
    "cte_limit": "WITH t AS (SELECT user_id FROM visits LIMIT 5) SELECT COUNT(*) FROM t",
    "per_unit_not_grouped_by_unit": (
        "WITH t AS (SELECT region, COUNT(*) AS n FROM visits GROUP BY region) "
        "SELECT SUM(LEAST(n, 5)) FROM t"
    ),
    "path_join_off_the_key": (
        "SELECT COUNT(*) FROM lines l JOIN baskets b ON l.price = b.basket_id"
    ),
    "path_join_on_a_key_not_declared": (
        "SELECT COUNT(*) FROM baskets b JOIN lines l ON b.user_id = l.basket_id"
    ),
    "path_join_across_unit_domains": (
        "SELECT COUNT(*) FROM lines l JOIN devices d ON l.basket_id = d.user_id"
    ),
    "path_table_right_join_public": (
        "SELECT COUNT(*) FROM lines l RIGHT JOIN zones z ON l.product = z.zone"
    ),
    "full_join_off_the_unit": (
        "SELECT COUNT(*) FROM visits v FULL JOIN purchases p ON v.spend = p.amount"
    ),
    "full_join_in_a_chain": (
        "SELECT COUNT(*) FROM visits v FULL JOIN purchases p ON v.user_id = p.user_id "
        "JOIN zones z ON v.region = z.region"
    ),
    "union_without_the_unit": (
        "SELECT COUNT(*) FROM (SELECT spend FROM visits UNION SELECT amount FROM purchases) AS t"
    ),
    "intersect_unit_at_other_positions": (
        "SELECT COUNT(*) FROM (SELECT user_id, spend FROM visits "
        "INTERSECT SELECT amount, user_id FROM purchases) AS t"
    ),
    "except_across_unit_domains": (
        "SELECT COUNT(*) FROM (SELECT user_id FROM visits EXCEPT SELECT user_id FROM devices) AS t"
    ),
    "union_all_with_a_public_branch": (
        "SELECT COUNT(*) FROM (SELECT region FROM visits UNION ALL SELECT region FROM zones) AS t"
    ),
    "set_operation_outside_a_subquery": (
        "SELECT COUNT(*) FROM visits UNION ALL SELECT COUNT(*) FROM purchases"
    ),
    "quantile_above_one": "SELECT QUANTILE_CONT(spend, 1.5) FROM visits",
    "quantile_below_zero": "SELECT QUANTILE_CONT(spend, -0.1) FROM visits",
    "percentile_above_one": (
        "SELECT PERCENTILE_CONT(1.2) WITHIN GROUP (ORDER BY spend) FROM visits"
    ),
}


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[Session]:
    session = Session(write_world(tmp_path, WITHIN))
    yield session
    session.close()


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_without_charge(name: str, fresh: Session) -> None:
    before = fresh.budget()
    with pytest.raises(UnsupportedQueryError):
        fresh.execute(REFUSED[name])
    with pytest.raises(UnsupportedQueryError):
        fresh.plan(REFUSED[name])
    after = fresh.budget()
    assert (after.epsilon_spent, after.delta_spent, after.queries) == (
        before.epsilon_spent,
        before.delta_spent,
        before.queries,
    )


def test_an_accepted_query_is_charged(fresh: Session) -> None:
    """The check above can fail: the same session does charge a query it answers."""
    fresh.execute(sql_of("join_public_inner"))
    assert fresh.budget().epsilon_spent == 1


def test_a_using_column_can_be_named_unqualified(fresh: Session) -> None:
    """USING (region) makes region one column, as in SQL: the same totals as the ON form."""
    plan = fresh.plan(
        "SELECT region, COUNT(*), COUNT(zone) FROM visits LEFT JOIN zones USING (region) "
        "GROUP BY region"
    )
    assert run_plan(fresh.engine, plan) == reference(CASES["join_public_left"], WITHIN, L0, C)


def test_rows_without_a_unit_touch_at_most_l0_groups(tmp_path: Path) -> None:
    """Rows with a NULL unit are one unit to the C cap, the R cap (PARTITION BY _u) and
    COUNT(DISTINCT unit); they must then also be one unit to the L0 cap (or be dropped)."""
    nulls = tuple((None, r, 30, 10.0, D(2024, 1, 1), "a") for r in REGIONS for _ in range(C))
    data = Data((*nulls, (1, "east", 30, 10.0, D(2024, 1, 1), "a")), ())
    session = Session(write_world(tmp_path / "full", data))
    less = DuckDBEngine(write_world(tmp_path / "less", data.without(None)), session.engine.salt)
    try:
        plan = session.plan("SELECT region, COUNT(*) FROM visits GROUP BY region")
        check_neighbours(plan, run_plan(session.engine, plan), run_plan(less, plan))
    finally:
        less.close()
        session.close()


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT COUNT(*) FROM visits JOIN tiers ON visits.region = tiers.threshold",
        "SELECT COUNT(*) FROM visits a JOIN visits b ON a.user_id = b.user_id AND a.region = b.age",
    ],
)
def test_a_join_condition_cannot_fail_on_the_data(sql: str, fresh: Session) -> None:
    """Whether a query fails must not depend on the data (DESIGN.md section 5): a join on
    columns of different types is refused before the charge, or evaluated totally. (On data whose
    regions all read as numbers, both queries run.)"""
    try:
        plan = fresh.plan(sql)
    except QueryError:
        assert fresh.budget().epsilon_spent == 0
        return
    fresh.engine.run(plan.engine_sql)  # 'east' cast to DOUBLE / INTEGER: ConversionException
