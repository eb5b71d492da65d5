"""What to do about a query the budget refuses (``Session.execute`` adds it to the refusal):
the largest epsilon that would fit now, whether a released answer to it exists, and who can
add budget. Every figure comes from a dry run of the filter on the ledger as it stands (it
records nothing) and from the cache's keys; it names no other analyst.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from decimal import ROUND_FLOOR, Decimal
from fractions import Fraction
from typing import Protocol

from dpsql.cache.releases import Hit
from dpsql.errors import DpsqlError
from dpsql.plan.plans import Plan
from dpsql.policy.numbers import decimal_text
from dpsql.session.pipeline import Pipeline


class Session(Protocol):
    """What the advice reads of a ``dpsql.session.session.Session``."""

    pipeline: Pipeline
    analyst: str | None

    def plan(self, sql: str, params: Sequence[object] | None = None, **options: object) -> Plan:
        """Plan without running or charging anything."""

    def served_from(self, plan: Plan, shared: bool = True) -> Hit | None:
        """The release that would serve ``plan`` now, or None."""

    def details(self, plan: Plan) -> dict[str, object]:
        """What the ledger keeps beside the charge of ``plan``."""


def advice(
    session: Session, sql: str, params: Sequence[object] | None, options: Mapping[str, object]
) -> str:
    """What to do about a query the budget refuses: the largest epsilon that would fit
    now (the query planned again at smaller epsilons, each decided on the ledger as it
    stands: a dry run, nothing recorded), whether a released answer to it exists (whoever
    asked it), and who can add budget."""
    plan = session.plan(sql, params, **options)
    parts = []
    fits = fitting_epsilon(
        plan.epsilon, lambda e: _fits(session, sql, params, {**options, "epsilon": e})
    )
    parts.append(
        f"the largest epsilon that fits now is {decimal_text(fits)} (OPTIONS(epsilon = "
        f"{decimal_text(fits)}), or SET dpsql.epsilon)"
        if fits is not None
        else "no epsilon fits now"
    )
    if session.served_from(plan) is not None:
        parts.append("a released answer to this query exists: asked without fresh, it is free")
    parts.append("the data owner can add budget (dpsql budget add)")
    return "; " + "; ".join(parts)


def _fits(
    session: Session, sql: str, params: Sequence[object] | None, options: dict[str, object]
) -> bool:
    try:
        plan = session.plan(sql, params, **options)
    except DpsqlError:  # a tiny epsilon's noise too large to sample, say
        return False
    return session.pipeline.refusal(plan.event, session.details(plan)) is None


def fitting_epsilon(asked: Fraction, fits: Callable[[Fraction], bool]) -> Fraction | None:
    """The largest epsilon below ``asked`` at which ``fits`` (monotone: less epsilon, less
    loss), by bisection, rounded down to two significant digits; None when not even a
    thousandth of it fits."""
    low, high = asked / 1000, asked
    if not fits(low):
        return None
    for _ in range(14):
        middle = (low + high) / 2
        if fits(middle):
            low = middle
        else:
            high = middle
    digits = Decimal(low.numerator) / Decimal(low.denominator)
    exponent = digits.adjusted() - 1  # two significant digits
    step = Fraction(10) ** exponent
    shown = Fraction(digits.scaleb(-exponent).to_integral_value(rounding=ROUND_FLOOR)) * step
    if shown + step < asked and fits(shown + step):
        return shown + step  # the bisection stops just short of a round boundary (0.4, not 0.39)
    return shown if shown > 0 else low


__all__ = ["advice", "fitting_epsilon"]
