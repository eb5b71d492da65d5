"""What every accountant provides: odometer figures for a history, and (if valid) a filter.

A *history* is the sequence of events released so far, each query's ``Composite`` flattened
(``events.flatten``). Accountants are stateless functions of the history, so a report can be
recomputed from the ledger at any time; the ones that need speed keep caches keyed by the
history's (event, multiplicity) groups.

- ``epsilon(history, delta)``: the smallest epsilon this accountant proves for the history at
  ``delta`` (an odometer figure). ``math.inf`` if it cannot bound it.
- ``delta(history, epsilon)``: the smallest delta it proves at ``epsilon``.
- ``fixed_in_advance``: True when the figure only holds if every event's parameters were fixed
  before the first query (KOV optimal composition, the natural PLD composition outside a totally
  ordered family): such figures are labelled "as if fixed in advance" and never decide.

A *filter* decides admission under fully adaptive choice of each query's parameters: it admits
``new`` after ``history`` only if the guarantee of the whole (its cap) still holds whatever the
analyst chose adaptively (Rogers, Roth, Ullman, Vadhan 2016; Whitehouse, Ramdas, Rogers, Wu 2023;
Feldman, Zrnic 2021; Smith, Thakurta 2022).

Filters also decide incrementally: ``tally()`` is an empty running state of the history as the
filter reads it (running sums of RDP at each order, of rho, of squared epsilons, ...), ``add``
folds events into it as they are charged, and ``admits_tally(tally, new)`` decides in time
independent of the history's length. It must decide exactly as ``admits(history, new)`` does
for the history folded into the tally (the stateless form stays as the reference, and
tests/accounting/test_incremental_filters.py drives both with random streams): every sum the
stateless form computes exactly is kept exactly, and a float sum it rounds once (``math.fsum``) is
kept as the exact sum of the same floats and rounded once.

Every filter also reads its own spend: ``epsilon_spent(tally, new)`` is the epsilon the filter's
own rule certifies for the history folded into ``tally`` followed by ``new``, at its cap's delta
(the union bound's per-order share, the rho cap's conversion, delta' fixed in advance: whatever
the filter fixed before the first query). It agrees with the decision: ``admits_tally(tally,
new)`` iff ``epsilon_spent(tally, new) <= epsilon_cap`` (``agreeing``), and it is ``math.inf``
when the filter's fixed parameters certify nothing (an event it cannot bound, a reserve of delta
passed). An empty history spends 0.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction
from typing import Any, Protocol

from dpsql.mechanisms.events import Composite, Event
from dpsql.mechanisms.stated_events import ApproxDP

Spent = Fraction | float
"""A filter's own epsilon spent (module docstring): exact, or the float ``math.inf``."""


class Accountant(Protocol):
    """Odometer figures for a history under one composition theorem."""

    name: str
    fixed_in_advance: bool

    def epsilon(self, history: Sequence[Event], delta: float) -> float: ...

    def delta(self, history: Sequence[Event], epsilon: float) -> float: ...


class Tally(Protocol):
    """A filter's running state of a history (module docstring)."""

    def add(self, event: Event, count: int = 1) -> None: ...


class Filter(Protocol):
    """An admission rule with a cap (epsilon, delta), valid under adaptive composition."""

    name: str
    epsilon_cap: Fraction
    delta_cap: Fraction

    def admits(self, history: Sequence[Event], new: Sequence[Event]) -> bool: ...

    def tally(self) -> Any: ...

    def admits_tally(self, tally: Any, new: Sequence[Event]) -> bool: ...

    def epsilon_spent(self, tally: Any, new: Sequence[Event] = ()) -> Spent: ...


def agreeing(figure: Fraction, admitted: bool, cap: Fraction) -> Fraction:
    """A filter's ``figure`` made to agree with its own decision where float rounding could part
    them (a cap solved for to a relative 1e-9, a float comparison): at most ``cap`` when the
    filter admits, above it when it refuses. Both moves are valid bounds: a history the filter
    admits is within its cap by the filter's own theorem, and overstating spend is the safe
    side."""
    if admitted:
        return min(figure, cap)
    if figure > cap:
        return figure
    # The float after the nearest one is above the cap (the nearest is within half an ulp).
    return Fraction(math.nextafter(float(cap), math.inf))


def as_events(composite: Composite) -> list[Event]:
    """A query as its events, composed in sequence (the theorems that compose every event's own
    curve: RDP, zCDP, GDP)."""
    return list(composite.events)


def as_pair(composite: Composite) -> list[Event]:
    """A query as the theorems that compose (epsilon, delta) pairs per step read it: one step at
    its certified pair when its events were calibrated jointly (the whole is (epsilon,
    delta)-DP although no split of it over the parts is, and its discrete Gaussians alone have
    no pair of their own), else its events."""
    if composite.certified is None:
        return list(composite.events)
    return [ApproxDP(composite.certified[0], composite.certified[1], "jointly calibrated query")]


def grouped(history: Sequence[Event]) -> list[tuple[Event, int]]:
    """The history as (event, multiplicity) pairs, in order of first appearance."""
    return list(Counter(history).items())


class GroupCache:
    """``grouped(history)`` for a history that grows by appending, as in the proxy: the counts
    of the last history seen are kept, and a call whose history starts with it (compared
    element by element, so any change is noticed) only counts the new events. Thread-safe.

    ``extra`` events are counted on top without being remembered (a filter's candidate query,
    which may be refused)."""

    def __init__(self) -> None:
        self._prefix: list[Event] = []
        self._counts: Counter[Event] = Counter()
        self._lock = threading.Lock()

    def __call__(
        self, history: Sequence[Event], extra: Sequence[Event] = ()
    ) -> list[tuple[Event, int]]:
        with self._lock:
            n = len(self._prefix)
            if len(history) >= n and list(history[:n]) == self._prefix:
                rest = history[n:]
            else:
                self._prefix, self._counts, rest = [], Counter(), history
            self._counts.update(rest)
            self._prefix.extend(rest)
            counts = self._counts.copy() if extra else self._counts
            counts.update(extra)
            return list(counts.items())
