"""Gaussian DP (Dong, Roth, Su 2019): exact for continuous Gaussian mechanisms.

N(0, sigma^2) with L2 sensitivity Delta is exactly mu-GDP with mu = Delta/sigma, and mu-GDP
mechanisms compose to sqrt(sum mu_i^2)-GDP (Dong, Roth, Su 2019, Corollary 3.3), whose
(epsilon, delta) curve is ``conversions.gdp_delta``. Sums of mu^2 are exact rationals of the
floats given.

Only continuous Gaussians are GDP here (``Event.gdp_mu_squared``). Any other event makes the
history not mu-GDP for any finite mu that dpsql can prove: the discrete Gaussian in particular
is NOT dominated by the continuous Gaussian of the same sigma (Canonne, Kamath, Steinke 2020; at
sigma 1, delta 1e-9 it needs epsilon 6.32 against 6.17), so ``epsilon``/``delta`` return
``math.inf`` ("no bound") and the filter refuses such events.

Filter: admitting while sum mu_i^2 <= mu_cap^2, with mu_i chosen adaptively, is
mu_cap-GDP (Smith, Thakurta 2022, fully adaptive GDP composition; Koskela, Tobaben, Honkela
2022, arXiv:2209.15596), so (epsilon_cap, delta_cap)-DP for mu_cap solving
gdp_delta(mu_cap, epsilon_cap) = delta_cap (rounded down).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from fractions import Fraction

from dpsql.accounting.theorems.base import GroupCache, agreeing
from dpsql.mechanisms.conversions import frac_down, frac_up, gdp_delta, gdp_epsilon, gdp_mu_cap
from dpsql.mechanisms.events import Event

__all__ = ["GdpAccountant", "GdpFilter", "GdpTally", "composed_mu"]


def composed_mu_squared(groups: Iterable[tuple[Event, int]]) -> Fraction | None:
    """sum mu_i^2 exactly over (event, multiplicity) groups, or None if some event is not
    exactly mu-GDP (its map ``Event.gdp_mu_squared``: only the continuous Gaussian's)."""
    total = Fraction(0)
    for event, count in groups:
        squared = event.gdp_mu_squared()
        if squared is None:
            return None
        total += count * squared
    return total


def composed_mu(groups: Iterable[tuple[Event, int]]) -> float | None:
    """The composed mu (rounded up), or None if the history is not GDP."""
    squared = composed_mu_squared(groups)
    return None if squared is None else math.nextafter(math.sqrt(frac_up(squared)), math.inf)


class GdpAccountant:
    """Odometer: the exact (epsilon, delta) curve of the composed mu, valid for parameters fixed
    in advance; ``GdpFilter``, its mu cap fixed in advance, is valid adaptively."""

    name = "gdp"
    # Adaptive mus read now bound nothing: the GDP filter needs its cap fixed first (Smith,
    # Thakurta 2022), and odometers pay more than fixed composition (RRUV 2016, lower bound).
    fixed_in_advance = True

    def __init__(self) -> None:
        self._groups = GroupCache()

    def epsilon(self, history: Sequence[Event], delta: float) -> float:
        mu = composed_mu(self._groups(history))
        if mu is None:
            return math.inf
        return 0.0 if mu == 0 else gdp_epsilon(mu, delta)

    def delta(self, history: Sequence[Event], epsilon: float) -> float:
        mu = composed_mu(self._groups(history))
        return math.inf if mu is None else gdp_delta(mu, epsilon)


class GdpFilter:
    """Fully adaptive GDP filter: admits continuous Gaussians while sum mu^2 <= mu_cap^2."""

    name = "gdp"

    def __init__(self, epsilon_cap: Fraction, delta_cap: Fraction):
        if epsilon_cap < 0 or not 0 < delta_cap < 1:
            raise ValueError("need epsilon_cap >= 0 and 0 < delta_cap < 1")
        self.epsilon_cap = Fraction(epsilon_cap)
        self.delta_cap = Fraction(delta_cap)
        self.mu_cap = gdp_mu_cap(frac_down(self.epsilon_cap), frac_down(self.delta_cap))
        self._mu_cap_squared = Fraction(self.mu_cap) ** 2
        self._groups = GroupCache()

    def admits(self, history: Sequence[Event], new: Sequence[Event]) -> bool:
        squared = composed_mu_squared(self._groups(history, new))
        return squared is not None and squared <= self._mu_cap_squared

    def tally(self) -> GdpTally:
        return GdpTally()

    def admits_tally(self, tally: GdpTally, new: Sequence[Event]) -> bool:
        """``admits`` from the running sum of mu^2 (exact, so the same decision)."""
        squared = composed_mu_squared([(e, 1) for e in new])
        if squared is None or tally.mu_squared is None:
            return False  # not GDP: the filter refuses (module docstring)
        return tally.mu_squared + squared <= self._mu_cap_squared

    def epsilon_spent(self, tally: GdpTally, new: Sequence[Event] = ()) -> Fraction | float:
        """The filter's own epsilon for the tally's history followed by ``new``: the composed mu
        (Dong, Roth, Su 2019, Corollary 3.3) through the exact GDP curve at delta_cap, agreeing
        with the decision on sum mu^2 (``base.agreeing``); ``math.inf`` if not GDP."""
        squared = composed_mu_squared([(e, 1) for e in new])
        if squared is None or tally.mu_squared is None:
            return math.inf
        squared += tally.mu_squared
        if squared == 0:
            return Fraction(0)
        mu = math.nextafter(math.sqrt(frac_up(squared)), math.inf)
        figure = Fraction(gdp_epsilon(mu, frac_down(self.delta_cap)))
        return agreeing(figure, squared <= self._mu_cap_squared, self.epsilon_cap)


class GdpTally:
    """Running sum of mu^2 (Dong, Roth, Su 2019, Corollary 3.3), None once an event is not GDP."""

    def __init__(self) -> None:
        self.mu_squared: Fraction | None = Fraction(0)

    def add(self, event: Event, count: int = 1) -> None:
        if self.mu_squared is not None:
            squared = composed_mu_squared([(event, count)])
            self.mu_squared = None if squared is None else self.mu_squared + squared
