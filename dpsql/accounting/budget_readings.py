"""What the budget reads of the spend: the deciding filter's figure, a share's, every odometer's.

The deciding filter's (epsilon, additive delta) spent by a history, worst view, is read from the
running tallies of its views (``_deciding``: O(views)), or from the views' whole histories
(``_deciding_replay``) where the tallies cannot tell; an analyst's share is read the same way
on their own history (``_share``), and every accountant's figure of the odometer report is
computed over the views (``_figures``). The ``Readings`` methods are part of
``dpsql.accounting.budget.Budget``, which reads under its lock.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING

from dpsql.accounting.advanced import AdvancedFilter, AdvancedTally, wrrw_bound
from dpsql.accounting.base import Accountant, Filter, Tally
from dpsql.accounting.budget_report import Charge, Figure, ShareReport
from dpsql.accounting.budget_state import _additive_delta, _State, events_for
from dpsql.accounting.events import Composite
from dpsql.accounting.parallel import View, member
from dpsql.accounting.pld import PldFilter, PldTally
from dpsql.accounting.rdp import RdpAccountant, RdpTally
from dpsql.accounting.zcdp import ZcdpAccountant, ZcdpTally


class Readings:
    """The reading part of ``Budget``: what a history spent, as the filter and each accountant
    read it."""

    _accountants: tuple[Accountant, ...]
    _lock: threading.RLock

    if TYPE_CHECKING:

        @property
        def name(self) -> str: ...

        def _rule(
            self, cap: tuple[Fraction, Fraction], total: bool
        ) -> Filter | tuple[Fraction, Fraction]: ...

        def views(self, charges: Sequence[Charge] | None = None) -> list[list[Composite]]: ...

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
            elif isinstance(tally, PldTally) and isinstance(decider, PldFilter):
                # the filter's own epsilon at its delta cap, from its rigorous composition
                readings.append(decider.epsilon_spent(tally))
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
