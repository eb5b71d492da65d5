"""Zero-concentrated DP (Bun, Steinke 2016): rho adds, with the CKS conversion to (epsilon, delta).

Every event is delta-approximately rho-zCDP (its map ``Event.zcdp``); rhos and deltas add under
composition (Bun, Steinke 2016, Lemma 2.3 and Lemma 8.3), and the sum converts to
(epsilon, delta' + sum delta) by the Canonne-Kamath-Steinke conversion (CKS 2020, Corollary 13)
at delta'. All sums are exact rationals.

Filter: admitting while sum rho <= rho_cap and sum delta <= approx_delta_cap, both fixed before
the first query, is valid under fully adaptive choice of each query's rho (Feldman, Zrnic 2021,
the Renyi filter at every order at once; Whitehouse, Ramdas, Rogers, Wu 2023, approximate zCDP
filter). A cap given as (epsilon_cap, delta_cap) becomes the largest rho_cap whose conversion at
delta_cap - approx_delta_cap is at most epsilon_cap. An event with no zCDP map makes the
history unbounded (``math.inf``), and the filter refuses it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from fractions import Fraction

from dpsql.accounting.theorems.base import GroupCache, agreeing
from dpsql.mechanisms.conversions import (
    frac_down,
    frac_up,
    rho_for,
    zcdp_to_delta,
    zcdp_to_dp,
)
from dpsql.mechanisms.events import Event

__all__ = ["ZcdpAccountant", "ZcdpFilter", "ZcdpTally", "composed_zcdp"]


def composed_zcdp(groups: Iterable[tuple[Event, int]]) -> tuple[Fraction, Fraction] | None:
    """(sum rho, sum delta), exactly, of a history given as (event, multiplicity) groups; None
    if an event has no zCDP map."""
    rho, delta = Fraction(0), Fraction(0)
    for event, count in groups:
        pair = event.zcdp()
        if pair is None:
            return None
        rho += count * pair[0]
        delta += count * pair[1]
    return rho, delta


class ZcdpAccountant:
    """Odometer: CKS conversion of the summed rho, valid for parameters fixed in advance; as an
    admission rule with its rho cap fixed in advance, ``ZcdpFilter`` is valid adaptively."""

    name = "zcdp"
    # Adaptive rhos summed and read now bound nothing: the zCDP filter needs its cap fixed first
    # (WRRW 2023), and odometers pay more than fixed composition (RRUV 2016, lower bound).
    fixed_in_advance = True

    def __init__(self) -> None:
        self._groups = GroupCache()

    def epsilon(self, history: Sequence[Event], delta: float) -> float:
        composed = composed_zcdp(self._groups(history))
        return math.inf if composed is None else self.epsilon_of(*composed, delta)

    @staticmethod
    def epsilon_of(rho: Fraction, approx_delta: Fraction, delta: float) -> float:
        """The figure from the summed (rho, delta) (``composed_zcdp``, ``ZcdpTally``)."""
        share = frac_down(Fraction(delta) - approx_delta)
        if share <= 0:
            return 0.0 if rho == 0 and approx_delta <= Fraction(delta) else math.inf
        return zcdp_to_dp(frac_up(rho), share)

    def delta(self, history: Sequence[Event], epsilon: float) -> float:
        composed = composed_zcdp(self._groups(history))
        if composed is None:
            return 1.0
        rho, approx_delta = composed
        converted = zcdp_to_delta(frac_up(rho), epsilon)
        return min(1.0, frac_up(Fraction(converted) + approx_delta))


class ZcdpFilter:
    """zCDP filter: admits while sum rho <= rho_cap and sum delta <= approx_delta_cap.

    Give either (epsilon_cap, delta_cap), from which rho_cap is derived, or ``rho_cap`` with the
    delta_cap at which the guarantee is stated (epsilon_cap is then its CKS conversion, rounded
    up). delta_cap must exceed approx_delta_cap: the difference is the conversion's delta.
    """

    name = "zcdp"

    def __init__(
        self,
        epsilon_cap: Fraction | None = None,
        delta_cap: Fraction = Fraction(0),
        *,
        rho_cap: Fraction | None = None,
        approx_delta_cap: Fraction = Fraction(0),
    ):
        if (epsilon_cap is None) == (rho_cap is None):
            raise ValueError("give exactly one of epsilon_cap and rho_cap")
        if not 0 <= approx_delta_cap < delta_cap < 1:
            raise ValueError("need 0 <= approx_delta_cap < delta_cap < 1")
        self.delta_cap = Fraction(delta_cap)
        self.approx_delta_cap = Fraction(approx_delta_cap)
        share = frac_down(self.delta_cap - self.approx_delta_cap)
        if rho_cap is not None:
            self.rho_cap = Fraction(rho_cap)
            self.epsilon_cap = Fraction(zcdp_to_dp(frac_up(self.rho_cap), share))
        else:
            assert epsilon_cap is not None
            self.epsilon_cap = Fraction(epsilon_cap)
            self.rho_cap = Fraction(rho_for(frac_down(self.epsilon_cap), share))
        self._groups = GroupCache()

    def admits(self, history: Sequence[Event], new: Sequence[Event]) -> bool:
        composed = composed_zcdp(self._groups(history, new))
        return composed is not None and self._within(*composed)

    def _within(self, rho: Fraction, delta: Fraction) -> bool:
        return rho <= self.rho_cap and delta <= self.approx_delta_cap

    def tally(self) -> ZcdpTally:
        return ZcdpTally()

    def admits_tally(self, tally: ZcdpTally, new: Sequence[Event]) -> bool:
        """``admits`` from the running sums: the same exact rationals, so the same decision."""
        composed = composed_zcdp([(e, 1) for e in new])
        if composed is None or tally.unbounded:
            return False
        # rho and delta add (module docstring)
        return self._within(tally.rho + composed[0], tally.delta + composed[1])

    def epsilon_spent(self, tally: ZcdpTally, new: Sequence[Event] = ()) -> Fraction | float:
        """The filter's own epsilon for the tally's history followed by ``new``: its summed rho
        through the conversion that set its rho cap (CKS 2020, Corollary 13, at delta_cap -
        approx_delta_cap), agreeing with the decision (``base.agreeing``: the cap is that
        conversion's inverse to a relative 1e-9). ``math.inf`` once the approximate deltas pass
        approx_delta_cap, or once an event has no zCDP map."""
        composed = composed_zcdp([(e, 1) for e in new])
        if composed is None or tally.unbounded:
            return math.inf
        rho, delta = tally.rho + composed[0], tally.delta + composed[1]  # Bun, Steinke 2016
        if delta > self.approx_delta_cap:
            return math.inf
        if rho == 0:
            return Fraction(0)
        share = frac_down(self.delta_cap - self.approx_delta_cap)
        figure = Fraction(zcdp_to_dp(frac_up(rho), share))
        return agreeing(figure, rho <= self.rho_cap, self.epsilon_cap)


class ZcdpTally:
    """Running (sum rho, sum delta) of a history, exact; ``unbounded`` once an event has no
    zCDP map."""

    def __init__(self) -> None:
        self.rho, self.delta = Fraction(0), Fraction(0)
        self.unbounded = False

    def add(self, event: Event, count: int = 1) -> None:
        pair = event.zcdp()
        if pair is None:
            self.unbounded = True
            return
        self.rho += count * pair[0]  # Bun, Steinke 2016, Lemma 2.3 (and 8.3 for the deltas)
        self.delta += count * pair[1]
