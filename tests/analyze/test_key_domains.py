"""Public key domains are sets in the key's engine type (class 2 of the threat model).

DuckDB casts ``1``, ``'1'`` and ``'01'`` in one CASE to one INTEGER key, groups ``'EU'`` and
``'eu'`` together under NOCASE, and ``-0.0`` with ``0.0``: a domain deduplicated with Python
equality released one group's total several times, with independent noise, for the price of
one. These tests generate CASE keys from spellings that collide in the engine, policy domains
and public-table domains, and compare the released rows with what the plain engine says the
key's distinct values are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pytest
from conftest import TinyPolicy, examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpsql.analyze.domains import probe_sql
from dpsql.bound.filters import literal_sql
from dpsql.errors import BoundsError, UnsupportedQueryError
from dpsql.policy import load_policy
from dpsql.session.session import Session

ROWS = [(u, ("east", "west")[u % 2], 18 + u % 60, float(u % 7)) for u in range(1, 200)]
BRANCHES = ("1", "'1'", "'01'", "' 1'", "2", "'2'", "2.0", "'+2'", "3", "NULL", "'3'", "1.0")


def _engine_distinct(branches: list[str], default: str | None) -> int:
    """How many distinct values (NULL counted once) the CASE itself yields over its branches,
    evaluated by the plain engine on one row per branch: the key's domain as the engine has
    it, computed without dpsql."""
    whens = " ".join(f"WHEN i = {j} THEN {b}" for j, b in enumerate(branches))
    tail = f" ELSE {default}" if default is not None else ""
    case = f"CASE {whens}{tail} END"
    con = duckdb.connect()
    try:
        (count,) = con.execute(
            f"SELECT COUNT(DISTINCT k) + MAX(CAST(k IS NULL AS INTEGER)) FROM "
            f"(SELECT {case} AS k FROM range({len(branches) + 1}) AS t(i))"
        ).fetchone()  # type: ignore[misc]
    finally:
        con.close()
    return int(count)


def _case_key(branches: list[str], default: str | None) -> str:
    bands = [f"WHEN age < {20 + 6 * j} THEN {b}" for j, b in enumerate(branches)]
    tail = f" ELSE {default}" if default is not None else ""
    return f"CASE {' '.join(bands)}{tail} END"


@settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    branches=st.lists(st.sampled_from(BRANCHES), min_size=1, max_size=6),
    default=st.one_of(st.none(), st.sampled_from(BRANCHES)),
)
def test_a_case_key_releases_each_engine_value_once(
    tiny_policy: TinyPolicy, branches: list[str], default: str | None
) -> None:
    session = Session(tiny_policy(ROWS, max_groups=1))
    key = _case_key(branches, default)
    sql = f"SELECT {key} AS k, COUNT(*) AS n FROM visits GROUP BY k"
    try:
        try:
            expected = _engine_distinct(branches, default)
        except duckdb.BinderException:
            # The engine cannot type this CASE at all: refused before any charge.
            with pytest.raises(UnsupportedQueryError):
                session.execute(sql)
            assert session.budget().queries == 0
            return
        try:
            result = session.execute(sql)
        except (BoundsError, UnsupportedQueryError):
            # Only a key with no value of its type at all is refused (every branch a NULL).
            assert expected == 1
            assert all(b == "NULL" for b in [*branches, default or "NULL"])
            return
        assert len(result.rows) == expected, (key, result.rows)
        # One noisy count per released group, charged once.
        assert result.charge is not None and result.plan is not None
        assert len({row[0] for row in result.rows}) == len(result.rows)
    finally:
        session.close()


def test_the_spellings_of_one_integer_are_one_group(tiny_policy: TinyPolicy) -> None:
    session = Session(tiny_policy(ROWS, max_groups=1))
    sql = (
        "SELECT CASE WHEN age < 30 THEN 1 WHEN age < 50 THEN '1' ELSE '01' END AS k, "
        "COUNT(*) AS n FROM visits GROUP BY k"
    )
    result = session.execute(sql)
    assert [row[0] for row in result.rows] == [1]
    explain = "\n".join(session.plan(sql).explain())
    assert "L0 = 1 group(s)" in explain
    session.close()


def test_a_policy_domain_is_a_set_in_the_column_type(tiny_policy: TinyPolicy) -> None:
    policy = tiny_policy(
        ROWS,
        max_groups=1,
        columns={
            "age": {"lower": 18, "upper": 90, "public_values": [20, "20", "020", " 20", 21]},
            "spend": {"lower": 0, "upper": 10},
        },
    )
    session = Session(policy)
    result = session.execute("SELECT age, COUNT(*) FROM visits GROUP BY age")
    assert [row[0] for row in result.rows] == [20, 21]
    session.close()


def _collated(tmp_path: Path, domain: dict[str, Any]) -> Session:
    database = tmp_path / "collated.duckdb"
    con = duckdb.connect(str(database))
    con.execute("CREATE TABLE visits (user_id BIGINT, region VARCHAR COLLATE NOCASE, k INTEGER)")
    con.execute(
        "INSERT INTO visits SELECT u, ['EU', 'eu', 'US'][1 + u % 3], u % 3 FROM range(90) t(u)"
    )
    con.execute("CREATE TABLE codes (code VARCHAR)")
    con.execute("INSERT INTO codes VALUES ('1'), ('01'), ('001'), ('2'), ('x'), (NULL)")
    con.close()
    return Session(
        load_policy(
            {
                "dataset": {"id": "collated"},
                "data": {"database": str(database)},
                "budget": {"diagnose": False, "epsilon": "10", "query_epsilon": "1"},
                "tables": {
                    "visits": {
                        "privacy_unit": "user_id",
                        "max_groups_per_unit": 1,
                        "max_rows_per_unit_per_group": 1,
                        "columns": domain,
                    },
                    "codes": {"public": True},
                },
            }
        )
    )


def test_a_policy_domain_is_a_set_under_the_column_collation(tmp_path: Path) -> None:
    session = _collated(tmp_path, {"region": {"public_values": ["EU", "eu", "Eu", "US"]}})
    result = session.execute("SELECT region, COUNT(*) FROM visits GROUP BY region")
    assert sorted(str(r[0]).lower() for r in result.rows) == ["eu", "us"]
    session.close()


def test_a_public_table_domain_is_a_set_in_the_key_type(tmp_path: Path) -> None:
    session = _collated(tmp_path, {"k": {"public_values_from": "codes.code"}})
    result = session.execute("SELECT k, COUNT(*) FROM visits GROUP BY k")
    # '1', '01' and '001' are the INTEGER 1; 'x' is no INTEGER; NULL is a member.
    keys = [r[0] for r in result.rows]
    assert len(keys) == len(set(keys)) == 3 and set(keys) == {1, 2, None}
    session.close()


def test_two_nans_in_a_policy_domain_are_one_group(tiny_policy: TinyPolicy) -> None:
    # Python keeps two NaNs in a set (nan != nan); the engine has one NaN.
    policy = tiny_policy(
        [*ROWS, (500, "east", 20, float("nan"))],
        max_groups=1,
        columns={
            "age": {"lower": 18, "upper": 90},
            "spend": {"public_values": [float("nan"), 1.0, float("nan")]},
        },
    )
    session = Session(policy)
    result = session.execute("SELECT spend, COUNT(*) FROM visits GROUP BY spend")
    assert len(result.rows) == 2
    session.close()


TEXTS = st.lists(
    st.sampled_from(
        ["a", "A", "é", "e\u0301", "ß", "SS", " ", "\t", "'", '"', "😀", "Z", "\\", "\n", "%"]
    ),
    max_size=4,
).map("".join)


@settings(
    max_examples=examples(80),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(values=st.lists(st.one_of(st.none(), TEXTS), max_size=8))
def test_a_text_domain_taken_in_python_is_the_engines(
    tiny_policy: TinyPolicy, values: list[str | None]
) -> None:
    """A bare VARCHAR column without a collation takes its domain's distinct values in Python
    (``Session._python_domain``) instead of from the engine's probe: the same values in the same
    order, for texts that differ by case, accents composed or not, spaces and quotes. A
    collated column (the NOCASE test above) and other types still ask the engine."""
    session = Session(tiny_policy(ROWS[:3], columns={"region": {"public_values": ["east"]}}))
    try:
        analysis = session.plan("SELECT region, COUNT(*) FROM visits GROUP BY region").analysis
        domain = tuple(values)
        fast = session._python_domain(analysis, '"region"', "VARCHAR", domain)
        literals = [None if v is None else literal_sql(v) for v in domain]
        engine = session.engine.key_domain(probe_sql('"visits"', '"region"', "VARCHAR", literals))
        assert fast == engine
        assert session._python_domain(analysis, '"region"', "INTEGER", (*domain, "x")) is None
        assert session._python_domain(analysis, 'UPPER("region")', "VARCHAR", domain) is None
        assert session._python_domain(analysis, '"region"', "VARCHAR", (*domain, 1)) is None
    finally:
        session.close()


BOUNDARIES = [-(2**63), -(2**31) - 1, -(2**31), -129, -128, -1, 0, 1, 127, 128, 2**15, 2**31 - 1]
INTEGERS = st.one_of(
    st.sampled_from([*BOUNDARIES, 2**31, 2**63 - 1, 2**63, 10**30]), st.integers(-300, 300)
)


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    values=st.lists(st.one_of(st.none(), INTEGERS), max_size=8),
    kind=st.sampled_from(["TINYINT", "SMALLINT", "INTEGER", "BIGINT"]),
)
def test_an_integer_domain_taken_in_python_is_the_engines(
    tiny_policy: TinyPolicy, values: list[int | None], kind: str
) -> None:
    """A key of a signed integer type over a domain of Python integers (a date part, a CASE of
    integers) takes its distinct values in Python: the same texts in the same order as the
    engine's probe, values outside the type dropped as TRY_CAST drops them; a text, a float or
    a boolean among them still asks the engine (``'01'`` and ``1`` are one INTEGER)."""
    session = Session(tiny_policy(ROWS[:3], columns={"region": {"public_values": ["east"]}}))
    try:
        analysis = session.plan("SELECT region, COUNT(*) FROM visits GROUP BY region").analysis
        key = f'TRY_CAST("age" AS {kind})'
        domain = tuple(values)
        fast = session._python_domain(analysis, key, kind, domain)
        literals = [None if v is None else literal_sql(v) for v in domain]
        engine = session.engine.key_domain(probe_sql('"visits"', key, kind, literals))
        assert fast == engine
        for other in ("1", 1.0, True):
            assert session._python_domain(analysis, key, kind, (*domain, other)) is None
    finally:
        session.close()
