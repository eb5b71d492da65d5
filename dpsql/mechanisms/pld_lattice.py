"""The discrete Laplace and the discrete Gaussian as privacy loss distributions on their lattice.

A measurement f with integer values, moved by one unit (added or removed) by an integer shift s
with |s| <= Delta on ONE coordinate, is released as f + N: N the discrete Laplace of scale t
(pmf proportional to e^(-|x|/t)) or the discrete Gaussian N_Z(0, sigma^2) (pmf proportional to
e^(-x^2/(2 sigma^2)) on all of Z, not truncated: Canonne, Kamath, Steinke 2020, Definition 1).

**One pair serves every neighbour and both directions.** Both pmfs p are symmetric and
log-concave on Z: the increments d(x) = ln p(x) - ln p(x - 1) are nonincreasing in x. For an
integer s > 0, ln p(x - s) - ln p(x) = -(d(x) + d(x - 1) + ... + d(x - s + 1)) is then
nondecreasing in x: the translates N + s have a monotone likelihood ratio. By Neyman-Pearson
(Karlin-Rubin), at every level alpha the most powerful test of N against N + s rejects above a
threshold c (with probability gamma at c), and c and gamma depend on alpha and N only, not on s.
Its type II error b(s) = P(N + s < c) + (1 - gamma) P(N + s = c) is nonincreasing in s:
b(s + 1) = P(N + s < c - 1) + (1 - gamma) P(N + s = c - 1) <= P(N + s < c) <= b(s). So the
trade-off function of (N, N + Delta) is below that of (N, N + s) for 0 <= s <= Delta, and by
Blackwell's theorem (Dong, Roth, Su 2022, Theorem 2.10) (N, N + s) is a post-processing of
(N, N + Delta): each of its hockey-stick divergences, alone or composed, is at most that of
(N, N + Delta). Negative shifts and the other direction (Q against P: add instead of remove)
are the same pair, N being symmetric: x -> -x maps (N, N - s) to (N, N + s), and x -> s - x maps
(N + s, N) to (N, N + s). k such measurements, chosen adaptively, are dominated by the k-fold
product of the pair (Dong, Roth, Su 2022, Theorem 3.2). With several coordinates a shift can be
spread over them, which this argument does not cover: such events get no lattice PLD here.

**The PLD.** For the pair (P, Q) = (N, N + Delta) and the loss L(y) = ln P(y)/Q(y),
delta(eps) = sum_y (P(y) - e^eps Q(y))_+ = E_P[(1 - e^(eps - L))_+] (the outcomes with P(y) = 0
add nothing), so delta is a function of the law of L under P alone; for a product pair L is the
sum of independent copies, whose law is the convolution. The losses lie on a lattice:
(|y - Delta| - |y|)/t (Laplace: Delta + 1 values, 2/t apart) and (Delta^2 - 2 Delta y)/(2 sigma^2)
(Gaussian: Delta/sigma^2 apart). ``LatticePld`` holds P's masses at the losses
``offset + unit * i`` (exact rationals) and at the infinite loss.

**Every approximation is pessimistic** (it can only raise every delta(eps)), since
(1 - e^(eps - L))_+ is nondecreasing in L, and the masses enter linearly with nonnegative
weights, alone and under convolution:

* masses are upper bounds (computed values nudged up by ``MASS_SLACK``); the discrete
  Gaussian's normaliser is its sum over the window kept, below the full sum, and the mass
  outside the window (a geometric tail bound) goes to the infinite loss;
* the least likely tails of a composition (at most ``TAIL`` of mass per step) move up: the
  lowest losses to the lowest loss kept, the highest to the largest loss the composition can
  reach (so a pure-DP composition keeps delta exactly 0 above its epsilon);
* a lattice too fine to compose fast is coarsened by "connect the dots" (Doroshenko, Ghazi,
  Kamath, Kumar, Manurangsi 2022): a mass at loss l between grid points g < g' is split between
  them keeping P's and Q's masses (p_lo + p_hi = p, p_lo e^-g + p_hi e^-g' = p e^-l), a
  mean-preserving spread of V = e^-L; v -> (1 - e^eps v w)_+ is convex, so by Jensen every
  delta, composed too, goes up (the split is rounded towards g');
* losses are rounded up to floats, and every float sum and product is of nonnegative terms: a
  quantity made by n of them is within a factor (1 + gamma_n), gamma_n = n u / (1 - n u),
  u = 2^-53, of its exact value (Higham 2002, Lemma 3.1 and section 3.1); each array carries
  its count ``operations`` and ``delta`` multiplies by the bound, so the figure is rigorous.
"""

from __future__ import annotations

import functools
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt

__all__ = [
    "MAX_ATOMS",
    "MAX_SENSITIVITY",
    "MAX_SIGMA2",
    "Composition",
    "LatticePld",
    "discrete_gaussian_pld",
    "discrete_laplace_pld",
]

_Floats = npt.NDArray[np.float64]

UNIT = 2.0**-53
"""The unit roundoff of binary64 (round to nearest)."""
MASS_SLACK = 1e-12
"""Relative nudge that makes a mechanism's computed masses upper bounds: each comes from a few
correctly rounded operations and one ``exp`` of an argument below 61 in size (a relative error
below 1e-13 even for a 4-ulp ``exp``), and the normaliser from ``math.fsum``."""
UNDERFLOW = 1e-300
"""Absolute bound on what underflow can lose: each product below 2^-1022 loses at most 2^-1075,
and no composition here makes 10^20 of them."""
TAIL = 1e-21
"""Mass of the least likely losses moved to the infinite loss at each step of a composition."""
MAX_ATOMS = 1024
"""Atoms of one mechanism's PLD on the composition grid; a finer lattice is coarsened."""
MAX_SIGMA2 = Fraction(10**10)
"""Largest variance whose pmf is summed point by point (22 sigma + 1 points, here 2.2e6)."""
MAX_SENSITIVITY = 10**6
"""Largest shift whose discrete Laplace losses are listed one by one."""
_WINDOW = 11
"""The discrete Gaussian's window is [-B, B] with B = ceil(11 sigma): outside it lies less than
e^(-60) of the mass."""


def _gamma(n: int) -> float:
    """Higham's gamma_n = n u / (1 - n u), rounded up; the bound needs n u < 1."""
    nu = n * UNIT
    if nu >= 0.01:
        raise ValueError("too many float operations for the error bound")
    return nu / (1 - nu) * (1 + 4 * UNIT)


def _up(x: float, ops: int = 2) -> float:
    """x, nonnegative, made an upper bound of the result of ``ops`` rounded operations (an exact
    0 stays 0: no operation on zeros rounds)."""
    return x * (1 + _gamma(ops)) + 5e-324 if x > 0 else 0.0


def _losses(offset: Fraction, unit: Fraction, n: int) -> _Floats:
    """offset + unit * i for i < n, each rounded UP to a float (exact rationals in between)."""
    den = offset.denominator * unit.denominator // math.gcd(offset.denominator, unit.denominator)
    first, step = int(offset * den), int(unit * den)
    if max(abs(first), abs(first + step * (n - 1)), den) < 2**53:
        nums = first + step * np.arange(n, dtype=np.int64)  # exact integers in int64
        # Integers below 2^53 are exact floats, and IEEE division is correctly rounded.
        near = nums.astype(np.float64) / float(den)
    else:
        near = np.array([(first + step * i) / den for i in range(n)], dtype=np.float64)
    return np.nextafter(near, np.inf)  # one ulp up: at least the exact loss


@dataclass(frozen=True, eq=False)
class LatticePld:
    """P's masses at the losses ``offset + unit * i``, at the loss ``ceiling`` (``top``: what
    the tails of compositions moved up to the largest loss they can reach) and at +infinity
    (module docstring).

    ``operations`` bounds the rounded float operations behind each mass (Higham's count): the
    exact values lie within a factor 1 + gamma(operations) of ``masses``. ``top`` and
    ``infinity`` are upper bounds outright; ``ceiling`` is at least every loss of the lattice."""

    offset: Fraction
    unit: Fraction
    masses: _Floats
    infinity: float
    operations: int
    top: float = 0.0
    ceiling: Fraction = Fraction(0)

    @functools.cached_property
    def losses(self) -> _Floats:
        return _losses(self.offset, self.unit, len(self.masses))

    @functools.cached_property
    def total(self) -> float:
        """An upper bound on the total mass, the infinite loss's included."""
        finite = float(np.sum(self.masses)) * (1 + _gamma(self.operations + len(self.masses)))
        return _up(finite + self.top + self.infinity, 3)

    def delta(self, epsilon: float) -> float:
        """An upper bound on the hockey-stick divergence of the pair at ``epsilon``: the sum of
        p (1 - e^(eps - l)) over the losses l above eps, plus the infinite mass; exactly 0 when
        no loss is above eps (which atoms are is decided in exact arithmetic)."""
        exact = Fraction(epsilon)
        above = max(0, min(len(self.masses), math.floor((exact - self.offset) / self.unit) + 1))
        # -expm1(eps - l) for l > eps: nonnegative; its relative error is a few ulps whatever
        # the cancellation in eps - l (Sterbenz: a difference of close floats is exact).
        weights = -np.expm1(epsilon - self.losses[above:])
        finite = float(np.dot(self.masses[above:], weights))
        # Each term: the mass's operations, 5 for the weight (subtraction, a 4-ulp expm1), one
        # product; then a sum of as many terms (Higham 2002, (3.5)).
        bound = finite * (1 + _gamma(self.operations + 6 + len(self.masses) - above))
        topped = self.top > 0 and self.ceiling > exact
        if topped:
            ceiling = float(_losses(self.ceiling, Fraction(1), 1)[0])
            bound += _up(self.top * -math.expm1(epsilon - ceiling), 8)
        if not topped and self.infinity == 0 and above == len(self.masses):
            return 0.0  # no loss above epsilon: exactly 0, no rounding to cover
        # UNDERFLOW: what products below the smallest subnormal can lose, absolutely.
        return min(1.0, _up(bound + self.infinity) + UNDERFLOW)

    def epsilon(self, delta: float) -> float:
        """The smallest epsilon >= 0 (to a relative 1e-12, rounded up) whose ``delta`` is at
        most ``delta``; infinity when the infinite mass alone exceeds it."""
        if self.delta(0.0) <= delta:
            return 0.0
        # At and above the ceiling, delta(eps) is the infinite mass alone.
        near = float(self.ceiling)
        lo, hi = 0.0, near if self.delta(near) <= delta else math.nextafter(near, math.inf)
        if hi <= 0 or self.delta(hi) > delta:
            return math.inf
        while hi - lo > 1e-12 * hi:
            mid = (lo + hi) / 2
            if mid in (lo, hi):
                break
            lo, hi = (lo, mid) if self.delta(mid) <= delta else (mid, hi)
        return hi

    def compose(self, other: LatticePld) -> LatticePld:
        """The PLD of the product pair: masses convolved (``np.convolve`` sums products directly,
        never by FFT); of the least likely tails (``TAIL``), the lowest losses are moved up to
        the lowest one kept and the highest to the ceiling."""
        if self.unit != other.unit:
            raise ValueError("PLDs on different lattices")
        masses = np.convolve(self.masses, other.masses)
        # A sum of len(other) products of the two inputs (Higham 2002, (3.5)).
        operations = self.operations + other.operations + len(other.masses)
        low, high = _tails(masses)
        slack = 1 + _gamma(operations + len(masses))  # a sum of the computed masses
        kept = masses[low : len(masses) - high].copy()
        kept[0] += _up(float(masses[:low].sum()) * slack)  # one more rounding: operations + 1
        cut = _up(float(masses[len(masses) - high :].sum()) * slack)
        # Pairs with a top (or an infinite) part lie at most at the sum of the ceilings (or at
        # infinity); the finite totals bound the partners' masses. A pair of a top and an
        # infinite part is counted in both, which only adds mass.
        top = _up(self.top * other.total + other.top * self.total + cut, 8)
        infinity = _up(self.infinity * other.total + other.infinity * self.total, 8)
        return LatticePld(
            self.offset + other.offset + low * self.unit,
            self.unit,
            kept,
            infinity,
            operations + 1,
            top,
            self.ceiling + other.ceiling,
        )

    def coarsened(self, factor: int) -> LatticePld:
        """The PLD on every ``factor``-th point of the lattice, by connect-the-dots."""
        if factor == 1:
            return self
        remainder = np.arange(factor, dtype=np.float64)
        wide = float(self.unit * factor)
        # share of mass to the upper point: (1 - e^-d)/(1 - e^-h), d = r unit, h = factor unit
        share = np.expm1(-remainder * float(self.unit)) / math.expm1(-wide)
        # A few ulps of error in the share, rounded towards the upper point.
        high = np.minimum(1.0, share * (1 + 1e-12))
        low = np.maximum(0.0, 1 - share * (1 - 1e-12))
        index = np.arange(len(self.masses))
        cell, rest = index // factor, index % factor
        size = int(cell[-1]) + 2
        masses = np.asarray(np.bincount(cell, self.masses * low[rest], size), dtype=np.float64)
        masses += np.bincount(cell + 1, self.masses * high[rest], size)
        # Each point sums at most 2 factor products: one rounding each, one per addition.
        unit = self.unit * factor
        return LatticePld(
            self.offset,
            unit,
            masses,
            self.infinity,
            self.operations + 2 * factor + 2,
            self.top,  # moved up to the new ceiling
            max(self.ceiling, self.offset + unit * (size - 1)),
        )

    def fitted(self, atoms: int = MAX_ATOMS) -> LatticePld:
        """Coarsened, if need be, to at most ``atoms`` + 1 points."""
        n = len(self.masses)
        return self if n <= atoms else self.coarsened(-(-(n - 1) // (atoms - 1)))


def _tails(masses: _Floats) -> tuple[int, int]:
    """How many of the first and of the last masses sum to at most TAIL / 2 each."""
    if len(masses) <= 1:
        return 0, 0
    low = int(np.searchsorted(np.cumsum(masses), TAIL / 2, side="right"))
    high = int(np.searchsorted(np.cumsum(masses[::-1]), TAIL / 2, side="right"))
    low = min(low, len(masses) - 1)
    return low, min(high, len(masses) - 1 - low)


def identity(unit: Fraction) -> LatticePld:
    """The PLD of releasing nothing: loss 0 with mass 1."""
    return LatticePld(Fraction(0), unit, np.ones(1), 0.0, 0, 0.0, Fraction(0))


def discrete_laplace_pld(scale: Fraction, sensitivity: int) -> LatticePld:
    """The exact PLD of (N, N + Delta), N the discrete Laplace of ``scale``: losses
    (|y - Delta| - |y|)/t = (2j - Delta)/t, j = 0..Delta. With q = e^(-1/t) and
    p(y) = (1 - q)/(1 + q) q^|y|: j = Delta holds y <= 0 (mass 1/(1 + q)), j = 0 holds y >= Delta
    (mass q^Delta/(1 + q)), and 0 < y < Delta is j = Delta - y (mass p(y))."""
    if not 1 <= sensitivity <= MAX_SENSITIVITY or scale <= 0:
        raise ValueError("the discrete Laplace PLD needs scale > 0 and 1 <= sensitivity <= 10^6")
    inv = float(1 / scale)
    q = math.exp(-inv)
    centre = -math.expm1(-inv) / (1 + q)  # (1 - q)/(1 + q), without cancellation
    masses = np.empty(sensitivity + 1)
    y = np.arange(1, sensitivity, dtype=np.float64)
    masses[sensitivity - 1 : 0 : -1] = centre * np.exp(-y * inv)
    masses[sensitivity] = 1 / (1 + q)
    masses[0] = math.exp(-sensitivity * inv) / (1 + q)
    return LatticePld(
        Fraction(-sensitivity) / scale,
        2 / scale,
        masses * (1 + MASS_SLACK),
        0.0,
        0,
        0.0,
        Fraction(sensitivity) / scale,
    )


def discrete_gaussian_pld(sigma2: Fraction, sensitivity: int) -> LatticePld:
    """The PLD of (N, N + Delta), N = N_Z(0, sigma2) untruncated: losses
    (Delta^2 - 2 Delta x)/(2 sigma2) for x in the window [-B, B] (j = B - x on the lattice of
    unit Delta/sigma2), masses e^(-x^2/(2 sigma2)) over their sum in the window (below the full
    normaliser, so each mass is an upper bound); the outside goes to the infinite loss, by
    sum_{x > B} e^(-x^2/2s2) <= e^(-(B+1)^2/2s2) / (1 - e^(-(B+1)/s2)) on each side."""
    if not 1 <= sensitivity <= MAX_SENSITIVITY or not 0 < sigma2 <= MAX_SIGMA2:
        raise ValueError("the discrete Gaussian PLD needs 0 < sigma2 <= 1e10 and 1 <= shift <= 1e6")
    s2 = float(sigma2)
    bound = math.ceil(_WINDOW * math.sqrt(s2))
    x = np.arange(-bound, bound + 1, dtype=np.float64)  # exact: |x| < 2^53, x * x < 2^53
    weights = np.exp(-(x * x) / (2 * s2))
    norm = math.fsum(weights)
    b1 = bound + 1.0
    tail = 2 * math.exp(-b1 * b1 / (2 * s2)) / -math.expm1(-b1 / s2)
    masses = weights[::-1] / norm * (1 + MASS_SLACK)  # j = B - x: masses[j] = p(B - j)
    return LatticePld(
        Fraction(sensitivity**2 - 2 * sensitivity * bound) / (2 * sigma2),
        Fraction(sensitivity) / sigma2,
        masses,
        tail / norm * (1 + MASS_SLACK),
        0,
        0.0,
        Fraction(sensitivity**2 + 2 * sensitivity * bound) / (2 * sigma2),  # x = -B
    )


class Composition:
    """The k-fold compositions of one PLD, each folded from the (k - 1)-fold one by one step:
    the same floats for a given k whatever was asked before (a cache only skips recomputing
    them), so a filter's incremental and stateless decisions agree exactly."""

    def __init__(self, step: LatticePld, kept: int = 32):
        self.step = step
        self._kept: OrderedDict[int, LatticePld] = OrderedDict({0: identity(step.unit)})
        self._size = kept
        self._lock = threading.Lock()

    def power(self, count: int) -> LatticePld:
        with self._lock:
            start = max(k for k in self._kept if k <= count)
            pld = self._kept[start]
            for _ in range(start, count):
                pld = pld.compose(self.step)
            self._kept[count] = pld
            self._kept.move_to_end(count)
            while len(self._kept) > self._size:
                oldest = next(k for k in self._kept if k != 0)
                del self._kept[oldest]
            return pld
