"""Optimal composition (Kairouz-Oh-Viswanath), exact or approximated (Murtagh-Vadhan).

An odometer figure only: the optimal composition theorem holds for mechanisms chosen adaptively
but with their privacy parameters fixed before the first query (Kairouz, Oh, Viswanath 2015;
Rogers, Roth, Ullman, Vadhan 2016 show that adaptive parameters break it), so
``fixed_in_advance = True`` and it never decides admission.

* **Homogeneous** k x epsilon-DP (KOV 2015, Theorem 3.3; Murtagh, Vadhan 2016, Theorem 1.5):
  the optimal delta at epsilon_total is the hockey-stick divergence of k-fold randomized response,
      delta = sum_{l=0}^{k} C(k, l) max(0, e^{(k-l) eps} - e^{eps_total + l eps}) / (1 + e^eps)^k,
  which at epsilon_total = (k - 2i) eps is KOV's delta_i. Each event's own delta_i enters as
  1 - (1 - delta')prod(1 - delta_i) <= delta' + sum delta_i (KOV Theorem 3.3; MV Lemma 3.3).
* **Heterogeneous** (exact is #P-complete, MV 2016 Theorem 1.6): Murtagh and Vadhan's algorithm
  (section 5) rounds every eps_i UP to a multiple of a grid eta and computes the distribution of
  the composed randomized-response privacy loss by dynamic programming on that grid. Rounding up
  only enlarges the class of mechanisms, so the figure is never below the optimum; rounding DOWN
  gives a figure never above it, and the gap of the two is the stated additive error of each
  answer (``Bracket.error``: a certified bracket rather than MV's a-priori eta). When every eps_i
  is a multiple of one rational grid small enough (the gcd of the fractions), the rounding is
  exact and so is the figure.
* **Exponential mechanisms** are epsilon-bounded-range, a smaller class than epsilon-DP
  (``ranged.py``). k identical ones compose exactly by Dong, Durfee, Rogers 2020, Theorem 3,
  which holds for mechanisms fixed in advance (adaptively chosen exponential mechanisms can lose
  more, their section 6): the report's "as if fixed in advance" is what it needs. Beside other
  events, or with several epsilons, no optimum is computable; they enter MV as pure epsilon
  (never below the optimum), and as randomized response at epsilon/2, one bounded-range pair,
  for the lower end. When one group of identical ones holds most of the history's sum of
  eps^2, it is also composed apart by Theorem 3, in sequence with the rest (``_split``), and
  the smaller figure is kept: an exponential history with a few other events reads close to
  its own optimum, not to the pure-epsilon figure.
* **When the events' own deltas use up delta** (or the composition cannot meet what they
  leave), the figure is the basic sum of the epsilons, which holds at delta = sum delta_i as
  the basic figure does, with no certified lower end; never infinity.

Probabilities are computed in log space; binomial tails below ``TAIL`` are moved to an infinite
loss (pessimistic); deltas are rounded up by ``1 + ROUND_UP`` and epsilons found by bisection
keep the side whose delta meets the target.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt
from scipy.special import gammaln

from dpsql.accounting.theorems.advanced import ROUND_UP, approx_dp
from dpsql.accounting.theorems.base import GroupCache
from dpsql.accounting.theorems.ranged import br_delta, br_epsilon
from dpsql.errors import ParameterError
from dpsql.mechanisms.events import Event

__all__ = ["Bracket", "OptimalAccountant", "kov_delta", "kov_epsilon", "murtagh_vadhan"]

TAIL = 1e-30
"""Binomial mass dropped per group (moved to an infinite privacy loss: pessimistic)."""

MAX_GRID_POINTS = 200_000
"""Largest support (in grid steps of one side) of the dynamic program."""

_Floats = npt.NDArray[np.float64]


def _hockey_stick(losses: _Floats, probs: _Floats, inf_mass: float, epsilon: float) -> float:
    """delta(epsilon) = P(L = inf) + E[(1 - e^{epsilon - L})_+] for a discrete loss L."""
    above = losses > epsilon
    value = inf_mass + float(np.dot(probs[above], -np.expm1(epsilon - losses[above])))
    return min(1.0, value * (1 + ROUND_UP))


def _binomial(m: int, epsilon: float) -> tuple[npt.NDArray[np.int64], _Floats, float]:
    """Randomized response with ``epsilon``, m times: the number j of 'minus' outcomes, its pmf
    (tails below TAIL dropped), and the dropped mass."""
    j = np.arange(m + 1, dtype=np.int64)
    log_p = -math.log1p(math.exp(-epsilon))  # P(loss = +epsilon) = e^eps / (1 + e^eps)
    log_q = -math.log1p(math.exp(epsilon))
    log_pmf = gammaln(m + 1) - gammaln(j + 1) - gammaln(m - j + 1) + (m - j) * log_p + j * log_q
    pmf = np.exp(log_pmf)
    keep = log_pmf > math.log(TAIL)
    return j[keep], pmf[keep], float(pmf[~keep].sum())


def kov_delta(epsilon: float, k: int, epsilon_total: float) -> float:
    """KOV 2015 Theorem 3.3: the optimal delta of k-fold epsilon-DP composition at epsilon_total."""
    if k < 0 or epsilon < 0:
        raise ParameterError("kov_delta needs k >= 0 and epsilon >= 0")
    if k == 0 or epsilon == 0:
        return 0.0
    j, pmf, dropped = _binomial(k, epsilon)
    losses = np.asarray((k - 2 * j) * epsilon, dtype=np.float64)
    return _hockey_stick(losses, pmf, dropped, epsilon_total)


def _smallest_epsilon(delta_at: Callable[[float], float], delta: float, upper: float) -> float:
    """Smallest epsilon in [0, upper] (to 1e-12 relative) with delta_at(epsilon) <= delta."""
    if delta_at(0.0) <= delta:
        return 0.0
    lo, hi = 0.0, upper
    if delta_at(hi) > delta:
        return math.inf
    while hi - lo > 1e-12 * max(1.0, hi):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if delta_at(mid) <= delta else (mid, hi)
    return hi


class _Curve:
    """The hockey-stick curve of a discrete loss, for the search of the smallest epsilon: each
    step of the bisection reads suffix sums (O(log n): delta(eps) = P(inf) + sum_{l > eps} p_l
    - e^eps sum_{l > eps} p_l e^-l), and the final bracket is certified with the exact sum
    (``_hockey_stick``, no cancellation); should the two disagree there, the bisection is redone
    on the exact curve. So the answer meets the same specification as ``_smallest_epsilon`` on
    the exact curve, in two exact evaluations instead of ~90."""

    def __init__(self, losses: _Floats, probs: _Floats, inf_mass: float):
        order = np.argsort(losses, kind="stable")
        self.losses, self.probs, self.inf_mass = losses[order], probs[order], inf_mass
        # Only losses above epsilon >= 0 are ever summed: e^-l <= 1 there, no overflow.
        weighted = self.probs * np.exp(-np.maximum(self.losses, 0.0))
        self.mass = np.append(np.cumsum(self.probs[::-1])[::-1], 0.0)
        self.weighted = np.append(np.cumsum(weighted[::-1])[::-1], 0.0)

    def exact(self, epsilon: float) -> float:
        return _hockey_stick(self.losses, self.probs, self.inf_mass, epsilon)

    def fast(self, epsilon: float) -> float:
        k = int(np.searchsorted(self.losses, epsilon, side="right"))
        value = self.inf_mass + float(self.mass[k]) - math.exp(epsilon) * float(self.weighted[k])
        return min(1.0, max(0.0, value) * (1 + ROUND_UP))

    def smallest(self, delta: float, upper: float) -> float:
        """Smallest epsilon in [0, upper] (to 1e-12 relative) with delta(epsilon) <= delta."""
        if self.exact(0.0) <= delta:
            return 0.0
        if self.exact(upper) > delta:
            return math.inf
        lo, hi = 0.0, upper
        while hi - lo > 1e-12 * max(1.0, hi):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if self.fast(mid) <= delta else (mid, hi)
        if self.exact(hi) <= delta < self.exact(lo):
            return hi  # certified on the exact curve: the smallest epsilon lies in (lo, hi]
        return _smallest_epsilon(self.exact, delta, upper)


def kov_epsilon(epsilon: float, k: int, delta: float) -> float:
    """The smallest epsilon_total with kov_delta(epsilon, k, epsilon_total) <= delta."""
    if k < 0 or epsilon < 0:
        raise ParameterError("kov_delta needs k >= 0 and epsilon >= 0")
    if k == 0 or epsilon == 0:
        return 0.0
    j, pmf, dropped = _binomial(k, epsilon)
    losses = np.asarray((k - 2 * j) * epsilon, dtype=np.float64)
    return _Curve(losses, pmf, dropped).smallest(delta, k * epsilon * (1 + 1e-9))


@dataclass(frozen=True)
class _Loss:
    """A privacy-loss distribution on the grid: loss (lowest + i) * grid with prob probs[i]."""

    grid: float
    lowest: int
    probs: _Floats
    inf_mass: float

    def losses(self) -> _Floats:
        return np.asarray((self.lowest + np.arange(len(self.probs))) * self.grid, np.float64)

    def delta(self, epsilon: float) -> float:
        return _hockey_stick(self.losses(), self.probs, self.inf_mass, epsilon)

    def curve(self) -> _Curve:
        return _Curve(self.losses(), self.probs, self.inf_mass)


def _compose_rr(groups: Sequence[tuple[int, int]], grid: float) -> _Loss:
    """Dynamic program of MV 2016 section 5: compose randomized responses of eps = a * grid,
    m times each, for (a, m) in ``groups``."""
    acc, lowest, dropped = np.ones(1), 0, 0.0
    for a, m in groups:
        j, pmf, tail = _binomial(m, a * grid)
        dropped += tail
        shifts = 2 * a * (m - j)  # loss (m - 2j) a = -m a + shift
        out = np.zeros(len(acc) + 2 * a * m)
        for shift, weight in zip(shifts.tolist(), pmf.tolist(), strict=True):
            out[shift : shift + len(acc)] += weight * acc
        acc, lowest = out, lowest - a * m
        nonzero = np.flatnonzero(acc)
        acc, lowest = acc[nonzero[0] : nonzero[-1] + 1], lowest + int(nonzero[0])
    return _Loss(grid, lowest, acc, min(1.0, dropped))


@dataclass(frozen=True)
class Bracket:
    """An MV figure: ``epsilon`` (never below the optimum) and ``lower`` (never above it)."""

    epsilon: float
    lower: float

    @property
    def error(self) -> float:
        return self.epsilon - self.lower


def _grid(
    groups: Sequence[tuple[Fraction, int]], extra: Sequence[tuple[Fraction, int]] = ()
) -> Fraction:
    """The gcd of the epsilons (those of ``extra`` too) if it is coarse enough, else sum /
    MAX_GRID_POINTS (the sum over ``groups``)."""
    common = Fraction(0)
    for e, _ in [*groups, *extra]:
        common = Fraction(
            math.gcd(common.numerator * e.denominator, e.numerator * common.denominator),
            common.denominator * e.denominator,
        )
    total = sum((e * m for e, m in groups), Fraction(0))
    if common > 0 and total / common <= MAX_GRID_POINTS:
        return common
    return total / MAX_GRID_POINTS


def murtagh_vadhan(
    groups: Sequence[tuple[Fraction, int]],
    delta: float,
    grid: Fraction | None = None,
    lower_groups: Sequence[tuple[Fraction, int]] | None = None,
) -> Bracket:
    """Optimal composition of pure eps_i-DP mechanisms (eps_i, multiplicity) at ``delta``, on
    ``grid`` (default: the gcd of the eps_i, or sum / MAX_GRID_POINTS if that is finer).
    ``lower_groups``: the pure mechanisms whose composition gives the lower end, when it is not
    ``groups`` (a class holding them, never more than ``groups``: see ``OptimalAccountant``)."""
    groups = [(e, m) for e, m in groups if e > 0 and m > 0]
    if not groups:
        return Bracket(0.0, 0.0)
    below = groups if lower_groups is None else [(e, m) for e, m in lower_groups if e > 0]
    grid = _grid(groups, below) if grid is None else Fraction(grid)
    up = [(math.ceil(e / grid), m) for e, m in groups]  # rounding up: a larger class
    down = [(math.floor(e / grid), m) for e, m in below if m > 0]
    upper = _compose_rr(up, float(grid))
    lower = _compose_rr([(a, m) for a, m in down if a > 0], float(grid))
    top = float(sum(a * m for a, m in up) * grid) * (1 + 1e-9)
    return Bracket(upper.curve().smallest(delta, top), lower.curve().smallest(delta, top))


SPLIT_SHARE = 0.5
"""A mixed history's largest group of identical exponential mechanisms is composed apart
(``_split``) when it holds at least this share of the history's sum of eps^2."""

SPLIT_STEPS = (1.002, 1.005, 1.01, 1.02, 1.05, 1.1, 1.2, 1.5)
"""The group's epsilons tried, as multiples of its own figure at the whole delta."""


def _split(
    pure: Sequence[tuple[Fraction, int]], ranged: Sequence[tuple[Fraction, int]], target: float
) -> Bracket:
    """A mixed history as two parts in sequence, whose epsilons and deltas add (Dwork, Roth 2014,
    Theorem 3.16): its largest group of identical exponential mechanisms at (eps_a, delta_a) by
    DDR 2020 Theorem 3, the rest by MV (exponential mechanisms as pure eps) at target - delta_a;
    the best of a few splits. The group alone is a lower end (the other events' classes hold a
    mechanism that releases nothing). (inf, 0) unless the group holds SPLIT_SHARE of the
    history's sum of eps^2 (each split costs one evaluation of Theorem 3)."""
    weights = [float(e) ** 2 * m for e, m in [*pure, *ranged]]
    e, k = max(ranged, key=lambda g: float(g[0]) ** 2 * g[1])
    if float(e) ** 2 * k < SPLIT_SHARE * math.fsum(weights):
        return Bracket(math.inf, 0.0)
    rest = _merged(pure, [g for g in ranged if g != (e, k)])
    grid = _grid(rest)
    curve = _compose_rr([(math.ceil(x / grid), m) for x, m in rest], float(grid)).curve()
    top = float(sum(x * m for x, m in rest)) * (1 + 1e-9)
    ends = (kov_epsilon(float(e) / 2, k, target), kov_epsilon(float(e), k, target))
    alone = br_epsilon(float(e), k, target, ends)
    best = math.inf
    for step in SPLIT_STEPS:
        delta_a = br_delta(float(e), k, alone * step)
        if delta_a < target:
            best = min(best, alone * step + curve.smallest(target - delta_a, top))
    # ``alone`` meets the rounded-up delta: the group's optimum is at most 1e-12 below it
    return Bracket(best * (1 + ROUND_UP), alone * (1 - 1e-9))


@dataclass(frozen=True)
class _Classes:
    """A history as optimal composition reads it: multiplicities of the pure eps (an event's
    own (eps, delta) pair, ``approx_dp``) and of the bounded-range eps (``Event.bounded_range``:
    the exponential mechanism's), the events' own deltas summed (rounded up), and the basic sum
    of the epsilons (rounded up)."""

    pure: tuple[tuple[Fraction, int], ...]
    ranged: tuple[tuple[Fraction, int], ...]
    own: float
    basic: float


def _merged(*parts: Sequence[tuple[Fraction, int]]) -> list[tuple[Fraction, int]]:
    counts: dict[Fraction, int] = {}
    for part in parts:
        for e, m in part:
            counts[e] = counts.get(e, 0) + m
    return sorted(counts.items())


class OptimalAccountant:
    """KOV optimal composition (exact if homogeneous, else MV), the exponential mechanism's
    bounded range (DDR 2020, exact if homogeneous), as if fixed in advance."""

    name = "optimal"
    # KOV 2015 Thm 3.3 / Murtagh, Vadhan 2016: the optimum over parameters fixed in advance.
    fixed_in_advance = True

    def __init__(self) -> None:
        self._groups = GroupCache()  # a growing history is counted once, then only its news
        self._last: tuple[tuple[_Classes, float], Bracket] | None = None

    def _classes(self, history: Sequence[Event]) -> _Classes | None:
        pure: dict[Fraction, int] = {}
        ranged: dict[Fraction, int] = {}
        own, basic = Fraction(0), Fraction(0)
        for event, count in self._groups(history):
            pair = approx_dp(event)
            if pair is None:
                return None
            basic += count * pair[0]
            own += count * pair[1]
            if pair[0] == 0:
                continue  # no privacy loss: nothing to compose
            # A bounded-range event (the exponential mechanism) has a smaller class (ranged.py)
            ranged_at = event.bounded_range()
            if ranged_at is None:
                pure[pair[0]] = pure.get(pair[0], 0) + count
            else:
                ranged[ranged_at] = ranged.get(ranged_at, 0) + count
        return _Classes(
            tuple(sorted(pure.items())),
            tuple(sorted(ranged.items())),
            float(own) * (1 + ROUND_UP),
            float(basic) * (1 + ROUND_UP),
        )

    def bracket(self, history: Sequence[Event], delta: float) -> Bracket:
        """Figure and certified lower end; exact (zero width) for homogeneous histories.

        The events' own deltas are paid first: 1 - (1 - d')prod(1 - d_i) <= d' + sum d_i (KOV
        2015 Theorem 3.3; MV 2016 Lemma 3.3). When they leave nothing of ``delta``, or the
        composition cannot meet what they leave, the figure is the basic sum of the epsilons
        (Dwork, Roth 2014, Theorem 3.16: it holds at delta = sum d_i, as the basic figure does),
        with no certified lower end (0)."""
        classes = self._classes(history)
        if classes is None:
            return Bracket(math.inf, math.inf)
        if self._last is not None and self._last[0] == (classes, delta):
            return self._last[1]
        # 1 - (1 - d')prod(1 - d_i) <= d' + sum d_i (KOV 2015 Theorem 3.3; MV 2016 Lemma 3.3)
        found = self._compose(classes, delta - classes.own)
        if found.epsilon > classes.basic:
            # sum eps_i holds at delta = sum d_i (Dwork, Roth 2014, Theorem 3.16)
            found = Bracket(classes.basic, 0.0 if found.epsilon == math.inf else found.lower)
        self._last = ((classes, delta), found)
        return found

    @staticmethod
    def _compose(classes: _Classes, target: float) -> Bracket:
        """The composition of the history's pure and bounded-range parts at ``target``."""
        pure, ranged = classes.pure, classes.ranged
        if target <= 0:
            return Bracket(math.inf, math.inf)
        if not pure and not ranged:
            return Bracket(0.0, 0.0)
        if not pure and len(ranged) == 1:
            # DDR 2020 Theorem 3: exact for identical bounded-range mechanisms fixed in advance;
            # RR at eps/2 is one of them (a lower end), eps-BR implies eps-DP (an upper end).
            eps, k = float(ranged[0][0]), ranged[0][1]
            ends = (kov_epsilon(eps / 2, k, target), kov_epsilon(eps, k, target))
            value = br_epsilon(eps, k, target, ends)
            return Bracket(value, value)
        if not ranged and len(pure) == 1:
            value = kov_epsilon(float(pure[0][0]), pure[0][1], target)
            return Bracket(value, value)
        # Heterogeneous: MV 2016 (exact is #P-complete, MV Theorem 1.6; DDR 2020 give an exact
        # form for identical bounded-range mechanisms only). eps-BR lies in the eps-DP class, so
        # MV on it is never below the optimum; RR at eps/2 is eps-BR, so MV's lower end over it
        # is never above the optimum.
        halves = [(e / 2, m) for e, m in ranged]
        found = murtagh_vadhan(_merged(pure, ranged), target, lower_groups=_merged(pure, halves))
        if not ranged:
            return found
        split = _split(pure, ranged, target)
        return Bracket(min(found.epsilon, split.epsilon), max(found.lower, split.lower))

    def epsilon(self, history: Sequence[Event], delta: float) -> float:
        return self.bracket(history, delta).epsilon

    def delta(self, history: Sequence[Event], epsilon: float) -> float:
        classes = self._classes(history)
        if classes is None:
            return 1.0
        pure, ranged, own = classes.pure, classes.ranged, classes.own
        if not pure and not ranged:
            return min(1.0, own) if epsilon >= 0 else 1.0
        if not pure and len(ranged) == 1:
            return min(1.0, own + br_delta(float(ranged[0][0]), ranged[0][1], epsilon))
        if not ranged and len(pure) == 1:
            return min(1.0, own + kov_delta(float(pure[0][0]), pure[0][1], epsilon))
        pairs = _merged(pure, ranged)  # eps-BR within eps-DP: an upper bound
        grid = _grid(pairs)
        loss = _compose_rr([(math.ceil(e / grid), m) for e, m in pairs], float(grid))
        return min(1.0, own + loss.delta(epsilon))
