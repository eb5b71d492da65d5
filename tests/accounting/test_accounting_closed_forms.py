"""Closed forms of the accountants, pinned and recomputed independently in the test.

Independent references: 50-digit mpmath evaluations of the published formulas (written here,
not imported from dpsql), and Google's dp_accounting 0.6 RdpAccountant for the RDP odometer.
"""

from __future__ import annotations

import math
from fractions import Fraction

import dp_accounting
import mpmath
import pytest
from dp_accounting.rdp import RdpAccountant as ReferenceRdp

from dpsql.accounting.theorems.basic import BasicAccountant, BasicFilter, basic_cost
from dpsql.accounting.theorems.gdp import GdpAccountant, GdpFilter
from dpsql.accounting.theorems.rdp import DEFAULT_ORDERS, ORDERS_V1, RdpAccountant, RdpFilter, rdp
from dpsql.accounting.theorems.zcdp import ZcdpAccountant, ZcdpFilter
from dpsql.mechanisms.conversions import (
    discrete_gaussian_delta,
    discrete_gaussian_epsilon,
    gaussian_rdp_epsilon_optimal_order,
    gdp_delta,
    gdp_epsilon,
    gdp_mu_cap,
    laplace_delta,
    rdp_to_delta,
    rdp_to_dp,
    rdp_to_dp_classic,
    zcdp_to_delta,
    zcdp_to_dp,
    zcdp_to_dp_simple,
)
from dpsql.mechanisms.curves import discrete_laplace_rdp, laplace_rdp
from dpsql.mechanisms.events import Event
from dpsql.mechanisms.gaussian_events import DiscreteGaussian, Gaussian
from dpsql.mechanisms.laplace_events import Laplace
from dpsql.mechanisms.stated_events import ApproxDP, PureDP

mpmath.mp.dps = 50


def mp_gdp_delta(mu: float, eps: float) -> mpmath.mpf:
    """Dong, Roth, Su 2019, Corollary 2.13, at 50 digits."""
    mu, eps = mpmath.mpf(mu), mpmath.mpf(eps)
    return mpmath.ncdf(-eps / mu + mu / 2) - mpmath.exp(eps) * mpmath.ncdf(-eps / mu - mu / 2)


def mp_gdp_epsilon(mu: float, delta: float) -> float:
    """Root of mp_gdp_delta(mu, eps) = delta, at 50 digits."""
    lo, hi = mpmath.mpf(0), mpmath.mpf(mu * mu + 10 * mu + 10)
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mp_gdp_delta(mu, mid) > delta else (lo, mid)
    return float(hi)


def mp_discrete_gaussian_delta(sigma2: float, shift: int, eps: float) -> mpmath.mpf:
    """CKS 2020 Theorem 7 in its tail form: P[Y > eps s2/D - D/2] - e^eps P[Y > eps s2/D + D/2]
    for Y ~ N_Z(0, s2), by explicit sums over the integers (the strict inequalities matter)."""
    s2, d, e = mpmath.mpf(sigma2), mpmath.mpf(shift), mpmath.mpf(eps)
    reach = int(60 * math.sqrt(sigma2)) + 20 + int(abs(eps * sigma2 / shift))
    ys = range(-reach, reach + 1)
    weight = {y: mpmath.exp(-(mpmath.mpf(y) ** 2) / (2 * s2)) for y in ys}
    norm = mpmath.fsum(weight.values())

    def tail(x: mpmath.mpf) -> mpmath.mpf:
        return mpmath.fsum(w for y, w in weight.items() if y > x) / norm

    return tail(e * s2 / d - d / 2) - mpmath.exp(e) * tail(e * s2 / d + d / 2)


# --- RDP conversions ------------------------------------------------------------------------


def test_classic_conversion_pins() -> None:
    # The pins, and their independent derivation: d/dalpha [alpha a + L/(alpha-1)] = 0
    # at alpha = 1 + sqrt(L/a) (Mironov 2017, Proposition 3).
    assert gaussian_rdp_epsilon_optimal_order(1, 4, 1e-6) == pytest.approx(
        1.345380442439233, abs=1e-12
    )
    assert gaussian_rdp_epsilon_optimal_order(1000, 8, 1e-6) == pytest.approx(
        28.590726703363874, abs=1e-12
    )
    for k, sigma in [(1, 4), (1000, 8), (7, 0.9)]:
        a, log_inv = mpmath.mpf(k) / (2 * mpmath.mpf(sigma) ** 2), -mpmath.log(mpmath.mpf("1e-6"))
        alpha = 1 + mpmath.sqrt(log_inv / a)
        expected = float(alpha * a + log_inv / (alpha - 1))
        got = gaussian_rdp_epsilon_optimal_order(k, sigma, 1e-6)
        assert expected <= got <= expected * (1 + 1e-13)
        assert rdp_to_dp_classic(float(alpha * a), float(alpha), 1e-6) >= expected


@pytest.mark.parametrize(("rdp_value", "alpha", "delta"), [(0.5, 2.0, 1e-5), (3.0, 32.0, 1e-9)])
def test_improved_conversion_against_its_formula(
    rdp_value: float, alpha: float, delta: float
) -> None:
    r, a, d = mpmath.mpf(rdp_value), mpmath.mpf(alpha), mpmath.mpf(delta)
    expected = float(r + mpmath.log((a - 1) / a) - (mpmath.log(d) + mpmath.log(a)) / (a - 1))
    got = rdp_to_dp(rdp_value, alpha, delta)
    assert expected <= got <= expected * (1 + 1e-13)
    # delta at that epsilon comes back: CKS 2020 Proposition 12 read the other way.
    assert rdp_to_delta(rdp_value, alpha, got) == pytest.approx(delta, rel=1e-10)
    assert got < rdp_to_dp_classic(rdp_value, alpha, delta)


def test_zcdp_conversions() -> None:
    # CKS Corollary 13 beats the simple bound of Bun-Steinke and, for a Gaussian, stays above
    # the exact GDP value (rho = mu^2/2).
    for rho in [0.005, 0.125, 2.0]:
        exact = mp_gdp_epsilon(math.sqrt(2 * rho), 1e-6)
        cks = zcdp_to_dp(rho, 1e-6)
        assert exact <= cks < zcdp_to_dp_simple(rho, 1e-6)
        assert zcdp_to_delta(rho, cks) == pytest.approx(1e-6, rel=1e-6)
    # Pinned: rho 1/2 at delta 1e-9 (a Gaussian of sigma = sensitivity).
    assert zcdp_to_dp(0.5, 1e-9) == pytest.approx(6.474070020733966, abs=1e-9)


# --- Gaussian DP ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mu", "eps"), [(1.0, 1.0), (0.5, 0.1), (0.01, 0.05), (3.0, 10.0), (5.0, 40.0), (0.2, 0.0)]
)
def test_gdp_delta_exact(mu: float, eps: float) -> None:
    expected = mp_gdp_delta(mu, eps)
    got = gdp_delta(mu, eps)
    assert got >= expected
    assert got == pytest.approx(float(expected), rel=1e-10)


def test_gdp_pins() -> None:
    assert gdp_delta(1.0, 1.0) == pytest.approx(0.12693673750664397, rel=1e-12)
    assert gdp_epsilon(1.0, 1e-9) == pytest.approx(mp_gdp_epsilon(1.0, 1e-9), rel=1e-12)
    assert gdp_epsilon(1.0, 1e-9) == pytest.approx(6.17393504667, abs=1e-9)
    mu = gdp_mu_cap(1.0, 1e-6)
    assert mp_gdp_delta(mu, 1.0) <= 1e-6 < mp_gdp_delta(mu * (1 + 1e-9), 1.0)


def test_laplace_profile() -> None:
    # Continuous Laplace with eps0 = 1: delta(eps) = 1 - exp((eps - 1)/2); none at eps >= 1.
    assert laplace_delta(1.0, 0.5) == pytest.approx(1 - math.exp(-0.25), rel=1e-13)
    assert laplace_delta(1.0, 1.0) == 0.0


# --- The discrete Gaussian ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sigma2", "shift", "eps"),
    [(1, 1, 0.5), (1, 1, 2.0), (1, 1, 6.0), (2.5, 2, 1.0), (0.5, 1, 0.1), (100, 3, 0.2)],
)
def test_discrete_gaussian_delta_independent(sigma2: float, shift: int, eps: float) -> None:
    expected = mp_discrete_gaussian_delta(sigma2, shift, eps)
    got = discrete_gaussian_delta(sigma2, shift, eps)
    assert got >= expected
    assert got == pytest.approx(float(expected), rel=1e-11)


def test_discrete_gaussian_is_not_the_continuous_one() -> None:
    # FACTS.md: at sigma 1, delta 1e-9 the discrete Gaussian needs epsilon 6.32, the continuous
    # one 6.17.
    discrete = discrete_gaussian_epsilon(1.0, 1, 1e-9)
    assert discrete == pytest.approx(6.3214191298, abs=1e-8)
    assert round(discrete, 2) == 6.32
    assert round(gdp_epsilon(1.0, 1e-9), 2) == 6.17
    assert mp_discrete_gaussian_delta(1, 1, discrete) <= 1e-9


# --- Event curves ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scale", "shift", "alpha"),
    [(Fraction(1), 1, 2.0), (Fraction(10), 3, 1.25), (Fraction(7, 2), 2, 64.0)],
)
def test_discrete_laplace_rdp_against_summation(scale: Fraction, shift: int, alpha: float) -> None:
    q = mpmath.exp(-1 / mpmath.mpf(scale))
    c = (1 - q) / (1 + q)
    total = mpmath.nsum(
        lambda z: c * q ** (alpha * abs(z) + (1 - alpha) * abs(z - shift)),
        [-mpmath.inf, mpmath.inf],
    )
    expected = float(mpmath.log(total) / (alpha - 1))
    got = discrete_laplace_rdp(scale, shift, alpha)
    assert expected <= got == pytest.approx(expected, rel=1e-12)


def test_laplace_rdp_matches_mironov() -> None:
    # Mironov 2017 Table II: (1/(a-1)) ln(a/(2a-1) e^((a-1)e) + (a-1)/(2a-1) e^(-a e)).
    for eps, a in [(0.1, 2.0), (1.0, 8.0), (0.01, 1.25)]:
        e, al = mpmath.mpf(eps), mpmath.mpf(a)
        expected = mpmath.log(
            al / (2 * al - 1) * mpmath.exp((al - 1) * e)
            + (al - 1) / (2 * al - 1) * mpmath.exp(-al * e)
        ) / (al - 1)
        assert laplace_rdp(eps, a) == pytest.approx(float(expected), rel=1e-12)
        assert rdp(Laplace(Fraction(1) / Fraction(eps), Fraction(1)), a) >= float(expected)


# --- Odometers against exact GDP and the closed form ----------------------------------------

GAUSSIAN_HISTORIES = [(1, 4.0), (1000, 8.0), (10, 2.0), (100, 20.0), (10_000, 50.0), (1, 100.0)]


@pytest.mark.parametrize(("k", "sigma"), GAUSSIAN_HISTORIES)
def test_odometers_between_exact_gdp_and_closed_form(k: int, sigma: float) -> None:
    history: list[Event] = [Gaussian(sigma, 1.0)] * k
    exact = mp_gdp_epsilon(math.sqrt(k) / sigma, 1e-6)
    closed = gaussian_rdp_epsilon_optimal_order(k, sigma, 1e-6)
    for accountant in (RdpAccountant(), ZcdpAccountant()):
        assert exact <= accountant.epsilon(history, 1e-6) <= closed
    gdp = GdpAccountant().epsilon(history, 1e-6)
    assert exact <= gdp == pytest.approx(exact, rel=1e-12)


def test_gdp_refuses_the_discrete_gaussian() -> None:
    history: list[Event] = [Gaussian(2.0, 1.0), DiscreteGaussian(Fraction(4), Fraction(1))]
    assert GdpAccountant().epsilon(history, 1e-6) == math.inf
    assert not GdpFilter(Fraction(1), Fraction("1e-6")).admits([], history[1:])


# --- Filters: their own bounds, pinned ------------------------------------------------------


def count_admitted(filt: RdpFilter | GdpFilter | ZcdpFilter | BasicFilter, event: Event) -> int:
    history: list[Event] = []
    while filt.admits(history, [event]):
        history.append(event)
        assert len(history) < 100_000
    return len(history)


def test_rdp_filter_single_order_pinned() -> None:
    # Budget at alpha 32 for (1, 1e-6): 1 - ln(31/32) + (ln 1e-6 + ln 32)/31 (CKS Prop. 12).
    a, d = mpmath.mpf(32), mpmath.mpf("1e-6")
    budget = float(1 - mpmath.log((a - 1) / a) + (mpmath.log(d) + mpmath.log(a)) / (a - 1))
    filt = RdpFilter(Fraction(1), Fraction("1e-6"), orders=(32.0,))
    assert filt.budgets[0] == pytest.approx(0.6978849997608827, abs=1e-12)
    assert filt.budgets[0] <= budget
    # Gaussians of sigma 40: RDP 32/3200 = 0.01 each, so 69 fit.
    assert count_admitted(filt, Gaussian(40.0, 1.0)) == 69


def _mp_order_budget(alpha: float, share: mpmath.mpf) -> mpmath.mpf:
    """The largest RDP at alpha converting to epsilon 1 at ``share`` (CKS 2020, Prop. 12)."""
    a = mpmath.mpf(alpha)
    return 1 - mpmath.log((a - 1) / a) + (mpmath.log(share) + mpmath.log(a)) / (a - 1)


def test_rdp_filter_union_bound_pinned() -> None:
    # The default split: 9/10 of delta to the order where a zCDP budget fits best at that
    # share, 1/10 equally to all orders; the filter admits while some order is within its
    # budget. Recomputed here from the formula, order by order, at 50 digits.
    m, sigma, delta = len(DEFAULT_ORDERS), 40.0, mpmath.mpf("1e-6")
    top, common = delta * (mpmath.mpf(9) / 10 + mpmath.mpf(1) / (10 * m)), delta / (10 * m)
    main = max(DEFAULT_ORDERS, key=lambda a: _mp_order_budget(a, top) / a)
    best = 0
    for alpha in DEFAULT_ORDERS:
        budget = _mp_order_budget(alpha, top if alpha == main else common)
        best = max(best, int(mpmath.floor(budget / (alpha / (2 * sigma**2)))))
    filt = RdpFilter(Fraction(1), Fraction("1e-6"))
    assert filt.orders[filt.main] == main == 1 + 1.41 * 16
    assert count_admitted(filt, Gaussian(sigma, 1.0)) == best == 76
    # A single order fixed in advance at the main order admits a little more (no union bound).
    single = RdpFilter(Fraction(1), Fraction("1e-6"), (main,))
    assert count_admitted(single, Gaussian(sigma, 1.0)) == 77
    # Version 1's grid with delta split equally across its 42 orders admitted 58: the union
    # paid ln 42 in ln(1/delta) where the main order pays ln(10/9).
    equal = RdpFilter(Fraction(1), Fraction("1e-6"), ORDERS_V1, main_share=Fraction(0))
    best = 0
    for alpha in ORDERS_V1:
        budget = _mp_order_budget(alpha, delta / len(ORDERS_V1))
        best = max(best, int(mpmath.floor(budget / (alpha / (2 * sigma**2)))))
    assert count_admitted(equal, Gaussian(sigma, 1.0)) == best == 58
    # The GDP filter (exact for continuous Gaussians) admits the most.
    gdp = GdpFilter(Fraction(1), Fraction("1e-6"))
    assert count_admitted(gdp, Gaussian(sigma, 1.0)) == 89 == math.floor((gdp.mu_cap * sigma) ** 2)


def test_zcdp_filter_caps() -> None:
    filt = ZcdpFilter(Fraction(1), Fraction("1e-6"))
    assert (
        zcdp_to_dp(float(filt.rho_cap), 1e-6) <= 1 < zcdp_to_dp(float(filt.rho_cap) * 1.001, 1e-6)
    )
    assert float(filt.rho_cap) == pytest.approx(0.024355970359525945, rel=1e-9)
    # An exact rho budget fills exactly: four charges of rho 1/8 fit 1/2, the fifth does not.
    rho_filter = ZcdpFilter(rho_cap=Fraction(1, 2), delta_cap=Fraction("1e-6"))
    assert count_admitted(rho_filter, DiscreteGaussian(Fraction(4), Fraction(1))) == 4
    assert float(rho_filter.epsilon_cap) == pytest.approx(zcdp_to_dp(0.5, 1e-6), rel=1e-15)


def test_basic_is_exact() -> None:
    filt = BasicFilter(Fraction(1), Fraction(0))
    assert count_admitted(filt, PureDP(Fraction("0.01"))) == 100
    history: list[Event] = [PureDP(Fraction("0.01"))] * 100 + [
        ApproxDP(Fraction(1), Fraction("1e-7"))
    ]
    # A float delta is read as the decimal it prints as (1e-7, not the float just below it).
    assert BasicAccountant().epsilon(history, 1e-7) == 2.0
    assert BasicAccountant().epsilon(history, 0.9e-7) == math.inf
    # A discrete Gaussian on 4 coordinates goes through its rho = 4/(2*16) (CKS Corollary 13),
    # on one coordinate through its own curve (CKS Theorem 7).
    several = DiscreteGaussian(Fraction(16), Fraction(1), target_epsilon=Fraction(1), dimensions=4)
    assert float(basic_cost(several)[1]) == zcdp_to_delta(0.125, 1.0)
    one = DiscreteGaussian(Fraction(16), Fraction(1), target_epsilon=Fraction(1))
    assert float(basic_cost(one)[1]) == pytest.approx(
        float(mp_discrete_gaussian_delta(16, 1, 1.0)), rel=1e-10
    )
    # A Gaussian is charged at least its own delta at its target epsilon.
    gaussian = Gaussian(4.0, 1.0, target_epsilon=Fraction(1), target_delta=Fraction(0))
    assert float(basic_cost(gaussian)[1]) == pytest.approx(
        float(mp_gdp_delta(0.25, 1.0)), rel=1e-12
    )


# --- Cross-check against dp_accounting ------------------------------------------------------

MIXES = [
    [("gauss", 8.0, 3000), ("laplace", 10.0, 7000)],
    [("gauss", 1.0, 5), ("laplace", 1.0, 5), ("gauss", 50.0, 9990)],
    [("laplace", 100.0, 10_000)],
    [("laplace", 2.0, 40), ("gauss", 3.0, 60), ("laplace", 30.0, 900)],
]


def build(mix: list[tuple[str, float, int]]) -> tuple[list[Event], list[dp_accounting.DpEvent]]:
    ours: list[Event] = []
    theirs: list[dp_accounting.DpEvent] = []
    for kind, noise, count in mix:
        if kind == "gauss":
            ours += [Gaussian(noise, 1.0)] * count
            event: dp_accounting.DpEvent = dp_accounting.GaussianDpEvent(noise)
        else:
            ours += [Laplace(Fraction(noise), Fraction(1))] * count
            event = dp_accounting.LaplaceDpEvent(noise)
        theirs.append(dp_accounting.SelfComposedDpEvent(event, count))
    return ours, theirs


@pytest.mark.parametrize("mix", MIXES)
def test_rdp_odometer_matches_dp_accounting(mix: list[tuple[str, float, int]]) -> None:
    ours, theirs = build(mix)
    reference = ReferenceRdp(orders=DEFAULT_ORDERS)
    reference.compose(dp_accounting.ComposedDpEvent(theirs))
    for delta in (1e-5, 1e-9):
        expected = reference.get_epsilon(delta)
        got = RdpAccountant().epsilon(ours, delta)
        assert expected <= got == pytest.approx(expected, rel=1e-12)
    eps = reference.get_epsilon(1e-6)
    assert RdpAccountant().delta(ours, eps) == pytest.approx(reference.get_delta(eps), rel=1e-9)


@pytest.mark.parametrize("mix", MIXES)
def test_zcdp_odometer_against_dp_accounting(mix: list[tuple[str, float, int]]) -> None:
    # zCDP bounds each RDP curve from above (Laplace by eps^2 alpha/2) but optimizes the order
    # continuously: it is never below the dense-grid RDP value by more than the grid's spacing,
    # and for Gaussians alone never above any grid's value.
    ours, theirs = build(mix)
    dense = [1 + math.exp(t / 100) for t in range(-700, 1000)]
    reference = ReferenceRdp(orders=dense)
    reference.compose(dp_accounting.ComposedDpEvent(theirs))
    got = ZcdpAccountant().epsilon(ours, 1e-6)
    assert got >= reference.get_epsilon(1e-6) * (1 - 1e-4)
    if all(kind == "gauss" for kind, _, _ in mix):
        assert got <= reference.get_epsilon(1e-6)
