"""Golden rewrite tests: input SQL -> bounded SQL, both executed on DuckDB.

For every ``tests/bound/golden/NAME.sql`` the bounded SQL of its plan (fixed salt) must equal
``tests/bound/golden/NAME.bounded.sql`` exactly; ``DPSQL_UPDATE_GOLDEN=1`` rewrites those files. The
bounded SQL is then run on a small hand-made data set and its pre-noise measurement totals are
compared with

- the bounding semantics of DESIGN.md section 3 re-implemented in plain Python here (round to
  the grid, clamp, per-unit groups, cap rows at C, scale sums), and
- the raw input query run directly on the same rows: the data lies within every bound (few rows
  per unit, at most L0 groups per unit, values inside their bounds and on the grid), so no bound
  binds and COUNT and SUM must match exactly, AVG up to the grid rounding.

A second data set exceeds every bound (units with many rows and many groups, values far outside
the bounds, NaN, infinities, NULLs); there the bounded intermediate CTEs are queried and checked
against the invariants that the sensitivities rest on.
"""

from __future__ import annotations

import math
import os
import random
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import duckdb
import pytest
import sqlglot
from sqlglot import exp

from dpsql.analyze.analyze import analyze
from dpsql.plan.planner import plan_query
from dpsql.plan.plans import Plan, QueryOptions
from dpsql.policy import Policy
from dpsql.sql.params import bind_parameters
from dpsql.sql.parse import DIALECT, Query, parse_statement
from dpsql.sql.validate import validate

GOLDEN = Path(__file__).parent / "golden"
TINY_REGIONS = ("central", "east", "north", "south", "west")  # the conftest policy's domain
TinyPolicy = Callable[..., Policy]
UPDATE = os.environ.get("DPSQL_UPDATE_GOLDEN") == "1"
SALT = 7
L0 = 2
C = 10

Row = Mapping[str, Any]
ValueFn = Callable[[Row], float | None]

# -- Python mirror of row-level SQL --------------------------------------------------------------


def clamp_col(x: float | None, lo: float, hi: float) -> float | None:
    """A bounded column as the rewrite sees it: NULL and NaN stay NULL, others are clamped."""
    if x is None or math.isnan(x):
        return None
    return min(max(x, lo), hi)


def spend(r: Row) -> float | None:
    return clamp_col(r["spend"], 0, 200)


def age(r: Row) -> float | None:
    return clamp_col(r["age"], 18, 90)


def bucket(r: Row) -> str:
    a = r["age"]
    if a is not None and a < 30:
        return "young"
    if a is not None and a < 60:
        return "middle"
    return "old"


def round_half_away(x: float) -> int:
    """DuckDB's ROUND on DOUBLE: halves away from zero."""
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


@dataclass(frozen=True)
class HandGrid:
    """The grid of DESIGN.md section 3, computed by hand: g = 2^(floor(log2(hi-lo)) - 20)."""

    lo: Fraction
    hi: Fraction
    integral: bool

    @property
    def step(self) -> Fraction:
        k = math.floor(math.log2(self.hi - self.lo))
        while Fraction(2) ** k > self.hi - self.lo:  # float log2 guard
            k -= 1
        while Fraction(2) ** (k + 1) <= self.hi - self.lo:
            k += 1
        g = Fraction(2) ** (k - 20)
        return max(g, Fraction(1)) if self.integral else g

    @property
    def lower(self) -> int:
        return math.floor(self.lo / self.step)

    @property
    def upper(self) -> int:
        return math.ceil(self.hi / self.step)

    def units(self, x: float) -> int:
        scaled = float(Fraction(x) / self.step)
        return min(max(round_half_away(scaled), self.lower), self.upper)


SPEND = HandGrid(Fraction(0), Fraction(200), False)
AGE = HandGrid(Fraction(18), Fraction(90), True)


@dataclass(frozen=True)
class Agg:
    kind: str  # count_rows | count | count_units | sum | avg
    value: ValueFn | None = None
    grid: HandGrid | None = None


@dataclass(frozen=True)
class Mirror:
    """Plain-Python meaning of a golden query: filter, key, aggregates in SELECT order."""

    aggs: tuple[Agg, ...]
    where: Callable[[Row], bool] = lambda r: True
    key: Callable[[Row], tuple[Any, ...]] = lambda r: ()
    domain: Sequence[tuple[Any, ...]] | None = None  # public keys: every key is released
    raw_only: frozenset[int] = field(default_factory=frozenset)


REGION_DOMAIN = [(r,) for r in TINY_REGIONS]
BUCKETS = [("young",), ("middle",), ("old",)]


def _where(r: Row) -> bool:
    # WHERE sees the raw columns (only aggregate arguments are clamped).
    return (
        r["spend"] is not None
        and r["age"] is not None
        and (r["spend"] * 2 > 20 and r["age"] + 1 >= 30)
    )


def _older_spend(r: Row) -> float | None:
    a = age(r)
    return spend(r) if a is not None and a > 30 else 0.0


def _explicit_clamp(r: Row) -> float:
    # DuckDB's LEAST/GREATEST skip NULLs, so the query's own clamp maps NULL to 0.
    s = spend(r)
    return 0.0 if s is None else min(max(s, 0.0), 50.0)


def _doubled(r: Row) -> float | None:
    s = spend(r)
    return None if s is None else 2 * s


MIRRORS: dict[str, Mirror] = {
    "count_rows": Mirror((Agg("count_rows"),)),
    "count_column_nulls": Mirror((Agg("count", spend),)),
    "count_distinct_units": Mirror((Agg("count_units"),)),
    "sum": Mirror((Agg("sum", spend, SPEND),)),
    "avg": Mirror((Agg("avg", spend, SPEND),)),
    "avg_integer": Mirror(
        (Agg("avg", age, AGE),), key=lambda r: (r["region"],), domain=REGION_DOMAIN
    ),
    "case_bucket": Mirror(
        (Agg("count_rows"), Agg("sum", spend, SPEND)),
        key=lambda r: (bucket(r),),
        domain=BUCKETS,
    ),
    "where_expressions": Mirror((Agg("count_rows"), Agg("sum", spend, SPEND)), where=_where),
    "several": Mirror(
        (
            Agg("count_rows"),
            Agg("count", spend, SPEND),
            Agg("sum", spend, SPEND),
            Agg("avg", spend, SPEND),
            Agg("count_units"),
        ),
        key=lambda r: (r["region"],),
        domain=REGION_DOMAIN,
    ),
    "count_by_region": Mirror(
        (Agg("count_rows"), Agg("count", age), Agg("count_units")),
        key=lambda r: (r["region"],),
        domain=REGION_DOMAIN,
    ),
    "group_public": Mirror(
        (Agg("sum", spend, SPEND),), key=lambda r: (r["region"],), domain=REGION_DOMAIN
    ),
    "group_private": Mirror(
        (Agg("count_rows"), Agg("sum", spend, SPEND)), key=lambda r: (r["age"],)
    ),
    "sum_times_two": Mirror((Agg("sum", _doubled, HandGrid(Fraction(0), Fraction(400), False)),)),
    "sum_case": Mirror((Agg("sum", _older_spend, SPEND),)),
    "explicit_clamp": Mirror(
        (Agg("sum", _explicit_clamp, HandGrid(Fraction(0), Fraction(50), False)),),
        key=lambda r: (r["region"],),
        domain=REGION_DOMAIN,
    ),
}

# user_id, region, age, spend. Within every bound: <= 2 groups per unit under every grouping
# above, <= 10 rows per unit, values inside their bounds and on the spend grid (dyadic).
WITHIN: list[tuple[Any, ...]] = [
    (1, "east", 25, 10.5),
    (1, "east", 25, 20.25),
    (1, "east", 25, None),
    (1, "west", 45, 100.0),
    (2, "east", 35, 0.0),
    (2, "east", 35, 199.75),
    (3, "north", 61, 50.5),
    (3, "north", 61, 12.125),
    (3, "north", 61, 3.0),
    (3, "south", 22, None),
    (4, "central", None, 7.5),
    (4, "central", 70, 8.0),
    (5, "west", 18, 200.0),
    (5, "west", 18, 0.5),
    (6, "south", 90, 150.0),
    (6, "south", 90, 149.5),
    (6, "south", 90, None),
    (7, "east", 29, 30.0),
    (7, "north", 30, 31.0),
    (8, "central", 55, 0.0),
]
COLUMNS = ("user_id", "region", "age", "spend")


def as_rows(data: Sequence[tuple[Any, ...]]) -> list[dict[str, Any]]:
    return [dict(zip(COLUMNS, r, strict=True)) for r in data]


# -- planning and running --------------------------------------------------------------------


def make_plan(policy: Policy, sql: str) -> Plan:
    statement = parse_statement(sql)
    assert isinstance(statement, Query)
    select = bind_parameters(statement.select, None)
    validate(select)
    con = duckdb.connect(":memory:")
    try:
        catalog = _catalog(con, policy)
    finally:
        con.close()
    analysis = analyze(select, policy, catalog)
    spec = policy.tables[analysis.table]
    options = QueryOptions(
        epsilon=policy.budget.query_epsilon,
        delta=policy.budget.query_delta,
        max_groups_per_unit=spec.max_groups_per_unit,
        max_rows_per_unit_per_group=spec.max_rows_per_unit_per_group,
    )
    return plan_query(analysis, options, policy)


def _catalog(con: duckdb.DuckDBPyConnection, policy: Policy) -> dict[str, dict[str, str]]:
    _view(con, policy)
    rows = con.execute("SELECT column_name, data_type FROM information_schema.columns").fetchall()
    return {"visits": {str(c).lower(): str(t) for c, t in rows}}


def _view(con: duckdb.DuckDBPyConnection, policy: Policy) -> None:
    path = policy.resolve(policy.data.tables["visits"])
    con.execute(f"CREATE OR REPLACE VIEW visits AS SELECT * FROM read_parquet('{path}')")


def run(policy: Policy, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    con = duckdb.connect(":memory:")
    try:
        _view(con, policy)
        # The engine binds the secret salt as $salt; the tests bind a fixed one.
        cursor = con.execute(sql, {"salt": SALT} if "$salt" in sql else None)
        names = [d[0] for d in cursor.description]
        return names, cursor.fetchall()
    finally:
        con.close()


def measured(plan: Plan, policy: Policy) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Bounded totals per key: {key: {"_m0": ..., ...}}."""
    names, rows = run(policy, plan.bounded_sql)
    nkeys = len(plan.analysis.keys)
    assert names[:nkeys] == [f"_k{i}" for i in range(nkeys)]
    return {tuple(r[:nkeys]): dict(zip(names[nkeys:], r[nkeys:], strict=True)) for r in rows}


# -- the Python reference of DESIGN.md section 3 -----------------------------------------------


def reference(
    rows: Sequence[Row], mirror: Mirror, max_rows: int = C
) -> dict[tuple[Any, ...], list[Any]]:
    """Per key, per aggregate: count | sum in grid units | (centred in g/2 units, count)."""
    groups: dict[tuple[Any, tuple[Any, ...]], list[Row]] = defaultdict(list)
    for r in rows:
        if not mirror.where(r):
            continue
        key = mirror.key(r)
        if mirror.domain is not None and key not in mirror.domain:
            continue
        groups[(r["user_id"], key)].append(r)
    per_unit_groups: dict[Any, set[tuple[Any, ...]]] = defaultdict(set)
    for unit, key in groups:
        per_unit_groups[unit].add(key)
    # No L0 cut needed: the data set keeps every unit within L0 groups.
    assert all(len(keys) <= L0 for keys in per_unit_groups.values())
    totals: dict[tuple[Any, ...], list[Any]] = {}
    for (_unit, key), rs in groups.items():
        out = totals.setdefault(key, [_zero(a) for a in mirror.aggs])
        for j, agg in enumerate(mirror.aggs):
            if agg.kind == "count_rows":
                out[j] += min(len(rs), max_rows)
            elif agg.kind == "count_units":
                out[j] += 1
            else:
                assert agg.value is not None
                xs = [x for x in (agg.value(r) for r in rs) if x is not None]
                c = min(len(xs), max_rows)
                if agg.kind == "count":
                    out[j] += c
                    continue
                assert agg.grid is not None
                g = agg.grid
                s = sum(g.units(x) for x in xs)
                if len(xs) <= max_rows:
                    t = s
                else:
                    t = round_half_away(float(s) * max_rows / len(xs))
                    t = min(max(t, max_rows * g.lower), max_rows * g.upper)
                if agg.kind == "sum":
                    out[j] += t
                else:
                    centred, count = out[j]
                    out[j] = (centred + 2 * t - c * (g.lower + g.upper), count + c)
    if mirror.domain is not None:
        for key in mirror.domain:
            totals.setdefault(key, [_zero(a) for a in mirror.aggs])
    return totals


def _zero(agg: Agg) -> Any:
    return (0, 0) if agg.kind == "avg" else 0


def plan_totals(plan: Plan, row: Mapping[str, Any]) -> list[Any]:
    """The bounded totals of one key, per aggregate, in the shape of ``reference``."""
    out: list[Any] = []
    for est in plan.estimates:
        # A group whose values are all NULL has a NULL SUM; release reads it as 0, and so do we.
        cols = [row[f"_m{j}"] or 0 for j in est.measurements]
        out.append((cols[0], cols[1]) if est.kind == "avg" else cols[0])
    return out


def value_of(plan: Plan, index: int, total: Any) -> Fraction | int | None:
    """An aggregate's pre-noise value in value units, from its bounded totals."""
    est = plan.estimates[index]
    if est.kind in ("count_rows", "count", "count_units"):
        return int(total)
    assert est.grid is not None
    g = est.grid.step
    if est.kind == "sum":
        return int(total) * g
    centred, count = total
    if count == 0:
        return None
    return (est.grid.lower + est.grid.upper) * g / 2 + int(centred) * (g / 2) / int(count)


# -- golden files ----------------------------------------------------------------------------

NAMES = sorted(p.name[: -len(".sql")] for p in GOLDEN.glob("*.sql") if ".bounded." not in p.name)


def test_every_golden_input_has_a_mirror() -> None:
    assert sorted(MIRRORS) == NAMES


@pytest.fixture
def within(tiny_policy: TinyPolicy) -> Policy:
    return tiny_policy(WITHIN, max_groups=L0, max_rows=C)


@pytest.mark.parametrize("name", NAMES)
def test_bounded_sql_matches_golden(name: str, within: Policy) -> None:
    sql = (GOLDEN / f"{name}.sql").read_text()
    bounded = make_plan(within, sql).bounded_sql + "\n"
    path = GOLDEN / f"{name}.bounded.sql"
    if UPDATE:
        path.write_text(bounded)
    assert path.exists(), f"missing {path.name}; run with DPSQL_UPDATE_GOLDEN=1"
    assert bounded == path.read_text()
    # The golden text itself is what the engine runs: it must parse back to the same plan SQL.
    reparsed = sqlglot.parse_one(path.read_text(), read=DIALECT)
    assert reparsed.sql(dialect=DIALECT) == make_plan(within, sql).bounded.sql(dialect=DIALECT)


@pytest.mark.parametrize("name", NAMES)
def test_bounded_totals_match_python_reference(name: str, within: Policy) -> None:
    sql = (GOLDEN / f"{name}.sql").read_text()
    mirror = MIRRORS[name]
    plan = make_plan(within, sql)
    _check_grids(plan, mirror)
    got = {k: plan_totals(plan, row) for k, row in measured(plan, within).items()}
    expected = reference(as_rows(WITHIN), mirror)
    assert got == expected


def _check_grids(plan: Plan, mirror: Mirror) -> None:
    assert len(plan.estimates) == len(mirror.aggs)
    for est, agg in zip(plan.estimates, mirror.aggs, strict=True):
        assert est.kind == agg.kind
        if agg.kind == "count":
            continue  # the grid of a counted value only decides NaN; no estimate carries it
        if agg.grid is None:
            assert est.grid is None
        else:
            assert est.grid is not None
            assert (est.grid.step, est.grid.lower, est.grid.upper) == (
                agg.grid.step,
                agg.grid.lower,
                agg.grid.upper,
            )


@pytest.mark.parametrize("name", NAMES)
def test_bounded_totals_equal_raw_aggregates_when_no_bound_binds(name: str, within: Policy) -> None:
    sql = (GOLDEN / f"{name}.sql").read_text()
    plan = make_plan(within, sql)
    bounded = measured(plan, within)
    names, raw_rows = run(within, sql)
    outputs = plan.analysis.outputs
    assert len(names) == len(outputs)
    key_pos = {int(o.expr.name[2:]): i for i, o in enumerate(outputs) if o.expr.name[:2] == "_k"}
    agg_pos = {i: int(o.expr.name[2:]) for i, o in enumerate(outputs) if o.expr.name[:2] == "_a"}
    assert len(key_pos) == len(plan.analysis.keys)
    raw_keys = set()
    for raw in raw_rows:
        key = tuple(raw[key_pos[j]] for j in range(len(key_pos)))
        raw_keys.add(key)
        totals = plan_totals(plan, bounded[key])
        for pos, a in agg_pos.items():
            est = plan.estimates[a]
            got = value_of(plan, a, totals[a])
            want = raw[pos]
            if est.kind == "avg":
                assert est.grid is not None
                if want is None:
                    assert got is None, (key, names[pos])
                else:
                    assert got is not None, (key, names[pos])
                    assert abs(Fraction(got) - Fraction(want)) <= est.grid.step / 2, (
                        key,
                        names[pos],
                        float(got),
                        want,
                    )
            else:
                assert got == Fraction(want if want is not None else 0), (key, names[pos])
    # Keys of the public domain with no rows are released with all-zero totals.
    for key, row in bounded.items():
        if key not in raw_keys:
            assert all(v == 0 for v in row.values()), key


def test_null_values_are_not_counted_or_summed_as_the_lower_bound(tiny_policy: TinyPolicy) -> None:
    """Minimal repro: a NULL value must stay NULL through the clamp and the grid.

    DuckDB's LEAST/GREATEST skip NULL arguments (GREATEST(NULL, 18) = 18), so a clamp written
    as LEAST(GREATEST(x, lo), hi) turns NULL into ``lo``.
    """
    policy = tiny_policy([(1, "east", None, None), (2, "east", 40, 10.0)])
    plan = make_plan(policy, "SELECT COUNT(age), SUM(age), AVG(spend) FROM visits")
    got = plan_totals(plan, measured(plan, policy)[()])
    assert value_of(plan, 0, got[0]) == 1  # COUNT(age): one non-NULL age
    # (COUNT(age) and SUM(age) share one value, the gridded age.)
    assert value_of(plan, 1, got[1]) == 40  # SUM(age): not 40 + 18
    assert value_of(plan, 2, got[2]) == 10  # AVG(spend): not (10 + 0) / 2


def test_count_of_a_column_does_not_depend_on_other_aggregates(tiny_policy: TinyPolicy) -> None:
    """COUNT(spend) alone counts a NaN like raw SQL does; next to SUM(spend) it must not differ."""
    policy = tiny_policy([(1, "east", 40, float("nan")), (2, "east", 40, 10.0)])
    alone = make_plan(policy, "SELECT COUNT(spend) FROM visits")
    paired = make_plan(policy, "SELECT COUNT(spend), SUM(spend) FROM visits")
    n_alone = plan_totals(alone, measured(alone, policy)[()])[0]
    n_paired = plan_totals(paired, measured(paired, policy)[()])[0]
    assert n_alone == n_paired


# -- bounded-intermediate invariants on data that exceeds every bound ------------------------

SPECIAL = [1e300, -1e300, math.inf, -math.inf, math.nan, None, -5.0, 250.0, 0.1, 199.99999]


def exceeding_rows(seed: int = 20261101) -> list[tuple[Any, ...]]:
    rng = random.Random(seed)
    rows: list[tuple[Any, ...]] = []
    rows += [(1, "east", 40, 150.0 + i) for i in range(50)]  # n >> C in one group
    for region in [*TINY_REGIONS, "mars", None]:  # every group, and keys outside the domain
        for v in SPECIAL:
            rows.append((2, region, rng.choice([None, -7, 17, 91, 200, 45]), v))
    rows += [(3, "west", 95, 200.0)] * 25  # at the top: scaled sums hit C·upper
    rows += [(3, "north", 10, -1e9)] * 12  # far below the bounds
    for unit in range(4, 40):
        for _ in range(rng.randint(1, 40)):
            rows.append(
                (
                    unit,
                    rng.choice([*TINY_REGIONS, "mars"]),
                    rng.choice([None, *range(0, 121, 7)]),
                    rng.choice([*SPECIAL, *(rng.uniform(-100, 400) for _ in range(8))]),
                )
            )
    return rows


INVARIANT_QUERIES = [
    "SELECT region, COUNT(*), COUNT(spend), SUM(spend), AVG(spend), AVG(age), "
    "COUNT(DISTINCT user_id) FROM visits GROUP BY region",
    "SELECT age, SUM(spend), AVG(spend) FROM visits GROUP BY age",
    "SELECT SUM(spend * 2), AVG(CASE WHEN age > 30 THEN spend ELSE -10 END) FROM visits",
    "SELECT CASE WHEN spend < 50 THEN 'low' ELSE 'high' END AS b, region, AVG(spend), "
    "SUM(LEAST(GREATEST(spend, 10), 20)) FROM visits WHERE age > 20 GROUP BY b, region",
    # Counts only (planned by a session, they rank per unit in one row: tests/bound/test_pivot.py)
    "SELECT region, COUNT(*), COUNT(age), COUNT(DISTINCT user_id) FROM visits GROUP BY region",
    "SELECT CASE WHEN age > 30 THEN 'old' ELSE 'young' END AS b, COUNT(*) FROM visits GROUP BY b",
]


def with_ctes(plan: Plan, select: str, capped_unit: bool = False) -> str:
    """``select`` run over the plan's own CTEs (``_capped`` optionally also carries ``_u``)."""
    ctes = []
    for cte in plan.bounded.ctes:
        node = cte.copy()
        if capped_unit and node.alias == "_capped":
            inner = node.this
            assert isinstance(inner, exp.Select)
            inner.set("expressions", [exp.column("_u"), *inner.expressions])
        ctes.append(node.sql(dialect=DIALECT))
    return f"WITH {', '.join(ctes)} {select}"


def grids_by_value(plan: Plan) -> dict[int, Any]:
    grids: dict[int, Any] = {}
    for est in plan.estimates:
        for j in est.measurements:
            spec = plan.measurements[j].spec
            if est.grid is not None and spec.value is not None:
                grids[spec.value] = est.grid
    return grids


@pytest.mark.parametrize(("max_groups", "max_rows"), [(2, 10), (3, 4), (1, 1)])
@pytest.mark.parametrize("sql", INVARIANT_QUERIES)
def test_bounded_intermediate_invariants(
    tiny_policy: TinyPolicy, sql: str, max_groups: int, max_rows: int
) -> None:
    policy = tiny_policy(exceeding_rows(), max_groups=max_groups, max_rows=max_rows)
    plan = make_plan(policy, sql)
    l0, c = plan.max_groups, plan.max_rows
    keys = [f"_k{i}" for i in range(len(plan.analysis.keys))]

    # Groups per unit: exactly min(L0, groups the unit has), and the L0 smallest hashes. The
    # groups a unit has are its distinct keys among the rows (whichever form ranks them).
    hashed = ", ".join(["_u", *keys, f"CAST({SALT} AS BIGINT)"])
    _, units = run(policy, with_ctes(plan, f"SELECT DISTINCT _u, {', '.join(['1', *keys])}, "
                                           f"hash({hashed}) FROM _vals"))  # fmt: skip
    _, kept = run(policy, with_ctes(plan, f"SELECT _u, {', '.join(['1', *keys])} FROM _kept"))
    by_unit: dict[Any, list[tuple[int, tuple[Any, ...]]]] = defaultdict(list)
    for row in units:
        by_unit[row[0]].append((row[-1], tuple(row[1:-1])))
    expected_kept = {
        (u, key)
        for u, groups in by_unit.items()
        for _, key in sorted(groups)[: (l0 if keys else 1)]
    }
    got_kept = [(row[0], tuple(row[1:])) for row in kept]
    assert len(got_kept) == len(set(got_kept))
    assert set(got_kept) == expected_kept
    per_unit: dict[Any, int] = defaultdict(int)
    for u, _ in got_kept:
        per_unit[u] += 1
    assert max(per_unit.values()) <= (l0 if keys else 1)

    # Per (unit, group) row of _capped: n' <= C, sums within n'·[lower, upper].
    grids = grids_by_value(plan)
    checks = ["_c < 1", f"_c > {c}"]
    values = {m.spec.value for m in plan.measurements if m.spec.value is not None}
    for i in sorted(values):
        checks += [f"_c{i} > _c", f"_c{i} < 0"]
    for i, g in grids.items():
        checks += [
            f"(_t{i} IS NULL AND _c{i} <> 0)",  # NULL only when every value is NULL
            f"_t{i} < _c{i} * {g.lower}",
            f"_t{i} > _c{i} * {g.upper}",
            f"abs(2 * _t{i} - _c{i} * ({g.lower + g.upper})) > _c{i} * ({g.upper - g.lower})",
        ]
    _, bad = run(policy, with_ctes(plan, f"SELECT * FROM _capped WHERE {' OR '.join(checks)}"))
    assert bad == []

    # Per unit, each measurement's total contribution is within its L1 sensitivity.
    contrib = []
    for m in plan.measurements:
        v = m.spec.value
        if m.spec.kind == "rows":
            contrib.append("SUM(_c)")
        elif m.spec.kind == "units":
            contrib.append("COUNT(*)")
        elif m.spec.kind == "count":
            contrib.append(f"SUM(_c{v})")
        elif m.spec.kind == "sum":
            contrib.append(f"COALESCE(SUM(abs(_t{v})), 0)")
        else:
            assert v is not None
            g = grids[v]
            contrib.append(f"COALESCE(SUM(abs(2 * _t{v} - _c{v} * {g.lower + g.upper})), 0)")
    select = f"SELECT _u, {', '.join(contrib)} FROM _capped GROUP BY _u"
    _, per_unit_rows = run(policy, with_ctes(plan, select, capped_unit=True))
    assert per_unit_rows
    for row in per_unit_rows:
        for m, value in zip(plan.measurements, row[1:], strict=True):
            assert 0 <= value <= m.sensitivity, (row[0], m.label, value, m.sensitivity)

    # The final totals exist, are integers, and nothing raised on NaN, inf or 1e300.
    _, final = run(policy, plan.bounded_sql)
    assert final
    for row in final:
        assert all(isinstance(v, int) or v is None for v in row[len(keys) :])


def test_kept_groups_depend_only_on_the_units_own_rows(tiny_policy: TinyPolicy) -> None:
    rows = exceeding_rows()
    sql = "SELECT region, COUNT(*) FROM visits GROUP BY region"
    full = tiny_policy(rows)
    alone = tiny_policy([r for r in rows if r[0] == 2])
    select = "SELECT _k0 FROM _kept WHERE _u = 2 ORDER BY _k0 NULLS FIRST"
    kept_full = run(full, with_ctes(make_plan(full, sql), select))[1]
    kept_alone = run(alone, with_ctes(make_plan(alone, sql), select))[1]
    assert kept_full == kept_alone
    assert len(kept_full) == L0


def test_count_of_columns_of_every_type_skips_null_and_nan(tiny_policy: TinyPolicy) -> None:
    policy = tiny_policy([(1, None, None, None), (2, "east", 30, math.nan), (3, "west", 20, 1.0)])
    plan = make_plan(policy, "SELECT COUNT(region), COUNT(age), COUNT(spend) FROM visits")
    assert plan_totals(plan, measured(plan, policy)[()]) == [2, 2, 1]
