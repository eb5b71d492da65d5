"""The grammar of queries the engine is sure to plan (``dpsql.analyze.binds``).

For a query of the grammar, the session leaves out the engine's pre-charge check of the bounded
SQL. That is right only if the check would pass: here queries of the grammar are generated over
a table of every column type the grammar reads, under every bounding setting, and the engine's
own check (DESCRIBE and EXPLAIN) must pass on each. Queries outside it keep the check, and an
ill-typed query is still refused before any charge.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import examples, write_parquet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpsql.errors import DpsqlError, UnsupportedQueryError
from dpsql.policy import load_policy
from dpsql.session.session import Session
from dpsql.sql.parse import parse_statement

SCHEMA = (
    ("user_id", "BIGINT"),
    ("region", "VARCHAR"),
    ("tier", "TINYINT"),
    ("rank", "SMALLINT"),
    ("age", "INTEGER"),
    ("big", "BIGINT"),
    ("spend", "DOUBLE"),
    ("ratio", "REAL"),
    ("ok", "BOOLEAN"),
    ("score", "DECIMAL(6,2)"),
    ("day", "DATE"),
    ("at", "TIMESTAMP"),
)
NUMBERS = ("tier", "rank", "age", "big", "spend", "ratio")
ROWS = [
    (u, ("east", "west")[u % 2], u % 5, u % 300, 18 + u % 60, u * 10**12, u / 7, u / 3,
     u % 3 == 0, round(u % 9 / 4, 2), dt.date(2026, 1, 1) + dt.timedelta(days=u % 30),
     dt.datetime(2026, 1, 1) + dt.timedelta(hours=5 * u))
    for u in range(1, 60)
]  # fmt: skip
COLUMNS: dict[str, dict[str, Any]] = {
    "region": {"public_values": ["east", "west", "north", "é"]},
    "tier": {"public_values": [0, 1, 2, 3, 4], "lower": 0, "upper": 4},
    "ok": {"public_values": [True, False]},
    "rank": {"lower": 0, "upper": 300},
    "age": {"lower": 18, "upper": 90},
    "big": {"lower": -(10**15), "upper": 10**15},
    "spend": {"lower": -5, "upper": 200},
    "ratio": {"lower": 0, "upper": 20},
    "day": {"date_range": [dt.date(2025, 12, 1), dt.date(2026, 3, 31)]},
    "at": {"date_range": [dt.date(2026, 1, 1), dt.date(2026, 1, 31)]},
}


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    root = tmp_path_factory.mktemp("binds")
    write_parquet(root / "visits.parquet", ROWS, SCHEMA)
    policy = load_policy(
        {
            "dataset": {"id": "binds", "data_version": "1"},
            "data": {"tables": {"visits": "visits.parquet"}},
            "budget": {"diagnose": False, "epsilon": "1000", "delta": "1e-6", "query_epsilon": "1"},
            "tables": {
                "visits": {
                    "privacy_unit": "user_id",
                    "max_groups_per_unit": 3,
                    "max_rows_per_unit_per_group": 5,
                    "columns": COLUMNS,
                }
            },
        },
        base_dir=root,
    )
    with contextlib.closing(Session(policy)) as made:
        yield made


def _literal(column: str) -> st.SearchStrategy[str]:
    if column == "region":
        return st.text(max_size=6).map(lambda t: "'" + t.replace("'", "''") + "'")
    if column == "ok":
        return st.sampled_from(["TRUE", "FALSE"])
    numbers = st.integers(-(10**14), 10**14) | st.integers(-400, 400)
    decimals = st.floats(-1e14, 1e14, allow_nan=False).map(repr)
    return (numbers.map(str) | decimals).map(lambda t: t if not t.startswith("-") else f"-{t[1:]}")


@st.composite
def predicates(draw: st.DrawFn, depth: int = 0) -> str:
    column = draw(st.sampled_from([*NUMBERS, "region", "ok"]))
    kind = draw(st.integers(0, 6 if depth < 2 else 3))
    if kind == 0:
        op = draw(st.sampled_from(["=", "<>", "!=", "<", "<=", ">", ">="]))
        return f"{column} {op} {draw(_literal(column))}"
    if kind == 1:
        return f"{column} IS {draw(st.sampled_from(['', 'NOT ']))}NULL"
    if kind == 2:
        values = draw(st.lists(_literal(column), min_size=1, max_size=4))
        neg = draw(st.sampled_from(["", "NOT "]))
        return f"{column} {neg}IN ({', '.join(values)})"
    if kind == 3:
        return f"{column} BETWEEN {draw(_literal(column))} AND {draw(_literal(column))}"
    if kind == 4:
        return f"NOT ({draw(predicates(depth + 1))})"
    word = draw(st.sampled_from(["AND", "OR"]))
    return f"({draw(predicates(depth + 1))}) {word} ({draw(predicates(depth + 1))})"


AGGREGATES = [
    "COUNT(*)", "COUNT(spend)", "COUNT(DISTINCT user_id)", "SUM(age)", "SUM(spend)",
    "AVG(ratio)", "AVG(big)", "STDDEV(spend)", "VARIANCE(rank)", "SUM(tier)", "STDDEV_POP(age)",
    "VAR_POP(spend)",
]  # fmt: skip


TIME_KEYS = [
    "MONTH(day)", "YEAR(day)", "QUARTER(at)", "DAYOFWEEK(day)", "DAY(day)", "HOUR(at)",
    "DATE_TRUNC('month', day)", "DATE_TRUNC('day', at)", "DATE_TRUNC('hour', at)",
]  # fmt: skip


@st.composite
def case_keys(draw: st.DrawFn) -> str:
    texts = draw(st.booleans())
    value = (
        st.text(alphabet="ab'", max_size=3).map(lambda t: "'" + t.replace("'", "''") + "'")
        if texts
        else st.integers(-1000, 1000).map(str)
    )
    results = st.one_of(value, st.just("NULL")) if draw(st.booleans()) else value
    first = (draw(predicates(1)), draw(value))  # one result at least is not NULL
    branches = [first, *draw(st.lists(st.tuples(predicates(1), results), max_size=2))]
    whens = " ".join(f"WHEN {p} THEN {r}" for p, r in branches)
    default = draw(st.one_of(st.none(), value))
    tail = f" ELSE {default}" if default is not None else ""
    return f"CASE {whens}{tail} END"


@st.composite
def queries(draw: st.DrawFn) -> str:
    plain = st.sampled_from(["region", "tier", "ok", "v.region", *TIME_KEYS])
    keys = draw(st.lists(st.one_of(plain, case_keys()), max_size=2))
    keys = list(dict.fromkeys(k.removeprefix("v.") for k in keys))
    aggregates = draw(st.lists(st.sampled_from(AGGREGATES), min_size=1, max_size=3))
    names = [f"k{i}" for i in range(len(keys))]
    select = ", ".join(
        [*(f"{k} AS {n}" for k, n in zip(keys, names, strict=True))]
        + [f"{a} AS m{i}" for i, a in enumerate(aggregates)]
    )
    sql = f"SELECT {select} FROM visits AS v"
    if draw(st.booleans()):
        sql += f" WHERE {draw(predicates())}"
    if keys:
        by_alias = draw(st.booleans())
        sql += f" GROUP BY {', '.join(names if by_alias else keys)}"
    return sql


SETTINGS = st.fixed_dictionaries(
    {},
    optional={
        "max_groups_per_unit": st.sampled_from([1, 2, 8]),
        "max_rows_per_unit_per_group": st.sampled_from([1, 3, 10]),
        "max_rows_per_unit": st.sampled_from([1, 2, 4, 8]),
        "other_group": st.booleans(),
        "mechanism": st.sampled_from(["laplace", "gaussian"]),
        "split": st.sampled_from(["even", "optimal"]),
    },
)


@settings(
    max_examples=examples(250),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(sql=queries(), options=SETTINGS)
def test_every_query_of_the_grammar_passes_the_engines_check(
    session: Session, sql: str, options: dict[str, Any]
) -> None:
    statement = parse_statement(sql)
    try:
        plan = session.plan(sql, **options)
    except DpsqlError:
        return  # refused before any charge on other grounds (bounds, delta, ...)
    assert plan.binds, sql
    assert statement is not None
    # The engine's own check: binding, the optimizer's folds and the physical plan.
    types = session.engine.check(plan.engine_sql)
    known = [k.engine_type for k in plan.analysis.keys]
    assert [t for t in known] == types[: len(known)], sql


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT COUNT(*) FROM visits WHERE age = '30'",  # a text compared with a number
        "SELECT COUNT(*) FROM visits WHERE day > '2026-01-05'",  # a date from text
        "SELECT COUNT(*) FROM visits WHERE UPPER(region) = 'EAST'",  # a function
        "SELECT SUM(age + 1) FROM visits",  # arithmetic
        "SELECT SUM(score) FROM visits",  # DECIMAL: not in the grammar
        "SELECT COUNT(*) FROM visits WHERE tier > 1e300",  # a literal far out
        "SELECT region, COUNT(*) FROM (SELECT * FROM visits) GROUP BY region",  # a subquery
        "SELECT COUNT(*) FROM visits TABLESAMPLE BERNOULLI (50 PERCENT)",  # a sample
        "SELECT COUNT(*) FROM visits WHERE region = region",  # two columns
        "SELECT visits.region, COUNT(*) FROM visits AS v GROUP BY visits.region",  # not its name
        "SELECT CASE WHEN age < 30 THEN 1 ELSE 'x' END AS k, COUNT(*) FROM visits GROUP BY k",
        "SELECT CASE WHEN age < 30 THEN 1.5 ELSE 2 END AS k, COUNT(*) FROM visits GROUP BY k",
        "SELECT CASE region WHEN 'east' THEN 1 END AS k, COUNT(*) FROM visits GROUP BY k",
        "SELECT HOUR(day) AS h, COUNT(*) FROM visits GROUP BY h",  # a DATE's hour
        "SELECT MONTH(region) AS m, COUNT(*) FROM visits GROUP BY m",
    ],
)
def test_queries_outside_the_grammar_keep_the_check(session: Session, sql: str) -> None:
    try:
        plan = session.plan(sql)
    except DpsqlError:
        return
    assert not plan.binds


def test_an_ill_typed_query_is_still_refused_for_free(session: Session) -> None:
    before = session.budget().queries
    with pytest.raises(UnsupportedQueryError, match="type-check"):
        session.execute("SELECT COUNT(*) AS n FROM visits WHERE age > 20 AND region > 3")
    assert session.budget().queries == before


def test_the_check_is_left_out_only_for_the_grammar(session: Session) -> None:
    checked: list[str] = []
    check = session.engine.check

    def recording(sql: str, types: bool = True) -> list[str]:
        checked.append(sql)
        return check(sql, types)

    session.engine.check = recording  # type: ignore[method-assign]
    try:
        session.plan("SELECT region, COUNT(*) AS n FROM visits WHERE age > 30 GROUP BY region")
        assert checked == []
        session.plan("SELECT region, COUNT(*) AS n FROM visits WHERE age > 30 + 1 GROUP BY region")
        assert len(checked) == 1
    finally:
        del session.engine.check
