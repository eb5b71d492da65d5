"""The neighbour-differential fuzzer: every generated query, on D and on D' = D plus one unit.

Hypothesis draws a query (aggregates over row expressions, CASE keys whose literals collide in
the engine, text columns in boolean contexts, per-unit subqueries and CTEs, joins, quantiles,
sums beyond 2^53 grid units) and one adversarial unit (type extremes, huge and tiny floats, NaN,
±inf, empty and non-boolean strings, NULLs, up to hundreds of rows). The plan is made on both
data sets and the bounded SQL run on both engines with one salt; then, for the add/remove-one-
unit neighbour relation the plan's sensitivities are stated for:

- neither run raises (whether a query fails must never depend on the data), and both plans
  are the same (planning reads no data);
- for every measurement, the vector of pre-noise totals over all candidate groups moves by at
  most the plan's per-group bound in each group, in at most L0 groups, by at most its L1
  sensitivity in L1 norm and its L2 sensitivity in L2 norm (a jointly calibrated Gaussian
  query composes its measurements' rho, so each measurement's L2 is what it relies on); with
  private keys that includes the distinct-unit count of partition selection (≤ 1 per group);
- a quantile's histogram moves by at most C values in each of at most L0 groups, so every
  candidate's score moves by at most the score sensitivity the plan charges for;
- with public keys the released key set is identical, and every group is released once;
- the plan's privacy event has one event per measurement: each noisy value is charged.

``DPSQL_FUZZ=long`` runs many more examples (the CI profile is sized to fit the suite).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import LONG, examples, write_parquet
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_function_totality import NUMERIC_TEMPLATES, PREDICATE_TEMPLATES
from test_fuzz import AGGREGATE, NUM_EXPR, PREDICATE

from dpsql import errors
from dpsql.engine.duckdb import engine as duckdb_engine
from dpsql.plan.plans import Plan
from dpsql.plan.sensitivity import tied_parts
from dpsql.policy import Policy, load_policy
from dpsql.session.session import Session

SCHEMA = (
    ("user_id", "BIGINT"),
    ("region", "VARCHAR"),
    ("age", "INTEGER"),
    ("spend", "DOUBLE"),
    ("note", "VARCHAR"),
    ("flag", "VARCHAR"),
    ("big", "BIGINT"),
    ("day", "DATE"),
    ("top", "BIGINT"),
)
# top's bounds put its grid units just under 2^52 (step 1): a unit's C-scaled sum of top is
# beyond 2^53, where DOUBLE arithmetic rounds the clamp and the sum (3·TOP rounds up).
TOP = 2**52 - 3
REGIONS = ("north", "south", "east", "west")
UNIT = 10**6


def _base_rows() -> list[tuple[Any, ...]]:
    rows = []
    for i in range(400):
        rows.append(
            (
                i % 40,
                REGIONS[i % 3],
                18 + i % 60,
                float(i % 100),
                str(i % 7),
                ("true", "false", "t", "0")[i % 4],
                (i % 5) * 2**50,
                dt.date(2026, 1, 1) + dt.timedelta(days=i % 60),
                TOP - (i % 7) * 2**16,
            )
        )
    return rows


BASE = _base_rows()


def _policy(folder: Path, rows: Sequence[tuple[Any, ...]], name: str) -> Policy:
    path = folder / f"{name}.parquet"
    write_parquet(path, rows, SCHEMA)
    zones = folder / "zones.parquet"
    if not zones.exists():
        write_parquet(
            zones,
            [("north", "N"), ("north", "N2"), ("south", "S"), ("east", "E"), ("", "Z")],
            (("region", "VARCHAR"), ("zone", "VARCHAR")),
        )
    return load_policy(
        {
            "dataset": {"id": "neighbours"},
            "data": {"tables": {"visits": str(path), "zones": str(zones)}},
            "budget": {
                "diagnose": False,
                "epsilon": "10000",
                "delta": "0.5",
                "query_epsilon": "1",
                "query_delta": "0.000001",
            },
            "tables": {
                "visits": {
                    "privacy_unit": "user_id",
                    "max_groups_per_unit": 2,
                    "max_rows_per_unit_per_group": 3,
                    # Pinned queries (WHERE region = ...) are enforced cells of this family.
                    "constant_per_unit": ["region"],
                    "columns": {
                        "age": {"lower": 18, "upper": 90},
                        "spend": {"lower": 0, "upper": 200},
                        "big": {"lower": -(2**52), "upper": 2**52},
                        "top": {"lower": TOP - 2**19, "upper": TOP},
                        "region": {"public_values": list(REGIONS)},
                        # A key domain held by a public table, deduplicated in the key's type.
                        "flag": {"public_values_from": "zones.zone"},
                        "day": {"date_range": ["2026-01-01", "2026-03-31"]},
                    },
                },
                "zones": {"public": True},
            },
        },
        base_dir=folder,
    )


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    folder = tmp_path_factory.mktemp("neighbours")
    session = Session(_policy(folder, BASE, "base"))
    yield session
    session.close()


# -- the adversarial unit -----------------------------------------------------------------------

VALUES: Mapping[str, st.SearchStrategy[Any]] = {
    "region": st.sampled_from([*REGIONS, "", "NORTH", "élan", None, "x" * 300]),
    "age": st.sampled_from([18, 90, 0, -(2**31), 2**31 - 1, None, 55]),
    "spend": st.sampled_from(
        [math.nan, math.inf, -math.inf, 1e308, -1e308, 5e-324, -0.0, 0.0, None, 199.9, 1e16]
    ),
    "note": st.sampled_from(["", "true", "7", "abc", "é漢", None, "9" * 50]),
    "flag": st.sampled_from(["true", "false", "maybe", "", "1", "yes", None, "TRUE "]),
    "big": st.sampled_from([2**63 - 1, -(2**63), 2**52, -(2**52), 2**53 + 1, 0, None]),
    "day": st.sampled_from(
        [dt.date(1, 1, 1), dt.date(9999, 12, 31), dt.date(2026, 2, 1), dt.date(2026, 5, 1), None]
    ),
    "top": st.sampled_from([TOP, TOP - 1, TOP - 2**19, 2**63 - 1, -(2**63), None]),
}


@st.composite
def unit_rows(draw: st.DrawFn) -> list[tuple[Any, ...]]:
    """One new unit: a few distinct rows, each repeated up to hundreds of times."""
    kinds = draw(st.lists(st.tuples(*VALUES.values()), min_size=1, max_size=4))
    rows = []
    for kind in kinds:
        rows += [(UNIT, *kind)] * draw(st.sampled_from([1, 2, 5, 60, 300]))
    return rows


# -- the queries ------------------------------------------------------------------------------

BOOLEAN_CONTEXTS = st.sampled_from(
    [
        "flag",
        "NOT flag",
        "flag AND age > 20",
        "flag OR spend > 10",
        "(CASE WHEN flag THEN 1 ELSE 0 END) = 1",
        "note",
        "region AND flag",
        "IF(flag, true, false)",
        "flag = 'true'",
        "region = 1",
        "note = 7",
        "age = '30'",
        # ORs whose branches test each column against constants (each column is then given a
        # filter of its own: dpsql.analyze.equalities), one with a term that raises on text.
        "(region = 'north' AND spend > 10) OR (region = 'south' AND spend < 5)",
        "(note = 7 AND age > 20) OR (note = 'x' AND age < 40)",
    ]
)
KEYS = st.sampled_from(
    [
        "region",
        "CASE WHEN age < 30 THEN 1 WHEN age < 50 THEN '1' ELSE '01' END",
        "CASE WHEN spend > 50 THEN 1.0 WHEN spend > 20 THEN 1 ELSE 2 END",
        "CASE WHEN flag THEN 'yes' ELSE 'no' END",
        "CASE WHEN age < 40 THEN 'a' WHEN age < 60 THEN 'A' END",
        "note",
        "flag",
        "month(day)",
        "date_trunc('month', day)",
        "upper(region)",
    ]
)
AGGREGATES = st.one_of(
    AGGREGATE,
    st.sampled_from(
        [
            "SUM(big)",
            "AVG(big)",
            "VAR_POP(big)",
            # A Bernstein vector (the Laplace's default for a variance; docs/privacy.md).
            "STDDEV_SAMP(spend)",
            "VAR_SAMP(CASE WHEN flag THEN age END)",
            "SUM(CASE WHEN flag THEN big ELSE 0 END)",
            "COUNT(CASE WHEN note THEN 1 END)",
            "SUM(LEAST(GREATEST(big * 4, -1e15), 1e15))",
            "MEDIAN(big)",
            "SUM(top)",
            "AVG(top)",
            "COUNT(age)",
            # Pair aggregates: the pairs' rows, products of centred values (docs/privacy.md).
            "COVAR_POP(spend, age)",
            "COVAR_SAMP(big, top)",
            "CORR(age, spend)",
            "REGR_SLOPE(spend, big)",
            "REGR_INTERCEPT(top, CASE WHEN flag THEN spend END)",
        ]
    ),
)
COLUMNS = "user_id, region, age, spend, note, flag, big, day, top"
COMMA_COLUMNS = ", ".join(f"v.{c}" for c in COLUMNS.split(", "))
FROM_CLAUSES = st.sampled_from(
    [
        "visits",
        "visits",
        "visits JOIN zones USING (region)",
        "visits v JOIN zones z ON v.region = z.region AND v.flag",
        "visits v LEFT JOIN zones z ON v.region = z.region AND NOT z.zone = 'N'",
        "visits SEMI JOIN zones USING (region)",
        f"(SELECT {COLUMNS} FROM visits WHERE flag) AS v",
        f"(SELECT {COLUMNS.replace('age', 'age * 80000000000000000000000000000000000 AS age')} "
        "FROM visits) AS v",
        "(SELECT user_id, region, SUM(age * 80000000000000000000000000000000000) AS age, "
        "AVG(spend) AS spend, MIN(note) AS note, MAX(flag) AS flag, SUM(big) AS big, "
        "MAX(day) AS day, MAX(top) AS top FROM visits GROUP BY user_id, region HAVING MAX(flag)) "
        "AS v",
        "(SELECT user_id, MIN(region) AS region, COUNT(*) * 9223372036854775807 AS age, "
        "SUM(spend) AS spend, MAX(note) AS note, MIN(flag) AS flag, AVG(big) AS big, "
        "MIN(day) AS day, MIN(top) AS top FROM visits GROUP BY user_id) AS v",
        "visits v JOIN (SELECT user_id AS u2, flag AS f2 FROM visits) w "
        "ON v.user_id = w.u2 AND w.f2",
        # A comma join whose key equality (left bare in the bounded WHERE), and a plain
        # equality of two text columns common to every OR branch, both of one unit's rows.
        f"(SELECT {COMMA_COLUMNS} FROM visits v, zones z WHERE v.region = z.region) AS v",
        f"(SELECT {COLUMNS} FROM visits WHERE note = region OR (flag AND note = region)) AS v",
        f"(SELECT {COMMA_COLUMNS} FROM visits v, visits w WHERE v.user_id = w.user_id "
        "AND w.flag) AS v",
    ]
)


@st.composite
def query(draw: st.DrawFn) -> str:
    keys = draw(st.lists(KEYS, max_size=2, unique=True))
    aggregates = draw(st.lists(AGGREGATES, min_size=1, max_size=3))
    items = [f"{k} AS k{i}" for i, k in enumerate(keys)] + aggregates
    sql = f"SELECT {', '.join(items)} FROM {draw(FROM_CLAUSES)}"
    where = draw(st.one_of(st.none(), BOOLEAN_CONTEXTS, PREDICATE, NUM_EXPR.map(str)))
    if where is not None:
        sql += f" WHERE {where}"
    if keys:
        sql += f" GROUP BY {', '.join(keys)}"
    options = []
    if draw(st.integers(0, 4)) == 0:
        # R <= L0 = 2 skips the ranking and the per-unit step (R <= C = 3); R = 4 keeps both.
        options.append(f"max_rows_per_unit = {draw(st.sampled_from([1, 2, 4, 8]))}")
    if keys and draw(st.integers(0, 3)) == 0:
        # Rows outside a public domain kept in one more group per key (a label may clash).
        options.append("other_group = true")
        label = draw(st.sampled_from([None, "zz", "-1", "north"]))
        if label is not None:
            options.append(f"other_label = '{label}'")
    if options:
        clause = f"OPTIONS({', '.join(options)})"
        sql = sql.replace("SELECT ", f"SELECT WITH DIFFERENTIAL_PRIVACY {clause} ", 1)
    if draw(st.integers(0, 5)) == 0:
        cte = "WITH w AS (SELECT * FROM visits WHERE note OR flag)"
        sql = f"{cte} {sql.replace(' FROM visits', ' FROM w', 1)}"
    return sql


# -- the check --------------------------------------------------------------------------------


def _key(row: Sequence[Any], n: int) -> tuple[str, ...]:
    return tuple(repr(v) for v in row[:n])


def _groups(plan: Plan, rows: list[tuple[Any, ...]]) -> dict[tuple[str, ...], tuple[Any, ...]]:
    n = len(plan.analysis.keys)
    groups = {_key(r, n): tuple(r[n:]) for r in rows}
    assert len(groups) == len(rows), "a group is released twice"
    return groups


def _check(plan: Plan, before: list[tuple[Any, ...]], after: list[tuple[Any, ...]]) -> None:
    d, d_prime = _groups(plan, before), _groups(plan, after)
    if plan.analysis.keys and all(k.public for k in plan.analysis.keys):
        assert d.keys() == d_prime.keys(), "the public key set changed"
        # Each domain, and one more value for a key with an other group (dpsql.other_group).
        sizes = [len(k.domain) + k.other for k in plan.analysis.keys if k.domain is not None]
        if len(sizes) == len(plan.analysis.keys):
            assert len(d) == math.prod(sizes)
    # One event per measurement (one per Bernstein vector of three), unless the query is on a
    # sample (one amplified event).
    tied = tied_parts([m.spec for m in plan.measurements])
    events = len(plan.measurements) - len(tied)
    assert plan.sample is not None or len(plan.event.events) == events
    for head in set(tied.values()):
        # A vector's three coordinates move together: per group by at most its per-group L1,
        # in at most L0 groups, by at most its sensitivity in all (dpsql.bound.values.bernstein).
        parts = [head, *(j for j, h in tied.items() if h == head)]
        m = plan.measurements[head]
        vector: dict[tuple[str, ...], int] = {}
        for group in d.keys() | d_prime.keys():
            old = d.get(group, (None,) * len(plan.measurements))
            new = d_prime.get(group, (None,) * len(plan.measurements))
            step = sum(abs(int(new[j] or 0) - int(old[j] or 0)) for j in parts)
            assert step <= m.per_group, (m.label, group, step, m.per_group)
            if step:
                vector[group] = step
        assert len(vector) <= m.groups and sum(vector.values()) <= m.sensitivity, m.label
    for j, m in enumerate(plan.measurements):
        moved: dict[tuple[str, ...], int] = {}
        for group in d.keys() | d_prime.keys():
            old = d.get(group, (None,) * len(plan.measurements))[j]
            new = d_prime.get(group, (None,) * len(plan.measurements))[j]
            if m.exponential:
                hist_old, hist_new = dict(old or {}), dict(new or {})
                change = sum(abs(hist_new.get(b, 0) - hist_old.get(b, 0))
                             for b in hist_old.keys() | hist_new.keys())  # fmt: skip
                assert change <= plan.max_rows, (m.label, group, change)
            else:
                change = int(new or 0) - int(old or 0)
                assert abs(change) <= m.per_group, (m.label, group, change, m.per_group)
            if change:
                moved[group] = change
        assert len(moved) <= m.groups, (m.label, len(moved), m.groups)
        if not m.exponential:
            assert sum(abs(c) for c in moved.values()) <= m.sensitivity, (m.label, moved)
            assert sum(c * c for c in moved.values()) <= m.groups * m.per_group**2, m.label


EXAMPLES = 1500 if LONG else 150


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sql=query(), unit=unit_rows())
def test_one_more_unit_moves_every_total_by_at_most_the_plan_sensitivity(
    base: Session, tmp_path_factory: pytest.TempPathFactory, sql: str, unit: list[tuple[Any, ...]]
) -> None:
    try:
        plan = base.plan(sql)
    except errors.DpsqlError as exc:
        assert not isinstance(exc, errors.EngineError | errors.InternalError), sql
        event(f"refused: {type(exc).__name__}")
        return
    event("checked")
    neighbour = Session(_policy(tmp_path_factory.mktemp("d"), [*BASE, *unit], "neighbour"))
    neighbour.engine.salt = base.engine.salt  # the same keyed hash picks every other unit's rows
    try:
        again = neighbour.plan(sql)
        assert again.engine_sql == plan.engine_sql  # planning reads no data
        _, before = base.engine.run(plan.engine_sql)  # EngineError: a data-dependent failure
        _, after = neighbour.engine.run(plan.engine_sql)
    finally:
        neighbour.close()
    _check(plan, before, after)


SAMPLE_EXAMPLES = 300 if LONG else 40


@settings(
    max_examples=SAMPLE_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sql=query(), unit=unit_rows())
def test_on_a_sample_one_more_unit_moves_every_total_by_at_most_the_plan_sensitivity(
    base: Session,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    sql: str,
    unit: list[tuple[Any, ...]],
) -> None:
    """The same neighbours on a unit-level sample (``sample_rate`` 1/2, so joins and subqueries
    are sampled too) with one secret for both runs: the sample keeps or drops each unit as a
    whole, before any bound, so the added unit moves every exact total by at most what the plan
    bounds, and no other unit's contribution moves (dpsql.analyze.sample)."""
    secret = "00112233445566778899aabbccddeeff"
    monkeypatch.setattr(duckdb_engine.secrets, "token_hex", lambda n: secret)
    try:
        plan = base.plan(sql, sample_rate="0.5")
    except errors.DpsqlError as exc:
        assert not isinstance(exc, errors.EngineError | errors.InternalError), sql
        event(f"refused: {type(exc).__name__}")
        return
    assert plan.sample is not None and "$sample" in plan.engine_sql
    event("checked")
    neighbour = Session(_policy(tmp_path_factory.mktemp("d"), [*BASE, *unit], "neighbour"))
    neighbour.engine.salt = base.engine.salt
    try:
        assert neighbour.plan(sql, sample_rate="0.5").engine_sql == plan.engine_sql
        _, before = base.engine.run(plan.engine_sql)
        _, after = neighbour.engine.run(plan.engine_sql)
    finally:
        neighbour.close()
    _check(plan, before, after)


# The constructs of the classes of the threat model that a data value could break, each on its
# own so that every run reaches them: text in boolean contexts (class 3), per-unit aggregates
# that overflow (class 3), CASE keys whose literals collide (class 2), sums beyond 2^53 grid
# units (class 8).
TARGETED = st.sampled_from(
    [
        "SELECT COUNT(*) FROM visits WHERE flag",
        "SELECT COUNT(*) FROM visits WHERE NOT note",
        "SELECT SUM(age) FROM visits WHERE flag AND spend > 1",
        "SELECT COUNT(CASE WHEN flag THEN 1 END) FROM visits",
        "SELECT COUNT(*) FROM visits v JOIN zones z ON v.region = z.region AND v.flag",
        "SELECT COUNT(*) FROM visits v LEFT JOIN zones z ON v.region = z.region AND z.zone "
        "AND v.note",
        "SELECT COUNT(*), SUM(age) FROM visits v, zones z WHERE v.region = z.region AND v.flag",
        "SELECT z.zone AS k, COUNT(*) FROM visits v, zones z WHERE v.region = z.region "
        "AND (v.note = v.region OR v.note = z.zone) GROUP BY z.zone",
        "SELECT COUNT(*) FROM visits WHERE note = region AND (flag OR note = region)",
        "SELECT COUNT(*), SUM(w.age) FROM visits v, visits w WHERE w.user_id = v.user_id "
        "AND v.note = w.region",
        "SELECT COUNT(age) FROM (SELECT user_id, SUM(age * 80000000000000000000000000000000000) "
        "AS age FROM visits GROUP BY user_id) AS v",
        "SELECT COUNT(big) FROM (SELECT user_id, AVG(big) * 4 AS big, SUM(big) AS s "
        "FROM visits GROUP BY user_id) AS v",
        "WITH p AS (SELECT user_id, region, SUM(top) AS t, COUNT(*) * 9223372036854775807 AS n "
        "FROM visits GROUP BY user_id, region HAVING MAX(flag)) SELECT COUNT(t), COUNT(n) FROM p",
        "SELECT CASE WHEN age < 30 THEN 1 WHEN age < 50 THEN '1' ELSE '01' END AS k, COUNT(*) "
        "FROM visits GROUP BY k",
        "SELECT CASE WHEN age < 40 THEN 'a' WHEN age < 60 THEN 'A' END AS k, SUM(top) "
        "FROM visits GROUP BY k",
        "SELECT SUM(top) FROM visits",
        "SELECT AVG(top), VAR_POP(top) FROM visits",
        "SELECT region, SUM(top) FROM visits GROUP BY region",
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(max_rows_per_unit = 5) SUM(top) FROM visits",
        "SELECT SUM(big) FROM visits WHERE flag",
        # Pinned cells: only the units whose keyed-hash-chosen region has the key are kept.
        "SELECT COUNT(*), SUM(top) FROM visits WHERE region = 'north'",
        "SELECT COUNT(*) FROM visits WHERE region = 'north' AND flag",
        "SELECT month(day) AS m, AVG(spend) FROM visits WHERE region = '' GROUP BY m",
        "SELECT COUNT(DISTINCT user_id) FROM visits WHERE region = 1",
        "SELECT flag, COUNT(*) FROM visits GROUP BY flag",
        # The other group: the unit's keys outside the domain join the ranking of its groups.
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(other_group = true) region, COUNT(*), "
        "SUM(top) FROM visits GROUP BY region",
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(other_group = true, max_rows_per_unit = 4) "
        "month(day) AS m, date_trunc('month', day) AS t, AVG(spend) FROM visits GROUP BY m, t",
    ]
)


@settings(
    max_examples=examples(100),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sql=TARGETED, unit=unit_rows())
def test_the_threat_model_constructs_hold_on_every_neighbour(
    base: Session, tmp_path_factory: pytest.TempPathFactory, sql: str, unit: list[tuple[Any, ...]]
) -> None:
    test_one_more_unit_moves_every_total_by_at_most_the_plan_sensitivity.hypothesis.inner_test(
        base, tmp_path_factory, sql, unit
    )


# Set operations in a FROM-subquery or CTE (dpsql.analyze.setops): UNION ALL of rows of one
# unit domain, and UNION, INTERSECT, EXCEPT whose branches carry the unit at one position.
SET_OPERATIONS = st.sampled_from(
    [
        "SELECT COUNT(*) FROM (SELECT region FROM visits UNION ALL "
        "SELECT region FROM visits WHERE age > 50)",
        "SELECT region, COUNT(*), SUM(s) FROM (SELECT region, spend AS s FROM visits UNION ALL "
        "SELECT region, age FROM visits WHERE flag) GROUP BY region",
        "SELECT COUNT(*) FROM (SELECT user_id, region FROM visits UNION "
        "SELECT user_id, region FROM visits WHERE spend > 10)",
        "SELECT COUNT(*), AVG(a) FROM (SELECT user_id, age AS a FROM visits EXCEPT "
        "SELECT user_id, age FROM visits WHERE flag)",
        "WITH x AS (SELECT user_id, note FROM visits INTERSECT SELECT user_id, note FROM visits "
        "WHERE NOT flag) SELECT COUNT(*) FROM x",
        "SELECT COUNT(DISTINCT user_id) FROM (SELECT user_id FROM visits WHERE age > 30 UNION "
        "ALL SELECT user_id FROM visits WHERE spend < 5)",
        "SELECT COUNT(*) FROM (SELECT user_id, big FROM visits UNION ALL (SELECT user_id, big "
        "FROM visits EXCEPT SELECT user_id, top FROM visits))",
        # Outer joins of two private relations on the unit: each row carries its side's unit.
        "SELECT COUNT(*), SUM(b.spend) FROM (SELECT * FROM visits WHERE age > 40) a "
        "FULL JOIN (SELECT * FROM visits WHERE flag) b ON a.user_id = b.user_id",
        "SELECT b.region, COUNT(*) FROM (SELECT * FROM visits WHERE spend > 50) a RIGHT JOIN "
        "visits b ON a.user_id = b.user_id GROUP BY b.region",
    ]
)


@settings(
    max_examples=examples(100),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sql=SET_OPERATIONS, unit=unit_rows())
def test_set_operations_hold_on_every_neighbour(
    base: Session, tmp_path_factory: pytest.TempPathFactory, sql: str, unit: list[tuple[Any, ...]]
) -> None:
    plan = base.plan(sql)  # every one is answered, none refused
    assert plan.measurements
    test_one_more_unit_moves_every_total_by_at_most_the_plan_sensitivity.hypothesis.inner_test(
        base, tmp_path_factory, sql, unit
    )


# -- every allow-listed function in every position ---------------------------------------------

# One neighbour for the sweep: a unit whose rows hold every extreme of VALUES, many times over.
HOSTILE_UNIT = [
    (UNIT, region, age, spend, note, flag, big, day, top)
    for region, age, spend, note, flag, big, day, top in [
        ("north", 2**31 - 1, math.inf, "true", "maybe", 2**63 - 1, dt.date(9999, 12, 31), TOP),
        ("", -(2**31), -math.inf, "", "", -(2**63), dt.date(1, 1, 1), -(2**63)),
        (None, 0, math.nan, "abc", "1", 2**53 + 1, None, None),
        ("west", None, 5e-324, None, None, None, dt.date(2026, 2, 1), 2**63 - 1),
        ("élan", 90, 1e308, "9" * 50, "TRUE ", 2**52, dt.date(2026, 5, 1), TOP - 2**19),
    ]
    for _ in range(40)
]
NUMBERS, TEXTS = ("age", "spend", "big", "top"), ("note", "flag", "region")
# Each position puts an expression {e} (numeric, or a predicate {p}) where the engine evaluates
# it on private rows.
NUMERIC_POSITIONS = (
    "SELECT COUNT(*) FROM visits WHERE ({e}) IS NOT NULL",
    "SELECT COUNT({e}) FROM visits",
    "SELECT SUM(LEAST(GREATEST({e}, -10), 10)) FROM visits",
    "SELECT {e} AS k, COUNT(*) FROM visits GROUP BY k",
    "SELECT COUNT(*) FROM visits v JOIN zones z ON v.region = z.region AND ({e}) > 0",
    "SELECT COUNT(w) FROM (SELECT user_id, {e} AS w FROM visits) AS v",
    "SELECT COUNT(w) FROM (SELECT user_id, SUM({e}) AS w FROM visits GROUP BY user_id) AS v",
    "WITH c AS (SELECT * FROM visits WHERE ({e}) < 5) SELECT COUNT(*) FROM c",
)
PREDICATE_POSITIONS = (
    "SELECT COUNT(*) FROM visits WHERE {p}",
    "SELECT COUNT(CASE WHEN {p} THEN 1 END) FROM visits",
    "SELECT CASE WHEN {p} THEN 'y' ELSE 'n' END AS k, COUNT(*) FROM visits GROUP BY k",
    "SELECT COUNT(*) FROM visits v JOIN zones z ON v.region = z.region AND {p}",
    "SELECT COUNT(u) FROM (SELECT user_id AS u FROM visits WHERE {p}) AS v",
    "SELECT COUNT(n) FROM (SELECT user_id, COUNT(*) AS n FROM visits GROUP BY user_id "
    "HAVING {p_agg}) AS v",
)


def _fill(template: str) -> list[str]:
    """The template over every numeric column as {x} (and {y}), every text column as {s}."""
    xs = NUMBERS if "{x}" in template else ("age",)
    ys = NUMBERS if "{y}" in template else ("age",)
    ss = TEXTS if "{s}" in template else ("note",)
    return sorted({template.format(x=x, y=y, s=s, t="day") for x in xs for y in ys for s in ss})


@pytest.fixture(scope="module")
def hostile(base: Session, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    folder = tmp_path_factory.mktemp("hostile")
    session = Session(_policy(folder, [*BASE, *HOSTILE_UNIT], "hostile"))
    session.engine.salt = base.engine.salt
    yield session
    session.close()


def _sweep(base: Session, hostile: Session, queries: list[str]) -> int:
    checked = 0
    for sql in queries:
        try:
            plan = base.plan(sql)
        except errors.DpsqlError as exc:
            assert not isinstance(exc, errors.EngineError | errors.InternalError), sql
            continue
        _, before = base.engine.run(plan.engine_sql)
        _, after = hostile.engine.run(plan.engine_sql)
        _check(plan, before, after)
        checked += 1
    return checked


@pytest.mark.parametrize("position", NUMERIC_POSITIONS)
def test_every_numeric_function_in_every_position(
    base: Session, hostile: Session, position: str
) -> None:
    templates = [t for t in NUMERIC_TEMPLATES if "{t}" not in t or "{e}" in position]
    queries = [position.format(e=e) for t in templates for e in _fill(t)[:3]]
    assert _sweep(base, hostile, queries) >= len(templates) // 2  # most of them plan


@pytest.mark.parametrize("position", PREDICATE_POSITIONS)
def test_every_predicate_in_every_position(base: Session, hostile: Session, position: str) -> None:
    queries = []
    for template in PREDICATE_TEMPLATES:
        for p in _fill(template)[:3]:
            # In a per-unit HAVING the predicate sees aggregates: MAX of each column.
            aggregated = p
            for column in (*NUMBERS, *TEXTS, "day"):
                aggregated = aggregated.replace(column, f"MAX({column})")
            queries.append(position.format(p=p, p_agg=aggregated))
    assert _sweep(base, hostile, queries) >= len(PREDICATE_TEMPLATES) // 2
