"""The exact discrete Laplace sampler.

The sampler is Algorithm 2 of Canonne, Kamath and Steinke, "The Discrete Gaussian for
Differential Privacy" (NeurIPS 2020, arXiv:2004.00010), drawing the discrete Laplace
distribution P(Z = z) = (1 - q) / (1 + q) · q^|z|, q = exp(-1/scale), with integers only. The
paper takes integers s, t and produces scale t/s, so for ``scale = Fraction(t, s)`` we pass
t = ``scale.numerator`` and s = ``scale.denominator``. Its Bernoulli(exp(-γ)) draws (their
Algorithm 1), uniform integers and batching come from :mod:`dpsql.noise.bits`, the only source
of randomness; no floating point value is computed on the sampling path (Mironov, CCS 2012,
shows what floats leak).

Integer ranges: X = U + t·V is computed in int64 while it stays below ``bits._FAST_LIMIT``
(read at call time) and with Python integers beyond; a scale whose numerator or denominator is
not below the limit uses the pure Python big-integer path for the whole batch (slow but exact).

The distribution's pmf, tail and confidence half-width (floating point or 60-digit decimals,
never used for sampling) are mathematics, in :mod:`dpsql.mechanisms.laplace`.
"""

from __future__ import annotations

from fractions import Fraction
from functools import partial

import numpy as np

from dpsql.errors import InternalError
from dpsql.mechanisms.checks import check_count
from dpsql.mechanisms.laplace import check_scale
from dpsql.noise import bits
from dpsql.noise.bits import (
    BoolArray,
    IntArray,
    _bernoulli_exp_fast,
    _bernoulli_exp_python,
    _fill,
    _uniform_fast,
    _uniform_python,
)

__all__ = ["discrete_laplace"]

_INT64_MAX = 2**63 - 1


_ONE_BY_ONE = 8
"""Up to this many values are drawn one at a time with Python integers (``_laplace_python``):
for a handful of draws that is faster than the vectorized passes, and exactly as distributed."""


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
    """Y = floor((U + t·V) / s), exactly. X = U + t·V stays below ``bits._FAST_LIMIT`` when
    V <= (limit - t) // t because U <= t - 1; larger V (rare) is computed with Python ints."""
    v_max = (bits._FAST_LIMIT - t) // t
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
    scale = check_scale(scale)
    size = check_count(size, "size", 0)
    t, s = scale.numerator, scale.denominator
    if t < bits._FAST_LIMIT and s < bits._FAST_LIMIT and size > _ONE_BY_ONE:
        return _laplace_fast(t, s, size)
    # A few draws (an ungrouped total, a handful of groups), or big integers: the same
    # algorithm one draw at a time. (The vectorized passes cost a fixed ~0.4 ms per call.)
    # Big-integer path for huge numerators or denominators: exact, one draw at a time.
    return np.fromiter((_laplace_python(t, s) for _ in range(size)), dtype=np.int64, count=size)


# --- exact distribution helpers (floating point; never used for sampling) --------------------
