"""Privacy loss distributions: the tightest figure, and a filter for totally ordered families.

Numerics by Google's ``dp_accounting`` (0.6): pessimistic PLDs (Meiser, Mohammadi 2018;
Koskela, Jalko, Honkela 2020; "connect the dots", Doroshenko, Ghazi, Kamath, Kumar, Manurangsi
2022) on a grid of ``value_discretization_interval`` (every privacy loss rounded UP to a multiple
of it, so hockey-stick divergences are over-estimated, never under), composed by convolution
with tails of at most 1e-15 moved to an infinite loss.

How each event enters:

* continuous ``Gaussian``: never discretized. Gaussians compose exactly to one Gaussian with
  mu^2 = sum mu_i^2 (Dong, Roth, Su 2019, Corollary 3.3), and the hockey stick of that Gaussian
  composed with the discrete PLD L of all other events is, exactly,
      delta(eps) = P(L = inf) + sum_j P(L = l_j) delta_mu(eps - l_j),
      delta_mu(x) = Phi(-x/mu + mu/2) - e^x Phi(-x/mu - mu/2)   (Balle, Wang 2018, Theorem 8)
  (condition on the first output; the inner divergence is the Gaussian's at e^{eps - l_j}).
  A Gaussian-only history is therefore exactly its mu-GDP curve.
* ``DiscreteLaplace`` / ``DiscreteGaussian`` on one coordinate (a sensitivity of at most 1, or
  ``dimensions == 1``): their own PLDs on the lattice of their losses (``pld_lattice``: exact
  pmfs, the shift Delta proven to dominate every smaller one in both directions), put on the
  grid by "connect the dots". With several coordinates the shift may be spread over them, for
  which the 1-D PLD is not proven to dominate: a discrete Laplace enters as pure epsilon-DP
  (randomized response dominates every epsilon-DP mechanism, KOV 2015), a discrete Gaussian
  through its calibrated (epsilon, delta), else unbounded.
* ``Laplace`` (reference only): the one-dimensional Laplace PLD, as dp_accounting's LaplaceDpEvent.
* ``Exponential``: the least pair dominating every epsilon-BR mechanism (``ranged.py``; Dong,
  Durfee, Rogers 2020), put on the grid by connect-the-dots: valid for adaptively chosen
  exponential mechanisms, tighter than the pure-epsilon randomized response.
* pure, approximate and partition-selection events: the dominating randomized-response PLD of
  their (epsilon, delta), put on the grid by connect-the-dots. zCDP: unbounded.

Validity. Composing full privacy profiles is valid for parameters fixed in advance, so the
``PldAccountant`` figure is labelled ``fixed_in_advance``. As an admission rule it is valid only
for a family of mechanisms fixed before the first query and totally ordered under composition
(Regehr, Hu, Leeman, Manurangsi, Tholoniat, Lecuyer 2026, arXiv 2602.15815): ``PldFilter``
takes that family up front and refuses any event outside it.

Float noise. dp_accounting composes by FFT, whose rounding errors are absolute and of either
sign. Measured against the direct (rigorous, ``pld_lattice``) composition of the same grid pmfs,
at the epsilon where delta is 1e-9: 2,000 discrete Laplaces of epsilon 0.01 were 8.9e-5 low
relatively on dp_accounting's own pmf; on dpsql's pmfs, 3,000 of epsilon 0.005 were 1.1e-4 low
and 5,000 2.1e-4 low (2.1e-3 at 1e-10), 1,000 of epsilon 0.02 1.3e-5 low, others as much high;
every absolute error was below 2.1e-13, under 0.4 u k for k composed events (u = 2^-53). The
old margin, a relative 1e-9, covered none of it. Every figure from dp_accounting therefore adds
``FFT_NOISE`` k (20 times the worst seen) to delta, and solves for epsilon at delta less it
(tests/mechanisms/test_pld_lattice.py pins such histories): at 10,000 events that is 1.8e-11, 1.8%
of a delta of 1e-9. The PLD filter composes its one mechanism without FFT, rigorously.

Discretization (measured, 2 cores): 10,000 Laplace events of epsilon 0.01 give epsilon 4.87628
at delta 1e-6 with interval 1e-3 against 4.87626 at 1e-4 and 1e-5, with 47k grid points instead
of 491k (the interval sets the memory: long histories with small intervals are what exhausts
memory; the Gaussian part here costs no grid at all). Choose the interval at most a tenth of the
smallest per-event epsilon; each event's loss is rounded up by less than one interval.
"""

from __future__ import annotations

import functools
import math
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from scipy.special import log_ndtr

from dpsql.accounting.theorems.base import agreeing
from dpsql.accounting.theorems.ranged import bounded_range_masses
from dpsql.errors import ParameterError, UndeclaredMechanismError
from dpsql.mechanisms import pld_lattice
from dpsql.mechanisms.events import (
    ApproxDP,
    DiscreteGaussian,
    DiscreteLaplace,
    Event,
    Exponential,
    Gaussian,
    Laplace,
    LaplacePartitionSelection,
    PureDP,
)
from dpsql.mechanisms.events import describe as describe_event
from dpsql.mechanisms.pld_lattice import Composition, LatticePld

__all__ = ["PldAccountant", "PldFilter", "PldTally", "exact_pld", "gaussian_delta", "lattice_pld"]

ROUND_UP = 1e-12
"""Relative upward nudge on float parameters and results (Fractions become floats here)."""
FFT_NOISE = 8 * 2.0**-53
"""Absolute delta added per event composed by dp_accounting (FFT): 20 times the largest error
measured per event (module docstring)."""

_Floats = npt.NDArray[np.float64]
PLD = Any  # dp_accounting's PrivacyLossDistribution (untyped)


@functools.cache
def _dp_accounting() -> tuple[Any, Any]:
    """dp_accounting's PLD modules, imported on first use: with SciPy's signal package they take
    ~0.8 s, which every ``dpsql`` command would otherwise pay at start."""
    from dp_accounting.pld import pld_pmf, privacy_loss_distribution  # noqa: PLC0415

    return privacy_loss_distribution, pld_pmf


def _hi(x: Fraction | float) -> float:
    return float(x) * (1 + ROUND_UP)


def gaussian_delta(epsilon: float | _Floats, mu: float) -> Any:
    """delta(epsilon) of mu-GDP, exact (Balle, Wang 2018; Dong, Roth, Su 2019), rounded up."""
    x = np.asarray(epsilon, dtype=np.float64)
    first = np.exp(log_ndtr(-x / mu + mu / 2))
    second = np.exp(x + log_ndtr(-x / mu - mu / 2))
    return np.clip((first - second) * (1 + 1e-9), 0.0, 1.0)


def _shift(event: DiscreteLaplace | DiscreteGaussian) -> int | None:
    """The largest integer shift of ``event``'s one coordinate, or None when the event may move
    several coordinates (or its PLD is too large to list)."""
    one = event.sensitivity <= 1 or event.dimensions == 1
    shift = math.ceil(event.sensitivity)  # integer measurements: |shift| <= floor, ceil is safe
    if not one or not 1 <= shift <= pld_lattice.MAX_SENSITIVITY:
        return None
    if isinstance(event, DiscreteGaussian) and not event.sigma2 <= pld_lattice.MAX_SIGMA2:
        return None
    return shift


def lattice_pld(event: Event) -> LatticePld | None:
    """The PLD of a discrete Laplace or Gaussian on one coordinate on the lattice of its losses
    (``pld_lattice``; up to 2.2e6 points: its users keep what they make of it), or None for any
    other event."""
    if not isinstance(event, DiscreteLaplace | DiscreteGaussian):
        return None
    shift = _shift(event)
    if shift is None:
        return None
    if isinstance(event, DiscreteLaplace):
        return pld_lattice.discrete_laplace_pld(event.scale, shift)
    return pld_lattice.discrete_gaussian_pld(event.sigma2, shift)


def exact_pld(event: Event) -> bool:
    """Whether ``event`` enters the PLD as its own mechanism (not through an (epsilon, delta)
    pair): a continuous Gaussian, or a discrete mechanism with a lattice PLD."""
    if isinstance(event, DiscreteLaplace | DiscreteGaussian):
        return _shift(event) is not None
    return isinstance(event, Gaussian)


def _on_grid(pld: LatticePld, interval: float) -> PLD:
    """``pld`` on dp_accounting's grid (multiples of ``interval``) by connect-the-dots, each
    mass split between the grid points around its exact loss towards the upper one
    (``pld_lattice`` docstring: pessimistic, composed too)."""
    grid = Fraction(interval)  # the float's exact value
    start, step = pld.offset / grid, pld.unit / grid
    den = start.denominator * step.denominator
    first, stride = start.numerator * step.denominator, step.numerator * start.denominator
    n = len(pld.masses)
    if max(abs(first), abs(first + stride * (n - 1)), den) < 2**62:
        nums = first + stride * np.arange(n, dtype=np.int64)
        cells, rests = np.divmod(nums, den)  # exact integer floor and remainder
        parts = rests.astype(np.float64) / float(den)
    else:
        pairs = [divmod(first + stride * i, den) for i in range(n)]
        cells = np.array([c for c, _ in pairs], dtype=np.int64)
        parts = np.array([r / den for _, r in pairs], dtype=np.float64)
    share = np.expm1(-parts * interval) / math.expm1(-interval)
    high = pld.masses * np.minimum(1.0, share * (1 + 1e-12))
    low = pld.masses * np.maximum(0.0, 1 - share * (1 - 1e-12))
    base = int(cells.min())
    size = int(cells.max()) - base + 2
    probs = np.asarray(np.bincount(cells - base, low, size), dtype=np.float64)
    probs += np.bincount(cells - base + 1, high, size)
    probs *= 1 + ROUND_UP  # the split's and the sums' few roundings
    masses = {base + i: float(p) for i, p in enumerate(probs) if p > 0}
    return _dp_accounting()[0].PrivacyLossDistribution.create_from_rounded_probability(
        masses, min(1.0, pld.infinity * (1 + ROUND_UP)), interval, pessimistic_estimate=True
    )


def event_pld(event: Event, interval: float) -> PLD | None:
    """A pessimistic PLD dominating ``event`` (not for Gaussian, composed in closed form)."""
    lattice = lattice_pld(event)
    if lattice is not None:
        return _on_grid(lattice.fitted(1 << 16), interval)
    if isinstance(event, Laplace):
        scale = float(event.scale) * (1 - ROUND_UP)
        return _dp_accounting()[0].from_laplace_mechanism(
            scale, _hi(event.sensitivity), value_discretization_interval=interval
        )
    if isinstance(event, Exponential):
        # epsilon is the mechanism's bounded-range parameter too (ranged.py, DDR 2020)
        masses, infinity = bounded_range_masses(_hi(event.epsilon), interval)
        return _dp_accounting()[0].PrivacyLossDistribution.create_from_rounded_probability(
            masses, infinity, interval, pessimistic_estimate=True
        )
    pair = _pair(event)
    if pair is None:
        return None
    return randomized_response_pld(_hi(pair[0]), min(1.0, _hi(pair[1])), interval)


def randomized_response_pld(epsilon: float, delta: float, interval: float) -> PLD:
    """The PLD of the pair that dominates every (epsilon, delta)-DP mechanism (KOV 2015, Theorem
    2.4): loss +-epsilon, and delta at infinity, put on the grid by "connect the dots".

    Each loss l between grid points g <= l <= g' is split into masses at g and g' with the same
    total under both distributions (P mass p, Q mass p e^-l): merging the two grid outcomes back
    gives the original pair, so the grid pair dominates it (post-processing) at every epsilon
    (Doroshenko et al. 2022). Rounding l up to g' instead (``from_privacy_parameters``) adds up
    to one interval to the mean loss per event, which k events accumulate.
    """
    upper = (1 - delta) / (1 + math.exp(-epsilon))
    masses: dict[int, float] = {}
    for loss, prob in ((epsilon, upper), (-epsilon, (1 - delta) - upper)):
        lo = math.floor(loss / interval)
        g_lo, g_hi = lo * interval, (lo + 1) * interval
        if g_lo > loss:  # float division may land one step high
            lo, g_lo, g_hi = lo - 1, g_lo - interval, g_lo
        # p_hi e^-g_hi + p_lo e^-g_lo = p e^-l  and  p_hi + p_lo = p
        share = (math.exp(-loss) - math.exp(-g_lo)) / (math.exp(-g_hi) - math.exp(-g_lo))
        share = min(1.0, max(0.0, share))
        masses[lo + 1] = masses.get(lo + 1, 0.0) + prob * share
        masses[lo] = masses.get(lo, 0.0) + prob * (1 - share)
    return _dp_accounting()[0].PrivacyLossDistribution.create_from_rounded_probability(
        masses, delta, interval, pessimistic_estimate=True
    )


def _pair(event: Event) -> tuple[Fraction, Fraction] | None:
    """The (epsilon, delta) that an event enters with when no exact PLD applies."""
    if isinstance(event, DiscreteLaplace | PureDP | Exponential):
        return event.epsilon, Fraction(0)
    if isinstance(event, ApproxDP | LaplacePartitionSelection):
        return event.epsilon, event.delta
    if isinstance(event, DiscreteGaussian) and event.target_delta > 0 < event.target_epsilon:
        return event.target_epsilon, event.target_delta
    return None  # zCDP, Gaussians without a calibrated pair: no (epsilon, delta) to enter with


def _arrays(pmf: Any) -> tuple[_Floats, _Floats, float]:
    """Losses, probabilities and infinite mass of a dp_accounting PMF (dense or sparse)."""
    step = pmf._discretization  # private: dp_accounting 0.6 has no array accessor
    if isinstance(pmf, _dp_accounting()[1].DensePLDPmf):
        losses = (pmf._lower_loss + np.arange(len(pmf._probs))) * step
        return losses, np.asarray(pmf._probs, dtype=np.float64), float(pmf._infinity_mass)
    keys = sorted(pmf._loss_probs)
    probs = np.array([pmf._loss_probs[k] for k in keys], dtype=np.float64)
    return np.array(keys, dtype=np.float64) * step, probs, float(pmf._infinity_mass)


TRIM = 1e-15
"""Mass of the least likely losses moved to the infinite loss before a Gaussian is mixed in."""


def _trimmed(losses: _Floats, probs: _Floats, inf_mass: float) -> tuple[_Floats, _Floats, float]:
    """The least likely losses, of total mass at most TRIM, moved to the infinite loss: each
    adds its whole mass to delta there, at least what it added before (every hockey stick is at
    most 1), so every delta is over-estimated, never under (pessimistic, as the composition's own
    tails). Most of a long composition's grid carries almost no mass: 19,241 points become 2,601
    for the 10,000-event mixed history of benchmarks/accountants.py."""
    order = np.argsort(probs, kind="stable")
    light = int(np.searchsorted(np.cumsum(probs[order]), TRIM, side="right"))
    if light == 0:
        return losses, probs, inf_mass
    keep = np.sort(order[light:])
    return losses[keep], probs[keep], inf_mass + float(probs[order[:light]].sum())


@dataclass(frozen=True)
class _State:
    """The composed loss of a history prefix: non-Gaussian PLD, sum of mu^2, or unbounded;
    ``composed`` counts the events inside ``rest`` (its FFT noise grows with them)."""

    events: tuple[Event, ...]
    rest: PLD | None
    mu2: Fraction
    unbounded: bool
    composed: int = 0

    @functools.cached_property
    def _arrays(self) -> list[tuple[_Floats, _Floats, float]]:
        """The composed PMFs as arrays, made once per state (a search reads them ~40 times)."""
        pmfs = () if self.rest is None else (self.rest._pmf_remove, self.rest._pmf_add)
        return [_trimmed(*_arrays(pmf)) for pmf in {id(p): p for p in pmfs}.values()]

    @property
    def noise(self) -> float:
        """What dp_accounting's FFT may have lost of any delta (module docstring)."""
        return FFT_NOISE * self.composed

    def delta(self, epsilon: float) -> float:
        if self.unbounded:
            return 1.0
        mu = math.sqrt(_hi(self.mu2)) if self.mu2 > 0 else 0.0
        if self.rest is None:
            return float(gaussian_delta(epsilon, mu)) if mu > 0 else 0.0 if epsilon >= 0 else 1.0
        if mu == 0:
            found = float(self.rest.get_delta_for_epsilon(epsilon))
            return min(1.0, found * (1 + 1e-9) + self.noise)
        worst = 0.0
        for losses, probs, inf_mass in self._arrays:
            mixed = float(np.dot(probs, gaussian_delta(epsilon - losses, mu)))
            worst = max(worst, inf_mass + mixed)
        return min(1.0, worst * (1 + 1e-9) + self.noise)

    def epsilon(self, delta: float) -> float:
        """The smallest epsilon (rounded up) whose ``delta`` is at most ``delta``."""
        if self.unbounded:
            return math.inf
        if self.mu2 == 0 and self.rest is not None:
            if delta <= self.noise:
                return math.inf
            # dp_accounting solves delta(eps) = delta exactly on the pessimistic grid; at delta
            # less its FFT noise, so that the figure holds for the noiseless composition.
            return float(self.rest.get_epsilon_for_delta(delta - self.noise)) * (1 + 1e-9)
        if self.delta(0.0) <= delta:
            return 0.0
        hi = 1.0
        while self.delta(hi) > delta:
            hi *= 2
            if hi > 1e6:
                return math.inf
        lo = hi / 2 if hi > 1 else 0.0
        while hi - lo > 1e-9 * hi:
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if self.delta(mid) <= delta else (mid, hi)
        return hi


class PldAccountant:
    """PLD figure for a history, composed incrementally (as if fixed in advance)."""

    name = "pld"
    # Composed profiles hold for parameters fixed in advance; adaptively, only within a totally
    # ordered family fixed first (Regehr et al. 2026, arXiv 2602.15815).
    fixed_in_advance = True

    def __init__(self, value_discretization_interval: float = 1e-3, cached_states: int = 4):
        if not 0 < value_discretization_interval <= 0.1:
            raise ParameterError("the PLD discretization interval must be in (0, 0.1]")
        self.interval = value_discretization_interval
        self._states: list[_State] = [_State((), None, Fraction(0), False)]
        self._plds: dict[Event, PLD | None] = {}
        self._cached = cached_states
        self._lock = threading.Lock()

    def _pld(self, event: Event) -> PLD | None:
        if event not in self._plds:
            if len(self._plds) > 1024:
                self._plds.clear()
            self._plds[event] = event_pld(event, self.interval)
        return self._plds[event]

    def _extend(self, state: _State, new: Sequence[Event]) -> _State:
        rest, mu2, unbounded = state.rest, state.mu2, state.unbounded
        composed = state.composed
        for event, count in Counter(new).items():
            if isinstance(event, Gaussian):
                mu2 += count * Fraction(event.mu) ** 2  # Dong, Roth, Su 2019, Corollary 3.3
                continue
            pld = self._pld(event)
            if pld is None:
                unbounded = True
                continue
            part = pld.self_compose(count) if count > 1 else pld
            rest = part if rest is None else rest.compose(part)
            composed += count
        return _State(state.events + tuple(new), rest, mu2, unbounded, composed)

    def state(self, history: Sequence[Event]) -> _State:
        """The composed state of ``history``, from the longest cached prefix."""
        history = tuple(history)
        with self._lock:
            best = max(
                (s for s in self._states if history[: len(s.events)] == s.events),
                key=lambda s: len(s.events),
            )
            if len(best.events) == len(history):
                return best
            state = self._extend(best, history[len(best.events) :])
            self._states = [*self._states[-(self._cached - 1) :], state]
            if not any(not s.events for s in self._states):
                self._states.insert(0, _State((), None, Fraction(0), False))
            return state

    def delta(self, history: Sequence[Event], epsilon: float) -> float:
        return self.state(history).delta(epsilon)

    def epsilon(self, history: Sequence[Event], delta: float) -> float:
        return self.state(history).epsilon(delta)


Family = Literal["gaussian", "identical"]


@functools.lru_cache(maxsize=16)
def _composition(event: Event) -> Composition | None:
    """The k-fold compositions of one discrete mechanism on its own lattice, shared by every
    filter of that mechanism (a budget has one per cap: the data set's and each share's). Up to
    256 counts are kept, one per view of parallel composition at most: a decision is then one
    convolution (of ~10^4 by ~10^3 floats for the streams of docs/accounting.md)."""
    lattice = lattice_pld(event)
    return None if lattice is None else Composition(lattice.fitted(), kept=256)


def _below(x: Fraction) -> float:
    """The largest float at most ``x``."""
    near = float(x)
    return near if Fraction(near) <= x else math.nextafter(near, -math.inf)


class PldFilter:
    """The natural PLD filter, valid for a totally ordered family fixed before the first query
    (Regehr, Hu, Leeman, Manurangsi, Tholoniat, Lecuyer 2026, arXiv 2602.15815).

    ``family='gaussian'``: continuous Gaussians of any sigma (mu-GDP is totally ordered in mu);
    ``family='identical'``: only ``mechanism``, repeated: after k events the history is its
    k-fold composition. A discrete Laplace or Gaussian on one coordinate is composed on its own
    lattice (``pld_lattice``: rigorous, no FFT), anything else by dp_accounting. Any other event
    raises ``UndeclaredMechanismError``: outside such a family the natural filter is invalid.

    Why one repeated mechanism is safe: whether the k-th event is admitted depends on k alone,
    so the number K admitted (in a view) never depends on the answers; an interaction that stops
    earlier is a post-processing of K adaptively composed events, each dominated by the
    mechanism's pair, so of the K-fold product pair (Dong, Roth, Su 2022, Theorem 3.2), whose
    delta at epsilon_cap the filter checked against delta_cap.
    """

    name = "pld"

    def __init__(
        self,
        epsilon_cap: Fraction,
        delta_cap: Fraction,
        family: Family,
        mechanism: Event | None = None,
        value_discretization_interval: float = 1e-3,
    ):
        if family not in ("gaussian", "identical"):
            raise ParameterError("the PLD filter's family must be 'gaussian' or 'identical'")
        if (family == "identical") != (mechanism is not None):
            raise ParameterError("family 'identical' needs its mechanism, and only it")
        self.epsilon_cap, self.delta_cap = Fraction(epsilon_cap), Fraction(delta_cap)
        self.family, self.mechanism = family, mechanism
        self.accountant = PldAccountant(value_discretization_interval)
        self._lattice = _composition(mechanism) if mechanism is not None else None
        self._verified: tuple[Event, ...] = ()

    def _check_history(self, history: Sequence[Event]) -> None:
        """Check the events of ``history`` not already checked (a prefix is checked once)."""
        history = tuple(history)
        done = len(self._verified)
        if history[:done] != self._verified:
            done = 0
        self._check(history[done:])
        self._verified = history

    def _check(self, events: Sequence[Event]) -> None:
        for event in events:
            inside = (
                isinstance(event, Gaussian)
                if self.family == "gaussian"
                else event == self.mechanism
            )
            if not inside:
                family = (
                    "continuous Gaussians"
                    if self.mechanism is None
                    else f"its declared mechanism, {describe_event(self.mechanism)}"
                )
                raise UndeclaredMechanismError(
                    f"the PLD filter accounts only {family}, and cannot admit "
                    f"{describe_event(event)}: the natural PLD filter is valid only for a family "
                    "of mechanisms totally ordered under composition and fixed before the first "
                    "query (Regehr et al. 2026); a broader family needs a proof of that order"
                )

    def admits(self, history: Sequence[Event], new: Sequence[Event]) -> bool:
        self._check_history(history)
        self._check(new)
        if self._lattice is not None:
            return self._fits(len(history) + len(new))
        delta = self.accountant.delta([*history, *new], _below(self.epsilon_cap))
        return Fraction(delta) <= self.delta_cap

    def _fits(self, count: int) -> bool:
        """Whether ``count`` events of the mechanism fit, on its lattice."""
        assert self._lattice is not None
        delta = self._lattice.power(count).delta(_below(self.epsilon_cap))
        return Fraction(delta) <= self.delta_cap

    def tally(self) -> PldTally:
        return PldTally()

    def admits_tally(self, tally: PldTally, new: Sequence[Event]) -> bool:
        """``admits`` from the running composition of the family: for Gaussians the exact sum
        of mu^2 (Dong, Roth, Su 2019, Corollary 3.3), for one repeated mechanism its count,
        composed as a fresh accountant composes it (one self-composition, or the k-fold
        composition on its lattice)."""
        self._check_tally(tally)
        self._check(new)
        state = self._state(tally, new)
        if self._lattice is not None:
            return self._fits(tally.count + len(new))
        return Fraction(state.delta(_below(self.epsilon_cap))) <= self.delta_cap

    def _check_tally(self, tally: PldTally) -> None:
        # The family is checked on the history as the stateless form checks it: for 'gaussian'
        # its first other event, for 'identical' its first two distinct events.
        self._check([tally.first_other] if self.family == "gaussian" and tally.first_other else [])
        self._check(tally.distinct if self.family == "identical" else [])

    def _state(self, tally: PldTally, new: Sequence[Event]) -> _State:
        mu2, count = tally.mu2, tally.count
        for event in new:
            if isinstance(event, Gaussian):
                mu2 += Fraction(event.mu) ** 2
            else:
                count += 1
        if count == 0 or self._lattice is not None:
            return _State((), None, mu2, False)
        assert self.mechanism is not None  # only family 'identical' has other events
        pld = self.accountant._pld(self.mechanism)
        rest = None if pld is None else pld.self_compose(count) if count > 1 else pld
        return _State((), rest, mu2, pld is None, count)

    def epsilon_spent(self, tally: PldTally, new: Sequence[Event] = ()) -> Fraction | float:
        """The filter's own epsilon for the tally's history followed by ``new``: the least
        epsilon whose delta, on the same composition ``admits_tally`` reads (the declared
        mechanism's k-fold lattice composition, or the Gaussians' summed mu^2 with the repeated
        mechanism's PLD), is within delta_cap, agreeing with the decision (``base.agreeing``);
        ``math.inf`` if unbounded."""
        self._check_tally(tally)
        self._check(new)
        if self._lattice is not None:
            count = tally.count + len(new)  # as admits_tally: each event is the declared one
            # the filter's rigorous composition on the mechanism's loss lattice
            figure = self._lattice.power(count).epsilon(_below(self.delta_cap)) if count else 0.0
        else:
            figure = self._state(tally, new).epsilon(float(self.delta_cap))
        if not math.isfinite(figure):
            return math.inf
        return agreeing(Fraction(figure), self.admits_tally(tally, new), self.epsilon_cap)


class PldTally:
    """Running state of a history for ``PldFilter``: the summed mu^2 of its Gaussians, the count
    of its other events (all one mechanism inside the family 'identical'), and what the family
    check needs: the first non-Gaussian event, the first two distinct events."""

    def __init__(self) -> None:
        self.mu2, self.count = Fraction(0), 0
        self.first_other: Event | None = None
        self.distinct: list[Event] = []

    def add(self, event: Event, count: int = 1) -> None:
        if isinstance(event, Gaussian):
            self.mu2 += count * Fraction(event.mu) ** 2  # as PldAccountant._extend
        else:
            self.count += count
            if self.first_other is None:
                self.first_other = event
        if len(self.distinct) < 2 and event not in self.distinct:
            self.distinct.append(event)
