"""The incremental decision is exactly the stateless one.

Every filter's ``admits_tally`` (running state, O(1) in the history's length) must decide what
``admits(history, new)`` (the whole history replayed) decides, and a ``Budget`` deciding from
its per-view tallies must admit and refuse exactly what a ``Budget(replay=True)`` admits and
refuses, on random mixed streams: discrete Laplace, discrete and continuous Gaussians (some
jointly calibrated), exponential, partition selection, generic events, pinned cells of several
families (and past the view limit), several analysts with shares, top-ups and allocations.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from conftest import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpsql.accounting.budget import parallel
from dpsql.accounting.budget.budget import Budget
from dpsql.accounting.budget.build import odometers
from dpsql.accounting.budget.state import events_for
from dpsql.accounting.ledger.ledger import BUDGET_RECORD
from dpsql.accounting.ledger.store import MemoryLedger, budget_caps, pinned_spec
from dpsql.accounting.theorems.advanced import AdvancedFilter
from dpsql.accounting.theorems.basic import BasicFilter
from dpsql.accounting.theorems.gdp import GdpFilter
from dpsql.accounting.theorems.pld_filter import PldFilter
from dpsql.accounting.theorems.rdp import ORDERS_V1, RdpFilter
from dpsql.accounting.theorems.zcdp import ZcdpFilter
from dpsql.errors import BudgetExceededError, ParameterError, UndeclaredMechanismError
from dpsql.mechanisms.events import Composite, Event
from dpsql.mechanisms.gaussian_events import ZCDP, DiscreteGaussian, Gaussian
from dpsql.mechanisms.laplace_events import DiscreteLaplace
from dpsql.mechanisms.selection_events import Exponential, LaplacePartitionSelection
from dpsql.mechanisms.stated_events import ApproxDP, PureDP
from dpsql.plan import calibration
from dpsql.policy import BudgetSpec

F = Fraction
# Small pools, so that events repeat: multiplicities matter to the RDP sums' rounding.
EVENTS: list[Event] = [
    DiscreteLaplace(F(10), F(1), "COUNT"),
    DiscreteLaplace(F(25), F(2)),
    DiscreteLaplace(F(7, 3), F(1)),
    DiscreteGaussian(F(200), F(1), F(1, 5), F(1, 10**9)),
    DiscreteGaussian(F(50), F(2), F(3, 10), F(1, 10**8), dimensions=3),
    Gaussian(40.0, 1.0, F(1, 10), F(1, 10**9)),
    Gaussian(7.5, 1.0),
    Exponential(F(1, 10)),
    LaplacePartitionSelection(F(20), F(1), 30, F(1, 10**9)),
    PureDP(F(1, 20)),
    ApproxDP(F(1, 30), F(1, 10**10)),
    ZCDP(F(1, 400), F(1, 10**11)),
    DiscreteLaplace(F(2), F(1)),
    Gaussian(2.0, 1.0, F(3, 2), F(1, 10**9)),
    PureDP(F(1, 2)),
]
CELLS: list[tuple[str, str] | None] = [
    None,
    None,
    ("visits.region", "east"),
    ("visits.region", "west"),
    ("visits.region", "north"),
    ("visits.country", "fr"),
    ("visits.country", "de"),
    ("users.tier", "1"),
    ("users.tier", "2"),
]
ANALYSTS = ["ann", "ann", "bob", "bob", "cy", None]

# Weighted towards the events that every (epsilon, delta) theorem can read.
events = st.sampled_from([*EVENTS, *EVENTS[:6], *EVENTS[7:11], *EVENTS[:3], *EVENTS[12:]])
steps = st.lists(st.lists(events, min_size=1, max_size=3), min_size=1, max_size=40)


def _filters() -> dict[str, Any]:
    return {
        "basic": BasicFilter(F(1), F(1, 10**6)),
        "advanced": AdvancedFilter(F(1), F(1, 10**6), F(1, 10**7)),
        "rdp": RdpFilter(F(1), F(1, 10**6), approx_delta_cap=F(1, 10**7)),
        "rdp one order": RdpFilter(F(1), F(1, 10**6), (8.0,), approx_delta_cap=F(1, 10**7)),
        "rdp version 1": RdpFilter(
            F(1), F(1, 10**6), ORDERS_V1, approx_delta_cap=F(1, 10**7), main_share=F(0)
        ),
        "zcdp": ZcdpFilter(F(1), F(1, 10**6), approx_delta_cap=F(1, 10**7)),
        "gdp": GdpFilter(F(1), F(1, 10**6)),
    }


def _outcome(decide: Any, *args: Any) -> object:
    try:
        return bool(decide(*args))
    except (ParameterError, UndeclaredMechanismError, TypeError, ValueError) as exc:
        return type(exc)


@pytest.mark.parametrize("name", sorted(_filters()))
@settings(max_examples=examples(60), suppress_health_check=[HealthCheck.too_slow])
@given(stream=steps)
def test_every_filter_decides_incrementally_as_it_does_statelessly(
    name: str, stream: list[list[Event]]
) -> None:
    filt = _filters()[name]
    history: list[Event] = []
    tally = filt.tally()
    decisions = []
    for new in stream:
        expected = _outcome(filt.admits, list(history), new)
        assert _outcome(filt.admits_tally, tally, new) == expected
        decisions.append(expected)
        if expected is True:
            history.extend(new)
            for event in new:
                tally.add(event)
    assert False in decisions or len(history) == sum(map(len, stream))


PLD_STREAMS = {
    "gaussian": st.lists(
        st.lists(
            st.sampled_from([Gaussian(40.0, 1.0), Gaussian(3.0, 1.0), PureDP(F(1, 9))]),
            min_size=1,
            max_size=2,
        ),
        min_size=1,
        max_size=12,
    ),
    "identical": st.lists(
        st.lists(
            st.sampled_from([DiscreteLaplace(F(4), F(1)), PureDP(F(1, 9))]), min_size=1, max_size=2
        ),
        min_size=1,
        max_size=12,
    ),
    # a declared discrete Gaussian, shift 2 on one coordinate: composed on its lattice
    "identical gaussian": st.lists(
        st.lists(
            st.sampled_from([DiscreteGaussian(F(9), F(2)), PureDP(F(1, 9))]),
            min_size=1,
            max_size=2,
        ),
        min_size=1,
        max_size=12,
    ),
}
PLD_MECHANISMS: dict[str, Event | None] = {
    "gaussian": None,
    "identical": DiscreteLaplace(F(4), F(1)),
    "identical gaussian": DiscreteGaussian(F(9), F(2)),
}


@pytest.mark.parametrize("family", sorted(PLD_STREAMS))
@settings(max_examples=examples(15), suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_pld_filter_decides_incrementally_as_a_fresh_one(family: str, data: Any) -> None:
    """Against a fresh filter each time: the stateless PLD filter composes from whichever prefix
    its accountant cached, a fresh one from the grouped history, as the tally does."""
    stream = data.draw(PLD_STREAMS[family])
    mechanism = PLD_MECHANISMS[family]

    def make() -> PldFilter:
        return PldFilter(F(2), F(1, 10**5), family.split(maxsplit=1)[0], mechanism)  # type: ignore[arg-type]

    filt, history = make(), []
    tally = filt.tally()
    for new in stream:
        expected = _outcome(make().admits, list(history), new)
        assert _outcome(filt.admits_tally, tally, new) == expected
        if expected is True:
            history.extend(new)
            for event in new:
                tally.add(event)
    if filt.family == "identical" and all(e == mechanism for e in history):
        # its own epsilon: the smallest at which the history's delta is within the cap
        spent = filt.epsilon_spent(tally)
        assert spent <= filt.epsilon_cap or not history
        probe = PldFilter(F(spent), F(1, 10**5), "identical", mechanism)
        assert probe.admits(history[:-1], history[-1:]) if history else spent == 0
        if spent > 0:  # and no smaller epsilon (to the search's 1e-12)
            lower = PldFilter(F(spent * (1 - 1e-9)), F(1, 10**5), "identical", mechanism)
            assert not lower.admits(history[:-1], history[-1:])


# -- the Budget: per-view tallies against the replay of the whole history -----------------------


def _certified(evs: list[Event]) -> tuple[F, F]:
    """What the planner would certify for discrete Gaussians calibrated jointly: the epsilon
    their summed rho gives at delta 1e-9 (CKS 2020, Corollary 13), rounded up."""
    rho = sum((e.rho for e in evs if isinstance(e, DiscreteGaussian)), F(0))
    return calibration.epsilon_for(rho, F(1, 10**9)), F(1, 10**9)


composites = st.builds(
    lambda evs, cell, certify: Composite(
        tuple(evs),
        _certified(evs) if certify and all(isinstance(e, DiscreteGaussian) for e in evs)
        else None,
        cell,
    ),
    st.lists(events, min_size=1, max_size=2),
    st.sampled_from(CELLS),
    st.booleans(),
)  # fmt: skip
operations = st.lists(
    st.one_of(
        st.tuples(st.just("charge"), composites, st.sampled_from(ANALYSTS)),
        st.tuples(st.just("charge"), composites, st.sampled_from(ANALYSTS)),
        st.tuples(st.just("charge"), composites, st.sampled_from(ANALYSTS)),
        st.tuples(st.just("add"), st.sampled_from([F(1, 4), F(1)]), st.just(None)),
        st.tuples(st.just("allocate"), st.sampled_from([F(1), F(3)]),
                  st.sampled_from(["ann", "bob", "cy"])),
    ),
    min_size=1, max_size=50,
)  # fmt: skip


def _spec(accountant: str) -> BudgetSpec:
    extra: dict[str, Any] = {}
    if accountant.endswith(" version 1"):  # the defaults of ledgers created before version 2
        accountant, extra["filter_version"] = accountant.removesuffix(" version 1"), 1
    if accountant == "advanced":
        extra["advanced_delta_prime"] = F(1, 10**7)
    shares = {
        "ann": {"epsilon": "4", "delta": "5e-6"},
        "bob": {"epsilon": "3", "delta": "5e-6"},
    }
    return BudgetSpec.model_validate(
        {"epsilon": "6", "delta": "1e-5", "accountant": accountant, "analysts": shares, **extra}
    )


def _budget(accountant: str, replay: bool) -> Budget:
    spec, store = _spec(accountant), MemoryLedger()
    store.append(BUDGET_RECORD, budget_caps(spec))
    return Budget("visits", pinned_spec(spec, store), store, odometers(), replay=replay)


def _apply(budget: Budget, op: tuple[str, Any, Any]) -> object:
    kind, value, who = op
    if kind == "add":
        budget.add(value, F(0), "owner", "top-up")
        return "added"
    if kind == "allocate":
        budget.allocate(who, value, F(5, 10**6), "owner", "share")
        return "allocated"
    try:
        budget.charge(value, "SELECT ...", who)
    except BudgetExceededError:
        return "refused"
    return "charged"


@pytest.mark.parametrize("views", ["exact views", "past the view limit"])
@pytest.mark.parametrize("accountant", ["basic", "advanced", "rdp", "zcdp", "rdp version 1"])
@settings(max_examples=examples(40), suppress_health_check=[HealthCheck.too_slow])
@given(ops=operations)
def test_the_budget_decides_from_its_tallies_as_by_replaying_the_history(
    accountant: str, views: str, ops: list[tuple[str, Any, Any]]
) -> None:
    limit = parallel.MAX_VIEWS
    # Past the limit, each view chooses one family's cell and holds all the others' queries.
    parallel.MAX_VIEWS = 2 if views == "past the view limit" else limit
    try:
        incremental, replay = _budget(accountant, False), _budget(accountant, True)
        outcomes = []
        for op in ops:
            expected = _apply(replay, op)
            assert _apply(incremental, op) == expected, (op, outcomes)
            outcomes.append(expected)
        assert [c.seq for c in incremental.charges] == [c.seq for c in replay.charges]
        _assert_tallies_are_the_views(incremental)
    finally:
        parallel.MAX_VIEWS = limit


def _canonical(tally: object) -> str:
    fields = vars(tally)
    return repr({k: sorted(v.items(), key=repr) if isinstance(v, dict) else v
                 for k, v in sorted(fields.items())})  # fmt: skip


def _assert_tallies_are_the_views(budget: Budget) -> None:
    """Every kept tally is the fold of its view's history, as ``views_with`` makes it (a view
    off by one event would rarely change a decision at the margin)."""
    report = budget.report()
    state = budget._state(budget.store.records())
    if state.new_tally is None:
        return
    # The deciding figure from the tallies is the one from the views' histories.
    decider = budget._rule((state.epsilon, state.delta), True)
    assert not isinstance(decider, tuple)
    replayed = budget._deciding_replay(decider, list(state.charges))
    assert (report.epsilon_spent, report.delta_spent) == replayed
    for who, mine in state.views.items():
        history = [c.event for c in state.charges if who in ("*", c.analyst)]
        for cell in CELLS:
            probe = Composite((), None, cell)
            expected = []
            for seen in parallel.views_with(history, probe, lambda c: c.cell):
                tally = state.new_tally()
                for event in events_for(budget.name, seen[:-1]):
                    tally.add(event)
                expected.append(_canonical(tally))
            assert sorted(map(_canonical, mine.holding(cell))) == sorted(expected)
