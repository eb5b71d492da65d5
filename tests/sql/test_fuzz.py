"""Fuzzing the proxy with generated SQL, valid and invalid (issue 6).

A small grammar produces SELECTs (aggregates over row expressions built from the allow-listed
operators and functions, WHERE, GROUP BY, HAVING, ORDER BY, LIMIT), then some are mangled with
garbage tokens, unknown functions and other statements; SET dpsql.* commands are mixed in.
Properties, for every statement:

- only a ``DpsqlError`` escapes, and never one that means a dpsql bug or a data-dependent
  failure (``EngineError``, ``InternalError``);
- no error message and no released cell carries a value planted in the data;
- a rejected statement charges nothing;
- an answered query is charged exactly its plan's epsilon, or served from the cache for free.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal

import duckdb
import pytest
from conftest import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpsql import errors
from dpsql.policy import load_policy
from dpsql.session.session import Session
from dpsql.session.settings import NAMES as SETTINGS

SECRET_REGION = "SECRET_REGION_Q7"
SECRET_SPEND = "987654.321"
SECRET_UNIT = "424242"
SECRET_NOTE = "SECRET_NOTE_K9"
SECRETS = (SECRET_REGION, SECRET_SPEND, "987654", SECRET_UNIT, SECRET_NOTE)


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    root = tmp_path_factory.mktemp("fuzz")
    path = root / "visits.parquet"
    con = duckdb.connect()
    # 600 rows, 60 units; unit 424242 (one row) holds every planted secret.
    con.execute(
        f"""COPY (
            SELECT (i % 60)::BIGINT AS user_id,
                   ['north', 'south', 'east'][1 + i % 3] AS region,
                   (18 + i % 60)::INTEGER AS age,
                   (i % 100)::DOUBLE AS spend,
                   (i % 7)::VARCHAR AS note,
                   DATE '2026-01-01' + (i % 30)::INTEGER AS day
            FROM range(600) r(i)
            UNION ALL
            SELECT {SECRET_UNIT}::BIGINT, '{SECRET_REGION}', 77::INTEGER,
                   {SECRET_SPEND}::DOUBLE, '{SECRET_NOTE}', DATE '2026-02-03'
        ) TO '{path}' (FORMAT parquet)"""
    )
    zones = root / "zones.parquet"
    con.execute(
        f"""COPY (SELECT * FROM (VALUES ('north', 'N'), ('north', 'N2'), ('south', 'S'),
            ('east', 'E'), ('{SECRET_REGION}', 'X')) v(region, zone))
            TO '{zones}' (FORMAT parquet)"""
    )
    con.close()
    policy = load_policy(
        {
            "dataset": {"id": "fuzz"},
            "data": {"tables": {"visits": str(path), "zones": str(zones)}},
            "budget": {
                "diagnose": False,
                "epsilon": "10000",
                "delta": "0.5",
                "query_epsilon": "1",
                "query_delta": "1e-9",
            },
            "tables": {
                "visits": {
                    "privacy_unit": "user_id",
                    "max_groups_per_unit": 2,
                    "max_rows_per_unit_per_group": 10,
                    "columns": {
                        "age": {"lower": 18, "upper": 90},
                        "spend": {"lower": 0, "upper": 200},
                        "region": {"public_values": ["north", "south", "east", "west"]},
                        "day": {"date_range": ["2026-01-01", "2026-03-31"]},
                    },
                },
                "zones": {"public": True},
            },
        },
        base_dir=root,
    )
    made = Session(policy)
    yield made
    made.close()


# -- the grammar -------------------------------------------------------------------------------

NUM_COLUMNS = st.sampled_from(["age", "spend", "user_id"])
STR_COLUMNS = st.sampled_from(["region", "note"])
INT_LITERALS = st.integers(-1000, 1000).map(str)
FLOAT_LITERALS = st.sampled_from(["0.5", "1e3", "-2.25", "0.0", "1e308", "'nan'::DOUBLE"])
STR_LITERALS = st.sampled_from(["'north'", "''", "'é漢'", "'%'", "'a_b'", "'x'"])
NUM_LEAVES = st.one_of(NUM_COLUMNS, INT_LITERALS, FLOAT_LITERALS, st.just("NULL"))
STR_LEAVES = st.one_of(STR_COLUMNS, STR_LITERALS)

UNARY_NUM = ["abs", "round", "floor", "ceil", "sign", "trunc", "ln", "log", "sqrt", "exp"]
BINARY_NUM = ["pow", "least", "greatest", "coalesce", "nullif", "round"]
BINARY_OPS = ["+", "-", "*", "/", "//", "%"]
COMPARISONS = ["=", "<>", "<", "<=", ">", ">="]
CASTS = ["INTEGER", "BIGINT", "DOUBLE", "SMALLINT", "VARCHAR"]


def _num(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(st.sampled_from(UNARY_NUM), children).map(lambda t: f"{t[0]}({t[1]})"),
        st.tuples(st.sampled_from(BINARY_NUM), children, children).map(
            lambda t: f"{t[0]}({t[1]}, {t[2]})"
        ),
        st.tuples(children, st.sampled_from(BINARY_OPS), children).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"
        ),
        children.map(lambda e: f"-({e})"),
        st.tuples(st.sampled_from(["CAST", "TRY_CAST"]), children, st.sampled_from(CASTS[:4])).map(
            lambda t: f"{t[0]}({t[1]} AS {t[2]})"
        ),
        st.tuples(children, children, children).map(
            lambda t: f"CASE WHEN {t[0]} > {t[1]} THEN {t[1]} ELSE {t[2]} END"
        ),
        STR_LEAVES.map(lambda s: f"length({s})"),
        st.sampled_from(["year", "month", "day", "dayofweek"]).map(lambda f: f"{f}(day)"),
        st.sampled_from(["YEAR", "MONTH", "DAY"]).map(lambda p: f"EXTRACT({p} FROM day)"),
    )


NUM_EXPR = st.recursive(NUM_LEAVES, _num, max_leaves=6)


def _predicate(num: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    atoms = st.one_of(
        st.tuples(num, st.sampled_from(COMPARISONS), num).map(lambda t: f"{t[0]} {t[1]} {t[2]}"),
        num.map(lambda e: f"{e} IS NULL"),
        num.map(lambda e: f"{e} IS NOT NULL"),
        st.tuples(num, num, num).map(lambda t: f"{t[0]} BETWEEN {t[1]} AND {t[2]}"),
        st.tuples(num, st.lists(INT_LITERALS, min_size=1, max_size=3)).map(
            lambda t: f"{t[0]} IN ({', '.join(t[1])})"
        ),
        st.tuples(STR_LEAVES, st.sampled_from(["LIKE", "ILIKE", "NOT LIKE"]), STR_LITERALS).map(
            lambda t: f"{t[0]} {t[1]} {t[2]}"
        ),
        st.tuples(st.sampled_from(["starts_with", "contains"]), STR_LEAVES, STR_LITERALS).map(
            lambda t: f"{t[0]}({t[1]}, {t[2]})"
        ),
        st.tuples(st.sampled_from(["lower", "upper", "trim"]), STR_LEAVES, STR_LITERALS).map(
            lambda t: f"{t[0]}({t[1]}) = {t[2]}"
        ),
        st.tuples(STR_LEAVES, STR_LEAVES).map(lambda t: f"({t[0]} || {t[1]}) <> ''"),
        st.tuples(STR_LEAVES, STR_LEAVES).map(lambda t: f"concat({t[0]}, {t[1]}) <> ''"),
        STR_LEAVES.map(lambda s: f"substring({s}, 1, 2) = 'no'"),
        st.sampled_from(["isnan", "isinf"]).map(lambda f: f"{f}(spend)"),
        st.sampled_from(["TRUE", "FALSE", "NULL"]),
    )
    return st.recursive(
        atoms,
        lambda p: st.one_of(
            st.tuples(p, st.sampled_from(["AND", "OR"]), p).map(
                lambda t: f"({t[0]} {t[1]} {t[2]})"
            ),
            p.map(lambda e: f"NOT ({e})"),
        ),
        max_leaves=3,
    )


PREDICATE = _predicate(st.recursive(NUM_LEAVES, _num, max_leaves=3))

AGGREGATE = st.one_of(
    st.just("COUNT(*)"),
    st.just("COUNT(DISTINCT user_id)"),
    st.tuples(st.sampled_from(["COUNT", "SUM", "AVG"]), NUM_COLUMNS).map(
        lambda t: f"{t[0]}({t[1]})"
    ),
    st.tuples(st.sampled_from(["COUNT", "SUM", "AVG"]), NUM_EXPR).map(lambda t: f"{t[0]}({t[1]})"),
    # explicitly clamped: the bounds come from LEAST/GREATEST
    st.tuples(
        st.sampled_from(["SUM", "AVG"]), NUM_EXPR, st.integers(-50, 0), st.integers(1, 50)
    ).map(lambda t: f"{t[0]}(LEAST(GREATEST({t[1]}, {t[2]}), {t[3]}))"),
    st.tuples(NUM_EXPR, st.sampled_from(["SUM", "COUNT"])).map(
        lambda t: f"{t[1]}(CASE WHEN {t[0]} > 0 THEN 1 ELSE 0 END)"
    ),
    # quantiles (the exponential mechanism) and COUNT(DISTINCT col)
    st.tuples(
        st.sampled_from(
            [
                "MEDIAN({})",
                "MIN({})",
                "MAX({})",
                "QUANTILE_CONT({}, 0.9)",
                "PERCENTILE_DISC(0.25) WITHIN GROUP (ORDER BY {})",
            ]
        ),
        st.one_of(NUM_COLUMNS, NUM_EXPR),
    ).map(lambda t: t[0].format(t[1])),
    st.sampled_from(["age", "region", "note", "day", "spend"]).map(
        lambda c: f"COUNT(DISTINCT {c})"
    ),
)

GROUP_KEYS = st.sampled_from(
    [
        "region",
        "CASE WHEN age < 30 THEN 'young' WHEN age < 60 THEN 'mid' ELSE 'old' END",
        "CASE WHEN spend > 50 THEN 1 ELSE 0 END",
        "note",
        "age",
        "day",
        "user_id",
        "upper(region)",
        "month(day)",
        "date_trunc('month', day)",
        "year(day)",
    ]
)
# Every FROM keeps the column names of visits, so the rest of the grammar applies unchanged.
FROM_CLAUSES = st.sampled_from(
    [
        "visits",
        "visits",
        "visits JOIN zones USING (region)",
        "visits LEFT JOIN zones USING (region)",
        "visits SEMI JOIN zones USING (region)",
        "visits ANTI JOIN zones USING (region)",
        "visits CROSS JOIN zones",
        "(SELECT * FROM visits WHERE spend > 3) AS v",
        "(SELECT user_id, region, age, spend * 2 AS spend, note, day FROM visits) AS v",
        "(SELECT user_id, region, COUNT(*) AS age, AVG(spend) AS spend, MIN(note) AS note, "
        "MAX(day) AS day FROM visits GROUP BY user_id, region) AS v",
        "visits v JOIN (SELECT user_id AS u2 FROM visits WHERE age > 30) w ON v.user_id = w.u2",
        "visits v JOIN zones z ON v.region = z.region AND z.zone <> 'N2'",
        "visits v JOIN zones z ON v.age > length(z.zone)",
        "visits v JOIN visits w ON v.age = w.age",
        "zones LEFT JOIN visits USING (region)",
    ]
)


@st.composite
def select(draw: st.DrawFn) -> str:
    keys = draw(st.lists(GROUP_KEYS, max_size=2, unique=True))
    aggregates = draw(st.lists(AGGREGATE, min_size=1, max_size=3))
    items = [f"{k} AS k{i}" for i, k in enumerate(keys)]
    items += [f"{a} AS a{i}" if draw(st.booleans()) else a for i, a in enumerate(aggregates)]
    sql = f"SELECT {', '.join(items)} FROM {draw(FROM_CLAUSES)}"
    if draw(st.booleans()):
        sql += f" WHERE {draw(PREDICATE)}"
    if keys:
        sql += f" GROUP BY {', '.join(keys)}"
        if draw(st.integers(0, 4)) == 0:
            sql += f" HAVING COUNT(*) > {draw(st.integers(0, 20))}"
    if draw(st.integers(0, 3)) == 0:
        sql += f" ORDER BY {draw(st.integers(1, len(items)))}"
        sql += draw(st.sampled_from(["", " DESC", " ASC"]))
    if draw(st.integers(0, 3)) == 0:
        sql += f" LIMIT {draw(st.integers(0, 10))}"
    if draw(st.integers(0, 4)) == 0:
        options = draw(st.sampled_from(["epsilon = 0.5", "max_groups_per_unit = 1", "bogus = 2"]))
        sql = sql.replace("SELECT ", f"SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS({options}) ", 1)
    if draw(st.integers(0, 5)) == 0:
        sql = f"WITH w AS (SELECT * FROM visits WHERE age > 20) {sql}".replace(
            " FROM visits", " FROM w", 1
        )
    return sql


GARBAGE = st.sampled_from(
    [
        "SELECT",
        "FROM",
        "WHERE",
        "GROUP BY",
        ")",
        "(",
        ",",
        ";",
        "'",
        '"',
        "--",
        "/*",
        "*",
        "UNION ALL SELECT 1",
        "JOIN visits v2 ON TRUE",
        "read_csv('/etc/passwd')",
        "random()",
        "now()",
        "my_udf(age)",
        "OVER ()",
        "$1",
        "?",
        "\x00",
        "é",
        "9" * 40,
        "DISTINCT",
        "LIMIT -1",
        "FILTER (WHERE TRUE)",
    ]
)

OTHER_STATEMENTS = st.sampled_from(
    [
        "DROP TABLE visits",
        "INSERT INTO visits VALUES (1, 'a', 2, 3.0, 'n', DATE '2026-01-01')",
        "DELETE FROM visits",
        "UPDATE visits SET age = 1",
        "COPY visits TO '/tmp/out.csv'",
        "PRAGMA database_list",
        "ATTACH 'x.db'",
        "CREATE TABLE t AS SELECT * FROM visits",
        "SELECT * FROM visits",
        "SELECT age FROM visits",
        "SELECT region, COUNT(*) FROM visits",
        "SELECT COUNT(*) FROM visits v JOIN visits w ON v.user_id = w.user_id",
        "WITH t AS (SELECT * FROM visits) SELECT COUNT(*) FROM t",
        "SELECT COUNT(*) FROM (SELECT * FROM visits)",
        "SELECT MAX(spend) FROM visits",
        "SELECT MEDIAN(age) FROM visits",
        "SELECT COUNT(*) FROM read_parquet('visits.parquet')",
        "SELECT COUNT(*) FROM main.visits",
        "SELECT COUNT(*) FROM nosuch",
        "SELECT COUNT(nosuch) FROM visits",
        "SELECT user_id, COUNT(*) FROM visits GROUP BY user_id",
        "SELECT COUNT(*) FROM visits; DROP TABLE visits",
        "EXPLAIN SELECT COUNT(*) FROM visits",
        "SHOW dpsql.all",
        "SHOW dpsql.budget",
        "SHOW dpsql.nosuch",
        "RESET dpsql.epsilon",
        "",
        "   ",
        "SELECT",
    ]
)

SET_STATEMENTS = st.tuples(
    st.sampled_from([*SETTINGS, "nosuch", "budget"]),
    st.sampled_from(["0.5", "2", "'0.25'", "0", "-1", "1e400", "'gaussian'", "'on'", "DEFAULT"]),
).map(lambda t: f"SET dpsql.{t[0]} = {t[1]}")


@st.composite
def mangled(draw: st.DrawFn) -> str:
    words = draw(select()).split(" ")
    for _ in range(draw(st.integers(1, 3))):
        position = draw(st.integers(0, len(words)))
        if draw(st.booleans()) and len(words) > 1:
            del words[min(position, len(words) - 1)]
        else:
            words.insert(position, draw(GARBAGE))
    return " ".join(words)


STATEMENTS = st.one_of(select(), select(), select(), mangled(), OTHER_STATEMENTS, SET_STATEMENTS)


def check_no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, (secret, text)


def check_no_secret_cell(cell: object) -> None:
    """A released number may hold any run of digits by chance (-23.174242424242426 is a noisy
    AVG): a number must not be a planted one, a text must not contain one."""
    if isinstance(cell, (int, float, Decimal)) and not isinstance(cell, bool):
        numbers = [Decimal(x) for x in SECRETS if x[0].isdigit()]
        assert all(cell != n and cell != float(n) for n in numbers), cell
        return
    check_no_secret(str(cell))


def run_one(session: Session, sql: str) -> None:
    for name in SETTINGS:  # every example starts from the policy defaults
        session.set_option(name, None)
    before = session.budget()
    try:
        result = session.execute(sql)
    except (errors.EngineError, errors.InternalError):
        raise  # data-dependent engine failure or an internal bug: never acceptable
    except errors.DpsqlError as exc:
        check_no_secret(str(exc))
        after = session.budget()
        assert after.queries == before.queries, sql
        assert after.epsilon_spent == before.epsilon_spent, sql
        assert after.delta_spent == before.delta_spent, sql
        return
    after = session.budget()
    for row in result.rows:
        for cell in row:
            check_no_secret_cell(cell)
    check_no_secret(result.message)
    if result.plan is None or result.columns == ("plan",):  # SET, SHOW, EXPLAIN: free
        assert after.queries == before.queries, sql
        assert after.epsilon_spent == before.epsilon_spent, sql
        return
    if result.cached_from is not None:
        assert result.charge is None
        assert after.queries == before.queries, sql
        assert after.epsilon_spent == before.epsilon_spent, sql
        return
    assert after.queries == before.queries + 1, sql
    assert after.epsilon_spent - before.epsilon_spent == result.plan.epsilon, sql
    assert after.delta_spent - before.delta_spent == result.plan.delta, sql


FUZZ = settings(
    max_examples=examples(350),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@FUZZ
@given(sql=STATEMENTS)
def test_generated_statements(session: Session, sql: str) -> None:
    run_one(session, sql)


@settings(FUZZ, max_examples=examples(40))
@given(sql=select())
def test_a_query_asked_twice_is_served_from_the_cache(session: Session, sql: str) -> None:
    run_one(session, sql)
    run_one(session, sql)  # answered again: from the cache at no cost, or charged exactly


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT COUNT(*) FROM visits WHERE region = 'SECRET_REGION_Q7'",
        "SELECT region AS k, COUNT(*) FROM visits GROUP BY region",
        "SELECT note AS k, COUNT(*) FROM visits GROUP BY note",
        "SELECT SUM(spend), AVG(spend) FROM visits WHERE spend > 900000",
        "SELECT COUNT(*) FROM visits WHERE CAST(region AS INTEGER) > 0",
        "SELECT COUNT(*) FROM visits WHERE CAST(note AS DATE) IS NULL",
        "SELECT COUNT(CAST(note AS INTEGER)) FROM visits",
    ],
)
def test_planted_values_stay_hidden(session: Session, sql: str) -> None:
    # These name or trip on the secret rows on purpose (the query text itself is checked
    # only where it does not quote a secret).
    before = session.budget()
    result = session.execute(sql, fresh=True)
    for row in result.rows:
        for cell in row:
            check_no_secret_cell(cell)
    assert session.budget().queries == before.queries + 1


@pytest.mark.parametrize(
    "sql",
    [
        # Found by the fuzzer: no group released (partition selection), then YEAR of the key.
        "SELECT day AS k0, year(day) AS k1, COUNT(DISTINCT user_id), COUNT(*) FROM visits "
        "WHERE age > 1000 GROUP BY day ORDER BY 4 DESC",
        "SELECT spend, ROUND(spend) + 1, COUNT(*) FROM visits WHERE age > 1000 GROUP BY spend",
    ],
)
def test_no_group_released_still_types_the_private_keys(session: Session, sql: str) -> None:
    """An empty released column has no type of its own; the keys are cast to the types the
    post-processing was checked in before the charge, so it binds after the charge too."""
    run_one(session, sql)
    result = session.execute(sql)
    assert result.rows == () and '"NULL"' not in result.types
