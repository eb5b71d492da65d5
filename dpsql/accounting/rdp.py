"""Renyi DP composition over a fixed grid of orders (Mironov 2017), as odometer and filter.

RDP at a fixed order adds under composition (Mironov 2017, Proposition 1); approximate events
(partition selection, (epsilon, delta) events) add their deltas (``curves`` module docstring).

Orders: ``DEFAULT_ORDERS`` runs from 1.25 to 256 in steps of about 10-25%, plus 384 ... 8192 for
the long, low-noise histories whose best order is large (k Gaussians of noise sigma: the best
order is about 1 + sigma sqrt(2 ln(1/delta)/k)). The grid is fixed before any query.

- Odometer (``RdpAccountant``): the best order of the grid with the improved conversion
  (Canonne, Kamath, Steinke 2020, Proposition 12). Reading a history that is already fixed, each
  order gives a valid bound, so their minimum is valid.
- Filter (``RdpFilter``; Feldman, Zrnic 2021, "Individual Privacy Accounting via a Renyi
  Filter", Theorem 3.1): at an order alpha fixed in advance, admitting while the composed RDP
  stays within a budget B keeps the whole interaction (alpha, B)-RDP under fully adaptive
  choice of each query's parameters. Over m orders, admitting while *some* order is within its
  budget is valid with delta split equally (a union bound): partition the outcomes by the first
  order whose budget held at the end; on that part the transcript is the one the single-order
  filter would produce, which is (epsilon, delta/m)-DP, and the m parts add up.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from fractions import Fraction
from functools import lru_cache

from dpsql.accounting.conversions import frac_down, frac_up, rdp_to_delta, rdp_to_dp, round_down
from dpsql.accounting.curves import GroupCache, approx_rdp, zcdp
from dpsql.accounting.events import Event

__all__ = ["DEFAULT_ORDERS", "RdpAccountant", "RdpFilter", "RdpTally", "composed_rdp"]

DEFAULT_ORDERS: tuple[float, ...] = (
    *(1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0),
    *(12.0, 14.0, 16.0, 20.0, 24.0, 28.0, 32.0, 40.0, 48.0, 56.0, 64.0, 80.0, 96.0, 112.0),
    *(128.0, 160.0, 192.0, 224.0, 256.0, 384.0, 512.0, 768.0, 1024.0, 2048.0, 4096.0, 8192.0),
)


@lru_cache(maxsize=65536)
def _event_curve(event: Event, orders: tuple[float, ...]) -> tuple[tuple[float, ...], Fraction]:
    # The approximate delta, exactly (the same delta approx_rdp carries as a float).
    return tuple(approx_rdp(event, alpha)[0] for alpha in orders), zcdp(event)[1]


def composed_rdp(
    groups: Iterable[tuple[Event, int]], orders: tuple[float, ...]
) -> tuple[list[float], Fraction]:
    """(RDP at each order, exact sum of the approximate deltas) of a history given as
    (event, multiplicity) groups (``base.grouped``). Sums use ``math.fsum`` (correctly
    rounded): the result does not depend on the order of events."""
    curves = [(_event_curve(event, orders), count) for event, count in groups]
    totals = [
        math.fsum(count * curve[j] for (curve, _), count in curves) for j in range(len(orders))
    ]
    delta = sum((count * d for (_, d), count in curves), Fraction(0))
    # fsum is correctly rounded; each product may have lost half an ulp: nudge up.
    return [math.nextafter(t, math.inf) if t > 0 else t for t in totals], delta


class RdpAccountant:
    """Odometer: min over the grid of the improved RDP-to-DP conversion. Valid for a history
    whose parameters were fixed in advance; as an admission rule use ``RdpFilter`` (choosing
    the order after the fact is not a filter)."""

    name = "rdp"
    # Adaptive parameters, best order after the fact, all of delta: no union bound paid; RDP
    # odometers need one over budgets and orders (Lecuyer 2021; RRUV 2016, odometers pay more).
    fixed_in_advance = True

    def __init__(self, orders: Sequence[float] = DEFAULT_ORDERS):
        if not orders or min(orders) <= 1:
            raise ValueError("RDP orders must be > 1")
        self.orders = tuple(float(a) for a in orders)
        self._groups = GroupCache()

    def epsilon(self, history: Sequence[Event], delta: float) -> float:
        if not history:
            return 0.0
        return self.epsilon_of(*composed_rdp(self._groups(history), self.orders), delta)

    def epsilon_of(self, rdps: Sequence[float], approx_delta: Fraction, delta: float) -> float:
        """The figure from a composed RDP curve on this grid (``composed_rdp``, ``RdpTally``)."""
        share = frac_down(Fraction(delta) - approx_delta)  # rounded down: the safe side
        if share <= 0:
            return math.inf
        return min(rdp_to_dp(r, a, share) for r, a in zip(rdps, self.orders, strict=True))

    def delta(self, history: Sequence[Event], epsilon: float) -> float:
        if not history:
            return 0.0
        rdps, approx_delta = composed_rdp(self._groups(history), self.orders)
        best = min(rdp_to_delta(r, a, epsilon) for r, a in zip(rdps, self.orders, strict=True))
        return min(1.0, frac_up(Fraction(best) + approx_delta))


def order_budget(epsilon_cap: float, delta_share: float, alpha: float) -> float:
    """The largest RDP at ``alpha`` that converts to <= epsilon_cap at ``delta_share`` by the
    improved conversion (CKS 2020, Proposition 12 solved for the RDP), rounded down."""
    slack = math.log1p(-1 / alpha) - (math.log(delta_share) + math.log(alpha)) / (alpha - 1)
    return round_down(epsilon_cap - slack)


class RdpFilter:
    """Renyi filter (Feldman, Zrnic 2021) with cap (epsilon_cap, delta_cap).

    ``orders`` of length 1: the single order fixed in advance (the policy's), delta_cap all
    spent on the conversion. Longer: the union bound of the module docstring, each order's
    conversion at delta share (delta_cap - approx_delta_cap)/len(orders). ``approx_delta_cap``
    (fixed in advance, part of delta_cap) is the most the approximate events' deltas may add up
    to; with 0 they are never admitted. Admits iff, after ``new``, the approximate deltas fit and
    the composed RDP is within ``budgets[j]`` at some order j.
    """

    name = "rdp"

    def __init__(
        self,
        epsilon_cap: Fraction,
        delta_cap: Fraction,
        orders: Sequence[float] = DEFAULT_ORDERS,
        *,
        approx_delta_cap: Fraction = Fraction(0),
    ):
        if not 0 <= approx_delta_cap < delta_cap < 1 or epsilon_cap < 0:
            raise ValueError("need epsilon_cap >= 0 and 0 <= approx_delta_cap < delta_cap < 1")
        if not orders or min(orders) <= 1:
            raise ValueError("RDP orders must be > 1")
        self.epsilon_cap = Fraction(epsilon_cap)
        self.delta_cap = Fraction(delta_cap)
        self.approx_delta_cap = Fraction(approx_delta_cap)
        self.orders = tuple(float(a) for a in orders)
        # Union bound over the grid: delta split equally across orders (docstring).
        share = frac_down((self.delta_cap - self.approx_delta_cap) / len(self.orders))
        eps = frac_down(self.epsilon_cap)
        self.budgets = tuple(order_budget(eps, share, a) for a in self.orders)
        self._groups = GroupCache()

    def admits(self, history: Sequence[Event], new: Sequence[Event]) -> bool:
        rdps, approx_delta = composed_rdp(self._groups(history, new), self.orders)
        if approx_delta > self.approx_delta_cap:
            return False
        return any(r <= b for r, b in zip(rdps, self.budgets, strict=True))

    def tally(self) -> RdpTally:
        return RdpTally(self.orders)

    def admits_tally(self, tally: RdpTally, new: Sequence[Event]) -> bool:
        """``admits`` from the running sums: the same floats summed exactly and rounded once, so
        the same decision (``RdpTally``)."""
        if tally.orders != self.orders:
            raise ValueError("the tally was kept on another grid of orders")
        rdps, approx_delta = tally.with_events(new)
        if approx_delta > self.approx_delta_cap:
            return False
        return any(r <= b for r, b in zip(rdps, self.budgets, strict=True))

    def epsilon_spent(self, tally: RdpTally, new: Sequence[Event] = ()) -> Fraction | float:
        """The filter's own epsilon for the tally's history followed by ``new``:
        min_j (rdp_j - budgets[j]) + epsilon_cap, exactly (the floats as Fractions). At order j
        that is what the filter's own conversion certifies at its per-order share of delta
        (``budgets[j]`` is epsilon_cap minus that conversion's term), so it follows whatever
        grid and split the filter fixed; it is <= epsilon_cap iff some order is within its
        budget, which is the decision. ``math.inf`` once the approximate deltas pass
        approx_delta_cap (the filter certifies nothing then)."""
        if tally.orders != self.orders:
            raise ValueError("the tally was kept on another grid of orders")
        rdps, approx_delta = tally.with_events(new)
        if approx_delta > self.approx_delta_cap:
            return math.inf
        if approx_delta == 0 and not any(rdps):
            return Fraction(0)  # nothing released: every divergence is 0
        # Feldman, Zrnic 2021 Thm 3.1 at each order, union bound over the grid (docstring)
        gaps = [Fraction(r) - Fraction(b) for r, b in zip(rdps, self.budgets, strict=True)
                if math.isfinite(r)]  # fmt: skip
        return self.epsilon_cap + min(gaps) if gaps else math.inf


# Every finite float is an integer multiple of 2^-1074: scaled by 2^1074, sums of floats are
# exact Python integers, and one correctly rounded division gives what math.fsum gives.
_SCALE_BITS = 1074


def _fixed(x: float) -> int:
    numerator, denominator = x.as_integer_ratio()
    return numerator << (_SCALE_BITS + 1 - denominator.bit_length())


class RdpTally:
    """Running composed RDP at each order of a grid, kept so that ``composed_rdp`` of the folded
    history comes out bit for bit: per distinct event its multiplicity, and per order the exact
    sum (an integer in units of 2^-1074) of the same products ``count * curve`` that
    ``composed_rdp`` gives ``math.fsum``; infinite products are counted apart. Each event's
    multiplicity change moves one product (O(orders)); reading is one correctly rounded division
    per order (int / int is correctly rounded, as is fsum)."""

    def __init__(self, orders: tuple[float, ...]):
        self.orders = orders
        self.counts: dict[Event, int] = {}
        self.sums = [0] * len(orders)
        self.infinite = [0] * len(orders)
        self.delta = Fraction(0)

    def _move(
        self, sums: list[int], infinite: list[int], event: Event, old: int, new: int
    ) -> Fraction:
        curve, delta = _event_curve(event, self.orders)
        for j, c in enumerate(curve):
            for count, sign in ((old, -1), (new, 1)):
                if count:
                    product = count * c
                    if math.isfinite(product):
                        sums[j] += sign * _fixed(product)
                    else:
                        infinite[j] += sign
        return (new - old) * delta

    def add(self, event: Event, count: int = 1) -> None:
        old = self.counts.get(event, 0)
        self.delta += self._move(self.sums, self.infinite, event, old, old + count)
        self.counts[event] = old + count

    def with_events(self, new: Sequence[Event]) -> tuple[list[float], Fraction]:
        """``composed_rdp`` of the folded history followed by ``new`` (nothing is kept)."""
        sums, infinite, delta = list(self.sums), list(self.infinite), self.delta
        extra: dict[Event, int] = {}
        for event in new:
            extra[event] = extra.get(event, 0) + 1
        for event, k in extra.items():
            old = self.counts.get(event, 0)
            delta += self._move(sums, infinite, event, old, old + k)
        totals = [
            math.inf if inf else total / (1 << _SCALE_BITS)
            for total, inf in zip(sums, infinite, strict=True)
        ]
        # As composed_rdp: each product may have lost half an ulp, so nudge up.
        return [math.nextafter(t, math.inf) if t > 0 else t for t in totals], delta
