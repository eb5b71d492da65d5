"""The integer quantile score of the grid candidates, and its sensitivity.

**Quantile score.** Candidates are the grid indices c in [lower, upper]. For p = a/b in lowest
terms and n rows, ``quantile_scores`` gives score(c) = max(b·#{x < c} - a·n, a·n - b·#{x <= c},
0): b times the distance from the target rank p·n to the ranks c spans, an integer that is 0
exactly where c is a p-quantile of the rows (a variant of OpenDP's
``make_quantile_score_candidates`` that does not penalise rows tied on c, which matters on a
coarse grid). Sensitivity sketch: adding a row moves n by one and each count by at most one, so
b·#{x < c} - a·n moves by b - a or -a, a·n - b·#{x <= c} by a - b or a; max(·, ·, 0) is
1-Lipschitz, so every score moves by at most max(a, b - a) = ``score_sensitivity(p)``.

**Shifted target.** ``shift`` (an integer number of rows, public) moves the target rank to
p·n + shift, with |shift| public rows padded at the grid's edge on the side of the shift (the
lowest candidate for a negative shift, the highest for a positive one): the score is b times the
distance from the target to the ranks c spans in the padded rows. The padding makes the edge a
zero-score candidate whenever the target falls beyond the data, so the best score is always 0
(which the exponential mechanism's utility bound needs); elsewhere it is the distance from
p·n + shift in the data. Its sensitivity is the same: the padding and the shift are constants,
and the target still moves by a per row. A quantile interval's endpoints are such shifted
quantiles.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from fractions import Fraction

import numpy as np

from dpsql.errors import ParameterError
from dpsql.mechanisms.checks import check_int

__all__ = ["INT64_LIMIT", "MAX_CANDIDATES", "quantile_scores", "score_sensitivity"]


MAX_CANDIDATES = 2**24
"""Largest accepted number of candidates (grid points). The sampler keeps a few int64 arrays of
this length; 2**24 is far beyond any useful quantile grid and bounds the memory used."""


INT64_LIMIT = 2**63
"""Exclusive bound for the int64 score arithmetic (not a sampling limit)."""


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


def quantile_scores(
    histogram: Mapping[int, int], lower: int, upper: int, p: Fraction, shift: int = 0
) -> list[int]:
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

    With ``shift`` the target rank is p·n + shift, |shift| rows padded at the edge on its side
    (module docstring); the sensitivity is unchanged.

    Raises ParameterError for an invalid p, lower, upper or shift, and ValueError for a
    histogram key outside [lower, upper] or a negative count.
    """
    p = _check_p(p)
    lower = check_int(lower, "lower")
    upper = check_int(upper, "upper")
    if upper < lower:
        raise ParameterError("the upper candidate must be at least the lower candidate")
    size = upper - lower + 1
    if size > MAX_CANDIDATES:
        raise ParameterError(f"a quantile grid may have at most {MAX_CANDIDATES} candidates")
    shift = check_int(shift, "shift")
    a, b = p.numerator, p.denominator
    offsets, counts = _bin_counts(histogram, lower, upper)
    total = sum(counts)
    target = a * total + b * shift  # b times the target rank p·n + shift
    if b * (total + abs(shift)) < INT64_LIMIT:  # every b·below - target and the rest fit
        binned = np.zeros(size, dtype=np.int64)
        binned[np.asarray(offsets, dtype=np.int64)] = np.asarray(counts, dtype=np.int64)
        below = np.cumsum(binned) - binned
        # b·(distance from p·n to [below, below + tied]); a row moves it by <= max(a, b - a).
        low = b * below - target
        high = target - b * (below + binned)
        if shift < 0:  # |shift| rows padded at the lowest candidate: none lies below it
            low[0] = -a * total
        elif shift > 0:  # shift rows padded at the highest: they count up to it
            high[-1] = target - b * (total + shift)
        scores: list[int] = np.maximum(np.maximum(low, high), 0).tolist()
        return scores
    binned_list = [0] * size
    for offset, count in zip(offsets, counts, strict=True):
        binned_list[offset] = count
    below_list = list(itertools.accumulate(binned_list[:-1], initial=0))
    lows = [b * lo - target for lo in below_list]
    highs = [target - b * (lo + n) for lo, n in zip(below_list, binned_list, strict=True)]
    if shift < 0:
        lows[0] = -a * total
    elif shift > 0:
        highs[-1] = target - b * (total + shift)
    return [max(lo, hi, 0) for lo, hi in zip(lows, highs, strict=True)]
