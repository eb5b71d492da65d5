"""The integer quantile score and the exact exponential mechanism (dpsql.noise.exponential).

Scores are checked against a brute-force count over the expanded rows, and their sensitivity
bound by adding and removing rows (hypothesis). The sampler is checked by Pearson's chi-square
test against ``exponential_probabilities`` at level ALPHA = 1e-6 (a correct sampler fails a given
test with probability 1e-6), and each configuration's power against γ off by 5% is computed
from the non-central chi-square distribution, so the statistical tests are known to be able to
fail.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dpsql.errors import EntropyError, ParameterError
from dpsql.mechanisms.quantile_score import quantile_scores, score_sensitivity
from dpsql.noise import bits
from dpsql.noise.exponential import (
    exponential_mechanism,
    exponential_mechanism_samples,
    exponential_probabilities,
)
from dpsql.noise.exponential_sampler import _build_table

ALPHA = 1e-6
MIN_EXPECTED = 5  # the usual validity condition for the chi-square approximation
POWER = 0.99  # each statistical configuration must detect γ·1.05 with at least this power
NAMED_P = [Fraction(0), Fraction(1), Fraction(1, 2), Fraction(1, 3)]


# --- helpers ---------------------------------------------------------------------------------


def brute_force_scores(
    histogram: dict[int, int], lower: int, upper: int, p: Fraction, shift: int = 0
) -> list[int]:
    """The definition, row by row: b·dist(p·n + shift, [#{x < c}, #{x <= c}]) for p = a/b, over
    the rows and |shift| rows padded at ``lower`` (a negative shift: the target rank p·n of the
    padded rows) or at ``upper`` (positive: p·n + shift)."""
    rows = [key for key, count in histogram.items() for _ in range(count)]
    a, b = p.numerator, p.denominator
    t = a * len(rows) + b * max(shift, 0)
    rows += [lower if shift < 0 else upper] * abs(shift)
    return [
        max(b * sum(x < c for x in rows) - t, t - b * sum(x <= c for x in rows), 0)
        for c in range(lower, upper + 1)
    ]


def pooled_bins(probs: Sequence[float], draws: int) -> list[list[int]]:
    """Candidates with an expected count >= MIN_EXPECTED get their own bin; the others share
    one bin, folded into the largest bin if even the pool is below MIN_EXPECTED."""
    big = [[j] for j, q in enumerate(probs) if draws * q >= MIN_EXPECTED]
    rest = [j for j, q in enumerate(probs) if draws * q < MIN_EXPECTED]
    if rest and draws * sum(probs[j] for j in rest) >= MIN_EXPECTED:
        return [*big, rest]
    if rest:
        largest = max(range(len(big)), key=lambda i: probs[big[i][0]])
        big[largest] = big[largest] + rest
    return big


def binned(probs: Sequence[float], bins: list[list[int]]) -> npt.NDArray[np.float64]:
    return np.array([sum(probs[j] for j in b) for b in bins])


def chi_square_pvalue(sample: npt.NDArray[np.int64], probs: Sequence[float]) -> float:
    """Pearson's chi-square p-value of ``sample`` (candidate indices) against ``probs``."""
    bins = pooled_bins(probs, sample.size)
    assert len(bins) >= 2, "too few bins for a meaningful test"
    counts = np.bincount(sample, minlength=len(probs))
    observed = np.array([counts[b].sum() for b in bins], dtype=np.float64)
    expected = sample.size * binned(probs, bins)
    statistic = float(((observed - expected) ** 2 / expected).sum())
    return float(stats.chi2.sf(statistic, df=len(bins) - 1))


def power_against(scores: Sequence[int], gamma: Fraction, wrong: Fraction, draws: int) -> float:
    """Power of the chi-square test above when the sampler really used γ' = ``wrong``: the
    statistic is then approximately non-central chi-square with df = bins - 1 and
    non-centrality λ = draws·Σ (q_b - p_b)²/p_b (computed, not simulated)."""
    probs = exponential_probabilities(scores, gamma)
    bins = pooled_bins(probs, draws)
    p = binned(probs, bins)
    q = binned(exponential_probabilities(scores, wrong), bins)
    noncentrality = draws * float(((q - p) ** 2 / p).sum())
    df = len(bins) - 1
    return float(stats.ncx2.sf(stats.chi2.isf(ALPHA, df), df, noncentrality))


# --- quantile scores -------------------------------------------------------------------------

p_values = st.one_of(
    st.sampled_from(NAMED_P),
    st.builds(Fraction, st.integers(0, 12), st.integers(1, 12)).filter(lambda f: f <= 1),
)


@st.composite
def histograms(draw: st.DrawFn) -> tuple[dict[int, int], int, int]:
    lower = draw(st.integers(-20, 20))
    upper = lower + draw(st.integers(0, 15))
    keys = st.integers(lower, upper)
    histogram = draw(st.dictionaries(keys, st.integers(0, 6), max_size=8))
    return histogram, lower, upper


@settings(max_examples=examples(300), deadline=None)
@given(histograms(), p_values, st.integers(-30, 30))
def test_quantile_scores_match_brute_force(
    case: tuple[dict[int, int], int, int], p: Fraction, shift: int
) -> None:
    histogram, lower, upper = case
    assert quantile_scores(histogram, lower, upper, p, shift) == brute_force_scores(
        histogram, lower, upper, p, shift
    )


@pytest.mark.parametrize("p", NAMED_P)
def test_named_quantiles(p: Fraction) -> None:
    """p = 0 scores #{x < c} (minimum at or below the smallest row), p = 1 scores #{x > c},
    p = 1/2 is zero at the median of an odd count; rows tied on c count on both sides."""
    histogram = {1: 2, 3: 1, 6: 2}  # rows 1, 1, 3, 6, 6
    scores = quantile_scores(histogram, 0, 7, p)
    expected = {
        Fraction(0): [0, 0, 2, 2, 3, 3, 3, 5],
        Fraction(1): [5, 3, 3, 2, 2, 2, 0, 0],
        Fraction(1, 2): [5, 1, 1, 0, 1, 1, 1, 5],  # max(2·below - 5, 5 - 2·upto, 0)
        Fraction(1, 3): [5, 0, 1, 1, 4, 4, 4, 10],  # max(3·below - 5, 5 - 3·upto, 0)
    }[p]
    assert scores == expected


def test_quantile_scores_big_integer_path() -> None:
    """b·n >= 2**63 switches to Python integers; the result still matches the formula."""
    p = Fraction(1, 2**30)
    histogram = {0: 2**40, 3: 2**40 - 5, 4: 7}
    a, b = p.numerator, p.denominator
    total = sum(histogram.values())
    expected = []
    for c in range(6):
        below = sum(n for x, n in histogram.items() if x < c)
        upto = sum(n for x, n in histogram.items() if x <= c)
        expected.append(max(b * below - a * total, a * total - b * upto, 0))
    assert b * total >= 2**63
    assert quantile_scores(histogram, 0, 5, p) == expected


def test_quantile_scores_empty_histogram_and_numpy_keys() -> None:
    assert quantile_scores({}, 3, 6, Fraction(1, 2)) == [0, 0, 0, 0]
    numpy_keys: dict[Any, Any] = {np.int64(4): np.int64(2)}  # as read from an engine result
    assert quantile_scores(numpy_keys, 3, 5, Fraction(1, 2)) == [2, 0, 2]


@pytest.mark.parametrize(
    ("p", "expected"),
    [
        (Fraction(0), 1),
        (Fraction(1), 1),
        (Fraction(1, 2), 1),
        (Fraction(1, 3), 2),
        (Fraction(3, 4), 3),
        (Fraction(2, 4), 1),
    ],
)
def test_score_sensitivity_values(p: Fraction, expected: int) -> None:
    assert score_sensitivity(p) == expected


@settings(max_examples=examples(300), deadline=None)
@given(histograms(), p_values, st.data(), st.integers(-30, 30))
def test_score_sensitivity_bounds_add_and_remove(
    case: tuple[dict[int, int], int, int], p: Fraction, data: st.DataObject, shift: int
) -> None:
    """Also for a shifted target (an interval's endpoint): the shift is public, a constant."""
    histogram, lower, upper = case
    before = quantile_scores(histogram, lower, upper, p, shift)
    row = data.draw(st.integers(lower, upper))
    added = dict(histogram)
    added[row] = added.get(row, 0) + 1
    after = quantile_scores(added, lower, upper, p, shift)
    assert max(abs(x - y) for x, y in zip(before, after, strict=True)) <= score_sensitivity(p)
    assert min(before) == 0 == min(after)  # the best candidate scores 0, shifted or not
    present = [k for k, n in histogram.items() if n > 0]
    if present:
        removed = dict(histogram)
        removed[data.draw(st.sampled_from(present))] -= 1
        after = quantile_scores(removed, lower, upper, p, shift)
        assert max(abs(x - y) for x, y in zip(before, after, strict=True)) <= score_sensitivity(p)


@pytest.mark.parametrize("p", [Fraction(1, 3), Fraction(3, 4), Fraction(1, 2)])
def test_score_sensitivity_is_attained(p: Fraction) -> None:
    """The bound is tight: a row below every candidate moves the top candidate by b - a, a row
    above them moves the bottom one by a."""
    moved = {
        abs(x - y)
        for row in (0, 9)
        for x, y in zip(
            quantile_scores({}, 0, 9, p), quantile_scores({row: 1}, 0, 9, p), strict=True
        )
    }
    assert max(moved) == score_sensitivity(p)


@pytest.mark.parametrize(
    ("histogram", "lower", "upper", "p", "error"),
    [
        ({10: 1}, 0, 9, Fraction(1, 2), ValueError),
        ({-1: 1}, 0, 9, Fraction(1, 2), ValueError),
        ({3: -1}, 0, 9, Fraction(1, 2), ValueError),
        ({3: 1.0}, 0, 9, Fraction(1, 2), ValueError),
        ({"3": 1}, 0, 9, Fraction(1, 2), ValueError),
        ({3: True}, 0, 9, Fraction(1, 2), ValueError),
        ({}, 0, 9, 0.5, ParameterError),
        ({}, 0, 9, Fraction(3, 2), ParameterError),
        ({}, 0, 9, Fraction(-1, 2), ParameterError),
        ({}, 5, 4, Fraction(1, 2), ParameterError),
        ({}, 0, 2**24, Fraction(1, 2), ParameterError),
        ({}, 0.0, 9, Fraction(1, 2), ParameterError),
    ],
)
def test_quantile_scores_validation(
    histogram: Any, lower: Any, upper: Any, p: Any, error: type[Exception]
) -> None:
    with pytest.raises(error):
        quantile_scores(histogram, lower, upper, p)


def test_score_sensitivity_validation() -> None:
    with pytest.raises(ParameterError, match="Fraction"):
        score_sensitivity(0.5)  # type: ignore[arg-type]


# --- the mechanism: validation and structure -------------------------------------------------


@pytest.mark.parametrize(
    ("scores", "gamma", "message"),
    [
        ([], Fraction(1), "empty"),
        (np.array([], dtype=np.int64), Fraction(1), "empty"),
        ([1, 2], Fraction(0), "positive"),
        ([1, 2], Fraction(-1, 2), "positive"),
        ([1, 2], 0.5, "Fraction"),
        ([1, 2], 1, "Fraction"),
        ([1.0, 2.0], Fraction(1), "integers"),
        ([1, 2.5], Fraction(1), "integers"),
        ([True, 2], Fraction(1), "integers"),
        ([Fraction(1), 2], Fraction(1), "integers"),
        (np.array([0.5, 1.0]), Fraction(1), "integers"),
        (np.array([True, False]), Fraction(1), "integers"),
        (np.array([[1, 2]]), Fraction(1), "one-dimensional"),
        ("12", Fraction(1), "sequence"),
        (None, Fraction(1), "sequence"),
    ],
)
def test_exponential_mechanism_validation(scores: Any, gamma: Any, message: str) -> None:
    with pytest.raises(ParameterError, match=message):
        exponential_mechanism(scores, gamma)


def test_samples_validation() -> None:
    with pytest.raises(ParameterError):
        exponential_mechanism_samples([1, 2], Fraction(1), -1)
    with pytest.raises(ParameterError):
        exponential_mechanism_samples([1, 2], Fraction(1), 3, scheme="fast")  # type: ignore[arg-type]
    assert exponential_mechanism_samples([1, 2], Fraction(1), 0).size == 0


def test_exponential_mechanism_returns_an_index() -> None:
    assert exponential_mechanism([7], Fraction(1)) == 0
    for scores in ([5, 3, 9], np.array([5, 3, 9], dtype=np.int32), np.array([5, 3, 9], np.uint8)):
        j = exponential_mechanism(scores, Fraction(1, 2))
        assert isinstance(j, int) and 0 <= j < 3
    # Shifting every score by a constant changes nothing but must not overflow int64.
    shifted = np.array([2**63 - 1, -(2**63), 0], dtype=np.int64)
    assert exponential_mechanism(shifted, Fraction(1)) == 1


def test_fails_closed_without_randomness(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(n: int) -> bytes:
        raise OSError("no entropy")

    monkeypatch.setattr(os, "urandom", broken)
    with pytest.raises(EntropyError):
        exponential_mechanism([0, 1, 2], Fraction(1))


def test_exponential_probabilities_closed_form() -> None:
    probs = exponential_probabilities([4, 5], Fraction(1))
    assert probs[0] == pytest.approx(1 / (1 + math.exp(-1)), rel=1e-15)
    assert sum(exponential_probabilities([0, 3, 10**30], Fraction(7, 3))) == pytest.approx(1)
    assert exponential_probabilities([0, 10**30], Fraction(1))[1] == 0.0


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(st.integers(0, 60), min_size=1, max_size=80),
    st.builds(Fraction, st.integers(1, 40), st.integers(1, 9)),
)
def test_levels_table_puts_each_candidate_at_or_below_its_level(
    scores: list[int], gamma: Fraction
) -> None:
    """Slot (g, t) must hold a candidate with floor(x_j) >= g, so that the acceptance
    probability exp(-(x_j - g)) is at most 1; and C = max_T ceil(N_T/(T + 1))."""
    table = _build_table(scores, gamma, "levels")
    whole = np.asarray(table.whole, dtype=np.int64)
    ranks = np.arange(len(scores))
    assert sorted(table.order.tolist()) == list(range(len(scores)))  # every candidate, once
    assert np.all(whole[table.order] >= ranks // table.width)
    levels = sorted(whole.tolist())
    assert table.width == max(-(-(r + 1) // (lvl + 1)) for r, lvl in enumerate(levels))


def test_auto_scheme_choice() -> None:
    concentrated = _build_table(np.abs(np.arange(2000) - 700), Fraction(2), "auto")
    flat = _build_table(list(range(100)), Fraction(1, 1000), "auto")
    small = _build_table([0, 9, 9, 9, 9, 9, 9, 9], Fraction(1), "auto")
    assert concentrated.geometric and concentrated.width == 1
    assert not flat.geometric and flat.width == 100
    assert not small.geometric  # K <= 64: one uniform batch is cheaper


# --- the mechanism: goodness of fit ----------------------------------------------------------

MIXED = [3, 0, 5, 1, 7, 2, 9, 4]
CONCENTRATED = np.abs(np.arange(2000) - 700).tolist()
SPIKE = [0, 5, 7, *range(20, 100)]  # only the minimum has noticeable mass at γ = 3/2
CASES: list[tuple[str, list[int], Fraction, int]] = [
    ("mixed K=8", MIXED, Fraction(1, 3), 10**6),
    ("concentrated K=2000", CONCENTRATED, Fraction(2), 10**6),
    ("spike K=83", SPIKE, Fraction(3, 2), 4 * 10**6),
]
UNIFORM_DRAWS = {"mixed K=8": 10**6, "concentrated K=2000": 10_000, "spike K=83": 200_000}
"""The uniform scheme needs about K/S proposals per draw (1,500 for the concentrated case), so
it is checked with fewer draws where the automatic choice would not use it."""


@pytest.mark.parametrize(("name", "scores", "gamma", "draws"), CASES, ids=[c[0] for c in CASES])
def test_power_against_gamma_off_by_five_percent(
    name: str, scores: list[int], gamma: Fraction, draws: int
) -> None:
    """Each goodness-of-fit configuration below would reject a sampler with γ·1.05 or γ/1.05
    with probability >= POWER (non-central chi-square), so those tests can fail."""
    for wrong in (gamma * Fraction(105, 100), gamma / Fraction(105, 100)):
        assert power_against(scores, gamma, wrong, draws) >= POWER, name


@pytest.mark.statistical
@pytest.mark.parametrize("scheme", ["auto", "levels"])
@pytest.mark.parametrize(("name", "scores", "gamma", "draws"), CASES, ids=[c[0] for c in CASES])
def test_sampler_fits_exact_distribution(
    name: str, scores: list[int], gamma: Fraction, draws: int, scheme: Any
) -> None:
    sample = exponential_mechanism_samples(scores, gamma, draws, scheme=scheme)
    assert chi_square_pvalue(sample, exponential_probabilities(scores, gamma)) > ALPHA, name


@pytest.mark.statistical
@pytest.mark.parametrize(("name", "scores", "gamma", "draws"), CASES, ids=[c[0] for c in CASES])
def test_uniform_scheme_fits_exact_distribution(
    name: str, scores: list[int], gamma: Fraction, draws: int
) -> None:
    draws = UNIFORM_DRAWS[name]
    sample = exponential_mechanism_samples(scores, gamma, draws, scheme="uniform")
    assert chi_square_pvalue(sample, exponential_probabilities(scores, gamma)) > ALPHA, name


@pytest.mark.statistical
def test_single_draw_api_fits() -> None:
    """The one-draw entry point (a fresh table per call) has the same distribution."""
    scores, gamma, draws = [2, 0, 1, 4], Fraction(1, 2), 10_000
    sample = np.array([exponential_mechanism(scores, gamma) for _ in range(draws)])
    assert chi_square_pvalue(sample, exponential_probabilities(scores, gamma)) > ALPHA


@pytest.mark.statistical
def test_huge_gamma_always_picks_the_minimum() -> None:
    """At γ = 50 every other candidate has mass below 2·e^-50: 10**6 draws all hit the
    minimum unless the sampler is wrong (probability < 10**-15 otherwise)."""
    scores = [9, 4, 1, 3, 0, 2, 7]
    sample = exponential_mechanism_samples(scores, Fraction(50), 10**6)
    assert np.all(sample == 4)


@pytest.mark.statistical
def test_big_integer_path_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scores beyond int64 and a γ with a large denominator run on Python integers."""
    calls = {"rational": 0}
    rational = bits._bernoulli_exp_rational_python

    def counted(num: int, den: int) -> bool:
        calls["rational"] += 1
        return rational(num, den)

    monkeypatch.setattr(bits, "_bernoulli_exp_rational_python", counted)
    scores = [2**70, 2**70 + 1, 2**70 + 3, 2**71, 2**70 + 2]
    gamma = Fraction(2**64 + 1, 2**64)  # denominator beyond int64: fraction stage in Python
    sample = exponential_mechanism_samples(scores, gamma, 30_000, scheme="uniform")
    assert calls["rational"] > 0  # the 2**70-level candidate went through Python integers
    assert chi_square_pvalue(sample, exponential_probabilities(scores, gamma)) > ALPHA


@pytest.mark.statistical
@pytest.mark.parametrize("scheme", ["uniform", "levels"])
def test_lowered_fast_limit_fits(monkeypatch: pytest.MonkeyPatch, scheme: Any) -> None:
    """With the fast-path limit lowered to 16, every stage takes its Python continuation."""
    calls = {"bernoulli": 0}
    bernoulli = bits._bernoulli_exp_python

    def counted(a: int, b: int, k: int = 1) -> bool:
        calls["bernoulli"] += 1
        return bernoulli(a, b, k)

    monkeypatch.setattr(bits, "_FAST_LIMIT", 16)
    monkeypatch.setattr(bits, "_bernoulli_exp_python", counted)
    scores, gamma = [0, 3, 1, 40, 2, 5, 17, 9], Fraction(5, 7)
    sample = exponential_mechanism_samples(scores, gamma, 30_000, scheme=scheme)
    assert calls["bernoulli"] > 100
    assert chi_square_pvalue(sample, exponential_probabilities(scores, gamma)) > ALPHA
