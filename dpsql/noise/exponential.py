"""The exact exponential mechanism over a finite grid: its entry points.

**Mechanism.** Given integer scores s_0, ..., s_{K-1} (lower is better) and a rational γ > 0,
``exponential_mechanism`` returns index j with probability exactly
exp(-γ·(s_j - m)) / Σ_i exp(-γ·(s_i - m)), m = min s. If every score moves by at most Δ when one
row is added or removed, γ = ε/(2Δ) makes it ε-DP (McSherry and Talwar, FOCS 2007, Theorem 6);
it is also (γΔ)²/2-zCDP (Cesar and Rogers 2021, bounded range). The caller picks γ and charges it.

The quantile score is in :mod:`dpsql.mechanisms.quantile_score`; the exact sampler, with the proof
that it draws exactly this distribution, in :mod:`dpsql.noise.exponential_sampler`. This module
holds the entry points and re-exports the names once defined here, so imports from
``dpsql.noise.exponential`` keep working.

``exponential_probabilities`` computes the target distribution with 60-digit decimals for tests
and docs; it is never used to sample.
"""

from __future__ import annotations

import decimal
from collections.abc import Sequence
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from dpsql.errors import ParameterError
from dpsql.mechanisms.checks import check_count
from dpsql.noise.bits import IntArray
from dpsql.noise.exponential_sampler import (
    Scheme,
    _build_table,
    _check_gamma,
    _check_scores,
    _sample,
)

__all__ = ["exponential_mechanism", "exponential_mechanism_samples", "exponential_probabilities"]

_DECIMAL = decimal.Context(prec=60, Emin=-999_999_999, Emax=999_999_999)
"""60 digits for ``exponential_probabilities``: far below any statistical test's resolution."""


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
    size = check_count(size, "size", 0)
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
    integers and uniform random bits only (see ``exponential_sampler`` for the proof). Raises
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
