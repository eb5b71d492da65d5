"""The budget report tells the truth about the decision.

The report's "decides" figure (``BudgetReport.epsilon_spent``, ``ShareReport.epsilon_spent``
and the ``decides`` row of ``figures``) is the deciding filter's own bound, read on the views of
parallel composition the way the filter decides: after every admitted query it is within the
cap, and at every refusal the refused query would take it over the cap, by the figure the
refusal names. Driven by random streams of charges (cells of several families, analysts with
shares, top-ups) under rdp (its grid and one order), zcdp (an epsilon cap and a rho cap),
advanced and basic composition, each compared with the filter folded afresh over every view.
What is left is never negative; a top-up after answers marks the cap as adaptive and states the
basic-composition figure, which holds adaptively.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

import pytest
from conftest import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dpsql
from dpsql.accounting.budget import parallel
from dpsql.accounting.budget.budget import Budget
from dpsql.accounting.budget.build import odometers
from dpsql.accounting.budget.report import EXCEEDS, Figure, figure_left
from dpsql.accounting.budget.state import events_for
from dpsql.accounting.ledger.ledger import BUDGET_RECORD
from dpsql.accounting.ledger.store import MemoryLedger, budget_caps, pinned_spec
from dpsql.accounting.theorems.base import Filter
from dpsql.errors import BudgetExceededError
from dpsql.interfaces.cli.budget_view import show_text
from dpsql.mechanisms.events import Composite, Event
from dpsql.mechanisms.gaussian_events import DiscreteGaussian
from dpsql.mechanisms.laplace_events import DiscreteLaplace
from dpsql.mechanisms.selection_events import Exponential, LaplacePartitionSelection
from dpsql.mechanisms.stated_events import ApproxDP, PureDP
from dpsql.policy import BudgetSpec

F = Fraction

EVENTS: list[Event] = [
    DiscreteLaplace(F(20), F(1), "COUNT"),
    DiscreteLaplace(F(8), F(1)),
    DiscreteLaplace(F(3), F(1)),
    DiscreteGaussian(F(2000), F(1), F(1, 5), F(1, 10**9)),
    DiscreteGaussian(F(300), F(2), F(3, 10), F(1, 10**8), dimensions=3),
    Exponential(F(1, 10)),
    LaplacePartitionSelection(F(20), F(1), 30, F(2, 10**7)),
    PureDP(F(1, 20)),
    ApproxDP(F(1, 30), F(1, 10**8)),
]
CELLS: list[tuple[str, str] | None] = [
    None,
    None,
    ("visits.region", "east"),
    ("visits.region", "west"),
    ("visits.country", "fr"),
    ("visits.country", "de"),
]
CONFIGS: dict[str, dict[str, Any]] = {
    "rdp grid": {"accountant": "rdp"},
    "rdp one order": {"accountant": "rdp", "rdp_order": "24"},
    "zcdp epsilon cap": {"accountant": "zcdp"},
    "zcdp rho cap": {"accountant": "zcdp", "rho": "0.04", "epsilon": None},
    "advanced": {"accountant": "advanced", "advanced_delta_prime": "5e-7"},
    "basic": {"accountant": "basic"},
}
SHARES = {"ann": {"epsilon": "1", "delta": "1e-6"}, "bob": {"epsilon": "0.6", "delta": "1e-6"}}

composites = st.builds(
    lambda evs, cell: Composite(tuple(evs), None, cell),
    st.lists(st.sampled_from(EVENTS), min_size=1, max_size=2),
    st.sampled_from(CELLS),
)
operations = st.lists(
    st.one_of(
        *[st.tuples(st.just("charge"), composites, st.sampled_from(["ann", "bob"]))] * 6,
        st.tuples(st.just("add"), st.sampled_from([F(1, 10), F(1, 2)]), st.just(None)),
    ),
    min_size=1,
    max_size=45,
)


def _budget(config: str, shares: bool) -> Budget:
    spec_data: dict[str, Any] = {"epsilon": "1.5", "delta": "2e-6", **CONFIGS[config]}
    if shares:
        spec_data["analysts"] = SHARES
    spec = BudgetSpec.model_validate({k: v for k, v in spec_data.items() if v is not None})
    store = MemoryLedger()
    store.append(BUDGET_RECORD, budget_caps(spec))
    return Budget("visits", pinned_spec(spec, store), store, odometers())


def _fresh(budget: Budget, rule: Filter, history: list[Composite]) -> Any:
    """The filter's own figure over every view of ``history``, each folded into a fresh tally
    (nothing of the budget's running state is read)."""
    readings = []
    for view in parallel.views(history, lambda c: c.cell):
        tally = rule.tally()
        for event in events_for(rule.name, view):
            tally.add(event)
        readings.append(rule.epsilon_spent(tally))
    return max(readings)


def _after(rule: Filter, history: list[Composite], new: Composite) -> tuple[Any, Any]:
    """The filter's own figure before and after ``new``, worst of the views that hold it."""
    before, after = [], []
    for view in parallel.views_with(history, new, lambda c: c.cell):
        tally = rule.tally()
        for event in events_for(rule.name, view[:-1]):
            tally.add(event)
        before.append(rule.epsilon_spent(tally))
        after.append(rule.epsilon_spent(tally, events_for(rule.name, [view[-1]])))
    return max(before), max(after)


def _basic(history: list[Composite]) -> F:
    views = parallel.views(history, lambda c: c.cell)
    return max(sum((c.epsilon for c in v), F(0)) for v in views)


def _basic_delta(history: list[Composite]) -> F:
    views = parallel.views(history, lambda c: c.cell)
    return max(sum((c.delta for c in v), F(0)) for v in views)


def _caps(budget: Budget, who: str | None) -> tuple[F, F]:
    report = budget.report(who)
    if who is None:
        return report.epsilon_total, report.delta_total
    assert report.share is not None
    return report.share.epsilon_share, report.share.delta_share


def _check_report(budget: Budget, who: str | None, history: list[Composite]) -> None:
    """The report's decision line is the deciding filter's state, recomputed afresh."""
    report = budget.report(who)
    line = report if who is None else report.share
    assert line is not None
    cap = _caps(budget, who)
    rule = budget._rule(cap, who is None)
    if isinstance(rule, tuple):
        assert line.epsilon_spent == _basic(history)
    else:
        assert line.epsilon_spent == _fresh(budget, rule, history)
    assert line.epsilon_remaining >= 0
    if line.epsilon_spent <= cap[0]:
        assert line.epsilon_remaining == cap[0] - line.epsilon_spent
    if who is None:
        decides = next(f for f in report.figures if f.note == "decides")
        assert decides.accountant == budget.name
        assert decides.epsilon == float(report.epsilon_spent)


def _check_refusal(budget: Budget, query: Composite, who: str, message: str) -> None:
    """Refused: the query takes the data set's or the analyst's filter over its cap, by the
    figure the message names."""
    history = [c.event for c in budget.charges]
    mine = [c.event for c in budget.charges if c.analyst == who]
    over = []
    for scope, seen in (("*", history), (who, mine)):
        cap = _caps(budget, None if scope == "*" else who)
        rule = budget._rule(cap, scope == "*")
        if isinstance(rule, tuple):
            after_eps = _basic([*seen, query]) if seen else query.epsilon
            after_delta = _basic_delta([*seen, query])
            over.append(after_eps > cap[0] or after_delta > cap[1])
        else:
            before, after = _after(rule, seen, query)
            spent = _fresh(budget, rule, seen) if seen else F(0)
            # The report's spent (the worst view) plus what the query adds to the worst view
            # holding it (after - before) is at least ``after``: above the cap at a refusal.
            assert spent >= before and after >= before
            over.append(after > cap[0])
    assert any(over), message
    if over[0] and budget.name != "basic":
        reach = re.search(r"its own epsilon would reach (\S+) of", message)
        assert reach is not None or "certify nothing" in message, message
        if reach is not None:
            assert F(reach.group(1)) > _caps(budget, None)[0]


@pytest.mark.parametrize("shares", [False, True], ids=["no shares", "analyst shares"])
@pytest.mark.parametrize("config", sorted(CONFIGS))
@settings(max_examples=examples(40), suppress_health_check=[HealthCheck.too_slow])
@given(ops=operations)
def test_the_report_is_the_deciding_filters_own_state(
    config: str, shares: bool, ops: list[tuple[str, Any, Any]]
) -> None:
    budget = _budget(config, shares)
    for kind, value, who in ops:
        analyst = who if shares else None
        if kind == "add":
            budget.add(value, F(0), "owner", "top-up")
            continue
        try:
            budget.charge(value, "SELECT ...", analyst)
        except BudgetExceededError as exc:
            _check_refusal(budget, value, analyst or "*", str(exc))
            continue
        history = [c.event for c in budget.charges]
        assert budget.report().epsilon_spent <= _caps(budget, None)[0]
        _check_report(budget, None, history)
        if analyst is not None:
            mine = [c.event for c in budget.charges if c.analyst == analyst]
            assert budget.report(analyst).share.epsilon_spent <= _caps(budget, analyst)[0]  # type: ignore[union-attr]
            _check_report(budget, analyst, mine)


def test_a_figure_above_the_cap_is_shown_as_such_and_nothing_left_is_negative() -> None:
    cap = F(1)
    above = Figure("basic", 3.5, "valid adaptively")
    assert figure_left(above, cap) == EXCEEDS
    assert figure_left(Figure("rdp", 0.25, "as if fixed in advance"), cap) == "0.75"
    # Bounds nothing: it leaves nothing, as the deciding filter's remaining once unbounded.
    assert figure_left(Figure("gdp", float("inf"), "as if fixed in advance"), cap) == "0"
    assert figure_left(Figure("rdp", 1.0000001, "decides"), cap) == "0"
    budget = _budget("rdp grid", False)
    count = Composite((DiscreteLaplace(F(100), F(1)),))
    for _ in range(200):
        budget.charge(count, "SELECT COUNT(*) FROM t", None)
    text = show_text(budget.report(), compare=True)
    assert re.search(rf"^│ basic .*│ {EXCEEDS} │ valid adaptively", text, re.M), text
    assert not re.search(r"│ +-\d", text), text  # no negative number in any cell


def test_a_top_up_after_answers_makes_the_cap_adaptive() -> None:
    budget = _budget("zcdp epsilon cap", False)
    count = Composite((DiscreteLaplace(F(20), F(1)),))
    budget.add(F(1, 2), F(0), "owner", "before any query")  # fixed before the first query
    assert budget.report().adaptive_cap is None
    budget.charge(count, "SELECT COUNT(*) FROM t", None)
    assert budget.report().adaptive_cap is None and "raised" not in str(budget.report())
    record = budget.add(F(1), F(0), "owner", "more, after an answer")
    budget.charge(count, "SELECT COUNT(*) FROM t", None)
    report = budget.report()
    assert report.adaptive_cap == record.seq
    assert report.valid_adaptively == (F(1, 10), F(0))  # basic composition of the two charges
    assert f"ledger record {record.seq}" in str(report) and "epsilon 0.1, delta 0" in str(report)
    assert "Adaptive cap" in show_text(report)
    basic = _budget("basic", False)
    basic.charge(count, "q", None)
    basic.add(F(1), F(0), "owner", "after")
    # Under basic composition the guarantee is the realised sum: the filter's own figure.
    assert basic.report().valid_adaptively == (basic.report().epsilon_spent, F(0))


def _policy(accountant: str) -> dict[str, Any]:
    return {
        "dataset": {"id": "fresh-counts", "data_version": "1"},
        "data": {"tables": {"visits": "examples/data/visits.parquet"}},
        "budget": {"diagnose": False, "epsilon": "1", "delta": "1e-6", "accountant": accountant,
                   "query_epsilon": "0.05"},
        "tables": {"visits": {"privacy_unit": "user_id", "max_groups_per_unit": 1,
                              "max_rows_per_unit_per_group": 10}},
    }  # fmt: skip


@pytest.mark.parametrize("accountant", ["rdp", "zcdp"])
def test_at_the_refusal_of_fresh_counts_the_report_says_why(accountant: str) -> None:
    """Through ``dpsql.connect``: fresh COUNTs of epsilon 0.05 until the filter refuses one;
    the report then leaves less than that query would add under the filter, and the refusal's
    figure is above the cap (an odometer's reading would have left much more)."""
    with dpsql.connect(_policy(accountant)) as conn:
        cursor = conn.cursor()
        with pytest.raises(dpsql.OperationalError) as refused:
            for _ in range(1000):
                cursor.execute("SELECT COUNT(*) FROM visits", fresh=True)
        report = conn.budget()
    reach = re.search(r"its own epsilon would reach (\S+) of 1;", str(refused.value))
    assert reach is not None, str(refused.value)
    after = F(reach.group(1))
    assert after > 1
    assert report.epsilon_remaining < after - report.epsilon_spent  # what is left cannot pay it
    assert report.epsilon_spent <= 1 and report.epsilon_spent > F(95, 100)
    odometer = next(f for f in report.figures if f.accountant == accountant)
    assert odometer.note == "decides" and odometer.epsilon == float(report.epsilon_spent)
