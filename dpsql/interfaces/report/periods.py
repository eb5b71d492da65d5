"""The report's and ``budget show``'s section on a person-within-period unit.

It leads with the lifetime cap per person, the guarantee (the data set's budget, charged for a
person in every period a query reads), then each period's admission budget: its unit-level
spend and what is left (``dpsql.accounting.budget.periods``). A period's spend is never the
guarantee, and the lifetime figure is never the sum of the periods' spends.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from dpsql.accounting.budget.budget import Budget
from dpsql.accounting.ledger.blocks import block_list
from dpsql.policy import Policy
from dpsql.policy.numbers import decimal_text

__all__ = ["md_periods", "period_lines", "periods_data"]


def _exact(value: Any) -> str:
    return str(value)


def periods_data(policy: Policy, budget: Budget) -> dict[str, Any] | None:
    """The section as JSON-ready data; None without a person-within-period unit."""
    periods = policy.periods
    if periods is None:
        return None
    records = budget.store.records()
    active = block_list(records).active(periods.table)
    rows = budget.period_rows([(b.id, b.start, b.end) for b in active])
    summary = budget.report()
    unit = policy.tables[periods.table].privacy_unit
    return {
        "table": periods.table,
        "person": unit,
        "unit": f"({unit}, period of {periods.table})",
        "lifetime": {
            "epsilon_cap": _exact(summary.epsilon_total),
            "epsilon_spent": _exact(summary.epsilon_spent),
            "delta_cap": _exact(summary.delta_total),
            "delta_spent": _exact(summary.delta_spent),
            "accountant": summary.accountant,
        },
        "period_budget": {"epsilon": _exact(periods.epsilon), "delta": _exact(periods.delta)},
        "periods": [{k: _exact(v) for k, v in r.items()} for r in rows],
    }


def period_lines(data: dict[str, Any]) -> list[str]:
    """``budget show``'s lines: the lifetime cap first, then each period."""
    life = data["lifetime"]
    n = decimal_text
    spent = Fraction(life["epsilon_spent"])
    out = [
        f"Lifetime cap per person ({data['person']}, across every period of {data['table']}): "
        f"epsilon {n(spent)} spent of {n(Fraction(life['epsilon_cap']))} under the "
        f"{life['accountant']} filter. This is the guarantee.",
        f"Each period's budget (unit {data['unit']}), an admission rule beneath it: epsilon "
        f"{n(Fraction(data['period_budget']['epsilon']))}, delta "
        f"{n(Fraction(data['period_budget']['delta']))}.",
    ]
    if not data["periods"]:
        return [*out, "  no period is registered yet"]
    for r in data["periods"]:
        out.append(
            f"  {r['block']} ({r['start']} to {r['end']}): epsilon {n(Fraction(r['epsilon']))} "
            f"spent, {n(Fraction(r['epsilon_left']))} left; delta {n(Fraction(r['delta']))}"
        )
    return out


def md_periods(data: dict[str, Any]) -> list[str]:
    """The Markdown section, when the policy declares a person-within-period unit."""
    found = data.get("periods")
    if found is None:
        return []
    lines = period_lines(found)
    out = ["## Periods", "", lines[0], "", lines[1], ""]
    out.append("| period | from | to | epsilon spent | epsilon left | delta spent |")
    out.append("|---|---|---|---|---|---|")
    for r in found["periods"]:
        out.append(
            f"| {r['block']} | {r['start']} | {r['end']} | {r['epsilon']} | "
            f"{r['epsilon_left']} | {r['delta']} |"
        )
    return out
