"""Exact discrete Laplace sampling: the only source of randomness in dpsql.

Why exact: textbook floating point Laplace noise leaks the input through the pattern of the
floats it can produce (Mironov, "On Significance of the Least Significant Bits for Differential
Privacy", CCS 2012). dpsql therefore draws noise with the integer-only algorithms of Canonne,
Kamath and Steinke, "The Discrete Gaussian for Differential Privacy" (NeurIPS 2020,
arXiv:2004.00010):

* Algorithm 1 draws Bernoulli(exp(-γ)) for a rational γ in [0, 1] using only Bernoulli(a/b)
  draws (the only case Algorithm 2 needs).
* Algorithm 2 draws the discrete Laplace distribution with
  P(Z = z) = (1 - q) / (1 + q) · q^|z|, q = exp(-1/scale).
  The paper takes integers s, t and produces scale t/s, so for ``scale = Fraction(t, s)`` we
  pass t = ``scale.numerator`` and s = ``scale.denominator``.
* Bernoulli(a/b) is ``uniform integer in [0, b) < a``, and uniform integers are drawn by
  rejection from uniformly random bytes. No floating point value is ever computed on the
  sampling path, so every output has exactly the stated probability.

Vectorization: every stage runs on numpy arrays for the whole batch ("masked rejection"): the
entries a stage accepts are kept and only the rejected ones are redrawn. Taking the first
accepted entries in index order is independent of their values, so the output is an i.i.d.
sample of the exact distribution.

Integer ranges: the fast path keeps every integer it computes below ``_FAST_LIMIT`` = 2**63 so
that it fits int64/uint64. The bounds are checked explicitly; an entry whose next step would
leave that range (a uniform range t·K in Algorithm 1, or X = U + t·V in Algorithm 2) is
finished exactly with Python integers, and a scale whose numerator or denominator is not below
the limit uses the pure Python big-integer path for the whole batch (slow but exact).

Randomness: every bit comes from ``_random_bytes``, which calls ``os.urandom``. There is no
seed, no environment variable and no global generator state. If the operating system cannot
provide randomness, :class:`~dpsql.errors.EntropyError` is raised and nothing is released.
"""

from __future__ import annotations

import decimal
import math
import os
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from dpsql.errors import EntropyError, InternalError, ParameterError

__all__ = [
    "MAX_SCALE",
    "discrete_laplace",
    "discrete_laplace_half_width",
    "discrete_laplace_pmf",
    "discrete_laplace_tail",
    "uniform_integers",
]

MAX_SCALE = Fraction(2**56)
"""Largest accepted scale. At this scale P(|Z| > 2**63 - 1) = 2 q^(2**63) / (1 + q)
< 2·exp(-128) < 2**-183 per draw, so outputs fit int64 except with negligible probability (and
that event raises instead of releasing). Larger scales would be absurd for int64 aggregates."""

_FAST_LIMIT = 2**63
"""Exclusive bound on every integer the numpy path computes (read at call time so that tests can
lower it to exercise the big-integer continuations)."""

_INT64_MAX = 2**63 - 1

_WORDS: tuple[tuple[int, type[np.unsignedinteger[Any]]], ...] = (
    (8, np.uint8),
    (16, np.uint16),
    (32, np.uint32),
    (64, np.uint64),
)
"""Word types for uniform draws: the smallest word that holds the range wastes the fewest bytes."""

_DECIMAL = decimal.Context(prec=60, Emin=-999_999_999, Emax=999_999_999)
"""Context for the half-width search: 60 digits, so rounding errors are far below ``_DOUBT``."""

_DOUBT = Decimal("1e-40")
"""Relative margin by which a tail must be below the miss rate to count as covered."""

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


def _check_scale(scale: object) -> Fraction:
    # Only Fraction: a float scale would already have been rounded, defeating exactness.
    if not isinstance(scale, Fraction):
        raise ParameterError(
            f"the noise scale must be a fractions.Fraction, not {type(scale).__name__}"
        )
    if scale <= 0:
        raise ParameterError("the noise scale must be positive")
    if scale > MAX_SCALE:
        raise ParameterError("the noise scale must be at most 2**56 so that noise fits in int64")
    return scale


def _check_int(value: object, name: str) -> int:
    if isinstance(value, np.integer):  # sizes often come out of numpy arithmetic
        return int(value)
    # bool is an int subclass; True as a size or a count is always a bug at the call site.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ParameterError(f"{name} must be an int, not {type(value).__name__}")
    return value


def _check_count(value: object, name: str, minimum: int) -> int:
    value = _check_int(value, name)
    if value < minimum:
        raise ParameterError(f"{name} must be at least {minimum}")
    return value


def _check_confidence(confidence: object) -> float:
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)):
        raise ParameterError("the confidence must be a float")
    if not (math.isfinite(confidence) and 0 < confidence < 1):
        raise ParameterError("the confidence must be strictly between 0 and 1")
    return float(confidence)


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
    n = _check_count(n, "the range n", 1)
    size = _check_count(size, "size", 0)
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


# --- Algorithm 2: discrete Laplace with scale t/s -------------------------------------------


def _geometric_fast(size: int) -> IntArray:
    """V = number of Bernoulli(exp(-1)) successes before the first failure (inner loop of
    CKS 2020 Algorithm 2), vectorized: P(V >= v) = exp(-v)."""
    v = np.zeros(size, dtype=np.int64)
    live = np.arange(size)
    while live.size:
        success = _bernoulli_exp_fast(np.ones(live.size, dtype=np.int64), 1)
        live = live[success]
        v[live] += 1
    return v


def _to_int64(value: int) -> int:
    # Cannot happen below MAX_SCALE except with probability < 2**-183 per draw; refuse rather
    # than wrap around or clip (clipping would change the distribution).
    if abs(value) > _INT64_MAX:
        raise InternalError("a noise draw exceeded the int64 range; nothing was released")
    return value


def _magnitude_fast(u: IntArray, v: IntArray, t: int, s: int) -> IntArray:
    """Y = floor((U + t·V) / s), exactly. X = U + t·V stays below ``_FAST_LIMIT`` when
    V <= (limit - t) // t because U <= t - 1; larger V (rare) is computed with Python ints."""
    v_max = (_FAST_LIMIT - t) // t
    fits = v <= v_max
    y = np.empty(u.size, dtype=np.int64)
    y[fits] = (u[fits] + t * v[fits]) // s
    for i in np.flatnonzero(~fits).tolist():
        y[i] = _to_int64((int(u[i]) + t * int(v[i])) // s)
    return y


def _laplace_round(t: int, s: int, tries: int) -> IntArray:
    """One vectorized pass of CKS 2020 Algorithm 2 over ``tries`` attempts; returns the
    accepted draws in attempt order (each one exactly discrete Laplace with scale t/s)."""
    u = _uniform_fast(t, tries)
    u = u[_bernoulli_exp_fast(u, t)]  # D ~ Bernoulli(exp(-U/t)); reject where D = 0
    y = _magnitude_fast(u, _geometric_fast(u.size), t, s)  # X = U + tV is Geometric(1 - e^{-1/t})
    negative = _uniform_fast(2, u.size) == 1  # B ~ Bernoulli(1/2)
    keep: BoolArray = ~(negative & (y == 0))  # B = 1 and Y = 0 would count zero twice: reject
    signed: IntArray = np.where(negative, -y, y)
    return signed[keep]


def _laplace_fast(t: int, s: int, size: int) -> IntArray:
    out = np.empty(size, dtype=np.int64)
    filled = tried = 0
    while filled < size:
        need = size - filled
        # Acceptance is between ~0.3 and 1 depending on t and s: start at 1.5x, then use the
        # observed rate. This only sizes the batch; it never touches a drawn value.
        tries = need + need // 2 + 32 if filled == 0 else need * tried // filled + 32
        got = _laplace_round(t, s, tries)
        tried += tries
        take = min(got.size, need)
        out[filled : filled + take] = got[:take]
        filled += take
    return out


def _laplace_python(t: int, s: int) -> int:
    """CKS 2020 Algorithm 2 with Python integers: one discrete Laplace draw with scale t/s."""
    while True:
        u = _uniform_python(t)
        if not _bernoulli_exp_python(u, t):  # D = 0: reject
            continue
        v = 0
        while _bernoulli_exp_python(1, 1):  # A ~ Bernoulli(exp(-1))
            v += 1
        y = (u + t * v) // s
        negative = _uniform_python(2) == 1
        if negative and y == 0:
            continue
        return _to_int64(-y if negative else y)


def discrete_laplace(scale: Fraction, size: int) -> IntArray:
    """Draw ``size`` independent exact discrete Laplace values with the given rational scale.

    P(Z = z) = (1 - q) / (1 + q) · q^|z| with q = exp(-1/scale), z an integer. This is
    Algorithm 2 of Canonne, Kamath and Steinke, "The Discrete Gaussian for Differential
    Privacy" (arXiv:2004.00010), with t = scale.numerator and s = scale.denominator, built on
    their Algorithm 1 and exact uniform integers; no floating point is used.

    Returns an int64 array. ``scale`` must be a positive Fraction at most ``MAX_SCALE`` (2**56),
    which keeps every value inside int64 except with probability below 2**-183 per draw (that
    event raises InternalError). Raises ParameterError for invalid inputs and EntropyError when
    the operating system's randomness is unavailable.
    """
    scale = _check_scale(scale)
    size = _check_count(size, "size", 0)
    t, s = scale.numerator, scale.denominator
    if t < _FAST_LIMIT and s < _FAST_LIMIT:
        return _laplace_fast(t, s, size)
    # Big-integer path for huge numerators or denominators: exact, one draw at a time.
    return np.fromiter((_laplace_python(t, s) for _ in range(size)), dtype=np.int64, count=size)


# --- exact distribution helpers (floating point; never used for sampling) --------------------


def _rate(scale: Fraction) -> float:
    """1/scale as a correctly rounded float (inf when it is beyond the float range)."""
    try:
        return scale.denominator / scale.numerator  # int / int is correctly rounded
    except OverflowError:
        return math.inf


def _as_float(k: int) -> float:
    # Python ints beyond the float range would raise; any |k| >= 2**1000 has probability 0.0.
    return float(min(k, 2**1000))


def _log_mass_at_zero(rate: float) -> float:
    # log((1 - q) / (1 + q)) with q = exp(-rate); expm1/log1p keep precision for large scales.
    return math.log(-math.expm1(-rate)) - math.log1p(math.exp(-rate))


def discrete_laplace_pmf(scale: Fraction, k: int) -> float:
    """P(Z = k) = (1 - q) / (1 + q) · q^|k|, q = exp(-1/scale): the discrete Laplace of
    Canonne, Kamath and Steinke 2020 (arXiv:2004.00010) that ``discrete_laplace`` samples."""
    scale = _check_scale(scale)
    k = _check_int(k, "k")
    rate = _rate(scale)
    if k == 0:  # avoids 0 · inf for vanishing scales
        return math.exp(_log_mass_at_zero(rate))
    return math.exp(_log_mass_at_zero(rate) - _as_float(abs(k)) * rate)


def discrete_laplace_tail(scale: Fraction, k: int) -> float:
    """P(Z >= k). For k >= 1 this is q^k / (1 + q); for k <= 0 it is 1 - P(Z >= 1 - k) by
    symmetry (P(Z <= k - 1) = P(Z >= 1 - k))."""
    scale = _check_scale(scale)
    k = _check_int(k, "k")
    if k <= 0:
        return 1.0 - discrete_laplace_tail(scale, 1 - k)
    rate = _rate(scale)
    return math.exp(-_as_float(k) * rate - math.log1p(math.exp(-rate)))


def _covered(k: int, rate: Decimal, miss: Decimal) -> bool:
    # P(|Z| > k) = 2 q^(k+1) / (1 + q). Near the decision (k + 1)·rate ~ ln(2 / miss) < 40
    # (miss >= 2**-53 for a float confidence below 1), so at 60 digits the computed tail is
    # within 1e-55 of the truth, relatively; demanding a 1e-40 margin therefore proves the true
    # tail is below ``miss``. Far from the decision the margin is irrelevant.
    tail = 2 * (-(k + 1) * rate).exp() / (1 + (-rate).exp())
    return tail * (1 + _DOUBT) <= miss


def discrete_laplace_half_width(scale: Fraction, confidence: float) -> int:
    """Smallest integer k >= 0 with P(|Z| <= k) >= ``confidence`` for the discrete Laplace.

    Uses the exact discrete tail P(|Z| > k) = 2 q^(k+1) / (1 + q) (CKS 2020, arXiv:2004.00010),
    evaluated in 60-digit decimal arithmetic. A candidate only counts as covering when its tail
    is below 1 - confidence by a margin far larger than the rounding error, so the returned k
    never gives coverage below ``confidence`` (ties round up).
    """
    scale = _check_scale(scale)
    confidence = _check_confidence(confidence)
    with decimal.localcontext(_DECIMAL):
        rate = Decimal(scale.denominator) / Decimal(scale.numerator)
        miss = 1 - Decimal(confidence)  # Decimal(float) is exact
        # (k + 1) · rate >= ln 2 - ln(1 + q) - ln(miss) solves the tail bound for real k.
        bound = (Decimal(2).ln() - (1 + (-rate).exp()).ln() - miss.ln()) / rate - 1
        k = max(0, int(bound.to_integral_value(rounding=decimal.ROUND_CEILING)))
        while not _covered(k, rate, miss):  # the candidate is within one of the answer
            k += 1
        while k > 0 and _covered(k - 1, rate, miss):
            k -= 1
    return k
