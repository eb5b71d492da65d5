"""Exact random bits for dpsql's noise: the one source of randomness and its exact primitives.

Every bit of noise in dpsql comes from ``_random_bytes``, which calls ``os.urandom``; the
discrete Laplace (:mod:`dpsql.noise.laplace`) and discrete Gaussian (:mod:`dpsql.noise.gaussian`)
samplers draw only through the functions here. There is no seed, no environment variable and no
global generator state. If the operating system cannot provide randomness,
:class:`~dpsql.errors.EntropyError` is raised and nothing is released.

The primitives are those of Canonne, Kamath and Steinke, "The Discrete Gaussian for Differential
Privacy" (NeurIPS 2020, arXiv:2004.00010), using integers only: floating point noise leaks the
input through the pattern of the floats it can produce (Mironov, "On Significance of the Least
Significant Bits for Differential Privacy", CCS 2012).

* Uniform integers on [0, n) by rejection from uniformly random bytes; Bernoulli(a/b) is
  ``uniform integer in [0, b) < a``.
* Algorithm 1: Bernoulli(exp(-γ)) for a rational γ in [0, 1] from Bernoulli(a/b) draws, and its
  extension to any rational γ >= 0 (floor(γ) Bernoulli(exp(-1)) draws and one for the fractional
  part, as in their Algorithm 3).
* ``_fill``: masked rejection. Every stage runs on numpy arrays for the whole batch; the entries
  a stage accepts are kept and only the rejected ones are redrawn. Taking the first accepted
  entries in index order is independent of their values, so the output is an i.i.d. sample of
  the exact distribution.

Integer ranges: the fast path keeps every integer it computes below ``_FAST_LIMIT`` = 2**63 so
that it fits int64/uint64; entries whose next step would leave that range are finished exactly
with Python integers. The samplers read ``bits._FAST_LIMIT`` through this module at call time,
so lowering it here (as tests do) lowers it everywhere.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from dpsql.errors import EntropyError
from dpsql.mechanisms.checks import check_count

__all__ = ["uniform_integers"]

_FAST_LIMIT = 2**63
"""Exclusive bound on every integer the numpy path computes. Read at call time, through this
module, here and in laplace.py and gaussian.py, so that one patch (as in the tests) lowers it
everywhere to exercise the big-integer continuations."""

_WORDS: tuple[tuple[int, type[np.unsignedinteger[Any]]], ...] = (
    (8, np.uint8),
    (16, np.uint16),
    (32, np.uint32),
    (64, np.uint64),
)
"""Word types for uniform draws: the smallest word that holds the range wastes the fewest bytes."""

BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]


# --- randomness ------------------------------------------------------------------------------


def _random_bytes(n: int) -> bytes:
    """Return ``n`` bytes from the operating system's CSPRNG: the only randomness in dpsql.

    ``os.urandom`` is looked up at call time so that tests can make it fail. Any failure is
    turned into :class:`EntropyError` so that callers fail closed instead of releasing
    something computed without noise.
    """
    try:
        data = os.urandom(n)
    except Exception:
        raise EntropyError("secure randomness is unavailable; nothing was released") from None
    if len(data) != n:  # a short read would silently bias the rejection samplers
        raise EntropyError("secure randomness is unavailable; nothing was released")
    return data


# --- validation ------------------------------------------------------------------------------


# --- exact uniform integers ------------------------------------------------------------------


def _uniform_python(n: int) -> int:
    """One exact uniform integer in [0, n) for any n >= 1, by rejection on whole bytes."""
    bits = (n - 1).bit_length()
    mask = (1 << bits) - 1
    while True:  # acceptance probability n / 2**bits >= 1/2
        candidate = int.from_bytes(_random_bytes((bits + 7) // 8), "little") & mask
        if candidate < n:
            return candidate


def _uniform_fast(n: int, size: int) -> IntArray:
    """``size`` exact uniform integers in [0, n) for 1 <= n < ``_FAST_LIMIT`` (vectorized).

    Draw words of the smallest sufficient width, keep the low ``bits`` bits (uniform on
    [0, 2**bits)) and keep the candidates below n: conditioned on acceptance each is uniform on
    [0, n). Only the shortfall is redrawn.
    """
    out = np.zeros(size, dtype=np.int64)
    if n == 1:  # the only value is 0; consume no randomness
        return out
    bits = (n - 1).bit_length()
    width, word = next((w, d) for w, d in _WORDS if bits <= w)
    filled = 0
    while filled < size:
        need = size - filled
        # Expected acceptance is n / 2**bits; oversample slightly so one round usually suffices.
        count = ((need << bits) // n) + need // 16 + 16
        words = np.frombuffer(_random_bytes(count * (width // 8)), dtype=word)
        if bits < width:
            words = words & word((1 << bits) - 1)
        if n != 1 << bits:
            words = words[words < word(n)]
        take = min(words.size, need)
        out[filled : filled + take] = words[:take].astype(np.int64)
        filled += take
    return out


def uniform_integers(n: int, size: int) -> npt.NDArray[Any]:
    """Return ``size`` independent exact uniform integers on [0, n).

    Drawn by rejection from uniformly random bytes (no floating point), the primitive under
    every Bernoulli(a/b) draw of Canonne, Kamath and Steinke 2020 (arXiv:2004.00010).
    The result has dtype int64 when n < 2**63 and dtype object (Python ints) otherwise.
    """
    n = check_count(n, "the range n", 1)
    size = check_count(size, "size", 0)
    if n < _FAST_LIMIT:
        return _uniform_fast(n, size)
    out = np.empty(size, dtype=object)
    for i in range(size):
        out[i] = _uniform_python(n)
    return out


# --- Algorithm 1: Bernoulli(exp(-a/b)) for 0 <= a <= b --------------------------------------


def _bernoulli_exp_python(a: int, b: int, k: int = 1) -> bool:
    """CKS 2020 Algorithm 1 for γ = a/b in [0, 1], with Python integers.

    Draw A_K ~ Bernoulli(γ/K) for K = k, k+1, ... until one is 0 and return whether that K is
    odd: P(K odd) = Σ (-γ)^j / j! = exp(-γ). Starting at ``k > 1`` resumes an entry that the
    vectorized loop handed over when b·K reached ``_FAST_LIMIT``.
    """
    while _uniform_python(b * k) < a:  # Bernoulli(γ/K) = Bernoulli(a / (b·K))
        k += 1
    return k % 2 == 1


def _bernoulli_exp_fast(a: IntArray, b: int) -> BoolArray:
    """Vectorized CKS 2020 Algorithm 1: entry i is Bernoulli(exp(-a[i]/b)), 0 <= a[i] <= b.

    All live entries share the same K, so Bernoulli(a[i]/(b·K)) is one uniform draw on
    [0, b·K) per live entry compared with a[i]. Entries stop independently; the loop ends after
    a few rounds because P(K > j) = γ^j / j!.
    """
    result = np.empty(a.size, dtype=np.bool_)
    live = np.arange(a.size)
    k = 1
    while live.size:
        if b * k >= _FAST_LIMIT:  # the uniform range no longer fits: finish exactly in Python
            for i in live.tolist():
                result[i] = _bernoulli_exp_python(int(a[i]), b, k)
            break
        goes_on = _uniform_fast(b * k, live.size) < a[live]
        result[live[~goes_on]] = k % 2 == 1
        live = live[goes_on]
        k += 1
    return result


# --- Bernoulli(exp(-γ)) for any rational γ >= 0 (Algorithm 1 extended, as in Algorithm 3) ---


def _bernoulli_exp_rational_python(num: int, den: int) -> bool:
    """Bernoulli(exp(-γ)) for any rational γ = num/den >= 0, with Python integers.

    exp(-γ) = exp(-1)^floor(γ) · exp(-(γ - floor(γ))): floor(γ) Bernoulli(exp(-1)) draws and
    one Bernoulli(exp(-frac(γ))) draw (CKS 2020 Algorithm 1, extended to γ > 1 as in their
    Algorithm 3), all of which must succeed. The loop stops at the first failure, so a huge
    floor(γ) costs few draws: P(more than j rounds) = exp(-j).
    """
    whole, rest = divmod(num, den)
    for _ in range(whole):
        if not _bernoulli_exp_python(1, 1):
            return False
    return _bernoulli_exp_python(rest, den)


def _bernoulli_exp_whole_fast(whole: IntArray) -> BoolArray:
    """Entry i is Bernoulli(exp(-whole[i])) for integers whole[i] >= 0 (vectorized): whole[i]
    independent Bernoulli(exp(-1)) draws that must all succeed. Each round draws once per entry
    with draws left; a failure settles the entry, so the live set shrinks by e^-1 per round."""
    ok = np.ones(whole.size, dtype=np.bool_)
    left = whole.copy()
    live = np.flatnonzero(left > 0)
    while live.size:
        success = _bernoulli_exp_fast(np.ones(live.size, dtype=np.int64), 1)
        ok[live[~success]] = False
        left[live] -= 1
        live = live[success & (left[live] > 0)]
    return ok


# --- masked rejection ------------------------------------------------------------------------


def _fill(draw_round: Callable[[int], IntArray], size: int, first: Fraction) -> IntArray:
    """Collect ``size`` accepted draws from rounds of masked rejection, in attempt order.

    The first round makes ``first`` attempts per missing value, later rounds use the observed
    acceptance rate. This only sizes the batches; it never looks at a drawn value.
    """
    out = np.empty(size, dtype=np.int64)
    filled = tried = 0
    while filled < size:
        need = size - filled
        tries = int(need * first) + 32 if filled == 0 else need * tried // filled + 32
        got = draw_round(tries)
        tried += tries
        take = min(got.size, need)
        out[filled : filled + take] = got[:take]
        filled += take
    return out
