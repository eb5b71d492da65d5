"""Answers derived from released measurements: post-processing, free (Dwork, Roth 2014, 2.1).

``derive_from_core`` answers a plan from one release of the same core: each measurement as it
was released, a centred sum rebuilt from a released SUM and COUNT of the same value
(AVG = SUM / COUNT), or a count, sum or centred sum of a value from its released Bernstein
vector (a VARIANCE's), with its noise as their combination. ``assemble`` answers it from every
fresh release of the same bounded rows whatever its epsilon: each measurement its least noisy
release or the inverse-variance combination of its releases, whichever has the narrower
half-width.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from dpsql.accounting.ledger.chain import canonical
from dpsql.cache.keys import Keys
from dpsql.cache.stored_values import typed as _typed
from dpsql.errors import ParameterError
from dpsql.noise.measure import Noisy
from dpsql.plan.aggregates.bernstein import forms
from dpsql.plan.estimators import combined_half_width
from dpsql.plan.plans import Plan

Terms = tuple[tuple[Fraction, Fraction], ...]  # (coefficient, discrete Laplace scale) pairs
Signatures = tuple[Terms, ...]


def derive_from_core(
    plan: Plan, k: Keys, payload: dict[str, Any]
) -> tuple[Noisy, tuple[Signatures | None, ...]] | None:
    """The plan's measurements from a release of the same core: each one found as it is, a
    centred sum rebuilt from a released SUM and COUNT of the same value (AVG = SUM / COUNT), or
    a count or sum from a released Bernstein vector (``_from_vector``), with its noise as their
    combination (None: served as released); an estimate over a rebuilt sum whose noises are not
    all discrete Laplace has no known half-width."""
    cached = [dict(m) for m in payload["measurements"]]
    stored = stored_noisy(payload)
    totals: list[tuple[int, ...]] = []
    signatures: list[Signatures | None] = []
    derived: set[int] = set()
    for j, want in enumerate(k.measurements):
        if want in cached:
            totals.append(stored.totals[cached.index(want)])
            signatures.append(None)
            continue
        rebuilt = _centred_from_sum(want, cached, stored.totals) or _from_vector(
            want, cached, stored.totals
        )
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


def _from_vector(
    want: dict[str, Any], cached: Sequence[dict[str, Any]], totals: Sequence[tuple[int, ...]]
) -> tuple[tuple[Any, ...], Signatures | None] | None:
    """COUNT(x), SUM(x) or x's centred sum from a released Bernstein vector of x (a VARIANCE or
    STDDEV under the Laplace, ``dpsql.plan.aggregates.bernstein``), post-processing: with x
    centred in ±w (units of g/2), N = (b0 + b1 + b2)/(4w²), the centred sum S = (b2 - b0)/(4w)
    and SUM = (S + M·N)/2 (units of g, M = lower + upper) are linear in the coordinates, and
    their noise the same combination of the coordinates' i.i.d. discrete Laplace noises.

    N's bounded total is the count's exactly (every cell's vector has L1 exactly 4w²·min(n, C):
    ``dpsql.bound.values.bernstein``); it is rounded to the nearest integer, which keeps its
    integer half-width valid (an integer within h + 1/2 of an integer is within h). S and SUM
    are released unrounded, as floats, and are the vector's own: where a unit's cell holds more
    than C rows, its scaled coordinates are rounded apart, so they may differ from a fresh SUM's
    bounded total by those roundings, and their half-width covers the noise around the
    vector's totals."""
    if want["kind"] not in ("count", "centred", "sum") or want["value"] is None:
        return None
    found = [
        (int(m["part"]), i)
        for i, m in enumerate(cached)
        if m["kind"] == "bernstein"
        and m["value"] == want["value"]
        and m["groups"] == want["groups"]
        and (want["kind"] == "count" or m["grid"] == want["grid"])
    ]
    parts = dict(found)
    if len(found) != 3 or sorted(parts) != [0, 1, 2]:
        return None  # no vector of the value, or several (a release holds one per value)
    _, lower, upper = cached[parts[0]]["grid"]
    centred, count = forms(int(upper) - int(lower))
    if want["kind"] == "count":
        coefficients = count
    elif want["kind"] == "centred":
        coefficients = centred
    else:
        centre = int(lower) + int(upper)
        coefficients = tuple((s + centre * n) / 2 for s, n in zip(centred, count, strict=True))
    columns = [totals[parts[p]] for p in (0, 1, 2)]
    if not all(type(v) is int for column in columns for v in column):
        return None  # not a fresh release's exact noisy integers
    values: tuple[Any, ...] = tuple(
        sum((a * v for a, v in zip(coefficients, cell, strict=True)), Fraction(0))
        for cell in zip(*columns, strict=True)
    )
    # A count as an integer; a sum unrounded, as a float (as a workload's least squares are:
    # released as DOUBLE, where a fresh sum of an integer grid is an integer).
    values = tuple(round(v) if want["kind"] == "count" else float(v) for v in values)
    scales = {cached[i]["scale"] for i in parts.values()}
    if None in scales or len(scales) != 1:
        return values, None
    (scale,) = scales
    terms = tuple(sorted((a, Fraction(scale)) for a in coefficients if a != 0))
    return values, (terms,)


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


def assemble(
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
        stored = stored_noisy(payload)
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


def stored_signatures(stored: Sequence[Any]) -> tuple[Signatures, ...]:
    return tuple(
        tuple(tuple((Fraction(a), Fraction(t)) for a, t in sig) for sig in m) for m in stored
    )


def _totals(column: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(v if isinstance(v, float) else int(v) for v in column)


def stored_noisy(payload: dict[str, Any]) -> Noisy:
    # A family's answers are unrounded: kept as the floats that were released.
    return Noisy(
        tuple(tuple(_typed(v) for v in column) for column in payload["keys"]),
        tuple(_totals(column) for column in payload["totals"]),
        diagnosis=tuple(int(v) for v in payload["diagnosis"]) if "diagnosis" in payload else None,
    )
