"""The bounds a query ran with that differ from the policy's, as its charge keeps them.

An analyst may replace the policy's contribution bounds for a session or a query (``SET
dpsql.max_groups_per_unit``, an inline ``OPTIONS(...)``, a keyword option), bounds estimated by
``ESTIMATE BOUNDS`` fill in those the policy leaves undeclared, ``dpsql.bounds = auto`` has
dpsql choose them per query, and ``dpsql.split`` and ``dpsql.mechanism`` change how a query's
budget is spent and noised. Each stays within the guarantee (the charge is computed from the
bounds the query runs with), but the owner must be able to see them: ``overrides`` lists, for
one plan, each that differs from the policy's declaration and where it came from (``session``:
the analyst's setting; ``estimate``: a released estimate filling an undeclared bound). The
charge keeps the list in its details (``dpsql.session.session.Session.details``), and the
shell's ``\\ledger``, ``dpsql budget --overrides`` and the report's audit section show it with
the analyst's name (``override_text``).

A pure function of the plan and the two policies (as declared, and with the estimates): public
facts only, as the rest of a charge's details.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlglot import exp

from dpsql.plan.auto import CLAMPS
from dpsql.plan.plans import Plan
from dpsql.policy import Policy
from dpsql.policy.numbers import decimal_text
from dpsql.session.settings import BY_NAME

__all__ = ["override_text", "overrides"]
_LABELS = {
    "max_groups_per_unit": "L0",
    "max_rows_per_unit_per_group": "C",
    "max_rows_per_unit": "R",
    CLAMPS: "clamps",
}


def overrides(base: Policy, effective: Policy, plan: Plan) -> list[dict[str, str]]:
    """Each bound ``plan`` runs with that differs from ``base`` (the policy as declared);
    ``effective`` is the policy with the session's estimates filled in."""
    found: list[dict[str, str]] = []
    table = plan.analysis.table
    declared, estimated = base.tables.get(table), effective.tables.get(table)
    options = plan.options
    chosen = set() if plan.auto is None else {c.bound for c in plan.auto.choices}
    for name, value in (
        ("max_groups_per_unit", options.max_groups_per_unit),
        ("max_rows_per_unit_per_group", options.max_rows_per_unit_per_group),
        ("max_rows_per_unit", options.max_rows_per_unit),
    ):
        own = getattr(declared, name, None)
        if value is None or value == own or name in chosen:
            continue
        if name == "max_groups_per_unit" and not plan.analysis.keys:
            continue  # one global group: L0 bounds nothing
        source = (
            "estimate" if own is None and value == getattr(estimated, name, None) else "session"
        )
        found.append(_entry(_LABELS[name], table, own, value, source))
    if declared is not None and estimated is not None:
        used = _columns(plan)
        for column, spec in sorted(estimated.columns.items()):
            own_spec = declared.columns.get(column)
            own = own_spec.bounds if own_spec is not None else None
            if column in used and spec.bounds is not None and spec.bounds != own:
                found.append(_entry("clamps", f"{table}.{column}", own, spec.bounds, "estimate"))
    if plan.auto is not None:
        names = sorted({_LABELS[c.bound] + (f" {c.column}" if c.column else "")
                        for c in plan.auto.choices})  # fmt: skip
        if names and (declared is None or declared.bounds is None):
            found.append(_entry("auto", table, "declared", ", ".join(names), "session"))
    default_split = BY_NAME["split"].default(base)  # the setting's own default
    if options.split != default_split:
        found.append(_entry("split", None, default_split, options.split, "session"))
    own_mechanism = (
        base.budget.declared_mechanism.mechanism
        if base.budget.declared_mechanism is not None
        else base.budget.mechanism
    )
    if options.mechanism != own_mechanism:
        found.append(_entry("mechanism", None, own_mechanism, options.mechanism, "session"))
    return found


def _entry(
    bound: str, where: str | None, policy: object, session: object, source: str
) -> dict[str, str]:
    entry = {"bound": bound, "policy": _text(policy), "session": _text(session), "source": source}
    if where is not None:
        entry["of"] = where
    return entry


def _text(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return "[" + ", ".join(_text(v) for v in value) + "]"
    if isinstance(value, int) or not hasattr(value, "denominator"):
        return str(value)
    return decimal_text(value)  # type: ignore[arg-type]


def _columns(plan: Plan) -> set[str]:
    """The columns the plan's measured values read (lower-case): whose clamps it uses."""
    if plan.bounding is None:
        return set()
    return {
        column.name.lower()
        for value in plan.bounding.values
        for column in value.expr.find_all(exp.Column)
    }


def override_text(entry: Mapping[str, Any]) -> str:
    """One override as the screens print it: ``L0 of visits 7 (policy 3)``."""
    where = f" of {entry['of']}" if entry.get("of") else ""
    source = " by estimate" if entry.get("source") == "estimate" else ""
    return f"{entry['bound']}{where} {entry['session']} (policy {entry['policy']}){source}"
