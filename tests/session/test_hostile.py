"""Hostile input: a typed error, no data value in any message, and nothing charged.

Every rejection is checked twice: through ``Session`` (the exact ``dpsql.errors`` class) and
through the DB-API (the PEP 249 class). The data holds planted secrets (a region, a spend, a
note and a unit id that occur in no query); none may appear in an error message, its formatted
traceback, an EXPLAIN plan or the bounded SQL.
"""

from __future__ import annotations

import contextlib
import traceback
from fractions import Fraction
from pathlib import Path
from typing import Any

import duckdb
import pytest
import sqlglot
from sqlglot import exp

import dpsql as dbapi
from dpsql import errors
from dpsql.policy import Policy, load_policy
from dpsql.session.session import Session
from dpsql.sql.parse import DIALECT, MAX_QUERY_LENGTH

SECRETS = ("SECRET_REGION_XYZ", "987654.321", "987654", "SECRET_NOTE_QRS", "424242")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hostile") / "visits.parquet"
    con = duckdb.connect()
    con.execute(
        f"""COPY (
            SELECT CASE WHEN i = 7 THEN 424242 ELSE i % 100 END::BIGINT AS user_id,
                   CASE WHEN i % 50 = 7 THEN 'SECRET_REGION_XYZ'
                        ELSE ['north', 'south'][1 + i % 2] END AS region,
                   (18 + i % 60)::INTEGER AS age,
                   CASE WHEN i % 50 = 3 THEN 987654.321 ELSE (i % 100)::DOUBLE END AS spend,
                   CASE WHEN i % 10 = 1 THEN 'SECRET_NOTE_QRS' ELSE (i % 9)::VARCHAR END AS note,
                   DATE '2026-01-01' + (i % 30)::INTEGER AS day
            FROM range(1000) r(i)) TO '{path}' (FORMAT parquet)"""
    )
    con.close()
    return path


def raw_policy(data: Path, **budget: str) -> dict[str, Any]:
    return {
        "dataset": {"id": "hostile"},
        "data": {"tables": {"visits": str(data)}},
        "budget": {
            "diagnose": False,
            "epsilon": "10",
            "delta": "1e-6",
            "query_epsilon": "0.5",
            "query_delta": "1e-8",
            **budget,
        },
        "tables": {
            "visits": {
                "privacy_unit": "user_id",
                "max_groups_per_unit": 2,
                "max_rows_per_unit_per_group": 10,
                "columns": {
                    "age": {"lower": 18, "upper": 90},
                    "spend": {"lower": 0, "upper": 200},
                },
            }
        },
    }


@pytest.fixture
def policy(data: Path) -> Policy:
    return load_policy(raw_policy(data), base_dir=data.parent)


@pytest.fixture
def session(policy: Policy) -> Any:
    s = Session(policy)
    yield s
    s.close()


@pytest.fixture
def conn(policy: Policy) -> Any:
    c = dbapi.connect(policy)
    yield c
    c.close()


def assert_no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{secret!r} leaked into {text!r}"


def assert_clean(exc: BaseException) -> None:
    """No secret in the message, the args or the formatted traceback (with its chain)."""
    assert_no_secret(str(exc))
    assert_no_secret(repr(exc.args))
    assert_no_secret("".join(traceback.format_exception(exc)))


def charged(s: Session) -> tuple[Fraction, Fraction, int]:
    report = s.budget()
    return report.epsilon_spent, report.delta_spent, report.queries


Q = "SELECT COUNT(*) FROM visits"
UNSUPPORTED = errors.UnsupportedQueryError
SCHEMA = errors.SchemaError
BOUNDS = errors.BoundsError
PARAM = errors.ParameterError
PARSE = errors.ParseError

# (statement, exact dpsql.errors class)
HOSTILE: list[tuple[str, type[errors.DpsqlError]]] = [
    # statements other than SELECT
    ("INSERT INTO visits VALUES (1, 'x', 20, 1.0, '1', DATE '2026-01-01')", UNSUPPORTED),
    ("INSERT INTO visits SELECT * FROM visits", UNSUPPORTED),
    ("UPDATE visits SET spend = 0", UNSUPPORTED),
    ("DELETE FROM visits", UNSUPPORTED),
    ("CREATE TABLE stolen AS SELECT * FROM visits", UNSUPPORTED),
    ("CREATE VIEW v AS SELECT * FROM visits", UNSUPPORTED),
    ("DROP TABLE visits", UNSUPPORTED),
    ("DROP VIEW visits", UNSUPPORTED),
    ("ALTER TABLE visits ADD COLUMN x INT", UNSUPPORTED),
    ("COPY visits TO '/tmp/stolen.csv'", UNSUPPORTED),
    ("COPY (SELECT * FROM visits) TO '/tmp/stolen.parquet' (FORMAT parquet)", UNSUPPORTED),
    ("ATTACH '/tmp/other.duckdb' AS other", UNSUPPORTED),
    ("DETACH other", UNSUPPORTED),
    ("PRAGMA show_tables", UNSUPPORTED),
    ("PRAGMA table_info('visits')", UNSUPPORTED),
    ("INSTALL httpfs", UNSUPPORTED),
    ("LOAD httpfs", UNSUPPORTED),
    ("CALL pragma_version()", UNSUPPORTED),
    ("DESCRIBE visits", UNSUPPORTED),
    ("SUMMARIZE visits", UNSUPPORTED),
    ("VACUUM", UNSUPPORTED),
    ("BEGIN TRANSACTION", UNSUPPORTED),
    ("SET threads = 1", UNSUPPORTED),
    ("SET enable_external_access = true", UNSUPPORTED),
    ("SET lock_configuration = false", UNSUPPORTED),
    ("SET GLOBAL allowed_paths = ['/etc']", UNSUPPORTED),
    ("RESET enable_external_access", UNSUPPORTED),
    ("SHOW TABLES", UNSUPPORTED),
    ("SHOW visits", UNSUPPORTED),
    # row-level output
    ("SELECT * FROM visits", UNSUPPORTED),
    ("SELECT visits.* FROM visits", UNSUPPORTED),
    ("SELECT *, COUNT(*) FROM visits", UNSUPPORTED),
    ("SELECT spend FROM visits", SCHEMA),
    ("SELECT region FROM visits", SCHEMA),
    ("SELECT user_id FROM visits", SCHEMA),
    ("SELECT user_id, COUNT(*) FROM visits", SCHEMA),
    ("SELECT COUNT(*), spend + 1 FROM visits", SCHEMA),
    ("SELECT region, COUNT(*) FROM visits GROUP BY region ORDER BY spend", SCHEMA),
    ("SELECT region, COUNT(*) FROM visits GROUP BY region HAVING spend > 1", SCHEMA),
    ("SELECT 1 FROM visits", UNSUPPORTED),
    ("SELECT DISTINCT region FROM visits", UNSUPPORTED),
    # the unit as a key
    ("SELECT user_id, COUNT(*) FROM visits GROUP BY user_id", SCHEMA),
    ("SELECT COUNT(*) FROM visits GROUP BY user_id", SCHEMA),
    ("SELECT user_id + 0 AS u, COUNT(*) FROM visits GROUP BY u", SCHEMA),
    ("SELECT user_id AS u, COUNT(*) FROM visits GROUP BY 1", SCHEMA),
    ("SELECT COUNT(*) FROM visits GROUP BY region, user_id % 1000", SCHEMA),
    # unknown objects and bounds
    ("SELECT COUNT(*) FROM nope", SCHEMA),
    ("SELECT COUNT(*) FROM information_schema.tables", UNSUPPORTED),
    ("SELECT COUNT(*) FROM duckdb_settings", SCHEMA),
    ("SELECT SUM(nope) FROM visits", SCHEMA),
    ("SELECT COUNT(*) FROM visits WHERE nope = 1", SCHEMA),
    ("SELECT COUNT(*) FROM visits v WHERE w.age > 1", SCHEMA),
    ("SELECT SUM(user_id) FROM visits", BOUNDS),
    ("SELECT AVG(user_id) FROM visits", BOUNDS),
    ("SELECT SUM(spend * user_id) FROM visits", BOUNDS),
    ("SELECT SUM(region) FROM visits", UNSUPPORTED),
    ("SELECT AVG(note) FROM visits", UNSUPPORTED),
    ("SELECT SUM(day) FROM visits", UNSUPPORTED),
    # other aggregates
    ("SELECT MAX(note) FROM visits", UNSUPPORTED),
    ("SELECT MIN(user_id) FROM visits", BOUNDS),
    ("SELECT MEDIAN(DISTINCT spend) FROM visits", UNSUPPORTED),
    ("SELECT MIN(spend, 3) FROM visits", UNSUPPORTED),
    ("SELECT COUNT(*) FROM visits NATURAL JOIN visits", UNSUPPORTED),
    ("SELECT QUANTILE_CONT(spend, 2) FROM visits", UNSUPPORTED),
    ("SELECT QUANTILE_CONT(spend, age) FROM visits", UNSUPPORTED),
    ("SELECT PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY spend DESC) FROM visits", UNSUPPORTED),
    ("SELECT MODE(spend) FROM visits", UNSUPPORTED),
    ("SELECT LIST(region) FROM visits", UNSUPPORTED),
    ("SELECT STRING_AGG(region, ',') FROM visits", UNSUPPORTED),
    ("SELECT ARG_MAX(region, spend) FROM visits", UNSUPPORTED),
    ("SELECT COUNT(DISTINCT region, age) FROM visits", UNSUPPORTED),
    ("SELECT SUM(DISTINCT spend) FROM visits", UNSUPPORTED),
    ("SELECT SUM(COUNT(*)) FROM visits", UNSUPPORTED),
    ("SELECT COUNT(*) FROM visits WHERE COUNT(*) > 1", UNSUPPORTED),
    # files and catalogs
    ("SELECT COUNT(*) FROM read_csv('/etc/passwd')", UNSUPPORTED),
    ("SELECT COUNT(*) FROM read_csv_auto('/etc/passwd')", UNSUPPORTED),
    ("SELECT COUNT(*) FROM read_parquet('visits.parquet')", UNSUPPORTED),
    ("SELECT COUNT(*) FROM read_json('/etc/passwd')", UNSUPPORTED),
    ("SELECT COUNT(*) FROM read_text('/etc/passwd')", UNSUPPORTED),
    ("SELECT COUNT(*) FROM glob('/etc/*')", UNSUPPORTED),
    ("SELECT COUNT(*) FROM 'file.parquet'", SCHEMA),
    ("SELECT COUNT(*) FROM '/etc/passwd'", SCHEMA),
    ("SELECT COUNT(*) FROM visits WHERE read_text('/etc/passwd') IS NULL", UNSUPPORTED),
    ("SELECT COUNT(*) FROM visits WHERE length(read_blob('/etc/passwd')) > 0", UNSUPPORTED),
    ("SELECT COUNT(*) FROM visits WHERE getenv('HOME') = 'x'", UNSUPPORTED),
    ("SELECT COUNT(*) FROM visits WHERE current_setting('threads') = 1", UNSUPPORTED),
    ("SELECT COUNT(*) FROM duckdb_tables()", UNSUPPORTED),
    ("SELECT COUNT(*) FROM main.visits", UNSUPPORTED),
    ("SELECT COUNT(*) FROM visits WHERE random() < 0.5", UNSUPPORTED),
    ("SELECT COUNT(*) FROM visits WHERE hash(user_id) % 2 = 0", UNSUPPORTED),
    # subqueries, joins, CTEs, set operations, windows
    ("SELECT COUNT(*) FROM (SELECT * FROM visits LIMIT 10)", UNSUPPORTED),
    ("SELECT COUNT(*) FROM (SELECT DISTINCT region FROM visits)", UNSUPPORTED),
    (
        "SELECT COUNT(*) FROM (SELECT region, COUNT(*) AS n FROM visits GROUP BY region)",
        UNSUPPORTED,
    ),
    ("SELECT SUM(n) FROM (SELECT user_id, COUNT(*) AS n FROM visits GROUP BY user_id)", BOUNDS),
    (
        "SELECT COUNT(*) FROM (SELECT user_id, MODE(spend) AS m FROM visits GROUP BY user_id)",
        UNSUPPORTED,
    ),
    ("SELECT COUNT(*) FROM (SELECT spend FROM visits ORDER BY spend)", UNSUPPORTED),
    ("SELECT COUNT(*) FROM visits WHERE age IN (SELECT age FROM visits)", UNSUPPORTED),
    ("SELECT COUNT(*) FROM visits WHERE EXISTS (SELECT 1 FROM visits)", UNSUPPORTED),
    ("SELECT (SELECT COUNT(*) FROM visits) FROM visits", UNSUPPORTED),
    ("SELECT COUNT(*) FROM visits a JOIN visits b ON a.age = b.age", UNSUPPORTED),
    ("SELECT COUNT(*) FROM visits a JOIN visits b ON a.user_id < b.user_id", UNSUPPORTED),
    ("SELECT COUNT(*) FROM visits a JOIN visits b ON a.user_id + 0 = b.user_id", UNSUPPORTED),
    # Outer joins of two private relations are allowed on their units only.
    ("SELECT COUNT(*) FROM visits a RIGHT JOIN visits b ON a.age = b.age", UNSUPPORTED),
    ("SELECT COUNT(*) FROM visits a FULL JOIN visits b ON a.user_id < b.user_id", UNSUPPORTED),
    (
        "SELECT COUNT(*) FROM visits a FULL JOIN visits b ON a.user_id = b.user_id "
        "JOIN visits c ON c.user_id = a.user_id",
        UNSUPPORTED,
    ),
    ("SELECT COUNT(*) FROM visits a RIGHT JOIN visits b USING (user_id)", UNSUPPORTED),
    ("SELECT COUNT(*) FROM visits a, visits b", UNSUPPORTED),
    ("SELECT COUNT(*) FROM visits a CROSS JOIN visits b", UNSUPPORTED),
    ("SELECT COUNT(*) FROM visits CROSS JOIN visits", SCHEMA),
    ("SELECT COUNT(*) FROM visits a JOIN visits b USING (age)", UNSUPPORTED),
    (
        "SELECT COUNT(*) FROM visits a JOIN visits b ON a.user_id = b.user_id WHERE user_id > 1",
        SCHEMA,
    ),
    ("SELECT COUNT(*) FROM visits a ASOF JOIN visits b ON a.user_id = b.user_id", UNSUPPORTED),
    ("WITH x AS (SELECT * FROM visits LIMIT 5) SELECT COUNT(*) FROM x", UNSUPPORTED),
    ("WITH RECURSIVE x AS (SELECT 1) SELECT COUNT(*) FROM visits", UNSUPPORTED),
    (f"{Q} UNION SELECT COUNT(*) FROM visits", UNSUPPORTED),
    (f"{Q} UNION ALL SELECT COUNT(*) FROM visits", UNSUPPORTED),
    (f"{Q} EXCEPT SELECT COUNT(*) FROM visits", UNSUPPORTED),
    (f"{Q} INTERSECT SELECT COUNT(*) FROM visits", UNSUPPORTED),
    ("SELECT COUNT(*) OVER () FROM visits", UNSUPPORTED),
    ("SELECT SUM(spend) OVER (PARTITION BY region) FROM visits", UNSUPPORTED),
    ("SELECT ROW_NUMBER() OVER (ORDER BY spend) FROM visits", UNSUPPORTED),
    ("SELECT COUNT(*) FROM visits QUALIFY ROW_NUMBER() OVER () = 1", UNSUPPORTED),
    ("SELECT COUNT(*) FROM visits USING SAMPLE 10", UNSUPPORTED),
    ("SELECT COUNT(*) FILTER (WHERE age > 1) FROM visits", UNSUPPORTED),
    ("SELECT COUNT(*) FROM visits LIMIT (SELECT 1)", UNSUPPORTED),
    # multiple statements and syntax errors
    (f"{Q}; {Q}", PARSE),
    (f"{Q}; DROP TABLE visits", PARSE),
    (f"{Q}; SET threads = 1", PARSE),
    ("SELECT COUNT(*) FROM visits WHERE (", PARSE),
    ("", PARSE),
    (";", PARSE),
    ("SELECT COUNT(*) FROM visits WHERE region = 'unterminated", PARSE),
    # settings
    ("SET dpsql.seed = 1", PARAM),
    ("SET dpsql.nope = 1", PARAM),
    ("SET dpsql.epsilon = 0", PARAM),
    ("SET dpsql.epsilon = -1", PARAM),
    ("SET dpsql.epsilon = 21", PARAM),
    ("SET dpsql.epsilon = 'nan'", PARAM),
    ("SET dpsql.epsilon = 'inf'", PARAM),
    ("SET dpsql.epsilon = 'abc'", PARAM),
    ("SET dpsql.delta = 1", PARAM),
    ("SET dpsql.delta = -0.5", PARAM),
    ("SET dpsql.max_groups_per_unit = 0", PARAM),
    ("SET dpsql.max_rows_per_unit_per_group = 1.5", PARAM),
    ("SET dpsql.confidence = 1", PARAM),
    ("SHOW dpsql.nope", PARAM),
    ("RESET dpsql.nope", PARAM),
    ("SET dpsql.epsilon = 0.1, 0.2", PARSE),
]

# PEP 249 class for each dpsql class.
PEP249: dict[type[errors.DpsqlError], tuple[type[Exception], type[Exception]]] = {
    UNSUPPORTED: (dbapi.UnsupportedQuery, dbapi.NotSupportedError),
    SCHEMA: (dbapi.UnknownObjectError, dbapi.ProgrammingError),
    BOUNDS: (dbapi.MissingBoundsError, dbapi.ProgrammingError),
    PARAM: (dbapi.InvalidParameterError, dbapi.ProgrammingError),
    PARSE: (dbapi.QuerySyntaxError, dbapi.ProgrammingError),
}

CASES = HOSTILE


@pytest.mark.parametrize(("sql", "expected"), CASES, ids=[sql[:60] for sql, _ in CASES])
def test_hostile_statement_is_rejected_typed_clean_and_free(
    session: Session, conn: dbapi.Connection, sql: str, expected: type[errors.DpsqlError]
) -> None:
    before = charged(session)
    with pytest.raises(errors.DpsqlError) as info:
        session.execute(sql)
    assert type(info.value) is expected, f"{type(info.value).__name__}: {info.value}"
    assert_clean(info.value)
    assert charged(session) == before == (0, 0, 0)

    # EXPLAIN of the same statement (where EXPLAIN applies) is rejected the same way.
    if sql.upper().startswith("SELECT"):
        with pytest.raises(expected) as explained:
            session.execute("EXPLAIN " + sql)
        assert_clean(explained.value)

    specific, general = PEP249[expected]
    cursor = conn.cursor()
    with pytest.raises(general) as pep:
        cursor.execute(sql)
    assert type(pep.value) is specific
    assert isinstance(pep.value, expected)
    assert isinstance(pep.value, dbapi.DatabaseError)
    assert_clean(pep.value)
    assert conn.budget().epsilon_spent == 0
    assert conn.budget().queries == 0
    assert cursor.description is None  # no stale result from a rejected statement


def test_rejected_statement_clears_the_previous_result(conn: dbapi.Connection) -> None:
    cursor = conn.cursor()
    cursor.execute(Q)
    with pytest.raises(dbapi.NotSupportedError):
        cursor.execute("SELECT * FROM visits")
    with pytest.raises(dbapi.ProgrammingError):
        cursor.fetchall()


def test_private_key_group_by_with_delta_zero(data: Path) -> None:
    sql = "SELECT region, COUNT(*) FROM visits GROUP BY region"
    zero = load_policy(raw_policy(data, delta="0", query_delta="0"), base_dir=data.parent)
    s = Session(zero)
    with pytest.raises(errors.ParameterError) as info:
        s.execute(sql)
    assert type(info.value) is errors.ParameterError
    assert_clean(info.value)
    assert charged(s) == (0, 0, 0)
    with pytest.raises(dbapi.InvalidParameterError):
        dbapi.connect(zero).cursor().execute(sql)
    # With a positive budget delta, a query may not set its own delta to zero either.
    s = Session(load_policy(raw_policy(data), base_dir=data.parent))
    with pytest.raises(errors.ParameterError):
        s.execute(sql, delta=0)
    assert charged(s) == (0, 0, 0)
    s.execute(sql)  # the default query delta works
    assert charged(s)[2] == 1


# -- privacy parameters ----------------------------------------------------------------------

BAD_EPSILONS: list[object] = [
    0,
    0.0,
    -1,
    "-0.5",
    float("nan"),
    float("inf"),
    float("-inf"),
    "nan",
    "inf",
    1e400,
    21,
    "20.000001",
    10**100,
    True,
    False,
    "abc",
    "",
    "1/0",
    [0.1],
    object(),
]


@pytest.mark.parametrize("epsilon", BAD_EPSILONS, ids=[repr(e)[:20] for e in BAD_EPSILONS])
def test_bad_epsilon_is_rejected(session: Session, conn: dbapi.Connection, epsilon: object) -> None:
    with pytest.raises(errors.ParameterError) as info:
        session.execute(Q, epsilon=epsilon)
    assert type(info.value) is errors.ParameterError
    assert_clean(info.value)
    with pytest.raises(dbapi.InvalidParameterError):
        conn.cursor().execute(Q, epsilon=epsilon)
    with pytest.raises(dbapi.InvalidParameterError):
        conn.set("epsilon", epsilon)
    assert charged(session) == (0, 0, 0)
    assert conn.budget().queries == 0


def test_epsilon_at_the_cap_is_accepted(session: Session) -> None:
    assert session.plan(Q, epsilon=20).epsilon == 20
    assert session.plan(Q, epsilon="1e-9").epsilon == Fraction(1, 10**9)


BAD_DELTAS: list[object] = [-0.1, "-1e-9", 1, 1.0, 1.5, float("nan"), float("inf"), "x", True]


@pytest.mark.parametrize("delta", BAD_DELTAS, ids=[repr(d) for d in BAD_DELTAS])
def test_bad_delta_is_rejected(session: Session, conn: dbapi.Connection, delta: object) -> None:
    sql = "SELECT region, COUNT(*) FROM visits GROUP BY region"
    with pytest.raises(errors.ParameterError) as info:
        session.execute(sql, delta=delta)
    assert type(info.value) is errors.ParameterError
    with pytest.raises(dbapi.InvalidParameterError):
        conn.cursor().execute(sql, delta=delta)
    assert charged(session) == (0, 0, 0)


@pytest.mark.parametrize(
    "options",
    [
        {"seed": 1},
        {"random_state": 1},
        {"max_groups_per_unit": 0},
        {"max_groups_per_unit": True},
        {"max_rows_per_unit_per_group": 10**9},
        {"max_rows_per_unit_per_group": "2.5"},
        {"confidence": 1.5},
        {"confidence": "x"},
    ],
)
def test_bad_options_are_rejected(session: Session, options: dict[str, object]) -> None:
    with pytest.raises(errors.ParameterError):
        session.execute(Q, **options)
    assert charged(session) == (0, 0, 0)


# -- query parameters ------------------------------------------------------------------------

INJECTIONS = [
    "x' OR 1=1 --",
    "'; DROP TABLE visits; --",
    "north' UNION SELECT * FROM visits --",
    "\\'; SELECT 1; --",
    "north\x00'",
    '" OR ""="',
]


@pytest.mark.parametrize("payload", INJECTIONS)
def test_injection_through_parameters_is_one_literal(session: Session, payload: str) -> None:
    sql = "SELECT COUNT(*) FROM visits WHERE region = ?"
    plan = session.plan(sql, [payload])
    assert charged(session) == (0, 0, 0)
    tree = sqlglot.parse_one(plan.bounded_sql, read=DIALECT)
    literals = [lit.this for lit in tree.find_all(exp.Literal) if lit.is_string]
    assert payload in literals  # the whole payload, as one string literal
    assert not list(tree.find_all(exp.Drop, exp.Union))
    (where,) = [w for w in tree.find_all(exp.Where) if "region" in w.sql()]
    assert not list(where.find_all(exp.Or))
    # It runs, is charged normally, and its exact bounded totals equal a non-matching literal's.
    control = session.plan(sql, ["no such region"])
    assert (
        session.engine.run(plan.bounded.sql(dialect=DIALECT))[1]
        == session.engine.run(control.bounded.sql(dialect=DIALECT))[1]
    )
    result = session.execute(sql, [payload])
    assert len(result.rows) == 1
    assert charged(session)[0] == Fraction(1, 2)


def test_parameter_in_select_list_and_group_by_stays_a_literal(session: Session) -> None:
    plan = session.plan("SELECT COUNT(*) FROM visits WHERE note <> ?", ["' OR '1'='1"])
    assert "' OR '1'='1" in [
        lit.this for lit in plan.bounded.find_all(exp.Literal) if lit.is_string
    ]


@pytest.mark.parametrize(
    ("sql", "params"),
    [
        ("SELECT COUNT(*) FROM visits WHERE region = ?", []),
        ("SELECT COUNT(*) FROM visits WHERE region = ?", None),
        ("SELECT COUNT(*) FROM visits WHERE region = ?", ["a", "b"]),
        ("SELECT COUNT(*) FROM visits WHERE age > ? AND age < ?", [1]),
        ("SELECT COUNT(*) FROM visits", ["a"]),
        ("SELECT COUNT(*) FROM visits WHERE region = ?", "north"),
        ("SELECT COUNT(*) FROM visits WHERE region = ?", {"a": 1}),
        ("SELECT COUNT(*) FROM visits WHERE region = ?", [b"bytes"]),
        ("SELECT COUNT(*) FROM visits WHERE age > ?", [float("nan")]),
        ("SELECT COUNT(*) FROM visits WHERE age > ?", [float("inf")]),
        ("SELECT COUNT(*) FROM visits WHERE region = $1", ["north"]),
        ("SELECT COUNT(*) FROM visits WHERE region = :name", ["north"]),
        ("SET dpsql.epsilon = 0.1", [1]),
    ],
)
def test_bad_parameters_are_rejected(
    session: Session, conn: dbapi.Connection, sql: str, params: Any
) -> None:
    with pytest.raises((errors.ParameterError, errors.UnsupportedQueryError, errors.ParseError)):
        session.execute(sql, params)
    with pytest.raises(dbapi.ProgrammingError if "$" not in sql else dbapi.DatabaseError):
        conn.cursor().execute(sql, params)
    assert charged(session) == (0, 0, 0)
    assert conn.budget().queries == 0


def test_wrong_parameter_count_is_a_parameter_error(session: Session) -> None:
    with pytest.raises(errors.ParameterError) as info:
        session.execute("SELECT COUNT(*) FROM visits WHERE region = ? AND age > ?", ["north"])
    assert type(info.value) is errors.ParameterError
    assert "2" in str(info.value) and "1" in str(info.value)


# -- size limits -----------------------------------------------------------------------------


def test_very_long_query_text_is_rejected(session: Session, conn: dbapi.Connection) -> None:
    padding = " OR age = 1" * (MAX_QUERY_LENGTH // 10)
    sql = f"SELECT COUNT(*) FROM visits WHERE age = 0{padding}"
    assert len(sql) > MAX_QUERY_LENGTH
    with pytest.raises(errors.ParseError):
        session.execute(sql)
    with pytest.raises(dbapi.QuerySyntaxError):
        conn.cursor().execute(sql)
    assert charged(session) == (0, 0, 0)


@pytest.mark.parametrize("depth", [40, 60, 3000])
def test_deeply_nested_query_fails_typed_or_answers(
    session: Session, conn: dbapi.Connection, depth: int
) -> None:
    # A parser's RecursionError must become a typed error, not escape as a Python crash.
    sql = "SELECT COUNT(*) FROM visits WHERE " + "(" * depth + "age > 1" + ")" * depth
    try:
        session.execute(sql)
    except errors.QueryError:
        assert charged(session) == (0, 0, 0)
    else:
        assert charged(session)[2] == 1
    with contextlib.suppress(dbapi.ProgrammingError, dbapi.NotSupportedError):
        conn.cursor().execute(sql)


def test_non_string_query_is_a_parse_error(session: Session) -> None:
    with pytest.raises(errors.ParseError):
        session.execute(b"SELECT COUNT(*) FROM visits")  # type: ignore[arg-type]
    with pytest.raises(errors.ParseError):
        session.execute(None)  # type: ignore[arg-type]


# -- budget ----------------------------------------------------------------------------------


def test_budget_exceeded_charges_nothing_and_smaller_queries_still_work(data: Path) -> None:
    policy = load_policy(raw_policy(data, epsilon="1"), base_dir=data.parent)
    s = Session(policy)
    s.execute(Q, epsilon="0.75")
    assert charged(s) == (Fraction(3, 4), 0, 1)
    with pytest.raises(errors.BudgetExceededError) as info:
        s.execute("SELECT SUM(spend) FROM visits", epsilon="0.5")
    assert type(info.value) is errors.BudgetExceededError
    assert_clean(info.value)
    assert charged(s) == (Fraction(3, 4), 0, 1)
    assert len(s.filter.charges) == 1
    result = s.execute("SELECT SUM(spend) FROM visits", epsilon="0.25")
    assert len(result.rows) == 1
    assert charged(s) == (1, 0, 2)
    with pytest.raises(errors.BudgetExceededError):
        s.execute(Q, epsilon="1e-9", fresh=True)  # not answered from the first release
    assert charged(s) == (1, 0, 2)
    # Through the DB-API: an OperationalError and a dpsql BudgetExceededError.
    conn = dbapi.connect(policy)
    conn.cursor().execute(Q, epsilon="0.9")
    with pytest.raises(dbapi.OperationalError) as pep:
        conn.cursor().execute(Q, epsilon="0.2", fresh=True)
    assert type(pep.value) is dbapi.BudgetExceededError
    assert isinstance(pep.value, errors.BudgetExceededError)
    assert conn.budget().epsilon_spent == Fraction(9, 10)
    conn.cursor().execute(Q, epsilon="0.1", fresh=True)
    assert conn.budget().epsilon_spent == 1


def test_delta_budget_exceeded(data: Path) -> None:
    policy = load_policy(raw_policy(data, delta="1e-8", query_delta="1e-8"), base_dir=data.parent)
    s = Session(policy)
    sql = "SELECT region, COUNT(*) FROM visits GROUP BY region"
    s.execute(sql)
    with pytest.raises(errors.BudgetExceededError):
        s.execute(sql, fresh=True)  # a plain repeat is served from the cache, at no cost
    assert charged(s) == (Fraction(1, 2), Fraction(1, 10**8), 1)
    s.execute(Q)  # no delta needed
    assert charged(s)[2] == 2


# -- no secret in plans or answers' metadata --------------------------------------------------

VALID = [
    Q,
    "SELECT SUM(spend), AVG(spend), COUNT(spend) FROM visits",
    "SELECT region, COUNT(*), SUM(spend) FROM visits GROUP BY region",
    "SELECT note, AVG(age) FROM visits WHERE CAST(note AS INT) > 2 GROUP BY note",
    "SELECT COUNT(DISTINCT user_id) FROM visits WHERE spend > 500",
]


@pytest.mark.parametrize("sql", VALID)
def test_explain_and_bounded_sql_hold_no_data(session: Session, sql: str) -> None:
    result = session.execute("EXPLAIN " + sql)
    text = "\n".join(row[0] for row in result.rows)
    assert text
    assert_no_secret(text)
    assert result.plan is not None
    assert_no_secret(result.plan.bounded_sql)
    assert charged(session) == (0, 0, 0)
    answer = session.execute(sql)
    assert_no_secret(repr(answer.columns) + repr(answer.types))
    # A private-key group is released only through partition selection; a planted key held by
    # two units never survives it at any sane budget.
    assert all("SECRET" not in str(cell) for row in answer.rows for cell in row)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT COUNT(*), SUM(1e308) FROM visits",  # found by the fuzzer: charged, then unsamplable
        "SELECT SUM(spend * 1e20) FROM visits",
    ],
)
def test_extreme_bounds_are_refused_before_any_charge(session: Session, sql: str) -> None:
    with pytest.raises(errors.BoundsError):
        session.execute(sql)
    assert charged(session) == (0, 0, 0)


def test_unsamplable_noise_is_refused_before_any_charge(session: Session) -> None:
    # Bounds within ±2**52 but contribution limits so large that the noise scale passes the
    # exact sampler's limit.
    with pytest.raises(errors.BoundsError):
        session.execute(
            "SELECT SUM(LEAST(GREATEST(spend, 0), 4e15)) FROM visits",
            max_rows_per_unit_per_group=1_000_000,
            epsilon="0.0000000001",
        )
    assert charged(session) == (0, 0, 0)


@pytest.mark.parametrize(
    "sql",
    [
        # b.user_id equals the unit on every row of an inner join on the unit
        "SELECT b.user_id, COUNT(*) FROM visits a JOIN visits b ON a.user_id = b.user_id "
        "GROUP BY 1",
        "SELECT COUNT(*) FROM (SELECT age AS _dpsql_unit FROM visits)",
    ],
)
def test_unit_aliases_and_reserved_names_are_refused(session: Session, sql: str) -> None:
    before = charged(session)
    with pytest.raises(errors.SchemaError):
        session.execute(sql)
    assert charged(session) == before
