"""The Session's pipeline contract: what is charged, when, with what record, and what is secret."""

from __future__ import annotations

from fractions import Fraction

import pytest
from conftest import TinyPolicy

from dpsql.errors import BudgetExceededError, EngineError
from dpsql.session.session import Session

ROWS = [(u, ["east", "west"][u % 2], 20 + u % 50, float(u % 300)) for u in range(1, 400)]


@pytest.fixture
def session(tiny_policy: TinyPolicy) -> Session:
    return Session(tiny_policy(ROWS))


def test_each_fresh_answer_is_one_charge_naming_the_bound_query(session: Session) -> None:
    result = session.execute(
        "SELECT region, COUNT(*) FROM visits WHERE age > ? GROUP BY region", (30,), epsilon=0.25
    )
    (charge,) = session.filter.charges
    assert charge == result.charge
    # The record names the parameter-bound query (so a later report can say what was answered)
    # and the event actually planned, whose loss is exactly the query's epsilon.
    assert charge.query == "SELECT region, COUNT(*) FROM visits WHERE age > 30 GROUP BY region"
    assert result.plan is not None
    assert charge.event == result.plan.event
    assert charge.epsilon == Fraction(1, 4) and charge.delta == 0
    session.execute("SELECT COUNT(*) FROM visits", epsilon=0.25)
    assert len(session.filter.charges) == 2
    assert session.budget().epsilon_spent == Fraction(1, 2)


def test_the_charge_is_committed_before_the_engine_runs(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Fraction] = []

    def run(sql: str) -> tuple[list[str], list[tuple[object, ...]]]:
        seen.append(session.budget().epsilon_spent)
        raise EngineError("engine down")

    monkeypatch.setattr(session.engine, "run", run)
    with pytest.raises(EngineError):
        session.execute("SELECT COUNT(*) FROM visits", epsilon=0.5)
    # When the engine started, the charge was already on the books, and it stays.
    assert seen == [Fraction(1, 2)]
    assert session.budget().epsilon_spent == Fraction(1, 2)


def test_a_refused_query_never_reaches_the_engine(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    def run(sql: str) -> tuple[list[str], list[tuple[object, ...]]]:
        raise AssertionError("the engine ran a query the budget refused")

    monkeypatch.setattr(session.engine, "run", run)
    with pytest.raises(BudgetExceededError):
        session.execute("SELECT COUNT(*) FROM visits", epsilon=11)
    assert session.filter.charges == ()


def test_the_hash_salt_is_bound_by_the_engine_and_never_shown(session: Session) -> None:
    salt = str(session.engine.salt)
    sql = "SELECT region, COUNT(*) FROM visits GROUP BY region"
    plan = session.plan(sql)
    explained = "\n".join(row[0] for row in session.execute("EXPLAIN VERBOSE " + sql).rows)
    assert "$salt" in plan.engine_sql and "$salt" in explained
    for text in (plan.engine_sql, plan.bounded_sql, explained, repr(plan)):
        assert salt not in text
    # The engine binds it when it runs the plan.
    assert session.engine.run(plan.engine_sql)[1]


def test_explain_and_plan_charge_nothing(session: Session) -> None:
    session.plan("SELECT AVG(spend) FROM visits")
    session.execute("EXPLAIN SELECT AVG(spend) FROM visits")
    assert session.filter.charges == ()
