"""Parallel composition across queries pinned to different values of a constant-per-unit column.

DESIGN.md section 4: disjointness is read from the AST, never assumed, and the bounded SQL
enforces it (each unit keeps the rows of one value, chosen by keyed hash, before any filter).
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any

import duckdb
import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsql.accounting.budget.budget import Budget
from dpsql.errors import BudgetExceededError
from dpsql.mechanisms.events import Composite
from dpsql.mechanisms.laplace_events import DiscreteLaplace
from dpsql.policy import BudgetSpec, Policy, load_policy
from dpsql.session.session import Session

QUERY = "SELECT COUNT(*) FROM visits WHERE home = '{home}' AND spend >= 0"


def _policy(tmp_path: Path, *, declared: bool, epsilon: str = "10") -> Policy:
    path = tmp_path / "visits.parquet"
    con = duckdb.connect()
    # Unit u lives in one home, except every 10th unit, which violates the declaration and has
    # rows in both homes.
    con.execute(
        f"""COPY (
            SELECT u AS user_id, CASE WHEN u % 2 = 0 THEN 'north' ELSE 'south' END AS home,
                   1.0 AS spend FROM range(1, 301) AS t(u), range(3) AS r(k)
            UNION ALL
            SELECT u, CASE WHEN u % 2 = 0 THEN 'south' ELSE 'north' END, 1.0
            FROM range(10, 301, 10) AS t(u)
        ) TO '{path}' (FORMAT PARQUET)"""
    )
    con.close()
    table: dict[str, Any] = {"privacy_unit": "user_id", "max_rows_per_unit_per_group": 5}
    if declared:
        table["constant_per_unit"] = ["home"]
    return load_policy(
        {
            "dataset": {"id": "parallel"},
            "data": {"tables": {"visits": str(path)}},
            "budget": {"diagnose": False, "epsilon": epsilon, "query_epsilon": "1"},
            "tables": {"visits": table},
        }
    )


def test_disjoint_cells_are_charged_their_maximum(tmp_path: Path) -> None:
    session = Session(_policy(tmp_path, declared=True))
    session.execute(QUERY.format(home="north"))
    session.execute(QUERY.format(home="south"), epsilon=0.5)
    # Each unit is in one cell: its loss is that cell's, never less than the largest part.
    assert session.budget().epsilon_spent == 1
    session.execute(QUERY.format(home="north"), epsilon=0.25)
    assert session.budget().epsilon_spent == Fraction(5, 4)
    # An unpinned query touches every unit: it adds to every cell.
    session.execute("SELECT COUNT(*) FROM visits", epsilon=0.5)
    assert session.budget().epsilon_spent == Fraction(7, 4)


def test_without_a_declaration_the_same_queries_are_charged_their_sum(tmp_path: Path) -> None:
    session = Session(_policy(tmp_path, declared=False))
    session.execute(QUERY.format(home="north"))
    session.execute(QUERY.format(home="south"), epsilon=0.5)
    assert session.budget().epsilon_spent == Fraction(3, 2)


def test_the_filter_admits_per_cell(tmp_path: Path) -> None:
    session = Session(_policy(tmp_path, declared=True, epsilon="1.5"))
    session.execute(QUERY.format(home="north"))
    session.execute(QUERY.format(home="south"))  # another cell: fits
    with pytest.raises(BudgetExceededError):
        session.execute(QUERY.format(home="north"), fresh=True)  # same cell: 2 > 1.5
    with pytest.raises(BudgetExceededError):
        session.execute("SELECT COUNT(*) FROM visits")  # every cell: 2 > 1.5
    session.execute("SELECT COUNT(*) FROM visits", epsilon=0.5)
    assert session.budget().epsilon_spent == Fraction(3, 2)


@pytest.mark.parametrize(
    "where",
    [
        "home = 'north' OR spend > 0",  # not a conjunct
        "home <> 'north'",  # not an equality
        "home = upper('north')",  # not a literal
        "home = spend",  # another column
    ],
)
def test_only_a_top_level_equality_with_a_literal_pins_a_cell(tmp_path: Path, where: str) -> None:
    session = Session(_policy(tmp_path, declared=True))
    plan = session.plan(f"SELECT COUNT(*) FROM visits WHERE {where}")
    assert plan.analysis.cell is None and plan.event.cell is None


def test_the_cell_comes_from_the_query_not_the_data(tmp_path: Path) -> None:
    session = Session(_policy(tmp_path, declared=True))
    plan = session.plan(QUERY.format(home="east"))  # no unit lives there: still a cell
    assert plan.event.cell == ("visits.home@1", "east")
    # The engine keys the literal in the column's type: the number 1 is the text '1' here.
    assert session.plan("SELECT COUNT(*) FROM visits WHERE home = 1").event.cell == (
        "visits.home@1",
        "1",
    )


def test_the_rewrite_keeps_each_unit_in_one_cell_on_data_that_break_the_declaration(
    tmp_path: Path,
) -> None:
    session = Session(_policy(tmp_path, declared=True))
    units: dict[str, set[int]] = {}
    for home in ("north", "south"):
        plan = session.plan(QUERY.format(home=home))
        sql = plan.engine_sql
        # Read the units that reach the bounded rows of this cell.
        rows_only = sql[: sql.index("_vals AS")].rstrip(", ") + " SELECT DISTINCT _u FROM _rows"
        _, rows = session.engine.run(rows_only)
        units[home] = {int(r[0]) for r in rows}
    assert units["north"] and units["south"]
    assert not units["north"] & units["south"]
    # The violating units (every 10th) are each in exactly one of the two cells.
    violating = set(range(10, 301, 10))
    assert violating <= units["north"] | units["south"]


@settings(max_examples=examples(60), deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([None, "north", "south", "east"]), st.integers(1, 20)),
        min_size=1,
        max_size=12,
    )
)
def test_parallel_charges_the_worst_cell_never_less_than_any_part(
    queries: list[tuple[str | None, int]],
) -> None:
    budget = Budget("p", BudgetSpec(epsilon=Fraction(10**4)))
    for cell, tenths in queries:
        event = DiscreteLaplace(Fraction(10), Fraction(tenths))  # epsilon = tenths / 10
        where = ("visits.home@1", cell) if cell is not None else None
        budget.charge(Composite((event,), cell=where), "q", None)
    spent = budget.report().epsilon_spent
    unpinned = sum(Fraction(t, 10) for c, t in queries if c is None)
    cells = {c for c, _ in queries if c is not None}
    worst = max(
        [unpinned]
        + [unpinned + sum(Fraction(t, 10) for c, t in queries if c == cell) for cell in cells]
    )
    assert spent == worst
    assert spent >= max(Fraction(t, 10) for _, t in queries)
    # Without cells (an undeclared column), the same queries cost their sum.
    assert spent <= sum(Fraction(t, 10) for _, t in queries)
    undeclared = Budget("u", BudgetSpec(epsilon=Fraction(10**4)))
    for _, tenths in queries:
        undeclared.charge(Composite((DiscreteLaplace(Fraction(10), Fraction(tenths)),)), "q", None)
    assert undeclared.report().epsilon_spent == sum(Fraction(t, 10) for _, t in queries)
