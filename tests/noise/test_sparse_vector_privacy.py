"""Privacy of the sparse-vector walks (``dpsql.noise.sparse_vector``) on neighbouring counts.

Neighbours: every count of every walk moves by at most Δ, all in one direction, and both ladders
stay non-negative and non-increasing. The claim is pure ε-DP for such monotone queries (Lyu, Su,
Li, VLDB 2017, Theorem 4 and section 3.4, as cited by the module).

Exact check: ``exact`` sums P(output | counts) over the threshold noise ρ in [-r, r] with
40-digit decimals, walks independent given ρ; the mass left out, 2 P(Z > r) < 1e-12, is the
``slack``. Computed P̂ satisfy P̂ <= P <= P̂ + slack, so ε-DP implies P̂_D(o) <= e^ε (P̂_D'(o) +
slack): ``loss`` = max_o ln(P̂_D(o) / (P̂_D'(o) + slack)) is a certified lower bound of the
true privacy loss and never exceeds ε for a correct mechanism. The exhaustive one-walk search
finds 0.74-0.84 ε (worst pair (0,0,0,0) against (Δ,Δ,0,0), threshold 3, output rung 2); with
the query noise scale halved the same checker finds 1.35-1.52 ε at Δ = 1.

Audit: the real sampler on D = (4,4,4,4), D' = (5,5,4,4), threshold 4 (exact loss 0.70 ε at
ε = 1/2, 0.72 ε at 1, 0.79 ε at 2, on output rung 2). In six runs of 10,000 draws per data set
the Clopper-Pearson lower bounds of ε measured were 0.00-0.13 at ε = 1/2, 0.32-0.40 at ε = 1
and 1.19-1.30 at ε = 2 (0.63 at ε = 1 with 100,000 draws), never above the charged ε. The same
audit of the halved query scale at ε = 2 measured 2.38-2.63 > 2 (its exact loss is 3.03).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterator, Sequence
from decimal import Context, Decimal, localcontext
from fractions import Fraction

import pytest
from conftest import LONG, examples
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dpsql.noise.sparse_vector import THRESHOLD_SHARE, Walks, above_threshold
from dpsql.plan.auto import TRADEOFF_THRESHOLD

Ladders = tuple[tuple[int, ...], ...]
Dist = dict[tuple[int, ...], Decimal]

_CTX = Context(prec=40)
TRUNCATION_DIGITS = 12  # P(|ρ| > r) < 10^-12: the absolute slack of every comparison
EPSILONS = (Fraction(1, 2), Fraction(1), Fraction(2))
SHARES = (THRESHOLD_SHARE, TRADEOFF_THRESHOLD)  # the threshold's share: ESTIMATE's, the trade-off's
ALPHA = 1e-6  # false-failure rate of each sampled test


def _powers(scale: Fraction, n: int) -> tuple[Decimal, list[Decimal]]:
    """p = exp(-1/scale) and [p^j / (1 + p) for j in 0..n]: P(Z >= j) = p^j/(1+p) for j >= 1."""
    p = (-Decimal(scale.denominator) / Decimal(scale.numerator)).exp()
    out = [1 / (1 + p)]
    for _ in range(n):
        out.append(out[-1] * p)
    return p, out


def exact(
    threshold_scale: Fraction,
    query_scale: Fraction,
    ladders: Ladders,
    thresholds: Sequence[Fraction],
) -> tuple[Dist, Decimal]:
    """P(stopping rungs | ladders) summed over |ρ| <= r, and the mass 2 P(Z > r) left out."""
    with localcontext(_CTX):
        r = math.ceil(float(threshold_scale) * TRUNCATION_DIGITS * math.log(10))
        p_rho, rho_tail = _powers(threshold_scale, r + 1)
        # Rung i stops iff nu_i >= ceil(count_i - threshold) + ρ, ρ an integer.
        offsets = [
            [math.ceil(c - t) for c in ladder]
            for ladder, t in zip(ladders, thresholds, strict=True)
        ]
        _, a = _powers(query_scale, max(abs(k) for o in offsets for k in o) + r + 2)
        out: Dist = {}
        for rho in range(-r, r + 1):
            per_walk = []
            for offset in offsets:
                reach, stops = Decimal(1), []
                for k in offset[:-1]:
                    j = k + rho  # P(nu >= j) = p^j/(1+p) for j >= 1, by symmetry otherwise
                    tail = a[j] if j >= 1 else 1 - a[1 - j]
                    stops.append(reach * tail)
                    reach *= 1 - tail
                stops.append(reach)  # the last rung: stopped there or never
                per_walk.append(stops)
            weight = (1 - p_rho) * rho_tail[abs(rho)]  # P(ρ) = (1-p)/(1+p) p^|ρ|
            for rungs in itertools.product(*(range(len(s)) for s in per_walk)):
                term = weight
                for stops, i in zip(per_walk, rungs, strict=True):
                    term *= stops[i]
                out[rungs] = out.get(rungs, Decimal(0)) + term
        return out, 2 * rho_tail[r + 1]


def loss(p: Dist, q: Dist, slack: Decimal) -> float:
    """max_o ln(P̂(o) / (Q̂(o) + slack)): a lower bound of the privacy loss of P against Q."""
    with localcontext(_CTX):
        return float(max(p[o] / (q[o] + slack) for o in p).ln())


def pair_loss(walks: Walks, d: Ladders, d2: Ladders, thresholds: Sequence[Fraction]) -> float:
    p, slack = exact(walks.threshold_scale, walks.query_scale, d, thresholds)
    q, _ = exact(walks.threshold_scale, walks.query_scale, d2, thresholds)
    return max(loss(p, q, slack), loss(q, p, slack))


def move(ladder: Sequence[int], steps: Sequence[int], sign: int) -> tuple[int, ...]:
    """ladder + sign·steps, each rung raised to the next one's value if needed (from the
    last rung up), so the result stays non-negative and non-increasing and within Δ."""
    moved: list[int] = []
    floor = 0
    for count, step in zip(reversed(ladder), reversed(steps), strict=True):
        floor = max(count + sign * step, floor)
        moved.append(floor)
    return tuple(reversed(moved))


def ladders_below(top: int, length: int) -> Iterator[tuple[int, ...]]:
    """Every non-increasing ladder of ``length`` counts in [0, top]."""
    yield from itertools.combinations_with_replacement(range(top, -1, -1), length)


def worst_single_walk_loss(walks: Walks, top: int = 3) -> float:
    """The largest loss over every one-walk ladder of 4 counts in [0, top] and every up-move
    of it by [0, Δ] per rung, at thresholds 3 and 5/2. Down-moves are the same pairs swapped,
    and the check is two-sided."""
    cache: dict[tuple[tuple[int, ...], Fraction], tuple[Dist, Decimal]] = {}

    def dist(ladder: tuple[int, ...], threshold: Fraction) -> tuple[Dist, Decimal]:
        if (ladder, threshold) not in cache:
            scales = (walks.threshold_scale, walks.query_scale)
            cache[ladder, threshold] = exact(*scales, (ladder,), (threshold,))
        return cache[ladder, threshold]

    worst = -math.inf
    for threshold in (Fraction(3), Fraction(5, 2)):
        for ladder in ladders_below(top, 4):
            for steps in itertools.product(range(walks.sensitivity + 1), repeat=4):
                other = tuple(c + s for c, s in zip(ladder, steps, strict=True))
                if list(other) == sorted(other, reverse=True):
                    (p, slack), (q, _) = dist(ladder, threshold), dist(other, threshold)
                    worst = max(worst, loss(p, q, slack), loss(q, p, slack))
    return worst


# --- exact neighbour checks --------------------------------------------------------------------


@pytest.mark.parametrize("share", SHARES)
@pytest.mark.parametrize("sensitivity", [1, 2])
@pytest.mark.parametrize("epsilon", EPSILONS)
def test_every_small_neighbour_pair_within_epsilon(
    epsilon: Fraction, sensitivity: int, share: Fraction
) -> None:
    worst = worst_single_walk_loss(Walks(epsilon, 1, sensitivity, share))
    assert worst <= epsilon  # pure ε-DP (Lyu, Su, Li 2017, Thm 4, monotone queries)
    # The enumeration reaches the near-worst pairs: measured 0.74-0.84 of epsilon at the 2/5
    # share, 0.59-0.71 at 3/5 (more on the threshold: 4-rung walks realise less of the queries').
    assert worst >= (0.7 if share == THRESHOLD_SHARE else 0.55) * float(epsilon)


class HalvedQueryNoise(Walks):
    """The mechanism with a bug: query noise at half the scale the proof needs."""

    @property
    def query_scale(self) -> Fraction:
        return super().query_scale / 2


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_checker_flags_halved_query_noise(epsilon: Fraction) -> None:
    assert worst_single_walk_loss(HalvedQueryNoise(epsilon, 1, 1)) > 1.2 * float(epsilon)


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_checker_flags_query_noise_ignoring_the_walk_count(epsilon: Fraction) -> None:
    # Two walks at the scale of one (c·Δ/ε2 with c = 1): both stopping rungs leak ε2.
    walks = HalvedQueryNoise(epsilon, 2, 1)
    zero = ((0, 0, 0, 0), (0, 0, 0, 0))
    assert pair_loss(walks, zero, ((1, 1, 0, 0),) * 2, (Fraction(3),) * 2) > 1.2 * float(epsilon)
    correct = Walks(epsilon, 2, 1)
    assert pair_loss(correct, zero, ((1, 1, 0, 0),) * 2, (Fraction(3),) * 2) <= epsilon


@st.composite
def neighbours(draw: st.DrawFn) -> tuple[Walks, Ladders, Ladders, tuple[Fraction, ...]]:
    """Walks and two neighbouring ladders of 3-6 rungs per walk, with thresholds."""
    sensitivity = draw(st.sampled_from((1, 2)))
    share = draw(st.sampled_from(SHARES))
    walks = Walks(
        draw(st.sampled_from(EPSILONS)), draw(st.sampled_from((1, 2))), sensitivity, share
    )
    sign = draw(st.sampled_from((1, -1)))
    d, d2, thresholds = [], [], []
    for _ in range(walks.count):
        length = draw(st.integers(3, 6))
        counts = st.lists(st.integers(0, 10), min_size=length, max_size=length)
        ladder = tuple(sorted(draw(counts), reverse=True))
        steps = st.lists(st.integers(0, sensitivity), min_size=length, max_size=length)
        d.append(ladder)
        d2.append(move(ladder, draw(steps), sign))
        thresholds.append(Fraction(draw(st.integers(0, 24)), draw(st.sampled_from((1, 2, 3)))))
    return walks, tuple(d), tuple(d2), tuple(thresholds)


@settings(max_examples=examples(30))
@given(neighbours())
def test_random_neighbour_pairs_within_epsilon(
    case: tuple[Walks, Ladders, Ladders, tuple[Fraction, ...]],
) -> None:
    walks, d, d2, thresholds = case
    for ladder, other in zip(d, d2, strict=True):  # neighbours: a one-directional move by at most Δ
        assert list(other) == sorted(other, reverse=True) and min(other) >= 0
        moves = [b - a for a, b in zip(ladder, other, strict=True)]
        assert all(0 <= m <= walks.sensitivity for m in moves) or all(
            -walks.sensitivity <= m <= 0 for m in moves
        )
    assert pair_loss(walks, d, d2, thresholds) <= walks.epsilon  # Lyu, Su, Li 2017, Thm 4


# --- the sampler against the exact distribution -------------------------------------------------

SAMPLER_CASE = (
    Walks(Fraction(1), 2, 1),
    ((6, 4, 3, 1), (5, 5, 2, 0)),
    (Fraction(3), Fraction(5, 2)),
)


def test_exact_distribution_matches_the_sampler() -> None:
    walks, ladders, thresholds = SAMPLER_CASE
    probs, slack = exact(walks.threshold_scale, walks.query_scale, ladders, thresholds)
    assert abs(sum(probs.values()) + slack - 1) < Decimal("1e-30")
    draws = 20_000
    seen = Counter(tuple(above_threshold(walks, ladders, thresholds)) for _ in range(draws))
    assert set(seen) <= set(probs)
    expected = [draws * float(probs[o]) for o in probs]
    assert min(expected) >= 5  # validity of the chi-square approximation
    observed = [seen[o] for o in probs]
    statistic = sum((k - e) ** 2 / e for k, e in zip(observed, expected, strict=True))
    assert float(stats.chi2.sf(statistic, len(probs) - 1)) >= ALPHA
    assert (
        sum(abs(k / draws - float(probs[o])) for k, o in zip(observed, probs, strict=True)) / 2
        < 0.03
    )
    # The walks share ρ: independent threshold noise per walk would be 0.15 away in TV.
    one = [
        exact(walks.threshold_scale, walks.query_scale, (lad,), (t,))[0]
        for lad, t in zip(ladders, thresholds, strict=True)
    ]
    apart = sum(abs(probs[o] - one[0][o[:1]] * one[1][o[1:]]) for o in probs) / 2
    assert apart > Decimal("0.1")


# --- black-box audit of the real sampler --------------------------------------------------------

AUDIT_RUNS = 100_000 if LONG else 10_000
AUDIT_PAIR = (((4, 4, 4, 4),), ((5, 5, 4, 4),), (Fraction(4),))


def _lower(k: int, n: int, a: float) -> float:
    return 0.0 if k == 0 else float(stats.beta.ppf(a, k, n - k + 1))


def _upper(k: int, n: int, a: float) -> float:
    return 1.0 if k == n else float(stats.beta.ppf(1 - a, k + 1, n - k))


def measured_epsilon(walks: Walks, runs: int) -> float:
    """max over outputs o and both orders of ln(CP lower bound of P_D(o) / CP upper bound of
    P_D'(o)), each bound at level ALPHA / (2 · comparisons): an ε that the mechanism exceeds
    with confidence 1 - ALPHA (Bonferroni over outputs and orders)."""
    d, d2, thresholds = AUDIT_PAIR
    first = Counter(tuple(above_threshold(walks, d, thresholds)) for _ in range(runs))
    second = Counter(tuple(above_threshold(walks, d2, thresholds)) for _ in range(runs))
    outputs = [(i,) for i in range(len(d[0]))]
    a = ALPHA / (2 * 2 * len(outputs))
    bounds = [
        math.log(max(_lower(x[o], runs, a), 1e-300) / _upper(y[o], runs, a))
        for x, y in ((first, second), (second, first))
        for o in outputs
    ]
    return max(bounds)


@pytest.mark.statistical
@pytest.mark.parametrize("share", SHARES)
@pytest.mark.parametrize("epsilon", EPSILONS)
def test_audit_never_exceeds_the_charged_epsilon(epsilon: Fraction, share: Fraction) -> None:
    assert measured_epsilon(Walks(epsilon, 1, 1, share), AUDIT_RUNS) <= epsilon


@pytest.mark.statistical
def test_audit_flags_halved_query_noise() -> None:
    # Exact loss of this pair at half the query scale: 3.03 at ε = 2; the audit sees > 2.
    assert measured_epsilon(HalvedQueryNoise(Fraction(2), 1, 1), AUDIT_RUNS) > 2
