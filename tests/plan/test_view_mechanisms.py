"""The view mechanisms' arithmetic (``dpsql.plan.views``) and their statistical audits.

- The square-root coefficients square to the prefix sums; the tree's nodes lie inside the
  horizon, each period in at most L of them.
- Consistency: every range's estimate is the sum of its periods' (parts sum to wholes).
- Coverage: over many draws of the real samplers, each range's ± covers the truth at least at
  its confidence (a one-sided binomial test at 1e-4).
- Privacy: the tree's and the factorization's released vectors for neighbouring totals (one
  person-period more) are no more distinguishable than the reserved loss allows: a threshold
  test on the optimal linear statistic, with a Clopper-Pearson bound, never certifies an
  epsilon above the plan's.
- ``BREAKEVEN`` is what ``breakeven`` computes.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from conftest import examples
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import beta, binomtest

from dpsql.mechanisms.conversions import zcdp_to_dp
from dpsql.mechanisms.events import Composite
from dpsql.mechanisms.tails import Noise
from dpsql.noise.gaussian import discrete_gaussian
from dpsql.noise.laplace import discrete_laplace
from dpsql.plan.views import (
    BREAKEVEN,
    SCALE,
    Design,
    Reading,
    breakeven,
    coefficients,
    levels,
    nodes,
)


def test_the_square_root_coefficients_square_to_the_prefix_sums() -> None:
    c = coefficients(40)
    for j in range(40):
        assert sum(c[i] * c[j - i] for i in range(j + 1)) == 1


@given(st.integers(1, 200))
def test_tree_nodes_lie_inside_the_horizon_each_period_in_at_most_l(horizon: int) -> None:
    found = nodes(horizon, "tree")
    assert all(0 <= a < b <= horizon for a, b in found)
    for p in range(horizon):
        assert 1 <= sum(1 for a, b in found if a <= p < b) <= levels(horizon)
    assert len(set(found)) == len(found)


def _reading(mechanism: str, horizon: int, noise: Noise) -> Reading:
    design = Design(mechanism, horizon, (noise,), Composite(()))  # type: ignore[arg-type]
    return Reading.of(design, nodes(horizon, mechanism))  # type: ignore[arg-type]


def _released(mechanism: str, horizon: int, x: list[int], noise: Noise) -> list[int]:
    """What the mechanism releases for exact per-period totals x, with the real samplers."""
    if mechanism == "factorization":
        c = coefficients(horizon)
        exact = [sum((c[t - j] * x[j] for j in range(t + 1)), Fraction(0)) for t in range(horizon)]
        base = [int((SCALE * v + Fraction(1, 2)) // 1) for v in exact]
    else:
        base = [sum(x[a:b]) for a, b in nodes(horizon, mechanism)]  # type: ignore[arg-type]
    draws = (discrete_laplace(noise.scale, len(base)) if noise.scale is not None
             else discrete_gaussian(noise.sigma2, len(base)))  # type: ignore[arg-type]  # fmt: skip
    return [v + int(z) for v, z in zip(base, draws, strict=True)]


CASES = [
    ("plain", 5, Noise(scale=Fraction(4))),
    ("tree", 6, Noise(scale=Fraction(9))),
    ("tree", 8, Noise(sigma2=Fraction(40))),
    ("factorization", 7, Noise(sigma2=Fraction(4000))),
]


@pytest.mark.parametrize(("mechanism", "horizon", "noise"), CASES)
def test_parts_sum_to_wholes(mechanism: str, horizon: int, noise: Noise) -> None:
    reading = _reading(mechanism, horizon, noise)
    x = [50, 7, 0, 120, 3, 9, 40, 11][:horizon]
    values = _released(mechanism, horizon, x, noise)
    for a in range(horizon):
        for b in range(a + 1, horizon + 1):
            whole = reading.estimate(values, a, b, noise, 0.9)[0]
            parts = sum(reading.estimate(values, p, p + 1, noise, 0.9)[0] for p in range(a, b))
            assert whole == parts


@pytest.mark.parametrize(("mechanism", "horizon", "noise"), CASES)
def test_each_ranges_half_width_covers_the_truth(
    mechanism: str, horizon: int, noise: Noise
) -> None:
    reading = _reading(mechanism, horizon, noise)
    rng = np.random.default_rng(7)
    x = [int(v) for v in rng.integers(0, 500, horizon)]
    ranges = [(0, horizon), (horizon // 2, horizon), (1, 2)]
    widths = {r: reading.estimate([0] * len(reading.released), *r, noise, 0.9)[1] for r in ranges}
    draws = examples(300)
    missed = dict.fromkeys(ranges, 0)
    for _ in range(draws):
        values = _released(mechanism, horizon, x, noise)
        for a, b in ranges:
            value = reading.estimate(values, a, b, noise, 0.9)[0]
            if abs(float(value) - sum(x[a:b])) > widths[(a, b)]:
                missed[(a, b)] += 1
    for r, n in missed.items():
        # The ± is sound (a bound): misses at most 10%, tested one-sided.
        assert binomtest(n, draws, 0.1, alternative="greater").pvalue > 1e-4, (r, n)


def _epsilon_lower(hits_d: int, hits_dp: int, n: int, delta: float) -> float:
    """A 99.9% lower confidence bound on the epsilon a threshold test shows (Clopper-Pearson)."""
    p_hi = beta.ppf(0.9995, hits_d + 1, n - hits_d) if hits_d < n else 1.0
    q_lo = beta.ppf(0.0005, hits_dp, n - hits_dp + 1) if hits_dp > 0 else 0.0
    if q_lo - delta <= 0 or p_hi <= 0:
        return 0.0
    return math.log(max(q_lo - delta, 1e-300) / p_hi)


@pytest.mark.parametrize(
    ("mechanism", "horizon", "noise", "shift"),
    [
        ("tree", 4, Noise(scale=Fraction(3)), 1),
        ("factorization", 4, Noise(sigma2=Fraction(60000)), 1),
    ],
)
def test_neighbouring_releases_are_no_more_distinguishable_than_reserved(
    mechanism: str, horizon: int, noise: Noise, shift: int
) -> None:
    """D: totals x; D': one person-period more in period 0 (x_0 + shift). The reserved loss:
    the tree's L events of scale L·b on a shift of 1 is epsilon = shift/b·... computed from the
    noise here; the factorization's rho from its shifts. The statistic sums the released values
    that period 0 moves, weighted by how much it moves them."""
    x = [20, 30, 25, 10]
    n = examples(4000)
    if mechanism == "tree":
        touched = [i for i, (a, b) in enumerate(nodes(horizon, "tree")) if a == 0]
        weights = {i: 1.0 for i in touched}
        assert noise.scale is not None
        claimed, delta = len(touched) * shift / float(noise.scale), 0.0
    else:
        c = coefficients(horizon)
        shifts = [math.ceil(SCALE * v * shift) + 1 for v in c]
        weights = {i: float(s) for i, s in enumerate(shifts)}
        assert noise.sigma2 is not None
        rho = sum(s * s for s in shifts) / (2 * float(noise.sigma2))
        delta = 1e-3
        claimed = zcdp_to_dp(rho, delta)
    stats = {}
    for name, totals in (("d", x), ("dp", [x[0] + shift, *x[1:]])):
        values = np.array([_released(mechanism, horizon, totals, noise) for _ in range(n)])
        stats[name] = sum(w * values[:, i] for i, w in weights.items())
    for cut in np.quantile(np.concatenate([stats["d"], stats["dp"]]), [0.3, 0.5, 0.7, 0.9]):
        a = int(np.sum(stats["d"] > cut))
        b = int(np.sum(stats["dp"] > cut))
        assert _epsilon_lower(a, b, n, delta) <= claimed + 1e-9


def test_breakeven_is_the_recorded_table() -> None:
    for (mechanism, gaussian), at in BREAKEVEN.items():
        assert breakeven(mechanism, gaussian) == at  # type: ignore[arg-type]
