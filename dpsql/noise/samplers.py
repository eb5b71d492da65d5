"""Exact discrete Laplace and discrete Gaussian sampling: the only source of randomness in dpsql.

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
* Algorithm 3 draws the discrete Gaussian N_Z(0, σ²), P(Z = z) ∝ exp(-z²/(2σ²)), for a
  rational σ² = p/q: discrete Laplace proposals with scale t = floor(σ) + 1, each accepted with
  probability exp(-γ), γ = (|Y| - σ²/t)²/(2σ²) = (|Y|·q·t - p)²/(2·p·q·t²), drawn as floor(γ)
  Bernoulli(exp(-1)) draws and one Algorithm 1 draw for the fractional part.
* Bernoulli(a/b) is ``uniform integer in [0, b) < a``, and uniform integers are drawn by
  rejection from uniformly random bytes. No floating point value is ever computed on the
  sampling path, so every output has exactly the stated probability.

Vectorization: every stage runs on numpy arrays for the whole batch ("masked rejection"): the
entries a stage accepts are kept and only the rejected ones are redrawn. Taking the first
accepted entries in index order is independent of their values, so the output is an i.i.d.
sample of the exact distribution.

Integer ranges: the fast path keeps every integer it computes below ``_FAST_LIMIT`` = 2**63 so
that it fits int64/uint64. The bounds are checked explicitly; an entry whose next step would
leave that range (a uniform range t·K in Algorithm 1, X = U + t·V in Algorithm 2, or
(|Y|·q·t - p)² in Algorithm 3) is finished exactly with Python integers, and a scale whose
numerator or denominator is not below the limit uses the pure Python big-integer path for the
whole batch (slow but exact); so does Algorithm 3's acceptance when 2·p·q·t² is not.

Randomness: every bit comes from ``_random_bytes``, which calls ``os.urandom``. There is no
seed, no environment variable and no global generator state. If the operating system cannot
provide randomness, :class:`~dpsql.errors.EntropyError` is raised and nothing is released.
"""

from __future__ import annotations

import decimal
import math
import os
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt

from dpsql.errors import EntropyError, InternalError, ParameterError

__all__ = [
    "MAX_SCALE",
    "MAX_SIGMA2",
    "discrete_gaussian",
    "discrete_gaussian_half_width",
    "discrete_gaussian_pmf",
    "discrete_gaussian_tail",
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

MAX_SIGMA2 = Fraction(2**110)
"""Largest accepted variance of the discrete Gaussian. Then sigma <= 2**55, the proposal scale
t = floor(sigma) + 1 is at most ``MAX_SCALE``, and P(|Z| > 2**63 - 1) <= 2·exp(-2**126 / 2**111)
= 2·exp(-32768) per draw (the discrete Gaussian is sub-Gaussian with parameter sigma, CKS 2020
Proposition 19)."""

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


def _check_sigma2(sigma2: object) -> Fraction:
    # Only Fraction, as for the scale: exactness starts at the parameter.
    if not isinstance(sigma2, Fraction):
        raise ParameterError(
            f"the noise variance sigma2 must be a fractions.Fraction, not {type(sigma2).__name__}"
        )
    if sigma2 <= 0:
        raise ParameterError("the noise variance sigma2 must be positive")
    if sigma2 > MAX_SIGMA2:
        raise ParameterError("the noise variance sigma2 must be at most 2**110")
    return sigma2


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


def _laplace_fast(t: int, s: int, size: int) -> IntArray:
    # Algorithm 2 accepts between ~0.3 and 1 of its attempts depending on t and s.
    return _fill(partial(_laplace_round, t, s), size, Fraction(3, 2))


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


# --- Algorithm 3: discrete Gaussian N_Z(0, sigma2) ------------------------------------------


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


def _gaussian_accept_fast(y: IntArray, p: int, q: int, t: int) -> BoolArray:
    """CKS 2020 Algorithm 3's C ~ Bernoulli(exp(-γ)) for each proposal Y, vectorized, with
    γ = (|Y| - σ²/t)² / (2σ²) = (|Y|·q·t - p)² / (2·p·q·t²) for σ² = p/q.

    Requires den = 2·p·q·t² < ``_FAST_LIMIT``. Since t² > p/q, den > 2p², so p <= D =
    isqrt(limit - 1) and d = |Y|·q·t - p >= -p has d² < limit whenever |Y| <= (p + D) // (q·t);
    larger |Y| (acceptance below exp(-D²/den), vanishingly rare) is settled with Python ints.
    """
    den, qt = 2 * p * q * t * t, q * t
    y_abs = np.abs(y)
    fits = y_abs <= (p + math.isqrt(_FAST_LIMIT - 1)) // qt
    d = y_abs[fits] * qt - p
    whole, rest = np.divmod(d * d, den)
    ok = _bernoulli_exp_whole_fast(whole)
    alive = np.flatnonzero(ok)
    ok[alive] = _bernoulli_exp_fast(rest[alive], den)  # exp(-frac(γ)): Algorithm 1 on a/b < 1
    accept = np.zeros(y.size, dtype=np.bool_)
    accept[fits] = ok
    for i in np.flatnonzero(~fits).tolist():
        accept[i] = _bernoulli_exp_rational_python((int(y_abs[i]) * qt - p) ** 2, den)
    return accept


def _gaussian_accept_python(y: IntArray, p: int, q: int, t: int) -> BoolArray:
    # The same acceptance when den = 2·p·q·t² is beyond int64: one proposal at a time.
    den, qt = 2 * p * q * t * t, q * t
    draws = (_bernoulli_exp_rational_python((abs(v) * qt - p) ** 2, den) for v in y.tolist())
    return np.fromiter(draws, dtype=np.bool_, count=y.size)


def _gaussian_round(p: int, q: int, t: int, tries: int) -> IntArray:
    """One vectorized pass of CKS 2020 Algorithm 3 over ``tries`` proposals Y ~ DLap(t); the
    accepted ones, in proposal order, are exactly N_Z(0, p/q) (their Theorem: the proposal
    weight exp(-|y|/t) times the acceptance exp(-(|y| - σ²/t)²/(2σ²)) is proportional to
    exp(-y²/(2σ²)) for every integer y)."""
    if t < _FAST_LIMIT:
        y = _laplace_fast(t, 1, tries)
    else:
        y = np.fromiter((_laplace_python(t, 1) for _ in range(tries)), np.int64, count=tries)
    if 2 * p * q * t * t < _FAST_LIMIT:
        return y[_gaussian_accept_fast(y, p, q, t)]
    return y[_gaussian_accept_python(y, p, q, t)]


def discrete_gaussian(sigma2: Fraction, size: int) -> IntArray:
    """Draw ``size`` independent exact discrete Gaussian values N_Z(0, sigma2).

    P(Z = z) = exp(-z²/(2·sigma2)) / Σ_k exp(-k²/(2·sigma2)), z an integer. This is
    Algorithm 3 of Canonne, Kamath and Steinke, "The Discrete Gaussian for Differential
    Privacy" (arXiv:2004.00010): t = floor(sigma) + 1, computed exactly as
    isqrt(floor(sigma2)); Y ~ discrete Laplace with scale t (Algorithm 2); accept Y with
    probability exp(-(|Y| - sigma2/t)²/(2·sigma2)) (Algorithm 1 extended to γ > 1); no floating
    point is used.

    Speed: the acceptance runs vectorized in int64 while 2·p·q·t² < 2**63 for sigma2 = p/q
    (roughly: numerator p below 2**31, e.g. any integer sigma2 up to 2·10**9); beyond that each
    proposal is accepted or rejected with Python integers (exact, ~50x slower). Callers that
    calibrate sigma2 should round it up to a short fraction (safe: more noise).

    Returns an int64 array. ``sigma2`` must be a positive Fraction at most ``MAX_SIGMA2``
    (2**110). Raises ParameterError for invalid inputs and EntropyError when the operating
    system's randomness is unavailable.
    """
    sigma2 = _check_sigma2(sigma2)
    size = _check_count(size, "size", 0)
    p, q = sigma2.numerator, sigma2.denominator
    t = math.isqrt(p // q) + 1  # floor(sqrt(x)) = isqrt(floor(x)) for real x >= 0
    # Acceptance per proposal is at least ~0.45 (lowest for small sigma2): start at 2.2x.
    return _fill(partial(_gaussian_round, p, q, t), size, Fraction(11, 5))


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


# --- the discrete Gaussian's distribution (floating point; never used for sampling) ----------

_EM_FROM = 10**6
"""Variance above which tails use Euler-Maclaurin instead of summing up to 80·sigma terms."""

_TERM_EPS = 1e-18
"""Series terms below this fraction of 1 are dropped (half an ulp of 1.0 is 1.1e-16)."""

_GAUSS_DOUBT = 1e-9
"""Relative margin by which a computed tail must be below the miss rate to count as covered.
Near any decision (tails above 2**-53, so exponents below ~40) the float evaluation below is
accurate to ~1e-13 relatively (see ``_upper_sum``), so the margin exceeds the error by four
orders of magnitude. The price: for huge sigma, where one step of k changes the tail by only
~k/sigma² relatively, the answer may exceed the minimum by about 1e-9·sigma²/k."""


def _half_square(sigma2: Fraction, k: int) -> float:
    """k²/(2·sigma2) as a correctly rounded float; inf when beyond the float range."""
    try:
        return float(Fraction(k * k * sigma2.denominator, 2 * sigma2.numerator))
    except OverflowError:
        return math.inf


def _normaliser(sigma2: Fraction) -> float:
    """Σ_k exp(-k²/(2σ²)) over all integers k, summed until the terms drop below 1e-18.

    Small σ² (< 1): the series itself, whose terms vanish after a few k. Larger σ²: its Poisson
    summation (Jacobi theta identity, CKS 2020 eq. (8)) sqrt(2πσ²)·Σ_n exp(-2π²σ²n²), whose
    second term is already below 2.7e-9 at σ² = 1 and below 1e-18 from σ² = 2.1.
    """
    if sigma2 < 1:
        terms, k = [1.0], 1
        while (term := math.exp(-_half_square(sigma2, k))) >= _TERM_EPS:
            terms.append(2 * term)
            k += 1
        return math.fsum(terms)
    s = float(sigma2)
    dual, n = [1.0], 1
    while (term := math.exp(-2 * math.pi**2 * s * n * n)) >= _TERM_EPS:
        dual.append(2 * term)
        n += 1
    return math.sqrt(2 * math.pi * s) * math.fsum(dual)


def _upper_sum(sigma2: Fraction, m: int) -> float:
    """Σ_{j >= m} exp(-j²/(2σ²)) for m >= 1 (the unnormalised upper tail).

    Beyond m²/(2σ²) = 746 every term underflows and the sum is below 1e-320·σ: 0.0. Up to
    σ² = 10**6 the terms j in [m, 40σ + 50) are summed in float (j² < 2**53 is exact; the rest
    is below exp(-800)). Above, Euler-Maclaurin to the third derivative:
    ∫_m^∞ f + f(m)/2 - f'(m)/12 + f'''(m)/720, f(x) = exp(-x²/(2σ²)). Against a 30-digit
    mpmath sum at σ² = 10**6 the relative error of either method is below 4e-14 for m <= 20σ
    (the Euler-Maclaurin remainder shrinks like σ^-6 beyond); tails below ~1e-300 lose
    precision to subnormal floats, far from any decision.
    """
    if _half_square(sigma2, m) > 746:
        return 0.0
    s = float(sigma2)
    sigma = math.sqrt(s)
    if sigma2 <= _EM_FROM:
        j = np.arange(m, max(m + 1, int(40 * sigma) + 50), dtype=np.float64)
        # Positive terms: numpy's pairwise sum errs by at most ~log2(n)·2**-53 relatively.
        return float(np.sum(np.exp(-(j * j) * (0.5 / s))))
    x = float(m)
    f = math.exp(-_half_square(sigma2, m))
    integral = sigma * math.sqrt(math.pi / 2) * math.erfc(x / (sigma * math.sqrt(2)))
    d1 = -x / s * f
    d3 = (3 * x / s**2 - x**3 / s**3) * f
    return integral + f / 2 - d1 / 12 + d3 / 720


def discrete_gaussian_pmf(sigma2: Fraction, k: int) -> float:
    """P(Z = k) = exp(-k²/(2·sigma2)) / Σ_j exp(-j²/(2·sigma2)): the discrete Gaussian
    N_Z(0, sigma2) of Canonne, Kamath and Steinke 2020 that ``discrete_gaussian`` samples."""
    sigma2 = _check_sigma2(sigma2)
    k = _check_int(k, "k")
    return math.exp(-_half_square(sigma2, k)) / _normaliser(sigma2)


def discrete_gaussian_tail(sigma2: Fraction, k: int) -> float:
    """P(Z >= k) for Z ~ N_Z(0, sigma2). For k <= 0 it is 1 - P(Z >= 1 - k) by symmetry."""
    sigma2 = _check_sigma2(sigma2)
    k = _check_int(k, "k")
    if k <= 0:
        return 1.0 - discrete_gaussian_tail(sigma2, 1 - k)
    return min(1.0, _upper_sum(sigma2, k) / _normaliser(sigma2))


def discrete_gaussian_half_width(sigma2: Fraction, confidence: float) -> int:
    """Smallest integer k >= 0 with P(|Z| <= k) >= ``confidence`` for Z ~ N_Z(0, sigma2).

    Uses the discrete tail P(|Z| > k) = 2·Σ_{j > k} exp(-j²/(2σ²)) / normaliser, not the
    continuous Gaussian's. A candidate only counts as covering when its computed tail is below
    1 - confidence by the relative margin ``_GAUSS_DOUBT`` (1e-9, far above the evaluation
    error), so the returned k never gives coverage below ``confidence`` (doubt rounds up).
    """
    sigma2 = _check_sigma2(sigma2)
    miss = 1.0 - _check_confidence(confidence)  # exact: confidence is a float in (0, 1)
    norm = _normaliser(sigma2)

    def covered(k: int) -> bool:
        return 2 * _upper_sum(sigma2, k + 1) / norm * (1 + _GAUSS_DOUBT) <= miss

    # Sub-Gaussian tail P(|Z| > k) <= 2 exp(-(k+1)²/(2σ²)) (CKS 2020 Prop. 19): a first bracket.
    hi = max(1, math.ceil(math.sqrt(2 * float(sigma2) * math.log(2 / miss))))
    while not covered(hi):
        hi *= 2
    lo = -1  # P(|Z| > -1) = 1 > miss: never covered
    while hi - lo > 1:  # invariant: covered(hi) and not covered(lo)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if covered(mid) else (mid, hi)
    return hi
