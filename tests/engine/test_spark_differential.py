"""Differential tests: the bounded query on DuckDB and its lowering on Spark give the same
pre-noise totals over the same rows (the same Parquet files, read by both engines).

Every query of the golden corpus (``tests/golden``, planned as
``tests/bound/test_rewrite_golden.py`` plans them, with its policy) and of the breadth corpus
(``tests/bound/golden_breadth``, planned by a session as ``tests/bound/test_breadth_golden.py``
does, with its policies and options) is run

1. exactly: with the bounds a keyed hash applies (L0 per unit, R per unit) set from the data so
   that they cannot bind, and the corpus's own C (its cap is deterministic: the same rows scaled
   the same way on both engines), the two results are identical row for row;
2. with the corpus's own bounds: the engines keep different groups (or rows) of a unit that
   exceeds L0 (or R), each by its own keyed hash. Every group's total may then differ by at
   most what those units contribute to it (their number times the per-group bound, twice that
   when R's window picks rows), and a group no such unit touches is identical;
3. as neighbours, on Spark alone: removing one unit's rows moves each total by at most its
   per-group bound, touches at most L0 groups and at most the L1 sensitivity in sum, and leaves
   every other unit's kept rows exactly as they were.

The data are adversarial: ±1e308, 1e300, NaN, ±inf and NULL values, rows without a unit, keys
outside the public domains, dates outside the declared range, one unit with thousands of rows.
``DPSQL_SPARK_FULL=1`` adds seeds, queries and neighbour pairs, compares the corpora's own
hand-made data sets exactly too, and runs Spark with adaptive query execution on.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import random
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import test_breadth_golden as breadth
import test_rewrite_golden as golden
from conftest import TINY_SCHEMA, policy_over, write_parquet
from spark_fixtures import (
    FULL,
    SOCKET_WARNINGS,
    duck_rows,
    normalise,
    register,
    sorted_rows,
    spark,  # noqa: F401 - the session fixture
    spark_rows,
)

from dpsql.bound import pivot
from dpsql.engine.spark.lower import lower
from dpsql.plan.plans import Plan
from dpsql.policy import Policy
from dpsql.session.session import Session

pytestmark = [pytest.mark.spark, *SOCKET_WARNINGS]

SALT = 7  # the tests' salt (the engines bind a secret one)
Key = tuple[Any, ...]
Totals = dict[Key, list[Any]]

# -- data -------------------------------------------------------------------------------------

EXTREMES = [1e308, -1e308, 1e300, math.inf, -math.inf, math.nan, None, -0.0, 5e-324, 199.75]


def golden_rows(seed: int) -> list[tuple[Any, ...]]:
    """The golden corpus's rows (user_id, region, age, spend): its own exceeding data set, with
    the extremes, rows without a unit and a unit with thousands of rows added."""
    rng = random.Random(seed)  # test data only; no privacy noise is drawn here
    rows = list(golden.exceeding_rows(seed))
    regions = [*golden.TINY_REGIONS, "mars", None]
    for i, x in enumerate(EXTREMES * 2):
        rows.append((40 + i % 7, regions[i % len(regions)], rng.choice([None, 17, 44, 91]), x))
    # Rows without a unit: one unit to every cap, as everywhere in dpsql.
    rows += [(None, r, 33, 12.5) for r in regions for _ in range(3)]
    rows += [(60, "east", 2**31 - 1, 1.0), (61, "west", -(2**31), 2.0)]  # INTEGER's limits
    heavy = [(99, rng.choice(regions), rng.randint(0, 120), rng.uniform(-50, 260))]
    rows += heavy * 3 + [(99, rng.choice(regions), rng.randint(0, 120), 150.0) for _ in range(3000)]
    return rows


def breadth_data(seed: int) -> breadth.Data:
    """The breadth corpus's tables: its own exceeding data set, with the extremes, rows without
    a unit (in both tables of the unit domain) and a unit with hundreds of rows (its self-join
    has a hundred thousand) added."""
    rng = random.Random(seed)  # test data only
    base = breadth.exceeding(seed)
    regions = [*breadth.REGIONS, "mars", None]
    days = [*breadth.DAYS, None]
    visits = list(base.visits)
    for i, x in enumerate(EXTREMES * 2):
        visits.append(
            (70 + i % 5, regions[i % len(regions)], rng.choice([None, 18, 50, 90]), x,
             days[i % len(days)], rng.choice([None, "a", "b", f"x{i}"]))
        )  # fmt: skip
    visits += [(None, r, 40, 20.0, dt.date(2024, 3, 3), "n") for r in regions for _ in range(2)]
    visits += [
        (98, rng.choice(regions), rng.randint(10, 100), rng.uniform(-10, 230),
         rng.choice(days), rng.choice(breadth.ITEMS))
        for _ in range(320)
    ]  # fmt: skip
    purchases = [*base.purchases, (None, 3.0), (None, 1e308), (98, math.nan), (98, 50.0)]
    # The normalised tables: the extremes as prices, unit 98 with a root row listed twice and
    # hundreds of lines, a basket id it shares with unit 3, NULL and dangling keys.
    people = [*base.people, (98, "b"), (98, "c"), (None, "c")]
    baskets = [*base.baskets, (5000, 98, "web"), (5001, 98, "shop"), (5001, 3, "shop"),
               (5002, None, "web"), (5003, 404, "web")]  # fmt: skip
    lines = list(base.lines)
    for x in EXTREMES * 2:
        lines.append((rng.choice([5000, 5001, 5002, 5003, None]), rng.choice(breadth.PRODUCTS), x))
    lines += [
        (rng.choice([5000, 5001]), rng.choice([*breadth.PRODUCTS, "p9", None]),
         rng.uniform(-5, 60))
        for _ in range(300)
    ]  # fmt: skip
    return breadth.Data(
        tuple(visits), tuple(purchases), tuple(people), tuple(baskets), tuple(lines)
    )


# -- planning ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class World:
    """One data set of one corpus: its tables' files, catalog and a way to plan a query."""

    tables: Mapping[str, Path]
    catalog: Mapping[str, Mapping[str, str]]
    plan: Callable[[str, int | None, int | None], Plan]  # (name, L0, R); None: the corpus's
    session: Session | None = None  # the breadth corpus's, planning any text


def golden_policy(path: Path, max_groups: int) -> Policy:
    """The policy of tests/bound/test_rewrite_golden.py (the conftest's tiny policy) over
    ``path``."""
    return policy_over(path, max_groups=max_groups, max_rows=golden.C)


def golden_world(directory: Path, rows: Sequence[tuple[Any, ...]]) -> World:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "visits.parquet"
    write_parquet(path, rows, TINY_SCHEMA)

    def plan(name: str, l0: int | None, r: int | None) -> Plan:
        assert r is None  # the golden corpus sets no R
        sql = (golden.GOLDEN / f"{name}.sql").read_text()
        return golden.make_plan(golden_policy(path, golden.L0 if l0 is None else l0), sql)

    return World({"visits": path}, {"visits": dict(TINY_SCHEMA)}, plan)


@contextlib.contextmanager
def breadth_world(directory: Path, data: breadth.Data) -> Iterator[World]:
    policy = breadth.write_world(directory, data)
    session = Session(policy)
    tables = {name: policy.resolve(p) for name, p in policy.data.tables.items()}

    def plan(name: str, l0: int | None, r: int | None) -> Plan:
        if name in EXTRA:
            sql, options = EXTRA[name][0], dict(EXTRA[name][1])
        else:
            sql, options = breadth.sql_of(name), dict(breadth.CASES[name].options)
        if l0 is not None:
            options["max_groups_per_unit"] = l0
        if r is not None:
            options["max_rows_per_unit"] = r
        return session.plan(sql, None, **options)

    try:
        yield World(tables, session.engine.catalog, plan, session)
    finally:
        session.close()


# Forms of the bounded query the corpora do not reach (planned over the breadth tables): R's
# window over weighted rows, variances, the direct form with quantiles and COUNT(DISTINCT),
# row-level arithmetic made total (TRY), date parts and truncation, text functions, CASE and
# cast keys, a public table's domain, two keys, the Gaussian mechanism's measurements.
EXTRA: dict[str, tuple[str, Mapping[str, object]]] = {
    "weighted_row_cap": (
        "SELECT region, COUNT(*) FROM visits GROUP BY region",
        {"max_rows_per_unit": 7},
    ),
    "variance": ("SELECT region, VARIANCE(spend), STDDEV(age) FROM visits GROUP BY region", {}),
    # Sums of products of centred values over the pairs' rows (dpsql.plan.aggregates.pairs).
    "pairs": (
        "SELECT region, COVAR_POP(spend, age), CORR(age, spend), REGR_SLOPE(spend, age), "
        "REGR_INTERCEPT(spend, age * 2) FROM visits GROUP BY region",
        {},
    ),
    "direct_quantiles": (
        "SELECT MIN(spend), MAX(age), MEDIAN(spend), COUNT(DISTINCT item) FROM visits",
        {"max_rows_per_unit": 2},
    ),
    "per_unit_aggregates": (
        "WITH t AS (SELECT user_id, MIN(spend) AS lo, MAX(age) AS hi, COUNT(DISTINCT item) AS n, "
        "SUM(LEAST(GREATEST(spend, 0), 10)) AS s FROM visits GROUP BY user_id) "
        "SELECT SUM(LEAST(n, 4)), AVG(lo), AVG(hi), SUM(LEAST(GREATEST(s, 0), 50)) FROM t",
        {},
    ),
    "arithmetic": (
        "SELECT region, SUM(age * 2 + 1), AVG(spend / 2 - age), COUNT(age % 7), "
        "SUM(CASE WHEN age // 10 = 3 THEN 1 ELSE 0 END) FROM visits "
        "WHERE age + 1 > 20 AND spend * 3 >= 0 GROUP BY region",
        {},
    ),
    "floor_buckets": (
        "SELECT FLOOR(age / 10) AS b, COUNT(*), SUM(spend) FROM visits GROUP BY FLOOR(age / 10)",
        {},
    ),
    "date_parts": (
        "SELECT dayofweek(day) AS w, quarter(day) AS q, COUNT(*) FROM visits "
        "GROUP BY dayofweek(day), quarter(day)",
        {},
    ),
    "trunc_quarter": (
        "SELECT date_trunc('quarter', day) AS q, COUNT(*) FROM visits "
        "GROUP BY date_trunc('quarter', day)",
        {},
    ),
    "case_key": (
        "SELECT CASE WHEN spend < 50 THEN 'low' WHEN spend IS NULL THEN NULL ELSE 'high' END "
        "AS b, COUNT(*), SUM(spend) FROM visits GROUP BY b",
        {},
    ),
    "text_filters": (
        "SELECT COUNT(*), SUM(age) FROM visits WHERE item LIKE 'a%' OR starts_with(region, 'we') "
        "OR length(region) = 5 OR region || item = 'easta' OR contains(region, 'or') "
        "OR concat(region, item) = 'northb'",
        {},
    ),
    # The other group of each public key (dpsql.other_group): rows outside the domain and NULL
    # keys (the data's 'mars' and NULL regions, dates outside the range) mapped onto one more
    # key, a label of the key's type or NULL, on both engines.
    "other_group": (
        "SELECT region, month(day) AS m, COUNT(*), SUM(spend) FROM visits "
        "GROUP BY region, month(day)",
        {"other_group": True},
    ),
    "other_label": (
        "SELECT date_trunc('quarter', day) AS q, COUNT(*) FROM visits "
        "GROUP BY date_trunc('quarter', day)",
        {"other_group": True, "other_label": "1900-01-01"},
    ),
    "public_table_domain": (
        "SELECT tier, COUNT(*) FROM visits CROSS JOIN tiers WHERE spend >= threshold GROUP BY tier",
        {"max_rows_per_unit": 3},
    ),
}
# In the full profile only: forms close to the ones above.
EXTRA_FULL: dict[str, tuple[str, Mapping[str, object]]] = {
    "year_of_range": ("SELECT year(day) AS y, COUNT(*) FROM visits GROUP BY year(day)", {}),
    "extract_month": (
        "SELECT extract(month FROM day) AS m, SUM(spend) FROM visits "
        "GROUP BY extract(month FROM day)",
        {},
    ),
    "between_in_dates": (
        "SELECT COUNT(*), SUM(age) FROM visits WHERE age BETWEEN 20 AND 60 "
        "AND region IN ('east', 'west', 'north') AND day >= '2024-02-01'",
        {},
    ),
    "clamps_and_nulls": (
        "SELECT SUM(COALESCE(age, 0)), AVG(GREATEST(spend, 10)), "
        "SUM(LEAST(GREATEST(NULLIF(age, 25), 0), 100)) FROM visits",
        {},
    ),
    "abs_round": (
        "SELECT SUM(ABS(age - 50)), SUM(ROUND(spend)), AVG(ABS(spend - 100)) FROM visits",
        {},
    ),
    "private_key_median": ("SELECT age, MEDIAN(spend) FROM visits GROUP BY age", {}),
    "gaussian": (
        "SELECT region, COUNT(*), SUM(spend) FROM visits GROUP BY region",
        {"mechanism": "gaussian"},
    ),
    "two_keys": (
        "SELECT region, month(day) AS m, COUNT(*) FROM visits GROUP BY region, month(day)",
        {},
    ),
    "cast_key": (
        "SELECT CAST(age AS VARCHAR) AS a, COUNT(*) FROM visits GROUP BY CAST(age AS VARCHAR)",
        {},
    ),
    "substring_key": (
        "SELECT substring(region, 1, 2) AS p, COUNT(*) FROM visits "
        "GROUP BY substring(region, 1, 2)",
        {},
    ),
}
if FULL:
    EXTRA.update(EXTRA_FULL)
CORPORA = {"golden": golden.NAMES, "breadth": breadth.NAMES, "extra": sorted(EXTRA)}
CASES = [(corpus, name) for corpus, names in CORPORA.items() for name in names]
SEEDS = [20261205, 20261206, 20261207] if FULL else [20261205]


@pytest.fixture(scope="module")
def worlds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, list[World]]]:
    """Per corpus, its adversarial data sets (one per seed)."""
    root = tmp_path_factory.mktemp("spark_worlds")
    out: dict[str, list[World]] = {"golden": [], "breadth": []}
    with contextlib.ExitStack() as stack:
        for seed in SEEDS:
            out["golden"].append(golden_world(root / f"golden_{seed}", golden_rows(seed)))
            data = breadth_data(seed)
            out["breadth"].append(stack.enter_context(breadth_world(root / f"b_{seed}", data)))
        out["extra"] = out["breadth"]  # the extra queries read the breadth corpus's tables
        yield out


@pytest.fixture(scope="module")
def within(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, World]]:
    """Per corpus, its own hand-made data set (tests/bound/test_rewrite_golden.py's WITHIN rows,
    tests/bound/test_breadth_golden.py's WITHIN tables)."""
    root = tmp_path_factory.mktemp("spark_within")
    with breadth_world(root / "breadth", breadth.WITHIN) as breadth_within:
        golden_within = golden_world(root / "golden", golden.WITHIN)
        yield {"golden": golden_within, "breadth": breadth_within, "extra": breadth_within}


def with_ctes(plan: Plan, select: str) -> str:
    """``select`` over the plan's own CTEs, in DuckDB's dialect (lowered like any query)."""
    return breadth.with_ctes(plan, select)


def cte_names(plan: Plan) -> set[str]:
    return {cte.alias for cte in plan.bounded.ctes}


def unit_rows_source(plan: Plan) -> tuple[str, str]:
    """The CTE of a unit's rows before the keyed-hash caps, and how to count a unit's rows in
    it (``_all`` with R's window; its rows carry their copies ``_w`` in the weighted form)."""
    if "_all" not in cte_names(plan):
        return "_rows", "COUNT(*)"
    (all_cte,) = [c for c in plan.bounded.ctes if c.alias == "_all"]
    weighted = "_w" in [e.alias_or_name for e in all_cte.this.selects]
    return "_all", "SUM(_w)" if weighted else "COUNT(*)"


def key_list(plan: Plan) -> list[str]:
    return [f"_k{i}" for i in range(len(plan.analysis.keys))]


def exact_bounds(world: World, name: str) -> tuple[int, int | None]:
    """L0 and R that the data cannot make bind: the most groups and rows any unit has (a
    unit's groups are its distinct keys once rows outside a public domain are dropped)."""
    plan = world.plan(name, None, None)
    source, count = unit_rows_source(plan)
    keys = "".join(f", {k}" for k in key_list(plan))
    groups = (
        f"SELECT COALESCE(MAX(n), 1) FROM (SELECT _u, COUNT(*) AS n FROM "
        f"(SELECT DISTINCT _u{keys} FROM {source}) GROUP BY _u)"
    )
    rows = f"SELECT COALESCE(MAX(n), 1) FROM (SELECT _u, {count} AS n FROM {source} GROUP BY _u)"
    ((l0,),) = duck_rows(world.tables, with_ctes(plan, groups), SALT)
    r = None
    if plan.bounding is not None and plan.bounding.max_total_rows is not None:
        ((r,),) = duck_rows(world.tables, with_ctes(plan, rows), SALT)
    return max(int(l0), 1), None if r is None else max(int(r), 1)


def run_both(
    session: Any, world: World, plan: Plan
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The bounded query's rows on DuckDB and its lowering's on Spark, over the same files."""
    register(session, world.tables)
    from_duck = duck_rows(world.tables, plan.engine_sql, SALT)
    return from_duck, spark_rows(session, lower(plan.engine_sql, world.catalog), SALT)


# -- 1. exact agreement -----------------------------------------------------------------------


@pytest.mark.parametrize(("corpus", "name"), CASES)
def test_totals_identical_when_no_keyed_cap_binds(
    corpus: str,
    name: str,
    worlds: dict[str, list[World]],
    within: dict[str, World],
    spark: Any,  # noqa: F811
) -> None:
    # The corpora's own hand-made data in the full profile only (tests/bound checks them
    # against the golden totals on DuckDB): by default each query runs once on Spark, on the
    # adversarial world.
    own = [within[corpus]] if FULL else []
    for world in [*own, *worlds[corpus]]:
        l0, r = exact_bounds(world, name)
        plan = world.plan(name, l0, r)
        assert plan.bounding is not None and plan.bounding.max_rows == plan.max_rows
        from_duck, from_spark = run_both(spark, world, plan)
        assert from_duck, name  # every corpus query returns a row on this data
        assert sorted_rows(from_spark) == sorted_rows(from_duck), name


def test_the_exact_runs_exercise_the_caps_that_are_deterministic(
    worlds: dict[str, list[World]],
) -> None:
    """A test of the test: with the exact bounds, C still binds (the heavy unit has far more
    than C rows in a group), so the exact comparison covers the scaled sums and the lists cut
    to C values."""
    world = worlds["golden"][0]
    l0, _ = exact_bounds(world, "sum")
    plan = world.plan("sum", l0, None)
    ((most,),) = duck_rows(
        world.tables,
        with_ctes(plan, "SELECT MAX(n) FROM (SELECT _u, COUNT(*) AS n FROM _rows GROUP BY _u)"),
        SALT,
    )
    assert most > 100 * plan.max_rows


# -- 2. the corpora's own (binding) bounds ----------------------------------------------------


def heavy_units_per_group(world: World, plan: Plan) -> dict[Key, int]:
    """Per group, the units whose kept groups or rows a keyed hash decides (more than L0
    groups, or more than R rows) among those with rows in that group."""
    bounding = plan.bounding
    assert bounding is not None
    source, count = unit_rows_source(plan)
    keys = key_list(plan)
    cols = "".join(f", {k}" for k in keys)
    heavy = []
    if bounding.max_groups is not None and keys:
        heavy.append(
            f"SELECT _u FROM (SELECT DISTINCT _u{cols} FROM {source}) GROUP BY _u "
            f"HAVING COUNT(*) > {bounding.max_groups}"
        )
    if bounding.max_total_rows is not None:
        heavy.append(
            f"SELECT _u FROM {source} GROUP BY _u HAVING {count} > {bounding.max_total_rows}"
        )
    if not heavy:
        return {}
    group = f" GROUP BY {', '.join(keys)}" if keys else ""
    select = (
        f"SELECT {''.join(f'{k}, ' for k in keys)}"
        "COUNT(DISTINCT _u) + MAX(CASE WHEN _u IS NULL THEN 1 ELSE 0 END) "
        f"FROM (SELECT DISTINCT _u{cols} FROM {source}) AS _s "
        f"SEMI JOIN ({' UNION '.join(heavy)}) AS _h ON _s._u IS NOT DISTINCT FROM _h._u{group}"
    )
    rows = duck_rows(world.tables, with_ctes(plan, select), SALT)
    return {tuple(normalise(v) for v in row[:-1]): int(row[-1]) for row in rows}


def difference(kind: str, a: Any, b: Any) -> int:
    """How far two totals of one group are apart: counts and sums by their difference, a
    quantile's histograms by the number of values in one and not the other."""
    if kind == "quantile":
        return sum(abs(a.get(k, 0) - b.get(k, 0)) for k in set(a) | set(b))
    return abs(int(a) - int(b))


def normalised_totals(plan: Plan, rows: Sequence[Sequence[Any]]) -> Totals:
    keyed = breadth.measured(plan, [tuple(normalise_cell(v) for v in row) for row in rows])
    return {tuple(normalise(v) for v in key): totals for key, totals in keyed.items()}


def normalise_cell(value: Any) -> Any:
    """A total as ``test_breadth_golden.measured`` reads it: ints, and histograms as dicts."""
    if isinstance(value, dict):
        return {normalise(k): normalise(v) for k, v in value.items()}
    return normalise(value)


# With binding bounds, the extra queries whose keyed-hash step the corpora do not have (R's
# window over weighted rows, with a public table's domain, the direct form); all of them in
# the full profile.
BINDING_EXTRA = sorted(EXTRA) if FULL else ["direct_quantiles", "pairs", "public_table_domain",
                                            "weighted_row_cap"]  # fmt: skip
BINDING_CASES = [(c, n) for c, n in CASES if c != "extra" or n in BINDING_EXTRA]


@pytest.mark.parametrize(("corpus", "name"), BINDING_CASES)
def test_binding_bounds_change_only_what_the_hash_decides(
    corpus: str,
    name: str,
    worlds: dict[str, list[World]],
    spark: Any,  # noqa: F811
) -> None:
    for world in worlds[corpus]:
        plan = world.plan(name, None, None)
        from_duck, from_spark = run_both(spark, world, plan)
        duck, spark_totals = normalised_totals(plan, from_duck), normalised_totals(plan, from_spark)
        heavy = heavy_units_per_group(world, plan)
        assert plan.bounding is not None
        # A unit kept by one engine and not the other moves a group by at most its per-group
        # bound; with R's window it keeps other rows, anywhere in [-bound, bound].
        factor = 2 if plan.bounding.max_total_rows is not None else 1
        if all(k.public for k in plan.analysis.keys):
            assert set(spark_totals) == set(duck)  # every key of the public domains
        for key in set(duck) | set(spark_totals):
            # A key only one engine has: a group that only heavy units reach.
            assert (key in duck and key in spark_totals) or heavy.get(key, 0) > 0, (name, key)
            for j, m in enumerate(plan.measurements):
                zero: Any = {} if m.spec.kind == "quantile" else 0
                a = duck[key][j] if key in duck else zero
                b = spark_totals[key][j] if key in spark_totals else zero
                per_unit = plan.max_rows if m.spec.kind == "quantile" else m.per_group
                bound = factor * heavy.get(key, 0) * per_unit
                assert difference(m.spec.kind, a, b) <= bound, (name, key, m.label, a, b)


def test_the_binding_runs_do_bind(
    worlds: dict[str, list[World]],
    spark: Any,  # noqa: F811
) -> None:
    """A test of the test: with the corpora's bounds the heavy units exist and the engines do
    keep different groups for some of them (each by its own keyed hash)."""
    world = worlds["golden"][0]
    plan = world.plan("group_private", None, None)
    heavy = heavy_units_per_group(world, plan)
    assert sum(heavy.values()) > 10
    from_duck, from_spark = run_both(spark, world, plan)
    assert sorted_rows(from_duck) != sorted_rows(from_spark)


# L0's ranking per unit in one row (dpsql.bound.pivot), at the corpus's binding L0: on Spark as on
# DuckDB (tests/bound/test_pivot.py) it keeps the groups of the ranking window it replaces, both
# ranked by the engine's own keyed hash.
PIVOTED = {
    "count_by_region": ("SELECT region, COUNT(*), COUNT(age), COUNT(DISTINCT user_id) "
                        "FROM visits GROUP BY region", {}),
    "count_other_group": ("SELECT region, COUNT(*) FROM visits GROUP BY region",
                          {"other_group": True}),
    "two_keys": ("SELECT CASE WHEN spend > 50 THEN 1 ELSE 0 END AS hi, CASE WHEN age > 40 "
                 "THEN 'old' ELSE 'young' END AS b, COUNT(*) FROM visits GROUP BY hi, b", {}),
    "join_public_left": (breadth.sql_of("join_public_left"), {}),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(PIVOTED))
def test_the_pivot_keeps_the_windows_groups_on_spark(
    name: str,
    worlds: dict[str, list[World]],
    spark: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sql, options = PIVOTED[name]
    limit = pivot.PIVOT_CELLS  # read once: the loop below sets it to 0 for each world
    for world in worlds["breadth"]:
        session = world.session
        assert session is not None
        forms = []
        try:
            for cells in (limit, 0):
                monkeypatch.setattr(pivot, "PIVOT_CELLS", cells)
                session._plans.clear()  # planned again under the other form
                plan = session.plan(sql, None, **options)
                forms.append(("_pivot AS" in plan.engine_sql, plan.engine_sql))
        finally:
            session._plans.clear()  # no plan of the window form is kept for the other tests
        assert [f for f, _ in forms] == [True, False], name
        register(spark, world.tables)
        pivoted, window = (
            sorted_rows(spark_rows(spark, lower(text, world.catalog), SALT)) for _, text in forms
        )
        assert pivoted, name
        assert pivoted == window, name


# -- 3. neighbours on Spark -------------------------------------------------------------------

# Queries whose neighbours are checked: public and private keys, the L0 ranking, R's window,
# quantile histograms and COUNT(DISTINCT) lists, a join.
NEIGHBOUR_CASES = [
    ("golden", "several"),
    ("golden", "group_private"),
    ("breadth", "row_cap"),
    ("breadth", "quantiles"),
    ("breadth", "path_join_chain"),
    ("breadth", "full_join_units"),
]
if FULL:
    NEIGHBOUR_CASES += [
        ("breadth", "path_two_links"),
        ("breadth", "path_right_join"),
        ("breadth", "union_all_units"),
        ("breadth", "set_intersect"),
        ("breadth", "count_distinct_grouped"),
        ("breadth", "join_private_unit_domain"),
        ("breadth", "self_join_grouped"),
        ("breadth", "date_trunc_month"),
        ("golden", "where_expressions"),
    ]


def kept_rows(session: Any, world: World, plan: Plan) -> Counter[tuple[Any, ...]]:
    """The rows the keyed-hash caps kept, per unit and group (``_kept``), or per row after R's
    window (``_rows``), on Spark."""
    source = "_kept" if "_kept" in cte_names(plan) else "_rows"
    text = lower(with_ctes(plan, f"SELECT * FROM {source}"), world.catalog)
    return Counter(tuple(normalise(v) for v in row) for row in spark_rows(session, text, SALT))


def without_unit(world_rows: Any, unit: int | None) -> Any:
    if isinstance(world_rows, breadth.Data):
        return world_rows.without(unit)
    return [r for r in world_rows if r[0] != unit]


def removed_units(corpus: str, data: Any, seed: int) -> list[int | None]:
    """The units whose neighbours are checked: the heaviest, the rows without a unit, and in
    the full profile one drawn at random."""
    units: list[int | None] = [99 if corpus == "golden" else 98, None]
    if FULL:
        rows = data if corpus == "golden" else data.visits
        rng = random.Random(seed)  # test data only
        units.append(rng.choice(sorted({r[0] for r in rows if r[0] is not None})))
    return units


@pytest.mark.parametrize(("corpus", "name"), NEIGHBOUR_CASES)
def test_removing_a_unit_on_spark_moves_totals_within_its_bounds(
    corpus: str,
    name: str,
    tmp_path: Path,
    spark: Any,  # noqa: F811
) -> None:
    for seed in SEEDS:
        data: Any = golden_rows(seed) if corpus == "golden" else breadth_data(seed)
        units = removed_units(corpus, data, seed)
        with contextlib.ExitStack() as stack:
            full, less = neighbour_worlds(stack, tmp_path / str(seed), corpus, data, units)
            check_neighbours_on_spark(spark, name, full, dict(zip(units, less, strict=True)))


def units_with_rows(world: World, plan: Plan) -> set[Any]:
    """The units with rows in the query's relation (a NULL unit drops out of a join on it)."""
    source, _ = unit_rows_source(plan)
    select = f"SELECT DISTINCT _u FROM {source}"
    return {row[0] for row in duck_rows(world.tables, with_ctes(plan, select), SALT)}


def check_neighbours_on_spark(
    session: Any, name: str, full_world: World, neighbours: Mapping[int | None, World]
) -> None:
    plan = full_world.plan(name, None, None)
    register(session, full_world.tables)
    text = lower(plan.engine_sql, full_world.catalog)
    full = normalised_totals(plan, spark_rows(session, text, SALT))
    kept_full = kept_rows(session, full_world, plan)
    for unit, less_world in neighbours.items():
        # A plan depends on the query and the schema only: D' is planned alike.
        assert less_world.plan(name, None, None).engine_sql == plan.engine_sql
        register(session, less_world.tables)
        less = normalised_totals(plan, spark_rows(session, text, SALT))
        moved = breadth.check_neighbours(plan, full, less)
        if unit in units_with_rows(full_world, plan):
            assert any(moved), (name, unit)  # the unit did contribute: the check could fail
        # Every other unit keeps exactly the groups (and rows) it kept: the choice is a
        # function of the unit's own rows and the salt.
        others = Counter({row: n for row, n in kept_full.items() if row[0] != unit})
        assert kept_rows(session, less_world, plan) == others, (name, unit)


def neighbour_worlds(
    stack: contextlib.ExitStack[None],
    directory: Path,
    corpus: str,
    data: Any,
    units: Sequence[int | None],
) -> tuple[World, list[World]]:
    """The data set and its neighbours, each without one of ``units``' rows."""
    sets = [("full", data), *((f"less_{u}", without_unit(data, u)) for u in units)]
    if corpus == "golden":
        worlds = [golden_world(directory / label, rows) for label, rows in sets]
    else:
        worlds = [
            stack.enter_context(breadth_world(directory / label, rows)) for label, rows in sets
        ]
    return worlds[0], worlds[1:]


# -- 4. the diagnosis of the bounds -----------------------------------------------------------

DIAGNOSED = (
    ("SELECT COUNT(*) FROM visits", {}),
    ("SELECT region, COUNT(*), AVG(spend * 2 - age) FROM visits GROUP BY region", {}),
    ("SELECT region, SUM(spend) FROM visits WHERE age > 30 GROUP BY region",
     {"max_rows_per_unit": 3}),
    ("SELECT MEDIAN(age) FROM visits", {"max_rows_per_unit_per_group": 1}),
)  # fmt: skip


@pytest.mark.parametrize(("sql", "options"), DIAGNOSED)
def test_the_diagnosis_is_identical_on_both_engines(
    sql: str,
    options: dict[str, Any],
    worlds: dict[str, list[World]],
    spark: Any,  # noqa: F811
) -> None:
    """The histogram of flag patterns is exact counts: Spark's lowering gives DuckDB's."""
    for world in worlds["golden"]:
        session = Session(golden_policy(world.tables["visits"], golden.L0))
        try:
            plan = session.plan(sql, diagnose=True, **options)
        finally:
            session.close()
        assert plan.diagnosis is not None
        text = plan.diagnosis.engine_sql
        register(spark, world.tables)
        from_duck = duck_rows(world.tables, text, SALT)
        assert len(from_duck) > 1, sql  # some unit is flagged on the adversarial data
        from_spark = spark_rows(spark, lower(text, world.catalog), SALT)
        assert sorted_rows(from_spark) == sorted_rows(from_duck), sql
