"""The sparse vector technique over ladders of counts: where a count first falls to a threshold.

Each *walk* is a sequence of integer counts ``above[0] >= above[1] >= ...`` (how many units lie
beyond each rung of a fixed ladder), and its answer is the first rung ``i`` at which the noisy
count is at most the noisy threshold: ``-above[i] + nu_i >= -threshold + rho``. Several walks
share one threshold noise ``rho`` and each stops at its first positive answer: this is
AboveThreshold with ``c`` positive answers (Lyu, Su and Li, "Understanding the Sparse Vector
Technique for Differential Privacy", VLDB 2017, Algorithm 1), over queries that one unit moves
by at most ``sensitivity`` and all in one direction (adding a unit never lowers a count, removing
one never raises it): *monotone* queries, for which query noise of scale ``c·Δ/ε2`` suffices
(their Theorem 4 and section 3.4) beside threshold noise of scale ``Δ/ε1``, for ``ε1 + ε2``-DP
in all. The split ``ε1 : ε2 = 2 : 3`` is the rational nearest their optimum ``1 : c^(2/3)`` for
two walks, and fine for one; a walk may state its own (``Walks.threshold_share``: the walks aimed
at a bias-noise trade-off give the threshold 3/5, ``dpsql.plan.auto``), any split being
``ε1 + ε2``-DP.

The noise is the exact discrete Laplace (``dpsql.noise.laplace``): the proof shifts the
threshold noise by Δ and the stopping query's noise by at most Δ, integers both, and a discrete
Laplace of scale t has ``P(Z = z) <= exp(s/t) P(Z = z + s)`` and the same ratio of tails, exactly
as the continuous one (Canonne, Kamath and Steinke 2020, section 2). Every query's noise is drawn
before the walk, whether it is read or not, so the number of draws depends on the ladder only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from dpsql.errors import InternalError
from dpsql.noise.laplace import discrete_laplace

THRESHOLD_SHARE = Fraction(2, 5)  # of the walks' epsilon, to the threshold noise (ε1)


@dataclass(frozen=True)
class Walks:
    """The public parameters of ``count`` walks at total ``epsilon``: the noise scales."""

    epsilon: Fraction
    count: int
    sensitivity: int = 1
    threshold_share: Fraction = THRESHOLD_SHARE  # ε1/ε, in (0, 1)

    @property
    def threshold_scale(self) -> Fraction:
        """Δ/ε1."""
        return self.sensitivity / (self.epsilon * self.threshold_share)

    @property
    def query_scale(self) -> Fraction:
        """c·Δ/ε2 (monotone queries)."""
        return self.count * self.sensitivity / (self.epsilon * (1 - self.threshold_share))

    def describe(self) -> str:
        return (
            f"sparse vector, {self.count} walk(s), threshold noise scale "
            f"{float(self.threshold_scale):.4g}, query noise scale {float(self.query_scale):.4g}"
        )


def tail(scale: Fraction, probability: float) -> int:
    """The least integer m >= 0 with P(Z > m) <= ``probability`` for Z discrete Laplace of
    ``scale``: P(Z > m) = p^(m+1)/(1 + p), p = exp(-1/scale)."""
    p = math.exp(-1 / float(scale))
    return max(math.ceil(math.log(probability * (1 + p)) / math.log(p) * (1 + 1e-12)) - 1, 0)


def overrun(walks: Walks, rungs: int, beta: float) -> int:
    """t such that, with probability at least 1 − ``beta``, every walk stops at a rung with at
    most its threshold + t units beyond it: a walk stops where count <= threshold + ν_i − ρ, so
    t bounds max_i ν_i (a union over the ``rungs`` of every walk) plus −ρ, at ``beta``/2 each.
    Public numbers only."""
    return tail(walks.query_scale, beta / 2 / (rungs * walks.count)) + tail(
        walks.threshold_scale, beta / 2
    )


def beyond_each(histogram: Sequence[int]) -> list[int]:
    """From how many units sit at each rung, how many lie beyond each (a walk's counts)."""
    left, out = sum(histogram), []
    for n in histogram:
        left -= n
        out.append(left)
    return out


def above_threshold(
    walks: Walks, counts: Sequence[Sequence[int]], thresholds: Sequence[Fraction]
) -> list[int]:
    """The stopping rung of each walk (the last rung when a walk never stops).

    ``counts[w][i]``: units beyond rung i of walk w (non-increasing in i); ``thresholds[w]``:
    the public (or earlier released) count each walk stops at, up to the noise."""
    if (
        len(counts) != walks.count
        or len(thresholds) != walks.count
        or walks.epsilon <= 0
        or not 0 < walks.threshold_share < 1
    ):
        raise InternalError("the sparse vector's walks do not match its parameters")
    rho = int(discrete_laplace(walks.threshold_scale, 1)[0])
    # All of them drawn now, read or not: the draws do not depend on where a walk stops.
    noise = [discrete_laplace(walks.query_scale, len(c)) for c in counts]
    stops = []
    for above, nu, threshold in zip(counts, noise, thresholds, strict=True):
        stop = len(above) - 1
        for i, count in enumerate(above):
            if -count + int(nu[i]) >= -threshold + rho:
                stop = i
                break
        stops.append(stop)
    return stops
