"""The budget's stores: the in-memory ledger, and the policy's durable one.

``MemoryLedger`` is the ledger's interface in memory (nothing survives the process); ``Store``
is either kind. ``budget_caps`` is what a ledger pins at its creation and ``pinned_spec`` the
budget it pinned, which a policy must equal; ``create_ledger``, ``ledger_exists`` and
``open_store`` create, find and open the ledger a policy names.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from dpsql.accounting.ledger.anchor import anchor_path
from dpsql.accounting.ledger.chain import Record
from dpsql.accounting.ledger.ledger import BUDGET_RECORD, Ledger
from dpsql.accounting.registry import deciding
from dpsql.errors import EntropyError, LedgerError, PolicyError
from dpsql.policy import FILTER_VERSION, BudgetSpec, FilterVersion, Policy

__all__ = [
    "MemoryLedger",
    "Store",
    "budget_caps",
    "create_ledger",
    "ledger_exists",
    "open_store",
    "pinned_spec",
]


class MemoryLedger:
    """The ledger's interface, in memory: nothing survives the process (no ``dpsql init``)."""

    durable = False

    def __init__(self) -> None:
        self._records: list[Record] = []
        self._lock = threading.Lock()
        # The salt of the keyed hash that picks a unit's groups (see Ledger.create).
        try:
            self.identity = {"salt": str(secrets.randbits(62))}
        except Exception:
            raise EntropyError("secure randomness is unavailable") from None

    def append(
        self,
        kind: str,
        payload: Mapping[str, Any],
        analyst: str | None = None,
        decide: Callable[[list[Record]], None] | None = None,
        *,
        synced: bool = True,  # nothing here is on disk
        wait: bool = True,
    ) -> Record:
        with self._lock:
            if decide is not None:
                decide(self._records)  # not copied: O(1) per charge; decide only reads it
            seq = len(self._records) + 1
            record = Record(seq, time.time(), kind, analyst, dict(payload), "", "")
            self._records.append(record)
            return record

    def on_disk(self, seq: int) -> None:
        """Nothing to wait for: nothing here is on disk."""

    def records(self) -> list[Record]:
        with self._lock:
            return list(self._records)

    def records_since(self, count: int) -> list[Record]:
        with self._lock:
            return self._records[count:]


Store = Ledger | MemoryLedger


def budget_caps(spec: BudgetSpec, filter_version: FilterVersion = FILTER_VERSION) -> dict[str, Any]:
    """What the ledger pins at its creation (``BUDGET_RECORD``): the caps, the deciding filter
    and its fixed parameters, the analysts' shares; exact numbers as text. Per-query defaults
    (``query_epsilon``, ``mechanism``, ...) are not caps and may change freely.

    Under the rdp and zcdp filters, also the version of the defaults their unstated parameters
    take (grid, split, selection reserve): the policy's, else ``filter_version`` (the current
    one for a new ledger). A ledger whose record has none was created with version 1."""

    def text(value: object) -> str | None:
        return None if value is None else str(value)

    deciding(spec)  # a ledger pins only a filter dpsql knows (PolicyError naming the field)
    version: int | None = None
    if spec.accountant in ("rdp", "zcdp"):
        version = spec.filter_version if spec.filter_version is not None else filter_version
    return {
        "epsilon": text(spec.epsilon),
        "delta": str(spec.delta),
        "rho": text(spec.rho),
        "accountant": spec.accountant,
        "advanced_delta_prime": text(spec.advanced_delta_prime),
        "rdp_order": None if spec.rdp_order is None else repr(spec.rdp_order),
        "selection_delta": text(spec.selection_delta),
        "filter_version": version,
        **_declared(spec),
        "analysts": {
            name: {"epsilon": str(share.epsilon), "delta": str(share.delta)}
            for name, share in sorted(spec.analysts.items())
        },
    }


def _declared(spec: BudgetSpec) -> dict[str, Any]:
    """The PLD filter's declared mechanism, its family, pinned with the caps (absent for the
    other filters, so that ledgers created before it pin the same fields)."""
    declared = spec.declared_mechanism
    if declared is None:
        return {}
    return {
        "declared_mechanism": {
            "kind": declared.kind,
            "sensitivity": str(declared.sensitivity),
            "scale": None if declared.scale is None else str(declared.scale),
            "sigma": None if declared.sigma is None else str(declared.sigma),
        }
    }


def _flat(caps: Mapping[str, Any], prefix: str = "budget") -> dict[str, object]:
    flat: dict[str, object] = {}
    for key, value in caps.items():
        if isinstance(value, Mapping):
            flat.update(_flat(value, f"{prefix}.{key}"))
        else:
            flat[f"{prefix}.{key}"] = value
    return flat


def pinned_spec(spec: BudgetSpec, store: Store) -> BudgetSpec:
    """The budget as the ledger pinned it at its creation, with the policy's per-query defaults.

    A policy whose caps or filter differ from the ledger's is refused with what differs: the cap
    of a ledger changes only by recorded owner acts (``dpsql budget add``, ``allocate``), never
    by editing a policy file or passing another dict to ``connect``.
    """
    pinned = next((r for r in store.records() if r.kind == BUDGET_RECORD), None)
    if pinned is None:
        raise LedgerError(
            "the ledger records no budget (it was created by an earlier dpsql); record the "
            "policy's budget in it with dpsql ledger pin-budget"
        )
    recorded = {k: v for k, v in pinned.payload.items() if k != "why"}
    if recorded.get("accountant") in ("rdp", "zcdp"):
        # Recorded before versions were: the filter of version 1, which decided its history.
        recorded.setdefault("filter_version", 1)
    ours, theirs = _flat(budget_caps(spec)), _flat(recorded)
    if spec.filter_version is None:
        # Unstated in the policy: the ledger's own, fixed when it was created (never the
        # current one: a filter chosen after the history is not a filter).
        ours.pop("budget.filter_version", None)
        theirs.pop("budget.filter_version", None)
    differing = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
    if differing:
        shown = "; ".join(
            f"{k} is {ours.get(k, 'absent')} in the policy, {theirs.get(k, 'absent')} in the ledger"
            for k in differing[:6]
        )
        raise PolicyError(
            f"the policy's budget differs from the one its ledger was created with: {shown}. "
            "A ledger's caps and filter are fixed at dpsql init; top it up with dpsql budget "
            "add and set shares with dpsql budget allocate"
        )
    caps = {k: v for k, v in recorded.items() if v is not None}
    # The policy's own, not caps: per-query defaults, and who may be answered.
    defaults = {"query_epsilon": spec.query_epsilon, "query_delta": spec.query_delta,
                "mechanism": spec.mechanism, "require_analyst": spec.require_analyst}  # fmt: skip
    return BudgetSpec.model_validate({**caps, **defaults})


def create_ledger(policy: Policy, by: str | None = None) -> Ledger:
    """``dpsql init``: the policy's durable ledger, created with its budget pinned."""
    assert policy.ledger is not None
    path = policy.resolve(policy.ledger.path)
    anchor = policy.resolve(policy.ledger.anchor) if policy.ledger.anchor is not None else None
    return Ledger.create(path, policy.dataset.id, anchor, budget=budget_caps(policy.budget), by=by)


def ledger_exists(policy: Policy) -> bool:
    """Whether the policy's ledger or its anchor is on disk (either: a ledger that lost one of
    them fails closed when opened, rather than passing for one never created)."""
    assert policy.ledger is not None
    path = policy.resolve(policy.ledger.path)
    given = policy.ledger.anchor
    anchor = policy.resolve(given) if given is not None else anchor_path(path)
    try:
        return path.exists() or anchor.exists()
    except OSError:
        return True  # cannot tell: opened, so that it fails closed


def open_store(policy: Policy) -> Store:
    """The policy's ledger, verified (fail closed), or a memory one when it names none."""
    if policy.ledger is None:
        return MemoryLedger()
    path = policy.resolve(policy.ledger.path)
    anchor = policy.resolve(policy.ledger.anchor) if policy.ledger.anchor is not None else None
    return Ledger(path, anchor)
