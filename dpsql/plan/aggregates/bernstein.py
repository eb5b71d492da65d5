"""VARIANCE and STDDEV from one joint measurement: a value's Bernstein coordinates.

A row's value x, centred on the middle of its bounds in units of g/2 (so in ±w, w the width),
gives the vector ((w - x)², 2(w² - x²), (w + x)²): the degree-2 Bernstein basis of
u = (x + w)/(2w) scaled by 4w², non-negative and summing to 4w² whatever x (the "Bézier
mechanism" of DPSQL+, Sato et al., arXiv 2602.22699). A group's totals b0, b1, b2 are linear in
its count N, centred sum S and centred sum of squares Q, and give them back:

    N = (b0 + b1 + b2)/(4w²),  S = (b2 - b0)/(4w),  Q = (b0 + b2 - b1)/4,

so the variance estimator and its interval are those of Q, S and N (``spreads``). Measured apart,
Q, S and N have L1 sensitivities C·w², C·w and C and take three shares of epsilon; the vector
has L1 sensitivity 4w²·C as a whole (each cell's three coordinates are non-negative and sum to
4w² per row: ``dpsql.bound.values.bernstein``), so one share noises all three (i.i.d. discrete
Laplace of scale Δ/ε_j on each: the Laplace mechanism on a vector, Dwork and Roth 2014, Theorem
3.6). Measured at equal epsilon, about 0.56 times the error of the three-way split for VAR_POP
(``benchmarks/variance_mechanisms.py``; benchmarks/README.md).

Where: the Laplace (the advantage is an L1 one; under zCDP the split composes in L2 and is as
good or better, measured), no accuracy target (its solver budgets each measurement alone), no
sample, and only for a value whose Q, S and N no other aggregate of the query reads (AVG(x)
beside VAR(x) shares S and N: measured apart they serve both). A group's exact total must fit
38 digits on any data (``dpsql.plan.sensitivity``), else Q, S and N as before. All public: the
query, the options and the bounds.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import replace
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from dpsql.bound.grid import Grid
from dpsql.bound.specs import MeasurementSpec
from dpsql.plan.estimators import FloatArray
from dpsql.plan.plans import Estimate, Measurement, QueryOptions, fits_exactly

SPREADS = ("var_pop", "var_samp", "stddev_pop", "stddev_samp")
# Relative widening of an interval's ends for float rounding: the bounds and the estimator are
# evaluated by different float operations, each within a few ulps (2**-52) of its terms.
ROUNDING = 1e-12


def applies(options: QueryOptions) -> bool:
    """Whether the query's options admit the joint measurement (module docstring)."""
    return (
        options.joint_moments
        and options.mechanism == "laplace"
        and options.declared is None
        and options.budgets is None
        and options.sample is None
    )


def adopt(
    specs: list[MeasurementSpec], estimates: Sequence[Estimate], grids: Sequence[Grid | None],
    c: int,
) -> tuple[list[MeasurementSpec], list[Estimate]]:  # fmt: skip
    """The specs and estimates with each eligible value's Q, S and N replaced by its three
    Bernstein coordinates (module docstring); ``grids``: each value's grid, ``c``: C."""
    users: dict[int, set[int]] = {}
    for e, est in enumerate(estimates):
        for j in est.measurements:
            users.setdefault(j, set()).add(e)
    chosen: dict[tuple[int, ...], int] = {}  # a (Q, S, N) triple -> its value
    for est in estimates:
        triple = est.measurements
        if est.kind not in SPREADS or triple in chosen:
            continue
        value = specs[triple[0]].value
        grid = grids[value] if value is not None else None
        readers = set().union(*(users[j] for j in triple))
        if (
            grid is None
            or not fits_exactly(c * 4 * grid.width**2)
            or any(estimates[e].measurements != triple for e in readers)
        ):
            continue
        chosen[triple] = value  # type: ignore[assignment]
    if not chosen:
        return specs, list(estimates)
    dropped = {j for triple in chosen for j in triple}
    kept = [s for j, s in enumerate(specs) if j not in dropped]
    index = {j: kept.index(s) for j, s in enumerate(specs) if j not in dropped}
    parts: dict[tuple[int, ...], tuple[int, ...]] = {}
    for triple, value in chosen.items():
        start = len(kept)
        kept += [MeasurementSpec("bernstein", value, part=p) for p in range(3)]
        parts[triple] = (start, start + 1, start + 2)
    out = []
    for est in estimates:
        if est.measurements in parts:
            out.append(replace(est, measurements=parts[est.measurements], joint=True))
        else:
            out.append(replace(est, measurements=tuple(index[j] for j in est.measurements)))
    return kept, out


def forms(w: int) -> tuple[tuple[Fraction, ...], tuple[Fraction, ...]]:
    """The coefficients on (b0, b1, b2) of the centred sum S and of the count N, exact (what
    ``moments`` computes in floats): S = (b2 - b0)/(4w), N = (b0 + b1 + b2)/(4w²)."""
    s = (Fraction(-1, 4 * w), Fraction(0), Fraction(1, 4 * w))
    return s, (Fraction(1, 4 * w * w),) * 3


def moments(b: Sequence[npt.ArrayLike], w: int) -> tuple[FloatArray, FloatArray, FloatArray]:
    """(Q, S, N) from the coordinates (b0, b1, b2), all in their integer units."""
    b0, b1, b2 = (np.asarray(x, dtype=np.float64) for x in b)
    return (b0 + b2 - b1) / 4.0, (b2 - b0) / (4.0 * w), (b0 + b1 + b2) / (4.0 * w * w)


@functools.lru_cache(maxsize=1024)
def l1_radius(scale: Fraction, confidence: float) -> int:
    """An integer t with P(|Z0| + |Z1| + |Z2| <= t) >= ``confidence`` for three independent
    discrete Laplace noises of ``scale`` (public: a function of the noise and the confidence).

    With p = exp(-1/scale), |Z| is 0 with probability (1 - p)/(1 + p) and otherwise 1 + G, G
    geometric (P(G = j) = (1 - p)·p^j), so |Z| <= 1 + G in distribution (P(|Z| >= m) =
    2p^m/(1 + p) <= p^(m - 1)), and the sum <= 3 + G1 + G2 + G3. G1 + G2 + G3 >= y exactly when
    at most 2 of the first y + 2 trials fail: P = Σ_{f <= 2} C(y + 2, f)(1 - p)^f p^(y + 2 - f).
    So t = y + 2 for the least y whose tail is at most 1 - confidence (less a 1e-9 share for
    float rounding): P(sum > t) <= P(G1 + G2 + G3 >= y)."""
    log_p = -1.0 / float(scale)
    odds = -math.expm1(log_p) / math.exp(log_p)  # (1 - p)/p, exact for large scales
    goal = (1.0 - confidence) * (1.0 - 1e-9)

    def tail(y: int) -> float:
        n = y + 2  # p^n·(1 + n·(1-p)/p + C(n, 2)·((1-p)/p)²)
        return math.exp(n * log_p) * (1.0 + n * odds + n * (n - 1) / 2.0 * odds**2)

    low, high = 0, 1
    while tail(high) > goal:
        low, high = high, high * 2
    while low < high:  # the least y with tail(y) <= goal
        mid = (low + high) // 2
        if tail(mid) <= goal:
            high = mid
        else:
            low = mid + 1
    return high + 2


def moment_widths(t: float, w: int) -> tuple[float, float, float]:
    """Half-widths of Q, S and N when the coordinates' noise z has |z0| + |z1| + |z2| <= t:
    the largest of a linear form a·z over that ball is t·max|a_i|, so |ΔQ| = |z0 + z2 - z1|/4
    <= t/4, |ΔS| = |z2 - z0|/(4w) <= t/(4w), |ΔN| = |z0 + z1 + z2|/(4w²) <= t/(4w²)."""
    return t / 4.0, t / (4.0 * w), t / (4.0 * w * w)


def one_scale(parts: Sequence[Measurement]) -> Fraction | None:
    """The discrete Laplace scale every coordinate's noise has, each its own draw (as released,
    or served from one release: a combination of one term of weight 1); None otherwise (a
    combination of several releases' noises, or scales that differ)."""
    scales = set()
    for m in parts:
        if m.combined is None:
            scales.add(m.scale)
        elif len(m.combined) == 1 and len(m.combined[0]) == 1 and m.combined[0][0][0] == 1:
            scales.add(m.combined[0][0][1])
        else:
            return None
    return scales.pop() if len(scales) == 1 else None


def cube_widths(k: tuple[float, float, float], w: int) -> tuple[float, float, float]:
    """Half-widths of Q, S and N when each coordinate's noise is within its own ±k_i: |ΔQ| <=
    (k0 + k1 + k2)/4, |ΔS| <= (k0 + k2)/(4w), |ΔN| <= (k0 + k1 + k2)/(4w²)."""
    k0, k1, k2 = k
    return (k0 + k1 + k2) / 4.0, (k0 + k2) / (4.0 * w), (k0 + k1 + k2) / (4.0 * w * w)


def vertex_range(
    b: Sequence[npt.ArrayLike], t: float, w: int
) -> tuple[FloatArray, FloatArray, npt.NDArray[np.bool_]]:
    """The population variance's range, in (g/2)², over the coordinates b + z with
    |z0| + |z1| + |z2| <= t (an octahedron), and where it is valid (every point has a count
    N >= 1, where the estimator's floor at 1 is idle); elsewhere the (Q, S, N) box alone.

    With B = b0 + b1 + b2, s = (b0 + b2)/B and d = (b2 - b0)/B, the variance Q/N - (S/N)² is
    w²·(2s - 1 - d²). B is linear, least at a vertex: where it is positive throughout, the map
    b -> (s, d) is a perspective, which sends the octahedron to the convex hull of its 6
    vertices' images; 2s - 1 - d² is concave in (s, d), so its least value on that hull is at
    one of those 6 points (exact), and its largest is at most 2·max s - 1 - (min |d|)², with
    min |d| = 0 where the images' d straddle 0 (sound). Widened by ``ROUNDING`` of the terms'
    size for float rounding."""
    base = [np.asarray(x, dtype=np.float64) for x in b]
    ss, dd, gg, totals = [], [], [], []
    for axis in range(3):
        for step in (-t, t):
            v0, v1, v2 = (x + step if i == axis else x for i, x in enumerate(base))
            total = v0 + v1 + v2
            safe = np.where(total > 0.0, total, 1.0)
            s_, d_ = (v0 + v2) / safe, (v2 - v0) / safe
            ss.append(s_)
            dd.append(d_)
            gg.append(2.0 * s_ - 1.0 - d_ * d_)
            totals.append(total)
    valid = np.min(totals, axis=0) >= 4.0 * w * w
    d_lo, d_hi = np.min(dd, axis=0), np.max(dd, axis=0)
    nearest = np.where((d_lo <= 0.0) & (d_hi >= 0.0), 0.0, np.minimum(d_lo**2, d_hi**2))
    scale = float(w) * float(w)
    low = np.min(gg, axis=0) * scale
    high = (2.0 * np.max(ss, axis=0) - 1.0 - nearest) * scale
    slack = ROUNDING * 3.0 * scale
    return low - slack, high + slack, valid


__all__ = [
    "SPREADS",
    "adopt",
    "applies",
    "cube_widths",
    "forms",
    "l1_radius",
    "moment_widths",
    "moments",
    "one_scale",
    "vertex_range",
]
