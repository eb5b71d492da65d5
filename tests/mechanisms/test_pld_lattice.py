"""The lattice PLDs of the discrete Laplace and Gaussian (dpsql.mechanisms.pld_lattice): exact
against a 40-digit direct convolution of the pmfs in both directions, the shift dominance, the
rigour of the float bound, and the FFT noise of dp_accounting that the PLD figure now covers."""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Callable
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from conftest import examples
from dp_accounting.pld import privacy_loss_distribution
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsql.accounting.theorems.pld import PldAccountant
from dpsql.accounting.theorems.pld_filter import PldFilter
from dpsql.mechanisms.conversions import discrete_gaussian_delta
from dpsql.mechanisms.gaussian_events import DiscreteGaussian
from dpsql.mechanisms.laplace_events import DiscreteLaplace
from dpsql.mechanisms.pld_lattice import (
    Composition,
    LatticePld,
    discrete_gaussian_pld,
    discrete_laplace_pld,
)

mpmath.mp.dps = 40
Law = dict[object, mpmath.mpf]  # loss (an mpf, or "inf") -> P's mass


def _laplace_pmf(scale: Fraction) -> dict[int, mpmath.mpf]:
    """The discrete Laplace pmf over 80 scales each side (the rest is below e^-80)."""
    q = mpmath.exp(-mpmath.mpf(scale.denominator) / scale.numerator)
    width = math.ceil(80 * scale)
    return {y: (1 - q) / (1 + q) * q ** abs(y) for y in range(-width, width + 1)}


def _gaussian_pmf(sigma2: Fraction) -> dict[int, mpmath.mpf]:
    """N_Z(0, sigma2), normalised over all of Z (mpmath's nsum), listed over 14 sigma."""
    s2 = mpmath.mpf(sigma2.numerator) / sigma2.denominator
    norm = mpmath.nsum(lambda y: mpmath.exp(-(y**2) / (2 * s2)), [-mpmath.inf, mpmath.inf])
    width = math.ceil(14 * math.sqrt(sigma2))
    return {y: mpmath.exp(-mpmath.mpf(y * y) / (2 * s2)) / norm for y in range(-width, width + 1)}


def _law(pmf: dict[int, mpmath.mpf], shift: int, reverse: bool) -> Law:
    """The law of ln A(y)/B(y) under A: (A, B) = (N, N + shift), or (N + shift, N) if reverse;
    outcomes outside the listed window are left out (their mass is below e^-80)."""
    law: Law = defaultdict(lambda: mpmath.mpf(0))
    for y in range(min(pmf), max(pmf) + shift + 1):
        a, b = pmf.get(y - shift if reverse else y), pmf.get(y if reverse else y - shift)
        if a is None:
            continue
        key = "inf" if b is None else mpmath.nstr(mpmath.log(a / b), 30)
        law[key] += a
    return law


def _compose(one: Law, two: Law) -> Law:
    out: Law = defaultdict(lambda: mpmath.mpf(0))
    for la, pa in one.items():
        for lb, pb in two.items():
            key = "inf" if "inf" in (la, lb) else mpmath.nstr(mpmath.mpf(la) + mpmath.mpf(lb), 30)
            out[key] += pa * pb
    return out


def _hockey_stick(law: Law, epsilon: float) -> mpmath.mpf:
    return sum(
        (p if loss == "inf" else p * max(0, 1 - mpmath.exp(epsilon - mpmath.mpf(loss))))
        for loss, p in law.items()
    )


def _exact(pmf: dict[int, mpmath.mpf], shift: int, count: int, reverse: bool, eps: float) -> float:
    law = one = _law(pmf, shift, reverse)
    for _ in range(count - 1):
        law = _compose(law, one)
    return float(_hockey_stick(law, eps))


def _within(got: float, exact: float) -> bool:
    """From above, to a relative 1e-9 (the bound's own slack is ~1e-11); outcomes left out of
    the 40-digit reference weigh below 1e-30."""
    return exact - 1e-30 <= got <= exact * (1 + 1e-9) + 1e-15


@settings(max_examples=examples(25), deadline=None)
@given(
    scale=st.sampled_from([Fraction(3, 2), Fraction(2), Fraction(3), Fraction(7)]),
    shift=st.integers(1, 3),
    count=st.integers(1, 3),
    eps=st.sampled_from([0.0, 0.2, 0.7, 1.5, 3.0]),
)
def test_discrete_laplace_pld_is_the_exact_hockey_stick_both_ways(
    scale: Fraction, shift: int, count: int, eps: float
) -> None:
    pmf = _laplace_pmf(scale)
    got = Composition(discrete_laplace_pld(scale, shift)).power(count).delta(eps)
    for reverse in (False, True):  # remove (N vs N + Delta) and add (N + Delta vs N)
        assert _within(got, _exact(pmf, shift, count, reverse, eps))


@settings(max_examples=examples(15), deadline=None)
@given(
    sigma2=st.sampled_from([Fraction(1, 2), Fraction(1), Fraction(9, 4), Fraction(3)]),
    shift=st.integers(1, 3),
    count=st.integers(1, 2),
    eps=st.sampled_from([0.0, 0.5, 1.5, 4.0]),
)
def test_discrete_gaussian_pld_is_the_exact_hockey_stick_both_ways(
    sigma2: Fraction, shift: int, count: int, eps: float
) -> None:
    pmf = _gaussian_pmf(sigma2)
    got = Composition(discrete_gaussian_pld(sigma2, shift)).power(count).delta(eps)
    for reverse in (False, True):
        assert _within(got, _exact(pmf, shift, count, reverse, eps))


@settings(max_examples=examples(40), deadline=None)
@given(
    sigma2=st.fractions(Fraction(1, 4), Fraction(400), max_denominator=8),
    shift=st.integers(1, 20),
    eps=st.floats(0.0, 6.0),
)
def test_one_discrete_gaussian_is_its_own_exact_curve(
    sigma2: Fraction, shift: int, eps: float
) -> None:
    # CKS 2020, Theorem 7, summed term by term in conversions.py (independent code)
    exact = discrete_gaussian_delta(float(sigma2), shift, eps)
    got = discrete_gaussian_pld(sigma2, shift).delta(eps)
    assert exact * (1 - 2e-12) - 1e-300 <= got <= exact * (1 + 1e-9) + 1e-15


@settings(max_examples=examples(40), deadline=None)
@given(
    noise=st.sampled_from([discrete_laplace_pld, discrete_gaussian_pld]),
    parameter=st.fractions(Fraction(1, 2), Fraction(30), max_denominator=4),
    shifts=st.tuples(st.integers(1, 11), st.integers(2, 12)).filter(lambda s: s[0] < s[1]),
    count=st.integers(1, 4),
    eps=st.floats(0.0, 4.0),
)
def test_the_largest_shift_dominates_every_smaller_one(
    noise: Callable[[Fraction, int], LatticePld],
    parameter: Fraction,
    shifts: tuple[int, int],
    count: int,
    eps: float,
) -> None:
    """The module's proof (monotone likelihood ratio), checked: (N, N + s) composed k times
    is below (N, N + Delta) composed k times at every epsilon, for s < Delta."""
    build, (low, high) = noise, shifts
    near = Composition(build(parameter, low)).power(count).delta(eps)
    far = Composition(build(parameter, high)).power(count).delta(eps)
    assert near <= far * (1 + 1e-10) + 1e-15


@settings(max_examples=examples(30), deadline=None)
@given(
    sigma2=st.sampled_from([Fraction(40), Fraction(250), Fraction(900)]),
    shift=st.integers(1, 4),
    factor=st.integers(2, 40),
    count=st.integers(1, 6),
    eps=st.floats(0.0, 3.0),
)
def test_coarsening_raises_every_delta(
    sigma2: Fraction, shift: int, factor: int, count: int, eps: float
) -> None:
    """Connect-the-dots onto every factor-th lattice point is pessimistic, composed too."""
    fine = discrete_gaussian_pld(sigma2, shift)
    coarse = fine.coarsened(factor)
    if count == 1:  # no composition: no tails trimmed either
        exact, got = fine.delta(eps), coarse.delta(eps)
        assert got >= exact * (1 - 1e-12)
    else:
        exact, got = (
            Composition(fine).power(count).delta(eps),
            Composition(coarse).power(count).delta(eps),
        )
        # both move tails of at most 1e-21 a step to the infinite loss, not the same ones
        assert got >= exact * (1 - 1e-12) - count * 1e-21
    # ... and stays tight: second order in the grid's width h (rounding every loss up to the
    # grid instead would add about h times the mass above epsilon, first order)
    h = float(coarse.unit)
    assert got <= exact + count * h * h * math.sqrt(sigma2) / shift + 1e-15


def test_the_bound_counts_its_float_operations() -> None:
    step = discrete_gaussian_pld(Fraction(250_000), 10).fitted()
    composed = Composition(step).power(140)
    # each mass: 140 steps of a sum of ~1,000 products; the bound multiplies by gamma of it
    assert 140 * len(step.masses) <= composed.operations <= 140 * (len(step.masses) + 40)
    # the figure is the float sum times (1 + gamma_n): its slack is ~1e-11 relative, no more
    eps = 1.0
    losses = composed.losses
    above = losses > eps
    raw = float(np.dot(composed.masses[above], -np.expm1(eps - losses[above])))
    assert raw < composed.delta(eps) <= raw * (1 + 1e-10) + composed.infinity * 1.01 + 1e-299


def test_losses_are_rounded_up() -> None:
    pld = discrete_laplace_pld(Fraction(3), 2)  # losses -2/3, 0, 2/3
    exact = [Fraction(-2, 3), Fraction(0), Fraction(2, 3)]
    for got, want in zip(pld.losses, exact, strict=True):
        assert want <= Fraction(float(got)) < want + Fraction(1, 10**15)


def test_compositions_do_not_depend_on_what_was_asked_before() -> None:
    step = discrete_laplace_pld(Fraction(20), 3)
    ordered, jumping = Composition(step, kept=2), Composition(step, kept=2)
    for k in range(1, 40):
        ordered.power(k)
    for k in (37, 5, 39, 12):
        a, b = ordered.power(k), jumping.power(k)
        assert a.offset == b.offset and np.array_equal(a.masses, b.masses)
        assert a.infinity == b.infinity


def test_dp_accounting_pld_is_of_the_truncated_noise() -> None:
    """dp_accounting's discrete Gaussian renormalises the noise on [-B, B] (B = ceil(11.6
    sigma) by default, outside mass <= 1e-30): the PLD of another mechanism. Forced to a small
    B it moves far from the untruncated curve (CKS Theorem 7); dpsql's PLD is that curve."""
    truncated = privacy_loss_distribution.from_discrete_gaussian_mechanism(
        50.0, 1, truncation_bound=100, value_discretization_interval=1e-5, use_connect_dots=True
    )
    ours = discrete_gaussian_pld(Fraction(2500), 1)
    for eps in (0.04, 0.07, 0.1):
        exact = discrete_gaussian_delta(2500.0, 1, eps)
        assert truncated.get_delta_for_epsilon(eps) > 2 * exact
        assert exact <= ours.delta(eps) <= exact * (1 + 1e-9)


@functools.cache
def _binomial_law(scale: Fraction, count: int) -> tuple[np.ndarray, np.ndarray]:
    """k discrete Laplaces of shift 1: losses (k - 2i)/t with binomial masses (KOV 2015), in
    40 digits, kept as floats (each within an ulp)."""
    q = mpmath.exp(-mpmath.mpf(scale.denominator) / scale.numerator)
    up = 1 / (1 + q)
    losses = [(count - 2 * i) * Fraction(1) / scale for i in range(count + 1)]
    masses = [
        mpmath.binomial(count, i) * up ** (count - i) * (1 - up) ** i for i in range(count + 1)
    ]
    return np.array([float(x) for x in losses]), np.array([float(m) for m in masses])


def _exact_laplace_composition(scale: Fraction, count: int, eps: float) -> float:
    losses, masses = _binomial_law(scale, count)
    above = losses > eps
    return float(np.sum(masses[above] * -np.expm1(eps - losses[above])))


@pytest.mark.parametrize(
    ("event", "count"),
    [
        (DiscreteLaplace(Fraction(200), Fraction(1)), 3000),
        (DiscreteLaplace(Fraction(50), Fraction(1)), 1000),
        (DiscreteGaussian(Fraction(400), Fraction(1)), 300),
        (DiscreteGaussian(Fraction(2500), Fraction(1)), 1000),
    ],
)
def test_the_pld_figure_covers_dp_accounting_fft_noise_near_1e_9(
    event: DiscreteLaplace | DiscreteGaussian, count: int
) -> None:
    """dp_accounting's FFT composition of these histories' grid pmfs is 1.1e-4 (Laplace 200,
    3,000 times) and 1.3e-5 (Laplace 50, 1,000 times) low at delta 1e-9 (pld.py docstring): the
    figure adds FFT_NOISE per event and stays above the exact value (without it, this fails)."""
    if isinstance(event, DiscreteLaplace):
        exact_at = lambda e: _exact_laplace_composition(event.scale, count, e)  # noqa: E731
    else:
        composed = Composition(discrete_gaussian_pld(event.sigma2, 1)).power(count)
        exact_at = composed.delta
    accountant = PldAccountant()
    for target in (1e-6, 1e-9):
        eps = _epsilon_at(exact_at, target)
        assert accountant.delta([event] * count, eps) >= exact_at(eps)
        # and epsilon at delta from above: exact delta at the figure's epsilon is within it
        assert exact_at(accountant.epsilon([event] * count, target)) <= target


def _epsilon_at(delta_at: object, target: float) -> float:
    lo, hi = 0.0, 30.0
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if delta_at(mid) > target else (lo, mid)  # type: ignore[operator]
    return hi


def test_the_filter_admits_exactly_the_exact_count_of_discrete_laplaces() -> None:
    """Pessimistic and tight: the count is the largest k whose exact (40-digit) delta fits."""
    mech = DiscreteLaplace(Fraction(100), Fraction(1))
    filt = PldFilter(Fraction(1), Fraction(1, 10**6), "identical", mech)
    tally, admitted = filt.tally(), 0
    while filt.admits_tally(tally, [mech]):
        tally.add(mech)
        admitted += 1
    assert _exact_laplace_composition(mech.scale, admitted, 1.0) <= 1e-6
    assert _exact_laplace_composition(mech.scale, admitted + 1, 1.0) > 1e-6
    spent = float(filt.epsilon_spent(tally))
    assert _exact_laplace_composition(mech.scale, admitted, spent) <= 1e-6
    assert _exact_laplace_composition(mech.scale, admitted, spent * (1 - 1e-6)) > 1e-6


@pytest.mark.parametrize(
    ("mech", "count"),
    [
        (DiscreteLaplace(Fraction(1000), Fraction(10), dimensions=1), 564),
        (DiscreteGaussian(Fraction(500**2), Fraction(10)), 140),
    ],
)
def test_the_filter_counts_the_streams_on_their_lattice(
    mech: DiscreteLaplace | DiscreteGaussian, count: int
) -> None:
    """The streams of docs/accounting.md (a COUNT with C = 10, epsilon 0.01 or sigma 50 times
    its sensitivity) in (1, 1e-6): 564 and 140 fit. The Gaussian's 140 is as many as the
    continuous Gaussian of the same sigma would (mu-GDP)."""
    filt = PldFilter(Fraction(1), Fraction(1, 10**6), "identical", mech)
    assert filt.admits([mech] * (count - 1), [mech])
    assert not filt.admits([mech] * count, [mech])
    tally = filt.tally()
    tally.add(mech, count)
    assert 0.999 < filt.epsilon_spent(tally) <= 1


def test_a_lattice_pld_is_a_value() -> None:
    pld = discrete_laplace_pld(Fraction(5), 1)
    assert isinstance(pld, LatticePld)
    assert pld.unit == Fraction(2, 5) and pld.offset == Fraction(-1, 5)
    assert pld.total == pytest.approx(1.0, rel=1e-11)
    with pytest.raises(ValueError, match="sensitivity"):
        discrete_laplace_pld(Fraction(5), 0)
    with pytest.raises(ValueError, match="sigma2"):
        discrete_gaussian_pld(Fraction(10**11), 1)


@settings(max_examples=examples(30), deadline=None)
@given(scale=st.sampled_from([Fraction(4), Fraction(10), Fraction(100), Fraction(7, 2)]),
       shift=st.integers(1, 3), cap=st.sampled_from([Fraction(1), Fraction(1, 2)]))  # fmt: skip
def test_a_pure_composition_keeps_delta_exactly_zero(
    scale: Fraction, shift: int, cap: Fraction
) -> None:
    """With delta_cap 0 a declared discrete Laplace fits exactly as often as basic composition
    allows (floor(cap t / Delta)): the tails a composition trims move up to finite losses, and
    which atoms lie above epsilon is decided exactly, so nothing rounds delta above 0."""
    mech = DiscreteLaplace(scale, Fraction(shift), dimensions=1)
    filt = PldFilter(cap, Fraction(0), "identical", mech)
    tally, admitted = filt.tally(), 0
    while filt.admits_tally(tally, [mech]):
        tally.add(mech)
        admitted += 1
    assert admitted == math.floor(cap * scale / shift)
    assert Fraction(filt.epsilon_spent(tally)) == admitted * Fraction(shift) / scale or (
        0 <= filt.epsilon_spent(tally) - float(admitted * shift / scale) <= 1e-12
    )
