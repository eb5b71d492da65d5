"""The owner's audit of a ledger: who ran queries on bounds other than the policy's, and who
spent budget without a name.

Each charge keeps the bounds its query ran with that differ from the policy's
(``dpsql.session.overrides``: L0, C, R, clamps, auto bounds, split, mechanism, and where each
came from). ``audit`` gathers them from the ledger's records, with the analyst, the time and
the query of each charge, and counts the charges made by no named analyst. The report's audit
section, ``dpsql budget --overrides`` and the shell's ``\\ledger`` print them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from dpsql.accounting.ledger.chain import Record
from dpsql.policy.numbers import exact
from dpsql.session.overrides import override_text

__all__ = ["audit", "audit_lines", "overrides_of"]


def overrides_of(payload: Mapping[str, Any]) -> list[dict[str, str]]:
    """The overrides a charge's record keeps (none in a record written before they were)."""
    found = payload.get("overrides")
    if not isinstance(found, list):
        return []
    return [{str(k): str(v) for k, v in e.items()} for e in found if isinstance(e, Mapping)]


def audit(records: Sequence[Record], times: Mapping[int, str]) -> dict[str, Any]:
    """The audit as JSON-ready data: each charge with overrides (``times``: each record's
    time as the report writes it, by seq), and the unnamed charges' count and epsilon sum."""
    changed = []
    unnamed, unnamed_epsilon = 0, Fraction(0)
    for record in records:
        if record.kind != "charge":
            continue
        payload = record.payload
        if record.analyst is None:
            unnamed += 1
            unnamed_epsilon += Fraction(str(payload.get("epsilon", "0")))
        found = overrides_of(payload)
        if found:
            changed.append(
                {
                    "seq": record.seq,
                    "time": times.get(record.seq, ""),
                    "analyst": record.analyst,
                    "query": str(payload.get("query", "")),
                    "overrides": found,
                }
            )
    return {
        "overrides": changed,
        "unnamed_charges": unnamed,
        "unnamed_epsilon": exact(unnamed_epsilon),
    }


def audit_lines(data: Mapping[str, Any]) -> list[str]:
    """The audit in sentences, one per charge with overrides (text screens)."""
    lines = []
    for entry in data["overrides"]:
        who = entry["analyst"] if entry["analyst"] is not None else "(no analyst name)"
        differs = "; ".join(override_text(e) for e in entry["overrides"])
        lines.append(f"charge {entry['seq']} at {entry['time']} by {who}: {differs}")
        lines.append(f"  {entry['query']}")
    if not lines:
        lines.append("no charge ran on bounds other than the policy's")
    if data["unnamed_charges"]:
        lines.append(
            f"{data['unnamed_charges']} charge(s) by no named analyst, epsilon "
            f"{data['unnamed_epsilon']} in all (budget.require_analyst admits named ones only)"
        )
    return lines
