"""The keys of a plan's release: what it measured, exactly, and the rows it measured.

``keys`` is a pure function of public inputs: the data set, the policy's version and the data
version the owner declares (never a fingerprint of the data: whether a query is charged must
not reveal that the data changed), the table, the canonical WHERE, the group keys and their
domains, the contribution bounds, a pinned cell, the privacy parameters, and every measurement
with its grid and its noise. ``Keys.exact`` names one release, ``Keys.core`` the releases of
the same measurement core at the same privacy parameters, ``Keys.rows`` every release of the
same bounded rows whatever its epsilon (``dpsql.cache.derive``)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dpsql.accounting.ledger.chain import canonical
from dpsql.plan.aggregates.pairs import paired
from dpsql.plan.plans import Measurement, Plan
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
    # Releases of one such key measured the same rows (``dpsql.cache.derive.assemble``).
    rows: str = ""
    # Where any release of it may answer it: the data set, the policy's version, the data read
    # and the engine (``scope``). A workload family's release derives answers only within it.
    scope: str = ""


def _digest(data: Any) -> str:
    return hashlib.sha256(canonical(data).encode()).hexdigest()


def _values(plan: Plan) -> dict[int, tuple[str, list[Any] | None]]:
    """Each measured value's canonical SQL and grid (None when it is only counted)."""
    out: dict[int, tuple[str, list[Any] | None]] = {}
    for agg, est in zip(plan.analysis.aggregates, plan.estimates, strict=True):
        spec = plan.measurements[est.measurements[0]].spec
        index = spec.value
        if agg.arg2 is not None and est.grid2 is not None and spec.other is not None:
            # F(y, x) reads x and y on the pairs' rows only: values of their own, not x's or
            # y's (a VARIANCE(x) must never be served a measurement of the pairs).
            assert agg.arg is not None and est.grid is not None and index is not None
            for i, value, on in ((index, paired(agg.arg, agg.arg2), est.grid),
                                 (spec.other, paired(agg.arg2, agg.arg), est.grid2)):  # fmt: skip
                out[i] = (canonical_sql(value), [str(on.step), on.lower, on.upper])
            continue
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
    out = {
        "kind": m.spec.kind,
        "p": str(m.spec.p) if m.spec.p is not None else None,  # MIN and MAX differ only here
        "value": value,
        "grid": grid,
        "groups": m.groups,
        "per_group": m.per_group,
        "scale": str(m.scale) if m.scale is not None else None,
        "sigma2": str(m.sigma2) if m.sigma2 is not None else None,
    }
    if m.spec.part is not None:
        out["part"] = m.spec.part  # a Bernstein coordinate (noised with the other two)
    if m.spec.other is not None:
        # A sum of products: its second value, on its grid.
        out["other"] = list(values.get(m.spec.other, (None, None)))
    if m.spec.side:
        # A quantile interval's end: which, and the coverage it was drawn for (a release's
        # interval is fixed when drawn; another confidence is another measurement).
        out["side"] = m.spec.side
        out["confidence"] = repr(m.spec.confidence)
    return out


def scope(dataset: str, policy_version: str, data: object, engine: str) -> str:
    """The digest of what every answer derived from a release must share with it: the data set,
    the policy's version (which holds the declared data version), what was read of the data
    (``data_key``) and the engine (its keyed hash keeps the rows)."""
    return _digest([dataset, policy_version, data, engine])


def data_key(data_version: str, blocks: Sequence[tuple[str, Sequence[str]]]) -> str | list[object]:
    """What a release read of the data: the declared data version, and the blocks it read of
    each table made of blocks (``dpsql.session.blocks``). Appending a block leaves the key of a
    query that does not read it as it was (served free, as before); a replaced block is read by
    no later plan, so a release of it is never served again. Without blocks, the data version
    alone (the keys of every other table are unchanged)."""
    if not blocks:
        return data_version
    return [data_version, [[t, list(ids)] for t, ids in sorted(blocks)]]


def keys(plan: Plan, policy: Policy, version: str | None = None) -> Keys:
    """The cache keys of a plan (a pure function of public inputs); ``version``: the policy's
    ``version``, when the caller has it (it hashes the whole policy)."""
    a, o = plan.analysis, plan.options
    core: dict[str, Any] = {
        "dataset": policy.dataset.id,
        "policy": version if version is not None else policy.version,
        "data": data_key(policy.dataset.data_version, plan.blocks),
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
    if plan.auto is not None:
        # Bounds chosen per query: the release answers the request (auto, its share and
        # walks), never the values chosen, which its record keeps (``record_auto``).
        au = plan.auto
        core["auto"] = [str(au.share), str(au.epsilon), [c.bound for c in au.choices],
                        [f"{c.table}.{c.column}" for c in au.choices if c.column]]  # fmt: skip
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
    # A diagnosis is one more histogram beside the measurements, not another way of keeping
    # rows: a diagnosed release's measurements join the others of its rows.
    kept = {k: v for k, v in core.items() if k not in ("params", "diagnosis")}
    rows = {**kept, "engine": policy.engine.name}
    where = scope(policy.dataset.id, core["policy"], core["data"], policy.engine.name)
    return Keys(_digest([core, list(measurements)]), _digest(core), measurements, _digest(rows),
                where)  # fmt: skip
