"""The exact exponential mechanism over a finite grid, and the integer quantile score.

**Mechanism.** Given integer scores s_0, ..., s_{K-1} (lower is better) and a rational γ > 0,
``exponential_mechanism`` returns index j with probability exactly
exp(-γ·(s_j - m)) / Σ_i exp(-γ·(s_i - m)), m = min s. If every score moves by at most Δ when one
row is added or removed, γ = ε/(2Δ) makes it ε-DP (McSherry and Talwar, FOCS 2007, Theorem 6);
it is also (γΔ)²/2-zCDP (Cesar and Rogers 2021, bounded range). The caller picks γ and charges it.

**Quantile score.** Candidates are the grid indices c in [lower, upper]. For p = a/b in lowest
terms and n rows, ``quantile_scores`` gives score(c) = max(b·#{x < c} - a·n, a·n - b·#{x <= c},
0): b times the distance from the target rank p·n to the ranks c spans, an integer that is 0
exactly where c is a p-quantile of the rows (a variant of OpenDP's
``make_quantile_score_candidates`` that does not penalise rows tied on c, which matters on a
coarse grid). Sensitivity sketch: adding a row moves n by one and each count by at most one, so
b·#{x < c} - a·n moves by b - a or -a, a·n - b·#{x <= c} by a - b or a; max(·, ·, 0) is
1-Lipschitz, so every score moves by at most max(a, b - a) = ``score_sensitivity(p)``.

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
beyond it the same algorithm runs with Python integers. ``exponential_probabilities`` computes
the target distribution with 60-digit decimals for tests and docs; it is never used to sample.
"""

from __future__ import annotations

import decimal
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from dpsql.errors import InternalError, ParameterError
from dpsql.noise import bits
from dpsql.noise.bits import BoolArray, IntArray, _check_count, _check_int

__all__ = [
    "MAX_CANDIDATES",
    "exponential_mechanism",
    "exponential_mechanism_samples",
    "exponential_probabilities",
    "quantile_scores",
    "score_sensitivity",
]

MAX_CANDIDATES = 2**24
"""Largest accepted number of candidates (grid points). The sampler keeps a few int64 arrays of
this length; 2**24 is far beyond any useful quantile grid and bounds the memory used."""

_INT64_LIMIT = 2**63
"""Exclusive bound for the int64 score arithmetic (not a sampling limit)."""

_MAX_BATCH = 2**17
"""Largest number of proposals drawn in one vectorized round (bounds memory per round)."""

_SMALL = 64
"""Up to this many candidates the uniform scheme is used: at most 64 expected proposals, drawn
in one batch, cost less than the levels scheme's geometric draws."""

_DECIMAL = decimal.Context(prec=60, Emin=-999_999_999, Emax=999_999_999)
"""60 digits for ``exponential_probabilities``: far below any statistical test's resolution."""

Scheme = Literal["auto", "uniform", "levels"]


# --- the quantile score ----------------------------------------------------------------------


def _check_p(p: object) -> Fraction:
    # Only Fraction: a float p would already be rounded, and the score needs p = a/b exactly.
    if not isinstance(p, Fraction):
        raise ParameterError(f"the quantile p must be a fractions.Fraction, not {type(p).__name__}")
    if not 0 <= p <= 1:
        raise ParameterError("the quantile p must be between 0 and 1")
    return p


def score_sensitivity(p: Fraction) -> int:
    """max(a, b - a) for p = a/b in lowest terms: the most any ``quantile_scores`` entry moves
    when one row is added or removed (the inner term moves by b - a or -a; |·| is 1-Lipschitz).
    """
    p = _check_p(p)
    a, b = p.numerator, p.denominator
    return max(a, b - a)


def _bin_counts(
    histogram: Mapping[int, int], lower: int, upper: int
) -> tuple[list[int], list[int]]:
    """Offsets (key - lower) and counts of the histogram, validated. Keys must already be
    clamped to [lower, upper] by the caller: a key outside is a caller bug, not a user error."""
    offsets: list[int] = []
    counts: list[int] = []
    for key, count in histogram.items():
        if isinstance(key, bool) or not isinstance(key, int | np.integer):
            raise ValueError(f"histogram keys must be ints, not {type(key).__name__}")
        if isinstance(count, bool) or not isinstance(count, int | np.integer):
            raise ValueError(f"histogram counts must be ints, not {type(count).__name__}")
        if not lower <= key <= upper:
            raise ValueError("a histogram key lies outside [lower, upper]; clamp before scoring")
        if count < 0:
            raise ValueError("histogram counts must be non-negative")
        offsets.append(int(key) - lower)
        counts.append(int(count))
    return offsets, counts


def quantile_scores(histogram: Mapping[int, int], lower: int, upper: int, p: Fraction) -> list[int]:
    """Integer quantile scores of the candidates lower, lower + 1, ..., upper (lower is better).

    ``histogram[c]`` is the number of rows on candidate c. With p = a/b in lowest terms and n
    rows, entry i (candidate c = lower + i) is b times the distance from the target rank p·n
    to the ranks c spans, [#{x < c}, #{x <= c}]:
    max(b·#{x < c} - a·n, a·n - b·#{x <= c}, 0). It is 0 exactly when c is a p-quantile of the
    rows; unlike |(1 - p)·#{x < c} - p·#{x > c}| (OpenDP's score) it is not penalised by the
    rows tied on c, which matters on a coarse grid. Adding or removing one row moves
    b·#{x < c} - a·n and a·n - b·#{x <= c} by at most max(a, b - a) each (the row moves n by
    one and each count by at most one), so each entry moves by at most ``score_sensitivity(p)``.
    Runs in O(K + len(histogram)) with prefix sums, in int64 when b·n < 2**63 (n = number of
    rows) and with Python integers otherwise.

    Raises ParameterError for an invalid p, lower or upper, and ValueError for a histogram key
    outside [lower, upper] or a negative count.
    """
    p = _check_p(p)
    lower = _check_int(lower, "lower")
    upper = _check_int(upper, "upper")
    if upper < lower:
        raise ParameterError("the upper candidate must be at least the lower candidate")
    size = upper - lower + 1
    if size > MAX_CANDIDATES:
        raise ParameterError(f"a quantile grid may have at most {MAX_CANDIDATES} candidates")
    a, b = p.numerator, p.denominator
    offsets, counts = _bin_counts(histogram, lower, upper)
    total = sum(counts)
    if b * total < _INT64_LIMIT:  # every |(b - a)·below - a·above| <= b·n fits in int64
        binned = np.zeros(size, dtype=np.int64)
        binned[np.asarray(offsets, dtype=np.int64)] = np.asarray(counts, dtype=np.int64)
        below = np.cumsum(binned) - binned
        target = a * total
        # b·(distance from p·n to [below, below + tied]); a row moves it by <= max(a, b - a).
        low = b * below - target
        high = target - b * (below + binned)
        scores: list[int] = np.maximum(np.maximum(low, high), 0).tolist()
        return scores
    binned_list = [0] * size
    for offset, count in zip(offsets, counts, strict=True):
        binned_list[offset] = count
    below_list = itertools.accumulate(binned_list[:-1], initial=0)
    return [
        max(b * lo - a * total, a * total - b * (lo + n), 0)
        for lo, n in zip(below_list, binned_list, strict=True)
    ]


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
    if all(-_INT64_LIMIT <= v < _INT64_LIMIT for v in values):
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
    if values.dtype != object and high - low < _INT64_LIMIT:
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


# --- public API ------------------------------------------------------------------------------


def exponential_mechanism_samples(
    scores: Sequence[int] | npt.NDArray[np.integer[Any]],
    gamma: Fraction,
    size: int,
    *,
    scheme: Scheme = "auto",
) -> IntArray:
    """``size`` independent exact exponential-mechanism draws (for tests and benchmarks: a
    release draws once, with ``exponential_mechanism``, and each draw costs privacy).

    Index j is drawn with probability exactly proportional to exp(-γ·(scores[j] - min scores)).
    ``scheme`` forces the uniform or levels proposal (both exact); "auto" picks the faster.
    Raises ParameterError for empty or non-integer scores or a non-positive or non-Fraction γ,
    and EntropyError when the operating system's randomness is unavailable.
    """
    size = _check_count(size, "size", 0)
    if scheme not in ("auto", "uniform", "levels"):
        raise ParameterError("scheme must be 'auto', 'uniform' or 'levels'")
    table = _build_table(scores, gamma, scheme)
    return _sample(table, size)


def exponential_mechanism(
    scores: Sequence[int] | npt.NDArray[np.integer[Any]], gamma: Fraction
) -> int:
    """Return index j with probability exactly exp(-γ·(s_j - m)) / Σ_i exp(-γ·(s_i - m)).

    ``scores`` are integers (lower is better), m = min(scores), γ a positive Fraction; with
    γ = ε/(2Δ), Δ the scores' sensitivity, this is ε-DP (McSherry and Talwar 2007). Exact:
    integers and uniform random bits only (see the module docstring for the proof). Raises
    ParameterError for invalid inputs and EntropyError without secure randomness.
    """
    return int(exponential_mechanism_samples(scores, gamma, 1)[0])


def exponential_probabilities(
    scores: Sequence[int] | npt.NDArray[np.integer[Any]], gamma: Fraction
) -> list[float]:
    """The exact target distribution of ``exponential_mechanism``, computed with 60-digit
    decimals and rounded to floats. For tests and docs; never used to sample."""
    values = _check_scores(scores).tolist()
    gamma = _check_gamma(gamma)
    low = min(values)
    weights: dict[int, Decimal] = {}
    with decimal.localcontext(_DECIMAL):
        for v in set(values):
            x = gamma * (v - low)
            weights[v] = (-(Decimal(x.numerator) / Decimal(x.denominator))).exp()
        total = sum(weights[v] for v in values)
        return [float(weights[v] / total) for v in values]
