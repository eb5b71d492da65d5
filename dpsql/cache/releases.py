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
(``dpsql.release.families.derive``: the same rows, settings and bounds, keys among its fine keys).
Every fresh release of the same bounded-row definition (``Keys.rows``: the core without the
privacy parameters, with the engine) answers a plan whose measurements they all hold, at any
epsilon, each the least noisy release or their inverse-variance combination (``_assemble``).
Releases are shared by every analyst of the data set: a released answer is public to whoever
may query it.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

from dpsql.accounting.ledger.chain import canonical
from dpsql.accounting.ledger.store import Store
from dpsql.cache.families import RECORD_KIND, derive
from dpsql.cache.stored_values import plain as _plain
from dpsql.cache.stored_values import typed as _typed
from dpsql.errors import ParameterError
from dpsql.noise.measure import Noisy
from dpsql.plan.estimators import combined_half_width
from dpsql.plan.plans import Measurement, Plan
from dpsql.plan.workload.family import base_digest, eligible
from dpsql.policy import Policy
from dpsql.sql.canonical import canonical_sql
from dpsql.sql.parse import DIALECT


@dataclass(frozen=True)
class Keys:
    """The two keys of a plan: its exact measurement set, and its measurement core."""

    exact: str
    core: str
    measurements: tuple[dict[str, Any], ...]
    # The core without the privacy parameters, with the engine: the bounded-row definition.
    # Releases of one such key measured the same rows (``_assemble``).
    rows: str = ""


def _digest(data: Any) -> str:
    return hashlib.sha256(canonical(data).encode()).hexdigest()


def _values(plan: Plan) -> dict[int, tuple[str, list[Any] | None]]:
    """Each measured value's canonical SQL and grid (None when it is only counted)."""
    out: dict[int, tuple[str, list[Any] | None]] = {}
    for agg, est in zip(plan.analysis.aggregates, plan.estimates, strict=True):
        index = plan.measurements[est.measurements[0]].spec.value
        if agg.arg is None or index is None:
            continue
        grid = [str(est.grid.step), est.grid.lower, est.grid.upper] if est.grid else None
        known = out.get(index)
        out[index] = (canonical_sql(agg.arg), grid or (known[1] if known else None))
    return out


def describe(m: Measurement, values: dict[int, tuple[str, list[Any] | None]]) -> dict[str, Any]:
    """A measurement's identity: what is measured, on which grid, with which noise."""
    value, grid = (
        values.get(m.spec.value, (None, None)) if m.spec.value is not None else (None, None)
    )
    return {
        "kind": m.spec.kind,
        "p": str(m.spec.p) if m.spec.p is not None else None,  # MIN and MAX differ only here
        "value": value,
        "grid": grid,
        "groups": m.groups,
        "per_group": m.per_group,
        "scale": str(m.scale) if m.scale is not None else None,
        "sigma2": str(m.sigma2) if m.sigma2 is not None else None,
    }


def keys(plan: Plan, policy: Policy, version: str | None = None) -> Keys:
    """The cache keys of a plan (a pure function of public inputs); ``version``: the policy's
    ``version``, when the caller has it (it hashes the whole policy)."""
    a, o = plan.analysis, plan.options
    core: dict[str, Any] = {
        "dataset": policy.dataset.id,
        "policy": version if version is not None else policy.version,
        "data": policy.dataset.data_version,
        "table": a.table,
        # The relation the rows come from (a join or subquery is part of what was measured).
        "source": a.source,
        "row_cap": o.max_rows_per_unit,
        "where": canonical_sql(a.where),
        "keys": [
            [k.expr.sql(dialect=DIALECT), list(map(str, k.domain or ())), k.domain_table]
            # The other group is one more released group, under its own key.
            + ([["other", k.other_text]] if k.other else [])
            for k in a.keys
        ],
        "l0": plan.max_groups,
        "c": plan.max_rows,
        "cell": [a.cell.column, a.cell.key] if a.cell is not None else None,
        "params": [str(o.epsilon), str(o.delta), o.mechanism, str(o.rho), str(o.sigma)],
        "selection": plan.selection.threshold if plan.selection is not None else None,
        # A release on a sample answers only a query on a sample at the same rate.
        "sample": str(plan.sample.rate) if plan.sample is not None else None,
    }
    if plan.diagnosis is not None:
        # A diagnosed release holds its histogram: only a release of the same diagnosis serves
        # a diagnosed query, and an undiagnosed one is keyed apart (charged afresh: safe).
        d = plan.diagnosis
        core["diagnosis"] = [list(d.flags), [list(x) for x in d.limits],
                             describe(d.measurement, {})]  # fmt: skip
    values = _values(plan)
    measurements = tuple(describe(m, values) for m in plan.measurements)
    # Which rows are kept is a function of everything in the core but the privacy parameters,
    # and of the engine's keyed hash (one per engine, docs/engines.md): a release at another
    # epsilon measured the same rows, so combining the two is post-processing (Dwork-Roth 2.1).
    rows = {**{k: v for k, v in core.items() if k != "params"}, "engine": policy.engine.name}
    return Keys(_digest([core, list(measurements)]), _digest(core), measurements, _digest(rows))


Terms = tuple[tuple[Fraction, Fraction], ...]  # (coefficient, discrete Laplace scale) pairs
Signatures = tuple[Terms, ...]


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
    # ``dpsql.release.families.derive``: a level or an aggregate no member of the file asked for).
    source: Literal["release", "member", "family", "releases"] = "release"
    # Computed from released measurements other than its own (an AVG from a SUM and a COUNT).
    derived: bool = False
    # With source "releases" (``_assemble``): every release whose measurements it combines.
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
        # Fresh releases by their bounded-row definition (``Keys.rows``, ``_assemble``).
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
                    signatures = _signatures(found[1]["combined"])
                    return Hit(_noisy(found[1]), found[0], tuple(signatures), "member")
                found = None
            if found is not None:
                return Hit(_noisy(found[1]), found[0])
            for seq, payload in reversed(self._cores.get(k.core, [])):
                derived = _derive(plan, k, payload)
                if derived is not None:
                    noisy, rebuilt = derived
                    known = rebuilt if any(s is not None for s in rebuilt) else None
                    return Hit(noisy, seq, known, derived=known is not None or bool(noisy.derived))
            if shared and self._families and eligible(plan):
                for seq, payload in reversed(self._families.get(base_digest(plan), [])):
                    got = derive(plan, payload)
                    if got is not None:
                        answered, noisy = got
                        combined = tuple(m.combined for m in answered.measurements)
                        return Hit(noisy, seq, combined, "family", derived=True)
            if k.rows in self._rows and eligible(plan):
                assembled = _assemble(k, self._rows[k.rows], plan.options.confidence)
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


def _signatures(stored: Sequence[Any]) -> tuple[Signatures, ...]:
    return tuple(
        tuple(tuple((Fraction(a), Fraction(t)) for a, t in sig) for sig in m) for m in stored
    )


def _totals(column: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(v if isinstance(v, float) else int(v) for v in column)


def _noisy(payload: dict[str, Any]) -> Noisy:
    # A family's answers are unrounded: kept as the floats that were released.
    return Noisy(
        tuple(tuple(_typed(v) for v in column) for column in payload["keys"]),
        tuple(_totals(column) for column in payload["totals"]),
        diagnosis=tuple(int(v) for v in payload["diagnosis"]) if "diagnosis" in payload else None,
    )


def _derive(
    plan: Plan, k: Keys, payload: dict[str, Any]
) -> tuple[Noisy, tuple[Signatures | None, ...]] | None:
    """The plan's measurements from a release of the same core: each one found as it is, or a
    centred sum rebuilt from a released SUM and COUNT of the same value (AVG = SUM / COUNT),
    with its noise as their combination (None: served as released); an estimate over a
    rebuilt sum whose noises are not all discrete Laplace has no known half-width."""
    cached = [dict(m) for m in payload["measurements"]]
    stored = _noisy(payload)
    totals: list[tuple[int, ...]] = []
    signatures: list[Signatures | None] = []
    derived: set[int] = set()
    for j, want in enumerate(k.measurements):
        if want in cached:
            totals.append(stored.totals[cached.index(want)])
            signatures.append(None)
            continue
        rebuilt = _centred_from_sum(want, cached, stored.totals)
        if rebuilt is None:
            return None
        totals.append(rebuilt[0])
        signatures.append(rebuilt[1])
        if rebuilt[1] is None:
            derived |= {i for i, e in enumerate(plan.estimates) if j in e.measurements}
    noisy = Noisy(stored.keys, tuple(totals), frozenset(derived), stored.diagnosis)
    return noisy, tuple(signatures)


def _centred_from_sum(
    want: dict[str, Any], cached: Sequence[dict[str, Any]], totals: Sequence[tuple[int, ...]]
) -> tuple[tuple[int, ...], Signatures | None] | None:
    if want["kind"] != "centred" or want["grid"] is None:
        return None
    same = [
        i for i, m in enumerate(cached) if m["value"] == want["value"] and m["grid"] == want["grid"]
    ]
    sums = [i for i in same if cached[i]["kind"] == "sum"]
    counts = [i for i in same if cached[i]["kind"] == "count"]
    if not sums or not counts:
        return None
    # Its noise is 2·Z_sum - M·Z_count, two independent discrete Laplace noises (a Gaussian's
    # combination is not bounded here: its half-width stays unknown).
    scales = (cached[sums[0]]["scale"], cached[counts[0]]["scale"])
    values, terms = _centred(
        want,
        (totals[sums[0]], None if scales[0] is None else ((Fraction(1), Fraction(scales[0])),)),
        (totals[counts[0]], None if scales[1] is None else ((Fraction(1), Fraction(scales[1])),)),
    )
    return values, None if terms is None else (terms,)


def _centred(
    want: dict[str, Any],
    sums: tuple[tuple[Any, ...], Terms | None],
    counts: tuple[tuple[Any, ...], Terms | None],
) -> tuple[tuple[Any, ...], Terms | None]:
    """Σ(2x - M) = 2·SUM - M·COUNT on the noisy values (post-processing), M = lower + upper of
    the grid in units of g/2; its noise 2·Z_sum - M·Z_count over the two parts' independent
    noise terms (None when a part's are not known)."""
    centre = int(want["grid"][1]) + int(want["grid"][2])
    values = tuple(2 * s - n * centre for s, n in zip(sums[0], counts[0], strict=True))
    if sums[1] is None or counts[1] is None:
        return values, None
    terms = [(2 * a, b) for a, b in sums[1]] + [(-centre * a, b) for a, b in counts[1]]
    return values, tuple(sorted(t for t in terms if t[0] != 0))


def _cells(columns: Sequence[Sequence[Any]]) -> dict[str, int]:
    """Each released group's position, by its key values' canonical JSON."""
    rows = list(zip(*columns, strict=True)) if columns else [()]
    return {canonical(list(row)): i for i, row in enumerate(rows)}


def _count(columns: Sequence[Sequence[Any]]) -> int:
    """How many groups were released (one without GROUP BY)."""
    return len(columns[0]) if columns else 1


def _what(m: dict[str, Any]) -> str:
    """What a released measurement measured, apart from its noise (kind, value, grid, groups).
    A count of a value does not depend on its grid (the bounded SQL counts the value's non-NULL,
    non-NaN rows either way: ``dpsql.bound.rewrite``), so COUNT(x) and AVG(x)'s count are one."""
    drop = ("scale", "sigma2", "grid") if m["kind"] in ("count", "rows") else ("scale", "sigma2")
    return canonical({k: v for k, v in m.items() if k not in drop})


Entry = tuple[int, tuple[Any, ...], Fraction]  # a release's seq, its noisy totals, its scale


def _assemble(
    k: Keys, releases: Sequence[tuple[int, dict[str, Any]]], confidence: float
) -> tuple[Noisy, tuple[Signatures, ...], tuple[int, ...]] | None:
    """The plan's measurements from every fresh release of the same bounded rows (``k.rows``:
    same table, WHERE, keys and domains, bounds, policy, data version and engine) whatever its
    epsilon: each one its least noisy release or the inverse-variance combination of its
    releases (``_best``), or a centred sum rebuilt from a SUM and a COUNT so found; None unless
    every one is found. Only discrete Laplace measurements take part (their noises'
    combination has a sound half-width), and only releases of the same released groups (public
    domains: all of them)."""
    reference = releases[-1][1]["keys"]
    # A released group is a row of its key columns (as stored: JSON-typed, so 1 and '1' differ);
    # each release's totals are read in the reference's order (the engine's order may differ).
    cells = _cells(reference)
    if len(cells) != _count(reference):
        return None  # a group released twice (not with public domains): nothing is derived
    pool: dict[str, tuple[dict[str, Any], list[Entry]]] = {}
    for seq, payload in releases:
        order = _cells(payload["keys"])
        if order.keys() != cells.keys() or len(order) != _count(payload["keys"]):
            continue
        at = [order[cell] for cell in cells]
        stored = _noisy(payload)
        for m, column in zip(payload["measurements"], stored.totals, strict=True):
            if m["scale"] is not None:
                aligned = tuple(column[i] for i in at)
                pool.setdefault(_what(m), (m, []))[1].append((seq, aligned, Fraction(m["scale"])))
    if not pool:
        return None
    totals: list[tuple[Any, ...]] = []
    signatures: list[Signatures] = []
    used: set[int] = set()
    for want in k.measurements:
        found = pool.get(_what(want))
        if found is not None:
            values, terms, seqs = _best(found[1], confidence)
        else:
            rebuilt = _centred_from_pool(want, list(pool.values()), confidence)
            if rebuilt is None:
                return None
            values, terms, seqs = rebuilt
        used |= seqs
        totals.append(values)
        signatures.append((terms,))
    keys = tuple(tuple(_typed(v) for v in column) for column in reference)
    return Noisy(keys, tuple(totals)), tuple(signatures), tuple(sorted(used))


def _best(entries: Sequence[Entry], confidence: float) -> tuple[tuple[Any, ...], Terms, set[int]]:
    """The narrower, at ``confidence``, of the inverse-variance combination of ``entries`` and
    their least noisy one alone (the combination has the lower variance, but its half-width is
    a tail bound, wider than a single noise's exact quantile): chosen from scales alone."""
    single = min(entries, key=lambda e: (e[2], e[0]))
    alone = ((Fraction(1), single[2]),)
    if len(entries) > 1:
        values, terms = _inverse_variance(entries)
        try:
            single_width = combined_half_width(alone, confidence)
            narrower = combined_half_width(terms, confidence) < single_width
        except ParameterError:  # no finite bound on the combination (scales only): the one
            narrower = False
        if narrower:
            return values, terms, {seq for seq, _, _ in entries}
    return single[1], alone, {single[0]}


def _inverse_variance(
    entries: Sequence[Entry],
) -> tuple[tuple[Any, ...], Terms]:
    """Independent noisy releases of one quantity combined with weights w_i = b_i^-2 / sum_j
    b_j^-2 (exact rationals summing to 1, so the combination is unbiased: any weights would be;
    b^-2 is the inverse of the Laplace variance 2b^2 up to a constant, so these are the
    minimum-variance ones up to the discrete distribution's small difference), and its noise
    as the terms (w_i, b_i): independent draws, one per release."""
    if len(entries) == 1:
        _, values, scale = entries[0]
        return values, ((Fraction(1), scale),)
    inverse = [1 / (scale * scale) for _, _, scale in entries]
    total = sum(inverse, Fraction(0))
    weights = [w / total for w in inverse]
    cells = zip(*(values for _, values, _ in entries), strict=True)
    combined = tuple(float(sum((w * Fraction(v) for w, v in zip(weights, cell, strict=True)),
                               Fraction(0))) for cell in cells)  # fmt: skip
    terms = tuple(sorted(zip(weights, (scale for _, _, scale in entries), strict=True)))
    return combined, terms


def _centred_from_pool(
    want: dict[str, Any], pool: Sequence[tuple[dict[str, Any], list[Entry]]], confidence: float
) -> tuple[tuple[Any, ...], Terms, set[int]] | None:
    """A centred sum Σ(2x - M) = 2·SUM - M·COUNT from the pool's SUM and COUNT of the same value
    and grid (each combined over its releases); its noise 2·Z_sum - M·Z_count, whose terms are
    independent draws (two measurements, or two releases)."""
    if want["kind"] != "centred" or want["grid"] is None:
        return None
    parts = {}
    for kind in ("sum", "count"):
        match = [entries for m, entries in pool if m["kind"] == kind and m["value"] == want["value"]
                 and (kind == "count" or m["grid"] == want["grid"])]  # fmt: skip
        if not match:
            return None
        parts[kind] = match[0]
    sums, sum_terms, sum_seqs = _best(parts["sum"], confidence)
    counts, count_terms, count_seqs = _best(parts["count"], confidence)
    values, terms = _centred(want, (sums, sum_terms), (counts, count_terms))
    assert terms is not None  # the pool holds discrete Laplace measurements only
    return values, terms, sum_seqs | count_seqs
