"""The natural PLD filter: admission for a totally ordered family fixed before the first query.

Composing full privacy profiles is valid for parameters fixed in advance (``pld.py``). As an
admission rule it is valid only for a family of mechanisms fixed before the first query and
totally ordered under composition (Regehr, Hu, Leeman, Manurangsi, Tholoniat, Lecuyer 2026,
arXiv 2602.15815): ``PldFilter`` takes that family up front and refuses any event outside it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Literal

from dpsql.accounting.theorems.base import agreeing
from dpsql.accounting.theorems.pld import PldAccountant, PldState
from dpsql.accounting.theorems.pld_grid import gaussian_mu_squared, lattice_pld
from dpsql.errors import ParameterError, UndeclaredMechanismError
from dpsql.mechanisms.events import Event
from dpsql.mechanisms.events import describe as describe_event
from dpsql.mechanisms.pld_lattice import Composition

__all__ = ["Family", "PldFilter", "PldTally"]


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
                gaussian_mu_squared(event) is not None
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

    def _state(self, tally: PldTally, new: Sequence[Event]) -> PldState:
        mu2, count = tally.mu2, tally.count
        for event in new:
            squared = gaussian_mu_squared(event)
            if squared is not None:
                mu2 += squared
            else:
                count += 1
        if count == 0 or self._lattice is not None:
            return PldState((), None, mu2, False)
        assert self.mechanism is not None  # only family 'identical' has other events
        pld = self.accountant.pld_of(self.mechanism)
        rest = None if pld is None else pld.self_compose(count) if count > 1 else pld
        return PldState((), rest, mu2, pld is None, count)

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
        squared = gaussian_mu_squared(event)
        if squared is not None:
            self.mu2 += count * squared  # as PldAccountant._extend
        else:
            self.count += count
            if self.first_other is None:
                self.first_other = event
        if len(self.distinct) < 2 and event not in self.distinct:
            self.distinct.append(event)
