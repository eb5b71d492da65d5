"""A charge on the table of periods, for one person (``dpsql.policy.periods``).

Every charge passes ``Persons.charge`` (called by ``Pipeline.charge``, the one place that
charges): a charge that read the table of periods (its details name the blocks it read, as every
plan, estimate and workload on a table made of blocks records them, ``dpsql.session.blocks``)
is charged to the lifetime cap for a person, who can be one unit in each period it read
(``dpsql.mechanisms.group``: the loss at min(|P|, m) times the sensitivity), and records its
unit-level cost for each period it read (``dpsql.accounting.budget.periods``). m, the periods a
person may be in, is the number of periods registered (no cap on periods per person is
enforced), so min(|P|, m) = |P|, the periods the query reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from fractions import Fraction
from typing import Any

from dpsql.accounting.budget.periods import PeriodCharge
from dpsql.errors import InternalError, UnsupportedQueryError
from dpsql.mechanisms.events import Composite
from dpsql.mechanisms.group import for_group
from dpsql.plan.plans import Plan
from dpsql.policy import PeriodsSpec, Policy
from dpsql.policy.blocks import iso_date
from dpsql.policy.numbers import decimal_text
from dpsql.session.blocks import Registered

__all__ = ["Persons", "check_plan", "explain"]


class Persons:
    """The person's charge of a session whose policy declares a person-within-period unit."""

    def __init__(self, spec: PeriodsSpec, registered: Registered) -> None:
        self.spec = spec
        self.registered = registered  # the blocks the session's engine binds

    @classmethod
    def of(cls, policy: Policy, registered: Registered) -> Persons | None:
        return None if policy.periods is None else cls(policy.periods, registered)

    def read(self, details: Mapping[str, Any]) -> PeriodCharge | None:
        """The periods a charge with ``details`` read (None: it did not read the table), with
        the person's multiplicity; its costs are filled in by ``charge``."""
        reserved = details.get("reserved")
        if isinstance(reserved, list):
            # A view's reservation: every period of its calendar, registered or to come.
            periods = []
            for i, a, b in reserved:
                first, end = iso_date(str(a)), iso_date(str(b))
                if first is None or end is None:
                    raise InternalError("a reservation names a malformed period")
                periods.append((str(i), first, end))
            if not periods:
                raise InternalError("a reservation names no period")
            return PeriodCharge(self.spec.table, tuple(periods), len(periods), Fraction(0),
                                Fraction(0))  # fmt: skip
        blocks = details.get("blocks")
        ids = blocks.get(self.spec.table) if isinstance(blocks, Mapping) else None
        if ids is None:
            return None
        active = {b.id: b for b in self.registered.blocks.active(self.spec.table)}
        if any(i not in active for i in ids):
            # Planned on the blocks the engine binds (Pipeline.charge checks the token first).
            raise InternalError("a charge names a period the session does not bind")
        read = tuple((i, active[i].start, active[i].end) for i in ids)
        # min(|P|, m) with m the periods registered (at least |P|): |P|; one at least, since
        # a query that reads no period's rows is still charged as a query on one.
        return PeriodCharge(self.spec.table, read, max(1, len(read)), Fraction(0), Fraction(0))

    def person(
        self, event: Composite, details: Mapping[str, Any]
    ) -> tuple[Composite, dict[str, Any]]:
        """The event to charge to the lifetime cap, and the details with the periods read."""
        read = self.read(details)
        if read is None:
            return event, dict(details)
        unit = replace(read, epsilon=event.epsilon, delta=event.delta)
        person = for_group(event, read.persons)
        return person, {**details, "periods": unit.payload()}


def explain(persons: Persons, plan: Plan) -> list[str]:
    """EXPLAIN's lines of a plan on the table of periods: what the person's lifetime cap is
    charged and what each period it reads is charged (nothing for a plan off that table)."""
    details = {"blocks": {t: list(ids) for t, ids in plan.blocks}}
    read = persons.read(details)
    if read is None:
        return []
    person, _ = persons.person(plan.event, details)
    n = decimal_text
    return [
        f"person-within-period unit: {read.persons} period(s) read; each pays epsilon "
        f"{n(plan.event.epsilon)}, delta {n(plan.event.delta)} of its budget",
        f"lifetime cost for one person in all {read.persons}: epsilon {n(person.epsilon)}, "
        f"delta {n(person.delta)} (the lifetime cap's charge)",
    ]


def check_plan(plan: Plan, policy: Policy) -> None:
    """What a plan on the table of periods may not do (``UnsupportedQueryError``, nothing
    charged): run on a sample (a person's units are sampled together, so a unit's inclusion is
    not independent of the others' and the amplification theorem does not hold for it), or
    count distinct units over several periods (they are person-periods there, not persons)."""
    table = policy.periods.table if policy.periods is not None else None
    read = dict(plan.blocks).get(table) if table is not None else None
    if read is None:
        return
    if plan.sample is not None or (plan.bounding is not None and plan.bounding.sample):
        raise UnsupportedQueryError(
            f"{table} has a person-within-period unit: its queries run on every unit, not on a "
            "sample (TABLESAMPLE, dpsql.sample_rate)"
        )
    if len(read) > 1 and any(a.kind == "count_units" for a in plan.analysis.aggregates):
        raise UnsupportedQueryError(
            f"COUNT(DISTINCT {plan.analysis.unit}) over several periods of {table} would count "
            "person-periods (the unit is a person within a period): read one period"
        )
