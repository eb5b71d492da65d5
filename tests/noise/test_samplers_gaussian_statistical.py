"""Goodness of fit of the exact discrete Gaussian sampler against its exact pmf (10**6 draws).

Every test here uses the same Pearson chi-square test at level ALPHA = 1e-6: a correct sampler
fails a given test with probability 1e-6, so these tests do not flake in CI. The power tests
show that the same test rejects a sampler whose sigma is off by 2 %.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import numpy.typing as npt
import pytest
from scipy import stats

from dpsql.mechanisms.gaussian import discrete_gaussian_tail
from dpsql.noise.gaussian import discrete_gaussian

pytestmark = pytest.mark.statistical

ALPHA = 1e-6
DRAWS = 10**6
MIN_EXPECTED = 5  # the usual validity condition for the chi-square approximation
BINS_PER_SIGMA = 25
OFF_BY_TWO_PERCENT = Fraction(51, 50) ** 2  # sigma * 1.02 <=> sigma2 * 1.02**2

SIGMA2S = [Fraction(1, 4), Fraction(1), Fraction(10), Fraction(2500, 7)]
BIG_NUMERATOR = Fraction(10**10, 3)
"""sigma ~ 57735: 2·p·q·t² ~ 2e20 is beyond int64, so every acceptance runs in Python ints."""


def bins(sigma2: Fraction, n: int) -> tuple[list[int], npt.NDArray[np.float64]]:
    """Integer edges e_1 < ... < e_B and the exact probabilities of the bins (-inf, e_1),
    [e_1, e_2), ..., [e_B, inf), from P(Z >= e) (``discrete_gaussian_tail``).

    Edges are every max(1, floor(sigma / 25)) integers over +-8 sigma; outer edges are dropped
    (merging the outer bins) until every bin expects at least MIN_EXPECTED of ``n`` draws.
    """
    sigma = math.sqrt(sigma2)
    step = max(1, int(sigma / BINS_PER_SIGMA))
    reach = int(8 * sigma) + 2
    edges = list(range(-reach, reach + 1, step))
    tails = [discrete_gaussian_tail(sigma2, e) for e in edges]
    # Dropping e_1 merges (-inf, e_1) into [e_1, e_2); likewise on the right.
    while n * min(1 - tails[0], tails[0] - tails[1]) < MIN_EXPECTED:
        edges, tails = edges[1:], tails[1:]
    while n * min(tails[-1], tails[-2] - tails[-1]) < MIN_EXPECTED:
        edges, tails = edges[:-1], tails[:-1]
    inner = [tails[i] - tails[i + 1] for i in range(len(tails) - 1)]
    probs = np.array([1 - tails[0], *inner, tails[-1]])
    assert (n * probs >= MIN_EXPECTED).all() and abs(probs.sum() - 1) < 1e-12
    return edges, probs


def chi_square_pvalue(sample: npt.NDArray[np.int64], sigma2: Fraction) -> float:
    """p-value of Pearson's chi-square test of ``sample`` against N_Z(0, sigma2)'s exact pmf."""
    edges, probs = bins(sigma2, sample.size)
    observed = np.bincount(np.searchsorted(edges, sample, side="right"), minlength=probs.size)
    expected = sample.size * probs
    statistic = float(((observed - expected) ** 2 / expected).sum())
    return float(stats.chi2.sf(statistic, df=probs.size - 1))


def power(sigma2: Fraction, true_sigma2: Fraction, n: int) -> float:
    """Probability that the test at ALPHA rejects n draws of N_Z(0, true_sigma2) against the
    pmf at sigma2: the noncentral chi-square approximation with noncentrality
    n·Σ (p_true - p)² / p over the same bins."""
    edges, probs = bins(sigma2, n)
    tails = [discrete_gaussian_tail(true_sigma2, e) for e in edges]
    inner = [tails[i] - tails[i + 1] for i in range(len(tails) - 1)]
    true = np.array([1 - tails[0], *inner, tails[-1]])
    noncentrality = float(n * ((true - probs) ** 2 / probs).sum())
    critical = stats.chi2.isf(ALPHA, df=probs.size - 1)
    return float(stats.ncx2.sf(critical, df=probs.size - 1, nc=noncentrality))


@pytest.mark.parametrize("sigma2", [*SIGMA2S, BIG_NUMERATOR], ids=str)
def test_discrete_gaussian_fits_exact_pmf(sigma2: Fraction) -> None:
    """10**6 draws pass a chi-square goodness-of-fit test against the exact pmf.

    False-failure rate: alpha = 1e-6 per sigma2 (the test rejects when p < 1e-6). 10**10/3
    runs the Python-integer acceptance for every proposal (~7 s).
    """
    sample = discrete_gaussian(sigma2, DRAWS)
    assert sample.dtype == np.int64 and sample.shape == (DRAWS,)
    assert chi_square_pvalue(sample, sigma2) >= ALPHA


@pytest.mark.parametrize("sigma2", [*SIGMA2S, BIG_NUMERATOR], ids=str)
def test_goodness_of_fit_detects_two_percent_sigma_error(sigma2: Fraction) -> None:
    """Power: the same test rejects 10**6 exact draws with sigma·1.02 against the pmf at sigma.

    Level alpha = 1e-6. The noncentrality is ~1117 at sigma2 = 1/4 and ~817 at the others
    (close to the Fisher bound n·2·0.02² = 800 for a continuous Gaussian), so the noncentral
    chi-square approximation puts the chance of NOT rejecting below 1e-58 (asserted below
    1e-9 first).
    """
    wrong = sigma2 * OFF_BY_TWO_PERCENT
    assert power(sigma2, wrong, DRAWS) > 1 - 1e-9
    assert chi_square_pvalue(discrete_gaussian(wrong, DRAWS), sigma2) < ALPHA
