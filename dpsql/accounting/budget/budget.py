"""``Budget``: check-and-charge under the policy's filter, over a ledger's records.

The deciding filter is the one the policy names (``dpsql.accounting.registry.filter_for``),
fixed when the budget is created. ``Budget.charge`` decides and records a charge in one ledger
transaction, from the history folded incrementally (``state.py``: O(views) per decision), or
with ``replay=True`` by replaying the whole history through the filters' stateless ``admits``;
analyst shares are decided the same way on their own history. Basic composition
(``BasicFilter``) decides from the running sums of the queries' pairs, the worst view in closed
form. ``Budget.add`` and ``Budget.allocate`` are the recorded owner acts, and ``Budget.report``
the odometer report (``report.py``), its figures read by the ``Readings`` base
(``readings.py``). ``build.py`` builds a budget from a policy (``budget_for``).
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from dpsql.accounting.budget.parallel import Cell, views, views_with
from dpsql.accounting.budget.periods import PeriodCharge, PeriodSpends
from dpsql.accounting.budget.readings import Readings
from dpsql.accounting.budget.report import BudgetReport, Charge, _down, _shown, _up
from dpsql.accounting.budget.state import _add, _additive_delta, _State, _Views, events_for
from dpsql.accounting.ledger.chain import Record
from dpsql.accounting.ledger.store import MemoryLedger, Store
from dpsql.accounting.registry import filter_for
from dpsql.accounting.theorems.base import Accountant, Filter, Spent
from dpsql.accounting.theorems.basic import BasicFilter, BasicTally
from dpsql.accounting.theorems.zcdp import ZcdpFilter
from dpsql.errors import BudgetExceededError
from dpsql.mechanisms.event_kinds import composite_from_json, composite_to_json
from dpsql.mechanisms.events import Composite
from dpsql.policy import BudgetSpec, PeriodsSpec

__all__ = ["Budget"]


class Budget(Readings):
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
        periods: PeriodsSpec | None = None,
    ):
        self.dataset = dataset
        self.spec = spec
        # A person-within-period unit: each period's admission budget (``periods.py``).
        self.periods = periods
        self.store: Store = store if store is not None else MemoryLedger()
        self._accountants = tuple(accountants)
        self._parsed: dict[int, Composite] = {}
        self._folded: _State | None = None
        self._deciders: dict[tuple[Fraction | None, Fraction, Fraction | None], Filter] = {}
        self._lock = threading.RLock()  # _state builds deciders under it
        # Decide by replaying the whole history through the filters' stateless ``admits``
        # (O(history) per charge): the reference the incremental path is tested against.
        self.replay = replay

    @property
    def name(self) -> str:
        return self.spec.accountant

    def _decider(self, epsilon: Fraction | None, delta: Fraction, rho: Fraction | None) -> Filter:
        key = (epsilon, delta, rho)
        with self._lock:
            if key not in self._deciders:  # building a filter may solve for its cap: keep it
                self._deciders[key] = filter_for(self.spec, epsilon, delta, rho)
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
                state.new_tally = None if isinstance(rule, BasicFilter) else rule.tally
                if self.periods is not None:
                    state.periods = PeriodSpends(self.periods)
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
            read = r.payload.get("periods")
            if state.periods is not None and isinstance(read, dict):
                state.periods.add(PeriodCharge.of(read))
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
            if state.charges and state.adaptive_cap is None:
                # Decided after answers: a filter's cap must be fixed before the first query
                # (Rogers, Roth, Ullman, Vadhan 2016; Whitehouse, Ramdas, Rogers, Wu 2023).
                state.adaptive_cap = r.seq
        elif r.kind == "allocate":
            share = (Fraction(str(r.payload["epsilon"])), Fraction(str(r.payload["delta"])))
            state.shares[str(r.payload["analyst"])] = share

    def _rule(self, cap: tuple[Fraction, Fraction], total: bool) -> Filter:
        """The filter for a cap (the data set's, ``total``, or an analyst's share)."""
        rho = self.spec.rho if total and cap[0] == _epsilon_total(self, self.spec) else None
        return self._decider(None if rho is not None else cap[0], cap[1], rho)

    def _admits(self, rule: Filter, state: _State, who: str, new: Composite) -> bool:
        """Whether ``rule`` admits ``new`` in every view of ``who``'s history it belongs to.

        Parallel composition (McSherry 2009) within a partition family only
        (``dpsql.accounting.budget.parallel``): a view per cell holds every query except those
        pinned to another cell of that cell's family; ``new`` must fit every view that holds it.
        """
        if isinstance(rule, BasicFilter):
            # Basic composition from the running sums, the worst view in closed form.
            worst = BasicTally(*state.worst(who, new.cell))
            return rule.admits_tally(worst, events_for(rule.name, [new]))
        if self.replay or state.new_tally is None:
            return self._admits_replay(rule, state, who, new)
        mine = state.views.get(who)
        if mine is None:
            mine = _Views(state.new_tally)  # an empty history (not kept: it may be refused)
        events = events_for(rule.name, [new])
        # The filter's own decision on each view's running tally (``base.Tally``): exactly
        # ``admits`` on that view's history (tests/accounting/test_incremental_filters.py).
        return all(rule.admits_tally(tally, events) for tally in mine.holding(new.cell))

    def _admits_replay(self, rule: Filter, state: _State, who: str, new: Composite) -> bool:
        """``_admits`` by replaying every view's whole history through ``rule.admits``."""
        mine = state.charges if who == "*" else [c for c in state.charges if c.analyst == who]
        history = [c.event for c in mine]
        for seen in views_with(history, new, _cell_of):
            if not rule.admits(events_for(rule.name, seen[:-1]), events_for(rule.name, [new])):
                return False
        return True

    def _decide(
        self,
        event: Composite,
        analyst: str | None,
        records: Sequence[Record],
        period: PeriodCharge | None = None,
    ) -> None:
        with self._lock:
            state = self._state(records)
            self._decide_on(state, event, analyst)
            if period is not None and state.periods is not None:
                # Each period it reads, under its budget for the person-period unit.
                state.periods.check(period)

    def _decide_on(self, state: _State, event: Composite, analyst: str | None) -> None:
        cap = (state.epsilon, state.delta)
        rule = self._rule(cap, True)
        if not self._admits(rule, state, "*", event):
            why = self._refusal(state, rule, "*", cap, event)
            raise BudgetExceededError(
                f"this query (epsilon {_shown(event.epsilon)}, delta {_shown(event.delta)}) "
                f"would take the data set over its budget under the {self.name} filter "
                f"({why}); nothing was charged"
            )
        if analyst is None and self.spec.require_analyst:
            # Checked by the session before anything (dpsql.session.pipeline.Pipeline.admit);
            # here too, since every charge passes here.
            raise BudgetExceededError(
                "the policy admits named analysts only (budget.require_analyst); nothing was "
                "charged"
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
                why = self._refusal(state, share, analyst, state.shares[analyst], event)
                raise BudgetExceededError(
                    f"this query (epsilon {_shown(event.epsilon)}) would take analyst "
                    f"{analyst} over their share of the budget ({why}); nothing was charged"
                )

    def _refusal(
        self,
        state: _State,
        rule: Filter,
        who: str,
        cap: tuple[Fraction, Fraction],
        new: Composite,
    ) -> str:
        """Why ``rule`` refuses ``new`` for ``who``: what its own figure would reach, and what
        is left of ``cap`` read as ``rule`` reads the spend (left rounded down, the figure
        rounded up: a refusal never overstates what remains)."""
        spent: Spent
        if isinstance(rule, BasicFilter):
            spent, delta = state.worst(who, None)
            eps_after, delta_after = state.worst(who, new.cell)
            reach = (
                f"its sums would reach epsilon {_up(eps_after + new.epsilon)} of "
                f"{_shown(cap[0])}, delta {_up(delta_after + new.delta)} of {_shown(cap[1])}"
            )
        else:
            spent, delta = self._deciding(state, rule, who)
            after = self._would_spend(state, rule, who, new)
            reach = (
                f"its own epsilon would reach {_up(after)} of {_shown(cap[0])}"
                if math.isfinite(after)
                else "it would certify nothing: the deltas would pass the part of delta it "
                "keeps for them, or it cannot bound the query"
            )
        left = cap[0] - spent if math.isfinite(spent) else Fraction(0)
        return (
            f"{reach}; epsilon {_down(left)} of {_shown(cap[0])} left, "
            f"delta {_down(cap[1] - delta)} of {_shown(cap[1])}"
        )

    def charge(
        self,
        event: Composite,
        query: str,
        analyst: str | None,
        details: Mapping[str, Any] | None = None,
        *,
        wait: bool = True,
    ) -> Charge:
        """Decide and record the charge in one ledger transaction, or raise
        ``BudgetExceededError`` and record nothing. ``wait=False``: return once it is
        committed, and call ``on_disk`` before releasing anything under it."""
        payload = {
            "query": query,
            "event": composite_to_json(event),
            "epsilon": str(event.epsilon),
            "delta": str(event.delta),
            "accountant": self.name,
            **(details or {}),
        }
        read = payload.get("periods")
        period = PeriodCharge.of(read) if isinstance(read, Mapping) else None
        record = self.store.append(
            "charge", payload, analyst,
            lambda records: self._decide(event, analyst, records, period), wait=wait,
        )  # fmt: skip
        self._parsed[record.seq] = event
        return Charge(record.time, analyst, query, event, record.seq)

    def on_disk(self, charge: Charge) -> None:
        """Return once ``charge`` is on disk and anchored (``charge``'s ``wait=False``)."""
        self.store.on_disk(charge.seq)

    def refusal(
        self, event: Composite, analyst: str | None, period: PeriodCharge | None = None
    ) -> str | None:
        """Why ``event`` would be refused now for ``analyst`` (the message a charge would
        raise), or None where it fits: the same decision on the ledger as it stands, recording
        nothing (a dry run: EXPLAIN's fit, a refusal's largest epsilon that fits)."""
        try:
            self._decide(event, analyst, self.store.records(), period)
        except BudgetExceededError as exc:
            return str(exc)
        return None

    def trial(self) -> Budget:
        """The same filter over a copy of the ledger's records, in memory: it decides as the
        ledger would, and nothing it records reaches the ledger (a workload's admission, the
        rounds of what-if)."""
        copy = MemoryLedger()
        for record in self.store.records():
            copy.append(record.kind, record.payload, record.analyst)
        return Budget(self.dataset, self.spec, copy, self._accountants, replay=self.replay,
                      periods=self.periods)  # fmt: skip

    def rounds(
        self, events: Sequence[Composite], analyst: str | None, most: int
    ) -> tuple[int, str | None]:
        """How many rounds of ``events`` (each charged once per round, in order, as
        ``analyst``) this filter would admit from the ledger as it stands, at most ``most``; and
        why the next would be refused (None at ``most``). Decided on a ``trial``: nothing is
        recorded (what-if on real queries)."""
        if not events:
            return most, None
        trial = self.trial()
        for done in range(most):
            for event in events:
                try:
                    trial.charge(event, "what-if", analyst, {})
                except BudgetExceededError as exc:
                    return done, str(exc)
        return most, None

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

    def period_rows(self, periods: Sequence[tuple[str, Any, Any]]) -> list[dict[str, Any]]:
        """Each of ``periods`` (block id, start, end) with its unit-level spend and what is left
        of its budget (``PeriodSpends.rows``); empty without a person-within-period unit."""
        records = self.store.records()
        with self._lock:
            state = self._state(records)
            return [] if state.periods is None else state.periods.rows(periods)

    def views(self, charges: Sequence[Charge] | None = None) -> list[list[Composite]]:
        """The histories that bound every unit's (``dpsql.accounting.budget.parallel``: one per cell
        of a partition family, or the whole history when no query was pinned). The guarantee is
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
            eps: Spent
            eps, delta = basic
            if not isinstance(decider, BasicFilter):
                eps, delta = self._deciding(state, decider)
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
            functools.partial(self._figures, charges, count, float(state.delta), basic[0], eps),
            share,
            state.adaptive_cap,
            basic if state.adaptive_cap is not None else None,
            None if self.periods is None else self.periods.table,
        )


def _cell_of(event: Composite) -> Cell | None:
    return event.cell


def _epsilon_total(budget: Budget, spec: BudgetSpec) -> Fraction:
    """The policy's epsilon, or with a rho budget the epsilon the zCDP filter certifies."""
    if spec.epsilon is not None:
        return spec.epsilon
    decider = budget._decider(None, spec.delta, spec.rho)
    assert isinstance(decider, ZcdpFilter)  # a rho budget goes with the zcdp filter
    return Fraction(decider.epsilon_cap)
