"""Bounds estimated from the data, in a session: ``ESTIMATE BOUNDS`` and the policy they fill.

An estimate is one sparse-vector release over one value per unit (``dpsql.release.clamp_bounds`` for
a column's clamps, ``dpsql.release.contribution_bounds`` for a table's L0, C and R): refused on
public facts only, charged as one ``PureDP`` event before the engine runs, then recorded in the
ledger. The record is the release: the same statement at the same epsilon, policy and data version
is served from it again at no cost, and ``Estimates.policy`` fills the bounds in for later queries
wherever the policy declares none. ``Estimates`` is a part of ``dpsql.session.session.Session``;
an ``Estimate`` is released through its pipeline like a query.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from sqlglot import exp

from dpsql.accounting.budget.report import Charge
from dpsql.accounting.ledger.chain import Record
from dpsql.accounting.ledger.store import Store
from dpsql.cache.keys import data_key
from dpsql.engine.base import Engine
from dpsql.errors import BoundsError, UndeclaredMechanismError
from dpsql.mechanisms.events import Composite
from dpsql.mechanisms.laplace import MAX_SCALE
from dpsql.mechanisms.stated_events import PureDP
from dpsql.plan.auto import noise_per_unit
from dpsql.plan.plans import Plan
from dpsql.policy import ColumnSpec, Policy
from dpsql.policy.blocks import BlockList
from dpsql.policy.numbers import decimal_text
from dpsql.release import clamp_bounds, contribution_bounds
from dpsql.release.diagnosis import BOUND_OF_FLAG
from dpsql.release.result import Result
from dpsql.session.effective import Settings
from dpsql.session.pipeline import Pipeline, Request
from dpsql.sql.parse import EstimateBounds


@dataclass(frozen=True)
class Estimate(Request[dict[str, object], Result]):
    """One ``ESTIMATE BOUNDS`` statement, planned on public facts: its query, its one
    ``PureDP`` event, its ledger key, and the estimate released before under that key."""

    statement: EstimateBounds
    kind: str  # the ledger record that keeps the estimate (post-processing, never charged)
    key: Mapping[str, object]
    sql: str
    query: str
    event: Composite
    epsilon: Fraction
    details: Mapping[str, object]
    found: Record | None  # a released estimate of the same key (None: fresh, or none yet)
    rule: contribution_bounds.Rule | None = None  # contribution bounds: how they are set
    confidence: float = 0.95  # of the note's "at most" (post-processing: no cost)

    def lookup(self, pipeline: Pipeline) -> Result | None:
        if self.found is None:
            return None
        # Serving a released estimate again is post-processing: recorded, never charged.
        seq = self.found.payload["charge"]
        pipeline.reserve(self.query, seq)
        return _estimate_result(self.found.payload, None, int(seq), self.cuts(self.found.payload))

    def measure(self, engine: Engine) -> dict[str, object]:
        _, rows = engine.run(self.sql)
        if self.statement.column is not None:
            lower, upper = clamp_bounds.release(self.epsilon, rows, self.statement.target)
            return {"lower": str(lower), "upper": str(upper)}
        keys = self.statement.keys
        values = contribution_bounds.release(self.epsilon, keys, rows, self.rule)
        return dict(zip(contribution_bounds.bounds_of(keys), values, strict=True))

    def record(self, pipeline: Pipeline, charge: Charge, measured: dict[str, object]) -> None:
        # Post-processing of the release just charged: recorded, never charged again.
        payload = {**self.key, "charge": charge.seq, **measured}
        pipeline.budget.store.append(self.kind, payload, pipeline.analyst)

    def publish(self, pipeline: Pipeline, charge: Charge, measured: dict[str, object]) -> Result:
        payload = {**self.key, "charge": charge.seq, **measured}
        return _estimate_result(payload, charge, None, self.cuts(payload))

    def cuts(self, payload: Mapping[str, Any]) -> str:
        """What each bound is expected to cut (post-processing of the released values)."""
        if self.rule is None:
            target = self.statement.target
            if target is None:
                k = Fraction(clamp_bounds.units_beyond(self.epsilon))
            else:
                k = noise_per_unit([target])
            most = int(k) + clamp_bounds.uncertainty(self.epsilon, self.confidence)
            return (f"lower and upper aimed at about {float(k):.3g} units with a value beyond "
                    f"each (their values are clamped to it); at {self.confidence:.4g} "
                    f"confidence at most {most} beyond each")  # fmt: skip
        keys = self.statement.keys
        values = [int(payload[n]) for n in contribution_bounds.bounds_of(keys)]
        return contribution_bounds.cuts(keys, values, self.rule, self.epsilon, self.confidence)


def _version(data: object) -> object:
    """The data version of an estimate's key: the key itself, or its first part when the
    estimate read blocks (``dpsql.cache.keys.data_key``): an estimate stays in use after more
    blocks come (a released value: using it is post-processing)."""
    return data[0] if isinstance(data, list) and data else data


class Estimates:
    """Bounds estimated from the data: a part of ``Session``. It plans an ``ESTIMATE BOUNDS``
    on public facts (``plan``), and keeps the policy with the estimates released so far filled
    in where the policy declares none (``policy``)."""

    def __init__(self, policy: Policy, store: Store, engine: Engine) -> None:
        self.base = policy
        self.store = store
        self.engine = engine
        self._version: tuple[Policy, str] | None = None
        self.estimated: dict[tuple[str, str], tuple[Fraction, Fraction]] = {}
        self._seen = 0
        self._with_estimates: Policy | None = None
        # The blocks the engine binds, by table made of blocks (the session's): an estimate is
        # keyed by those it reads, and used by later plans whatever blocks came since.
        self.blocks: BlockList = BlockList()

    def plan(self, statement: EstimateBounds, settings: Settings) -> Estimate:
        """The estimate's plan: refused on public facts only, its SQL bound by the engine on
        the schema alone (a query that cannot run costs nothing)."""
        epsilon, policy = settings.epsilon, self.base
        if policy.budget.declared_mechanism is not None:
            raise UndeclaredMechanismError(
                "ESTIMATE BOUNDS is a sparse vector release, and the pld filter admits only its "
                "declared mechanism: declare the bounds in the policy instead"
            )
        table = statement.table.lower()
        what: dict[str, object]
        rule = None
        if statement.column is not None:
            column = statement.column.lower()
            kind, what = clamp_bounds.RECORD_KIND, {"column": column}
            sql = clamp_bounds.bounds_query(policy, self.engine.catalog, table, column)
            label = clamp_bounds.walks(epsilon).describe()
            # None matches the records of the default rule (written before targets existed).
            what["target"] = None if statement.target is None else str(statement.target)
        else:
            rule = _rule(statement, settings)
            kind, what = contribution_bounds.RECORD_KIND, {"keys": list(statement.keys)}
            what["rule"] = rule.text()
            cells = None
            if rule.quantile is None and statement.keys:
                # Keys of a small public domain: auto's route, L0 every combination and C
                # by the weighted cell walk (dpsql.release.contribution_bounds).
                cells = contribution_bounds.cells_query(
                    policy, self.engine.catalog, self.engine.describe, table, statement.keys
                )
            if cells is not None:
                rule = replace(rule, groups=cells[0])
                sql = cells[1]
            else:
                sql = contribution_bounds.bounds_query(
                    policy, self.engine.catalog, table, statement.keys
                )
            label = contribution_bounds.describe(epsilon, statement.keys, rule)
            if rule.quantile is not None:
                label = "count of units and " + label
        # Every noise the release draws, checked before the charge: at a tiny epsilon a scale
        # past what the exact sampler draws would fail after it (the charge would stand).
        scales = (clamp_bounds.scales(epsilon) if statement.column is not None
                  else contribution_bounds.scales(epsilon, statement.keys, rule))  # fmt: skip
        if any(scale > MAX_SCALE for scale in scales):
            raise BoundsError(
                "the noise of ESTIMATE BOUNDS would be too large to sample exactly at this "
                "epsilon; raise dpsql.epsilon"
            )
        # Binds on the schema alone, before the charge: a query that cannot run costs nothing.
        self.engine.check(sql, types=False)
        read = ((table, tuple(b.id for b in self.blocks.active(table))),) if (
            table in policy.data.blocks) else ()  # fmt: skip
        key = {"table": table, **what, "epsilon": str(epsilon), "policy": self.version(),
               "data": data_key(policy.dataset.data_version, read)}  # fmt: skip
        details = {"bounded_sql": sql, "engine": self.engine.name,
                   "policy_version": self.version(),
                   "data_version": policy.dataset.data_version,
                   **({"blocks": {t: list(ids) for t, ids in read}} if read else {})}  # fmt: skip
        found = None if settings.fresh else self._released(kind, key)
        event = Composite((PureDP(epsilon, "ESTIMATE BOUNDS: " + label),))
        return Estimate(statement, kind, key, sql, _canonical(statement, epsilon), event,
                        epsilon, details, found, rule, float(settings.confidence))  # fmt: skip

    def chose(self, plan: Plan, asked: frozenset[str]) -> bool:
        """Whether every bound the plan's diagnosis flags is one dpsql chose: each contribution
        bound an estimate where the policy declares none and no setting gave one, and each
        aggregated column's clamp an estimate. Such a query needs no diagnosis by default: the
        estimates already aim at cutting few units (``docs/sql.md``)."""
        if plan.diagnosis is None or plan.bounding is None or not self.estimated:
            return False
        a, base = plan.analysis, self.base
        tables = [t.lower() for t in a.tables if not base.tables[t.lower()].public]
        for flag in plan.diagnosis.flags:
            if flag == "clamped":
                columns = {
                    c.name.lower()
                    for v in plan.bounding.values
                    if v.grid is not None
                    for c in v.expr.find_all(exp.Column)
                }
                if not all(self._estimated_clamp(tables, c) for c in columns):
                    return False
                continue
            name = BOUND_OF_FLAG[flag]
            if name in asked or not all(
                getattr(base.tables[t], name) is None
                and (t, _CONTRIBUTION + name) in self.estimated
                for t in tables
            ):
                return False
        return True

    def _estimated_clamp(self, tables: list[str], column: str) -> bool:
        """A column's bounds come from an estimate, not from the policy, in its table."""
        for t in tables:
            declared = self.base.tables[t].columns.get(column)
            if (t, column) in self.estimated and (declared is None or declared.bounds is None):
                return True
        return False

    def version(self) -> str:
        """The base policy's content digest, computed once per policy object (a Policy is
        frozen). Kept here, not read through the session: a part holding its session would be a
        reference cycle that keeps the engine's file open until the garbage collector runs."""
        if self._version is None or self._version[0] is not self.base:
            self._version = (self.base, self.base.version)
        return self._version[1]

    def _released(self, kind: str, key: Mapping[str, object]) -> Record | None:
        """The latest estimate of the same statement, epsilon, policy and data version."""
        for record in reversed(self.store.records()):
            if record.kind == kind and all(record.payload.get(k) == v for k, v in key.items()):
                return record
        return None

    def policy(self) -> Policy:
        """The policy with the bounds estimated so far (same policy and data version) filled in
        where it declares none: clamps for columns, contribution bounds for tables; declared
        bounds always win."""
        records = self.store.records_since(self._seen)
        for record in records:
            p = record.payload
            if (
                record.kind in (clamp_bounds.RECORD_KIND, contribution_bounds.RECORD_KIND)
                and p.get("policy") == self.version()
                and _version(p.get("data")) == self.base.dataset.data_version
            ):
                self._with_estimates = None
                if record.kind == clamp_bounds.RECORD_KIND:
                    key = (str(p["table"]), str(p["column"]))
                    self.estimated[key] = (Fraction(str(p["lower"])), Fraction(str(p["upper"])))
                    continue
                for name in contribution_bounds.bounds_of(p.get("keys") or ()):
                    value = Fraction(int(p[name]))
                    self.estimated[(str(p["table"]), _CONTRIBUTION + name)] = (value, value)
        self._seen += len(records)
        return self.known()

    def known(self) -> Policy:
        """``policy`` with the estimates read so far, without reading the ledger again: what a
        plan made since the last read was made with."""
        if not self.estimated:
            return self.base
        if self._with_estimates is None:
            self._with_estimates = _with_estimates(self.base, self.estimated)
        return self._with_estimates


# Keys of contribution bounds among the estimates, beside (table, column) keys of clamps; a
# column name never starts with NUL.
_CONTRIBUTION = "\0"


def _with_estimates(
    policy: Policy, estimated: Mapping[tuple[str, str], tuple[Fraction, Fraction]]
) -> Policy:
    tables = dict(policy.tables)
    for (table, column), (lower, upper) in estimated.items():
        spec = tables.get(table)
        if spec is None:
            continue
        if column.startswith(_CONTRIBUTION):
            name = column[len(_CONTRIBUTION) :]
            if getattr(spec, name) is None:  # a declared bound wins
                tables[table] = spec.model_copy(update={name: int(lower)})
            continue
        declared = spec.columns.get(column)
        if declared is not None and declared.bounds is not None:
            continue
        col = (declared or ColumnSpec()).model_copy(update={"lower": lower, "upper": upper})
        tables[table] = spec.model_copy(update={"columns": {**spec.columns, column: col}})
    return policy.model_copy(update={"tables": tables})


def _rule(statement: EstimateBounds, settings: Settings) -> contribution_bounds.Rule:
    """How contribution bounds are set: at the stated quantile, else by the trade-off for
    queries at the stated epsilon (the session's epsilon, which later queries default to)."""
    if statement.quantile is not None:
        return contribution_bounds.Rule(quantile=statement.quantile)
    return contribution_bounds.Rule(target=statement.target or settings.epsilon)


def _canonical(statement: EstimateBounds, epsilon: Fraction) -> str:
    """The statement as the ledger names it, with its epsilon."""
    if statement.column is not None:
        what = f"{statement.table}.{statement.column}"
    else:
        keys = f" GROUP BY {', '.join(statement.keys)}" if statement.keys else ""
        what = statement.table + keys
    if statement.target is not None:
        what += f" FOR EPSILON {decimal_text(statement.target)}"
    if statement.quantile is not None:
        what += f" AT QUANTILE {decimal_text(statement.quantile)}"
    return f"ESTIMATE BOUNDS FOR {what} WITH epsilon = {decimal_text(epsilon)}"


def _estimate_result(
    payload: Mapping[str, Any], charge: Charge | None, cached: int | None, note: str = ""
) -> Result:
    """The rows of an estimate: ``(table, column, lower, upper)`` for clamps, ``(table, bound,
    value)`` for contribution bounds, one row per bound."""
    table = str(payload["table"])
    if "column" in payload:
        row: tuple[Any, ...] = (
            table, str(payload["column"]), float(Fraction(str(payload["lower"]))),
            float(Fraction(str(payload["upper"]))),
        )  # fmt: skip
        columns: tuple[str, ...] = ("table", "column", "lower", "upper")
        types: tuple[str, ...] = ("VARCHAR", "VARCHAR", "DOUBLE", "DOUBLE")
        rows: tuple[tuple[Any, ...], ...] = (row,)
    else:
        names = contribution_bounds.bounds_of(payload.get("keys") or ())
        rows = tuple((table, name, int(payload[name])) for name in names)
        columns, types = ("table", "bound", "value"), ("VARCHAR", "VARCHAR", "BIGINT")
    return Result(
        columns, types, rows,
        accuracy=tuple((None,) * len(columns) for _ in rows),
        charge=charge, cached_from=cached, bounds_note=note,
    )  # fmt: skip
