"""No data-dependent errors (DESIGN.md section 5): whether a query fails depends only on the
query and the policy. Each query runs on a data set with rows that make DuckDB raise (bad
casts, overflow, division by zero, NaN and infinities) and on the same data without them; both
must answer. Engine error text, which quotes data values, never reaches the user.
"""

from __future__ import annotations

from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import duckdb
import pytest

import dpsql as dbapi
from dpsql import errors
from dpsql.policy import Policy, load_policy
from dpsql.session.session import Session
from dpsql.sql.parse import DIALECT

SECRET = "SECRET_VALUE_31337"

# 300 ordinary rows (30 units of 10 rows), then rows that trip the engine.
CLEAN = """SELECT (i % 30)::BIGINT AS user_id, (i % 9)::VARCHAR AS note,
    (18 + i % 60)::INTEGER AS age, (i * 1000)::BIGINT AS big,
    (i % 100)::DOUBLE AS spend, (i % 5)::INTEGER AS small
    FROM range(300) r(i)"""
TRIGGERS = f"""SELECT * FROM (VALUES
    (1001::BIGINT, '{SECRET}', 2147483647::INTEGER, 9223372036854775807::BIGINT,
        'nan'::DOUBLE, 0::INTEGER),
    (1002::BIGINT, 'abc', 2147483646::INTEGER, (-9223372036854775807 - 1)::BIGINT,
        'inf'::DOUBLE, 0::INTEGER),
    (1003::BIGINT, '', 2147483647::INTEGER, 9223372036854775806::BIGINT,
        '-inf'::DOUBLE, 0::INTEGER),
    (1004::BIGINT, '99999999999', 2147483647::INTEGER, 9223372036854775807::BIGINT,
        'nan'::DOUBLE, 0::INTEGER)
    ) v(user_id, note, age, big, spend, small)"""


def make_policy(path: Path, with_triggers: bool) -> Policy:
    con = duckdb.connect()
    body = f"{CLEAN} UNION ALL {TRIGGERS}" if with_triggers else CLEAN
    con.execute(f"COPY ({body}) TO '{path}' (FORMAT parquet)")
    con.close()
    return load_policy(
        {
            "dataset": {"id": "totality"},
            "data": {"tables": {"visits": str(path)}},
            "budget": {
                "diagnose": False,
                "epsilon": "1000",
                "delta": "1e-3",
                "query_epsilon": "1",
                "query_delta": "1e-6",
            },
            "tables": {
                "visits": {
                    "privacy_unit": "user_id",
                    "max_groups_per_unit": 2,
                    "max_rows_per_unit_per_group": 10,
                    "columns": {
                        "age": {"lower": 18, "upper": 2147483647},
                        "spend": {"lower": 0, "upper": 200},
                        "big": {"lower": -10, "upper": 10},
                        "small": {"lower": 0, "upper": 10},
                        "note": {"public_values": ["1", "2", "abc"]},
                    },
                }
            },
        },
        base_dir=path.parent,
    )


@pytest.fixture(scope="module")
def sessions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[bool, Session]]:
    root = tmp_path_factory.mktemp("totality")
    made = {flag: Session(make_policy(root / f"v{int(flag)}.parquet", flag)) for flag in (0, 1)}
    yield {bool(k): v for k, v in made.items()}
    for s in made.values():
        s.close()


QUERIES = [
    # failing casts
    "SELECT COUNT(*) FROM visits WHERE CAST(note AS INT) > 2",
    "SELECT COUNT(*) FROM visits WHERE note::INTEGER > 2",
    "SELECT COUNT(*) FROM visits WHERE CAST(note AS TINYINT) > 2",
    "SELECT COUNT(*) FROM visits WHERE CAST(note AS DATE) IS NULL",
    "SELECT COUNT(CAST(note AS INT)) FROM visits",
    "SELECT SUM(LEAST(GREATEST(CAST(spend AS TINYINT), 0), 10)) FROM visits",
    "SELECT CAST(note AS INT) AS n, COUNT(*) FROM visits GROUP BY CAST(note AS INT)",
    "SELECT COUNT(*) FROM visits WHERE CAST(spend AS INT) > 0",
    "SELECT COUNT(*) FROM visits WHERE CAST(big AS INT) > 0",
    "SELECT COUNT(*) FROM visits WHERE CAST(age AS SMALLINT) > 0",
    # integer overflow
    "SELECT COUNT(*) FROM visits WHERE age + age > 0",
    "SELECT COUNT(*) FROM visits WHERE age * 2 > 0",
    "SELECT COUNT(*) FROM visits WHERE big + big > 0",
    "SELECT COUNT(*) FROM visits WHERE big * big > 0",
    "SELECT COUNT(*) FROM visits WHERE big - 1 < 0",
    "SELECT COUNT(*) FROM visits WHERE -big < 0",
    "SELECT COUNT(*) FROM visits WHERE abs(big) > 0",
    "SELECT SUM(age + age) FROM visits",
    "SELECT AVG(big + big) FROM visits",
    "SELECT SUM(LEAST(GREATEST(big * 3, 0), 10)) FROM visits",
    # division and modulo by zero
    "SELECT COUNT(*) FROM visits WHERE age // (age - age) > 0",
    "SELECT COUNT(*) FROM visits WHERE age % 0 = 0",
    "SELECT COUNT(*) FROM visits WHERE small // small > 0",
    "SELECT COUNT(*) FROM visits WHERE big % small = 0",
    "SELECT COUNT(*) FROM visits WHERE 1 // 0 > 0",
    "SELECT COUNT(*) FROM visits WHERE 1 / 0 > 0",
    "SELECT COUNT(*) FROM visits WHERE small / (small - small) > 0",
    "SELECT SUM(LEAST(GREATEST(small // (small - small), 0), 10)) FROM visits",
    "SELECT AVG(LEAST(GREATEST(age % 0, 0), 10)) FROM visits",
    "SELECT COUNT(age // (small - small)) FROM visits",
    # math domain errors
    "SELECT COUNT(*) FROM visits WHERE ln(0) > 0",
    "SELECT COUNT(*) FROM visits WHERE ln(small) > 0",
    "SELECT COUNT(*) FROM visits WHERE ln(spend) > 0",
    "SELECT COUNT(*) FROM visits WHERE log(small - 5) > 0",
    "SELECT COUNT(*) FROM visits WHERE sqrt(-1) > 0",
    "SELECT COUNT(*) FROM visits WHERE sqrt(small - 10) > 0",
    "SELECT COUNT(*) FROM visits WHERE exp(age) > 0",
    "SELECT COUNT(*) FROM visits WHERE pow(big, 10) > 0",
    "SELECT COUNT(*) FROM visits WHERE spend / 0 > 0",
    "SELECT COUNT(*) FROM visits WHERE round(spend) > 0",
    "SELECT COUNT(*) FROM visits WHERE substring(note, big) = 'x'",
    "SELECT COUNT(*) FROM visits WHERE substring(note, 1, big) = 'x'",
    "SELECT COUNT(*) FROM visits WHERE isnan(spend)",
    "SELECT COUNT(*) FROM visits WHERE isinf(spend)",
    # NaN and infinities in sums and averages
    "SELECT SUM(spend) FROM visits",
    "SELECT AVG(spend) FROM visits",
    "SELECT SUM(spend), AVG(spend), COUNT(spend) FROM visits",
    "SELECT SUM(spend * 2) FROM visits",
    "SELECT AVG(LEAST(GREATEST(spend / 0, 0), 10)) FROM visits WHERE spend > 1000",
    "SELECT note, SUM(spend), AVG(spend) FROM visits GROUP BY note",
    "SELECT note, COUNT(*) FROM visits GROUP BY note HAVING COUNT(*) / 0 > 1",
    "SELECT note, SUM(spend) / (COUNT(*) - COUNT(*)) FROM visits GROUP BY note",
    "SELECT COUNT(*) FROM visits WHERE CASE WHEN small = 0 THEN 1 // small ELSE 1 END > 0",
]


@pytest.mark.parametrize("sql", QUERIES)
def test_query_answers_with_and_without_triggering_rows(
    sessions: dict[bool, Session], sql: str
) -> None:
    for flag, session in sessions.items():
        before = session.budget().queries
        # fresh: the engine must run it (a variant written the same way would be a cache hit)
        result = session.execute(sql, fresh=True)
        assert session.budget().queries == before + 1, flag
        assert result.rows is not None
        assert all(SECRET not in str(cell) for row in result.rows for cell in row)
        assert len(result.accuracy) == len(result.rows)


@pytest.mark.parametrize("sql", QUERIES[:12])
def test_query_through_the_dbapi(sessions: dict[bool, Session], sql: str) -> None:
    for session in sessions.values():
        with dbapi.connect(session.policy) as conn:
            cursor = conn.cursor()
            cursor.execute(sql)
            assert isinstance(cursor.fetchall(), list)


def totals(session: Session, sql: str) -> list[tuple[Any, ...]]:
    """The exact pre-noise totals of the bounded query (test-only view of the engine)."""
    plan = session.plan(sql)
    return session.engine.run(plan.bounded.sql(dialect=DIALECT))[1]


def test_nan_counts_as_null_in_sums_and_averages(sessions: dict[bool, Session]) -> None:
    # Per unit: 10 clean rows, plus one trigger row for units 1001-1004 (spend nan, inf, -inf,
    # nan). NaN must count as NULL; +inf clamps to the upper bound and -inf to the lower.
    clean = totals(sessions[False], "SELECT SUM(spend), COUNT(spend), AVG(spend) FROM visits")
    bad = totals(sessions[True], "SELECT SUM(spend), COUNT(spend), AVG(spend) FROM visits")
    plan = sessions[True].plan("SELECT SUM(spend), COUNT(spend), AVG(spend) FROM visits")
    kinds = [m.spec.kind for m in plan.measurements]
    assert kinds == ["sum", "count", "centred"]
    units = [m.unit for m in plan.measurements]
    clean_sum, clean_count, _ = clean[0]
    bad_sum, bad_count, _ = bad[0]
    assert clean_count == 300
    assert bad_count == clean_count + 2  # inf and -inf are values; the two NaNs are not
    assert (bad_sum - clean_sum) * units[0] == Fraction(200)  # +inf -> 200, -inf -> 0


def test_count_of_a_column_means_the_same_next_to_a_sum(sessions: dict[bool, Session]) -> None:
    ((alone,),) = totals(sessions[True], "SELECT COUNT(spend) FROM visits")
    ((_, beside),) = totals(sessions[True], "SELECT SUM(spend), COUNT(spend) FROM visits")
    assert alone == beside


def test_null_values_are_not_counted_in_averages(tmp_path: Path) -> None:
    # 10 units; each has 2 rows with spend 80 and 2 rows with spend NULL. Bounds [50, 100]:
    # a NULL taken for 0 and clamped would show up as 50. SQL's AVG ignores NULLs: 80.
    path = tmp_path / "nulls.parquet"
    con = duckdb.connect()
    con.execute(
        f"""COPY (SELECT (i % 10)::BIGINT AS user_id,
            CASE WHEN i < 20 THEN 80.0 ELSE NULL END::DOUBLE AS spend FROM range(40) r(i))
            TO '{path}' (FORMAT parquet)"""
    )
    con.close()
    policy = load_policy(
        {
            "dataset": {"id": "nulls"},
            "data": {"tables": {"visits": str(path)}},
            "budget": {"diagnose": False, "epsilon": "10"},
            "tables": {
                "visits": {
                    "privacy_unit": "user_id",
                    "max_groups_per_unit": 1,
                    "max_rows_per_unit_per_group": 10,
                    "columns": {"spend": {"lower": 50, "upper": 100}},
                }
            },
        },
        base_dir=tmp_path,
    )
    session = Session(policy)
    sql = "SELECT SUM(spend), COUNT(spend), AVG(spend) FROM visits"
    plan = session.plan(sql)
    ((total, count, centred),) = totals(session, sql)
    assert count == 20  # COUNT(spend) skips NULL
    assert total * plan.measurements[0].unit == 20 * 80
    # centred sum: each value contributes (x - m) with m = 75, in units of g/2.
    assert centred * plan.measurements[2].unit == 20 * (80 - 75)


def test_infinities_clamp_in_sums(sessions: dict[bool, Session]) -> None:
    ((inf_sum,),) = totals(sessions[True], "SELECT SUM(spend) FROM visits WHERE isinf(spend)")
    plan = sessions[True].plan("SELECT SUM(spend) FROM visits WHERE isinf(spend)")
    assert inf_sum * plan.measurements[0].unit == 200


def test_failing_rows_are_dropped_not_raised(sessions: dict[bool, Session]) -> None:
    # TRY(...) IS TRUE: a row whose WHERE raises is filtered out, exactly like a false one.
    sql = "SELECT COUNT(*) FROM visits WHERE CAST(note AS INT) >= 0"
    ((clean,),) = totals(sessions[False], sql)
    ((bad,),) = totals(sessions[True], sql)
    assert clean == bad == 300
    # Every trigger row's big + big overflows BIGINT (clean row i = 0 gives 0).
    sql = "SELECT COUNT(*) FROM visits WHERE big + big <> 0"
    ((clean,),) = totals(sessions[False], sql)
    ((bad,),) = totals(sessions[True], sql)
    assert clean == 299
    assert bad in (299, 303)  # overflow drops the row, or integer arithmetic is widened


def test_overflowing_rows_are_dropped_whole(sessions: dict[bool, Session]) -> None:
    # TRY wraps the whole WHERE: an overflow makes the condition NULL, so even
    # "overflowing expression IS NULL" does not select the row.
    sql = "SELECT COUNT(*) FROM visits WHERE big + big IS NULL"
    assert totals(sessions[False], sql) == totals(sessions[True], sql) == [(None,)]


def test_check_before_charge_does_not_read_data(sessions: dict[bool, Session]) -> None:
    # A query the engine cannot type-check is rejected on the schema alone, before the charge,
    # identically with and without the triggering rows.
    sql = "SELECT COUNT(*) FROM visits WHERE substring(age, 1) = 'x'"
    outcomes = []
    for session in sessions.values():
        before = session.budget().queries
        try:
            session.execute(sql)
            outcomes.append("ok")
        except errors.UnsupportedQueryError:
            outcomes.append("rejected")
            assert session.budget().queries == before
    assert outcomes[0] == outcomes[1]


# -- engine failures -------------------------------------------------------------------------


class FailingConnection:
    """Wraps the engine's DuckDB connection: binding works, running raises with a secret."""

    def __init__(self, real: Any, error: type[Exception]):
        self.real = real
        self.error = error

    def execute(self, sql: str, *args: Any) -> Any:
        # Only the bounded query itself fails; binding it (EXPLAIN/DESCRIBE) still works.
        if not sql.lstrip().upper().startswith(("WITH", "SELECT")):
            return self.real.execute(sql, *args)
        raise self.error(f'Conversion Error: Could not convert string "{SECRET}" to INT32')

    def close(self) -> None:
        self.real.close()


@pytest.mark.parametrize(
    "error",
    [duckdb.ConversionException, duckdb.OutOfMemoryException, duckdb.InterruptException],
)
def test_engine_error_text_never_reaches_the_user(tmp_path: Path, error: type[Exception]) -> None:
    session = Session(make_policy(tmp_path / "v.parquet", True))
    session.engine._con = FailingConnection(session.engine._con, error)
    with pytest.raises(errors.EngineError) as info:
        session.execute("SELECT SUM(spend) FROM visits", epsilon="0.5")
    assert type(info.value) is errors.EngineError
    assert SECRET not in str(info.value)
    assert info.value.__cause__ is None
    assert info.value.__suppress_context__
    # The charge stands: the engine ran (or may have) after the budget admitted the query.
    report = session.budget()
    assert report.epsilon_spent == Fraction(1, 2)
    assert report.queries == 1


def test_engine_error_through_the_dbapi(tmp_path: Path) -> None:
    conn = dbapi.connect(make_policy(tmp_path / "v.parquet", True))
    engine = conn.session.engine
    engine._con = FailingConnection(engine._con, duckdb.ConversionException)
    with pytest.raises(dbapi.OperationalError) as info:
        conn.cursor().execute("SELECT COUNT(*) FROM visits")
    assert type(info.value) is dbapi.EngineFailure
    assert isinstance(info.value, errors.EngineError)
    assert SECRET not in str(info.value)
    assert info.value.__cause__ is None
    assert conn.budget().epsilon_spent == 1
    assert conn.budget().queries == 1


def test_engine_error_log_has_no_secret(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    session = Session(make_policy(tmp_path / "v.parquet", True))
    session.engine._con = FailingConnection(session.engine._con, duckdb.ConversionException)
    with caplog.at_level("DEBUG", logger="dpsql"), pytest.raises(errors.EngineError):
        session.execute("SELECT COUNT(*) FROM visits")
    assert caplog.records
    assert SECRET not in caplog.text
