"""Property tests (hypothesis) for the closed-form accountants and their filters.

- monotone: adding an event never lowers epsilon(delta) nor delta(epsilon);
- order-independent: a shuffled history gives the same figures, exactly;
- sound filters: a history a filter admitted (fed one event at a time, skipping refusals) is
  within the cap by an independent computation: dp_accounting's RdpAccountant, the exact GDP
  formula written here, or the exact RDP curves optimized here over a continuous order;
- shape facts the curves rely on: the Laplace curves are superadditive in the shift (so an L1
  sensitivity split over groups costs no more than one shift), the discrete Gaussian's delta
  grows with the shift.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction

import dp_accounting
import pytest
from conftest import examples
from dp_accounting.rdp import RdpAccountant as ReferenceRdp
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize_scalar
from scipy.stats import norm

from dpsql.accounting.theorems.base import Accountant
from dpsql.accounting.theorems.basic import BasicAccountant, BasicFilter
from dpsql.accounting.theorems.gdp import GdpAccountant, GdpFilter
from dpsql.accounting.theorems.rdp import DEFAULT_ORDERS, ORDERS_V1, RdpAccountant, RdpFilter
from dpsql.accounting.theorems.zcdp import ZcdpAccountant, ZcdpFilter
from dpsql.mechanisms.conversions import discrete_gaussian_delta
from dpsql.mechanisms.curves import discrete_laplace_rdp, laplace_rdp
from dpsql.mechanisms.events import Event
from dpsql.mechanisms.gaussian_events import ZCDP, DiscreteGaussian, Gaussian
from dpsql.mechanisms.laplace_events import DiscreteLaplace, Laplace
from dpsql.mechanisms.selection_events import Exponential, LaplacePartitionSelection
from dpsql.mechanisms.stated_events import ApproxDP, PureDP

SETTINGS = settings(max_examples=examples(60), deadline=None)

small_fraction = st.fractions(
    min_value=Fraction(1, 100), max_value=Fraction(3), max_denominator=100
)
scale = st.fractions(min_value=Fraction(1, 2), max_value=Fraction(200), max_denominator=10)
tiny_delta = st.integers(1, 100).map(lambda n: Fraction(n, 10**9))
sigma = st.floats(0.5, 60.0)

gaussian = st.builds(Gaussian, sigma, st.sampled_from([1.0, 2.0]))
laplace = st.builds(Laplace, scale, st.just(Fraction(1)))
discrete_gaussian = st.builds(
    DiscreteGaussian,
    st.fractions(min_value=Fraction(1, 4), max_value=Fraction(2000), max_denominator=4),
    st.integers(1, 3).map(Fraction),
    dimensions=st.integers(1, 3),
)
any_event: st.SearchStrategy[Event] = st.one_of(
    gaussian,
    laplace,
    discrete_gaussian,
    st.builds(DiscreteLaplace, scale, st.integers(1, 3).map(Fraction)),
    st.builds(PureDP, small_fraction),
    st.builds(Exponential, small_fraction),
    st.builds(ApproxDP, small_fraction, tiny_delta),
    st.builds(ZCDP, small_fraction.map(lambda x: x / 10), tiny_delta),
    st.builds(LaplacePartitionSelection, scale, st.just(Fraction(1)), st.just(10), tiny_delta),
)


def histories(events: st.SearchStrategy[Event], most: int = 40) -> st.SearchStrategy[list[Event]]:
    """Lists of events with repeats: a few kinds, each several times."""
    pairs = st.lists(st.tuples(events, st.integers(1, most)), min_size=0, max_size=5)
    return pairs.map(lambda ps: [e for e, n in ps for _ in range(n)])


ACCOUNTANTS: list[Accountant] = [
    BasicAccountant(),
    RdpAccountant(),
    ZcdpAccountant(),
    GdpAccountant(),
]


# --- Odometers ------------------------------------------------------------------------------


@SETTINGS
@given(histories(any_event), any_event)
def test_monotone_in_every_event(history: list[Event], extra: Event) -> None:
    for accountant in ACCOUNTANTS:
        for delta in (1e-6, 1e-3):
            assert accountant.epsilon([*history, extra], delta) >= accountant.epsilon(
                history, delta
            )
        for eps in (0.5, 5.0):
            assert accountant.delta([*history, extra], eps) >= accountant.delta(history, eps)


@SETTINGS
@given(histories(any_event), st.randoms(use_true_random=False))
def test_order_independent(history: list[Event], rng: random.Random) -> None:
    shuffled = list(history)
    rng.shuffle(shuffled)
    for accountant in ACCOUNTANTS:
        assert accountant.epsilon(shuffled, 1e-6) == accountant.epsilon(history, 1e-6)
        assert accountant.delta(shuffled, 1.0) == accountant.delta(history, 1.0)


@SETTINGS
@given(histories(any_event), histories(any_event), st.integers(0, 50), any_event)
def test_cached_groups_follow_any_change(
    first: list[Event], more: list[Event], cut: int, replacement: Event
) -> None:
    # Accountants remember the last history's groups; growing, shrinking or editing it must
    # give the figures of a fresh accountant.
    edited = [*first, *more]
    if edited:
        edited[cut % len(edited)] = replacement
    for make in (BasicAccountant, RdpAccountant, ZcdpAccountant, GdpAccountant):
        cached = make()
        for history in (first, [*first, *more], first[: cut // 2], edited):
            assert cached.epsilon(history, 1e-6) == make().epsilon(history, 1e-6)


# --- Independent references -----------------------------------------------------------------


def exact_gdp_delta(events: list[Event], eps: float) -> float:
    """Dong, Roth, Su 2019, Corollary 2.13 for the composed mu, written here with scipy.stats."""
    mu = math.sqrt(sum((e.sensitivity / e.sigma) ** 2 for e in events if isinstance(e, Gaussian)))
    if mu == 0:
        return 0.0
    return float(norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2))


def exact_rdp(events: list[Event], alpha: float) -> float:
    """The exact RDP of Gaussian and Laplace events (Mironov 2017, Prop. 6-7), and alpha rho for
    discrete Gaussians (CKS 2020), written here."""
    total = 0.0
    for e in events:
        if isinstance(e, Gaussian):
            total += alpha * (e.sensitivity / e.sigma) ** 2 / 2
        elif isinstance(e, Laplace):
            x = float(e.sensitivity / e.scale)
            # Mironov 2017 Table II with e^((alpha-1)x) factored out of the log.
            mix = alpha + (alpha - 1) * math.exp(-(2 * alpha - 1) * x)
            total += x + math.log(mix / (2 * alpha - 1)) / (alpha - 1)
        else:
            assert isinstance(e, DiscreteGaussian)
            total += alpha * float(e.rho)
    return total


def continuous_order_epsilon(events: list[Event], delta: float) -> float:
    """min over real alpha > 1 of the improved conversion (CKS 2020 Prop. 12) of exact_rdp."""

    def eps(t: float) -> float:
        a = 1 + math.exp(t)
        return (
            exact_rdp(events, a) + math.log((a - 1) / a) - (math.log(delta) + math.log(a)) / (a - 1)
        )

    found = minimize_scalar(eps, bounds=(-12, 14), method="bounded", options={"xatol": 1e-10})
    return float(found.fun)


def reference_rdp(events: list[Event], orders: tuple[float, ...]) -> ReferenceRdp:
    accountant = ReferenceRdp(orders=orders)
    for e in events:
        if isinstance(e, Gaussian):
            accountant.compose(dp_accounting.GaussianDpEvent(e.sigma / e.sensitivity))
        else:
            assert isinstance(e, Laplace)
            accountant.compose(dp_accounting.LaplaceDpEvent(float(e.scale / e.sensitivity)))
    return accountant


def run_filter(
    filt: RdpFilter | ZcdpFilter | GdpFilter | BasicFilter, stream: list[Event]
) -> list[Event]:
    admitted: list[Event] = []
    for event in stream:
        if filt.admits(admitted, [event]):
            admitted.append(event)
    return admitted


# Mostly small events, so that an admitted history ends close to the cap (a filter 5% too
# generous must fail these tests; checked by mutation when they were written).
small_gaussian = st.builds(Gaussian, st.floats(4.0, 60.0), st.just(1.0))
small_laplace = st.builds(
    Laplace, st.fractions(min_value=4, max_value=200, max_denominator=10), st.just(Fraction(1))
)
small_discrete_gaussian = st.builds(
    DiscreteGaussian, st.integers(16, 3600).map(Fraction), st.just(Fraction(1))
)


def streams(events: st.SearchStrategy[Event]) -> st.SearchStrategy[list[Event]]:
    """Runs of repeated events, long enough to reach the caps."""
    runs = st.lists(st.tuples(events, st.integers(1, 40)), min_size=1, max_size=8)
    return runs.map(lambda rs: [e for e, n in rs for _ in range(n)])


mixed_stream = streams(st.one_of(small_gaussian, small_laplace, gaussian))
caps = st.tuples(st.sampled_from([0.5, 1.0, 3.0]), st.sampled_from([1e-9, 1e-6, 1e-3]))


# --- Filters --------------------------------------------------------------------------------


@SETTINGS
@given(mixed_stream, caps, st.sampled_from([2.0, 8.0, 32.0]))
def test_rdp_filter_single_order_sound(
    stream: list[Event], cap: tuple[float, float], alpha: float
) -> None:
    eps_cap, delta_cap = cap
    admitted = run_filter(RdpFilter(Fraction(eps_cap), Fraction(delta_cap), (alpha,)), stream)
    if admitted:
        reference = reference_rdp(admitted, (alpha,))
        assert reference.get_epsilon(delta_cap) <= eps_cap * (1 + 1e-12)


def union_shares(
    eps_cap: float, delta_cap: float, orders: tuple[float, ...], main_share: float
) -> list[float]:
    """Each order's conversion delta under the union bound, recomputed from the documented
    rule: ``main_share`` of delta to the order where a zCDP budget (RDP alpha rho) fits best at
    that share, the rest equally to every order."""
    common = delta_cap * (1 - main_share) / len(orders)
    top = delta_cap * main_share + common

    def budget(a: float, share: float) -> float:  # CKS 2020, Prop. 12 solved for the RDP
        return eps_cap - math.log1p(-1 / a) + (math.log(share) + math.log(a)) / (a - 1)

    main = max(orders, key=lambda a: budget(a, top) / a) if main_share else None
    return [top if a == main else common for a in orders]


@settings(max_examples=examples(30), deadline=None)
@given(mixed_stream, caps, st.sampled_from(["default", "version 1"]))
def test_rdp_filter_union_sound(stream: list[Event], cap: tuple[float, float], grid: str) -> None:
    eps_cap, delta_cap = cap
    if grid == "default":
        filt, orders, main = RdpFilter(Fraction(eps_cap), Fraction(delta_cap)), DEFAULT_ORDERS, 0.9
    else:
        orders, main = ORDERS_V1, 0.0
        filt = RdpFilter(Fraction(eps_cap), Fraction(delta_cap), orders, main_share=Fraction(0))
    shares = union_shares(eps_cap, delta_cap, orders, main)
    # The union bound holds: the orders' deltas add up to at most the conversion's.
    assert sum(map(Fraction, filt.shares)) <= Fraction(delta_cap)
    assert list(filt.shares) == pytest.approx(shares, rel=1e-12)
    admitted = run_filter(filt, stream)
    if admitted:
        per_order = [
            reference_rdp(admitted, (a,)).get_epsilon(share)
            for a, share in zip(orders, shares, strict=True)
        ]
        assert min(per_order) <= eps_cap * (1 + 1e-12)


@SETTINGS
@given(streams(st.one_of(small_gaussian, small_laplace, small_discrete_gaussian)), caps)
def test_zcdp_filter_sound(stream: list[Event], cap: tuple[float, float]) -> None:
    eps_cap, delta_cap = cap
    admitted = run_filter(ZcdpFilter(Fraction(eps_cap), Fraction(delta_cap)), stream)
    if not admitted:
        return
    if all(isinstance(e, Gaussian) for e in admitted):
        assert exact_gdp_delta(admitted, eps_cap) <= delta_cap * (1 + 1e-9)
    else:
        assert continuous_order_epsilon(admitted, delta_cap) <= eps_cap * (1 + 1e-9)


@SETTINGS
@given(streams(st.one_of(small_gaussian, any_event)), caps)
def test_gdp_filter_sound(stream: list[Event], cap: tuple[float, float]) -> None:
    eps_cap, delta_cap = cap
    admitted = run_filter(GdpFilter(Fraction(eps_cap), Fraction(delta_cap)), stream)
    assert all(isinstance(e, Gaussian) for e in admitted)
    assert exact_gdp_delta(admitted, eps_cap) <= delta_cap * (1 + 1e-9)


@SETTINGS
@given(
    st.lists(
        st.one_of(
            st.builds(PureDP, small_fraction), st.builds(ApproxDP, small_fraction, tiny_delta)
        )
    ),
    st.sampled_from([Fraction(1), Fraction(5, 2)]),
    st.sampled_from([Fraction(0), Fraction(1, 10**7)]),
)
def test_basic_filter_sound(stream: list[Event], eps_cap: Fraction, delta_cap: Fraction) -> None:
    admitted = run_filter(BasicFilter(eps_cap, delta_cap), stream)
    assert sum((e.epsilon for e in admitted), Fraction(0)) <= eps_cap
    assert sum((e.delta for e in admitted), Fraction(0)) <= delta_cap


@SETTINGS
@given(
    st.lists(
        st.builds(ApproxDP, small_fraction.map(lambda x: x / 10), tiny_delta),
        min_size=1,
        max_size=40,
    )
)
def test_approx_delta_cap_respected(stream: list[Event]) -> None:
    cap = Fraction(2, 10**8)
    for filt in (
        RdpFilter(Fraction(3), Fraction("1e-6"), approx_delta_cap=cap),
        ZcdpFilter(Fraction(3), Fraction("1e-6"), approx_delta_cap=cap),
    ):
        admitted = run_filter(filt, stream)
        assert sum((e.delta for e in admitted), Fraction(0)) <= cap
    assert run_filter(RdpFilter(Fraction(3), Fraction("1e-6")), stream) == []


# --- Shapes the curves rely on --------------------------------------------------------------


@SETTINGS
@given(scale, st.integers(1, 6), st.integers(1, 6), st.sampled_from(DEFAULT_ORDERS[:30]))
def test_laplace_curves_superadditive_in_the_shift(
    t: Fraction, a: int, b: int, alpha: float
) -> None:
    together = discrete_laplace_rdp(t, a + b, alpha)
    assert discrete_laplace_rdp(t, a, alpha) + discrete_laplace_rdp(t, b, alpha) <= together * (
        1 + 1e-12
    )
    x, y = a / float(t), b / float(t)
    assert laplace_rdp(x, alpha) + laplace_rdp(y, alpha) <= laplace_rdp(x + y, alpha) * (1 + 1e-12)


@settings(max_examples=examples(30), deadline=None)
@given(st.floats(0.2, 30.0), st.integers(1, 4), st.floats(0.0, 4.0))
def test_discrete_gaussian_delta_grows_with_the_shift(
    sigma2: float, shift: int, eps: float
) -> None:
    assert discrete_gaussian_delta(sigma2, shift, eps) <= discrete_gaussian_delta(
        sigma2, shift + 1, eps
    )
