"""Equalities of columns in joins and WHERE.

An equality between a UHUGEINT and a signed integer fails on a value past 2^127 (DuckDB casts
both to INT128), so it may never reach the engine bare: in a join's ON, a WHERE that joins a
comma list (left bare so that the engine sees a join condition), a set operation or a unit
path. Each query here is refused before the charge, or runs without an error on data that holds
2^128 - 1 (DESIGN.md section 5: whether a query fails must not depend on the data). A WHERE's
plain equalities, also those common to every branch of an OR, are left bare and give the same
totals as the same condition made total.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsql.errors import UnsupportedQueryError
from dpsql.policy import Policy, load_policy
from dpsql.session.session import Session

HUGE = 2**128 - 1


def _policy(tmp_path: Path) -> Policy:
    path = tmp_path / "data.duckdb"
    con = duckdb.connect(str(path))
    try:
        con.execute("CREATE TABLE a (uid BIGINT, big UHUGEINT, k BIGINT)")
        con.execute(f"INSERT INTO a VALUES (1, {HUGE}::UHUGEINT, 5), (2, 5, 5)")
        con.execute("CREATE TABLE b (uid BIGINT, k BIGINT)")
        con.execute("INSERT INTO b VALUES (1, 5), (2, -3)")
        con.execute("CREATE TABLE p (k BIGINT, label VARCHAR)")
        con.execute("INSERT INTO p VALUES (5, 'x'), (-3, 'y'), (NULL, 'z'), (7, NULL)")
        # Units with NULL keys and labels: three-valued logic on both sides of the OR.
        con.execute(
            "INSERT INTO a SELECT i, i % 9, CASE WHEN i % 4 = 0 THEN NULL ELSE "
            "[5, -3, 7][1 + i % 3] END FROM range(3, 60) t(i)"
        )
    finally:
        con.close()
    return load_policy(
        {
            "dataset": {"id": "uhugeint"},
            "data": {"database": str(path)},
            "budget": {"diagnose": False, "epsilon": 100, "query_epsilon": 1},
            "tables": {
                "a": {
                    "privacy_unit": "uid",
                    "unit_domain": "person",
                    "max_groups_per_unit": 2,
                    "max_rows_per_unit_per_group": 3,
                    "columns": {"big": {"lower": 0, "upper": 10}, "k": {"lower": -9, "upper": 9}},
                },
                "b": {
                    "privacy_unit": "uid",
                    "unit_domain": "person",
                    "max_groups_per_unit": 2,
                    "max_rows_per_unit_per_group": 3,
                    "columns": {"k": {"lower": -9, "upper": 9}},
                },
                "p": {"public": True},
            },
        },
        base_dir=tmp_path,
    )


QUERIES = [
    "SELECT COUNT(*) FROM a JOIN p ON a.big = p.k",
    "SELECT COUNT(*) FROM a, p WHERE a.big = p.k",
    "SELECT COUNT(*) FROM a, p WHERE a.big = p.k AND a.k = p.k",
    "SELECT COUNT(*) FROM a JOIN b ON a.uid = b.uid AND a.big = b.k",
    "SELECT COUNT(*) FROM (SELECT uid, big FROM a UNION SELECT uid, k FROM b) AS t",
    "SELECT COUNT(*) FROM (SELECT big FROM a UNION ALL SELECT k FROM b) AS t",
]


@pytest.mark.parametrize("sql", QUERIES)
def test_a_uhugeint_equality_never_fails_on_the_data(sql: str, tmp_path: Path) -> None:
    session = Session(_policy(tmp_path))
    try:
        try:
            plan = session.plan(sql)
        except UnsupportedQueryError:
            assert session.budget().epsilon_spent == 0
            return
        session.engine.run(plan.engine_sql)  # a ConversionException here is the bug
    finally:
        session.close()


def test_an_equality_of_one_type_is_left_bare_for_the_engine(tmp_path: Path) -> None:
    """The comma join's equality of two BIGINTs reaches the engine as a join condition (not
    inside TRY), and gives the same totals as the ON form."""
    session = Session(_policy(tmp_path))
    try:
        comma = session.plan("SELECT COUNT(*) FROM a, p WHERE a.k = p.k")
        joined = session.plan("SELECT COUNT(*) FROM a JOIN p ON a.k = p.k")
        assert 'WHERE "a_k" = "p_k"' in comma.engine_sql or 'WHERE "k" = ' in comma.engine_sql
        assert "TRY(" not in comma.engine_sql.split("_rows AS")[1].split("_vals AS")[0]
        assert session.engine.run(comma.engine_sql)[1] == session.engine.run(joined.engine_sql)[1]
    finally:
        session.close()


def test_an_equality_of_floats_stays_inside_try(tmp_path: Path) -> None:
    """NaN equals NaN to DuckDB and Parquet's statistics leave it out: a float equality is
    never a bare filter the engine could push into a scan."""
    session = Session(_policy(tmp_path))
    try:
        plan = session.plan("SELECT COUNT(*) FROM a, p WHERE CAST(a.k AS DOUBLE) = p.k")
        rows = plan.engine_sql.split("_rows AS")[1].split("_vals AS")[0]
        assert "TRY(" in rows
    finally:
        session.close()


@pytest.mark.parametrize(
    "condition",
    [
        "({eq} AND p.label = 'x') OR ({eq} AND a.big > 3)",
        "({eq} AND p.label = 'x') OR {eq}",
        "({eq} AND (p.label = 'x' OR p.label IS NULL)) OR ({eq} AND a.uid > 40 AND a.big < 2)",
        "{eq} AND (p.label <> 'y' OR a.big = 1)",
        # An OR beside other terms keeps its parentheses (A OR B AND C is A OR (B AND C)).
        "{eq} AND (p.label = 'x' OR a.big > 3) AND a.uid > 30",
        "(a.big > 3 OR p.label = 'y') AND {eq} AND (a.uid < 30 OR a.big = 1)",
        "({eq} AND (p.label = 'x' OR a.big > 3) AND a.uid > 20) OR ({eq} AND a.big = 2)",
        # A term common to every branch, not an equality: factored out, made total apart.
        "({eq} AND a.big > 3 AND p.label = 'x') OR ({eq} AND a.big > 3 AND a.uid < 30)",
    ],
)
def test_equalities_common_to_every_branch_are_a_join_condition(
    condition: str, tmp_path: Path
) -> None:
    """Bare (the engine's hash join) and made total (a + 0 is no plain equality), the same
    pre-noise totals, on data with NULL keys and labels."""
    session = Session(_policy(tmp_path))
    try:
        bare = session.plan(
            "SELECT COUNT(*), SUM(a.k) FROM a, p WHERE " + condition.format(eq="a.k = p.k")
        )
        kept = session.plan(
            "SELECT COUNT(*), SUM(a.k) FROM a, p WHERE " + condition.format(eq="a.k + 0 = p.k")
        )
        rows = bare.engine_sql.split("_rows AS")[1].split("_vals AS")[0]
        assert 'WHERE "a_k" = "p_k"' in rows, rows
        if "a.big > 3 AND p.label" in condition:
            assert rows.count('"big" > 3') == 1, rows  # once, on its own, before the OR
        totals = session.engine.run(bare.engine_sql)[1]
        assert totals == session.engine.run(kept.engine_sql)[1]
        assert totals[0][0] > 0  # rows do meet the condition: the comparison could fail
    finally:
        session.close()


@pytest.mark.parametrize(
    "condition",
    [
        "{eq}",
        "{eq} AND p.label = 'x'",
        "({eq} AND p.label = 'x') OR ({eq} AND a.big > 3)",
        "{eq} AND (p.label = 'x' OR a.big > 3) AND a.uid > 30",
    ],
)
def test_a_subquerys_equalities_are_a_join_condition_too(condition: str, tmp_path: Path) -> None:
    """The same split in a FROM-subquery's WHERE (a comma join inside it was a cross product
    at the engine): bare, and the same totals as made total."""
    session = Session(_policy(tmp_path))
    try:
        sql = "SELECT COUNT(*), SUM(k) FROM (SELECT a.uid, a.k FROM a, p WHERE {}) AS t"
        bare = session.plan(sql.format(condition.format(eq="a.k = p.k")))
        kept = session.plan(sql.format(condition.format(eq="a.k + 0 = p.k")))
        assert '"a_k" = "p_k" AND' in bare.engine_sql or '"a_k" = "p_k")' in bare.engine_sql
        totals = session.engine.run(bare.engine_sql)[1]
        assert totals == session.engine.run(kept.engine_sql)[1]
        assert totals[0][0] > 0
    finally:
        session.close()


@pytest.mark.parametrize(
    ("condition", "implied"),
    [
        # TPC-H Q7's shape: each branch tests both tables' columns against constants.
        (
            "(p.label = 'x' AND a.k = 5) OR (p.label = 'y' AND a.k = -3)",
            ["(\"label\" = 'x') OR (\"label\" = 'y')", '("a_k" = 5) OR ("a_k" = -3)'],
        ),
        # Q19's: a common equality factored out, then the rest's columns.
        (
            "({eq} AND p.label = 'x' AND a.uid > 30) OR ({eq} AND p.label IS NULL AND a.uid < 10)",
            ['("label" = \'x\') OR ("label" IS NULL)'],
        ),
        # A term that raises inside TRY (p.label = 5 on 'x' and 'y'): its rows stay dropped.
        (
            "(p.label = 5 AND a.uid > 30) OR (p.label = 'y' AND a.uid < 10)",
            ['("label" = 5) OR ("label" = \'y\')'],
        ),
        # Not implied: a column one branch does not test, an expression of a column.
        ("(p.label = 'x' AND a.k = 5) OR (a.uid < 10)", []),
        ("(a.k + 0 = 5 AND p.label = 'x') OR (a.k + 0 = 7 AND a.uid > 3)", []),
    ],
)
def test_an_or_gives_each_column_it_tests_in_every_branch_a_filter_of_its_own(
    condition: str, implied: list[str], tmp_path: Path
) -> None:
    """An OR whose every branch tests a column against constants implies the OR of those tests,
    a filter on one table before the joins (TPC-H Q7 ran in half the time with it). Added beside
    the OR, it keeps the same rows, also where a term raises on a value."""
    session = Session(_policy(tmp_path))
    try:
        sql = "SELECT COUNT(*), SUM(a.k) FROM a, p WHERE {}"
        text = condition.format(eq="a.k = p.k")
        split = session.plan(sql.format(text))
        whole = session.plan(sql.format(f"COALESCE(({text}), FALSE)"))
        rows = split.engine_sql.split("_rows AS")[1].split("_vals AS")[0]
        for filter_ in implied:
            assert f"TRY(({filter_})) IS TRUE" in rows or f"TRY({filter_}) IS TRUE" in rows, rows
        if not implied:
            assert rows.count("TRY(") == whole.engine_sql.split("_rows AS")[1].count("TRY(")
        assert session.engine.run(split.engine_sql)[1] == session.engine.run(whole.engine_sql)[1]
    finally:
        session.close()


@pytest.mark.parametrize(
    ("comma", "joined"),
    [
        (
            "SELECT COUNT(*), SUM(b.k) FROM a, b WHERE a.uid = b.uid",
            "SELECT COUNT(*), SUM(b.k) FROM a JOIN b ON a.uid = b.uid",
        ),
        (
            "SELECT COUNT(*), SUM(b.k) FROM a, b WHERE (b.uid = a.uid) AND b.k > 0",
            "SELECT COUNT(*), SUM(b.k) FROM a JOIN b ON b.uid = a.uid WHERE b.k > 0",
        ),
        (
            "SELECT COUNT(*) FROM a, p, b WHERE a.k = p.k AND a.uid = b.uid AND a.k = b.k",
            "SELECT COUNT(*) FROM a, p JOIN b ON a.uid = b.uid AND a.k = b.k WHERE a.k = p.k",
        ),
        (
            "SELECT COUNT(*), SUM(a.k) FROM a, b, p WHERE a.uid = b.uid AND b.k = p.k "
            "AND p.label = 'x'",
            "SELECT COUNT(*), SUM(a.k) FROM a JOIN b ON a.uid = b.uid JOIN p ON b.k = p.k "
            "WHERE p.label = 'x'",
        ),
    ],
)
def test_private_tables_listed_with_commas_join_on_the_where_s_unit_equality(
    comma: str, joined: str, tmp_path: Path
) -> None:
    """``FROM a, b WHERE a.uid = b.uid``: the WHERE's top-level equalities of the two inputs
    are the join's ON (an inner join keeps the same rows either way), so the units' rule holds
    and the pre-noise totals are those of the JOIN ... ON form."""
    session = Session(_policy(tmp_path))
    try:
        a, b = session.plan(comma), session.plan(joined)
        assert a.measurements == b.measurements
        totals = session.engine.run(a.engine_sql)[1]
        assert totals == session.engine.run(b.engine_sql)[1]
        assert totals and all(v for row in totals for v in row[-1:])
    finally:
        session.close()


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT COUNT(*) FROM a, b",  # no condition
        "SELECT COUNT(*) FROM a, b WHERE a.uid = b.uid OR a.k = 1",  # not at the top level
        "SELECT COUNT(*) FROM a, b WHERE NOT a.uid <> b.uid",  # not a plain equality
        "SELECT COUNT(*) FROM a, b WHERE a.k = b.k",  # not the units
        "SELECT COUNT(*) FROM a, b WHERE a.uid = b.k",  # a unit and another column
        "SELECT COUNT(*) FROM a, b WHERE a.uid = a.uid",  # one input only
        "SELECT COUNT(*) FROM a, b WHERE a.uid + 0 = b.uid",  # an expression of the unit
        "SELECT COUNT(*) FROM a, b WHERE a.uid = b.uid + 0",
    ],
)
def test_commas_without_the_unit_equality_are_refused(sql: str, tmp_path: Path) -> None:
    session = Session(_policy(tmp_path))
    try:
        with pytest.raises(UnsupportedQueryError, match="tables a and b, listed with a comma,"):
            session.plan(sql)
        assert session.budget().epsilon_spent == 0
    finally:
        session.close()


# One column against constants (the OR's implied filters read these), and ``p.label = 5``,
# which raises on 'x' inside TRY: an implied filter must drop exactly the rows the OR drops.
ATOMS = [
    "{eq}",
    "p.label = 'x'",
    "a.big > 3",
    "a.uid > 30",
    "a.uid < 10",
    "p.label IS NULL",
    "p.label IN ('y', 'z')",
    "a.k BETWEEN -3 AND 5",
    "p.label = 5",
]


@st.composite
def conditions(draw: st.DrawFn, depth: int = 3) -> str:
    """A condition of ANDs and ORs (parenthesised or not) over the atoms, the equality among
    them, so that terms of every precedence meet the split."""
    if depth == 0 or draw(st.integers(0, 2)) == 0:
        return draw(st.sampled_from(ATOMS))
    parts = draw(st.lists(conditions(depth - 1), min_size=2, max_size=3))
    text = f" {draw(st.sampled_from(['AND', 'OR']))} ".join(parts)
    return f"({text})" if draw(st.booleans()) else text


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    session = Session(_policy(tmp_path_factory.mktemp("where")))
    yield session
    session.close()


@settings(max_examples=examples(60), deadline=None)
@given(condition=conditions())
def test_any_condition_keeps_its_rows_when_its_equalities_are_left_bare(
    shared: Session, condition: str
) -> None:
    """However ANDs, ORs and parentheses fall, the split (bare equalities, terms common to an
    OR's branches factored out, each term made total apart) keeps the rows of the condition
    made total as a whole: inside COALESCE(..., FALSE) it is one term, split no further."""
    session = shared
    for sql in (
        "SELECT COUNT(*), SUM(a.k) FROM a, p WHERE {}",
        "SELECT COUNT(*), SUM(k) FROM (SELECT a.uid, a.k FROM a, p WHERE {}) AS t",
    ):
        bare = session.plan(sql.format(condition.replace("{eq}", "a.k = p.k")))
        whole = f"COALESCE(({condition.replace('{eq}', 'a.k = p.k')}), FALSE)"
        kept = session.plan(sql.format(whole))
        assert "COALESCE(" in kept.engine_sql  # one term, made total whole
        assert session.engine.run(bare.engine_sql)[1] == session.engine.run(kept.engine_sql)[1]
