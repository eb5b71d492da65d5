"""What the budget reads of the spend: the deciding filter's own figure, a share's, each odometer's.

The deciding filter's (epsilon, additive delta) spent by a history, worst view, is the filter's
own bound (``Filter.epsilon_spent``: the epsilon its rule certifies, <= its cap iff it admits)
read from the running tallies of its views (``_deciding``: O(views)), or from the views' whole
histories (``_deciding_replay``, the reference); an analyst's share is read the same way on
their own history under their share's filter (``_share``), and every accountant's figure of the
odometer report is computed over the views (``_figures``), labelled by what makes it valid
under fully adaptive choice (``_note``). The ``Readings`` methods are part of
``dpsql.accounting.budget.budget.Budget``, which reads under its lock.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING

from dpsql.accounting.budget.report import Charge, Figure, ShareReport
from dpsql.accounting.budget.state import _additive_delta, _State, events_for
from dpsql.accounting.theorems.base import Accountant, Filter, Spent
from dpsql.accounting.theorems.basic import BasicFilter
from dpsql.mechanisms.events import Composite


class Readings:
    """The reading part of ``Budget``: what a history spent, as the filter and each accountant
    read it."""

    _accountants: tuple[Accountant, ...]
    _lock: threading.RLock

    if TYPE_CHECKING:

        @property
        def name(self) -> str: ...

        def _rule(self, cap: tuple[Fraction, Fraction], total: bool) -> Filter: ...

        def views(self, charges: Sequence[Charge] | None = None) -> list[list[Composite]]: ...

    def _share(self, state: _State, analyst: str) -> ShareReport:
        """What ``analyst`` spent of their share, as the filter that decides their queries
        (``_decide_on``: the share's cap, their own history) reads it."""
        cap = state.shares[analyst]
        rule = self._rule(cap, False)
        mine = [c for c in state.charges if c.analyst == analyst]
        eps: Spent
        eps, delta = state.worst(analyst, None)
        if not isinstance(rule, BasicFilter):
            eps, delta = self._deciding(state, rule, analyst)
        return ShareReport(analyst, cap[0], cap[1], eps, delta, len(mine))

    def _deciding(self, state: _State, decider: Filter, who: str = "*") -> tuple[Spent, Fraction]:
        """The deciding filter's own (epsilon, additive delta) spent by ``who``'s history ("*":
        the data set's), worst view: ``decider.epsilon_spent`` of every view's running tally,
        the very number it compares with its cap when it decides (``base.Filter``). The same
        numbers as from the views' histories (``_deciding_replay``)."""
        mine = state.views.get(who)
        if mine is None:
            return Fraction(0), Fraction(0)
        readings = [decider.epsilon_spent(tally) for _, tally in mine.tallies.values()]
        additive = [mine.additive_in(view) for view, _ in mine.tallies.values()]
        return max(readings), max(additive)

    def _would_spend(self, state: _State, rule: Filter, who: str, new: Composite) -> Spent:
        """The deciding filter's own epsilon after ``new``, worst of the views that hold it:
        above the cap exactly when it refuses ``new`` (``base.Filter``)."""
        mine = state.views.get(who)
        if mine is None:
            assert state.new_tally is not None  # a filter other than basic keeps tallies
            tallies = [state.new_tally()]
        else:
            tallies = list(mine.holding(new.cell))
        events = events_for(rule.name, [new])
        return max(rule.epsilon_spent(tally, events) for tally in tallies)

    def _deciding_replay(self, decider: Filter, charges: list[Charge]) -> tuple[Spent, Fraction]:
        """``_deciding`` from the views' whole histories (O(history)), each folded into a fresh
        tally of the filter."""
        readings: list[Spent] = []
        seen = self.views(charges)
        for view in seen:
            tally = decider.tally()
            for event in events_for(decider.name, view):
                tally.add(event)
            readings.append(decider.epsilon_spent(tally))
        return max(readings), max(_additive_delta(v) for v in seen)

    def _figures(
        self, charges: list[Charge], count: int, delta: float, basic: Fraction, deciding: Spent
    ) -> tuple[Figure, ...]:
        """Every accountant's reading of the first ``count`` charges, worst view, labelled; the
        deciding family's row is the filter's own figure (``deciding``), not its odometer's."""
        with self._lock:  # the list grows under it
            history = charges[:count]
        seen = self.views(history)
        figures = [
            Figure("basic", float(basic), "decides" if self.name == "basic" else _note(None))
        ]
        for accountant in self._accountants:
            if accountant.name == self.name:
                figures.append(Figure(accountant.name, float(deciding), "decides"))
                continue
            readings = [
                accountant.epsilon(events_for(accountant.name, v), delta) if v else 0.0
                for v in seen
            ]
            figures.append(Figure(accountant.name, max(readings), _note(accountant)))
        return tuple(figures)


def _note(accountant: Accountant | None) -> str:
    """The label of an odometer's reading under fully adaptive choice of every query's
    parameters (``None``: basic composition, whose sums are a valid odometer, Rogers, Roth,
    Ullman, Vadhan 2016). Each accountant's ``fixed_in_advance`` cites why (its module)."""
    if accountant is not None and accountant.fixed_in_advance:
        return "as if fixed in advance"
    return "valid adaptively"
