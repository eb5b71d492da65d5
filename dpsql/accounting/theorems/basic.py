"""Basic (sequential) composition in exact rational arithmetic.

The epsilons and deltas of all events add (Dwork, McSherry, Nissim, Smith 2006; Dwork, Roth 2014,
Theorem 3.16). As a filter, a cap on both sums is valid when every query's parameters are chosen
adaptively from earlier answers (Rogers, Roth, Ullman, Vadhan 2016, "Privacy Odometers and
Filters", Theorem 3.5 / the basic filter). Sums are Fractions, so 100 charges of epsilon 1/100
fill a budget of 1 exactly (parse epsilons from decimal text: ``Fraction(0.01)`` > 1/100).

Each event's (epsilon, delta) pair comes from ``basic_cost`` (``events.basic_pair``, which every
query's ``Composite`` reads too): the pair an event states, except that a targeted event
(continuous or discrete Gaussian, zCDP: ``Event.targeted``) is charged at its target epsilon with
delta = max(target delta, the mechanism's own delta at that epsilon, ``Event.profile``), so a
missing or wrong calibration never makes its cost smaller than its curve gives.

The budget decides basic composition with ``BasicFilter`` from its running sums of the queries'
pairs, and reports them as they are (``BasicSpend``: the sums' epsilon, their delta beside it);
``BasicAccountant`` is the odometer that reads them at a given delta.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from fractions import Fraction

from dpsql.accounting.theorems.base import GroupCache
from dpsql.mechanisms.conversions import frac_up
from dpsql.mechanisms.events import Event, basic_pair

__all__ = [
    "BasicAccountant",
    "BasicFilter",
    "BasicSpend",
    "BasicTally",
    "basic_cost",
    "basic_totals",
]


# The (epsilon, delta)-DP pair of one event, as exact rationals, guarded for the Gaussian
# family (``events.basic_pair``: never below the mechanism's own curve).
basic_cost = basic_pair


def basic_totals(groups: Iterable[tuple[Event, int]]) -> tuple[Fraction, Fraction]:
    """(sum of epsilons, sum of deltas), exactly, over (event, multiplicity) groups."""
    eps, delta = Fraction(0), Fraction(0)
    for event, count in groups:
        e, d = basic_cost(event)
        eps += count * e
        delta += count * d
    return eps, delta


def _decimal(x: float) -> Fraction:
    """A float argument read as the decimal it prints as (``1e-7`` means 1/10^7, not the float
    just below it): the figure asked for is the one the caller wrote."""
    return Fraction(repr(float(x)))


class BasicAccountant:
    """Odometer by basic composition: (sum eps, sum delta). Valid adaptively."""

    name = "basic"
    # The sums bound the loss at every time whatever was chosen adaptively: a valid odometer
    # (Rogers, Roth, Ullman, Vadhan 2016, basic composition; WRRW 2023).
    fixed_in_advance = False

    def __init__(self) -> None:
        self._groups = GroupCache()

    def epsilon(self, history: Sequence[Event], delta: float) -> float:
        """Sum of epsilons if the deltas sum to at most ``delta``; ``math.inf`` otherwise."""
        eps, total_delta = basic_totals(self._groups(history))
        return frac_up(eps) if total_delta <= _decimal(delta) else math.inf

    def delta(self, history: Sequence[Event], epsilon: float) -> float:
        """Sum of deltas if the epsilons sum to at most ``epsilon``; ``math.inf`` otherwise."""
        eps, total_delta = basic_totals(self._groups(history))
        return min(1.0, frac_up(total_delta)) if eps <= _decimal(epsilon) else math.inf


class BasicSpend:
    """The basic pair spent, (sum eps, sum delta), read as its epsilon whatever delta is asked:
    what the budget's running sums hold under basic composition, shown beside their delta by the
    report, the composition curves and what-if. Valid adaptively, as the sums are."""

    name = "basic"
    fixed_in_advance = False  # the sums bound the loss whatever was chosen (RRUV 2016)

    def __init__(self) -> None:
        self._groups = GroupCache()

    def epsilon(self, history: Sequence[Event], delta: float) -> float:
        """The sum of the epsilons (to the nearest float), at the sum of the deltas."""
        return float(basic_totals(self._groups(history))[0])

    def delta(self, history: Sequence[Event], epsilon: float) -> float:
        """The sum of the deltas (rounded up) if the epsilons sum to at most ``epsilon``."""
        eps, total_delta = basic_totals(self._groups(history))
        return min(1.0, frac_up(total_delta)) if eps <= _decimal(epsilon) else math.inf


class BasicFilter:
    """Admits while both sums stay within (epsilon_cap, delta_cap): valid adaptively
    (Rogers, Roth, Ullman, Vadhan 2016)."""

    name = "basic"

    def __init__(self, epsilon_cap: Fraction, delta_cap: Fraction = Fraction(0)):
        if epsilon_cap < 0 or not 0 <= delta_cap <= 1:
            raise ValueError("caps must satisfy epsilon >= 0 and 0 <= delta <= 1")
        self.epsilon_cap = Fraction(epsilon_cap)
        self.delta_cap = Fraction(delta_cap)
        self._groups = GroupCache()

    def admits(self, history: Sequence[Event], new: Sequence[Event]) -> bool:
        eps, delta = basic_totals(self._groups(history, new))
        return eps <= self.epsilon_cap and delta <= self.delta_cap

    def tally(self) -> BasicTally:
        return BasicTally()

    def admits_tally(self, tally: BasicTally, new: Sequence[Event]) -> bool:
        """``admits`` from the running sums (exact, so the same decision)."""
        eps, delta = basic_totals([(e, 1) for e in new])
        return tally.epsilon + eps <= self.epsilon_cap and tally.delta + delta <= self.delta_cap

    def epsilon_spent(self, tally: BasicTally, new: Sequence[Event] = ()) -> Fraction | float:
        """The exact sum of the epsilons of the tally's history and ``new``; ``math.inf`` once
        their deltas pass delta_cap (Dwork, Roth 2014, Theorem 3.16)."""
        eps, delta = basic_totals([(e, 1) for e in new])
        if tally.delta + delta > self.delta_cap:
            return math.inf
        return tally.epsilon + eps


class BasicTally:
    """Running exact sums of the epsilons and deltas (Dwork, Roth 2014, Theorem 3.16), from 0
    or from sums kept elsewhere (the budget's worst view)."""

    def __init__(self, epsilon: Fraction = Fraction(0), delta: Fraction = Fraction(0)) -> None:
        self.epsilon, self.delta = epsilon, delta

    def add(self, event: Event, count: int = 1) -> None:
        eps, delta = basic_cost(event)
        self.epsilon += count * eps
        self.delta += count * delta
