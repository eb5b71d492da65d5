"""The sound half-width of a linear combination of discrete noises (dpsql.noise.tails):
coverage against the exact samplers, tightness, the one-term exact case and bad input."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from dpsql.errors import ParameterError
from dpsql.noise.samplers import (
    discrete_gaussian,
    discrete_gaussian_half_width,
    discrete_laplace,
    discrete_laplace_half_width,
)
from dpsql.noise.tails import Noise, linear_half_width

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
        assert h >= quantile
        if len(terms) >= 3:
            assert h <= 1.6 * quantile, (name, confidence, h / quantile)


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
