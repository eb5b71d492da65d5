"""Privacy events: what was sampled, each carrying its privacy maps beside its proof note.

An event names the mechanism actually sampled (DESIGN.md section 1), so that every accountant
can recompute its loss from it later: a discrete Laplace is not a continuous one, and a discrete
Gaussian is not a continuous Gaussian (Canonne, Kamath, Steinke 2020). Events are frozen,
hashable values; ``label`` is a description only and takes no part in equality, so a history can
be grouped into (event, multiplicity) pairs. Neighbouring data sets differ in one privacy unit
(add/remove); every sensitivity is for that relation, in the integer units of the measurement.

As a measurement of OpenDP carries its privacy map, every event answers for itself under each
notion an accountant composes, and an accountant is a fold over the answers (never a dispatch on
the event's type). ``Event`` gives the maps and their defaults, all derived from the event's
(epsilon, delta)-DP guarantee; a mechanism with a sharper curve overrides them, citing its
theorem. A map that does not exist for an event answers None, and the accountant then reports no
bound (``math.inf``) or refuses the event, as its module says:

- ``approx_dp()``: the (epsilon, delta)-DP guarantee (advanced and optimal composition);
- ``pure``: whether that guarantee has delta 0;
- ``targeted``, ``profile(epsilon)``: whether the stated pair is only the target the mechanism
  was calibrated to on its own curve, and that curve's delta at epsilon (``basic_pair``);
- ``exact_curve(epsilon)``: the one-mechanism curve that certifies a lone event (``supports``);
- ``zcdp()``, ``renyi(alpha)``, ``gdp_mu_squared()``: approximate zCDP, approximate RDP, GDP;
- ``pld()``: what its privacy loss distribution is built from (``pld_forms``);
- ``bounded_range()``: its bounded-range parameter (Dong, Durfee, Rogers 2020), if it has one.

The events themselves live in one module per family (``laplace_events``, ``gaussian_events``,
``selection_events``, ``stated_events``) and are named for the ledger and the policy in
``event_kinds``.

Basic-composition cost is ``basic_pair``: the stated pair, except that a targeted event's delta
never falls below its own curve. A ``Composite`` (one query) is charged its ``certified`` pair,
which it refuses at construction unless a theorem supports it for its events (``supports``), or
else the sum of its events' guarded pairs: so no path that reads a query's cost (the ledger's
basic composition, its replay, the report) can charge less than its mechanisms give.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import TYPE_CHECKING, ClassVar

from dpsql.errors import InternalError
from dpsql.mechanisms.conversions import frac_down, frac_up, zcdp_to_dp
from dpsql.mechanisms.curves import pure_dp_rdp
from dpsql.mechanisms.pld_forms import PairLoss, PldForm
from dpsql.policy.numbers import decimal_text

__all__ = [
    "EXACT_CURVE_MAX_SIGMA2",
    "Composite",
    "Event",
    "basic_pair",
    "describe",
    "flatten",
    "joint_zcdp",
    "parameter_text",
    "supports",
]


class Event:
    """A privacy event: the stated (``epsilon``, ``delta``) of the mechanism sampled, and its
    privacy maps (module docstring). Subclasses are frozen dataclasses."""

    label: str
    # Whether the stated pair is a target on the mechanism's own curve (``profile``), not its
    # guarantee: such events are charged by that curve and certified jointly by summed rho.
    targeted: ClassVar[bool] = False

    if TYPE_CHECKING:

        @property
        def epsilon(self) -> Fraction: ...

        @property
        def delta(self) -> Fraction: ...

    def parameters(self) -> str:
        """The mechanism's name and parameters, as ``describe`` shows them."""
        return f"{type(self).__name__}(epsilon={parameter_text(self.epsilon)})"

    def approx_dp(self) -> tuple[Fraction, Fraction] | None:
        """The (epsilon, delta)-DP guarantee, or None when the event states none."""
        return Fraction(self.epsilon), Fraction(self.delta)

    @property
    def pure(self) -> bool:
        """Whether the event is epsilon-DP with delta 0 (its max-divergence map exists)."""
        pair = self.approx_dp()
        return pair is not None and pair[1] == 0

    def profile(self, epsilon: float) -> float | None:
        """delta at ``epsilon`` of the mechanism's own curve, rounded up, for a ``targeted``
        event; None for the others, whose stated pair is their guarantee."""
        return None

    def exact_curve(self, epsilon: float) -> float | None:
        """delta at ``epsilon`` of the exact one-mechanism curve that the calibration certifies
        a lone event by (``supports``), where it uses one; None otherwise."""
        return None

    def zcdp(self) -> tuple[Fraction, Fraction] | None:
        """(rho, delta), exactly: the event is delta-approximately rho-zCDP. By default from its
        guarantee: (eps, delta)-DP is delta-approximately eps^2/2-zCDP (Bun, Steinke 2016,
        Proposition 3.3 and section 8)."""
        pair = self.approx_dp()
        return None if pair is None else (pair[0] ** 2 / 2, pair[1])

    def renyi(self, alpha: float) -> tuple[float, Fraction] | None:
        """(RDP at order ``alpha`` > 1, rounded up; delta, exact): the event is
        delta-approximately RDP (``curves`` docstring). By default from its guarantee, through
        eps^2/2-zCDP and D_alpha <= D_inf = eps (``curves.pure_dp_rdp``)."""
        pair = self.approx_dp()
        return None if pair is None else (pure_dp_rdp(frac_up(pair[0]), alpha), pair[1])

    def gdp_mu_squared(self) -> Fraction | None:
        """mu^2 if the event is exactly mu-GDP (Dong, Roth, Su 2019); None otherwise."""
        return None

    def pld(self) -> PldForm | None:
        """What its privacy loss distribution is built from (``pld_forms``). By default the
        pair that dominates every (epsilon, delta)-DP mechanism (KOV 2015, Theorem 2.4)."""
        pair = self.approx_dp()
        return None if pair is None else PairLoss(*pair)

    def bounded_range(self) -> Fraction | None:
        """The epsilon of its bounded range (Dong, Durfee, Rogers 2020), if it has one."""
        return None


def describe(event: Event) -> str:
    """One line naming the mechanism and its parameters, then its label."""
    suffix = f" {event.label}" if event.label else ""
    return event.parameters() + suffix


def parameter_text(value: Fraction | float | int) -> str:
    """A mechanism parameter as a decimal people read (0.25, never 1/4): exact when it
    terminates, else exact in parentheses."""
    if isinstance(value, Fraction):
        return decimal_text(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


# The exact one-dimensional curve sums the pmf over a window of 40 sigma; above this variance
# the calibration (``dpsql.plan.calibration``) certifies through zCDP, and so does ``supports``.
EXACT_CURVE_MAX_SIGMA2 = 10**6


@lru_cache(maxsize=4096)
def basic_pair(event: Event) -> tuple[Fraction, Fraction]:
    """The (epsilon, delta)-DP pair of one event, as exact rationals: the pair it states, except
    that a targeted event (continuous or discrete Gaussian, zCDP) is charged at its target
    epsilon with delta = max(target delta, the mechanism's own delta at that epsilon), so a
    missing or wrong calibration never makes its cost smaller than its curve gives."""
    eps = event.epsilon
    # A smaller epsilon only raises the curve's delta: rounding it down is safe.
    curve = event.profile(frac_down(eps)) if event.targeted else None
    if curve is None:
        return eps, event.delta
    delta = max(event.delta, Fraction(min(1.0, curve)))
    return eps, min(delta, Fraction(1))


def joint_zcdp(events: Iterable[Event]) -> tuple[Fraction, Fraction] | None:
    """(sum rho, sum delta) of the targeted events among ``events``, as calibrated jointly: zCDP
    composes (Bun, Steinke 2016, Lemma 2.3; approximate zCDP adds its deltas, Lemma 8.3). None
    when one of them has no zCDP map."""
    rho, delta = Fraction(0), Fraction(0)
    for event in events:
        if event.targeted:
            pair = event.zcdp()
            if pair is None:
                return None
            rho, delta = rho + pair[0], delta + pair[1]
    return rho, delta


@lru_cache(maxsize=4096)
def supports(events: tuple[Event, ...], certified: tuple[Fraction, Fraction]) -> bool:
    """Whether a theorem makes ``events``, composed, (certified epsilon, certified delta)-DP.

    The untargeted events take their own pairs (basic composition, Dwork, Roth 2014,
    Theorem 3.16); the targeted events the rest, (epsilon_g, delta_g), by one of: their summed
    rho (``joint_zcdp``) through the CKS conversion (Corollary 13); a single event, its exact
    curve (``Event.exact_curve``: the mu-GDP curve of a continuous Gaussian, Dong, Roth, Su 2019;
    a discrete Gaussian's on one coordinate, Canonne, Kamath, Steinke 2020, Theorem 7, up to
    EXACT_CURVE_MAX_SIGMA2). The same functions the calibration uses, which rounds with a margin
    of 1e-12 on the safe side, so every pair the planner certifies passes.
    """
    eps, delta = certified
    targeted = [e for e in events if e.targeted]
    for e in events:
        if not e.targeted:
            eps, delta = eps - basic_pair(e)[0], delta - basic_pair(e)[1]
    if eps < 0 or delta < 0:
        return False
    if not targeted:
        return True
    joint = joint_zcdp(targeted)
    if joint is None:
        return False
    share = delta - joint[1]
    if share >= 1:
        return True  # delta 1 holds of anything
    if share > 0 and Fraction(zcdp_to_dp(frac_up(joint[0]), frac_down(share))) <= eps:
        return True  # the cheap route first: every joint calibration takes it
    if len(targeted) != 1:
        return False
    curve = targeted[0].exact_curve(frac_down(eps))
    return curve is not None and Fraction(curve) <= delta


@dataclass(frozen=True)
class Composite:
    """The events of one query, released together: they compose sequentially.

    ``certified`` is the query's (epsilon, delta) when the planner calibrated several events
    jointly (discrete Gaussians through their summed rho and the CKS conversion): the whole is
    (epsilon, delta)-DP although no split of it over the parts is. Basic composition charges
    that pair; without it, the sum of the parts' guarded costs (``basic_pair``). A certified
    pair that no theorem gives for the events (``supports``) raises ``InternalError``: a query
    cannot claim less than its mechanisms give, whatever path later reads its cost.
    """

    events: tuple[Event, ...]
    certified: tuple[Fraction, Fraction] | None = None
    # (family, key): the query touched only the units of one cell of a partition family (a
    # constant-per-unit column of one table at one data version, ``dpsql.analyze.cells``): queries
    # of different keys of one family compose in parallel, all others sequentially.
    cell: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        if self.certified is not None and not supports(self.events, self.certified):
            raise InternalError(
                "a query's certified (epsilon, delta) is below what its mechanisms give"
            )

    @property
    def epsilon(self) -> Fraction:
        if self.certified is not None:
            return self.certified[0]
        return sum((basic_pair(e)[0] for e in self.events), Fraction(0))

    @property
    def delta(self) -> Fraction:
        if self.certified is not None:
            return self.certified[1]
        return sum((basic_pair(e)[1] for e in self.events), Fraction(0))

    def describe(self) -> list[str]:
        return [describe(e) for e in self.events]


def flatten(history: list[Composite] | tuple[Composite, ...]) -> list[Event]:
    """The events of a history of queries, in order (sequential composition)."""
    return [e for c in history for e in c.events]
