"""A query never costs less than its mechanisms give, on every path that reads its cost.

A query of discrete Gaussians calibrated jointly carries ``certified = (epsilon, delta)``, and
basic composition charges that pair; an uncertified Gaussian is charged at its stated target
with delta no smaller than its own curve (``events.basic_pair``). Both guards are structural: a
``Composite`` whose certified pair no theorem gives refuses to exist (``InternalError``), a
ledger record of one fails closed (``LedgerError``), and the ledger's own basic composition
(the budget's running sums, its replay, the report) reads the guarded pair, so it charges what
``BasicFilter`` charges.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from conftest import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpsql.accounting.budget.budget import Budget
from dpsql.accounting.budget.build import odometers
from dpsql.accounting.ledger.ledger import BUDGET_RECORD
from dpsql.accounting.ledger.store import MemoryLedger, budget_caps, pinned_spec
from dpsql.accounting.theorems.basic import BasicFilter
from dpsql.errors import BudgetExceededError, InternalError, LedgerError
from dpsql.mechanisms.conversions import discrete_gaussian_delta, zcdp_to_dp
from dpsql.mechanisms.event_kinds import composite_to_json
from dpsql.mechanisms.events import Composite, Event, basic_pair, flatten, supports
from dpsql.mechanisms.gaussian_events import DiscreteGaussian, Gaussian
from dpsql.mechanisms.laplace_events import DiscreteLaplace
from dpsql.mechanisms.selection_events import LaplacePartitionSelection
from dpsql.plan import calibration
from dpsql.policy import BudgetSpec

F = Fraction

DELTA = F(1, 10**9)


def _basic_budget(epsilon: str = "10", delta: str = "1e-6") -> Budget:
    spec = BudgetSpec.model_validate({"epsilon": epsilon, "delta": delta})
    store = MemoryLedger()
    store.append(BUDGET_RECORD, budget_caps(spec))
    return Budget("guard", pinned_spec(spec, store), store, odometers())


def _understated_record(store: MemoryLedger) -> None:
    """A charge record, hash-chained like any other, of one discrete Gaussian of variance 1
    claiming (0.1, 1e-9): its own curve needs delta 0.37 at that epsilon."""
    honest = Composite((DiscreteGaussian(F(1), F(1)),))
    event = composite_to_json(honest)
    event["certified"] = [{"fraction": "1/10"}, {"fraction": "1/1000000000"}]
    store.append("charge", {"query": "q", "event": event, "epsilon": "0.1", "delta": "1e-9"})


# -- the planner's pairs pass, under-stated ones are refused -------------------------------------


@settings(max_examples=examples(40), suppress_health_check=[HealthCheck.too_slow])
@given(
    epsilon=st.sampled_from([F(1, 100), F(1, 10), F(1, 2), F(1), F(3)]),
    delta=st.sampled_from([F(1, 10**10), F(1, 10**8), F(1, 10**6)]),
    shifts=st.lists(st.tuples(st.integers(1, 20), st.integers(1, 4)), min_size=1, max_size=3),
    selection=st.booleans(),
)
def test_every_pair_the_calibration_certifies_is_supported(
    epsilon: F, delta: F, shifts: list[tuple[int, int]], selection: bool
) -> None:
    """As ``sensitivity._gaussian`` calibrates: one coordinate on its exact curve, else the
    summed rho split equally; with selection, a discrete Laplace part taking epsilon/k and half
    of delta."""
    k = len(shifts) + selection
    eps_g = epsilon * len(shifts) / k
    delta_g = delta / 2 if selection else delta
    events: list[Event] = []
    if selection:
        events.append(LaplacePartitionSelection(k / epsilon, F(1), 30, delta / 2))
    if len(shifts) == 1 and shifts[0][1] == 1:
        events.append(DiscreteGaussian(calibration.single_sigma2(shifts[0][0], eps_g, delta_g),
                                       F(shifts[0][0])))  # fmt: skip
    else:
        rho = calibration.rho_for(eps_g, delta_g)
        for shift, dims in shifts:
            sigma2 = calibration.sigma2_for(shift, dims, rho / len(shifts))
            events.append(DiscreteGaussian(sigma2, F(shift), dimensions=dims))
    query = Composite(tuple(events), (epsilon, delta))
    assert (query.epsilon, query.delta) == (epsilon, delta)
    # A tenth of the epsilon is more than any rounding of the variances leaves unused (an
    # integer variance is at most twice the one asked for), and a Gaussian is never delta 0.
    assert not supports(tuple(events), (epsilon / 10, delta))
    assert not supports(tuple(events), (epsilon, F(0)))


def test_a_query_that_certifies_less_than_its_gaussians_give_cannot_be_made() -> None:
    one = DiscreteGaussian(F(1), F(1))  # its own curve at epsilon 0.1: delta 0.37
    assert discrete_gaussian_delta(1.0, 1, 0.1) > 0.3
    with pytest.raises(InternalError, match="certified"):
        Composite((one,), (F(1, 10), DELTA))
    several = (DiscreteGaussian(F(100), F(1), dimensions=4),) * 2  # rho = 0.04
    needed = zcdp_to_dp(0.04, 1e-9)
    with pytest.raises(InternalError):
        Composite(several, (F(needed) * F(99, 100), DELTA))
    assert Composite(several, (F(needed) * F(101, 100), DELTA)).epsilon > F(needed)
    gaussian = Gaussian(1.0, 1.0)  # mu = 1
    with pytest.raises(InternalError):
        Composite((gaussian,), (F(1), DELTA))


# -- the ledger's basic composition reads the guarded pair ---------------------------------------


def test_a_ledger_record_that_certifies_less_fails_closed_and_nothing_is_charged() -> None:
    budget = _basic_budget()
    _understated_record(budget.store)  # type: ignore[arg-type]
    before = len(budget.store.records())
    count = Composite((DiscreteLaplace(F(10), F(1)),))
    with pytest.raises(LedgerError, match="certifies less"):
        budget.charge(count, "SELECT COUNT(*) FROM t", None)
    assert len(budget.store.records()) == before
    with pytest.raises(LedgerError):
        budget.report()


def test_basic_composition_of_the_ledger_charges_a_gaussian_its_own_curve() -> None:
    """A discrete Gaussian that states (0.2, 1e-9) while its curve gives 5.4e-5 at epsilon 0.2:
    the ledger's basic sums must charge the curve, as ``BasicFilter`` does, and so refuse it
    under a delta cap of 1e-6 (it was admitted at 1e-9 when the sums read the stated pair)."""
    understated = DiscreteGaussian(F(200), F(1), F(1, 5), DELTA)
    assert basic_pair(understated)[1] > F(5, 10**5)
    assert not BasicFilter(F(10), F(1, 10**6)).admits([], [understated])
    budget = _basic_budget()
    with pytest.raises(BudgetExceededError):
        budget.charge(Composite((understated,)), "SELECT SUM(x) FROM t", None)
    assert budget.charges == ()
    assert budget.report().delta_spent == 0


EVENTS: list[Event] = [
    DiscreteLaplace(F(10), F(1)),
    DiscreteLaplace(F(25), F(2)),
    DiscreteGaussian(F(200), F(1), F(1, 5), DELTA),
    DiscreteGaussian(F(4000), F(1), F(1, 10), F(1, 10**7)),
    DiscreteGaussian(F(50), F(2), F(3, 10), F(1, 10**8), dimensions=3),
    Gaussian(40.0, 1.0, F(1, 10), DELTA),
    Gaussian(7.5, 1.0),
    LaplacePartitionSelection(F(20), F(1), 30, DELTA),
]


@settings(max_examples=examples(40), suppress_health_check=[HealthCheck.too_slow])
@given(stream=st.lists(st.lists(st.sampled_from(EVENTS), min_size=1, max_size=3), max_size=30))
def test_the_ledgers_basic_sums_decide_as_the_basic_filter(stream: list[list[Event]]) -> None:
    budget, filt = _basic_budget("2", "0.001"), BasicFilter(F(2), F(1, 1000))
    for events in stream:
        query = Composite(tuple(events))
        expected = filt.admits(flatten(list(budget.views()[0])), list(events))
        assert _charged(budget, query) == expected
    spent = budget.report()
    history = flatten([c.event for c in budget.charges])
    assert (spent.epsilon_spent, spent.delta_spent) == _totals(history)


def _charged(budget: Budget, query: Composite) -> bool:
    try:
        budget.charge(query, "q", None)
    except BudgetExceededError:
        return False
    return True


def _totals(history: list[Event]) -> tuple[Any, Any]:
    return (
        sum((basic_pair(e)[0] for e in history), F(0)),
        sum((basic_pair(e)[1] for e in history), F(0)),
    )
