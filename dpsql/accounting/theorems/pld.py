"""Privacy loss distributions: the tightest figure of a history, as if fixed in advance.

Each event enters by its own PLD (``pld_grid``: built from the event's map ``Event.pld``),
composed by ``dp_accounting``, except continuous Gaussians, never discretized: Gaussians compose
exactly to one Gaussian with mu^2 = sum mu_i^2 (Dong, Roth, Su 2019, Corollary 3.3), and the
hockey stick of that Gaussian composed with the discrete PLD L of all other events is, exactly,
    delta(eps) = P(L = inf) + sum_j P(L = l_j) delta_mu(eps - l_j),
    delta_mu(x) = Phi(-x/mu + mu/2) - e^x Phi(-x/mu - mu/2)   (Balle, Wang 2018, Theorem 8)
(condition on the first output; the inner divergence is the Gaussian's at e^{eps - l_j}). A
Gaussian-only history is therefore exactly its mu-GDP curve.

Validity. Composing full privacy profiles is valid for parameters fixed in advance, so the
``PldAccountant`` figure is labelled ``fixed_in_advance``. As an admission rule it is valid only
for a family of mechanisms fixed before the first query and totally ordered under composition
(Regehr, Hu, Leeman, Manurangsi, Tholoniat, Lecuyer 2026, arXiv 2602.15815): ``pld_filter``.

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

import numpy as np

from dpsql.accounting.theorems.pld_grid import (
    PLD,
    Floats,
    event_pld,
    gaussian_delta,
    gaussian_mu_squared,
    nudged_up,
    pmf_arrays,
    trimmed,
)
from dpsql.errors import ParameterError
from dpsql.mechanisms.events import Event

__all__ = ["FFT_NOISE", "PldAccountant", "PldState"]

FFT_NOISE = 8 * 2.0**-53
"""Absolute delta added per event composed by dp_accounting (FFT): 20 times the largest error
measured per event (module docstring)."""


@dataclass(frozen=True)
class PldState:
    """The composed loss of a history prefix: non-Gaussian PLD, sum of mu^2, or unbounded;
    ``composed`` counts the events inside ``rest`` (its FFT noise grows with them)."""

    events: tuple[Event, ...]
    rest: PLD | None
    mu2: Fraction
    unbounded: bool
    composed: int = 0

    @functools.cached_property
    def _arrays(self) -> list[tuple[Floats, Floats, float]]:
        """The composed PMFs as arrays, made once per state (a search reads them ~40 times)."""
        pmfs = () if self.rest is None else (self.rest._pmf_remove, self.rest._pmf_add)
        return [trimmed(*pmf_arrays(pmf)) for pmf in {id(p): p for p in pmfs}.values()]

    @property
    def noise(self) -> float:
        """What dp_accounting's FFT may have lost of any delta (module docstring)."""
        return FFT_NOISE * self.composed

    def delta(self, epsilon: float) -> float:
        if self.unbounded:
            return 1.0
        mu = math.sqrt(nudged_up(self.mu2)) if self.mu2 > 0 else 0.0
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
        self._states: list[PldState] = [PldState((), None, Fraction(0), False)]
        self._plds: dict[Event, PLD | None] = {}
        self._cached = cached_states
        self._lock = threading.Lock()

    def pld_of(self, event: Event) -> PLD | None:
        if event not in self._plds:
            if len(self._plds) > 1024:
                self._plds.clear()
            self._plds[event] = event_pld(event, self.interval)
        return self._plds[event]

    def _extend(self, state: PldState, new: Sequence[Event]) -> PldState:
        rest, mu2, unbounded = state.rest, state.mu2, state.unbounded
        composed = state.composed
        for event, count in Counter(new).items():
            squared = gaussian_mu_squared(event)
            if squared is not None:
                mu2 += count * squared  # Dong, Roth, Su 2019, Corollary 3.3
                continue
            pld = self.pld_of(event)
            if pld is None:
                unbounded = True
                continue
            part = pld.self_compose(count) if count > 1 else pld
            rest = part if rest is None else rest.compose(part)
            composed += count
        return PldState(state.events + tuple(new), rest, mu2, unbounded, composed)

    def state(self, history: Sequence[Event]) -> PldState:
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
                self._states.insert(0, PldState((), None, Fraction(0), False))
            return state

    def delta(self, history: Sequence[Event], epsilon: float) -> float:
        return self.state(history).delta(epsilon)

    def epsilon(self, history: Sequence[Event], delta: float) -> float:
        return self.state(history).epsilon(delta)
