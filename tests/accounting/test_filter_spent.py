"""Every filter's own figure agrees with its decision, and is the bound its own rule certifies.

``Filter.epsilon_spent(tally, new)`` is what the report calls "decides": the filter must admit
``new`` iff that figure is within its cap, on random mixed streams, and the figure must be the
filter's own conversion (not an odometer's best order after the fact): for the Renyi filter,
min_j (rdp_j - budgets[j]) + epsilon_cap exactly, that is the conversion at each order's own
share of delta, whatever grid and split the filter fixed; for zCDP the summed rho through the
conversion at delta_cap minus the reserve; the WRRW quantity for the advanced filter; the exact
sum for basic composition; the GDP curve of the summed mu^2; the PLD filter's own curve.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import pytest
from conftest import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpsql.accounting.theorems.advanced import AdvancedFilter, approx_dp, wrrw_bound
from dpsql.accounting.theorems.base import grouped
from dpsql.accounting.theorems.basic import BasicFilter, basic_totals
from dpsql.accounting.theorems.gdp import GdpFilter
from dpsql.accounting.theorems.pld_filter import PldFilter
from dpsql.accounting.theorems.rdp import DEFAULT_ORDERS, RdpFilter, composed_rdp, order_budget
from dpsql.accounting.theorems.zcdp import ZcdpFilter, composed_zcdp
from dpsql.mechanisms.conversions import frac_down, frac_up, gdp_epsilon, rdp_to_dp, zcdp_to_dp
from dpsql.mechanisms.events import Event
from dpsql.mechanisms.gaussian_events import ZCDP, DiscreteGaussian, Gaussian
from dpsql.mechanisms.laplace_events import DiscreteLaplace
from dpsql.mechanisms.selection_events import Exponential, LaplacePartitionSelection
from dpsql.mechanisms.stated_events import ApproxDP, PureDP

F = Fraction

EVENTS: list[Event] = [
    DiscreteLaplace(F(100), F(1), "COUNT"),
    DiscreteLaplace(F(25), F(2)),
    DiscreteLaplace(F(7, 3), F(1)),
    DiscreteGaussian(F(2000), F(1), F(1, 5), F(1, 10**9)),
    DiscreteGaussian(F(500), F(2), F(3, 10), F(1, 10**8), dimensions=3),
    Gaussian(40.0, 1.0, F(1, 10), F(1, 10**9)),
    Exponential(F(1, 10)),
    LaplacePartitionSelection(F(20), F(1), 30, F(1, 10**8)),
    PureDP(F(1, 20)),
    ApproxDP(F(1, 30), F(1, 10**9)),
    ZCDP(F(1, 400), F(1, 10**9)),
]
steps = st.lists(st.lists(st.sampled_from(EVENTS), min_size=1, max_size=3), min_size=1, max_size=60)
CAP, DELTA, RESERVE = F(1), F(1, 10**6), F(1, 10**7)


def _filters() -> dict[str, Any]:
    return {
        "basic": BasicFilter(CAP, DELTA),
        "advanced": AdvancedFilter(CAP, DELTA, F(5, 10**7)),
        "rdp grid": RdpFilter(CAP, DELTA, approx_delta_cap=RESERVE),
        "rdp one order": RdpFilter(CAP, DELTA, (32.0,), approx_delta_cap=RESERVE),
        "zcdp epsilon cap": ZcdpFilter(CAP, DELTA, approx_delta_cap=RESERVE),
        "zcdp rho cap": ZcdpFilter(delta_cap=DELTA, rho_cap=F(1, 40), approx_delta_cap=RESERVE),
        "gdp": GdpFilter(CAP, DELTA),
    }


def _drive(filt: Any, stream: list[list[Event]]) -> list[Event]:
    """Admit what the filter admits; at every step its figure after ``new`` is within the cap
    iff it admits ``new``. The history admitted."""
    tally, history = filt.tally(), []
    for new in stream:
        try:
            admitted = filt.admits_tally(tally, new)
        except (TypeError, ValueError):
            continue  # an event the filter cannot read at all (GDP: only continuous Gaussians)
        after = filt.epsilon_spent(tally, new)
        assert admitted == (after <= filt.epsilon_cap), (filt.name, after, admitted)
        if admitted:
            history.extend(new)
            for event in new:
                tally.add(event)
            assert filt.epsilon_spent(tally) == after
    return history


@pytest.mark.parametrize("name", sorted(_filters()))
@settings(max_examples=examples(60), suppress_health_check=[HealthCheck.too_slow])
@given(stream=steps)
def test_a_filter_admits_iff_its_own_figure_stays_within_its_cap(
    name: str, stream: list[list[Event]]
) -> None:
    filt = _filters()[name]
    history = _drive(filt, stream)
    assert filt.epsilon_spent(filt.tally()) == 0  # nothing released, nothing spent
    figure = filt.epsilon_spent(_folded(filt, history))
    assert figure <= filt.epsilon_cap
    if history:
        assert figure == _recomputed(filt, history)


def _folded(filt: Any, history: list[Event]) -> Any:
    tally = filt.tally()
    for event in history:
        tally.add(event)
    return tally


def _recomputed(filt: Any, history: list[Event]) -> F | float:
    """The filter's own bound computed from the history, not from its tally."""
    if isinstance(filt, RdpFilter):
        rdps, _ = composed_rdp(grouped(history), filt.orders)
        gaps = [F(r) - F(b) for r, b in zip(rdps, filt.budgets, strict=True)]
        exact = filt.epsilon_cap + min(gaps)
        # the conversion at each order's share of delta, as the budgets were made
        converted = min(
            rdp_to_dp(r, a, share)
            for r, a, share in zip(rdps, filt.orders, filt.shares, strict=True)
        )
        assert float(exact) == pytest.approx(converted, rel=1e-12, abs=1e-12)
        return exact
    if isinstance(filt, ZcdpFilter):
        rho, _ = composed_zcdp(grouped(history))
        share = frac_down(filt.delta_cap - filt.approx_delta_cap)
        return F(zcdp_to_dp(frac_up(rho), share))
    if isinstance(filt, AdvancedFilter):
        pairs = [approx_dp(e) for e in history]
        squares = sum((p[0] ** 2 for p in pairs if p is not None), F(0))
        return F(wrrw_bound(float(squares), float(filt.delta_prime)))
    if isinstance(filt, BasicFilter):
        return basic_totals(grouped(history))[0]
    assert isinstance(filt, GdpFilter)
    squared = sum((F(e.sensitivity) ** 2 / F(e.sigma) ** 2 for e in history
                   if isinstance(e, Gaussian)), F(0))  # fmt: skip
    mu = math.nextafter(math.sqrt(frac_up(squared)), math.inf)
    return F(gdp_epsilon(mu, frac_down(filt.delta_cap)))


GAUSSIANS = st.lists(
    st.lists(st.sampled_from([Gaussian(40.0, 1.0), Gaussian(8.0, 1.0), Gaussian(3.0, 2.0)]),
             min_size=1, max_size=3),
    min_size=1, max_size=40,
)  # fmt: skip


@settings(max_examples=examples(30), suppress_health_check=[HealthCheck.too_slow])
@given(stream=GAUSSIANS)
def test_the_gdp_filter_on_the_gaussians_it_reads(stream: list[list[Event]]) -> None:
    filt = GdpFilter(CAP, DELTA)
    history = _drive(filt, stream)
    if history:
        assert filt.epsilon_spent(_folded(filt, history)) == _recomputed(filt, history)


@pytest.mark.parametrize("family", ["gaussian", "identical"])
@settings(max_examples=examples(8), suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_pld_filter_admits_iff_its_own_figure_stays_within_its_cap(
    family: str, data: Any
) -> None:
    mechanism = DiscreteLaplace(F(40), F(1)) if family == "identical" else None
    pool = [mechanism] if mechanism is not None else [Gaussian(20.0, 1.0), Gaussian(6.0, 1.0)]
    stream = data.draw(st.lists(st.lists(st.sampled_from(pool), min_size=1, max_size=4),
                                min_size=1, max_size=30))  # fmt: skip
    filt = PldFilter(F(2), F(1, 10**5), family, mechanism)  # type: ignore[arg-type]
    _drive(filt, stream)


@settings(max_examples=examples(40), suppress_health_check=[HealthCheck.too_slow])
@given(
    orders=st.lists(st.sampled_from(DEFAULT_ORDERS), min_size=1, max_size=12, unique=True),
    weights=st.lists(st.integers(1, 9), min_size=12, max_size=12),
    stream=steps,
)
def test_the_renyi_figure_follows_any_grid_and_split_of_delta(
    orders: list[float], weights: list[int], stream: list[list[Event]]
) -> None:
    """The figure is read off ``budgets`` alone: with another grid, or delta split unequally
    across orders, it still agrees with the decision and is the conversion at each order's own
    share."""
    filt = RdpFilter(CAP, DELTA, tuple(sorted(orders)), approx_delta_cap=RESERVE)
    weights = weights[: len(orders)]
    shares = [F(w, sum(weights)) * (DELTA - RESERVE) for w in weights]
    filt.budgets = tuple(
        order_budget(frac_down(CAP), frac_down(s), a)
        for s, a in zip(shares, filt.orders, strict=True)
    )
    history = _drive(filt, stream)
    if history:
        rdps, _ = composed_rdp(grouped(history), filt.orders)
        converted = min(
            rdp_to_dp(r, a, frac_down(s)) for r, a, s in zip(rdps, filt.orders, shares, strict=True)
        )
        figure = filt.epsilon_spent(_folded(filt, history))
        assert float(figure) == pytest.approx(converted, rel=1e-12, abs=1e-12)


def test_the_renyi_figure_is_infinite_once_the_reserve_of_delta_is_passed() -> None:
    filt = RdpFilter(CAP, DELTA, approx_delta_cap=F(1, 10**8))
    selection = LaplacePartitionSelection(F(20), F(1), 30, F(6, 10**9))
    tally = filt.tally()
    tally.add(selection)
    assert math.isfinite(filt.epsilon_spent(tally))
    assert not filt.admits_tally(tally, [selection])
    assert filt.epsilon_spent(tally, [selection]) == math.inf
