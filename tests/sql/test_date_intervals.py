"""Constant date ± INTERVAL folded into its date (``dpsql.sql.dates``): the same date DuckDB
computes, for any date, amount and unit (hypothesis, month ends and leap days included); the
rows a filter selects are the same as with the date written out; anything else with INTERVAL
is still refused, before the charge."""

from __future__ import annotations

import datetime as dt

import duckdb
import pytest
import sqlglot
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsql.errors import UnsupportedQueryError
from dpsql.session.session import Session
from dpsql.sql.dates import fold_intervals
from dpsql.sql.parse import DIALECT


def _fold(expression: str) -> str:
    tree = sqlglot.parse_one(f"SELECT {expression}", read=DIALECT)
    return fold_intervals(tree).sql(DIALECT)


@settings(max_examples=examples(300), deadline=None)
@given(
    day=st.dates(dt.date(1900, 1, 1), dt.date(2100, 12, 31)),
    amount=st.integers(-400, 400),
    unit=st.sampled_from(["DAY", "WEEK", "MONTH", "YEAR", "days", "Months"]),
    sign=st.sampled_from(["+", "-"]),
)
def test_the_folded_date_is_duckdbs(day: dt.date, amount: int, unit: str, sign: str) -> None:
    expression = f"DATE '{day.isoformat()}' {sign} INTERVAL '{amount}' {unit}"
    folded = _fold(expression)
    assert "INTERVAL" not in folded.upper()
    con = duckdb.connect()
    try:
        ((expected,),) = con.execute(f"SELECT CAST({expression} AS DATE)").fetchall()
        ((got,),) = con.execute(folded).fetchall()
    finally:
        con.close()
    assert got == expected


@pytest.mark.parametrize(
    ("written", "date"),
    [
        ("DATE '1998-12-01' - INTERVAL '90' DAY", "1998-09-02"),  # TPC-H Q1
        ("DATE '1995-01-31' + INTERVAL '1' MONTH", "1995-02-28"),
        ("DATE '2024-02-29' + INTERVAL '1' YEAR", "2025-02-28"),
        ("INTERVAL '3' MONTH + DATE '1993-07-01'", "1993-10-01"),  # TPC-H Q4, reversed
        ("DATE '1994-01-01' + INTERVAL '1' YEAR - INTERVAL '1' DAY", "1994-12-31"),
        ("CAST('1994-01-01' AS DATE) + INTERVAL 1 YEAR", "1995-01-01"),
    ],
)
def test_known_dates(written: str, date: str) -> None:
    assert _fold(written) == f"SELECT CAST('{date}' AS DATE)"


@pytest.mark.parametrize(
    "written",
    [
        "d + INTERVAL '1' DAY",  # a column: not a constant
        "DATE '1994-01-01' + INTERVAL '1' HOUR",  # not whole days
        "DATE '1994-01-01' + INTERVAL '1.5' DAY",
        "DATE '9999-12-31' + INTERVAL '1' DAY",  # past year 9999
        "TIMESTAMP '1994-01-01 10:00:00' + INTERVAL '1' DAY",
    ],
)
def test_anything_else_is_left_for_validation_to_refuse(written: str) -> None:
    assert "INTERVAL" in _fold(written).upper()


def test_a_filter_selects_the_same_rows_and_the_rest_is_refused(tiny_policy: object) -> None:
    """End to end: the folded query plans exactly as the one with the date written out; an
    INTERVAL that cannot fold is refused, nothing charged."""
    policy = tiny_policy(  # type: ignore[operator]
        [(1, "east", 30, 1.0)],
        schema=(
            ("user_id", "BIGINT"),
            ("region", "VARCHAR"),
            ("age", "INTEGER"),
            ("spend", "DOUBLE"),
        ),
    )
    session = Session(policy)
    try:
        folded = session.plan(
            "SELECT COUNT(*) FROM visits WHERE CAST('1998-09-02' AS DATE) >= "
            "DATE '1998-12-01' - INTERVAL '90' DAY"
        )
        written = session.plan(
            "SELECT COUNT(*) FROM visits WHERE CAST('1998-09-02' AS DATE) >= DATE '1998-09-02'"
        )
        assert folded.engine_sql == written.engine_sql
        with pytest.raises(UnsupportedQueryError, match="INTERVAL"):
            session.plan("SELECT COUNT(*) FROM visits WHERE age > 3 + INTERVAL '1' HOUR")
        assert session.budget().epsilon_spent == 0
    finally:
        session.close()
