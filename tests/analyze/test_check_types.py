"""The pre-charge check takes public keys' types from the key domains, not from a DESCRIBE.

``dpsql.session.planning.check_soon`` skips the engine's DESCRIBE of the bounded SQL when every
GROUP BY key is public: each key then carries the type the engine gave its expression
(``engine_type``), and the post-processing is bound over those types before the charge. That is
right only if the bounded SQL releases each public key in exactly that type. These tests generate
grouped queries over every kind of public key (policy values of several column types, CASE keys
mixing literal types, date parts, truncated dates) and compare the types with the engine's own
DESCRIBE of the bounded SQL; a query with a private key still asks the engine.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from conftest import examples, write_parquet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpsql.errors import DpsqlError, UnsupportedQueryError
from dpsql.policy import load_policy
from dpsql.release.post import _TYPED
from dpsql.session.session import Session
from dpsql.sql.parse import parse_statement

SCHEMA = (
    ("user_id", "BIGINT"),
    ("region", "VARCHAR"),
    ("age", "INTEGER"),
    ("tier", "SMALLINT"),
    ("score", "DECIMAL(6,2)"),
    ("ok", "BOOLEAN"),
    ("day", "DATE"),
    ("at", "TIMESTAMP"),
)
ROWS = [
    (
        u,
        ("east", "west", "north")[u % 3],
        18 + u % 60,
        u % 4,
        round(u % 9 / 4, 2),
        u % 2 == 0,
        dt.date(2026, 1, 1) + dt.timedelta(days=u % 90),
        dt.datetime(2026, 1, 1) + dt.timedelta(hours=7 * u),
    )
    for u in range(1, 120)
]
CASE_BRANCHES = ("1", "'1'", "2.5", "'x'", "NULL", "CAST(3 AS SMALLINT)", "DATE '2026-01-02'")
PUBLIC_KEYS = (
    "region",
    "tier",
    "score",
    "ok",
    "MONTH(day)",
    "EXTRACT(dow FROM at)",
    "YEAR(day)",
    "DATE_TRUNC('month', day)",
    "DATE_TRUNC('day', at)",
    "QUARTER(at)",
    "HOUR(at)",
    "CASE WHEN age < 30 THEN 1 WHEN age < 50 THEN '1' ELSE '01' END",
    "CASE WHEN age < 30 THEN 2.5 WHEN age < 40 THEN NULL ELSE 1 END",
)


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("check_types")
    write_parquet(root / "visits.parquet", ROWS, SCHEMA)
    policy = load_policy(
        {
            "dataset": {"id": "check-types", "data_version": "1"},
            "data": {"tables": {"visits": "visits.parquet"}},
            "budget": {"diagnose": False, "epsilon": "100", "delta": "1e-6", "query_epsilon": "1"},
            "tables": {
                "visits": {
                    "privacy_unit": "user_id",
                    "max_groups_per_unit": 3,
                    "max_rows_per_unit_per_group": 5,
                    "columns": {
                        "region": {"public_values": ["east", "west", "north", "south"]},
                        "tier": {"public_values": [0, 1, 2, 3]},
                        "score": {"public_values": ["0.25", "1.50", "2"], "lower": 0, "upper": 3},
                        "ok": {"public_values": [True, False]},
                        "age": {"lower": 18, "upper": 90},
                        "day": {"date_range": [dt.date(2025, 12, 1), dt.date(2026, 4, 30)]},
                        "at": {"date_range": [dt.date(2026, 1, 1), dt.date(2026, 3, 31)]},
                    },
                }
            },
        },
        base_dir=root,
    )
    made = Session(policy)
    yield made
    made.close()


def _case(branches: list[str]) -> str:
    whens = " ".join(f"WHEN age < {20 + 7 * j} THEN {b}" for j, b in enumerate(branches[:-1]))
    return f"CASE {whens} ELSE {branches[-1]} END"


def _compare(session: Session, keys: list[str], measure: str) -> bool:
    names = [f"k{i}" for i in range(len(keys))]
    select = ", ".join(f"{k} AS {n}" for k, n in zip(keys, names, strict=True))
    sql = f"SELECT {select}, {measure} AS m FROM visits GROUP BY {', '.join(names)}"
    try:
        plan = session.plan(sql)
    except DpsqlError:
        return False  # refused before any charge (a key of no value, too many groups, ...)
    known = [key.engine_type for key in plan.analysis.keys]
    described = session.engine.check(plan.engine_sql)[: len(keys)]
    if all(known):
        assert known == described, sql
        return True
    return False


@pytest.mark.parametrize("key", PUBLIC_KEYS)
def test_each_public_key_is_released_in_its_domain_type(session: Session, key: str) -> None:
    assert _compare(session, [key], "COUNT(*)")


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    keys=st.lists(
        st.one_of(
            st.sampled_from(PUBLIC_KEYS),
            st.lists(st.sampled_from(CASE_BRANCHES), min_size=2, max_size=5).map(_case),
        ),
        min_size=1,
        max_size=2,
    ),
    measure=st.sampled_from(["COUNT(*)", "SUM(age)", "AVG(score)", "COUNT(DISTINCT user_id)"]),
)
def test_generated_public_keys_have_their_domain_types(
    session: Session, keys: list[str], measure: str
) -> None:
    _compare(session, keys, measure)


def test_only_a_private_key_asks_the_engine_for_types(session: Session) -> None:
    """``age // 10`` has no public domain: the check asks the engine's DESCRIBE for its type;
    a query whose keys are all public does not."""
    asked: list[bool] = []
    check = session.engine.check

    def recording(sql: str, types: bool = True) -> list[str]:
        asked.append(types)
        return check(sql, types)

    session.engine.check = recording  # type: ignore[method-assign]
    try:
        private = "SELECT age // 10 AS band, COUNT(*) AS n FROM visits GROUP BY band"
        plan = session.plan(private, delta=1e-7)
        assert plan.analysis.keys[0].engine_type is None
        # (Arithmetic takes them out of the grammar the engine is sure to plan, which is not
        # checked at all: tests/analyze/test_binds.py.)
        session.plan("SELECT region, SUM(age + 1) AS n FROM visits GROUP BY region")
        session.plan("SELECT COUNT(*) AS n FROM visits WHERE age + 1 > 20")
    finally:
        del session.engine.check
    assert asked == [True, False, False]


def test_the_post_processing_check_keeps_only_what_bound(session: Session) -> None:
    """Passed post-processing checks are kept by text; a refused one is refused every time,
    for free, and a kept one still lets a query of another WHERE through."""

    bad = "SELECT region, UPPER(COUNT(*)) AS n FROM visits WHERE age > {} GROUP BY region"
    for age in (20, 20, 30):
        with pytest.raises(UnsupportedQueryError, match="cannot be typed"):
            session.plan(bad.format(age))
    good = "SELECT region, COUNT(*) + 1 AS n FROM visits WHERE age > {} GROUP BY region"
    session.plan(good.format(20))
    kept = len(_TYPED)
    session.plan(good.format(30))
    assert len(_TYPED) == kept  # the same post-processing text: kept, not re-bound
    assert session.budget().queries == 0


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT region, COUNT(*) AS n FROM visits GROUP BY region",
        "SELECT DATE_TRUNC('month', day) AS m, SUM(age) AS s FROM visits GROUP BY m",
        "SELECT COUNT(*) AS n FROM visits WHERE CAST(at AS DATE) = DATE '5881580-07-10'",
        "SELECT COUNT(*) AS n FROM visits WHERE age > 30",
    ],
)
def test_the_check_in_the_engines_worker_is_the_check(session: Session, sql: str) -> None:
    """``check_soon`` (a second connection with the same views, in a worker thread) gives the
    same types, or refuses with the same error, as ``check``."""
    try:
        plan = session.plan(sql)
    except UnsupportedQueryError as refused:
        plan = session._prepare(parse_statement(sql).select, None, {})  # type: ignore[union-attr]
        with pytest.raises(UnsupportedQueryError) as late:
            session.engine.check_soon(plan.engine_sql)()
        assert str(late.value) == str(refused)
        return
    for types in (True, False):
        assert session.engine.check_soon(plan.engine_sql, types)() == session.engine.check(
            plan.engine_sql, types
        )


def test_a_bare_columns_type_from_the_catalog_is_describes(session: Session) -> None:
    """A public key that is a bare column of a table read directly takes its type from the
    engine's catalog instead of a DESCRIBE: the two agree for every column of the schema
    (BIGINT, VARCHAR, INTEGER, SMALLINT, DECIMAL, BOOLEAN, DATE, TIMESTAMP), and a key over a
    subquery still asks DESCRIBE."""
    for name, _ in SCHEMA:
        ((_, described),) = session.engine.describe(f'SELECT "{name}" AS _k FROM "visits"')
        assert session.engine.catalog["visits"][name] == described, name
    asked: list[str] = []
    describe = session.engine.describe

    def recording(sql: str) -> list[tuple[str, str]]:
        asked.append(sql)
        return describe(sql)

    session.engine.describe = recording  # type: ignore[method-assign]
    try:
        for key in ("region", "tier", "score", "ok", "REGION", "visits.tier"):
            plan = session.plan(f"SELECT {key} AS k, COUNT(*) AS n FROM visits GROUP BY k")
            ((_, described),) = describe(
                f'SELECT {plan.analysis.keys[0].expr.sql()} AS _k FROM "visits"'
            )
            assert plan.analysis.keys[0].engine_type == described
        assert not any("AS _k FROM" in sql for sql in asked)
        session.plan("SELECT region, COUNT(*) AS n FROM (SELECT * FROM visits) GROUP BY region")
        assert any("AS _k FROM (" in sql for sql in asked)
    finally:
        del session.engine.describe
