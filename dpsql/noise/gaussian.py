"""The exact discrete Gaussian N_Z(0, σ²) sampler.

The sampler is Algorithm 3 of Canonne, Kamath and Steinke, "The Discrete Gaussian for
Differential Privacy" (NeurIPS 2020, arXiv:2004.00010), P(Z = z) ∝ exp(-z²/(2σ²)), for a
rational σ² = p/q: discrete Laplace proposals (:mod:`dpsql.noise.laplace`) with scale
t = floor(σ) + 1, each accepted with probability exp(-γ), γ = (|Y| - σ²/t)²/(2σ²) =
(|Y|·q·t - p)²/(2·p·q·t²), drawn as floor(γ) Bernoulli(exp(-1)) draws and one Algorithm 1 draw
for the fractional part. All bits come from :mod:`dpsql.noise.bits`, the only source of
randomness; no floating point value is computed on the sampling path.

Integer ranges: the acceptance runs in int64 while 2·p·q·t² and (|Y|·q·t - p)² stay below
``bits._FAST_LIMIT`` (read at call time) and with Python integers beyond.

The distribution's pmf, tail and confidence half-width (floating point, never used for
sampling) are mathematics, in :mod:`dpsql.mechanisms.gaussian`.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import partial

import numpy as np

from dpsql.mechanisms.checks import check_count
from dpsql.mechanisms.gaussian import check_sigma2
from dpsql.noise import bits
from dpsql.noise.bits import (
    BoolArray,
    IntArray,
    _bernoulli_exp_fast,
    _bernoulli_exp_rational_python,
    _bernoulli_exp_whole_fast,
    _fill,
)
from dpsql.noise.laplace import _laplace_fast, _laplace_python

__all__ = ["discrete_gaussian"]


# --- Algorithm 3: discrete Gaussian N_Z(0, sigma2) ------------------------------------------


def _gaussian_accept_fast(y: IntArray, p: int, q: int, t: int) -> BoolArray:
    """CKS 2020 Algorithm 3's C ~ Bernoulli(exp(-γ)) for each proposal Y, vectorized, with
    γ = (|Y| - σ²/t)² / (2σ²) = (|Y|·q·t - p)² / (2·p·q·t²) for σ² = p/q.

    Requires den = 2·p·q·t² < ``bits._FAST_LIMIT``. Since t² > p/q, den > 2p², so p <= D =
    isqrt(limit - 1) and d = |Y|·q·t - p >= -p has d² < limit whenever |Y| <= (p + D) // (q·t);
    larger |Y| (acceptance below exp(-D²/den), vanishingly rare) is settled with Python ints.
    """
    den, qt = 2 * p * q * t * t, q * t
    y_abs = np.abs(y)
    fits = y_abs <= (p + math.isqrt(bits._FAST_LIMIT - 1)) // qt
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
    if t < bits._FAST_LIMIT:
        y = _laplace_fast(t, 1, tries)
    else:
        y = np.fromiter((_laplace_python(t, 1) for _ in range(tries)), np.int64, count=tries)
    if 2 * p * q * t * t < bits._FAST_LIMIT:
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
    sigma2 = check_sigma2(sigma2)
    size = check_count(size, "size", 0)
    p, q = sigma2.numerator, sigma2.denominator
    t = math.isqrt(p // q) + 1  # floor(sqrt(x)) = isqrt(floor(x)) for real x >= 0
    # Acceptance per proposal is at least ~0.45 (lowest for small sigma2): start at 2.2x.
    return _fill(partial(_gaussian_round, p, q, t), size, Fraction(11, 5))


# --- the discrete Gaussian's distribution (floating point; never used for sampling) ----------
