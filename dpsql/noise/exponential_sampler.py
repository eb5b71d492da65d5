"""The exact sampler of the exponential mechanism: validated inputs, the proposal table, rounds.

``_build_table`` and ``_sample`` draw index j with probability exactly
exp(-γ·(s_j - m)) / Σ_i exp(-γ·(s_i - m)), m = min s, for integer scores and a rational γ > 0;
the entry points are in :mod:`dpsql.noise.exponential`.

**Exact sampling.** Floating point breaks the exponential mechanism: rounded weights and a float
inverse-CDF draw give output probabilities other than the analysed ones, by amounts that depend
on the scores, and the guarantee is lost (Ilvento, "Implementing the Exponential Mechanism with
Base-2 Differential Privacy", CCS 2020). Here every decision uses integers only. Write
x_j = γ·(s_j - m) = n_j/den with den = γ's denominator. Each round makes one proposal and accepts
it with an exact Bernoulli(exp(-y)) (Canonne, Kamath and Steinke 2020, Algorithm 1 and its
extension to y > 1, in :mod:`dpsql.noise.bits`); the output is the first accepted proposal. Two
proposal schemes, both exact:

* *uniform*: j uniform on [0, K), accepted with Bernoulli(exp(-x_j)). A round outputs j with
  probability exp(-x_j)/K.
* *levels*: sort the candidates by floor(x_j) and put the one of rank r in slot
  (g, t) = (r div C, r mod C) of a table with C columns, C = max_T ceil(N_T/(T + 1)) and
  N_T = #{j : floor(x_j) <= T}. For the candidate j of rank r and T = floor(x_j),
  r + 1 <= N_T <= C·(T + 1), so g <= floor(x_j). A round draws G with
  P(G = g) = (1 - 1/e)·e^{-g} (Bernoulli(e^-1) successes before the first failure) and t
  uniform on [0, C); an empty slot (G, t) rejects, and a slot holding j accepts with
  Bernoulli(exp(-(x_j - G))), a probability since x_j - G >= 0. A round outputs j with
  probability (1 - 1/e)·e^{-g}/C · e^{-(x_j - g)} = (1 - 1/e)·exp(-x_j)/C, g = j's row.

In both schemes a round outputs j with probability c·exp(-x_j) for a constant c, independently of
the other rounds, so the first accepted round returns j with probability exactly
exp(-x_j)/Σ_i exp(-x_i). Rounds are drawn in vectorized batches; taking the first accepted
proposal in proposal order (the order never depends on drawn values) is the first accepted
round, and batch sizes only change how many rounds are drawn at once.

*Cost and timing.* With S = Σ exp(-x_j) >= 1, a round accepts with probability S/K (uniform)
or (1 - 1/e)·S/C (levels). The levels scheme is used when 2C <= K and K > 64, where it is
faster; either way the expected number of proposals is at most K/S <= K. The running time
depends on the noise and, through S and C, on the scores (so on the data): like every rejection
sampler here, it is not constant-time. Floating point is used only to size the batches (an
estimate of S), never in a decision.

Integer ranges: integers stay in int64 while below ``bits._FAST_LIMIT`` (read at call time);
beyond it the same algorithm runs with Python integers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from dpsql.errors import InternalError, ParameterError
from dpsql.mechanisms.quantile_score import INT64_LIMIT, MAX_CANDIDATES
from dpsql.noise import bits
from dpsql.noise.bits import BoolArray, IntArray

__all__ = ["Scheme"]

_MAX_BATCH = 2**17
"""Largest number of proposals drawn in one vectorized round (bounds memory per round)."""

_SMALL = 64
"""Up to this many candidates the uniform scheme is used: at most 64 expected proposals, drawn
in one batch, cost less than the levels scheme's geometric draws."""

Scheme = Literal["auto", "uniform", "levels"]


# --- input validation for the mechanism ------------------------------------------------------


def _check_gamma(gamma: object) -> Fraction:
    # Only Fraction: exactness needs γ = num/den exactly (a float γ is already rounded).
    if not isinstance(gamma, Fraction):
        raise ParameterError(f"gamma must be a fractions.Fraction, not {type(gamma).__name__}")
    if gamma <= 0:
        raise ParameterError("gamma must be positive")
    return gamma


def _as_int_array(values: list[int]) -> npt.NDArray[Any]:
    """int64 when every value fits, else an object array of Python ints."""
    if all(-INT64_LIMIT <= v < INT64_LIMIT for v in values):
        return np.asarray(values, dtype=np.int64)
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _check_scores(scores: object) -> npt.NDArray[Any]:
    """A 1-D array of integer scores: int64, or object (Python ints) when some do not fit."""
    if isinstance(scores, np.ndarray):
        array = scores
    elif isinstance(scores, Sequence) and not isinstance(scores, str | bytes):
        values = scores if isinstance(scores, list) else list(scores)
        types = set(map(type, values))  # one pass in C: K can be 2**21
        if not all(issubclass(t, int | np.integer) and t is not bool for t in types):
            raise ParameterError("the scores must be integers")
        try:
            array = np.asarray(values, dtype=np.int64)
        except OverflowError:  # some score is beyond int64: Python integers
            array = _as_int_array([int(v) for v in values])
    else:
        raise ParameterError(f"the scores must be a sequence of ints, not {type(scores).__name__}")
    if array.ndim != 1:
        raise ParameterError("the scores must be one-dimensional")
    if array.size == 0:
        raise ParameterError("the scores must not be empty: there is nothing to select")
    if array.size > MAX_CANDIDATES:
        raise ParameterError(f"the exponential mechanism takes at most {MAX_CANDIDATES} scores")
    kind = array.dtype.kind
    if kind == "i":
        return array.astype(np.int64, copy=False)
    if kind in {"u", "O"}:
        values = array.tolist()
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise ParameterError("the scores must be integers")
        return _as_int_array(values)
    raise ParameterError(f"the scores must be integers, not {array.dtype}")


# --- the proposal table ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Table:
    """Everything a round needs: candidate j has x_j = whole[j] + rest[j]/den, and slot
    g·width + t (g < levels, t < width) holds candidate order[g·width + t] when that is < K."""

    whole: npt.NDArray[Any]  # floor(x_j): int64, or object when some do not fit
    rest: npt.NDArray[Any]  # x_j·den - whole·den in [0, den): int64, or object
    den: int
    geometric: bool  # levels scheme (G drawn) or uniform scheme (G = 0)
    width: int
    levels: int
    order: IntArray
    rate: float  # approximate acceptance probability per proposal; sizes batches only


def _exponents(d: npt.NDArray[Any], gamma: Fraction) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    """floor(γ·d) and (γ·d·den) mod den for d >= 0, in int64 while γ.numerator·max(d) and den
    stay below ``bits._FAST_LIMIT``, else with Python integers."""
    num, den = gamma.numerator, gamma.denominator
    limit = bits._FAST_LIMIT
    if d.dtype != object and num * int(d.max()) < limit and den < limit:
        whole, rest = np.divmod(d * num, den)
        return whole, rest
    pairs = [divmod(num * int(v), den) for v in d.tolist()]
    whole_obj = np.empty(len(pairs), dtype=object)
    rest_obj = np.empty(len(pairs), dtype=object)
    whole_obj[:] = [w for w, _ in pairs]
    rest_obj[:] = [r for _, r in pairs]
    return whole_obj, rest_obj


def _weight_sum(level_counts: npt.NDArray[np.int64]) -> float:
    """Σ exp(-x_j) to within a factor e^(1/2), from the number of candidates per floor(x_j):
    floating point used only to size batches, never in a decision."""
    head = level_counts[:800].astype(np.float64)  # exp(-800) == 0.0: higher levels add nothing
    return float((head * np.exp(-np.arange(head.size) - 0.5)).sum())


def _build_table(scores: object, gamma: object, scheme: Scheme) -> _Table:
    values = _check_scores(scores)
    gamma = _check_gamma(gamma)
    size = values.size
    low, high = int(values.min()), int(values.max())
    if values.dtype != object and high - low < INT64_LIMIT:
        d = values - np.int64(low)  # no wrap-around: every difference is below 2**63
    else:
        d = np.empty(size, dtype=object)
        d[:] = [int(v) - low for v in values.tolist()]
    whole, rest = _exponents(d, gamma)
    # Levels at or beyond K only need to be >= K for the slot table (ceil(N/(T+1)) <= 1 there).
    clipped = np.minimum(whole, size).astype(np.int64)
    level_counts = np.bincount(clipped, minlength=size + 1)
    cumulative = np.cumsum(level_counts)
    t_plus_1 = np.arange(1, size + 2, dtype=np.int64)
    width = int(((cumulative + t_plus_1 - 1) // t_plus_1).max())  # C = max_T ceil(N_T/(T+1))
    # Levels proposals cost about twice as much as uniform ones: use them only where they win.
    geometric = scheme == "levels" or (scheme == "auto" and 2 * width <= size and size > _SMALL)
    weight = _weight_sum(level_counts)
    if geometric:
        order = np.argsort(clipped, kind="stable").astype(np.int64)
        levels = -(-size // width)
        rate = (1 - math.exp(-1)) * weight / width
        # The slot of rank r sits at level r // C <= floor(x_j): the acceptance exp(-(x_j - G))
        # must be a probability. Checked, not assumed (the proof is in the module docstring).
        if np.any(clipped[order] < np.arange(size, dtype=np.int64) // width):
            raise InternalError("the exponential mechanism's slot table is inconsistent")
    else:
        order = np.arange(size, dtype=np.int64)
        width, levels = size, 1
        rate = weight / size
    return _Table(whole, rest, gamma.denominator, geometric, width, levels, order, rate)


# --- one vectorized batch of rounds ----------------------------------------------------------


def _uniform(n: int, size: int) -> IntArray:
    # Values are below n <= MAX_CANDIDATES, so int64 holds them even on the big-integer path.
    return np.asarray(bits.uniform_integers(n, size), dtype=np.int64)


def _levels(size: int, cap: int) -> IntArray:
    """G = Bernoulli(e^-1) successes before the first failure, so P(G = g) = (1 - 1/e)·e^-g
    (CKS 2020, inner loop of Algorithm 2); counting stops at ``cap`` since every G >= cap lands
    on an empty slot and is rejected alike."""
    g = np.zeros(size, dtype=np.int64)
    live = np.arange(size)
    while live.size:
        success = bits._bernoulli_exp_fast(np.ones(live.size, dtype=np.int64), 1)
        live = live[success]
        g[live] += 1
        live = live[g[live] < cap]
    return g


def _bernoulli_exp_whole(whole: npt.NDArray[Any]) -> BoolArray:
    """Entry i is Bernoulli(exp(-whole[i])) for integers >= 0 (CKS 2020, Algorithm 1 with γ = 1
    repeated); int64 entries vectorized, larger ones with Python integers."""
    limit = bits._FAST_LIMIT
    if whole.dtype != object:
        return bits._bernoulli_exp_whole_fast(whole)
    small = np.fromiter((w < limit for w in whole.tolist()), dtype=np.bool_, count=whole.size)
    ok = np.empty(whole.size, dtype=np.bool_)
    ok[small] = bits._bernoulli_exp_whole_fast(whole[small].astype(np.int64))
    for i in np.flatnonzero(~small).tolist():  # exp(-1)^w: stops at the first failure
        ok[i] = bits._bernoulli_exp_rational_python(int(whole[i]), 1)
    return ok


def _bernoulli_exp_fraction(rest: npt.NDArray[Any], den: int) -> BoolArray:
    """Entry i is Bernoulli(exp(-rest[i]/den)), 0 <= rest[i] < den (CKS 2020, Algorithm 1)."""
    if rest.dtype != object and den < bits._FAST_LIMIT:
        return bits._bernoulli_exp_fast(rest, den)
    out = np.empty(rest.size, dtype=np.bool_)
    for i, r in enumerate(rest.tolist()):
        out[i] = bits._bernoulli_exp_python(int(r), den)
    return out


def _round(table: _Table, size: int) -> IntArray:
    """``size`` proposals; returns the accepted candidates in proposal order."""
    count = table.order.size
    g = _levels(size, table.levels) if table.geometric else np.zeros(size, dtype=np.int64)
    slot = g * table.width + _uniform(table.width, size)
    filled = np.flatnonzero((g < table.levels) & (slot < count))  # empty slot: reject
    candidate = table.order[slot[filled]]
    # Accept with exp(-(x_j - G)) = exp(-(whole_j - G))·exp(-rest_j/den), both exact (CKS 2020).
    accept = _bernoulli_exp_whole(table.whole[candidate] - g[filled])
    survivors = np.flatnonzero(accept)
    accept[survivors] = _bernoulli_exp_fraction(table.rest[candidate[survivors]], table.den)
    accepted: IntArray = candidate[accept]
    return accepted


def _sample(table: _Table, size: int) -> IntArray:
    """The first ``size`` accepted proposals of an i.i.d. sequence of rounds, in order: each is
    an exact exponential-mechanism draw. Batch sizes depend only on the table and on how many
    were accepted so far, never on which candidates were."""
    out = np.empty(size, dtype=np.int64)
    filled = 0
    while filled < size:
        need = size - filled
        tries = min(_MAX_BATCH, int(1.25 * need / table.rate) + 64)
        got = _round(table, tries)
        take = min(got.size, need)
        out[filled : filled + take] = got[:take]
        filled += take
    return out
