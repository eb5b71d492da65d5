"""Bounds estimated from the data, in a session: ``ESTIMATE BOUNDS`` and the policy they fill.

An estimate is one sparse-vector release over one value per unit (``dpsql.release.clamp_bounds`` for
a column's clamps, ``dpsql.release.contribution_bounds`` for a table's L0, C and R): refused on
public facts only, charged as one ``PureDP`` event before the engine runs, then recorded in the
ledger. The record is the release: the same statement at the same epsilon, policy and data version
is served from it again at no cost, and ``_effective_policy`` fills the bounds in for later queries
wherever the policy declares none. The ``EstimatedBounds`` methods are part of
``dpsql.session.session.Session``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from dpsql.accounting.budget.budget import Budget
from dpsql.accounting.budget.report import Charge
from dpsql.accounting.ledger.chain import Record
from dpsql.engine.base import Engine
from dpsql.errors import EngineError, ParameterError, UndeclaredMechanismError
from dpsql.mechanisms.events import Composite
from dpsql.mechanisms.stated_events import PureDP
from dpsql.plan.plans import Plan
from dpsql.policy import ColumnSpec, Policy
from dpsql.policy.numbers import decimal_text
from dpsql.release import clamp_bounds as bounds
from dpsql.release import contribution_bounds
from dpsql.release.result import Result
from dpsql.session.plans import Planned
from dpsql.session.settings import SETTINGS
from dpsql.sql.options import EMPTY
from dpsql.sql.parse import EstimateBounds


class EstimatedBounds:
    """The bounds part of ``Session``: an estimate's statement, and the policy with the bounds
    estimated so far."""

    policy: Policy
    analyst: str | None
    engine: Engine
    filter: Budget
    _estimated: dict[tuple[str, str], tuple[Fraction, Fraction]]
    _bounds_seen: int
    _with_estimates: Policy | None

    if TYPE_CHECKING:

        def settings(self, overrides: Mapping[str, object] | None = None) -> dict[str, object]: ...

        def policy_version(self) -> str: ...

        def _prepare(
            self,
            select: Any,
            params: Sequence[object] | None,
            options: Mapping[str, object],
            inline: Mapping[str, object] = EMPTY,
            estimates: bool = True,
        ) -> Plan: ...

        def _check_soon(self, plan: Plan, soon: bool) -> Callable[[], None]: ...

        def _answer(
            self, plan: Plan, fresh: bool, planned: Planned | None = None, shared: bool = True
        ) -> Result: ...

        def _failed(self, charge: Charge, cause: str) -> EngineError: ...

    # -- bounds estimated from the data ------------------------------------------------------
    def _estimate_bounds(
        self,
        statement: EstimateBounds,
        options: Mapping[str, object],
        charge: Charge | None = None,
    ) -> Result:
        """One sparse-vector release over one value per unit (``dpsql.release.clamp_bounds`` for
        clamps, ``dpsql.release.contribution_bounds`` for L0, C and R): refused on public facts
        only, charged before the engine runs, then recorded for later queries to use and served
        again free. ``charge``: a workload's charge that already holds its event
        (``estimate_event``)."""
        prepared = self._estimate_prepare(statement, options)
        kind, key, sql, canonical, found, event, epsilon = prepared
        if found is not None and charge is None:
            # Serving a released estimate again is post-processing: recorded, never charged.
            self.filter.store.append(
                "reserve",
                {"query": canonical, "release": found.payload["charge"]},
                self.analyst,
                synced=False,
            )
            return _estimate_result(found.payload, None, int(found.payload["charge"]))
        if charge is None:
            details = {"bounded_sql": sql, "engine": self.engine.name,
                       "policy_version": self.policy_version(),
                       "data_version": self.policy.dataset.data_version}  # fmt: skip
            # Charged first: nothing runs unless the budget admits it (a crash after it loses
            # budget, never privacy).
            charge = self.filter.charge(event, canonical, self.analyst, details)
        try:
            _, rows = self.engine.run(sql)
        except (EngineError, MemoryError) as exc:
            raise self._failed(charge, getattr(exc, "cause", None) or type(exc).__name__) from None
        except KeyboardInterrupt:
            self._failed(charge, "KeyboardInterrupt")
            raise
        payload: dict[str, object] = {**key, "charge": charge.seq}
        if statement.column is not None:
            lower, upper = bounds.release(epsilon, rows)
            payload.update(lower=str(lower), upper=str(upper))
        else:
            values = contribution_bounds.release(epsilon, statement.keys, rows)
            payload.update(zip(contribution_bounds.bounds_of(statement.keys), values, strict=True))
        # Post-processing of the release just charged: recorded, never charged again.
        self.filter.store.append(kind, payload, self.analyst)
        return _estimate_result(payload, charge, None)

    def estimate_event(
        self, statement: EstimateBounds, options: Mapping[str, object]
    ) -> Composite | None:
        """The loss an ``ESTIMATE BOUNDS`` would charge now (None: served from a released
        estimate, free); refused on public facts only, like the statement itself."""
        _, _, _, _, found, event, _ = self._estimate_prepare(statement, options)
        return None if found is not None else event

    def _estimate_prepare(
        self, statement: EstimateBounds, options: Mapping[str, object]
    ) -> tuple[str, dict[str, object], str, str, Record | None, Composite, Fraction]:
        bad = set(options) - set(SETTINGS)
        if bad:
            raise ParameterError(f"unknown option(s): {', '.join(sorted(bad))}")
        settings = self.settings(options)
        epsilon = settings["epsilon"]
        assert isinstance(epsilon, Fraction)  # check_setting normalised it
        if self.policy.budget.declared_mechanism is not None:
            raise UndeclaredMechanismError(
                "ESTIMATE BOUNDS is a sparse vector release, and the pld filter admits only its "
                "declared mechanism: declare the bounds in the policy instead"
            )
        table = statement.table.lower()
        what: dict[str, object]
        if statement.column is not None:
            column = statement.column.lower()
            kind, what = bounds.RECORD_KIND, {"column": column}
            sql = bounds.bounds_query(self.policy, self.engine.catalog, table, column)
        else:
            kind, what = contribution_bounds.RECORD_KIND, {"keys": list(statement.keys)}
            sql = contribution_bounds.bounds_query(
                self.policy, self.engine.catalog, table, statement.keys
            )
        # Binds on the schema alone, before the charge: a query that cannot run costs nothing.
        self.engine.check(sql, types=False)
        key = {"table": table, **what, "epsilon": str(epsilon), "policy": self.policy_version(),
               "data": self.policy.dataset.data_version}  # fmt: skip
        canonical = _canonical(statement, epsilon)
        found = None if settings["fresh"] else self._released_estimate(kind, key)
        label = "ESTIMATE BOUNDS: " + (
            bounds.walks(epsilon).describe()
            if statement.column is not None
            else f"count of units and {contribution_bounds.describe(epsilon, statement.keys)}"
        )
        event = Composite((PureDP(epsilon, label),))
        return kind, key, sql, canonical, found, event, epsilon

    def _released_estimate(self, kind: str, key: Mapping[str, object]) -> Record | None:
        """The latest estimate of the same statement, epsilon, policy and data version."""
        for record in reversed(self.filter.store.records()):
            if record.kind == kind and all(record.payload.get(k) == v for k, v in key.items()):
                return record
        return None

    def _effective_policy(self) -> Policy:
        """The policy with the bounds estimated so far (same policy and data version) filled in
        where it declares none: clamps for columns, contribution bounds for tables; declared
        bounds always win."""
        records = self.filter.store.records_since(self._bounds_seen)
        for record in records:
            p = record.payload
            if (
                record.kind in (bounds.RECORD_KIND, contribution_bounds.RECORD_KIND)
                and p.get("policy") == self.policy_version()
                and p.get("data") == self.policy.dataset.data_version
            ):
                self._with_estimates = None
                if record.kind == bounds.RECORD_KIND:
                    key = (str(p["table"]), str(p["column"]))
                    self._estimated[key] = (Fraction(str(p["lower"])), Fraction(str(p["upper"])))
                    continue
                for name in contribution_bounds.bounds_of(p.get("keys") or ()):
                    value = Fraction(int(p[name]))
                    self._estimated[(str(p["table"]), _CONTRIBUTION + name)] = (value, value)
        self._bounds_seen += len(records)
        if not self._estimated:
            return self.policy
        if self._with_estimates is None:
            self._with_estimates = _with_estimates(self.policy, self._estimated)
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


def _canonical(statement: EstimateBounds, epsilon: Fraction) -> str:
    """The statement as the ledger names it, with its epsilon."""
    if statement.column is not None:
        what = f"{statement.table}.{statement.column}"
    else:
        keys = f" GROUP BY {', '.join(statement.keys)}" if statement.keys else ""
        what = statement.table + keys
    return f"ESTIMATE BOUNDS FOR {what} WITH epsilon = {decimal_text(epsilon)}"


def _estimate_result(
    payload: Mapping[str, Any], charge: Charge | None, cached: int | None
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
        charge=charge, cached_from=cached,
    )  # fmt: skip
