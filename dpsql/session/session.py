"""``Session``: one connection's policy, engine, budget, release cache, settings and analyst.

Every interface (the DB-API, the CLI, the shell and the server) is a thin face over a Session
and calls its public methods only. A Session holds its parts and composes them in the order of
the pipeline: a statement is parsed, its settings resolved (``dpsql.session.effective``), a
SELECT planned from public facts (``dpsql.session.planning``, with the engine's values of its
constants, ``dpsql.session.probes``; a plan is kept for a statement seen again,
``dpsql.session.plans``), then released through the one pipeline that checks, charges, runs,
noises, records and publishes (``dpsql.session.pipeline``). ``ESTIMATE BOUNDS``
(``dpsql.session.bounds``) and a file planned as one workload (``dpsql.session.workloads``) go
through the same pipeline.

Every step before the charge is a pure function of the query, the policy, the settings and the
catalog; the charge is committed before the engine runs, so a crash after it loses budget,
never privacy. A rejected query is never charged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from dpsql.accounting.budget.budget import Budget
from dpsql.accounting.budget.build import budget_for
from dpsql.accounting.budget.report import BudgetReport
from dpsql.accounting.ledger.store import open_store
from dpsql.analyze.analysis import Analysis
from dpsql.cache import keys as cache
from dpsql.cache.releases import Hit, ReleaseCache
from dpsql.engine.base import open_engine
from dpsql.errors import (
    BudgetExceededError,
    DpsqlError,
    LedgerError,
    ParameterError,
    PolicyError,
)
from dpsql.plan.aggregates.bernstein import SPREADS
from dpsql.plan.diagnosis import without_default
from dpsql.plan.plans import Plan
from dpsql.policy import Policy, check_against_schema, load_policy
from dpsql.release.post import accuracy_columns
from dpsql.release.result import Result, _with_accuracy
from dpsql.session import planning, views, workload_plan, workloads
from dpsql.session.advice import advice
from dpsql.session.auto import AutoRequest
from dpsql.session.blocks import Registered, blocks_read
from dpsql.session.bounds import Estimates
from dpsql.session.effective import Settings, SetValues, show_rows
from dpsql.session.overrides import overrides
from dpsql.session.periods import Persons, check_plan
from dpsql.session.pipeline import Pipeline, QueryRequest
from dpsql.session.plans import KeptPlans, Planned, explained, ledger_details, plan_key
from dpsql.session.probes import Probes
from dpsql.session.settings import BY_NAME
from dpsql.session.workload_plan import Step, Workload
from dpsql.sql.options import EMPTY, merge_options
from dpsql.sql.parse import (
    EstimateBounds,
    Explain,
    Query,
    ReadView,
    SetOption,
    ShowOption,
    Statement,
    parse_statement,
)
from dpsql.sql.split import Piece

__all__ = ["MAX_KEPT_PLANS", "VERSION", "Session"]

VERSION = "0.1.0"

# Plans a session keeps for statements it sees again, the oldest dropped first.
MAX_KEPT_PLANS = 256


class Session:
    """A connection's state: policy, engine, budget filter, settings, analyst."""

    def __init__(
        self,
        policy: Policy | str | Path,
        analyst: str | None = None,
        memory_limit: str | None = None,
    ):
        self._policy = policy if isinstance(policy, Policy) else load_policy(policy)
        self._analyst = analyst
        store = open_store(self.policy)
        if store.identity.get("dataset", self.policy.dataset.id) != self.policy.dataset.id:
            raise LedgerError("the ledger belongs to another data set than the policy names")
        # Salt of the keyed hash that picks a unit's groups, kept with the ledger so every
        # session bounds the same rows; any value is private (the choice depends only on the
        # unit's own rows), secrecy only stops prediction.
        # The registered blocks of the tables made of blocks (dpsql.session.blocks), bound by
        # the engine; read again before each statement is planned (``refresh_blocks``).
        self._memory_limit, self.registered = memory_limit, Registered(self.policy, store)
        salt = int(store.identity["salt"])
        self.engine = open_engine(self.policy, salt, memory_limit, self.registered.blocks)
        try:
            check_against_schema(self.policy, self.engine.file_catalog)
            # The accountant's name is checked against the registry here: a refused policy
            # leaves no engine open.
            self._filter = budget_for(
                self.policy.dataset.id, self.policy.budget, store, self.policy.periods
            )
        except PolicyError:
            self.engine.close()
            raise
        self.cache = ReleaseCache(store)
        self.pipeline = Pipeline(self._filter, self.cache, self.engine, analyst)
        self.pipeline.persons = Persons.of(self.policy, self.registered)
        self.set_values = SetValues()
        self.probes = Probes(self.engine)
        self.estimates = Estimates(self.policy, store, self.engine)
        self.estimates.blocks = self.registered.blocks
        self._plans = KeptPlans(MAX_KEPT_PLANS)

    # -- the parts a caller may replace: each part that holds one follows -----------------------
    @property
    def policy(self) -> Policy:
        return self._policy

    @policy.setter
    def policy(self, policy: Policy) -> None:
        self._policy = policy
        self.estimates.base = policy

    @property
    def filter(self) -> Budget:
        """The budget: the policy's filter over the ledger (check-and-charge, the report)."""
        return self._filter

    @filter.setter
    def filter(self, budget: Budget) -> None:
        self._filter = budget
        self.pipeline.budget = budget
        self.estimates.store = budget.store

    @property
    def analyst(self) -> str | None:
        return self._analyst

    @analyst.setter
    def analyst(self, analyst: str | None) -> None:
        self._analyst = analyst
        self.pipeline.analyst = analyst

    # -- settings ------------------------------------------------------------------------------
    def set_option(self, name: str, value: object) -> None:
        """``SET dpsql.name = value``; ``None`` resets to the default."""
        self.set_values.set(name, value)

    def settings(self, options: Mapping[str, object] | None = None) -> Settings:
        """The effective settings: the defaults, then SET values, then ``options``."""
        return Settings.resolve(self.policy, self.set_values.values(), options or {})

    def _settings_for(
        self, options: Mapping[str, object], inline: Mapping[str, object] = EMPTY
    ) -> Settings:
        """A statement's settings: its keyword ``options`` (a name outside the table is
        refused) over its inline ``OPTIONS(...)`` over SET values."""
        bad = set(options) - set(BY_NAME)
        if bad:
            raise ParameterError(f"unknown option(s): {', '.join(sorted(bad))}")
        return self.settings(merge_options(inline, options))

    def policy_version(self) -> str:
        """The policy's content digest, computed once per policy object (a Policy is frozen)."""
        return self.estimates.version()

    def plan_key(
        self,
        sql: str,
        params: Sequence[object] | None,
        options: Mapping[str, object],
        current: bool = True,
    ) -> tuple[object, ...] | None:
        """What a statement's plan is a pure function of (``dpsql.session.plans.plan_key``).
        ``current=False`` keys on the bounds estimates read so far, without reading the ledger
        again (a caller planning many statements at once reads it once)."""
        if current:
            self.refresh_blocks()
            self.estimates.policy()  # reads bounds estimated since the last statement
        version: tuple[object, ...] = (self.policy_version(), self.policy.dataset.data_version)
        version += self.registered.token()
        return plan_key(sql, params, options, set_values=self.set_values.values(),
                        analyst=self.analyst, version=version,
                        estimated=self.estimates.estimated)  # fmt: skip

    def refresh_blocks(self) -> None:
        """Blocks registered since the engine bound its files: a new engine over the blocks
        registered now, before the next statement is planned. A statement planned on the old
        list is refused before its charge (``Pipeline.charge``), never run on the new one."""
        moved = self.registered.moved(self.filter.store)
        if moved is not None:
            # A block that cannot be bound (a file changed) is refused here, at every statement,
            # until the owner replaces it; plans keep reading the list the engine binds.
            engine = open_engine(self.policy, self.engine.salt, self._memory_limit, moved[0])
            old, self.engine = self.engine, engine
            self.registered.commit(*moved)
            self.pipeline.engine = self.probes.engine = self.estimates.engine = engine
            self.estimates.blocks = moved[0]
            old.close()

    # -- planning ------------------------------------------------------------------------------
    def plan(self, sql: str, params: Sequence[object] | None = None, **options: object) -> Plan:
        """Plan a SELECT without running or charging anything (what EXPLAIN shows)."""
        planned = self.planned(sql, params, options)
        if planned is None:
            raise ParameterError("only a SELECT query can be planned")
        # The plan that would run: a variance a release of the other form serves is served so.
        return self.apart(sql, params, options, planned).plan

    def planned(
        self,
        sql: str,
        params: Sequence[object] | None,
        options: Mapping[str, object],
        current: bool = True,
        statement: Statement | None = None,
    ) -> Planned | None:
        """The plan of a SELECT or EXPLAIN statement, from the session's plans when the same
        key was planned before; None for any other statement. Nothing is charged.
        ``current``: as for ``plan_key``; ``statement``: ``sql`` already parsed."""
        finish = self.planned_soon(sql, params, options, current, statement, soon=False)
        return None if finish is None else finish()

    def planned_soon(
        self,
        sql: str,
        params: Sequence[object] | None,
        options: Mapping[str, object],
        current: bool = True,
        statement: Statement | None = None,
        *,
        soon: bool = True,
    ) -> Callable[[], Planned] | None:
        """``planned`` in two steps: the statement is parsed, analysed and planned now (raising
        what ``planned`` raises there), and the engine's check of the bounded SQL starts in the
        engine's worker (``soon``; else it runs here and now); the function returned waits for
        the check (raising its error) and gives the Planned; None for a statement that is
        not a SELECT or EXPLAIN. Nothing is charged in either step. A batch file plans its next
        statement while the engine checks this one."""
        key = self.plan_key(sql, params, options, current)
        # Reused only under the full key: a SET, another analyst, a policy edit, a new data
        # version or a new bounds estimate each plan afresh (tests/cache/test_plan_cache.py).
        found = self._plans.get(key) if key is not None else None
        if found is not None:
            return lambda: found
        if statement is None:
            statement = parse_statement(sql)
        if not isinstance(statement, Explain | Query):
            return None
        explain = isinstance(statement, Explain)
        plan = self._prepare(statement.select, params, options, statement.options)
        # Fixed now, checked before each charge; checked here too, so that a file replaced
        # since the session bound it is named as such, not as a query the engine cannot type.
        files = planning.files_read(self.engine, plan)
        files.verify()
        checked = planning.check_soon(self.engine, plan, soon)
        # Keyed on the estimates the plan was made with (_prepare reads the ledger again).
        key = self.plan_key(sql, params, options, current=False)

        def finish() -> Planned:
            types = checked()
            typed = plan
            if len(types) == len(plan.analysis.keys) and plan.auto is None:
                # The key types the post-processing was bound with: a private key's released
                # column is typed by them even when no group is released (an empty column
                # has no type of its own).
                typed = replace(plan, key_types=tuple(types))
            keys = cache.keys(typed, self.policy, self.policy_version())
            verbose = isinstance(statement, Explain) and statement.verbose
            done = Planned(explain, typed, keys, self.details(typed), verbose, files)
            if key is not None:
                self._plans.keep(key, done)
            return done

        return finish

    def _prepare(
        self,
        select: Any,
        params: Sequence[object] | None,
        options: Mapping[str, object],
        inline: Mapping[str, object] = EMPTY,
        estimates: bool = True,
    ) -> Plan:
        """The plan, before the engine's check of its bounded SQL (``planning.check_soon``).
        ``inline``: the statement's ``WITH DIFFERENTIAL_PRIVACY OPTIONS(...)``, under the
        call's keyword ``options`` (a keyword option given wins), over SET values.
        ``estimates``: use bounds estimated earlier where the policy declares none."""
        settings = self._settings_for(options, inline)
        policy = self.estimates.policy() if estimates else self.policy
        plan = planning.prepare(
            select, params, settings=settings, inline=inline, policy=policy, probes=self.probes
        )
        if estimates and self.estimates.chose(plan, settings.asked):
            # Bounds dpsql chose itself: no diagnosis unless the analyst asked for one.
            plan = without_default(plan)
        if self.policy.data.blocks:
            # The blocks it reads, fixed now: its release's key (dpsql.session.blocks).
            plan = replace(plan, blocks=blocks_read(plan, self.registered.blocks, self.policy))
            check_plan(plan, self.policy)
        return plan

    def _python_domain(
        self, analysis: Analysis, expression: str, engine_type: str, domain: tuple[object, ...]
    ) -> list[str | None] | None:
        """A public key's domain as the engine's values, without asking it (``Probes``)."""
        return self.probes.python_domain(analysis, expression, engine_type, domain)

    def details(self, plan: Plan) -> dict[str, object]:
        """What the ledger keeps beside a charge, so that a report can be reproduced later."""
        return ledger_details(plan, engine=self.engine.name, overrides=self.overrides(plan),
                              policy_version=self.policy_version(), dpsql_version=VERSION,
                              data_version=self.policy.dataset.data_version)  # fmt: skip

    def overrides(self, plan: Plan) -> list[dict[str, str]]:
        """The bounds ``plan`` runs with that differ from the policy's (``overrides``), read
        against the estimates it was planned with (none read since)."""
        return overrides(self.policy, self.estimates.known(), plan)

    # -- execution -----------------------------------------------------------------------------
    def execute(
        self, sql: str, params: Sequence[object] | None = None, **options: object
    ) -> Result:
        """Run one statement. Raises a ``DpsqlError``; a rejected query is never charged."""
        key = self.plan_key(sql, params, options)
        known = self._plans.get(key) if key is not None else None
        if known is not None:
            # A kept plan skips only the pure steps: the pipeline still checks, charges, noises.
            known = self.apart(sql, params, options, known)
            return self._planned_result(known, options)
        statement = parse_statement(sql)
        if isinstance(statement, SetOption):
            if params:
                raise ParameterError("SET takes no parameters")
            self.set_option(statement.name, statement.value)
            return Result((), (), (), message=f"SET dpsql.{statement.name}")
        if isinstance(statement, ShowOption | ReadView):  # free: a setting, the budget, a view
            return self._show(statement)
        if isinstance(statement, EstimateBounds):
            if params:
                raise ParameterError("ESTIMATE BOUNDS takes no parameters")
            estimate = self.estimates.plan(statement, self._settings_for(options))
            return self.pipeline.release(estimate)
        planned = self.planned(sql, params, options, current=False, statement=statement)
        assert planned is not None  # parse_statement gave a SELECT or an EXPLAIN
        planned = self.apart(sql, params, options, planned)
        try:
            return self._planned_result(planned, options)
        except BudgetExceededError as exc:
            if planned.explain or self.pipeline.refused_unnamed():
                raise
            raise BudgetExceededError(f"{exc}{advice(self, sql, params, options)}") from None

    def apart(
        self, sql: str, params: Sequence[object] | None, options: Mapping[str, object],
        planned: Planned, moments: str = "separate",
    ) -> Planned:  # fmt: skip
        """``planned``, or where its variances are measured one way (a Bernstein vector; with
        ``moments="joint"``, Q, S and N apart) and the same statement measured the other way
        has a release that serves it, that plan: serving a release again is post-processing
        and free, so asking a variance again never pays because the default changed or a file
        measured it apart (``dpsql.plan.aggregates.bernstein``)."""
        joint = any(e.joint for e in planned.plan.estimates)
        spreads = any(e.kind in SPREADS for e in planned.plan.estimates)
        settings = self.settings(options)
        if planned.explain or settings.fresh or not spreads or joint != (moments == "separate"):
            return planned
        try:
            other = self.planned(sql, params, {**options, "moments": moments}, current=False)
        except DpsqlError:
            return planned  # the other form is refused (public facts): this one runs as planned
        if other is None or self.served_from(other.plan, settings.share) is None:
            return planned
        return other

    def _planned_result(self, planned: Planned, options: Mapping[str, object]) -> Result:
        plan = planned.plan
        if planned.explain:
            return explained(plan, planned.verbose, self.engine.name, self.pipeline.persons)
        settings = self.settings(options)
        # The names of the ± columns are checked before the charge: a collision costs nothing.
        extra = accuracy_columns(plan) if settings.accuracy_columns else None
        # A fresh answer (not one served from the cache) is charged like any other, and a
        # plan reused from an earlier statement is charged and noised afresh.
        # A default diagnosis is never a reason to charge a query the cache answers without it.
        bare = without_default(plan)
        keys = partial(cache.keys, bare, self.policy, self.policy_version())
        request: QueryRequest
        if plan.auto is not None and plan.replan is not None:
            # Bounds chosen after the charge (dpsql.session.auto): served again only from the
            # release of the same request, with the values it chose.
            request = AutoRequest(plan, planned.keys, planned.details, plan.replan,
                                  fresh=settings.fresh, files=planned.files)  # fmt: skip
        else:
            request = QueryRequest(
                plan, planned.keys, planned.details, fresh=settings.fresh, shared=settings.share,
                bare=None if bare is plan else (bare, keys), files=planned.files,
            )  # fmt: skip
        result = self.pipeline.release(request)
        return result if extra is None else _with_accuracy(result, extra)

    def served_from(self, plan: Plan, shared: bool = True) -> Hit | None:
        """The release that would serve ``plan`` now, or None (then it would be charged):
        what EXPLAIN-like commands tell; nothing is recorded or charged. A plan with a default
        diagnosis is also served by a release without one, as ``execute`` would serve it."""
        bare = without_default(plan)
        for candidate in (plan,) if bare is plan else (plan, bare):
            keys = cache.keys(candidate, self.policy, self.policy_version())
            hit = self.cache.lookup(candidate, keys, shared)
            if hit is not None:
                return hit
        return None

    def _show(self, statement: ShowOption | ReadView) -> Result:
        if isinstance(statement, ReadView):  # a continual-release view's released values
            return views.read(self, statement)
        if statement.name == "budget":
            return Result(("budget",), ("VARCHAR",), ((str(self.budget()),),))
        columns, rows = show_rows(self.settings(), statement.name)
        return Result(columns, ("VARCHAR",) * len(columns), rows)

    def plan_workload(self, pieces: Sequence[Piece]) -> Workload:
        """Plan every statement of a file, then the file as one workload admitted on a copy
        of the budget (``dpsql.session.workload_plan``); nothing is charged."""
        return workload_plan.plan_workload(self, pieces)

    def run_workload(self, workload: Workload) -> Iterator[tuple[Step, Result | None]]:
        """Run a planned workload: its one charge first, then its answers in order."""
        return workloads.run_workload(self, workload)

    def run_script(self, text: str, partial: bool = False) -> list[tuple[Step, Result | None]]:
        """Plan ``text`` as one workload and run it: all or nothing, or with ``partial`` the
        longest prefix that fits."""
        self.pipeline.admit()  # budget.require_analyst: before planning its admission
        return workloads.run_script(self, text, partial)

    def budget(self) -> BudgetReport:
        """A frozen report of the spent and remaining budget."""
        return self.filter.report(self.analyst)

    def close(self) -> None:
        self.engine.close()
