"""BigQuery's ``SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(...)`` through every interface.

The clause is read by an extension of sqlglot's DuckDB dialect (dpsql.sql.options); its keys map
onto dpsql's settings, its values go through the same validation as ``SET``, and a keyword
option given to ``execute`` wins over an inline one.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
import sqlglot

import dpsql
from dpsql.errors import ParameterError, ParseError
from dpsql.session.session import Session
from dpsql.sql.options import KEYS, split_options
from dpsql.sql.parse import Explain, Query, SetOption, parse_statement

ROWS = [(u, "east" if u % 2 else "west", 20 + u % 50, float(u % 90)) for u in range(1, 201)]
BQ = (
    "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon = 0.2, delta = 1e-7, "
    "max_groups_contributed = 1) region, COUNT(*) AS n FROM visits GROUP BY region"
)


@pytest.fixture
def session(tiny_policy) -> Session:  # type: ignore[no-untyped-def]
    return Session(tiny_policy(ROWS))


def test_the_clause_is_parsed_off_the_select_and_mapped_to_settings() -> None:
    statement = parse_statement(BQ)
    assert isinstance(statement, Query)
    assert dict(statement.options) == {
        "epsilon": "0.2",
        "delta": "1e-7",
        "max_groups_per_unit": "1",
    }
    assert statement.select.sql(dialect="duckdb") == (
        "SELECT region, COUNT(*) AS n FROM visits GROUP BY region"
    )
    explain = parse_statement("EXPLAIN " + BQ)
    assert isinstance(explain, Explain) and explain.options == statement.options
    # Without the clause nothing changes, and SET statements are untouched.
    assert parse_statement("SELECT COUNT(*) FROM visits") == Query(
        sqlglot.parse_one("SELECT COUNT(*) FROM visits", read="duckdb")
    )
    assert parse_statement("SET dpsql.epsilon = 1") == SetOption("epsilon", "1")


def test_the_clause_is_blanked_out_where_it_stood() -> None:
    """The clause's characters become spaces (line breaks kept): the rest of the text, and the
    line and column of a syntax error after the clause, stay where they were."""
    sql = BQ.replace(" region,", "\n region,").replace("GROUP BY", "GRUOP BY")
    text, options = split_options(sql)
    assert len(text) == len(sql) and text.count("\n") == sql.count("\n")
    assert text.split() == ["SELECT", *sql[sql.index("\n") :].split()]
    assert dict(options) == {"epsilon": "0.2", "delta": "1e-7", "max_groups_per_unit": "1"}
    with pytest.raises(ParseError) as bad:
        parse_statement(sql)
    with pytest.raises(ParseError) as plain:
        parse_statement("SELECT\n" + sql[sql.index("\n") + 1 :])
    assert (bad.value.line, bad.value.column) == (plain.value.line, plain.value.column)
    assert bad.value.line == 2
    with pytest.raises(sqlglot.errors.ParseError):  # plain DuckDB does not read it
        sqlglot.parse_one(BQ, read="duckdb")


@pytest.mark.parametrize(
    ("sql", "words"),
    [
        ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon = 1 COUNT(*) FROM visits", "closed"),
        ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS epsilon = 1 COUNT(*) FROM visits", "followed"),
        ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon = 1 FROM t) COUNT(*) FROM visits",
         "pairs"),
        ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(1) COUNT(*) FROM visits", "pairs"),
        ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon = 1) WITH DIFFERENTIAL_PRIVACY "
         "COUNT(*) FROM visits", "syntax"),
    ],
)  # fmt: skip
def test_a_malformed_clause_is_a_parse_error(sql: str, words: str) -> None:
    with pytest.raises(ParseError, match=words):
        parse_statement(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT COUNT(*) FROM visits "
        "WHERE region <> 'WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=9)'",
        "SELECT /* WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=9) */ COUNT(*) FROM visits",
        "SELECT -- WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=9)\n COUNT(*) FROM visits",
    ],
)
def test_strings_and_comments_are_not_the_clause(session: Session, sql: str) -> None:
    statement = parse_statement(sql)
    assert isinstance(statement, Query) and not statement.options
    assert session.plan(sql).epsilon == 1  # the policy's query_epsilon


def test_session_execute_uses_the_inline_options(session: Session) -> None:
    result = session.execute(BQ)
    assert result.plan is not None and result.charge is not None
    assert (result.plan.epsilon, result.plan.max_groups) == (Fraction(1, 5), 1)
    assert result.charge.epsilon == Fraction(1, 5)
    assert session.budget().epsilon_spent == Fraction(1, 5)
    assert [r[0] for r in result.rows] == ["central", "east", "north", "south", "west"]


def test_keyword_options_win_over_inline_ones_which_win_over_set(session: Session) -> None:
    session.execute("SET dpsql.epsilon = 0.1")
    assert session.plan(BQ).epsilon == Fraction(1, 5)  # inline over SET
    assert session.plan(BQ, epsilon="0.3").epsilon == Fraction(3, 10)  # keyword over inline
    assert session.plan(BQ, epsilon=None).epsilon == Fraction(1, 5)  # None: not given
    plan = session.plan(BQ, max_groups_per_unit=2)
    assert (plan.epsilon, plan.max_groups) == (Fraction(1, 5), 2)
    assert session.execute(BQ, epsilon="0.3").charge.epsilon == Fraction(3, 10)  # type: ignore[union-attr]


def test_dbapi_and_explain_accept_the_clause(tiny_policy) -> None:  # type: ignore[no-untyped-def]
    with dpsql.connect(tiny_policy(ROWS)) as conn:
        cursor = conn.cursor()
        cursor.execute("EXPLAIN " + BQ)
        lines = [row[0] for row in cursor.fetchall()]
        assert "cost: epsilon 0.2, delta 0" in lines
        assert "bounds: L0 = 1 group(s) per unit, C = 10 row(s) per unit and group" in lines
        assert conn.budget().epsilon_spent == 0  # EXPLAIN charges nothing
        cursor.execute(BQ)
        assert len(cursor.fetchall()) == 5  # the public domain of region
        assert conn.budget().epsilon_spent == Fraction(1, 5)


def test_dpsql_names_and_the_privacy_unit_are_accepted(session: Session) -> None:
    plan = session.plan(
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(privacy_unit_column = user_id, "
        "max_rows_per_unit_per_group = 3, mechanism = 'gaussian', delta = 1e-6, rho = 0.5, "
        "confidence = 0.9) COUNT(*) FROM visits"
    )
    assert (plan.max_rows, plan.options.mechanism, plan.options.rho) == (
        3,
        "gaussian",
        Fraction(1, 2),
    )
    assert plan.options.confidence == 0.9
    assert session.plan("SELECT WITH DIFFERENTIAL_PRIVACY COUNT(*) FROM visits").epsilon == 1
    assert set(KEYS) >= {"epsilon", "delta", "max_groups_contributed", "sigma"}


def test_max_rows_contributed_is_the_total_row_cap(session: Session) -> None:
    plan = session.plan(
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(max_rows_contributed = 4) COUNT(*) FROM visits"
    )
    assert plan.options.max_rows_per_unit == 4


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ("epsilon = 1, budget = 3", ParameterError, "budget"),
        ("max_rows_contributed = 0", ParameterError, "max_rows_per_unit"),
        ("max_rows_contributed = 3, max_rows_per_unit = 3", ParameterError, "twice"),
        ("epsilon = 1, epsilon = 2", ParameterError, "twice"),
        ("max_groups_contributed = 1, max_groups_per_unit = 2", ParameterError, "twice"),
        ("privacy_unit_column = region", ParameterError, "privacy unit"),
        ("epsilon = -1", ParameterError, "epsilon"),
        ("epsilon = 1000", ParameterError, "epsilon"),
        ("max_groups_contributed = 1.5", ParameterError, "max_groups_per_unit"),
        ("mechanism = 'exponential'", ParameterError, "mechanism"),
        ("epsilon = 1 + 1", ParseError, "literal"),
        ("fresh = true", ParameterError, "fresh"),
    ],
)
def test_bad_options_are_rejected_and_nothing_is_charged(
    session: Session, options: str, error: type[Exception], words: str
) -> None:
    sql = f"SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS({options}) COUNT(*) FROM visits"
    with pytest.raises(error, match=words):
        session.execute(sql)
    with pytest.raises(error, match=words):
        session.execute("EXPLAIN " + sql)
    assert session.filter.charges == ()


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT COUNT(*) FROM (SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1) x FROM t)",
        "WITH c AS (SELECT WITH DIFFERENTIAL_PRIVACY x FROM t) SELECT COUNT(*) FROM c",
        "SELECT WITH DIFFERENTIAL_PRIVACY COUNT(*) FROM t UNION ALL "
        "SELECT WITH DIFFERENTIAL_PRIVACY COUNT(*) FROM t",
    ],
)
def test_the_clause_belongs_to_the_outer_select_only(sql: str) -> None:
    with pytest.raises(ParseError, match="outer SELECT"):
        parse_statement(sql)
    with pytest.raises(ParseError, match="outer SELECT"):
        parse_statement("EXPLAIN " + sql)
