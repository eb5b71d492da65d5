"""What the budget hands out: a committed ``Charge``, and the odometer reports.

``BudgetReport`` is the spent and remaining budget of a data set as the deciding filter reads
it, with every accountant's ``Figure`` computed on first use and the asking analyst's
``ShareReport``. Their text is in decimals people read: spent rounded up, what is left rounded
down (``_up``, ``_down``, ``_shown``), so a report never overstates what remains.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

from dpsql.accounting.events import Composite
from dpsql.policy_numbers import exact

__all__ = ["BudgetReport", "Charge", "Figure", "ShareReport", "cap_text", "left_text", "spent_text"]


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
    # Under basic composition: the exact sums of the charged queries (worst cell). Under another
    # filter: its own accountant's epsilon at delta_total (rounded up), and the additive deltas
    # (partition selection) charged so far.
    epsilon_spent: Fraction
    delta_spent: Fraction
    queries: int
    durable: bool
    # Every accountant's figures, computed on first use of ``figures`` (the full report costs
    # up to 200 ms at 10,000 charges; spent and remaining budget need none of it).
    readings: Callable[[], tuple[Figure, ...]] = field(default=tuple, compare=False, repr=False)
    # The asking analyst's share, when the budget is shared and the analyst has one.
    share: ShareReport | None = None

    @functools.cached_property
    def figures(self) -> tuple[Figure, ...]:
        """The history at the time of the report under every accountant, labelled."""
        return self.readings()

    @property
    def epsilon_remaining(self) -> Fraction:
        return self.epsilon_total - self.epsilon_spent

    @property
    def delta_remaining(self) -> Fraction:
        return self.delta_total - self.delta_spent

    def __str__(self) -> str:
        """Decimals people read (never 19/2 nor 1e-06): spent rounded up, what is left rounded
        down and never below zero."""
        mine = "" if self.share is None else f"{self.share}; "
        return mine + (
            f"dataset {self.dataset}: epsilon {_up(self.epsilon_spent)} spent of "
            f"{_shown(self.epsilon_total)} ({_down(self.epsilon_remaining)} left), delta "
            f"{_up(self.delta_spent)} of {_shown(self.delta_total)}; {self.queries} "
            f"charged queries; {self.accountant} composition decides"
            + ("" if self.durable else "; in memory: resets when the process ends")
        )


def _shown(value: Fraction) -> str:
    """An exact number as a decimal people read (never 19/2): exact when short, else 6
    significant digits."""
    value = Fraction(value)  # an int, or a float of a reading
    if value.denominator == 1 or 10**12 % value.denominator == 0:
        return exact(value) or ""
    return f"{float(value):.6g}"


def _down(value: Fraction) -> str:
    """What is left, never below zero, rounded down to 6 significant digits."""
    return _rounded(value, math.floor)


def _up(value: Fraction) -> str:
    """What was spent, rounded up to 6 significant digits (never understated)."""
    return _rounded(value, math.ceil)


def _rounded(value: Fraction, way: Callable[[Fraction], int]) -> str:
    if value <= 0:
        return "0"
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
    epsilon_spent: Fraction
    delta_spent: Fraction
    queries: int

    @property
    def epsilon_remaining(self) -> Fraction:
        """Never below zero: a share read past its cap by a looser figure has nothing left."""
        return max(Fraction(0), self.epsilon_share - self.epsilon_spent)

    @property
    def delta_remaining(self) -> Fraction:
        return max(Fraction(0), self.delta_share - self.delta_spent)

    def __str__(self) -> str:
        return (
            f"analyst {self.analyst}: epsilon {_up(self.epsilon_spent)} spent of their "
            f"share {_shown(self.epsilon_share)} ({_down(self.epsilon_remaining)} left), "
            f"delta {_up(self.delta_spent)} of {_shown(self.delta_share)}; "
            f"{self.queries} charged queries"
        )


# The same roundings for every interface that prints a budget: spent up, left down.
spent_text = _up
left_text = _down
cap_text = _shown
