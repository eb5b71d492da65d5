"""A new accountant is one registration and a new kind of event one class: a toy of each, both
declared in this file only.

The toy accountant is basic composition at a pessimistic factor of 2 (every epsilon counted
twice: valid whenever basic composition is, never tighter), registered from here with its
odometer, its filter, its label and its curve's style. It shows in the report's figures, the
composition curves and what-if beside the built-in accountants, and as the policy's
``budget.accountant`` it decides admission through a real ``Session``.

The toy event is randomized response, whose only declared map is its exact Renyi curve: every
accountant composes it through the maps it inherits from its pair. An event that declares no
guarantee at all is unbounded under every theorem that needs one, and refused by its filter.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import pytest
from conftest import TinyPolicy

from dpsql.accounting.registry import Caps, Registration, register, unregister
from dpsql.accounting.theorems.advanced import AdvancedAccountant, AdvancedFilter
from dpsql.accounting.theorems.base import grouped
from dpsql.accounting.theorems.basic import basic_totals
from dpsql.accounting.theorems.gdp import GdpAccountant
from dpsql.accounting.theorems.optimal import OptimalAccountant
from dpsql.accounting.theorems.pld import PldAccountant
from dpsql.accounting.theorems.rdp import RdpAccountant, RdpFilter
from dpsql.accounting.theorems.zcdp import ZcdpAccountant, ZcdpFilter
from dpsql.errors import BudgetExceededError, PolicyError
from dpsql.interfaces.report.charts import CURVES, draw, history_curves, label
from dpsql.interfaces.report.whatif import Query, after_n, fit_count, whatif_fits, whatif_label
from dpsql.mechanisms.event_kinds import composite_from_json, composite_to_json
from dpsql.mechanisms.events import Composite, Event
from dpsql.mechanisms.stated_events import PureDP
from dpsql.session.session import Session

FACTOR = 2
ROWS = [(u, "east", 30, 10.0) for u in range(1, 200)]
QUERY = "SELECT COUNT(*) FROM visits"


def _sums(events: Sequence[Event]) -> tuple[Fraction, Fraction]:
    eps, delta = basic_totals(grouped(events))
    return FACTOR * eps, delta


class ToyAccountant:
    """Twice the sum of the epsilons, at the sum of the deltas."""

    name = "toy"
    fixed_in_advance = False  # a multiple of basic composition's sums: valid adaptively

    def epsilon(self, history: Sequence[Event], delta: float) -> float:
        return float(_sums(history)[0])

    def delta(self, history: Sequence[Event], epsilon: float) -> float:
        eps, delta = _sums(history)
        return float(delta) if eps <= Fraction(epsilon) else math.inf


class ToyTally:
    def __init__(self) -> None:
        self.epsilon, self.delta = Fraction(0), Fraction(0)

    def add(self, event: Event, count: int = 1) -> None:
        eps, delta = _sums([event] * count)
        self.epsilon, self.delta = self.epsilon + eps, self.delta + delta


class ToyFilter:
    """Admits while twice the sum of the epsilons and the sum of the deltas fit the cap."""

    name = "toy"

    def __init__(self, epsilon_cap: Fraction, delta_cap: Fraction):
        self.epsilon_cap, self.delta_cap = epsilon_cap, delta_cap

    def admits(self, history: Sequence[Event], new: Sequence[Event]) -> bool:
        eps, delta = _sums([*history, *new])
        return eps <= self.epsilon_cap and delta <= self.delta_cap

    def tally(self) -> ToyTally:
        return ToyTally()

    def admits_tally(self, tally: ToyTally, new: Sequence[Event]) -> bool:
        return self.epsilon_spent(tally, new) <= self.epsilon_cap

    def epsilon_spent(self, tally: ToyTally, new: Sequence[Event] = ()) -> Fraction | float:
        eps, delta = _sums(new)
        if tally.delta + delta > self.delta_cap:
            return math.inf
        return tally.epsilon + eps


def _toy_filter(caps: Caps) -> ToyFilter:
    assert caps.epsilon is not None
    return ToyFilter(caps.epsilon, caps.delta)


@pytest.fixture
def toy() -> Iterator[Registration]:
    registration = Registration(
        "toy",
        "basic composition, twice over",
        ToyAccountant,
        _toy_filter,
        pairs=True,
        colour="#9467bd",
        line=":",
        whatif=True,
    )
    register(registration)
    try:
        yield registration
    finally:
        unregister("toy")


def _fill(session: Session, limit: int = 100) -> int:
    for n in range(limit):
        try:
            session.execute(QUERY, epsilon="0.1", fresh=True)
        except BudgetExceededError:
            return n
    return limit


def test_the_toy_reads_beside_the_others_in_the_report_and_the_curves(
    tiny_policy: TinyPolicy, toy: Registration
) -> None:
    session = Session(tiny_policy(ROWS, budget={"epsilon": "1"}))
    for _ in range(3):
        session.execute(QUERY, epsilon="0.1", fresh=True)
    figures = {f.accountant: f for f in session.budget().figures}
    names = list(figures)
    assert names[0] == "basic" and names[-1] == "toy"  # registered after the built-in ones
    assert figures["basic"].note == "decides" and figures["toy"].note == "valid adaptively"
    assert figures["toy"].epsilon == 2 * figures["basic"].epsilon == pytest.approx(0.6)
    assert "toy" in CURVES and label("toy") == "basic composition, twice over: valid adaptively"
    curves = history_curves(session.filter)
    assert curves.epsilons["toy"] == tuple(2 * x for x in curves.epsilons["basic"])
    assert curves.epsilons["toy"][-1] == figures["toy"].epsilon
    assert label("toy") in draw(curves, "svg").decode("utf-8")


def test_the_toy_filter_decides_admission_through_a_session(
    tiny_policy: TinyPolicy, toy: Registration
) -> None:
    session = Session(tiny_policy(ROWS, budget={"epsilon": "1", "accountant": "toy"}))
    assert _fill(session) == 5  # 2 x 0.1 x 5 = 1: basic composition would admit 10
    with pytest.raises(BudgetExceededError, match="under the toy filter"):
        session.execute(QUERY, epsilon="0.1", fresh=True)
    report = session.budget()
    assert report.accountant == "toy" and report.epsilon_spent == 1
    figures = {f.accountant: f for f in report.figures}
    assert figures["toy"].note == "decides" and figures["basic"].epsilon == pytest.approx(0.5)


def test_what_if_asks_the_toy_too(toy: Registration) -> None:
    query = Query(epsilon=Fraction(1, 10))
    fits = whatif_fits(query, Fraction(1), Fraction(0))
    assert fit_count(fits["toy"]) == 5 and fit_count(fits["basic"]) == 10
    assert after_n(query, 10, 1e-6)["toy"] == pytest.approx(2.0)
    assert whatif_label("toy") == "valid adaptively"


def test_a_filter_name_nothing_registers_is_a_policy_error(tiny_policy: TinyPolicy) -> None:
    with pytest.raises(PolicyError, match=r"budget\.accountant: 'toy' is not an accountant"):
        Session(tiny_policy(ROWS, budget={"epsilon": "1", "accountant": "toy"}))
    with pytest.raises(PolicyError, match="odometer only, not a filter"):
        Session(tiny_policy(ROWS, budget={"epsilon": "1", "accountant": "optimal"}))


@dataclass(frozen=True)
class RandomizedResponse(Event):
    """One bit kept with probability p = e^eps/(1 + e^eps), flipped otherwise: exactly eps-DP,
    and itself the pair that dominates every eps-DP mechanism (Kairouz, Oh, Viswanath 2015), so
    the maps it inherits from its pair are its own; its Renyi curve, declared here, is exact:
    D_alpha = ln(p^alpha (1-p)^(1-alpha) + (1-p)^alpha p^(1-alpha)) / (alpha - 1)."""

    epsilon: Fraction
    label: str = field(default="", compare=False)

    @property
    def delta(self) -> Fraction:
        return Fraction(0)

    def renyi(self, alpha: float) -> tuple[float, Fraction]:
        eps = float(self.epsilon)
        log_p, log_q = -math.log1p(math.exp(-eps)), -math.log1p(math.exp(eps))
        a, b = alpha * log_p + (1 - alpha) * log_q, alpha * log_q + (1 - alpha) * log_p
        log_inner = max(a, b) + math.log1p(math.exp(-abs(a - b)))  # in logs: no overflow
        return min(eps, log_inner / (alpha - 1) * (1 + 1e-9)), Fraction(0)


@dataclass(frozen=True)
class Undeclared(Event):
    """An event that states a pair but declares no guarantee: no map at all."""

    epsilon: Fraction
    label: str = field(default="", compare=False)

    @property
    def delta(self) -> Fraction:
        return Fraction(0)

    def approx_dp(self) -> None:
        return None


def test_a_toy_event_composes_through_its_maps_under_every_accountant() -> None:
    toy = [RandomizedResponse(Fraction(1, 10))] * 100
    pure = [PureDP(Fraction(1, 10))] * 100
    for accountant in (AdvancedAccountant(), OptimalAccountant(), ZcdpAccountant()):
        # The maps inherited from its pair: the figures of any pure 0.1-DP mechanism.
        assert accountant.epsilon(toy, 1e-6) == accountant.epsilon(pure, 1e-6)
    assert PldAccountant().epsilon(toy, 1e-6) == pytest.approx(PldAccountant().epsilon(pure, 1e-6))
    # Its own Renyi curve is tighter than the pure-DP bound (eps^2/2-zCDP) it would otherwise get.
    assert RdpAccountant().epsilon(toy, 1e-6) < RdpAccountant().epsilon(pure, 1e-6)
    assert RdpFilter(Fraction(10), Fraction(1, 10**6)).admits(toy[:50], toy[50:])
    assert math.isinf(GdpAccountant().epsilon(toy, 1e-6))  # no GDP map, as for any pure event
    with pytest.raises(ValueError, match="unknown event type 'RandomizedResponse'"):
        composite_from_json(composite_to_json(Composite((toy[0],))))


def test_an_event_without_maps_is_unbounded_or_refused() -> None:
    history = [Undeclared(Fraction(1, 10))]
    for accountant in (
        AdvancedAccountant(),
        OptimalAccountant(),
        RdpAccountant(),
        ZcdpAccountant(),
        GdpAccountant(),
        PldAccountant(),
    ):
        assert math.isinf(accountant.epsilon(history, 1e-6)), accountant.name
    cap = (Fraction(1), Fraction(1, 10**6))
    assert not RdpFilter(*cap).admits([], history)
    assert not ZcdpFilter(*cap).admits([], history)
    assert not AdvancedFilter(*cap, Fraction(1, 10**7)).admits([], history)
