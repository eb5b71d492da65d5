"""The sound half-width of a linear combination of discrete noises (dpsql.mechanisms.tails):
coverage against the exact samplers, tightness, the one-term exact case and bad input."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsql.errors import ParameterError
from dpsql.mechanisms.gaussian import discrete_gaussian_half_width
from dpsql.mechanisms.laplace import discrete_laplace_half_width
from dpsql.mechanisms.tails import Noise, linear_half_width
from dpsql.noise.gaussian import discrete_gaussian
from dpsql.noise.laplace import discrete_laplace

DRAWS = 200_000


def lap(t: int | Fraction) -> Noise:
    return Noise(scale=Fraction(t))


def gauss(s: int | Fraction) -> Noise:
    return Noise(sigma2=Fraction(s))


F = Fraction
COMBINATIONS = {
    "two equal Laplace": [(F(1), lap(10)), (F(1), lap(10))],
    "parent and 19 children": [(F(4, 5), lap(10))] + [(F(-1, 20), lap(10))] * 19,
    "child of a 4-way split": [(F(4, 5), lap(10)), (F(1, 5), lap(10))] + [(F(-1, 5), lap(10))] * 3,
    "Gaussian terms": [(F(1), gauss(100)), (F(1, 2), gauss(50)), (F(-1, 3), gauss(200))],
    "mixed": [(F(9, 10), lap(F(15, 2))), (F(1, 2), gauss(50)), (F(-1, 10), lap(20))],
    "five Laplace": [(F(1), lap(10))] * 5,
}


def absolute_sums(terms: list[tuple[Fraction, Noise]]) -> np.ndarray:
    total = np.zeros(DRAWS)
    for a, noise in terms:
        if noise.scale is not None:
            z = discrete_laplace(noise.scale, DRAWS)
        else:
            assert noise.sigma2 is not None
            z = discrete_gaussian(noise.sigma2, DRAWS)
        total += float(a) * z
    return np.abs(total)


@pytest.mark.parametrize("name", list(COMBINATIONS))
def test_covers_and_is_not_loose(name: str) -> None:
    terms = COMBINATIONS[name]
    sums = absolute_sums(terms)
    for confidence in (0.95, 0.99):
        h = linear_half_width(terms, confidence)
        quantile = float(np.quantile(sums, confidence))
        # Coverage within the draws' sampling error (a near-exact bound sits at the quantile;
        # the exact comparison is the property test below).
        standard_error = np.sqrt(confidence * (1 - confidence) / DRAWS)
        assert np.mean(sums <= h * (1 + 1e-12)) >= confidence - 4 * standard_error
        if len(terms) >= 3:
            assert h <= 1.6 * quantile, (name, confidence, h / quantile)
        if all(noise.scale is not None for _, noise in terms):  # the grid's bound: near-exact
            assert h <= 1.03 * quantile + 1, (name, confidence, h / quantile)


@pytest.mark.parametrize(
    ("a", "noise"),
    [(F(1), lap(10)), (F(-3, 7), lap(F(5, 2))), (F(2), gauss(40)), (F(1, 3), gauss(F(7, 2)))],
)
def test_one_term_is_exact(a: Fraction, noise: Noise) -> None:
    sums = absolute_sums([(a, noise)])
    for confidence in (0.9, 0.95, 0.99):
        if noise.scale is not None:
            k = discrete_laplace_half_width(noise.scale, confidence)
        else:
            assert noise.sigma2 is not None
            k = discrete_gaussian_half_width(noise.sigma2, confidence)
        h = linear_half_width([(a, noise)], confidence)
        assert Fraction(h) >= abs(a) * k
        assert h == pytest.approx(float(abs(a) * k), rel=1e-15)
        standard_error = np.sqrt(confidence * (1 - confidence) / DRAWS)
        assert np.mean(sums <= h) >= confidence - 4 * standard_error


def test_zero_coefficients_and_lattice() -> None:
    assert linear_half_width([(F(0), lap(3))], 0.95) == 0.0
    h = linear_half_width([(F(1), lap(10)), (F(0), gauss(9)), (F(1), lap(10))], 0.95)
    assert h == linear_half_width(COMBINATIONS["two equal Laplace"], 0.95)
    assert h == int(h)  # a sum of integers: the half-width is rounded down to an integer


def test_bad_input() -> None:
    with pytest.raises(ParameterError):
        linear_half_width([], 0.95)
    with pytest.raises(ParameterError):
        Noise()
    with pytest.raises(ParameterError):
        Noise(scale=F(1), sigma2=F(1))
    with pytest.raises(ParameterError):
        Noise(scale=F(0))
    with pytest.raises(ParameterError):
        Noise(sigma2=1.5)  # type: ignore[arg-type]
    for confidence in (0.0, 1.0, -0.5, 1.5, float("nan")):
        with pytest.raises(ParameterError):
            linear_half_width([(F(1), lap(1))], confidence)
    with pytest.raises(ParameterError):
        linear_half_width([(0.5, lap(1))], 0.95)  # type: ignore[list-item]


def _exact_half_width(terms: list[tuple[int, int]], confidence: float, lattice: int) -> Fraction:
    """The exact half-width of Σ b_k Z_k / lattice (integer b_k, discrete Laplace scales t_k):
    the pmf of the integer sum by direct convolution (support cut where the tails are < 1e-30)."""
    total = np.array([1.0])
    for b, t in terms:
        p = np.exp(-1 / t)
        reach = int(70 * t)
        z = np.arange(-reach, reach + 1)
        pmf = (1 - p) / (1 + p) * p ** np.abs(z)
        spread = np.zeros(2 * abs(b) * reach + 1)
        spread[:: abs(b)] = pmf
        total = np.convolve(total, spread)
    centre = len(total) // 2
    inside = total[centre] + np.cumsum(total[centre + 1 :] + total[centre - 1 :: -1][:centre])
    q = 0 if total[centre] >= confidence else int(np.nonzero(inside >= confidence)[0][0]) + 1
    return Fraction(q, lattice)


@settings(max_examples=examples(25), deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(-4, 4).filter(bool), st.integers(1, 12)), min_size=2, max_size=4
    ),
    st.integers(1, 6),
    st.sampled_from([0.9, 0.95, 0.99]),
)
def test_the_grid_bound_is_sound_and_within_a_lattice_step_of_exact(
    terms: list[tuple[int, int]], lattice: int, confidence: float
) -> None:
    """Against the exact quantile of Σ (b_k/L)·Z_k (computed by direct convolution): never
    below it (sound), and at most one lattice step and 1% above it (near-exact)."""
    combination = [(Fraction(b, lattice), lap(t)) for b, t in terms]
    h = linear_half_width(combination, confidence)
    exact = _exact_half_width(terms, confidence, lattice)
    assert Fraction(h) >= exact
    step = Fraction(math.gcd(*[b for b, _ in terms]), lattice)  # S lies on step·Z
    assert Fraction(h) <= exact * Fraction(101, 100) + step


def test_many_terms_and_huge_coefficients_are_near_exact() -> None:
    """A least-squares cell of 400 terms and a centred sum 2·SUM - M·COUNT (M = 1638400): the
    grid bound is within 2% of the simulated quantile, where Chernoff is 1.4-1.8 times it."""
    many = [(F(1 + k % 7, 400), lap(50 + k % 3)) for k in range(400)]
    centred = [(F(2), lap(F(65536000))), (F(-1638400), lap(F(184112, 1835)))]
    for terms in (many, centred):
        sums = absolute_sums(terms)
        h = linear_half_width(terms, 0.95)
        quantile = float(np.quantile(sums, 0.95))
        assert quantile * 0.99 <= h <= 1.02 * quantile
