"""Goodness of fit of the exact discrete Laplace sampler against its exact pmf (10**6 draws).

Every test here uses the same chi-square test at level ALPHA = 1e-6: a correct sampler fails a
given test with probability 1e-6, so these tests do not flake in CI.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import numpy.typing as npt
import pytest
from scipy import stats

from dpsql.mechanisms.laplace import discrete_laplace_pmf, discrete_laplace_tail
from dpsql.noise.laplace import discrete_laplace

pytestmark = pytest.mark.statistical

ALPHA = 1e-6
DRAWS = 10**6
MIN_EXPECTED = 5  # the usual validity condition for the chi-square approximation


def _central_bins(scale: Fraction, n: int) -> int:
    """Largest m such that the bins {k} for |k| <= m and the two tails |Z| > m all have an
    expected count of at least MIN_EXPECTED (the pmf decreases in |k|, so checking the outer
    bins suffices)."""
    m = 0
    while (
        n * discrete_laplace_pmf(scale, m + 1) >= MIN_EXPECTED
        and n * discrete_laplace_tail(scale, m + 2) >= MIN_EXPECTED
    ):
        m += 1
    return m


def chi_square_pvalue(sample: npt.NDArray[np.int64], scale: Fraction) -> float:
    """p-value of Pearson's chi-square test of ``sample`` against the exact discrete Laplace pmf.

    Bins: Z <= -m-1, each k in [-m, m], Z >= m+1, with m from ``_central_bins``; the expected
    probabilities come from the exact pmf and tail and sum to 1 (up to float rounding).
    """
    n = sample.size
    m = _central_bins(scale, n)
    assert m >= 1, "too few draws for a meaningful test"
    observed = np.bincount(np.clip(sample, -m - 1, m + 1) + m + 1, minlength=2 * m + 3)
    tail = discrete_laplace_tail(scale, m + 1)
    probs = np.array([tail, *(discrete_laplace_pmf(scale, k) for k in range(-m, m + 1)), tail])
    expected = n * probs
    statistic = float(((observed - expected) ** 2 / expected).sum())
    return float(stats.chi2.sf(statistic, df=probs.size - 1))


@pytest.mark.parametrize(
    "scale", [Fraction(1, 3), Fraction(1), Fraction(7, 2), Fraction(10), Fraction(1000, 7)]
)
def test_discrete_laplace_fits_exact_pmf(scale: Fraction) -> None:
    """10**6 draws pass a chi-square goodness-of-fit test against the exact pmf.

    False-failure rate: alpha = 1e-6 per scale (the test rejects when p < 1e-6).
    """
    sample = discrete_laplace(scale, DRAWS)
    assert sample.dtype == np.int64
    assert chi_square_pvalue(sample, scale) >= ALPHA


@pytest.mark.parametrize("scale", [Fraction(1, 3), Fraction(1), Fraction(7, 2), Fraction(10)])
def test_goodness_of_fit_detects_two_percent_scale_error(scale: Fraction) -> None:
    """Power: the same test rejects 10**6 exact draws at scale·1.02 against the pmf at scale.

    Level alpha = 1e-6. The noncentrality of the chi-square statistic is about 400 at every
    scale listed, so the probability of NOT rejecting is below 1e-14 (computed with scipy's
    noncentral chi-square). At scale 1000/7 the ~1900 bins dilute it to ~90 % power, so that
    scale is only in the fit test.
    """
    wrong = discrete_laplace(scale * Fraction(102, 100), DRAWS)
    assert chi_square_pvalue(wrong, scale) < ALPHA
