"""Reports print numbers as the budget screens do: spent rounded up, what is left rounded down,
to 6 significant digits, never a float's repr (``4.6000000000000046``); the JSON keeps every
digit. And ``conn.budget()`` has a short repr and a notebook table in decimals."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import dpsql
from dpsql.accounting.budget.report import BudgetReport
from dpsql.interfaces.report import markdown

ROOT = Path(__file__).resolve().parents[2]


def test_a_float_s_repr_is_shown_rounded_up() -> None:
    assert markdown._up("4.6000000000000046") == "4.60001"
    assert markdown._up("0.5") == "0.5"
    assert markdown._up("inf") == markdown._up("unbounded") == "unbounded"  # one spelling
    assert markdown._number("9.99999949", markdown.left_text) == "9.99999949"  # short: exact
    assert markdown._number(str(Fraction(10) - Fraction(1, 3)), markdown.left_text) == "9.66666"
    assert markdown._short("10") == "10"
    assert markdown._up(None) is None


@settings(max_examples=examples(200))
@given(spent=st.fractions(0, 100, max_denominator=10**9), cap=st.integers(1, 1000))
def test_spent_is_never_understated_and_left_never_overstated(spent: Fraction, cap: int) -> None:
    # A float is read as the decimal it prints as (accountants round their figures up by far
    # more than an ulp: ``figure_value``); an exact fraction as itself.
    text = repr(float(spent))
    shown_spent = markdown._up(text)
    assert isinstance(shown_spent, str)
    assert Fraction(shown_spent) >= Fraction(text)
    exact = markdown._up(str(spent))
    assert isinstance(exact, str) and Fraction(exact) >= spent
    left = cap - spent
    if left > 0:
        shown_left = markdown._number(str(left), markdown.left_text)
        assert isinstance(shown_left, str) and Fraction(shown_left) <= left


def test_the_budget_report_repr_and_notebook_table_are_decimals() -> None:
    report = BudgetReport(
        "hospital",
        "basic",
        Fraction(10),
        Fraction(1, 10**6),
        Fraction(87, 20),
        Fraction(0),
        3,
        True,
    )
    assert repr(report) == (
        "<BudgetReport hospital: epsilon 4.35 spent of 10, 5.65 left; delta 0 of 0.000001; "
        "3 queries>"
    )
    page = report._repr_html_()
    assert "<td>4.35</td><td>10</td><td>5.65</td>" in page and "Fraction" not in page
    conn = dpsql.connect(str(ROOT / "examples" / "policy.toml"))
    try:
        assert "Fraction" not in repr(conn.budget())
    finally:
        conn.close()
