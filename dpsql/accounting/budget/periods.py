"""Each period's admission budget under a person-within-period unit (``dpsql.policy.periods``).

A charge on the table of periods records, beside the person's loss that the deciding filter
composes (``dpsql.mechanisms.group``), the periods it read and its unit-level cost: the
(epsilon, delta) of one person-period (``PeriodCharge``). A period's spend is the basic sum of
the unit-level costs of every charge that read a period overlapping it (sequential composition,
Dwork, Roth 2014, Theorem 3.16; Sage's block composition, Lecuyer et al. 2019: a query that
does not read a period's rows costs its units nothing). Overlap rather than identity: a block
that replaces another, or one registered over a period whose block was removed, holds the same
person-periods, so it inherits what was spent on them.

The lifetime cap per person (the data set's budget) is the guarantee; a period's budget is an
admission rule beneath it, read from the policy.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from dpsql.errors import BudgetExceededError
from dpsql.policy import PeriodsSpec
from dpsql.policy.numbers import decimal_text

__all__ = ["PeriodCharge", "PeriodSpends"]

Period = tuple[str, dt.date, dt.date]  # (block id, start, end exclusive)


@dataclass(frozen=True)
class PeriodCharge:
    """What a charge on the table of periods read: its periods, the person's multiplicity
    ``persons`` = min(|P|, m) its loss was charged at, and its unit-level (epsilon, delta)."""

    table: str
    read: tuple[Period, ...]
    persons: int
    epsilon: Fraction
    delta: Fraction

    def payload(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "read": [[i, a.isoformat(), b.isoformat()] for i, a, b in self.read],
            "persons": self.persons,
            "unit_epsilon": str(self.epsilon),
            "unit_delta": str(self.delta),
        }

    @classmethod
    def of(cls, p: Mapping[str, Any]) -> PeriodCharge:
        read = tuple(
            (str(i), dt.date.fromisoformat(str(a)), dt.date.fromisoformat(str(b)))
            for i, a, b in p["read"]
        )
        return cls(str(p["table"]), read, int(p["persons"]), Fraction(str(p["unit_epsilon"])),
                   Fraction(str(p["unit_delta"])))  # fmt: skip


@dataclass
class PeriodSpends:
    """The unit-level spends of the charges recorded so far, by period read."""

    spec: PeriodsSpec
    spent: dict[tuple[dt.date, dt.date], tuple[Fraction, Fraction]] = field(default_factory=dict)

    def add(self, charge: PeriodCharge) -> None:
        for _, start, end in charge.read:
            eps, delta = self.spent.get((start, end), (Fraction(0), Fraction(0)))
            self.spent[(start, end)] = (eps + charge.epsilon, delta + charge.delta)

    def of(self, start: dt.date, end: dt.date) -> tuple[Fraction, Fraction]:
        """What the charges reading any period that overlaps [start, end) spent."""
        eps, delta = Fraction(0), Fraction(0)
        for (a, b), (e, d) in self.spent.items():
            if a < end and start < b:
                eps, delta = eps + e, delta + d
        return eps, delta

    def check(self, charge: PeriodCharge) -> None:
        """``BudgetExceededError`` if ``charge`` would take a period it reads over its budget."""
        cap_e, cap_d = self.spec.epsilon, self.spec.delta
        for block, start, end in charge.read:
            eps, delta = self.of(start, end)
            if eps + charge.epsilon > cap_e or delta + charge.delta > cap_d:
                raise BudgetExceededError(
                    f"this query (epsilon {decimal_text(charge.epsilon)} per person-period) "
                    f"would take period {block} of {charge.table} over its budget "
                    f"(epsilon {decimal_text(max(cap_e - eps, Fraction(0)))} of "
                    f"{decimal_text(cap_e)} left, delta "
                    f"{decimal_text(max(cap_d - delta, Fraction(0)))} of {decimal_text(cap_d)}); "
                    "nothing was charged: read fewer periods (WHERE on the period column)"
                )

    def rows(self, periods: Sequence[Period]) -> list[dict[str, Any]]:
        """Each period's spend and what is left of its budget, for the odometer."""
        out = []
        for block, start, end in periods:
            eps, delta = self.of(start, end)
            out.append({
                "block": block, "start": start.isoformat(), "end": end.isoformat(),
                "epsilon": eps, "delta": delta, "epsilon_left": max(self.spec.epsilon - eps, 0),
                "delta_left": max(self.spec.delta - delta, 0),
            })  # fmt: skip
        return out
