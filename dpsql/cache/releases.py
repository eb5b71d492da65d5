"""The release cache: a released answer served again is post-processing and costs nothing.

What is cached is a fresh release's *noisy measurements* (keys and noisy integer totals), in
the ledger, so a hit survives restarts and is recorded there like everything else. Each hit
re-runs only the post-processing, so textual variants of a query (case, whitespace, aliases,
the order of AND/OR terms, a parameter inlined or bound) and its ORDER BY / LIMIT / HAVING /
output-expression variants are answered from the same release.

The key is the *measurement core*: the data set, the policy's version and the data version the
owner declares (never a fingerprint of the data: whether a query is charged must not reveal
that the data changed), the table, the canonical WHERE, the group keys, the contribution
bounds, a pinned cell, the privacy parameters, and every measurement with its noise. A query
whose measurements are all in one release of the same core (same bounded rows: same bounds,
filter, salt and NULL handling, and the same released groups) is served from it; AVG(x) may be
derived from a released SUM(x) and COUNT(x) of that core (its half-width from the combination
of their noises, under the union bound: they share the COUNT's).
A workload family's release answers a plan that is a linear function of its measurements
(``dpsql.cache.families.derive``: the same rows, settings and bounds, keys among its fine keys).
Every fresh release of the same bounded-row definition (``Keys.rows``: the core without the
privacy parameters, with the engine) answers a plan whose measurements they all hold, at any
epsilon, each the least noisy release or their inverse-variance combination (``assemble``).
Releases are shared by every analyst of the data set: a released answer is public to whoever
may query it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

from dpsql.accounting.ledger.store import Store
from dpsql.cache.derive import (
    Signatures,
    assemble,
    derive_from_core,
    stored_noisy,
    stored_signatures,
)
from dpsql.cache.families import RECORD_KIND, derive
from dpsql.cache.keys import Keys
from dpsql.cache.stored_values import plain as _plain
from dpsql.noise.measure import Noisy
from dpsql.plan.plans import Plan
from dpsql.plan.workload.family import ASSEMBLED, base_digest, eligible


@dataclass(frozen=True)
class Hit:
    """A cached release that answers a plan, and the ledger record it came from."""

    noisy: Noisy
    release_seq: int
    # Per measurement, the noise combination of its values (``Measurement.combined``), for its
    # half-widths; None for a measurement served as it was released.
    combined: tuple[Signatures | None, ...] | None = None
    # Where it came from: a release ("release"), a workload member's answer kept under its own
    # key ("member", ``record_member``), or a workload family's release ("family",
    # ``dpsql.cache.families.derive``: a level or an aggregate no member of the file asked for).
    source: Literal["release", "member", "family", "releases"] = "release"
    # Computed from released measurements other than its own (an AVG from a SUM and a COUNT,
    # a COUNT, SUM or AVG from a variance's Bernstein vector).
    derived: bool = False
    # With source "releases" (``assemble``): every release whose measurements it combines.
    sources: tuple[int, ...] = ()

    @property
    def origin(self) -> str:
        """Where the answer comes from, for a plan's display: ``release N`` or ``releases N, M``."""
        if len(self.sources) > 1:
            return "releases " + ", ".join(map(str, self.sources))
        return f"release {self.release_seq}"


class ReleaseCache:
    """The releases recorded in the ledger, indexed by key; refreshed from the ledger."""

    def __init__(self, store: Store):
        self.store = store
        self._seen = 0
        self._exact: dict[str, tuple[int, dict[str, Any]]] = {}
        self._cores: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        # Workload families' releases, by the digest of their rows and settings (``derive``).
        self._families: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        # Fresh releases by their bounded-row definition (``Keys.rows``, ``assemble``).
        self._rows: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        self._lock = threading.Lock()

    def _refresh(self) -> None:
        for record in self.store.records_since(self._seen):
            if record.kind == "release":
                payload = dict(record.payload)
                self._exact[str(payload["key"])] = (record.seq, payload)
                if "combined" not in payload:  # a family's answer serves its own query only
                    self._cores.setdefault(str(payload["core"]), []).append((record.seq, payload))
                    if "rows" in payload:
                        self._rows.setdefault(str(payload["rows"]), []).append(
                            (record.seq, payload)
                        )
            elif record.kind == RECORD_KIND and "derive" in record.payload:
                payload = dict(record.payload)
                base = str(payload["derive"]["base"])
                self._families.setdefault(base, []).append((record.seq, payload))
            self._seen = max(self._seen, record.seq)

    def lookup(self, plan: Plan, k: Keys, shared: bool = True) -> Hit | None:
        """The cached release answering ``plan`` exactly, or one it can be derived from (a
        release of the same core, or a workload family's release); ``shared=False`` (``SET
        dpsql.share = off``): not an answer a workload's family gave, nor one derived from it."""
        with self._lock:
            self._refresh()
            found = self._exact.get(k.exact)
            if found is not None and "combined" in found[1]:
                if shared:
                    signatures = stored_signatures(found[1]["combined"])
                    return Hit(stored_noisy(found[1]), found[0], tuple(signatures), "member")
                found = None
            if found is not None:
                return Hit(stored_noisy(found[1]), found[0])
            for seq, payload in reversed(self._cores.get(k.core, [])):
                derived = derive_from_core(plan, k, payload)
                if derived is not None:
                    noisy, rebuilt = derived
                    known = rebuilt if any(s is not None for s in rebuilt) else None
                    return Hit(noisy, seq, known, derived=known is not None or bool(noisy.derived))
            if shared and self._families and eligible(plan):
                for seq, payload in reversed(self._families.get(base_digest(plan), [])):
                    got = derive(plan, payload, k.scope)
                    if got is not None:
                        answered, noisy = got
                        combined = tuple(m.combined for m in answered.measurements)
                        return Hit(noisy, seq, combined, "family", derived=True)
            if k.rows in self._rows and eligible(plan, ASSEMBLED):
                assembled = assemble(k, self._rows[k.rows], plan.options.confidence)
                if assembled is not None:
                    noisy, signatures, seqs = assembled
                    return Hit(noisy, seqs[-1], signatures, "releases", True, seqs)
        return None

    def record(self, plan: Plan, k: Keys, noisy: Noisy, charge_seq: int, query: str) -> None:
        """Store a fresh release (after its charge); a key value that cannot be stored exactly
        leaves the release uncached, never wrong."""
        payload = _payload(k, noisy, charge_seq, query)
        if payload is None:
            return
        payload["totals"] = [list(t) for t in noisy.totals]
        if noisy.diagnosis is not None:
            payload["diagnosis"] = list(noisy.diagnosis)
        # Post-processing of the charged release: unsynced (a crash may lose it and the query
        # is then charged afresh; the charge itself was synced before the engine ran).
        self.store.append("release", payload, synced=False)

    def lookup_auto(self, k: Keys) -> tuple[Noisy, int, dict[str, object]] | None:
        """The release of a query whose bounds were chosen per query (``dpsql.plan.auto``),
        under its request's exact key, with the values it chose; nothing else serves it, and
        it serves nothing else."""
        with self._lock:
            self._refresh()
            found = self._exact.get(k.exact)
        if found is None or "chosen" not in found[1]:
            return None
        chosen: dict[str, object] = {}
        for name, value in found[1]["chosen"].items():
            chosen[name] = (
                (Fraction(value[0]), Fraction(value[1])) if isinstance(value, list) else int(value)
            )
        return stored_noisy(found[1]), found[0], chosen

    def record_auto(  # noqa: PLR0917
        self,
        k: Keys,
        noisy: Noisy,
        charge_seq: int,
        query: str,
        chosen: dict[str, object],
        bounded_sql: str,
    ) -> None:
        """Store a release whose bounds were chosen per query, with the chosen values: its core
        and rows keys are its own, so no other plan is derived from it (its rows are bounded by
        values another plan does not know)."""
        payload = _payload(k, noisy, charge_seq, query)
        if payload is None:
            return
        payload["core"] = payload["rows"] = "auto:" + k.exact
        payload["totals"] = [list(t) for t in noisy.totals]
        payload["bounded_sql"] = bounded_sql  # the answer's, at the chosen values
        payload["chosen"] = {
            name: [str(v[0]), str(v[1])] if isinstance(v, tuple) else v
            for name, v in chosen.items()
        }
        # Post-processing of the charged release: unsynced, like any release record.
        self.store.append("release", payload, synced=False)

    def record_member(  # noqa: PLR0917
        self, plan: Plan, k: Keys, noisy: Noisy, charge_seq: int, family_seq: int, query: str
    ) -> None:
        """Store a workload member's answer (``plan`` with its ``combined`` measurements, its
        unrounded totals) under its own query's key, so that asked again alone it is served
        the same answer, free; ``charge_seq``: the workload's charge, ``family_seq``: the
        family's ``family_release`` record."""
        payload = _payload(k, noisy, charge_seq, query)
        if payload is None:
            return
        payload["family_release"] = family_seq
        payload["totals"] = [[float(v) for v in t] for t in noisy.totals]
        payload["combined"] = [
            [[[str(a), str(t)] for a, t in sig] for sig in (m.combined or ())]
            for m in plan.measurements
        ]
        # Post-processing of the family's release: unsynced, like any release record.
        self.store.append("release", payload, synced=False)


def _payload(k: Keys, noisy: Noisy, charge_seq: int, query: str) -> dict[str, Any] | None:
    """A release record's fields but its totals; None when a key value cannot be stored."""
    try:
        groups = [[_plain(v) for v in column] for column in noisy.keys]
    except TypeError:
        return None
    return {
        "key": k.exact,
        "core": k.core,
        "rows": k.rows,
        "charge": charge_seq,
        "query": query,
        "measurements": list(k.measurements),
        "keys": groups,
    }
