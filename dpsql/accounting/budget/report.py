"""What the budget hands out: a committed ``Charge``, and the odometer reports.

``BudgetReport`` is the spent and remaining budget of a data set as the deciding filter reads
it, with every accountant's ``Figure`` computed on first use and the asking analyst's
``ShareReport``. Their text is in decimals people read: spent rounded up, what is left rounded
down (``_up``, ``_down``, ``_shown``), so a report never overstates what remains.
"""

from __future__ import annotations

import functools
import html
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

from dpsql.accounting.theorems.base import Spent
from dpsql.mechanisms.events import Composite
from dpsql.policy.numbers import exact

__all__ = [
    "EXCEEDS",
    "UNBOUNDED",
    "BudgetReport",
    "Charge",
    "Figure",
    "ShareReport",
    "cap_text",
    "exceeds",
    "figure_left",
    "figure_value",
    "left_text",
    "spent_text",
]


# How every screen and the report spell a figure that bounds nothing (an accountant that proves
# no finite epsilon for the history): one word, everywhere.
UNBOUNDED = "unbounded"


@dataclass(frozen=True)
class Charge:
    """One committed charge: a fresh release's privacy event and who asked."""

    time: float
    analyst: str | None
    query: str
    event: Composite
    seq: int = 0  # its record in the ledger

    @property
    def epsilon(self) -> Fraction:
        return self.event.epsilon

    @property
    def delta(self) -> Fraction:
        return self.event.delta


@dataclass(frozen=True)
class Figure:
    """One accountant's reading of the history: epsilon at the budget's delta."""

    accountant: str
    epsilon: float
    note: str  # "decides", "valid adaptively", or "as if fixed in advance"


@dataclass(frozen=True)
class BudgetReport:
    """Spent and remaining budget; ``figures`` is the same history under every accountant."""

    dataset: str
    accountant: str
    epsilon_total: Fraction
    delta_total: Fraction
    # Under basic composition: the exact sums of the charged queries (worst view). Under another
    # filter: its own bound, worst view (``Filter.epsilon_spent``: what its rule certifies, <=
    # epsilon_total exactly while it admits; ``math.inf`` if its fixed parameters certify
    # nothing), and the additive deltas (partition selection) charged so far.
    epsilon_spent: Spent
    delta_spent: Fraction
    queries: int
    durable: bool
    # Every accountant's figures, computed on first use of ``figures`` (the full report costs
    # up to 200 ms at 10,000 charges; spent and remaining budget need none of it).
    readings: Callable[[], tuple[Figure, ...]] = field(default=tuple, compare=False, repr=False)
    # The asking analyst's share, when the budget is shared and the analyst has one.
    share: ShareReport | None = None
    # The ledger record of the first top-up recorded after a charge, if any: the cap was then
    # chosen after answers were seen, so no filter's cap is a guarantee any more.
    adaptive_cap: int | None = None
    # With an adaptive cap, what still holds whatever was chosen adaptively, the caps included:
    # basic composition of the charges, worst view (a valid odometer: Rogers, Roth, Ullman,
    # Vadhan 2016). Under the basic filter that is its own sums: the guarantee is the realised
    # sum, not the cap.
    valid_adaptively: tuple[Fraction, Fraction] | None = None
    # Under a person-within-period unit: the table of periods. The budget is then the lifetime
    # cap per person, the guarantee that the report leads with (dpsql.policy.periods).
    lifetime: str | None = None

    @functools.cached_property
    def figures(self) -> tuple[Figure, ...]:
        """The history at the time of the report under every accountant, labelled."""
        return self.readings()

    @property
    def epsilon_remaining(self) -> Fraction:
        """Never below zero: the deciding filter's figure is within its cap while it admits."""
        return _left(self.epsilon_total, self.epsilon_spent)

    @property
    def delta_remaining(self) -> Fraction:
        return _left(self.delta_total, self.delta_spent)

    def __str__(self) -> str:
        """Decimals people read (never 19/2 nor 1e-06): spent rounded up, what is left rounded
        down and never below zero."""
        mine = "" if self.share is None else f"{self.share}; "
        if self.lifetime is not None:
            mine = (
                f"lifetime cap per person (one person's loss over every period of "
                f"{self.lifetime}; the guarantee): " + mine
            )
        return mine + (
            f"dataset {self.dataset}: epsilon {_up(self.epsilon_spent)} spent of "
            f"{_shown(self.epsilon_total)} ({_down(self.epsilon_remaining)} left), delta "
            f"{_up(self.delta_spent)} of {_shown(self.delta_total)}; {self.queries} "
            f"charged queries; {self.accountant} composition decides"
            + self.adaptive_text()
            + ("" if self.durable else "; in memory: resets when the process ends")
        )

    def __repr__(self) -> str:
        """Short, in decimals (a notebook's echo of ``conn.budget()``, never Fraction(87, 20))."""
        return (
            f"<BudgetReport {self.dataset}: epsilon {_up(self.epsilon_spent)} spent of "
            f"{_shown(self.epsilon_total)}, {_down(self.epsilon_remaining)} left; delta "
            f"{_up(self.delta_spent)} of {_shown(self.delta_total)}; {self.queries} queries>"
        )

    def _repr_html_(self) -> str:
        """A notebook's display: spent, cap and left of epsilon and delta, in decimals."""
        rows = [("epsilon", self.epsilon_spent, self.epsilon_total, self.epsilon_remaining)]
        rows.append(("delta", self.delta_spent, self.delta_total, self.delta_remaining))
        body = "".join(
            f"<tr><th>{name}</th><td>{_up(spent)}</td><td>{_shown(cap)}</td>"
            f"<td>{_down(left)}</td></tr>"
            for name, spent, cap, left in rows
        )
        caption = (
            f"dataset {html.escape(self.dataset)}: {self.queries} charged queries; "
            f"{html.escape(self.accountant)} composition decides"
        )
        mine = "" if self.share is None else f"<p>{html.escape(str(self.share))}</p>"
        return (
            f"{mine}<table><caption>{caption}</caption><tr><th></th><th>spent</th>"
            f"<th>cap</th><th>left</th></tr>{body}</table>"
            + (f"<p>{html.escape(self.adaptive_text()[2:])}</p>" if self.adaptive_text() else "")
        )

    def adaptive_text(self) -> str:
        """What holds once the cap was raised after answers were seen ("" if it was not)."""
        if self.adaptive_cap is None or self.valid_adaptively is None:
            return ""
        eps, delta = self.valid_adaptively
        return (
            f"; the cap was raised after answers were seen (ledger record {self.adaptive_cap}), "
            f"so it is not a guarantee: valid adaptively, by basic composition of the charges, "
            f"epsilon {_up(eps)}, delta {_up(delta)}"
        )


def _left(cap: Fraction, spent: Spent) -> Fraction:
    """What ``spent`` leaves of ``cap``: never below zero, nothing once unbounded."""
    if not math.isfinite(spent):
        return Fraction(0)
    return max(Fraction(0), cap - Fraction(spent))


def _shown(value: Spent) -> str:
    """An exact number as a decimal people read (never 19/2): exact when short, else 6
    significant digits; ``UNBOUNDED`` for an unbounded spend."""
    if not math.isfinite(value):
        return UNBOUNDED
    value = Fraction(value)  # an int, or a float of a reading
    if value.denominator == 1 or 10**12 % value.denominator == 0:
        return exact(value) or ""
    return f"{float(value):.6g}"


def _down(value: Spent) -> str:
    """What is left, never below zero, rounded down to 6 significant digits."""
    return _rounded(value, math.floor)


def _up(value: Spent) -> str:
    """What was spent, rounded up to 6 significant digits (never understated)."""
    return _rounded(value, math.ceil)


def _rounded(value: Spent, way: Callable[[Fraction], int]) -> str:
    if value <= 0:
        return "0"
    if not math.isfinite(value):
        return UNBOUNDED
    value = Fraction(value)
    if value.denominator == 1 or 10**12 % value.denominator == 0:
        return _shown(value)
    digits = 6 - 1 - math.floor(math.log10(value))
    scale = Fraction(10) ** digits
    return _shown(Fraction(way(value * scale)) / scale)


@dataclass(frozen=True)
class ShareReport:
    """An analyst's share of the budget and what they spent of it, read as the deciding filter
    reads it when it decides their queries (their own history, under their share's cap)."""

    analyst: str
    epsilon_share: Fraction
    delta_share: Fraction
    epsilon_spent: Spent
    delta_spent: Fraction
    queries: int

    @property
    def epsilon_remaining(self) -> Fraction:
        """Never below zero: a share set below what was already spent has nothing left."""
        return _left(self.epsilon_share, self.epsilon_spent)

    @property
    def delta_remaining(self) -> Fraction:
        return _left(self.delta_share, self.delta_spent)

    def __repr__(self) -> str:
        return f"<ShareReport {self}>"

    def __str__(self) -> str:
        return (
            f"analyst {self.analyst}: epsilon {_up(self.epsilon_spent)} spent of their "
            f"share {_shown(self.epsilon_share)} ({_down(self.epsilon_remaining)} left), "
            f"delta {_up(self.delta_spent)} of {_shown(self.delta_share)}; "
            f"{self.queries} charged queries"
        )


EXCEEDS = "exceeds cap under this theorem"


def exceeds(figure: Figure, cap: Fraction) -> bool:
    """Whether a figure that does not decide reads the history above the cap: that theorem
    would have refused long ago, which says nothing about the deciding filter's guarantee."""
    return figure.note != "decides" and figure.epsilon > cap


def figure_left(figure: Figure, cap: Fraction) -> str:
    """What a figure leaves of the cap, for people: rounded down, never a negative number
    (``EXCEEDS`` for a figure that does not decide and reads above the cap; 0 for a figure
    that bounds nothing, as the deciding filter's remaining once its spend is unbounded)."""
    if not math.isfinite(figure.epsilon):
        return "0"
    if exceeds(figure, cap):
        return EXCEEDS
    return _down(cap - figure_value(figure.epsilon))


def figure_value(epsilon: float) -> Spent:
    """A figure's float as the decimal it prints as (its shortest repr): accountants already
    round their figures up by far more than an ulp, so 0.4 is shown as 0.4, not 0.400001."""
    return Fraction(repr(epsilon)) if math.isfinite(epsilon) else epsilon


# The same roundings for every interface that prints a budget: spent up, left down.
spent_text = _up
left_text = _down
cap_text = _shown
