"""Advanced (DRV/KOV figure, WRRW filter) and optimal (KOV exact, Murtagh-Vadhan) composition.

Closed forms are recomputed here independently (mpmath at 50 digits for KOV); the filter is
checked against dp_accounting's PLD, an implementation that shares no code with it.
"""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import pytest
from conftest import examples
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld.common import DifferentialPrivacyParameters
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpsql.accounting.theorems.advanced import (
    AdvancedAccountant,
    AdvancedFilter,
    approx_dp,
    drv_epsilon,
    wrrw_bound,
)
from dpsql.accounting.theorems.optimal import (
    OptimalAccountant,
    kov_delta,
    kov_epsilon,
    murtagh_vadhan,
)
from dpsql.mechanisms.gaussian_events import ZCDP, Gaussian
from dpsql.mechanisms.laplace_events import DiscreteLaplace
from dpsql.mechanisms.stated_events import ApproxDP, PureDP

# --- DRV / KOV Theorem 3.5 figure -------------------------------------------------------------


def test_drv_closed_form_pinned() -> None:
    # k = 10,000 x epsilon 0.01 at delta' = 1e-6 (FACTS.md: "about 1.4" is wrong; it is 6.26)
    expected = math.sqrt(2 * 10_000 * math.log(1e6)) * 0.01 + 10_000 * 0.01 * math.expm1(0.01)
    assert drv_epsilon(0.01, 10_000, 1e-6) == pytest.approx(expected, rel=1e-11)
    assert drv_epsilon(0.01, 10_000, 1e-6) >= expected
    assert drv_epsilon(0.01, 10_000, 1e-6) == pytest.approx(6.2615384782, rel=1e-9)
    assert drv_epsilon(0.1, 10_000, 1e-5) == pytest.approx(153.156177198, rel=1e-9)  # "153.2"


def test_advanced_figure_is_kov_35_and_never_above_drv_or_basic() -> None:
    history = [PureDP(Fraction(1, 100))] * 10_000
    figure = AdvancedAccountant().epsilon(history, 1e-6)
    kov = 10_000 * 0.01 * math.tanh(0.005) + math.sqrt(2 * 10_000 * 1e-4 * math.log(1e6))
    assert figure == pytest.approx(kov, rel=1e-11)
    assert figure >= kov
    assert figure < drv_epsilon(0.01, 10_000, 1e-6)
    assert AdvancedAccountant().epsilon([PureDP(Fraction(1))] * 3, 1e-6) == pytest.approx(
        3
    )  # basic


def test_advanced_figure_pays_the_events_deltas() -> None:
    history = [ApproxDP(Fraction(1, 10), Fraction(1, 10**7))] * 5
    acc = AdvancedAccountant()
    assert acc.epsilon(history, 4e-7) == math.inf  # 5e-7 of event deltas alone exceed it
    delta = acc.delta(history, 0.4)
    assert 5e-7 < delta < 1
    assert acc.epsilon(history, delta) <= 0.4 * (1 + 1e-9)
    assert acc.fixed_in_advance


def test_events_without_a_pair_are_unbounded() -> None:
    assert approx_dp(ZCDP(Fraction(1, 10))) is None
    assert approx_dp(Gaussian(2.0, 1.0)) is None  # never pure DP, and no calibrated pair
    assert approx_dp(Gaussian(2.0, 1.0, Fraction(1), Fraction(1, 10**6))) == (
        Fraction(1),
        Fraction(1, 10**6),
    )
    assert AdvancedAccountant().epsilon([ZCDP(Fraction(1, 10))], 1e-6) == math.inf
    assert OptimalAccountant().epsilon([ZCDP(Fraction(1, 10))], 1e-6) == math.inf


# --- KOV exact and Murtagh-Vadhan --------------------------------------------------------------


def _kov_mpmath(eps: float, k: int, eps_total: float) -> mpmath.mpf:
    mpmath.mp.dps = 50
    e, g = mpmath.mpf(eps), mpmath.mpf(eps_total)
    total = mpmath.mpf(0)
    for j in range(k + 1):
        total += mpmath.binomial(k, j) * max(0, mpmath.exp((k - j) * e) - mpmath.exp(g + j * e))
    return total / (1 + mpmath.exp(e)) ** k


@pytest.mark.parametrize("eps", [0.1, 0.5, 1.0])
@pytest.mark.parametrize("k", [1, 2, 5, 12, 30])
def test_kov_delta_matches_direct_summation(eps: float, k: int) -> None:
    for eps_total in [0.0, 0.3, eps * k / 3, eps * (k - 2), eps * k * 0.9]:
        exact = float(_kov_mpmath(eps, k, eps_total))
        got = kov_delta(eps, k, eps_total)
        assert got >= exact
        assert got <= exact * (1 + 1e-9) + 1e-300


def test_kov_theorem_33_grid_values() -> None:
    # at eps_total = (k - 2i) eps the optimal delta is KOV's delta_i
    eps, k = 0.3, 9
    for i in range(k // 2 + 1):
        delta_i = (
            sum(
                math.comb(k, j) * (math.exp((k - j) * eps) - math.exp((k - 2 * i + j) * eps))
                for j in range(i)
            )
            / (1 + math.exp(eps)) ** k
        )
        assert kov_delta(eps, k, (k - 2 * i) * eps) == pytest.approx(delta_i, rel=1e-10, abs=1e-300)


def test_kov_epsilon_pinned_and_inverse() -> None:
    value = kov_epsilon(0.01, 10_000, 1e-6)
    assert value == pytest.approx(4.885515601, rel=1e-8)
    assert kov_delta(0.01, 10_000, value) <= 1e-6
    assert kov_delta(0.01, 10_000, value * (1 - 1e-8)) > 1e-6
    assert value < AdvancedAccountant().epsilon([PureDP(Fraction(1, 100))] * 10_000, 1e-6)


@pytest.mark.parametrize(
    ("eps", "k", "grid"),
    [
        (Fraction(1, 10), 200, Fraction(1, 35)),
        (Fraction(1, 10), 200, Fraction(1, 1003)),
        (Fraction(1, 100), 3000, Fraction(1, 2999)),
    ],
)
def test_murtagh_vadhan_brackets_exact_kov(eps: Fraction, k: int, grid: Fraction) -> None:
    exact = kov_epsilon(float(eps), k, 1e-6)
    bracket = murtagh_vadhan([(eps, k)], 1e-6, grid=grid)
    assert bracket.epsilon >= exact  # never below the optimum
    assert bracket.lower <= exact * (1 + 1e-9)
    assert bracket.epsilon - exact <= bracket.error + 1e-9  # within its stated error


def test_murtagh_vadhan_exact_on_a_common_grid() -> None:
    history = (
        [PureDP(Fraction(1, 100))] * 3000
        + [PureDP(Fraction(1, 20))] * 500
        + [PureDP(Fraction(3, 100))] * 200
    )
    bracket = OptimalAccountant().bracket(history, 1e-6)
    assert bracket.error == 0
    assert bracket.epsilon == pytest.approx(6.677547594823958, rel=1e-9)
    # never above the advanced figure, never below the optimum of the largest part alone
    assert bracket.epsilon <= AdvancedAccountant().epsilon(history, 1e-6)
    assert bracket.epsilon >= kov_epsilon(0.01, 3000, 1e-6)


def test_optimal_is_fixed_in_advance_and_order_independent() -> None:
    acc = OptimalAccountant()
    assert acc.fixed_in_advance
    a = [
        PureDP(Fraction(1, 10)),
        DiscreteLaplace(Fraction(20), Fraction(1)),
        PureDP(Fraction(1, 10)),
    ]
    assert acc.epsilon(a, 1e-5) == acc.epsilon(a[::-1], 1e-5)


def test_optimal_falls_back_to_the_basic_sum_when_own_deltas_use_up_delta() -> None:
    """The events' own deltas (5e-7) exceed the reading's delta (4e-7): no composition of these
    (eps, delta) pairs reaches 4e-7, and the figure is the basic sum, which holds at their own
    delta (it was infinity)."""
    acc = OptimalAccountant()
    history = [ApproxDP(Fraction(1, 10), Fraction(1, 10**7))] * 5
    bracket = acc.bracket(history, 4e-7)
    assert bracket.epsilon == pytest.approx(0.5, rel=1e-11)
    assert bracket.epsilon >= 0.5
    assert bracket.lower == 0  # nothing is certified below it
    # just above the own deltas the composition is finite, never above the basic sum
    figures = [acc.epsilon(history, d) for d in (5.0000001e-7, 6e-7, 1e-6, 1e-3)]
    assert all(a >= b for a, b in zip([bracket.epsilon, *figures], figures, strict=False))
    assert figures[-1] < 0.5
    # jointly calibrated queries, read as their certified pairs: 1000 x (0.1, 1e-9) at 1e-6
    calibrated = [ApproxDP(Fraction(1, 10), Fraction(1, 10**9))] * 1000
    assert acc.epsilon(calibrated, 1e-6) == pytest.approx(100.0, rel=1e-11)
    assert acc.epsilon([*history, PureDP(Fraction(1, 5))], 4e-7) == pytest.approx(0.7, rel=1e-11)


def test_optimal_falls_back_when_the_composition_cannot_meet_what_is_left() -> None:
    # 1e-35 is below the binomial tails the composition drops to an infinite loss (1e-30)
    history = [PureDP(Fraction(1, 100))] * 10_000
    assert OptimalAccountant().epsilon(history, 1e-35) == pytest.approx(100.0, rel=1e-11)
    assert OptimalAccountant().epsilon(history, 1e-6) == pytest.approx(4.885515601, rel=1e-8)


def test_optimal_never_reads_above_the_basic_sum() -> None:
    # epsilons with no common grid coarse enough: MV rounds them up to a grid, which at a tiny
    # delta reads above the basic sum; the basic sum holds there, and is read instead
    history = [PureDP(Fraction(1, 3))] * 2 + [PureDP(Fraction(1, 10**12 + 39))]
    basic = float(Fraction(2, 3) + Fraction(1, 10**12 + 39))
    rounded = murtagh_vadhan([(Fraction(1, 3), 2), (Fraction(1, 10**12 + 39), 1)], 1e-200)
    assert rounded.epsilon > basic * (1 + 1e-6)
    bracket = OptimalAccountant().bracket(history, 1e-200)
    assert bracket.epsilon == pytest.approx(basic, rel=1e-11)
    assert bracket.epsilon >= basic
    assert bracket.lower == rounded.lower


# --- the WRRW filter ---------------------------------------------------------------------------


def test_wrrw_filter_count_pinned() -> None:
    # queries of 0.01 into (1, 1e-6) with delta' = 1e-6: V = n 1e-4 must keep
    # sqrt(2 ln(1e6) V) + V / 2 <= 1; solve for the largest n independently
    n = max(n for n in range(1, 1000) if math.sqrt(2 * math.log(1e6) * n * 1e-4) + n * 5e-5 <= 1)
    filt = AdvancedFilter(Fraction(1), Fraction(1, 10**6), Fraction(1, 10**6))
    history: list[PureDP] = []
    while filt.admits(history, [PureDP(Fraction(1, 100))]):
        history.append(PureDP(Fraction(1, 100)))
    assert len(history) == n == 349
    assert filt.bound(history) <= 1 < wrrw_bound(350e-4, 1e-6)


def test_wrrw_filter_refuses_unbounded_events_and_delta_overflow() -> None:
    filt = AdvancedFilter(Fraction(1), Fraction(2, 10**6), Fraction(1, 10**6))
    assert not filt.admits([], [ZCDP(Fraction(1, 100))])
    assert not filt.admits([], [ApproxDP(Fraction(1, 100), Fraction(2, 10**6))])
    assert filt.admits([], [ApproxDP(Fraction(1, 100), Fraction(1, 10**6))])


def _reference_epsilon(history: list[ApproxDP], delta: float) -> float:
    """dp_accounting's pessimistic PLD of the history (its own code, fine grid)."""
    composed = None
    counts: dict[tuple[Fraction, Fraction], int] = {}
    for event in history:
        counts[(event.epsilon, event.delta)] = counts.get((event.epsilon, event.delta), 0) + 1
    for (eps, d), m in counts.items():
        params = DifferentialPrivacyParameters(float(eps), float(d))
        part = pld_lib.from_privacy_parameters(params, 1e-4).self_compose(m)
        composed = part if composed is None else composed.compose(part)
    return 0.0 if composed is None else float(composed.get_epsilon_for_delta(delta))


@settings(max_examples=examples(25), suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from([Fraction(1, 100), Fraction(1, 20), Fraction(1, 5), Fraction(1, 2)]),
            st.booleans(),
        ),
        min_size=1,
        max_size=400,
    ),
    st.sampled_from([Fraction(1, 2), Fraction(1), Fraction(3)]),
)
def test_wrrw_filter_never_admits_beyond_an_independent_accountant(
    requests: list[tuple[Fraction, bool]], cap: Fraction
) -> None:
    delta_cap, delta_prime = Fraction(1, 10**5), Fraction(1, 10**6)
    filt = AdvancedFilter(cap, delta_cap, delta_prime)
    history: list[ApproxDP] = []
    for eps, with_delta in requests:
        event = ApproxDP(eps, Fraction(1, 10**8) if with_delta else Fraction(0))
        if filt.admits(history, [event]):
            history.append(event)
    assert sum(e.delta for e in history) <= delta_cap - delta_prime
    assert _reference_epsilon(history, float(delta_cap)) <= float(cap)
