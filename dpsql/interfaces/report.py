"""The report of a data set's privacy contract (DESIGN.md section 1), as data and as text.

``build_report`` gathers, from the policy and the verified ledger only (never the data), what a
guarantee needs stated: the budget (policy totals, top-ups, spent, remaining), adjacency, the
contribution bounds of every table, the mechanism preference, the deciding filter beside every
other accountant's reading of the same history, and the release schedule (every charge, top-up
and allocation in ledger order). The result is a plain JSON-ready dict: exact rationals are
written as their text (``"1/3"``, ``"0.5"`` never rounded), floats from accountants as their
``repr`` (``"inf"`` included), counts as integers. ``render_markdown`` and ``render_json`` only
format that dict, so both formats always say the same thing.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from dpsql.accounting.events import composite_from_json
from dpsql.accounting.filter import Budget
from dpsql.accounting.ledger import GENESIS, Record
from dpsql.policy import Policy, TableSpec
from dpsql.policy_numbers import exact

REPORT_FORMAT = 1
ADJACENCY = (
    "user-level, unbounded: neighbouring databases differ by adding or removing all rows of one "
    "privacy unit"
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
        "privacy_unit": spec.privacy_unit,
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
            "accountant": summary.accountant,
            "epsilon": {
                "policy": exact(summary.epsilon_total - top_eps),
                "top_ups": exact(top_eps),
                "total": exact(summary.epsilon_total),
                "spent": exact(summary.epsilon_spent),
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
            "analysts": _analysts(policy, records, schedule),
        },
        "adjacency": {
            "definition": ADJACENCY,
            "privacy_units": {
                n: t.privacy_unit for n, t in sorted(policy.tables.items()) if t.is_private
            },
            "public_tables": sorted(n for n, t in policy.tables.items() if t.public),
        },
        "bounds": [_table(n, t) for n, t in sorted(policy.tables.items()) if t.is_private],
        "mechanism": {"preference": spec.mechanism, "description": MECHANISMS[spec.mechanism]},
        "accounting": {
            "decides": summary.accountant,
            "delta": exact(summary.delta_total),
            "figures": [
                {"accountant": f.accountant, "epsilon": repr(f.epsilon), "note": f.note}
                for f in summary.figures
            ],
            "notes": NOTES,
        },
        "schedule": schedule,
    }


def render_json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def _cell(value: object) -> str:
    """A Markdown table cell: pipes escaped, one line."""
    if value is None:
        return "—"
    if isinstance(value, list):
        value = "; ".join(str(v) for v in value)
    return " ".join(str(value).split()).replace("|", "\\|")


def _rows(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return lines


def _short(text: str) -> str:
    """For people: an exact decimal of a float's binary value (a rho budget's certified epsilon
    has ~50 digits) shown to 16 significant digits; the JSON keeps every digit."""
    if len(text) <= 24 or "/" in text:
        return text
    return f"≈ {float(Fraction(text)):.16g}"


def _md_budget(data: dict[str, Any]) -> list[str]:
    b = data["budget"]
    out = [
        "## Budget",
        "",
        f"The **{b['accountant']}** filter decides admission; the guarantee is its cap.",
        "",
    ]
    parts = ("policy", "top_ups", "total", "spent", "remaining")
    out += _rows(
        ("", "policy", "top-ups", "total", "spent", "remaining"),
        [[name, *(_short(b[name][p]) for p in parts)] for name in ("epsilon", "delta")],
    )
    if b["rho"] is not None:
        out += ["", f"The policy's budget is zCDP rho = {b['rho']}."]
    defaults = b["query_defaults"]
    out += [
        "",
        f"Charged queries: {b['charged_queries']}. Per-query defaults: epsilon "
        f"{defaults['epsilon']}, delta {defaults['delta']}.",
    ]
    if b["analysts"]:
        header = (
            "analyst",
            "share epsilon",
            "share delta",
            "share set by",
            "queries",
            "epsilon charged",
            "delta charged",
        )
        rows = []
        for name, a in b["analysts"].items():
            share = a["share"] or {}
            rows.append(
                [
                    name,
                    share.get("epsilon"),
                    share.get("delta"),
                    share.get("set_by"),
                    a["queries"],
                    a["epsilon_charged"],
                    a["delta_charged"],
                ]
            )
        out += ["", "### Analysts", "", *_rows(header, rows)]
    return out


def _md_contract(data: dict[str, Any]) -> list[str]:
    adj, mech = data["adjacency"], data["mechanism"]
    out = ["## Adjacency", "", adj["definition"] + ".", ""]
    out += _rows(("table", "privacy unit"), list(adj["privacy_units"].items()))
    if adj["public_tables"]:
        out += ["", "Public tables: " + ", ".join(f"`{t}`" for t in adj["public_tables"]) + "."]
    out += ["", "## Contribution bounds", ""]
    out += _rows(
        (
            "table",
            "L0 (max_groups_per_unit)",
            "C (max_rows_per_unit_per_group)",
            "constant_per_unit",
        ),
        [
            [
                t["table"],
                t["max_groups_per_unit"],
                t["max_rows_per_unit_per_group"],
                t["constant_per_unit"] or None,
            ]
            for t in data["bounds"]
        ],
    )
    columns = [
        [t["table"], name, c["lower"], c["upper"], c["public_values"], c["public_values_from"]]
        for t in data["bounds"]
        for name, c in t["columns"].items()
    ]
    if columns:
        header = ("table", "column", "lower", "upper", "public values", "values from")
        out += ["", *_rows(header, columns)]
    out += ["", "## Mechanism", "", f"Preference: `{mech['preference']}`, {mech['description']}."]
    return out


def _md_accounting(data: dict[str, Any]) -> list[str]:
    acc = data["accounting"]
    out = [
        "## Accountants",
        "",
        f"The same history under every accountant: epsilon at delta = {acc['delta']}. Labels:",
        "",
    ]
    out += [f"- *{note}*: {meaning}" for note, meaning in acc["notes"].items()]
    rows = [[f["accountant"], f["epsilon"], f["note"]] for f in acc["figures"]]
    return [*out, "", *_rows(("accountant", "epsilon", "label"), rows)]


def _reference(entry: dict[str, Any]) -> str | None:
    if entry["kind"] == "failure":
        return f"failure of charge {entry['charge_seq']} in the engine ({entry['cause']})"
    if "charge_seq" in entry:
        return f"answer of charge {entry['charge_seq']}"
    if "release_seq" in entry:
        return f"re-serve of release {entry['release_seq']} (no charge)"
    return None


def _md_schedule(data: dict[str, Any]) -> list[str]:
    rows = []
    for e in data["schedule"]:
        who = e["analyst"] if e["analyst"] is not None else e.get("by")
        what = e.get("query") or (f"share of {e['share_of']}" if "share_of" in e else None)
        how = e.get("mechanisms") or e.get("why") or _reference(e)
        rows.append(
            [e["seq"], e["time"], e["kind"], who, what, e.get("epsilon"), e.get("delta"), how]
        )
    header = (
        "seq",
        "time (UTC)",
        "kind",
        "analyst / by",
        "query",
        "epsilon",
        "delta",
        "mechanisms / why",
    )
    return ["## Release schedule", "", *_rows(header, rows)]


def render_markdown(data: dict[str, Any]) -> str:
    """The report as Markdown: one section per part of the contract."""
    ledger = data["ledger"]
    head = [
        f"# Privacy report: data set `{data['dataset']['id']}`",
        "",
        f"Generated {data['generated']}; data version `{data['dataset']['data_version']}`; "
        f"policy version `{data['policy_version']}`; ledger `{ledger['id']}` "
        f"({ledger['records']} records, head `{ledger['head']}`).",
    ]
    sections = [
        head,
        _md_budget(data),
        _md_contract(data),
        _md_accounting(data),
        _md_schedule(data),
    ]
    return "\n\n".join("\n".join(s) for s in sections) + "\n"


__all__ = ["build_report", "exact", "iso_time", "render_json", "render_markdown"]
