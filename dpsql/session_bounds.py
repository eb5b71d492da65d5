"""Bounds estimated from the data, in a session: ``ESTIMATE BOUNDS`` and the policy they fill.

The estimate is two quantile releases, planned, checked before the charge, charged and cached
like any query (the ladder and its reading are ``dpsql.bounds``); the bounds are then recorded
in the ledger, and ``_effective_policy`` fills them in for later queries over columns that
declare none. The ``EstimatedBounds`` methods are part of ``dpsql.session.Session``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from dpsql import bounds
from dpsql.accounting.filter import Budget
from dpsql.engine.base import Engine
from dpsql.plan.planner import Plan
from dpsql.policy import ColumnSpec, Policy
from dpsql.session_plans import Planned
from dpsql.session_result import Result
from dpsql.sql.options import EMPTY
from dpsql.sql.parse import EstimateBounds, parse_select


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

        def _answer(self, plan: Plan, fresh: bool, planned: Planned | None = None) -> Result: ...

    # -- bounds estimated from the data ------------------------------------------------------
    def _estimate_bounds(self, statement: EstimateBounds, options: Mapping[str, object]) -> Result:
        """Two quantile releases on a fixed ladder give the bounds (``dpsql.bounds``); they are
        charged and cached like any query, then recorded for later queries to use."""
        sql = bounds.bounds_query(
            self.policy, self.engine.catalog, statement.table, statement.column
        )
        # On the declared policy: an earlier estimate must not clamp the values of a new one.
        # Never diagnosed: its cost is the session's epsilon (docs/sql.md), and its ladder of
        # rungs clamps nothing a diagnosis could tell.
        options = {**options, "diagnose": False}
        plan = self._prepare(parse_select(sql), None, options, estimates=False)
        self._check_soon(plan, soon=False)()
        answer = self._answer(plan, bool(self.settings(options)["fresh"]))
        lower_index, upper_index = answer.rows[0]
        lower, upper = bounds.from_release(float(lower_index), float(upper_index))
        if answer.charge is not None:
            # Post-processing of the release just charged: recorded, never charged again.
            payload = {
                "table": statement.table,
                "column": statement.column,
                "lower": str(lower),
                "upper": str(upper),
                "charge": answer.charge.seq,
                "policy": self.policy_version(),
                "data": self.policy.dataset.data_version,
            }
            self.filter.store.append(bounds.RECORD_KIND, payload, self.analyst)
        row = (statement.table, statement.column, float(lower), float(upper))
        return Result(
            ("table", "column", "lower", "upper"),
            ("VARCHAR", "VARCHAR", "DOUBLE", "DOUBLE"),
            (row,),
            accuracy=((None, None, None, None),),
            plan=plan,
            charge=answer.charge,
            cached_from=answer.cached_from,
        )

    def _effective_policy(self) -> Policy:
        """The policy with the bounds estimated so far (same policy and data version) filled in
        for columns that declare none; declared bounds always win."""
        records = self.filter.store.records_since(self._bounds_seen)
        for record in records:
            p = record.payload
            if (
                record.kind == bounds.RECORD_KIND
                and p.get("policy") == self.policy_version()
                and p.get("data") == self.policy.dataset.data_version
            ):
                key = (str(p["table"]), str(p["column"]))
                self._estimated[key] = (Fraction(str(p["lower"])), Fraction(str(p["upper"])))
                self._with_estimates = None
        self._bounds_seen += len(records)
        if not self._estimated:
            return self.policy
        if self._with_estimates is None:
            tables = dict(self.policy.tables)
            for (table, column), (lower, upper) in self._estimated.items():
                spec = tables.get(table)
                if spec is None:
                    continue
                declared = spec.columns.get(column)
                if declared is not None and declared.bounds is not None:
                    continue
                col = (declared or ColumnSpec()).model_copy(update={"lower": lower, "upper": upper})
                tables[table] = spec.model_copy(update={"columns": {**spec.columns, column: col}})
            self._with_estimates = self.policy.model_copy(update={"tables": tables})
        return self._with_estimates
