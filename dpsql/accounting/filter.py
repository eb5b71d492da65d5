"""The budget: the history of charges, the filter that admits queries, the odometer report.

The deciding filter is fixed when the budget is created (the policy's ``budget.accountant``),
never switched by the history: a filter chosen after seeing the history is not a filter.
``basic`` is sequential composition over queries in exact rationals (Dwork, McSherry, Nissim,
Smith 2006; valid adaptively, Rogers, Roth, Ullman, Vadhan 2016): each query is charged its
certified (epsilon, delta). The other filters decide on the flattened events (their own
theorems, see their modules). Optional analyst shares cap each analyst's own history under the
same filter; the data set's cap holds for everyone's together.

Decisions are incremental: the budget folds each charge into the deciding filter's running
tallies (``base.Tally``), one per view of parallel composition and per analyst, and decides from
those in O(views); ``Budget(replay=True)`` decides by replaying the whole history through the
filters' stateless ``admits`` instead, the reference the incremental path is tested against.

This budget lives in memory: it resets when the process ends, until the durable ledger lands.
"""

from __future__ import annotations

import functools
import math
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Any

from dpsql.accounting.advanced import (
    AdvancedAccountant,
    AdvancedFilter,
    AdvancedTally,
    wrrw_bound,
)
from dpsql.accounting.base import Accountant, Filter, Tally
from dpsql.accounting.events import (
    ZCDP,
    ApproxDP,
    Composite,
    Event,
    LaplacePartitionSelection,
    composite_from_json,
    composite_to_json,
    flatten,
)
from dpsql.accounting.gdp import GdpAccountant
from dpsql.accounting.ledger import BUDGET_RECORD, Ledger, Record, anchor_path
from dpsql.accounting.optimal import OptimalAccountant
from dpsql.accounting.parallel import Cell, View, choices, member, views, views_with, worst
from dpsql.accounting.pld import PldAccountant
from dpsql.accounting.rdp import DEFAULT_ORDERS, RdpAccountant, RdpFilter, RdpTally
from dpsql.accounting.zcdp import ZcdpAccountant, ZcdpFilter, ZcdpTally
from dpsql.errors import BudgetExceededError, EntropyError, LedgerError, PolicyError
from dpsql.policy import BudgetSpec, Policy


@dataclass(frozen=True)
class Charge:
    """One committed charge: a fresh release's privacy event and who asked."""

    time: float
    analyst: str | None
    query: str
    event: Composite
    seq: int = 0  # its record in the ledger

    @property
    def epsilon(self) -> Fraction:
        return self.event.epsilon

    @property
    def delta(self) -> Fraction:
        return self.event.delta


@dataclass(frozen=True)
class Figure:
    """One accountant's reading of the history: epsilon at the budget's delta."""

    accountant: str
    epsilon: float
    note: str  # "decides", "valid adaptively", or "as if fixed in advance"


@dataclass(frozen=True)
class BudgetReport:
    """Spent and remaining budget; ``figures`` is the same history under every accountant."""

    dataset: str
    accountant: str
    epsilon_total: Fraction
    delta_total: Fraction
    # Under basic composition: the exact sums of the charged queries (worst cell). Under another
    # filter: its own accountant's epsilon at delta_total (rounded up), and the additive deltas
    # (partition selection) charged so far.
    epsilon_spent: Fraction
    delta_spent: Fraction
    queries: int
    durable: bool
    # Every accountant's figures, computed on first use of ``figures`` (the full report costs
    # up to 200 ms at 10,000 charges; spent and remaining budget need none of it).
    readings: Callable[[], tuple[Figure, ...]] = field(default=tuple, compare=False, repr=False)
    # The asking analyst's share, when the budget is shared and the analyst has one.
    share: ShareReport | None = None

    @functools.cached_property
    def figures(self) -> tuple[Figure, ...]:
        """The history at the time of the report under every accountant, labelled."""
        return self.readings()

    @property
    def epsilon_remaining(self) -> Fraction:
        return self.epsilon_total - self.epsilon_spent

    @property
    def delta_remaining(self) -> Fraction:
        return self.delta_total - self.delta_spent

    def __str__(self) -> str:
        """Decimals people read (never 19/2 nor 1e-06): spent rounded up, what is left rounded
        down and never below zero."""
        mine = "" if self.share is None else f"{self.share}; "
        return mine + (
            f"dataset {self.dataset}: epsilon {_up(self.epsilon_spent)} spent of "
            f"{_shown(self.epsilon_total)} ({_down(self.epsilon_remaining)} left), delta "
            f"{_up(self.delta_spent)} of {_shown(self.delta_total)}; {self.queries} "
            f"charged queries; {self.accountant} composition decides"
            + ("" if self.durable else "; in memory: resets when the process ends")
        )


def _shown(value: Fraction) -> str:
    """An exact number as a decimal people read (never 19/2): exact when short, else 6
    significant digits."""
    value = Fraction(value)  # an int, or a float of a reading
    if value.denominator == 1 or 10**12 % value.denominator == 0:
        text = f"{Decimal(value.numerator) / Decimal(value.denominator):f}"
        return text.rstrip("0").rstrip(".") if "." in text else text
    return f"{float(value):.6g}"


def _down(value: Fraction) -> str:
    """What is left, never below zero, rounded down to 6 significant digits."""
    return _rounded(value, math.floor)


def _up(value: Fraction) -> str:
    """What was spent, rounded up to 6 significant digits (never understated)."""
    return _rounded(value, math.ceil)


def _rounded(value: Fraction, way: Callable[[Fraction], int]) -> str:
    if value <= 0:
        return "0"
    if value.denominator == 1 or 10**12 % value.denominator == 0:
        return _shown(value)
    digits = 6 - 1 - math.floor(math.log10(value))
    scale = Fraction(10) ** digits
    return _shown(Fraction(way(value * scale)) / scale)


@dataclass(frozen=True)
class ShareReport:
    """An analyst's share of the budget and what they spent of it, read as the deciding filter
    reads it when it decides their queries (their own history, under their share's cap)."""

    analyst: str
    epsilon_share: Fraction
    delta_share: Fraction
    epsilon_spent: Fraction
    delta_spent: Fraction
    queries: int

    @property
    def epsilon_remaining(self) -> Fraction:
        """Never below zero: a share read past its cap by a looser figure has nothing left."""
        return max(Fraction(0), self.epsilon_share - self.epsilon_spent)

    @property
    def delta_remaining(self) -> Fraction:
        return max(Fraction(0), self.delta_share - self.delta_spent)

    def __str__(self) -> str:
        return (
            f"analyst {self.analyst}: epsilon {_up(self.epsilon_spent)} spent of their "
            f"share {_shown(self.epsilon_share)} ({_down(self.epsilon_remaining)} left), "
            f"delta {_up(self.delta_spent)} of {_shown(self.delta_share)}; "
            f"{self.queries} charged queries"
        )


# Accountants and filters that compose (epsilon, delta) pairs per step: a query whose events
# were calibrated jointly (``certified``) is one (epsilon, delta) step for them, which is
# exactly what it is; its discrete Gaussians alone have no (epsilon, delta) of their own.
_PAIRWISE = {"advanced", "optimal", "pld"}


def events_for(name: str, composites: Sequence[Composite]) -> list[Event]:
    """The history as the accountant or filter ``name`` reads it."""
    if name not in _PAIRWISE:
        return flatten(list(composites))
    events: list[Event] = []
    for c in composites:
        if c.certified is not None:
            events.append(ApproxDP(c.certified[0], c.certified[1], "jointly calibrated query"))
        else:
            events.extend(c.events)
    return events


def _additive_delta(view: Sequence[Composite]) -> Fraction:
    """The deltas charged outright (partition selection, approximate DP) in a view."""
    additive = (LaplacePartitionSelection, ApproxDP, ZCDP)
    return sum((e.delta for c in view for e in c.events if isinstance(e, additive)), Fraction(0))


Sums = dict[tuple[str, object], tuple[Fraction, Fraction]]


ViewKey = tuple[tuple[str, Cell], ...]


def _key(view: View) -> ViewKey:
    return tuple(sorted(view.items()))


@dataclass
class _Views:
    """One history (the data set's or an analyst's) as the deciding filter reads it, folded as
    records arrive: per cell (None: the unpinned queries) the events' multiplicities, and per
    view of ``dpsql.accounting.parallel`` the filter's running tally (``base.Tally``). A
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

    def worst(self, who: str, within: Cell | None) -> tuple[Fraction, Fraction]:
        """The basic-composition sums of ``who``'s worst view (``dpsql.accounting.parallel``),
        among those holding cell ``within`` if given; epsilon and delta maximised apart."""
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


class MemoryLedger:
    """The ledger's interface, in memory: nothing survives the process (no ``dpsql init``)."""

    durable = False

    def __init__(self) -> None:
        self._records: list[Record] = []
        self._lock = threading.Lock()
        # The salt of the keyed hash that picks a unit's groups (see Ledger.create).
        try:
            self.identity = {"salt": str(secrets.randbits(62))}
        except Exception:
            raise EntropyError("secure randomness is unavailable") from None

    def append(
        self,
        kind: str,
        payload: Mapping[str, Any],
        analyst: str | None = None,
        decide: Callable[[list[Record]], None] | None = None,
    ) -> Record:
        with self._lock:
            if decide is not None:
                decide(self._records)  # not copied: O(1) per charge; decide only reads it
            seq = len(self._records) + 1
            record = Record(seq, time.time(), kind, analyst, dict(payload), "", "")
            self._records.append(record)
            return record

    def records(self) -> list[Record]:
        with self._lock:
            return list(self._records)

    def records_since(self, count: int) -> list[Record]:
        with self._lock:
            return self._records[count:]


Store = Ledger | MemoryLedger


class Budget:
    """Check-and-charge under the policy's filter, atomic across threads and (with a durable
    ledger) processes; analyst shares; budget administration; the odometer report.

    Every decision is taken inside the ledger's transaction on the records committed so far, so
    its inputs are public (earlier charges, the policy, top-ups and allocations), never data.
    """

    def __init__(
        self,
        dataset: str,
        spec: BudgetSpec,
        store: Store | None = None,
        accountants: Sequence[Accountant] = (),
        *,
        replay: bool = False,
    ):
        self.dataset = dataset
        self.spec = spec
        self.store: Store = store if store is not None else MemoryLedger()
        self._accountants = tuple(accountants)
        self._parsed: dict[int, Composite] = {}
        self._folded: _State | None = None
        self._deciders: dict[tuple[Fraction | None, Fraction, Fraction | None], Filter | None] = {}
        self._lock = threading.RLock()  # _state builds deciders under it
        # Decide by replaying the whole history through the filters' stateless ``admits``
        # (O(history) per charge): the reference the incremental path is tested against.
        self.replay = replay

    @property
    def name(self) -> str:
        return self.spec.accountant

    def _decider(
        self, epsilon: Fraction | None, delta: Fraction, rho: Fraction | None
    ) -> Filter | None:
        key = (epsilon, delta, rho)
        with self._lock:
            if key not in self._deciders:  # building a filter may solve for its cap: keep it
                self._deciders[key] = _decider(self.spec, epsilon, delta, rho)
            return self._deciders[key]

    def _state(self, records: Sequence[Record]) -> _State:
        """The ledger folded into a state, reading only the records since the last call (the
        store guarantees that earlier records never change under a session). The state is the
        live one: callers hold ``_lock`` while they read it."""
        with self._lock:
            state = self._folded
            if state is None or len(records) < state.seen:
                spec = self.spec
                shares = {n: (a.epsilon, a.delta) for n, a in spec.analysts.items()}
                state = _State([], _epsilon_total(self, spec), spec.delta, shares, {})
                rule = self._rule((state.epsilon, state.delta), True)
                # A tally holds sums only, never a cap: one kind serves every cap of the filter.
                state.new_tally = None if isinstance(rule, tuple) else rule.tally
            for r in records[state.seen :]:
                self._fold(state, r)
            state.seen = len(records)
            self._folded = state
            return state

    def _fold(self, state: _State, r: Record) -> None:
        if r.kind == "charge":
            event = self._parsed.get(r.seq)
            if event is None:
                event = self._parsed[r.seq] = composite_from_json(dict(r.payload["event"]))
            state.charges.append(Charge(r.time, r.analyst, str(r.payload["query"]), event, r.seq))
            _add(state, "*", event)
            if r.analyst is not None:
                _add(state, r.analyst, event)
            if state.new_tally is not None:
                events = events_for(self.name, [event])
                for who in ("*", r.analyst) if r.analyst is not None else ("*",):
                    mine = state.views.get(who)
                    if mine is None:
                        mine = state.views[who] = _Views(state.new_tally)
                    mine.add(event.cell, events, _additive_delta([event]))
        elif r.kind == "budget_add":
            state.epsilon += Fraction(str(r.payload["epsilon"]))
            state.delta += Fraction(str(r.payload["delta"]))
        elif r.kind == "allocate":
            share = (Fraction(str(r.payload["epsilon"])), Fraction(str(r.payload["delta"])))
            state.shares[str(r.payload["analyst"])] = share

    def _rule(
        self, cap: tuple[Fraction, Fraction], total: bool
    ) -> Filter | tuple[Fraction, Fraction]:
        """The filter for a cap; a tuple stands for basic composition with that cap."""
        rho = self.spec.rho if total and cap[0] == _epsilon_total(self, self.spec) else None
        decider = self._decider(None if rho is not None else cap[0], cap[1], rho)
        return decider if decider is not None else cap

    def _admits(
        self,
        rule: Filter | tuple[Fraction, Fraction],
        state: _State,
        who: str,
        new: Composite,
    ) -> bool:
        """Whether ``rule`` admits ``new`` in every view of ``who``'s history it belongs to.

        Parallel composition (McSherry 2009) within a partition family only
        (``dpsql.accounting.parallel``): a view per cell holds every query except those pinned
        to another cell of that cell's family; ``new`` must fit every view that holds it.
        """
        if isinstance(rule, tuple):
            # Basic composition from the running sums, the worst view in closed form.
            eps, delta = state.worst(who, new.cell)
            return eps + new.epsilon <= rule[0] and delta + new.delta <= rule[1]
        if self.replay or state.new_tally is None:
            return self._admits_replay(rule, state, who, new)
        mine = state.views.get(who)
        if mine is None:
            mine = _Views(state.new_tally)  # an empty history (not kept: it may be refused)
        events = events_for(rule.name, [new])
        # The filter's own decision on each view's running tally (``base.Tally``): exactly
        # ``admits`` on that view's history (tests/test_incremental_filters.py).
        return all(rule.admits_tally(tally, events) for tally in mine.holding(new.cell))

    def _admits_replay(self, rule: Filter, state: _State, who: str, new: Composite) -> bool:
        """``_admits`` by replaying every view's whole history through ``rule.admits``."""
        mine = state.charges if who == "*" else [c for c in state.charges if c.analyst == who]
        history = [c.event for c in mine]
        for seen in views_with(history, new, _cell_of):
            if not rule.admits(events_for(rule.name, seen[:-1]), events_for(rule.name, [new])):
                return False
        return True

    def _decide(self, event: Composite, analyst: str | None, records: Sequence[Record]) -> None:
        with self._lock:
            self._decide_on(self._state(records), event, analyst)

    def _decide_on(self, state: _State, event: Composite, analyst: str | None) -> None:
        rule = self._rule((state.epsilon, state.delta), True)
        if not self._admits(rule, state, "*", event):
            left = self._left(state, rule, "*", (state.epsilon, state.delta))
            raise BudgetExceededError(
                f"this query (epsilon {_shown(event.epsilon)}, delta {_shown(event.delta)}) "
                f"would take the data set over its budget under the {self.name} filter "
                f"({left}); nothing was charged"
            )
        if state.shares and (analyst is None or analyst not in state.shares):
            # With shares declared, only the analysts they name may spend anything.
            raise BudgetExceededError(
                "the budget is shared among named analysts only, and this connection's analyst "
                "has no share; nothing was charged"
            )
        if analyst is not None and analyst in state.shares:
            share = self._rule(state.shares[analyst], False)
            if not self._admits(share, state, analyst, event):
                left = self._left(state, share, analyst, state.shares[analyst])
                raise BudgetExceededError(
                    f"this query (epsilon {_shown(event.epsilon)}) would take analyst "
                    f"{analyst} over their share of the budget ({left}); nothing was charged"
                )

    def _left(
        self,
        state: _State,
        rule: Filter | tuple[Fraction, Fraction],
        who: str,
        cap: tuple[Fraction, Fraction],
    ) -> str:
        """How much of ``cap`` is left for ``who``, read as ``rule`` reads the spend (rounded
        down: a refusal never overstates what remains)."""
        if isinstance(rule, tuple):
            eps, delta = state.worst(who, None)
        else:
            eps, delta = self._deciding(state, rule, len(state.charges), who, float(cap[1]))
        return (
            f"epsilon {_down(cap[0] - eps)} of {_shown(cap[0])} left, "
            f"delta {_down(cap[1] - delta)} of {_shown(cap[1])}"
        )

    def charge(
        self,
        event: Composite,
        query: str,
        analyst: str | None,
        details: Mapping[str, Any] | None = None,
    ) -> Charge:
        """Decide and record the charge in one ledger transaction, or raise
        ``BudgetExceededError`` and record nothing."""
        payload = {
            "query": query,
            "event": composite_to_json(event),
            "epsilon": str(event.epsilon),
            "delta": str(event.delta),
            "accountant": self.name,
            **(details or {}),
        }
        record = self.store.append(
            "charge", payload, analyst, lambda records: self._decide(event, analyst, records)
        )
        self._parsed[record.seq] = event
        return Charge(record.time, analyst, query, event, record.seq)

    def add(self, epsilon: Fraction, delta: Fraction, by: str, why: str) -> Record:
        """A top-up of the data set's budget, recorded with who did it and why."""
        payload = {"epsilon": str(epsilon), "delta": str(delta), "by": by, "why": why}
        return self.store.append("budget_add", payload, None)

    def allocate(
        self, analyst: str, epsilon: Fraction, delta: Fraction, by: str, why: str
    ) -> Record:
        """Set an analyst's share (replacing the policy's or an earlier one), recorded."""
        payload = {"analyst": analyst, "epsilon": str(epsilon), "delta": str(delta), "by": by,
                   "why": why}  # fmt: skip
        return self.store.append("allocate", payload, None)

    @property
    def charges(self) -> tuple[Charge, ...]:
        records = self.store.records()
        with self._lock:
            return tuple(self._state(records).charges)

    def views(self, charges: Sequence[Charge] | None = None) -> list[list[Composite]]:
        """The histories that bound every unit's (``dpsql.accounting.parallel``: one per cell of
        a partition family, or the whole history when no query was pinned). The guarantee is
        the worst view."""
        composites = [c.event for c in (charges if charges is not None else self.charges)]
        return views(composites, _cell_of)

    def report(self, analyst: str | None = None) -> BudgetReport:
        """Spent and remaining budget now, with ``analyst``'s share when they have one. The
        deciding filter's figure is read from the running tallies (O(views)); every
        accountant's figure (``BudgetReport.figures``) is computed on first use, over the
        history as it was at this call."""
        records = self.store.records()
        with self._lock:
            state = self._state(records)
            # Not copied: the list only grows, so its first ``count`` items stay this history.
            charges, count = state.charges, len(state.charges)
            basic = state.worst("*", None)  # what basic composition decides on
            decider = self._rule((state.epsilon, state.delta), True)
            eps, delta = basic
            if not isinstance(decider, tuple):
                eps, delta = self._deciding(state, decider, count)
            share = None
            if analyst is not None and analyst in state.shares:
                share = self._share(state, analyst)
        return BudgetReport(
            self.dataset,
            self.name,
            state.epsilon,
            state.delta,
            eps,
            delta,
            count,
            self.store.durable,
            functools.partial(self._figures, charges, count, float(state.delta), basic[0]),
            share,
        )

    def _share(self, state: _State, analyst: str) -> ShareReport:
        """What ``analyst`` spent of their share, as the filter that decides their queries
        (``_decide_on``: the share's cap, their own history) reads it."""
        cap = state.shares[analyst]
        rule = self._rule(cap, False)
        mine = [c for c in state.charges if c.analyst == analyst]
        eps, delta = state.worst(analyst, None)
        if not isinstance(rule, tuple):
            eps, delta = self._deciding(state, rule, len(state.charges), analyst, float(cap[1]))
        return ShareReport(analyst, cap[0], cap[1], eps, delta, len(mine))

    def _odometer(self, name: str) -> Accountant | None:
        return next((a for a in self._accountants if a.name == name), None)

    def _deciding(
        self,
        state: _State,
        decider: Filter,
        count: int,
        who: str = "*",
        cap_delta: float | None = None,
    ) -> tuple[Fraction, Fraction]:
        """The deciding filter's (epsilon, additive delta) spent, worst view, of ``who``'s
        history ("*": the data set's) at ``cap_delta`` (default: the data set's delta): its own
        bound where it has one (advanced), else its family's odometer reading; Fraction(repr)
        keeps the rounded-up float exactly. From the tallies, the same numbers as from the
        views' histories (``_deciding_replay``), which serves the cases the tallies cannot."""
        delta = float(state.delta) if cap_delta is None else cap_delta
        history = state.charges[:count]
        if who != "*":
            history = [c for c in history if c.analyst == who]
        mine = state.views.get(who)
        odometer = self._odometer(self.name)
        tallies = [] if mine is None else list(mine.tallies.values())
        readings: list[float] = []
        pairs: list[tuple[View, Tally | None]] = [*tallies] or [({}, None)]
        for view, tally in pairs:
            empty = mine is None or not any(
                counts for cell, counts in mine.atoms.items() if member(cell, view)
            )
            if isinstance(tally, AdvancedTally) and isinstance(decider, AdvancedFilter):
                # WRRW 2023 section 3: the filter's own epsilon of the view's history
                bound = wrrw_bound(float(tally.eps_sq), float(decider.delta_prime))
                readings.append(bound if tally.bounded else math.inf)
            elif empty:
                readings.append(0.0)
            elif isinstance(tally, RdpTally) and isinstance(odometer, RdpAccountant):
                if tally.orders != odometer.orders:  # a single order decides: read the grid
                    return self._deciding_replay(decider, history, delta)
                readings.append(odometer.epsilon_of(*tally.with_events(()), delta))
            elif isinstance(tally, ZcdpTally):
                readings.append(ZcdpAccountant.epsilon_of(tally.rho, tally.delta, delta))
            else:
                return self._deciding_replay(decider, history, delta)
        additive = [Fraction(0)] if mine is None else [mine.additive_in(v) for v, _ in tallies]
        return Fraction(repr(max(readings))), max(additive)

    def _deciding_replay(
        self, decider: Filter, charges: list[Charge], delta: float
    ) -> tuple[Fraction, Fraction]:
        """``_deciding`` from the views' whole histories (O(history))."""
        seen = self.views(charges)
        bound = getattr(decider, "bound", None)
        odometer = self._odometer(self.name)
        if bound is not None:
            readings = [float(bound(events_for(self.name, v))) for v in seen]
        elif odometer is not None:
            readings = [
                odometer.epsilon(events_for(self.name, v), delta) if v else 0.0 for v in seen
            ]
        else:
            raise AssertionError(f"no reading for the {self.name} filter")  # odometers() has one
        return Fraction(repr(max(readings))), max(_additive_delta(v) for v in seen)

    def _figures(
        self, charges: list[Charge], count: int, delta: float, basic: Fraction
    ) -> tuple[Figure, ...]:
        """Every accountant's reading of the first ``count`` charges, worst view, labelled."""
        with self._lock:  # the list grows under it
            history = charges[:count]
        seen = self.views(history)
        figures = [
            Figure("basic", float(basic), "decides" if self.name == "basic" else "valid adaptively")
        ]
        for accountant in self._accountants:
            note = "as if fixed in advance" if accountant.fixed_in_advance else "valid adaptively"
            if accountant.name == self.name:
                suffix = "; figure as if fixed in advance" if accountant.fixed_in_advance else ""
                note = "decides" + suffix
            readings = [
                accountant.epsilon(events_for(accountant.name, v), delta) if v else 0.0
                for v in seen
            ]
            figures.append(Figure(accountant.name, max(readings), note))
        return tuple(figures)


def _decider(
    spec: BudgetSpec, epsilon: Fraction | None, delta: Fraction, rho: Fraction | None = None
) -> Filter | None:
    """The filter the policy names, for a cap (epsilon, delta) or (rho, delta); None is basic
    composition."""
    if spec.accountant == "advanced":
        assert spec.advanced_delta_prime is not None and epsilon is not None  # policy-validated
        return AdvancedFilter(epsilon, delta, spec.advanced_delta_prime)
    # The part of delta reserved for partition selection's additive deltas, as a fraction of
    # the total (half by default), applied alike to the data set's cap and to analyst shares.
    part = spec.selection_delta / spec.delta if spec.selection_delta is not None else Fraction(1, 2)
    selection = delta * part
    if spec.accountant == "rdp":
        assert epsilon is not None
        orders = (spec.rdp_order,) if spec.rdp_order is not None else DEFAULT_ORDERS
        return RdpFilter(epsilon, delta, orders, approx_delta_cap=selection)
    if spec.accountant == "zcdp":
        if rho is not None:
            return ZcdpFilter(delta_cap=delta, rho_cap=rho, approx_delta_cap=selection)
        return ZcdpFilter(epsilon, delta, approx_delta_cap=selection)
    return None


def _cell_of(event: Composite) -> Cell | None:
    return event.cell


def _epsilon_total(budget: Budget, spec: BudgetSpec) -> Fraction:
    """The policy's epsilon, or with a rho budget the epsilon the zCDP filter certifies."""
    if spec.epsilon is not None:
        return spec.epsilon
    decider = budget._decider(None, spec.delta, spec.rho)
    assert isinstance(decider, ZcdpFilter)  # a rho budget goes with the zcdp filter
    return Fraction(decider.epsilon_cap)


def odometers() -> list[Accountant]:
    """Every accountant's reading of a history, for the report (basic is the report's own)."""
    return [
        AdvancedAccountant(),
        OptimalAccountant(),
        RdpAccountant(),
        ZcdpAccountant(),
        GdpAccountant(),
        PldAccountant(),
    ]


def budget_caps(spec: BudgetSpec) -> dict[str, Any]:
    """What the ledger pins at its creation (``BUDGET_RECORD``): the caps, the deciding filter
    and its fixed parameters, the analysts' shares; exact numbers as text. Per-query defaults
    (``query_epsilon``, ``mechanism``, ...) are not caps and may change freely."""

    def text(value: object) -> str | None:
        return None if value is None else str(value)

    return {
        "epsilon": text(spec.epsilon),
        "delta": str(spec.delta),
        "rho": text(spec.rho),
        "accountant": spec.accountant,
        "advanced_delta_prime": text(spec.advanced_delta_prime),
        "rdp_order": None if spec.rdp_order is None else repr(spec.rdp_order),
        "selection_delta": text(spec.selection_delta),
        "analysts": {
            name: {"epsilon": str(share.epsilon), "delta": str(share.delta)}
            for name, share in sorted(spec.analysts.items())
        },
    }


def _flat(caps: Mapping[str, Any], prefix: str = "budget") -> dict[str, object]:
    flat: dict[str, object] = {}
    for key, value in caps.items():
        if isinstance(value, Mapping):
            flat.update(_flat(value, f"{prefix}.{key}"))
        else:
            flat[f"{prefix}.{key}"] = value
    return flat


def pinned_spec(spec: BudgetSpec, store: Store) -> BudgetSpec:
    """The budget as the ledger pinned it at its creation, with the policy's per-query defaults.

    A policy whose caps or filter differ from the ledger's is refused with what differs: the cap
    of a ledger changes only by recorded owner acts (``dpsql budget add``, ``allocate``), never
    by editing a policy file or passing another dict to ``connect``.
    """
    pinned = next((r for r in store.records() if r.kind == BUDGET_RECORD), None)
    if pinned is None:
        raise LedgerError(
            "the ledger records no budget (it was created by an earlier dpsql); record the "
            "policy's budget in it with dpsql ledger pin-budget"
        )
    recorded = {k: v for k, v in pinned.payload.items() if k != "why"}
    ours, theirs = _flat(budget_caps(spec)), _flat(recorded)
    differing = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
    if differing:
        shown = "; ".join(
            f"{k} is {ours.get(k, 'absent')} in the policy, {theirs.get(k, 'absent')} in the ledger"
            for k in differing[:6]
        )
        raise PolicyError(
            f"the policy's budget differs from the one its ledger was created with: {shown}. "
            "A ledger's caps and filter are fixed at dpsql init; top it up with dpsql budget "
            "add and set shares with dpsql budget allocate"
        )
    caps = {k: v for k, v in recorded.items() if v is not None}
    defaults = {"query_epsilon": spec.query_epsilon, "query_delta": spec.query_delta,
                "mechanism": spec.mechanism}  # fmt: skip
    return BudgetSpec.model_validate({**caps, **defaults})


def budget_for(dataset: str, spec: BudgetSpec, store: Store | None = None) -> Budget:
    """The budget a ledger pinned (``pinned_spec``), which the policy's must equal; over a
    durable ledger, or in memory (whose budget is the policy's: it lives as long as the
    process, and is created here)."""
    store = store if store is not None else MemoryLedger()
    if not store.durable and not store.records():
        store.append(BUDGET_RECORD, budget_caps(spec))
    return Budget(dataset, pinned_spec(spec, store), store, odometers())


def create_ledger(policy: Policy, by: str | None = None) -> Ledger:
    """``dpsql init``: the policy's durable ledger, created with its budget pinned."""
    assert policy.ledger is not None
    path = policy.resolve(policy.ledger.path)
    anchor = policy.resolve(policy.ledger.anchor) if policy.ledger.anchor is not None else None
    return Ledger.create(path, policy.dataset.id, anchor, budget=budget_caps(policy.budget), by=by)


def ledger_exists(policy: Policy) -> bool:
    """Whether the policy's ledger or its anchor is on disk (either: a ledger that lost one of
    them fails closed when opened, rather than passing for one never created)."""
    assert policy.ledger is not None
    path = policy.resolve(policy.ledger.path)
    given = policy.ledger.anchor
    anchor = policy.resolve(given) if given is not None else anchor_path(path)
    try:
        return path.exists() or anchor.exists()
    except OSError:
        return True  # cannot tell: opened, so that it fails closed


def open_store(policy: Policy) -> Store:
    """The policy's ledger, verified (fail closed), or a memory one when it names none."""
    if policy.ledger is None:
        return MemoryLedger()
    path = policy.resolve(policy.ledger.path)
    anchor = policy.resolve(policy.ledger.anchor) if policy.ledger.anchor is not None else None
    return Ledger(path, anchor)
