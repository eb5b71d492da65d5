"""The budget filter: admits a query only if the composed loss stays within the cap.

Basic (sequential) composition in exact rational arithmetic: the epsilons and deltas of all
events add (Dwork, McSherry, Nissim, Smith 2006; Dwork, Roth 2014, Theorem 3.16). Basic
composition is valid as a filter under fully adaptive choice of each query's parameters
(Rogers, Roth, Ullman, Vadhan 2016). A later module adds the tighter accountants behind the
same ``check``/``charge`` seam.

This budget lives in memory: it resets when the process ends, until the durable ledger lands.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from fractions import Fraction

from dpsql.accounting.events import Composite
from dpsql.errors import BudgetExceededError


@dataclass(frozen=True)
class Charge:
    """One committed charge: a fresh release's privacy event and who asked."""

    time: float
    analyst: str | None
    query: str
    event: Composite

    @property
    def epsilon(self) -> Fraction:
        return self.event.epsilon

    @property
    def delta(self) -> Fraction:
        return self.event.delta


@dataclass(frozen=True)
class BudgetReport:
    """Spent and remaining budget under the filter that decides (basic composition)."""

    dataset: str
    accountant: str
    epsilon_total: Fraction
    delta_total: Fraction
    epsilon_spent: Fraction
    delta_spent: Fraction
    queries: int
    durable: bool

    @property
    def epsilon_remaining(self) -> Fraction:
        return self.epsilon_total - self.epsilon_spent

    @property
    def delta_remaining(self) -> Fraction:
        return self.delta_total - self.delta_spent

    def __str__(self) -> str:
        return (
            f"dataset {self.dataset}: epsilon {float(self.epsilon_spent):.6g} spent of "
            f"{float(self.epsilon_total):.6g} ({float(self.epsilon_remaining):.6g} left), delta "
            f"{float(self.delta_spent):.3g} of {float(self.delta_total):.3g}; {self.queries} "
            f"charged queries; {self.accountant} composition"
            + ("" if self.durable else "; in memory: resets when the process ends")
        )


class BasicFilter:
    """A hard cap on the sum of epsilons and deltas; check-and-charge is atomic."""

    name = "basic"

    def __init__(self, dataset: str, epsilon: Fraction, delta: Fraction):
        self.dataset = dataset
        self.epsilon_total = epsilon
        self.delta_total = delta
        self._charges: list[Charge] = []
        self._lock = threading.Lock()

    def _spent(self) -> tuple[Fraction, Fraction]:
        eps = sum((c.epsilon for c in self._charges), Fraction(0))
        delta = sum((c.delta for c in self._charges), Fraction(0))
        return eps, delta

    def admits(self, event: Composite) -> bool:
        """Would charging ``event`` keep both sums within their caps? (Public inputs only.)"""
        with self._lock:
            eps, delta = self._spent()
        return self._fits(eps, delta, event)

    def _fits(self, eps: Fraction, delta: Fraction, event: Composite) -> bool:
        return eps + event.epsilon <= self.epsilon_total and delta + event.delta <= self.delta_total

    def charge(self, event: Composite, query: str, analyst: str | None) -> Charge:
        """Record the charge, or raise ``BudgetExceededError`` and record nothing."""
        with self._lock:
            eps, delta = self._spent()
            if not self._fits(eps, delta, event):
                raise BudgetExceededError(
                    f"this query costs epsilon {event.epsilon} and delta {event.delta}, but only "
                    f"epsilon {self.epsilon_total - eps} and delta {self.delta_total - delta} "
                    "remain; nothing was charged"
                )
            record = Charge(time.time(), analyst, query, event)
            self._charges.append(record)
            return record

    @property
    def charges(self) -> tuple[Charge, ...]:
        with self._lock:
            return tuple(self._charges)

    def report(self) -> BudgetReport:
        with self._lock:
            eps, delta = self._spent()
            count = len(self._charges)
        return BudgetReport(
            self.dataset, self.name, self.epsilon_total, self.delta_total, eps, delta, count, False
        )
