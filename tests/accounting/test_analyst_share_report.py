"""An analyst sees their own share: ``Session.budget()`` (``conn.budget()``, the shell's
``\\budget``, ``SHOW dpsql.budget`` over the wire) reports what the caller spent of their
share, read as the filter that decides their queries reads it, beside the data set's totals.

Generated streams of queries under each filter pin that the share's reading agrees with the
decisions: while the filter admits, the reading is at most the share; the remaining is never
negative; a refusal comes only when the next query would not fit by that reading (basic) or the
filter's own test (the others)."""

from __future__ import annotations

from fractions import Fraction

import pytest
from conftest import TinyPolicy, examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dpsql
from dpsql.errors import BudgetExceededError
from dpsql.session.session import Session

ROWS = [(u, ("east", "west")[u % 2], 18 + u % 60, float(u % 50)) for u in range(1, 120)]
QUERY = "SELECT COUNT(*) AS n FROM visits"
FILTERS = {
    "basic": {},
    "rdp": {"accountant": "rdp"},
    "zcdp": {"accountant": "zcdp"},
    "advanced": {"accountant": "advanced", "advanced_delta_prime": "0.0000005"},
}


def _shared(tiny_policy: TinyPolicy, accountant: str, share: str = "0.6") -> tuple[Session, ...]:
    budget = {
        "epsilon": "2",
        "delta": "0.000001",
        **FILTERS[accountant],
        "analysts": {
            "ana": {"epsilon": share, "delta": "0.0000005"},
            "bo": {"epsilon": "1", "delta": "0.0000005"},
        },
    }
    policy = tiny_policy(ROWS, budget=budget)
    ana, bo = Session(policy, analyst="ana"), Session(policy, analyst="bo")
    bo.filter = ana.filter  # one budget for both (in memory)
    return ana, bo


def test_the_report_carries_the_callers_share(tiny_policy: TinyPolicy) -> None:
    ana, bo = _shared(tiny_policy, "basic")
    ana.execute(QUERY, epsilon="0.25")
    bo.execute(QUERY, epsilon="0.5")
    mine = ana.budget().share
    assert mine is not None and mine.analyst == "ana"
    assert (mine.epsilon_share, mine.epsilon_spent, mine.queries) == (
        Fraction(3, 5),
        Fraction(1, 4),
        1,
    )
    assert mine.epsilon_remaining == Fraction(7, 20)
    report = bo.budget()
    assert report.share is not None and report.share.epsilon_spent == Fraction(1, 2)
    assert report.epsilon_spent == Fraction(3, 4)  # the data set's total, beside it
    text = str(ana.budget())
    assert text.startswith("analyst ana: epsilon 0.25 spent of their share 0.6 (0.35 left)")
    assert "dataset tiny: epsilon 0.75 spent of 2" in text


def test_no_share_no_share_line(tiny_policy: TinyPolicy) -> None:
    session = Session(tiny_policy(ROWS), analyst="ana")
    assert session.budget().share is None and not str(session.budget()).startswith("analyst")
    assert Session(tiny_policy(ROWS)).budget().share is None


@settings(
    max_examples=examples(25),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    accountant=st.sampled_from(sorted(FILTERS)),
    costs=st.lists(st.sampled_from(["0.05", "0.1", "0.2", "0.3"]), min_size=1, max_size=12),
)
def test_the_share_reading_agrees_with_the_decisions(
    tiny_policy: TinyPolicy, accountant: str, costs: list[str]
) -> None:
    ana, _ = _shared(tiny_policy, accountant)
    for cost in costs:
        before = ana.budget().share
        assert before is not None
        try:
            ana.execute(QUERY, epsilon=cost, fresh=True)
        except BudgetExceededError:
            after = ana.budget().share
            assert after == before  # a refusal charges nothing
            if accountant == "basic":
                assert before.epsilon_spent + Fraction(cost) > before.epsilon_share
            continue
        after = ana.budget().share
        assert after is not None
        assert after.epsilon_spent <= after.epsilon_share  # admitted: within the share
        assert after.epsilon_spent > before.epsilon_spent
        assert after.epsilon_remaining >= 0 and after.queries == before.queries + 1


def test_dbapi_budget_shows_the_share(tiny_policy: TinyPolicy) -> None:
    budget = {"epsilon": "2", "analysts": {"ana": {"epsilon": "0.5"}}}
    with dpsql.connect(tiny_policy(ROWS, budget=budget), analyst="ana") as conn:
        conn.cursor().execute("SET dpsql.epsilon = 0.1")
        conn.cursor().execute(QUERY)
        share = conn.budget().share
        assert share is not None and share.epsilon_remaining == Fraction(2, 5)
        cursor = conn.cursor()
        cursor.execute("SHOW dpsql.budget")
        (line,) = cursor.fetchone()  # type: ignore[misc]
        assert line.startswith("analyst ana: epsilon 0.1 spent of their share 0.5")


@pytest.mark.parametrize("accountant", sorted(FILTERS))
def test_every_filter_gives_a_share_reading(tiny_policy: TinyPolicy, accountant: str) -> None:
    ana, _ = _shared(tiny_policy, accountant)
    ana.execute(QUERY, epsilon="0.1")
    share = ana.budget().share
    assert share is not None and 0 < share.epsilon_spent <= share.epsilon_share
