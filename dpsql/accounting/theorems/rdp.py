"""Renyi DP composition over a fixed grid of orders (Mironov 2017), as odometer and filter.

RDP at a fixed order adds under composition (Mironov 2017, Proposition 1); approximate events
(partition selection, (epsilon, delta) events) add their deltas (``curves`` module docstring).
Each event gives its own curve (its map ``Event.renyi``); an event without one makes the history
unbounded at every order.

Orders: ``DEFAULT_ORDERS`` spaces alpha - 1 evenly on a log scale, four orders per doubling,
from 1.0078 (alpha - 1 = 2^-7) to 8193 (2^13), 81 orders. The best order of a history moves
with its loss: k Gaussians of noise sigma are best near 1 + sigma sqrt(2 ln(1/delta)/k), so
long, high-loss histories (10^4 Gaussians of sigma 1 at delta 1e-6: about 1.05) need orders
close to 1, long low-noise ones and small caps large orders. Each order is the float
1 + m 2^n with m in (1, 1.19, 1.41, 1.68) (2^(k/4) to three digits): one correctly rounded
sum, the same float on every platform. The grid is fixed before any query. ``ORDERS_V1`` is
the earlier grid (42 orders from 1.25 to 8192), which ledgers created with it keep
(``RDP_GRIDS``).

- Odometer (``RdpAccountant``): the best order of the grid with the improved conversion
  (Canonne, Kamath, Steinke 2020, Proposition 12). Reading a history that is already fixed, each
  order gives a valid bound, so their minimum is valid.
- Filter (``RdpFilter``; Feldman, Zrnic 2021, "Individual Privacy Accounting via a Renyi
  Filter", Theorem 3.1): at an order alpha fixed in advance, admitting while the composed RDP
  stays within a budget B keeps the whole interaction (alpha, B)-RDP under fully adaptive
  choice of each query's parameters. Over m orders with conversion deltas delta_1..delta_m,
  each fixed before the first query, admitting while *some* order is within its budget is
  (epsilon, delta_1 + ... + delta_m)-DP (a union bound): partition the outcomes by the first
  order j whose budget held at the end; every query admitted kept order j within its budget
  (RDP only grows) and every refusal refused order j too, so on that part the transcript is
  the one the single-order filter at j would produce, which is (epsilon, delta_j)-DP (Theorem
  3.1 and CKS 2020, Proposition 12), and the m parts add up. Nothing in the argument needs the
  delta_j equal: only fixed in advance and summing to at most the conversion's delta.

Split (``RdpFilter``, ``main_share``): the conversion's delta D goes 9/10 to one *main* order
and 1/10 equally to all orders. The main order is the one where, at its share, the largest
zCDP budget fits (the largest budget_j / alpha_j): a public function of the caps and the grid,
fixed before the first query. Why one order can take most of delta: at a given cap, every long
stream of small Gaussian-like queries (discrete Gaussians of any sigma, discrete Laplace of
small epsilon, mixtures of them) is refused near the same order, the one where a zCDP budget
converts best (at (1, 1e-6) the best single orders of Laplace queries of epsilon 0.03 to 0.001
and of Gaussians of sigma 50 to 500 are 20.9 to 23.6; the main order is 23.56), so
concentrating delta there costs such streams ln(10/9) in ln(1/delta) instead of ln(m); the
equal tenth keeps every other order usable (a few large queries, whose best order is large).
docs/accounting.md has the measurements. With ``main_share`` 0 the split is the equal one of
``ORDERS_V1``'s ledgers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from fractions import Fraction
from functools import lru_cache

from dpsql.accounting.theorems.base import GroupCache
from dpsql.mechanisms.conversions import frac_down, frac_up, rdp_to_delta, rdp_to_dp, round_down
from dpsql.mechanisms.events import Event

__all__ = [
    "DEFAULT_ORDERS",
    "MAIN_SHARE",
    "ORDERS_V1",
    "RDP_GRIDS",
    "RdpAccountant",
    "RdpFilter",
    "RdpTally",
    "composed_rdp",
    "rdp",
]

# alpha - 1 = m 2^n, m ~ 2^(k/4) (module docstring); ldexp is exact, so each order is one
# correctly rounded sum.
DEFAULT_ORDERS: tuple[float, ...] = (
    *(1 + math.ldexp(m, n) for n in range(-7, 13) for m in (1.0, 1.19, 1.41, 1.68)),
    1 + math.ldexp(1.0, 13),
)
# The part of the conversion's delta that the default filter gives its main order.
MAIN_SHARE = Fraction(9, 10)

# The grid before version 2 of the filters' defaults, kept for the ledgers created with it.
ORDERS_V1: tuple[float, ...] = (
    *(1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0),
    *(12.0, 14.0, 16.0, 20.0, 24.0, 28.0, 32.0, 40.0, 48.0, 56.0, 64.0, 80.0, 96.0, 112.0),
    *(128.0, 160.0, 192.0, 224.0, 256.0, 384.0, 512.0, 768.0, 1024.0, 2048.0, 4096.0, 8192.0),
)

# Per version of the filters' defaults (``budget.filter_version``, pinned by the ledger): the
# grid and the main order's share. A ledger keeps the filter it was created with: a filter
# chosen after the history is not a filter.
RDP_GRIDS: dict[int, tuple[tuple[float, ...], Fraction]] = {
    1: (ORDERS_V1, Fraction(0)),
    2: (DEFAULT_ORDERS, MAIN_SHARE),
}


def rdp(event: Event, alpha: float) -> float:
    """RDP of ``event`` at order ``alpha`` > 1; ``math.inf`` for approximate events (their
    curve holds with a delta: ``Event.renyi``) and for events without a Renyi curve."""
    curve = event.renyi(alpha)
    return curve[0] if curve is not None and curve[1] == 0 else math.inf


@lru_cache(maxsize=65536)
def _event_curve(event: Event, orders: tuple[float, ...]) -> tuple[tuple[float, ...], Fraction]:
    """The event's RDP at each order and its approximate delta, exactly (``Event.renyi``);
    infinite at every order when it has no Renyi curve."""
    curve = [event.renyi(alpha) for alpha in orders]
    found = [c for c in curve if c is not None]
    if len(found) != len(curve) or not found:
        return (math.inf,) * len(orders), Fraction(0)
    return tuple(value for value, _ in found), found[0][1]


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


def _split(
    conversion: Fraction, orders: tuple[float, ...], main_share: Fraction, epsilon_cap: Fraction
) -> tuple[int, tuple[float, ...]]:
    """(main order's index, each order's conversion delta) of ``RdpFilter``: exact weights that
    sum to 1, each share rounded down, so the shares sum to at most ``conversion`` (the union
    bound's condition, module docstring)."""
    m = len(orders)
    rest = (1 - main_share) / m
    # Union bound over the grid (Feldman, Zrnic 2021, Thm 3.1 per order): any deltas fixed in
    # advance whose sum is at most the conversion's delta, equal or not.
    common, top = frac_down(conversion * rest), frac_down(conversion * (main_share + rest))
    if main_share == 0:
        return 0, (common,) * m
    eps = frac_down(epsilon_cap)
    # The main order: where a zCDP budget (RDP alpha rho) fits best at the main share; from
    # the caps and the grid only, so fixed before the first query.
    main = max(range(m), key=lambda j: (order_budget(eps, top, orders[j]) / orders[j], -j))
    return main, tuple(top if j == main else common for j in range(m))


class RdpFilter:
    """Renyi filter (Feldman, Zrnic 2021) with cap (epsilon_cap, delta_cap).

    ``orders`` of length 1: the single order fixed in advance (the policy's), the conversion
    taking all of delta_cap - approx_delta_cap. Longer: the union bound of the module docstring
    over the conversion's delta D = delta_cap - approx_delta_cap, order j converting at
    ``shares[j]``: ``main_share`` of D to the main order (``main``: the order with the largest
    budget_j / alpha_j at its share), the rest of D equally to every order (with
    ``main_share`` 0, D/len(orders) each). ``approx_delta_cap`` (fixed in advance, part of
    delta_cap) is the most the approximate events' deltas may add up to; with 0 they are never
    admitted. Admits iff, after ``new``, the approximate deltas fit and the composed RDP is
    within ``budgets[j]`` at some order j; ``budgets[j]`` is the largest composed RDP at
    ``orders[j]`` whose conversion at ``shares[j]`` is within epsilon_cap.
    """

    name = "rdp"

    def __init__(
        self,
        epsilon_cap: Fraction,
        delta_cap: Fraction,
        orders: Sequence[float] = DEFAULT_ORDERS,
        *,
        approx_delta_cap: Fraction = Fraction(0),
        main_share: Fraction = MAIN_SHARE,
    ):
        if not 0 <= approx_delta_cap < delta_cap < 1 or epsilon_cap < 0:
            raise ValueError("need epsilon_cap >= 0 and 0 <= approx_delta_cap < delta_cap < 1")
        if not orders or min(orders) <= 1:
            raise ValueError("RDP orders must be > 1")
        if not 0 <= main_share < 1:
            raise ValueError("need 0 <= main_share < 1")
        self.epsilon_cap = Fraction(epsilon_cap)
        self.delta_cap = Fraction(delta_cap)
        self.approx_delta_cap = Fraction(approx_delta_cap)
        self.orders = tuple(float(a) for a in orders)
        self.main_share = Fraction(main_share)
        self.main, self.shares = _split(
            self.delta_cap - self.approx_delta_cap, self.orders, self.main_share, self.epsilon_cap
        )
        eps = frac_down(self.epsilon_cap)
        self.budgets = tuple(
            order_budget(eps, s, a) for s, a in zip(self.shares, self.orders, strict=True)
        )
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
