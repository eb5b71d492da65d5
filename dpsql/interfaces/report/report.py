"""The report of a data set's privacy contract (DESIGN.md section 1), as data and as text.

``build_report`` gathers, from the policy and the verified ledger only (never the data), what a
guarantee needs stated: the budget (policy totals, top-ups, spent, remaining), adjacency, the
contribution bounds of every table, the mechanism preference, the deciding filter beside every
other accountant's reading of the same history, and the release schedule (every charge, top-up
and allocation in ledger order). The result is a plain JSON-ready dict: exact rationals are
written as their text (``"1/3"``, ``"0.5"`` never rounded), floats from accountants as their
``repr`` (``"unbounded"`` for a figure that bounds nothing, as every screen spells it), counts
as integers. ``render_markdown`` and ``render_json`` only
format that dict, so both formats always say the same thing; the Markdown is written by
``markdown_report.py``, and ``render_markdown`` is re-exported here.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from dpsql.accounting.budget.budget import Budget
from dpsql.accounting.budget.report import UNBOUNDED, BudgetReport, exceeds
from dpsql.accounting.ledger.chain import GENESIS, Record
from dpsql.accounting.theorems.base import Spent
from dpsql.interfaces.report.audit import audit, overrides_of
from dpsql.interfaces.report.blocks import blocks_data
from dpsql.interfaces.report.periods import periods_data
from dpsql.mechanisms.event_kinds import composite_from_json
from dpsql.policy import Policy, TableSpec
from dpsql.policy.numbers import exact

REPORT_FORMAT = 1
ADJACENCY = (
    "user-level, unbounded: neighbouring databases differ by adding or removing all rows of one "
    "privacy unit"
)
# A table whose unit is a path of foreign keys (dpsql.policy.paths): its rows as resolved.
PATHS = (
    "; for a table whose unit is a path of foreign keys, its rows as resolved along the path "
    "(a stored row that reaches two units is a row of each)"
)
MECHANISMS = {
    "laplace": "discrete Laplace (pure epsilon-DP)",
    "gaussian": "discrete Gaussian (zCDP, converted to (epsilon, delta))",
}
# What each note of ``BudgetReport.figures`` means; the notes themselves are the labels.
NOTES = {
    "decides": "the filter that admits queries; its cap is the guarantee",
    "valid adaptively": "a valid bound for adaptively chosen queries; not the deciding filter",
    "as if fixed in advance": (
        "a bound that holds only if every query had been fixed before any answer; never the "
        "guarantee"
    ),
}


def iso_time(seconds: float) -> str:
    """A ledger time (seconds since the epoch) in ISO 8601, UTC."""
    moment = dt.datetime.fromtimestamp(seconds, tz=dt.UTC)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


def _table(name: str, spec: TableSpec) -> dict[str, Any]:
    columns = {
        column: {
            "lower": exact(col.lower),
            "upper": exact(col.upper),
            "public_values": [str(v) for v in col.public_values]
            if col.public_values is not None
            else None,
            "public_values_from": col.public_values_from,
        }
        for column, col in sorted(spec.columns.items())
    }
    return {
        "table": name,
        "public": spec.public,
        "privacy_unit": spec.unit_text if spec.is_private else None,
        "max_groups_per_unit": spec.max_groups_per_unit,
        "max_rows_per_unit_per_group": spec.max_rows_per_unit_per_group,
        "columns": columns,
        "constant_per_unit": list(spec.constant_per_unit),
    }


def _schedule_entry(record: Record) -> dict[str, Any]:
    payload = record.payload
    entry: dict[str, Any] = {
        "seq": record.seq,
        "time": iso_time(record.time),
        "kind": record.kind,
        "analyst": record.analyst,
    }
    if record.kind == "charge":
        event = composite_from_json(dict(payload["event"]))
        entry.update(
            query=str(payload["query"]),
            epsilon=exact(event.epsilon),
            delta=exact(event.delta),
            mechanisms=event.describe(),
            cell=list(event.cell) if event.cell is not None else None,
        )
        if payload.get("blocks"):  # the blocks it read of each table made of blocks
            entry["blocks"] = payload["blocks"]
        if overrides_of(payload):  # the bounds it ran with that differ from the policy's
            entry["overrides"] = overrides_of(payload)
    elif record.kind in ("budget_add", "allocate"):
        entry.update(
            epsilon=exact(Fraction(str(payload["epsilon"]))),
            delta=exact(Fraction(str(payload["delta"]))),
            by=str(payload["by"]),
            why=str(payload["why"]),
        )
        if record.kind == "allocate":
            entry["share_of"] = str(payload["analyst"])
    elif record.kind == "failure":  # for the owner: why the query of a charge gave no answer
        entry["charge_seq"] = payload.get("charge")
        entry["cause"] = str(payload.get("cause"))
    else:  # a release, a cache re-serve, or a kind this version does not read: named, not read
        if "query" in payload:
            entry["query"] = str(payload["query"])
        for ref in ("charge", "release"):  # the record a release or a re-serve refers to
            if isinstance(payload.get(ref), int):
                entry[f"{ref}_seq"] = payload[ref]
    return entry


def _analysts(
    policy: Policy, records: Sequence[Record], schedule: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    shares: dict[str, dict[str, Any]] = {
        name: {"epsilon": exact(s.epsilon), "delta": exact(s.delta), "set_by": "policy"}
        for name, s in policy.budget.analysts.items()
    }
    for entry in schedule:
        if entry["kind"] == "allocate":
            shares[entry["share_of"]] = {
                "epsilon": entry["epsilon"],
                "delta": entry["delta"],
                "set_by": f"ledger record {entry['seq']}",
            }
    spent: dict[str, tuple[Fraction, Fraction, int]] = {}
    for entry in schedule:
        if entry["kind"] == "charge":
            name = entry["analyst"] if entry["analyst"] is not None else "(anonymous)"
            eps, delta, n = spent.get(name, (Fraction(0), Fraction(0), 0))
            spent[name] = (
                eps + Fraction(entry["epsilon"]),
                delta + Fraction(entry["delta"]),
                n + 1,
            )
    result: dict[str, Any] = {}
    for name in sorted(set(shares) | set(spent)):
        eps, delta, n = spent.get(name, (Fraction(0), Fraction(0), 0))
        result[name] = {
            "share": shares.get(name),
            "queries": n,
            # The plain sums of the analyst's charges (basic composition of their own history).
            "epsilon_charged": exact(eps),
            "delta_charged": exact(delta),
        }
    return result


def build_report(policy: Policy, budget: Budget, generated: float | None = None) -> dict[str, Any]:
    """The contract of the data set as plain JSON-ready data (see the module docstring)."""
    records = budget.store.records()
    summary = budget.report()
    schedule = [_schedule_entry(r) for r in records]
    top_eps = sum(
        (Fraction(e["epsilon"]) for e in schedule if e["kind"] == "budget_add"), Fraction(0)
    )
    top_delta = sum(
        (Fraction(e["delta"]) for e in schedule if e["kind"] == "budget_add"), Fraction(0)
    )
    spec = policy.budget
    identity = getattr(budget.store, "identity", {})
    return {
        "format": REPORT_FORMAT,
        "generated": iso_time(
            generated if generated is not None else dt.datetime.now(dt.UTC).timestamp()
        ),
        "dataset": {"id": policy.dataset.id, "data_version": policy.dataset.data_version},
        "policy_version": policy.version,
        "ledger": {
            "id": identity.get("ledger_id"),
            "durable": budget.store.durable,
            "records": len(records),
            "head": records[-1].hash if records else GENESIS,
        },
        "budget": {
            "glance": str(summary),  # the one line every budget screen leads with
            "accountant": summary.accountant,
            "epsilon": {
                "policy": exact(summary.epsilon_total - top_eps),
                "top_ups": exact(top_eps),
                "total": exact(summary.epsilon_total),
                "spent": _spent(summary.epsilon_spent),
                "remaining": exact(summary.epsilon_remaining),
            },
            "delta": {
                "policy": exact(summary.delta_total - top_delta),
                "top_ups": exact(top_delta),
                "total": exact(summary.delta_total),
                "spent": exact(summary.delta_spent),
                "remaining": exact(summary.delta_remaining),
            },
            "rho": exact(spec.rho),
            "query_defaults": {
                "epsilon": exact(spec.query_epsilon),
                "delta": exact(spec.query_delta),
            },
            "charged_queries": summary.queries,
            "adaptive_cap": _adaptive(summary),
            "analysts": _analysts(policy, records, schedule),
        },
        "adjacency": {
            "definition": ADJACENCY
            + (PATHS if any(t.unit_path for t in policy.tables.values()) else ""),
            "privacy_units": {
                n: t.unit_text for n, t in sorted(policy.tables.items()) if t.is_private
            },
            "public_tables": sorted(n for n, t in policy.tables.items() if t.public),
        },
        "bounds": [_table(n, t) for n, t in sorted(policy.tables.items()) if t.is_private],
        # The tables made of blocks: each block, the charges that read it, those retired.
        **({"blocks": blocks_data(records)} if policy.data.blocks else {}),
        # A person-within-period unit: the lifetime cap per person, then each period's budget.
        **({"periods": periods_data(policy, budget)} if policy.periods is not None else {}),
        "mechanism": {"preference": spec.mechanism, "description": MECHANISMS[spec.mechanism]},
        "accounting": {
            "decides": summary.accountant,
            "delta": exact(summary.delta_total),
            "figures": [
                {
                    "accountant": f.accountant,
                    "epsilon": repr(f.epsilon) if math.isfinite(f.epsilon) else UNBOUNDED,
                    "note": f.note,
                    "exceeds_cap": exceeds(f, summary.epsilon_total),
                }
                for f in summary.figures
            ],
            "notes": NOTES,
        },
        "schedule": schedule,
        "audit": audit(records, {e["seq"]: e["time"] for e in schedule}),
    }


def _adaptive(summary: BudgetReport) -> dict[str, Any] | None:
    """With a cap raised after answers were seen: the record that raised it first, and what
    holds adaptively instead of the cap (``BudgetReport.valid_adaptively``)."""
    if summary.adaptive_cap is None or summary.valid_adaptively is None:
        return None
    eps, delta = summary.valid_adaptively
    return {
        "since_record": summary.adaptive_cap,
        "valid_adaptively": {
            "theorem": "basic composition",
            "epsilon": exact(eps),
            "delta": exact(delta),
        },
    }


def _spent(value: Spent) -> str | None:
    """A filter's spend as exact text; ``UNBOUNDED`` when its parameters certify nothing."""
    return exact(Fraction(value)) if math.isfinite(value) else UNBOUNDED


def render_json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


__all__ = ["build_report", "iso_time", "render_json"]
