"""EXPLAIN is concise by default (bounds, shares, each measurement's noise ±, the diagnosis's
cost, the cost) and ``EXPLAIN VERBOSE`` (PostgreSQL's ``EXPLAIN (VERBOSE)`` too) adds the exact
sensitivities and scales and the bounded SQL. Neither charges anything; the ± EXPLAIN states is
the one the answer then carries."""

from __future__ import annotations

from fractions import Fraction

import pytest
from conftest import TINY_REGIONS, TinyPolicy

from dpsql.errors import ParseError
from dpsql.plan.estimators import half_width
from dpsql.session.session import Session
from dpsql.sql.parse import Explain, parse_statement

QUERY = (
    "SELECT region, COUNT(*) AS n, SUM(spend) AS s, MEDIAN(age) AS m FROM visits GROUP BY region"
)


def _session(tiny_policy: TinyPolicy) -> Session:
    rows = [(u, TINY_REGIONS[u % 5], 20 + u % 60, float(u % 170)) for u in range(300)]
    return Session(tiny_policy(rows))


def _lines(s: Session, text: str) -> list[str]:
    return [line for (line,) in s.execute(text).rows]


def test_the_concise_form_has_bounds_shares_noise_and_cost_only(tiny_policy: TinyPolicy) -> None:
    s = _session(tiny_policy)
    lines = _lines(s, f"EXPLAIN {QUERY}")
    assert lines[1] == "bounds: L0 = 2 group(s) per unit, C = 10 row(s) per unit and group"
    measured = [x for x in lines if x.startswith("measurement ")]
    assert len(measured) == 5  # COUNT, SUM, the median and its interval's two ends
    assert sum("interval's" in x for x in measured) == 2
    assert all("share" in x for x in measured)
    assert all("; noise ± " in x for x in measured if "exponential" not in x)
    assert any(x.startswith("cost: epsilon 1, delta ") for x in lines)
    assert "bounded SQL:" not in lines and not any("DiscreteLaplace scale" in x for x in lines)
    assert lines[-1].startswith("(EXPLAIN VERBOSE")
    assert s.budget().epsilon_spent == 0


@pytest.mark.parametrize("head", ["EXPLAIN VERBOSE", "explain verbose", "EXPLAIN (VERBOSE)",
                                  "EXPLAIN ( verbose on )", "EXPLAIN (VERBOSE TRUE)"])  # fmt: skip
def test_verbose_adds_the_exact_figures_and_the_bounded_sql(
    tiny_policy: TinyPolicy, head: str
) -> None:
    s = _session(tiny_policy)
    lines = _lines(s, f"{head} {QUERY}")
    assert "bounded SQL:" in lines and lines[-1].startswith("  ")
    assert any("DiscreteLaplace scale" in x and "; noise ± " in x for x in lines)
    # Every line of the concise form's measurements, cost and bounds is in the verbose one too.
    concise = _lines(s, f"EXPLAIN {QUERY}")
    assert [x for x in concise if x.startswith(("table", "bounds", "keys", "cost"))] == [
        x for x in lines if x.startswith(("table", "bounds", "keys", "cost"))
    ]
    assert s.budget().epsilon_spent == 0


def test_verbose_false_is_the_concise_form(tiny_policy: TinyPolicy) -> None:
    s = _session(tiny_policy)
    assert _lines(s, f"EXPLAIN (VERBOSE OFF) {QUERY}") == _lines(s, f"EXPLAIN {QUERY}")
    statement = parse_statement(f"EXPLAIN (verbose false) {QUERY}")
    assert isinstance(statement, Explain) and not statement.verbose


def test_the_noise_explain_states_is_the_answer_s(tiny_policy: TinyPolicy) -> None:
    """The concise ± of the COUNT is the half-width the released count carries."""
    s = _session(tiny_policy)
    plan = s.plan(QUERY)
    count = plan.measurements[0]
    expected = Fraction(half_width(count, plan.options.confidence)) * count.unit
    line = next(x for x in _lines(s, f"EXPLAIN {QUERY}") if x.startswith("measurement COUNT(*)"))
    shown = Fraction(line.split("noise ± ")[1].split(" ")[0])
    assert expected <= shown <= expected * Fraction(101, 100)
    result = s.execute(QUERY)
    assert result.accuracy[0][1] == pytest.approx(float(expected))


@pytest.mark.parametrize(
    "text", ["EXPLAIN VERBOSE", "EXPLAIN (VERBOSE", "EXPLAIN VERBOSE VERBOSE SELECT 1"]
)
def test_a_malformed_option_is_a_parse_error(text: str) -> None:
    with pytest.raises(ParseError):
        parse_statement(text)
