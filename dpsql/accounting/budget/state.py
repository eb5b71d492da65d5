"""The history as the deciding filter reads it, folded incrementally as records arrive.

``_State`` is what the ledger says: the charges, the caps (policy plus administration), running
basic-composition sums per (who, cell), and under another filter its running tallies per view
of parallel composition (``_Views``, one per history: the data set's and each analyst's).
``events_for`` is a history as a given accountant or filter reads it (its registration's
``steps``: a jointly calibrated query is one (epsilon, delta) step for the theorems that compose
pairs, its events for the others). ``Budget`` (``budget.py``) builds and reads these under its
lock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from dpsql.accounting.budget.parallel import Cell, View, choices, member, worst
from dpsql.accounting.budget.periods import PeriodSpends
from dpsql.accounting.budget.report import Charge
from dpsql.accounting.registry import get
from dpsql.accounting.theorems.base import Tally
from dpsql.mechanisms.events import Composite, Event

__all__ = ["Sums", "ViewKey", "events_for"]


def events_for(name: str, composites: Sequence[Composite]) -> list[Event]:
    """The history as the registered accountant or filter ``name`` reads it."""
    steps = get(name).steps
    return [e for c in composites for e in steps(c)]


def _additive_delta(view: Sequence[Composite]) -> Fraction:
    """The deltas charged outright (partition selection, approximate DP) in a view: each
    event's approximate delta, the part of its zCDP and RDP curves that holds only with a delta
    (``Event.zcdp``; a subsampled Gaussian's delta is its pair's only, its curves hold without
    it); the stated delta of an event without a zCDP curve."""
    return sum((_approximate(e) for c in view for e in c.events), Fraction(0))


def _approximate(event: Event) -> Fraction:
    pair = event.zcdp()
    return event.delta if pair is None else pair[1]


Sums = dict[tuple[str, object], tuple[Fraction, Fraction]]


ViewKey = tuple[tuple[str, Cell], ...]


def _key(view: View) -> ViewKey:
    return tuple(sorted(view.items()))


@dataclass
class _Views:
    """One history (the data set's or an analyst's) as the deciding filter reads it, folded as
    records arrive: per cell (None: the unpinned queries) the events' multiplicities, and per
    view of ``dpsql.accounting.budget.parallel`` the filter's running tally (``base.Tally``). A
    decision reads the tallies of the views that hold the new query: O(views), whatever the
    length of the history. A view's content depends only on its choice of cells (``member``),
    so a tally, once built, stays right as long as its view exists; a query of a new cell
    builds the views it creates from the per-cell multiplicities (O(views x distinct events))."""

    new_tally: Callable[[], Tally]
    atoms: dict[Cell | None, Counter[Event]] = field(default_factory=dict)
    cells: list[Cell] = field(default_factory=list)
    tallies: dict[ViewKey, tuple[View, Tally]] = field(default_factory=dict)
    additive: dict[Cell | None, Fraction] = field(default_factory=dict)  # ``_additive_delta``

    def additive_in(self, view: View) -> Fraction:
        """The deltas charged outright in ``view`` (``_additive_delta`` of its history)."""
        return sum((d for c, d in self.additive.items() if member(c, view)), Fraction(0))

    def __post_init__(self) -> None:
        if not self.tallies:
            self.tallies = {(): ({}, self.new_tally())}  # no cell yet: one view, everything

    def _build(self, view: View) -> Tally:
        tally = self.new_tally()
        for cell, counts in self.atoms.items():
            if member(cell, view):
                for event, count in counts.items():
                    tally.add(event, count)
        return tally

    def add(self, cell: Cell | None, events: Sequence[Event], additive: Fraction) -> None:
        fresh = cell is not None and cell not in self.atoms
        self.additive[cell] = self.additive.get(cell, Fraction(0)) + additive
        self.atoms.setdefault(cell, Counter()).update(events)
        if cell is None or not fresh:
            for view, tally in self.tallies.values():
                if member(cell, view):
                    for event in events:
                        tally.add(event)
            return
        # A new cell changes the views (``choices``): keep the tallies of those that remain.
        self.cells.append(cell)
        old, self.tallies = self.tallies, {}
        for view in choices(self.cells):
            kept = old.get(_key(view))
            if kept is None:
                tally = self._build(view)  # the atoms already hold ``events``
            else:
                tally = kept[1]
                if member(cell, view):
                    for event in events:
                        tally.add(event)
            self.tallies[_key(view)] = (view, tally)

    def holding(self, cell: Cell | None) -> Iterator[Tally]:
        """The tallies of the views that a new query pinned to ``cell`` belongs to, over the
        history so far: those ``views_with`` gives (a new cell's views are built on the fly)."""
        if cell is None or cell in self.atoms:
            for view, tally in self.tallies.values():
                if member(cell, view):
                    yield tally
            return
        for view in choices([*self.cells, cell]):
            if member(cell, view):
                kept = self.tallies.get(_key(view))
                yield kept[1] if kept is not None else self._build(view)


@dataclass
class _State:
    """What the ledger says, folded incrementally: the charges, the caps (policy plus
    administration), and running basic-composition sums per (who, cell), where who is "*" for
    the data set or an analyst's name, and cell None for the unpinned queries; under another
    filter, its running tallies per view of each who (``_Views``)."""

    charges: list[Charge]
    epsilon: Fraction
    delta: Fraction
    shares: dict[str, tuple[Fraction, Fraction]]
    sums: Sums
    seen: int = 0
    new_tally: Callable[[], Tally] | None = None
    views: dict[str, _Views] = field(default_factory=dict)
    # The ledger record of the first top-up recorded after a charge: a cap raised after answers
    # were seen is adaptive, no longer a filter's guarantee (``BudgetReport.adaptive_cap``).
    adaptive_cap: int | None = None
    # Each period's unit-level spends, under a person-within-period unit (``periods.py``).
    periods: PeriodSpends | None = None

    def worst(self, who: str, within: Cell | None) -> tuple[Fraction, Fraction]:
        """The basic-composition sums of ``who``'s worst view
        (``dpsql.accounting.budget.parallel``), among those holding cell ``within`` if given;
        epsilon and delta maximised apart."""
        zero = (Fraction(0), Fraction(0))
        base = self.sums.get((who, None), zero)
        cells = {c: v for (w, c), v in self.sums.items() if w == who and isinstance(c, tuple)}
        return (
            worst(base[0], {c: v[0] for c, v in cells.items()}, within),
            worst(base[1], {c: v[1] for c, v in cells.items()}, within),
        )


def _add(state: _State, who: str, event: Composite) -> None:
    eps, delta = state.sums.get((who, event.cell), (Fraction(0), Fraction(0)))
    state.sums[(who, event.cell)] = (eps + event.epsilon, delta + event.delta)
