"""A workload family's release in the ledger: its key, its record, and the later plans it answers.

A family's measurements, once released, are kept in the ledger (``family_payload``) under a key
of everything they measured (``family_key``); a later plan that is a linear function of them is
answered from the record by post-processing (``derive``), at no cost."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from dpsql.accounting.ledger.chain import Record
from dpsql.cache.keys import data_key
from dpsql.cache.stored_values import plain as _plain
from dpsql.cache.stored_values import typed as _typed
from dpsql.noise.measure import Noisy
from dpsql.plan.plans import Plan
from dpsql.plan.workload.family import (
    Family,
    base_digest,
    eligible,
    key_descriptor,
    positions_among,
    rows_text,
    same_rows,
    spec_text,
)
from dpsql.plan.workload.model import Kind, level_map, member_kinds
from dpsql.release.families import Noised, level_answers, member_answer

# -- released families: served again at no cost -------------------------------------------------
RECORD_KIND = "family_release"


def family_key(family: Family, dataset: str, policy_version: str, data_version: str) -> str:
    """What a family's release answers: the bounded query at the fine grouping (its tables,
    WHERE, bounds, grids and key domains), the measurements taken with their noise, the policy
    and the data version. Any later plan with the same key is answered by post-processing."""
    taken = [
        [t.spec, list(t.level), t.measurement.label, str(t.measurement.scale),
         str(t.measurement.sensitivity), t.dimensions]
        for t in family.taken
    ]  # fmt: skip
    data = data_key(data_version, family_blocks(family))
    body = [dataset, policy_version, data, family.fine.engine_sql, list(family.sizes),
            taken]  # fmt: skip
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def family_blocks(family: Family) -> list[tuple[str, tuple[str, ...]]]:
    """The blocks its members read (one WHERE, one table: the same ones; its fine plan is made
    apart from the session, and names none)."""
    return sorted({b for m in family.members for b in m.plan.blocks})


def released_family(records: Sequence[Record], key: str) -> Record | None:
    """The latest release of the family ``key``, if any."""
    for record in reversed(records):
        if record.kind == RECORD_KIND and record.payload.get("key") == key:
            return record
    return None


def family_payload(
    family: Family, key: str, charge: int, values: Sequence[Sequence[Any]], noised: Noised,
    *, where: str,
) -> dict[str, Any] | None:  # fmt: skip
    """The ledger record of a family's release (None when a key value cannot be stored
    exactly: the release is then not kept, never wrong); ``where``: its ``keys.scope``."""
    try:
        cells = [[_plain(v) for v in column] for column in values]
    except TypeError:
        return None
    measured = [[spec, list(level), list(totals)] for (spec, level), totals in noised.items()]
    return {"key": key, "charge": charge, "cells": cells, "measurements": measured,
            "derive": {**_description(family), "scope": where}}  # fmt: skip


def _description(family: Family) -> dict[str, Any]:
    """What a later statement's plan is matched against to be answered from the release
    (``derive``): public quantities of the family's plan only."""
    kinds = member_kinds(family.sizes, family.members)
    return {
        "base": base_digest(family.fine),
        "rows": rows_text(family.fine.bounding) if family.fine.bounding is not None else None,
        "keys": [key_descriptor(k) for k in family.fine.analysis.keys],
        "sizes": list(family.sizes),
        "specs": [spec_text(family.fine, m) for m in family.fine.measurements],
        "levels": {str(k.spec): [list(lv) for lv in k.levels] for k in kinds},
        "scales": [[t.spec, list(t.level), str(t.measurement.scale)] for t in family.taken],
    }


def derive(plan: Plan, payload: dict[str, Any], where: str) -> tuple[Plan, Noisy] | None:
    """``plan``'s answer from a family's release, when it is a linear function of the
    measurements released (None otherwise): the same rows before bounding, the same settings
    but epsilon, the same contribution bounds, its keys among the fine keys (an other group for
    each fine key it lacks), its own bounded rows the family's (``same_rows``), and each of its
    measurements a kind the family measured at a level holding its keys. Its cells are sums of
    the fine cells' least-squares values, and their noise the combination of the released
    noises: post-processing, so free. Only within the release's ``where`` (``keys.scope``):
    another data version or policy, other blocks read, another engine derive nothing (a release
    recorded before scopes were kept derives nothing either: charged afresh, never stale)."""
    info = payload.get("derive")
    if info is None or not eligible(plan) or info["base"] != base_digest(plan):
        return None
    if info.get("scope") != where:
        return None
    positions = positions_among(info["keys"], [key_descriptor(k) for k in plan.analysis.keys])
    # Only where the statement's own bounded rows are the family's: a count by month from
    # rows bounded per (region, month) cell is not the month's own bounded count. (A release
    # recorded without it, bounded at another member's grouping, derives nothing.)
    if positions is None or not same_rows(info.get("rows"), len(info["keys"]), plan, positions):
        return None
    level = tuple(sorted(positions))
    index = {text: j for j, text in enumerate(info["specs"])}
    found = [index.get(spec_text(plan, m)) for m in plan.measurements]
    specs = [s for s in found if s is not None]
    if len(specs) != len(found):
        return None
    sizes = tuple(int(n) for n in info["sizes"])
    kinds = []
    for spec in sorted(set(specs)):
        stored = [tuple(int(p) for p in lv) for lv in info["levels"].get(str(spec), [])]
        # Answerable from the kind's base cells: a level whose keys the base holds.
        if not stored or not set(level) <= set(stored[0]):
            return None
        levels = stored if level in stored else [*stored, level]
        maps = tuple(level_map(sizes, stored[0], lv) for lv in levels)
        kinds.append(Kind(spec, tuple(levels), maps, sizes))
    scales = {(int(spec), tuple(int(p) for p in lv)): Fraction(scale)
              for spec, lv, scale in info["scales"]}  # fmt: skip
    values, noised = from_payload(payload)
    answers = level_answers(sizes, kinds, scales, noised)
    return member_answer(plan, positions, specs, answers, values, sizes)


def from_payload(payload: dict[str, Any]) -> tuple[list[list[Any]], Noised]:
    values = [[_typed(v) for v in column] for column in payload["cells"]]
    noised = {
        (int(spec), tuple(int(p) for p in level)): [int(v) for v in totals]
        for spec, level, totals in payload["measurements"]
    }
    return values, noised
