"""A query's loss for one person who is ``k`` privacy units: group privacy, mechanism by mechanism.

Under a person-within-period unit (``dpsql.policy.periods``), a person is one unit per period,
and a query that reads |P| periods can see min(|P|, m) of one person's units. Each event's
neighbouring relation is one unit; for the person, the event is the same mechanism on a query
whose sensitivity is k times the unit's (a person's units move each measurement by at most the
sum of their shifts, the triangle inequality), so the person's loss is that mechanism's own
guarantee at k times the sensitivity: k·epsilon for the Laplace and exponential mechanisms,
k²·rho for the Gaussian (Bun, Steinke 2016, Proposition 1.9, from the same shift), and every
other map of the event (RDP, PLD, its curve) read at the larger shift. An event known only by
its stated guarantee takes the group-privacy theorem for that guarantee (Dwork, Roth 2014,
Theorem 2.2; Vadhan 2017, Lemma 2.2 for (epsilon, delta): (k·epsilon, k·e^((k-1)·epsilon)·delta)).

Nothing here rounds down: a rational that is not exact is rounded up.
"""

from __future__ import annotations

import decimal
import math
from dataclasses import replace
from fractions import Fraction

from dpsql.errors import QueryError
from dpsql.mechanisms.conversions import frac_down, frac_up, zcdp_to_dp
from dpsql.mechanisms.events import Composite, Event, basic_pair, joint_zcdp, supports
from dpsql.mechanisms.gaussian_events import ZCDP, DiscreteGaussian, Gaussian
from dpsql.mechanisms.laplace_events import DiscreteLaplace, Laplace
from dpsql.mechanisms.partition import laplace_tail_log
from dpsql.mechanisms.selection_events import Exponential, LaplacePartitionSelection
from dpsql.mechanisms.stated_events import ApproxDP, PureDP, SubsampledGaussian

__all__ = ["certified", "for_group", "group_event", "selection_delta"]


def _up(value: decimal.Decimal) -> Fraction:
    """A Decimal rounded up to a rational with at most 30 significant digits."""
    with decimal.localcontext(decimal.Context(prec=30, rounding=decimal.ROUND_CEILING)):
        return Fraction(+value)


def selection_delta(scale: Fraction, groups: int, threshold: int, shift: int) -> Fraction:
    """delta of partition selection for ``shift`` units that one person holds (up to
    ``groups`` groups, each counted at most ``shift`` times): a group only they create has at
    most ``shift`` distinct units and is released iff shift + Z >= threshold, Z discrete
    Laplace with ``scale``, so delta <= groups · P(Z >= threshold - shift), P(Z >= j) =
    q^j/(1 + q) (``partition.laplace_tail_log``), and 1 at most."""
    k = threshold - shift
    if k <= 0:
        return Fraction(1)
    ctx = decimal.Context(prec=60)
    log = ctx.add(ctx.ln(decimal.Decimal(groups)), laplace_tail_log(scale, k, ctx))
    # exp(log) plus a margin above the 60-digit rounding of ln and exp.
    value = ctx.multiply(ctx.exp(log), decimal.Decimal("1.000000000000000000001"))
    return min(Fraction(1), _up(value))


def group_event(event: Event, k: int) -> Event:
    """``event`` for ``k`` units at once (module docstring); ``QueryError`` for an event whose
    group loss dpsql does not derive (a query on a sample, an approximate zCDP)."""
    if k == 1:
        return event
    if isinstance(event, (DiscreteLaplace, Laplace)):
        return replace(event, sensitivity=event.sensitivity * k)
    if isinstance(event, DiscreteGaussian):
        # Charged at k times its target epsilon, with its own curve's delta there (basic_pair).
        return replace(
            event, sensitivity=event.sensitivity * k, target_epsilon=event.target_epsilon * k
        )
    if isinstance(event, Gaussian):
        return replace(
            event, sensitivity=event.sensitivity * k, target_epsilon=event.target_epsilon * k
        )
    if isinstance(event, LaplacePartitionSelection):
        # The counts of groups on both sides: a discrete Laplace at k·L0; the groups one person
        # creates: up to k·L0 of them, each with at most k distinct units.
        groups = math.ceil(event.sensitivity) * k
        delta = selection_delta(event.scale, groups, event.threshold, k)
        return replace(event, sensitivity=event.sensitivity * k, delta_bound=delta)
    if isinstance(event, Exponential):
        # Utility of sensitivity 1 per unit: k per person, so k·epsilon (and bounded range).
        return replace(event, epsilon=event.epsilon * k)
    if isinstance(event, ZCDP) and event.delta_zcdp == 0:
        return replace(event, rho=event.rho * k * k, target_epsilon=event.target_epsilon * k)
    if isinstance(event, PureDP):
        return replace(event, epsilon=event.epsilon * k)
    if isinstance(event, ApproxDP) and not isinstance(event, SubsampledGaussian):
        ctx = decimal.Context(prec=60)
        eps = decimal.Decimal(event.epsilon.numerator) / decimal.Decimal(event.epsilon.denominator)
        growth = ctx.multiply(decimal.Decimal(k), ctx.exp(ctx.multiply(k - 1, eps)))
        delta = min(Fraction(1), _up(ctx.multiply(growth, decimal.Decimal("1.000000001"))) *
                    event.delta)  # fmt: skip
        return ApproxDP(event.epsilon * k, delta, event.label)
    raise QueryError(
        f"a query whose loss is {type(event).__name__} cannot be charged for a person in several "
        "periods (a sampled query, or an approximate zCDP): read one period, or no sampling"
    )


def certified(events: tuple[Event, ...], delta: Fraction) -> tuple[Fraction, Fraction] | None:
    """A pair that ``supports`` certifies for ``events``: the untargeted events' own pairs
    (basic composition) and, for the targeted ones, their summed rho through the CKS conversion
    at ``delta`` more (Bun, Steinke 2016, Lemma 2.3; Canonne, Kamath, Steinke 2020, Corollary
    13), the route the calibration takes; None without targeted events or a share of delta.
    It spares a targeted event's own curve, which sums its pmf over 40 sigma."""
    targeted = [e for e in events if e.targeted]
    joint = joint_zcdp(targeted)
    if not targeted or joint is None or not 0 < delta < 1:
        return None
    eps = sum((basic_pair(e)[0] for e in events if not e.targeted), Fraction(0))
    spent = sum((basic_pair(e)[1] for e in events if not e.targeted), Fraction(0))
    pair = (eps + Fraction(zcdp_to_dp(frac_up(joint[0]), frac_down(delta))),
            spent + joint[1] + delta)  # fmt: skip
    return pair if supports(events, pair) else None


def for_group(composite: Composite, k: int) -> Composite:
    """A query's events for ``k`` units at once, composed as the query's were. Its certified
    pair held for one unit: the group's is the CKS route at the query's own delta where it has
    Gaussian events (``certified``), else none (basic composition then charges the sum of the
    events' own guarded pairs)."""
    if k < 1:
        raise ValueError("a group has at least one unit")
    if k == 1:
        return composite
    events = tuple(group_event(e, k) for e in composite.events)
    return Composite(events, certified(events, composite.delta), composite.cell)
