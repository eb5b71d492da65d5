"""Bounded range (dpsql.accounting.theorems.ranged): DDR 2020 Theorem 3 and the bounded-range PLD.

The references share no code with the module: Theorem 3 is transcribed again in mpmath at 50
digits (every outcome count summed, no window); the optimum itself is checked by brute force
over heterogeneous t-vectors of the worst-case pairs RR_t and over actual exponential mechanisms,
every outcome of the composition enumerated; the PLD is read with dp_accounting's own code; and
the quantile dpsql plans is checked to be bounded-range with its event's epsilon, exactly.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable
from fractions import Fraction

import mpmath
import numpy as np
import numpy.typing as npt
import pytest
from conftest import examples
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpsql.accounting.theorems.optimal import OptimalAccountant, kov_epsilon, murtagh_vadhan
from dpsql.accounting.theorems.pld import PldAccountant
from dpsql.accounting.theorems.pld_grid import randomized_response_pld
from dpsql.accounting.theorems.ranged import (
    bounded_range_masses,
    br_delta,
    br_epsilon,
    envelope_delta,
    rr_t_probability,
)
from dpsql.accounting.theorems.zcdp import ZcdpAccountant
from dpsql.mechanisms.quantile_score import quantile_scores, score_sensitivity
from dpsql.mechanisms.selection_events import Exponential
from dpsql.mechanisms.stated_events import PureDP
from dpsql.noise import measure as release
from dpsql.noise.exponential import exponential_probabilities
from dpsql.policy import Policy
from dpsql.session.session import Session

Floats = npt.NDArray[np.float64]


# --- independent references ------------------------------------------------------------------


def theorem_3_mpmath(eps: float, k: int, eps_g: float) -> float:
    """DDR 2020 Theorem 3 as stated: max over l of the full sum at t*_l, clipped to [0, 1]."""
    mpmath.mp.dps = 50
    e, g = mpmath.mpf(eps), mpmath.mpf(eps_g)
    best = mpmath.mpf(0)
    for ell in range(k + 1):
        t = min(mpmath.mpf(1), (g / e + ell + 1) / (k + 1))
        p = (mpmath.exp(e) - mpmath.exp(t * e)) / (mpmath.exp(e) - 1)
        total = mpmath.mpf(0)
        for i in range(k + 1):  # i outcomes of loss t eps, k - i of loss (t - 1) eps
            loss = i * t * e + (k - i) * (t - 1) * e
            if loss > g:
                mass = mpmath.binomial(k, i) * p**i * (1 - p) ** (k - i)
                total += mass * (1 - mpmath.exp(g - loss))
        best = max(best, total)
    return float(best)


def product_delta(eps: float, ts: Floats, eps_g: float) -> Floats:
    """delta(eps_g) of RR_{t_1} x ... x RR_{t_k} for each row of ``ts``: all 2^k outcomes."""
    n, k = ts.shape
    p = np.exp(ts * eps) * np.expm1((1 - ts) * eps) / math.expm1(eps)
    total = np.zeros(n)
    for bits in itertools.product([False, True], repeat=k):
        high = np.array(bits)[None, :]
        prob = np.prod(np.where(high, p, 1 - p), axis=1)
        loss = np.sum(np.where(high, ts * eps, (ts - 1) * eps), axis=1)
        total += prob * np.clip(-np.expm1(eps_g - loss), 0, None)
    return total


def em_pair(scores: list[int], shift: list[int], gamma: float) -> tuple[Floats, Floats]:
    """An exponential mechanism's output distributions on x and x' (scores moved by ``shift``)."""
    p = np.exp(-gamma * np.array(scores, dtype=np.float64))
    q = np.exp(-gamma * (np.array(scores, dtype=np.float64) + np.array(shift)))
    return p / p.sum(), q / q.sum()


def composed_delta(pairs: list[tuple[Floats, Floats]], eps_g: float) -> float:
    """delta(eps_g) of the product of the pairs: every joint outcome enumerated."""
    p, q = np.ones(1), np.ones(1)
    for a, b in pairs:
        p, q = np.outer(p, a).ravel(), np.outer(q, b).ravel()
    return float(np.clip(p - math.exp(eps_g) * q, 0, None).sum())


# --- DDR Theorem 3 ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("eps", "k", "eps_g"),
    [
        (0.1, 100, 2.0),
        (0.1, 100, 0.0),
        (0.1, 100, 9.5),
        (0.5, 10, 1.3),
        (1.0, 3, 0.4),
        (2.0, 5, 3.0),
        (3.0, 7, 1.0),
        (0.01, 40, 0.05),
    ],
)
def test_theorem_3_matches_mpmath(eps: float, k: int, eps_g: float) -> None:
    exact = theorem_3_mpmath(eps, k, eps_g)
    got = br_delta(eps, k, eps_g)
    assert got >= exact  # rounded up
    assert got <= exact * (1 + 1e-9) + 1e-300


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("eps", [0.3, 1.0, 2.0])
@pytest.mark.parametrize("frac", [0.0, 0.2, 0.5])
def test_brute_force_over_heterogeneous_worst_case_pairs(k: int, eps: float, frac: float) -> None:
    """Every eps-BR pair is a post-processing of some RR_t (DDR section 4), so the optimum is
    the sup over t-vectors: no vector on a grid exceeds Theorem 3, and common t reach it."""
    eps_g = frac * k * eps
    formula = br_delta(eps, k, eps_g)
    grid = np.linspace(0, 1, 41)
    vectors = np.array(list(itertools.product(grid, repeat=k)))
    assert product_delta(eps, vectors, eps_g).max() <= formula
    common = np.repeat(np.linspace(0, 1, 20_001)[:, None], k, axis=1)
    assert product_delta(eps, common, eps_g).max() == pytest.approx(formula, rel=1e-7)


@settings(max_examples=examples(60), deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(0, 6), min_size=2, max_size=4),
            st.lists(st.integers(-2, 2), min_size=4, max_size=4),
        ),
        min_size=1,
        max_size=3,
    ),
    st.sampled_from([0.2, 0.7, 1.5]),
    st.floats(0.0, 1.0),
)
def test_actual_exponential_mechanisms_never_exceed_theorem_3(
    mechanisms: list[tuple[list[int], list[int]]], eps: float, frac: float
) -> None:
    """Exponential mechanisms with weights exp(-gamma s), scores moved by at most 2 and
    gamma = eps/4 (eps-BR, McSherry-Talwar's calibration): their composition, enumerated,
    stays within Theorem 3, within the composed bounded-range PLD, and one by one within the
    envelope."""
    pairs = [em_pair(s, shift[: len(s)], eps / 4) for s, shift in mechanisms]
    k = len(pairs)
    eps_g = frac * k * eps
    actual = composed_delta(pairs, eps_g)
    assert actual <= br_delta(eps, k, eps_g) + 1e-12
    pld = PldAccountant().state([Exponential(Fraction(eps))] * k)
    assert actual <= pld.delta(eps_g) + 1e-12
    for pair in pairs:
        assert composed_delta([pair], frac * eps) <= envelope_delta(eps, frac * eps) + 1e-12


def test_pinned_figures() -> None:
    """100 x EM(0.1) at delta 1e-6: Theorem 3 gives 2.246 (pure-epsilon KOV: 4.77)."""
    optimal = br_epsilon(0.1, 100, 1e-6)
    assert optimal == pytest.approx(2.2460262124588, rel=1e-11)
    assert br_delta(0.1, 100, optimal) <= 1e-6 < br_delta(0.1, 100, optimal * (1 - 1e-11))
    assert kov_epsilon(0.1, 100, 1e-6) == pytest.approx(4.7745675881, rel=1e-9)
    assert br_epsilon(0.01, 1000, 1e-6) == pytest.approx(0.6479538282059, rel=1e-11)
    assert br_epsilon(1.0, 10, 1e-5) == pytest.approx(theorem_3_inverse(1.0, 10, 1e-5), rel=1e-9)


def theorem_3_inverse(eps: float, k: int, delta: float) -> float:
    lo, hi = 0.0, k * eps
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if theorem_3_mpmath(eps, k, mid) <= delta else (mid, hi)
    return hi


@settings(max_examples=examples(40), suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from([0.01, 0.05, 0.1, 0.3, 1.0, 2.0]),
    st.integers(1, 300),
    st.sampled_from([1e-9, 1e-6, 1e-3]),
)
def test_between_the_half_epsilon_instance_and_pure_dp(eps: float, k: int, delta: float) -> None:
    """RR_{1/2} is randomized response at eps/2, one eps-BR pair: the optimum is at least its
    KOV figure. eps-BR implies eps-DP, and eps^2/8-zCDP: at most KOV at eps and the zCDP bound
    (Bun, Steinke 2016, Prop. 1.3)."""
    value = br_epsilon(eps, k, delta)
    assert br_delta(eps, k, value) <= delta
    assert value == 0 or br_delta(eps, k, value * (1 - 1e-9)) > delta
    assert value >= kov_epsilon(eps / 2, k, delta) * (1 - 1e-9)
    assert value <= kov_epsilon(eps, k, delta) * (1 + 1e-9)
    rho = k * eps * eps / 8
    assert value <= rho + 2 * math.sqrt(rho * math.log(1 / delta))


def test_edges() -> None:
    assert br_delta(0.1, 0, 0.0) == 0.0
    assert br_delta(0.0, 10, 0.0) == 0.0
    assert br_delta(0.1, 10, -0.5) == 1.0  # a trivial bound below zero
    assert br_delta(0.1, 10, 1.0) == 0.0  # no loss exceeds k eps
    assert br_epsilon(0.1, 10, 0.0) == pytest.approx(1.0)  # delta 0: the basic sum
    assert br_epsilon(0.1, 10, 1.0) == 0.0
    with pytest.raises(Exception, match="k >= 0"):
        br_delta(0.1, -1, 0.0)


# --- the bounded-range PLD -------------------------------------------------------------------


@pytest.mark.parametrize("eps", [0.05, 0.4, 1.0, 3.0])
def test_envelope_is_the_worst_single_bounded_range_pair(eps: float) -> None:
    ts = np.linspace(0, 1, 40_001)[:, None]
    for e in np.linspace(0, eps, 9):
        worst = product_delta(eps, ts, float(e)).max()
        assert worst <= envelope_delta(eps, float(e)) * (1 + 1e-12)
        assert worst == pytest.approx(envelope_delta(eps, float(e)), rel=1e-7, abs=1e-15)
    p, q = rr_t_probability(eps, 0.5)  # t = 1/2 is randomized response at eps/2
    assert p == pytest.approx(1 / (1 + math.exp(-eps / 2)), rel=1e-14)
    assert q == pytest.approx(1 - p, rel=1e-12)


@pytest.mark.parametrize(("eps", "interval"), [(0.1, 1e-3), (0.1, 0.03), (1.0, 1e-3), (3.0, 0.1)])
def test_bounded_range_pld_dominates_the_envelope(eps: float, interval: float) -> None:
    masses, infinity = bounded_range_masses(eps, interval)
    assert 1 <= math.fsum(masses.values()) + infinity <= 1 + 1e-11
    pld = pld_lib.PrivacyLossDistribution.create_from_rounded_probability(
        masses, infinity, interval, pessimistic_estimate=True
    )
    for e in np.linspace(0, 1.2 * eps, 50):
        assert pld.get_delta_for_epsilon(float(e)) >= envelope_delta(eps, float(e))
    # connect the dots keeps the hockey stick at every grid point
    for j in range(0, math.floor(eps / interval)):
        e = j * interval
        assert pld.get_delta_for_epsilon(e) == pytest.approx(envelope_delta(eps, e), rel=1e-9)


def test_pld_reads_exponential_events_as_bounded_range() -> None:
    """100 x EM(0.1) at 1e-6: 2.612 (it was the pure-epsilon 4.77): above Theorem 3's 2.246,
    since one pair dominating every eps-BR mechanism pays for every t at each step."""
    history = [Exponential(Fraction(1, 10))] * 100
    figure = PldAccountant().epsilon(history, 1e-6)
    assert figure == pytest.approx(2.611847996, rel=1e-8)
    assert figure >= br_epsilon(0.1, 100, 1e-6)
    pure = randomized_response_pld(0.1, 0.0, 1e-3).self_compose(100)
    assert pure.get_epsilon_for_delta(1e-6) == pytest.approx(4.7745675881, rel=1e-6)


@settings(max_examples=examples(25), suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([0.02, 0.1, 0.5, 1.0]), st.integers(1, 200), st.sampled_from([1e-8, 1e-5]))
def test_pld_is_never_below_the_exact_optimum(eps: float, k: int, delta: float) -> None:
    history = [Exponential(Fraction(eps))] * k
    figure = PldAccountant().epsilon(history, delta)
    assert figure >= br_epsilon(eps, k, delta)
    assert figure <= kov_epsilon(eps, k, delta) + 2e-3  # never worse than pure eps (a grid step)


# --- the optimal accountant --------------------------------------------------------------------


def test_optimal_reads_identical_exponential_mechanisms_by_theorem_3() -> None:
    """100 x EM(0.1) at 1e-6: 2.246 (it was the pure-epsilon 4.77; zCDP reads 2.42)."""
    acc = OptimalAccountant()
    history = [Exponential(Fraction(1, 10))] * 100
    bracket = acc.bracket(history, 1e-6)
    assert bracket.error == 0
    assert bracket.epsilon == pytest.approx(2.2460262124588, rel=1e-11)
    assert bracket.epsilon == pytest.approx(br_epsilon(0.1, 100, 1e-6), rel=2e-12)
    assert acc.delta(history, bracket.epsilon) == br_delta(0.1, 100, bracket.epsilon) <= 1e-6
    assert ZcdpAccountant().epsilon(history, 1e-6) == pytest.approx(2.4190931769, rel=1e-9)
    assert acc.epsilon(history[:1], 1e-6) <= 0.1  # one mechanism: never above its epsilon


def test_optimal_brackets_a_mixed_history() -> None:
    """Exponential mechanisms beside pure ones: MV over eps-DP (a class holding eps-BR), or the
    exponential group by Theorem 3 in sequence with MV over the rest, from above; MV over RR at
    eps/2 (an eps-BR pair), or the group alone, from below."""
    ems = [Exponential(Fraction(1, 10))] * 100
    alone = br_epsilon(0.1, 100, 1e-6)
    bracket = OptimalAccountant().bracket([*ems, PureDP(Fraction(1, 100))], 1e-6)
    assert bracket.epsilon == pytest.approx(2.2605181818616, rel=1e-9)  # pure eps: 4.78
    assert alone < bracket.epsilon < alone + 0.0146  # at most the basic sum of the rest, and a bit
    assert bracket.lower == pytest.approx(alone, rel=1e-8)
    bracket = OptimalAccountant().bracket([*ems, *[PureDP(Fraction(1, 10))] * 3], 1e-6)
    assert bracket.epsilon == pytest.approx(2.5505179765377, rel=1e-9)
    below = murtagh_vadhan([(Fraction(1, 20), 100), (Fraction(1, 10), 3)], 1e-6)
    assert bracket.lower == pytest.approx(below.lower, rel=1e-11)  # above the group alone here
    assert kov_epsilon(0.05, 100, 1e-6) * (1 - 1e-9) <= bracket.lower <= bracket.epsilon
    # a group below half of the sum of eps^2 is not composed apart: MV over pure eps
    bracket = OptimalAccountant().bracket([*ems, *[PureDP(Fraction(1, 10))] * 101], 1e-6)
    assert bracket.epsilon == pytest.approx(kov_epsilon(0.1, 201, 1e-6), rel=1e-9)
    mixed = [Exponential(Fraction(1, 10))] * 50 + [Exponential(Fraction(1, 5))] * 20
    bracket = OptimalAccountant().bracket(mixed, 1e-6)  # heterogeneous bounded range
    pure = murtagh_vadhan([(Fraction(1, 10), 50), (Fraction(1, 5), 20)], 1e-6)
    assert br_epsilon(0.2, 20, 1e-6) <= bracket.lower <= bracket.epsilon <= pure.epsilon


@pytest.mark.parametrize("eps_pure", [0.5, 1.0])
def test_mixed_bracket_holds_the_brute_force_optimum(eps_pure: float) -> None:
    """Two EM(1) and one pure eps: the worst t-vectors of a grid (the optimum's lower estimate)
    exceed delta at the bracket's lower end and stay within it at its upper end."""
    history = [Exponential(Fraction(1))] * 2 + [PureDP(Fraction(eps_pure))]
    delta = 1e-3
    bracket = OptimalAccountant().bracket(history, delta)
    grid = np.linspace(0, 1, 201)
    ts = np.array(list(itertools.product(grid, repeat=2)))

    def worst(eps_g: float) -> float:
        # the pure part's worst case is randomized response (KOV 2015), loss +-eps_pure; the
        # same t-vector for both of its outcomes (fixed in advance)
        total = np.zeros(len(ts))
        for loss in (eps_pure, -eps_pure):
            total += product_delta(1.0, ts, eps_g - loss) / (1 + math.exp(-loss))
        return float(total.max())

    assert worst(bracket.lower * (1 - 1e-6)) > delta
    assert worst(bracket.epsilon) <= delta


# --- what dpsql samples: the quantile's bounded range ----------------------------------------


def _log_ratio_width(scores: list[int], moved: list[int], gamma: Fraction) -> Fraction:
    """max_y - min_y of ln(P_x(y)/P_x'(y)) for weights exp(-gamma s): the normalisers cancel,
    so it is gamma (max d - min d), d = s' - s, exactly."""
    d = [b - a for a, b in zip(scores, moved, strict=True)]
    return gamma * (max(d) - min(d))


@pytest.mark.parametrize(
    ("sql", "p"),
    [
        ("SELECT QUANTILE(spend, 0.5) FROM visits", Fraction(1, 2)),
        ("SELECT region, QUANTILE(spend, 0.25) FROM visits GROUP BY region", Fraction(1, 4)),
    ],
)
def test_the_quantile_event_epsilon_is_its_bounded_range(
    tiny_policy: Callable[..., Policy], sql: str, p: Fraction, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The release draws with weights exp(-score/(2 scale)) (``noise.release``); one unit's C rows
    move each group's scores by at most D = C score_sensitivity(p), so the log ratio spans at
    most D/scale per group, and the unit's L0 groups add: the event's epsilon. The width is
    attained (the score is not monotone), so no smaller bounded-range parameter holds."""
    c = 3
    session = Session(tiny_policy([(1, "east", 30, 10.0)], max_groups=2, max_rows=c))
    try:
        plan = session.plan(sql)
    finally:
        session.close()
    # The quantile itself (its interval's two ends are the same mechanism, at their own scale).
    m, *ends = [x for x in plan.measurements if x.exponential]
    event, *end_events = [e for e in plan.event.events if isinstance(e, Exponential)]
    assert [x.spec.side for x in ends] == [-1, 1] and len(end_events) == 2
    assert all(e.epsilon == x.sensitivity / x.scale for e, x in zip(end_events, ends, strict=True))
    assert m.scale is not None and m.grid is not None
    drawn: list[Fraction] = []
    monkeypatch.setattr(release, "exponential_mechanism", lambda s, g: drawn.append(g) or 0)
    release._quantiles([{}], m)  # the gamma the release samples with
    (gamma,) = drawn
    assert gamma == 1 / (2 * m.scale)
    assert m.per_group == c * score_sensitivity(p)
    assert event.epsilon == m.sensitivity / m.scale == m.groups * m.per_group / m.scale
    lower, upper = m.grid.lower, m.grid.upper
    rng = random.Random(15)
    widest = Fraction(0)
    for _ in range(300):
        base = {rng.randint(lower, upper): rng.randint(0, 6) for _ in range(rng.randint(0, 5))}
        moved = dict(base)
        for _ in range(rng.randint(1, c)):  # one unit adds up to C rows to the group
            key = rng.choice([lower, upper, rng.randint(lower, upper)])
            moved[key] = moved.get(key, 0) + 1
        scores = quantile_scores(base, lower, upper, p)
        width = _log_ratio_width(scores, quantile_scores(moved, lower, upper, p), gamma)
        assert width <= m.per_group / m.scale
        widest = max(widest, width)
    assert widest == m.per_group / m.scale
    # the sampled distribution itself: its log ratios span that width
    base = {lower + 300: 4, lower + 700: 4}
    moved = {**base, lower: c}
    scores = quantile_scores(base, lower, upper, p)
    shifted = quantile_scores(moved, lower, upper, p)
    before = exponential_probabilities(scores, gamma)
    after = exponential_probabilities(shifted, gamma)
    logs = [math.log(a / b) for a, b in zip(before, after, strict=True)]
    width = _log_ratio_width(scores, shifted, gamma)
    assert max(logs) - min(logs) == pytest.approx(float(width), rel=1e-9)
    assert width >= m.per_group / m.scale * Fraction(9, 10)
