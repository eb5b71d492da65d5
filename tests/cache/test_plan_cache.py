"""The session's plan cache: a plan is reused only under its whole key (the statement's text,
parameters and options, every SET value, the analyst, the policy's content digest, the data
version and the bounds estimated so far), and a reused plan is still checked, charged and
noised afresh on every fresh execution."""

from __future__ import annotations

from fractions import Fraction

import pytest
from conftest import TinyPolicy

from dpsql.errors import BudgetExceededError, ParameterError
from dpsql.session.session import Session

ROWS = [(u, ["east", "west"][u % 2], 20 + u % 50, float(u % 300)) for u in range(1, 400)]
QUERY = "SELECT region, COUNT(*) AS n, SUM(spend) AS s FROM visits GROUP BY region"


@pytest.fixture
def session(tiny_policy: TinyPolicy) -> Session:
    return Session(tiny_policy(ROWS))


def _plan_of(session: Session, sql: str = QUERY) -> object:
    result = session.execute(sql, fresh=True)
    assert result.plan is not None
    return result.plan


def test_a_repeated_statement_reuses_its_plan(session: Session) -> None:
    first = _plan_of(session)
    assert _plan_of(session) is first
    assert session.plan(QUERY) is session.plan(QUERY)


def test_every_fresh_execution_of_a_reused_plan_is_charged(session: Session) -> None:
    for n in range(1, 6):
        result = session.execute(QUERY, fresh=True)
        assert result.charge is not None and result.cached_from is None
        assert len(session.filter.charges) == n
    assert session.budget().epsilon_spent == 5
    charges = session.filter.charges
    assert len({c.seq for c in charges}) == 5


def test_a_reused_plan_draws_fresh_noise(session: Session) -> None:
    answers = {session.execute(QUERY, fresh=True).rows for _ in range(6)}
    # Six independent draws of two discrete-Laplace counts and sums (epsilon 1 split over four
    # measurements): all six equal has probability far below 1e-6.
    assert len(answers) == 6


def test_the_filter_still_refuses_a_reused_plan(tiny_policy: TinyPolicy) -> None:
    session = Session(tiny_policy(ROWS, budget={"epsilon": "3"}))
    for _ in range(3):
        session.execute(QUERY, fresh=True)
    with pytest.raises(BudgetExceededError):
        session.execute(QUERY, fresh=True)
    assert len(session.filter.charges) == 3


def test_a_set_plans_afresh(session: Session) -> None:
    first = _plan_of(session)
    session.execute("SET dpsql.epsilon = 0.5")
    second = _plan_of(session)
    assert second is not first
    assert session.filter.charges[-1].epsilon == Fraction(1, 2)
    session.execute("SET dpsql.epsilon = 1")
    third = _plan_of(session)
    # Same effective value, but set: keyed apart from the policy default, never confused.
    assert third is not first and session.filter.charges[-1].epsilon == 1
    session.set_option("epsilon", None)
    assert _plan_of(session) is first


def test_keyword_options_and_parameters_are_part_of_the_key(session: Session) -> None:
    sql = "SELECT COUNT(*) AS n FROM visits WHERE age > ?"
    a = session.execute(sql, (30,), epsilon=0.25)
    b = session.execute(sql, (31,), epsilon=0.25)
    # Fresh: at another epsilon the same bounded rows are otherwise derived from a's release.
    c = session.execute(sql, (30,), epsilon=0.5, fresh=True)
    d = session.execute(sql, ("30",), epsilon=0.25)
    plans = [r.plan for r in (a, b, c, d)]
    assert len({id(p) for p in plans}) == 4
    assert [r.charge.epsilon for r in (a, c) if r.charge] == [Fraction(1, 4), Fraction(1, 2)]
    assert session.execute(sql, [30], epsilon=0.25).plan is not None


def test_another_analyst_plans_afresh(session: Session) -> None:
    first = _plan_of(session)
    session.analyst = "bob"
    second = _plan_of(session)
    assert second is not first
    assert session.filter.charges[-1].analyst == "bob"


def test_a_policy_edit_plans_afresh(session: Session) -> None:
    first = _plan_of(session)
    budget = session.policy.budget.model_copy(update={"query_epsilon": Fraction(1, 4)})
    session.policy = session.policy.model_copy(update={"budget": budget})
    second = _plan_of(session)
    assert second is not first
    assert session.filter.charges[-1].epsilon == Fraction(1, 4)
    records = [r for r in session.filter.store.records() if r.kind == "charge"]
    assert records[-1].payload["policy_version"] == session.policy.version
    assert records[0].payload["policy_version"] != session.policy.version


def test_a_data_version_change_plans_afresh(session: Session) -> None:
    first = session.execute(QUERY)
    assert first.charge is not None
    dataset = session.policy.dataset.model_copy(update={"data_version": "2"})
    session.policy = session.policy.model_copy(update={"dataset": dataset})
    second = session.execute(QUERY)
    assert second.plan is not first.plan
    # The release of data version 1 is not served for version 2: a new charge.
    assert second.charge is not None and second.cached_from is None
    records = [r for r in session.filter.store.records() if r.kind == "charge"]
    assert [r.payload["data_version"] for r in records] == ["1", "2"]


def test_explain_and_the_query_are_kept_apart(session: Session) -> None:
    explained = session.execute("EXPLAIN " + QUERY)
    assert explained.columns == ("plan",) and explained.charge is None
    answered = session.execute(QUERY)
    assert answered.charge is not None and answered.columns == ("region", "n", "s")
    assert session.execute("EXPLAIN " + QUERY).charge is None


def test_a_refused_statement_is_refused_every_time(session: Session) -> None:
    for _ in range(2):
        with pytest.raises(ParameterError):
            session.execute("SELECT COUNT(*) FROM visits", epsilon=-1)
    assert session.filter.charges == ()


def test_a_cached_release_is_still_served_from_a_reused_plan(session: Session) -> None:
    fresh = session.execute(QUERY)
    again = session.execute(QUERY)
    assert again.cached_from is not None and again.charge is None
    assert again.rows == fresh.rows
    assert len(session.filter.charges) == 1


def test_a_bounds_estimate_plans_afresh(tiny_policy: TinyPolicy) -> None:
    session = Session(tiny_policy(ROWS, columns={"age": {"lower": 18, "upper": 90}}))
    sql = "SELECT COUNT(*) AS n FROM visits"
    before = session.plan(sql)
    assert session.plan(sql) is before
    session.execute("ESTIMATE BOUNDS FOR visits.spend", epsilon=4)
    # The policy with the estimated bounds is another input: planned again.
    assert session.plan(sql) is not before
    assert session.execute("SELECT SUM(spend) AS s FROM visits", fresh=True).charge is not None


def test_the_charge_record_keeps_the_plan_lines_without_the_sql(session: Session) -> None:
    sql = "SELECT region, AVG(spend) AS a FROM visits WHERE age > 30 GROUP BY region"
    result = session.execute(sql, fresh=True)
    assert result.plan is not None
    (record,) = [r for r in session.filter.store.records() if r.kind == "charge"]
    explained = result.plan.explain()
    assert record.payload["plan"] == [line for line in explained if not line.startswith("  ")]
    assert record.payload["plan"][-1] == "bounded SQL:"
    assert record.payload["bounded_sql"] == result.plan.engine_sql
