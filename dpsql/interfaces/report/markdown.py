"""The privacy report as Markdown: one section per part of the contract.

``render_markdown`` formats the plain dict of ``report.build_report`` and computes nothing from
the data: the budget and the analysts' shares, adjacency, contribution bounds and mechanism,
every accountant's reading, and the release schedule, each a heading with paragraphs, lists and
pipe tables (cells on one line, ``|`` escaped as ``\\|``). Numbers are shown as the budget
screens show them (spent rounded up, what is left rounded down, 6 significant digits); the JSON
keeps every digit. ``html_report.py`` renders this Markdown to
HTML; ``report.py`` re-exports ``render_markdown``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

from dpsql.accounting.budget.report import EXCEEDS, UNBOUNDED, cap_text, left_text, spent_text
from dpsql.accounting.theorems.base import Spent
from dpsql.interfaces.report.blocks import md_blocks
from dpsql.interfaces.report.periods import md_periods
from dpsql.session.overrides import override_text

__all__ = ["EXCEEDS_MEANING", "render_markdown"]

EXCEEDS_MEANING = (
    "a figure that does not decide reads the history above the cap: that theorem would have "
    "refused earlier; the cap of the filter that decides still holds"
)


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


def _number(text: object, rounded: Callable[[Spent], str]) -> object:
    """For people: an exact decimal or a float's repr of the JSON in the budget screens' decimals
    (``rounded``: spent up, what is left down, a cap as it is); the JSON keeps every digit."""
    if not isinstance(text, str):
        return text
    if text in (UNBOUNDED, "inf", "Infinity"):
        return UNBOUNDED
    try:
        value = Fraction(text)
    except (ValueError, ZeroDivisionError):
        return text
    return rounded(value)


def _short(text: object) -> object:
    return _number(text, cap_text)


def _up(text: object) -> object:
    return _number(text, spent_text)


def _md_budget(data: dict[str, Any]) -> list[str]:
    b = data["budget"]
    out = [
        "## Budget",
        "",
        b["glance"],  # the one line every budget screen leads with
        "",
        f"The **{b['accountant']}** filter decides admission; the guarantee is its cap.",
        "",
    ]
    parts = (("policy", _short), ("top_ups", _short), ("total", _short), ("spent", _up))
    out += _rows(
        ("", "policy", "top-ups", "total", "spent", "remaining"),
        [
            [name, *(way(b[name][p]) for p, way in parts), _number(b[name]["remaining"], left_text)]
            for name in ("epsilon", "delta")
        ],
    )
    if b["rho"] is not None:
        out += ["", f"The policy's budget is zCDP rho = {b['rho']}."]
    if b["adaptive_cap"] is not None:
        held = b["adaptive_cap"]["valid_adaptively"]
        out += [
            "",
            f"**Adaptive cap.** The cap was raised after answers were seen (ledger record "
            f"{b['adaptive_cap']['since_record']}), so it is not a guarantee. What holds whatever "
            f"was chosen adaptively, by {held['theorem']} of the charges: epsilon "
            f"{_up(held['epsilon'])}, delta {_up(held['delta'])}.",
        ]
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
                    _short(share.get("epsilon")),
                    _short(share.get("delta")),
                    share.get("set_by"),
                    a["queries"],
                    _up(a["epsilon_charged"]),
                    _up(a["delta_charged"]),
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
    out += [f"- *{EXCEEDS}*: {EXCEEDS_MEANING}"]
    rows = [
        [
            f["accountant"],
            _up(f["epsilon"]),
            f["note"] + (f"; {EXCEEDS}" if f["exceeds_cap"] else ""),
        ]
        for f in acc["figures"]
    ]
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
            [
                e["seq"],
                e["time"],
                e["kind"],
                who,
                what,
                _up(e.get("epsilon")),
                _up(e.get("delta")),
                how,
            ]
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


def _md_audit(data: dict[str, Any]) -> list[str]:
    """Who ran queries on bounds other than the policy's, and the unnamed charges."""
    found = data["audit"]
    out = ["## Audit", ""]
    rows = [
        [
            e["seq"],
            e["time"],
            e["analyst"] if e["analyst"] is not None else "(no name)",
            e["query"],
            "; ".join(override_text(o) for o in e["overrides"]),
        ]
        for e in found["overrides"]
    ]
    if rows:
        out += [
            "Charges whose query ran on bounds other than the policy's (session settings, "
            "estimates, bounds chosen per query, the split, the mechanism):",
            "",
            *_rows(("seq", "time (UTC)", "analyst", "query", "differs from the policy"), rows),
        ]
    else:
        out.append("No charge ran on bounds other than the policy's.")
    if found["unnamed_charges"]:
        out += [
            "",
            f"Charges by no named analyst: {found['unnamed_charges']}, epsilon "
            f"{found['unnamed_epsilon']} in all (`budget.require_analyst = true` admits named "
            "analysts only).",
        ]
    return out


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
        md_periods(data),
        _md_budget(data),
        _md_contract(data),
        _md_accounting(data),
        _md_audit(data),
        md_blocks(data),
        _md_schedule(data),
    ]
    return "\n\n".join("\n".join(s) for s in sections if s) + "\n"
