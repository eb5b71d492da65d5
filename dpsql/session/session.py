"""The one orchestrator: parse -> validate -> analyze -> plan -> check -> charge -> execute ->
noise -> release. Every interface (DB-API, CLI, later the shell and the server) is a thin face
over ``Session``.

Every step before the charge is a pure function of the query, the policy, the settings and the
catalog; the charge is committed before the engine runs, so a crash after it loses budget,
never privacy. A rejected query is never charged.

The parts of ``Session`` that stand on their own are its bases, each in a module beside this
one: the settings, SET and SHOW (``dpsql.session.settings``), the keys of the plans it keeps
(``dpsql.session.plans``), the bounds estimated from the data (``dpsql.session.bounds``) and
the engine's values of a query's constants (``dpsql.session.probes``); ``Result`` is
``dpsql.release.result``. This module keeps the pipeline, and re-exports their public names.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from fractions import Fraction
from pathlib import Path
from typing import Any

from dpsql.accounting.budget.build import budget_for
from dpsql.accounting.budget.report import BudgetReport, Charge
from dpsql.accounting.ledger.store import open_store
from dpsql.analyze.analysis import Analysis
from dpsql.analyze.analyze import analyze
from dpsql.analyze.binds import provably_binds
from dpsql.analyze.sample import implemented, take_sample
from dpsql.cache import releases as cache
from dpsql.engine.base import open_engine
from dpsql.errors import (
    EngineError,
    LedgerError,
    ParameterError,
    PolicyError,
    UnsupportedQueryError,
)
from dpsql.noise.measure import check_samplable, measure, measure_diagnosis
from dpsql.plan.planner import plan_query
from dpsql.plan.plans import Plan
from dpsql.plan.targets import solve
from dpsql.policy import Policy, check_against_schema, load_policy
from dpsql.policy.numbers import decimal_text
from dpsql.release.diagnosis import diagnose
from dpsql.release.post import Release, accuracy_columns, check_post_processing, publish
from dpsql.release.result import Result, _with_accuracy
from dpsql.session.bounds import EstimatedBounds
from dpsql.session.plans import PlanKeys, Planned
from dpsql.session.probes import Probes
from dpsql.session.settings import (
    SETTINGS,
    Settings,
    target_of,
)
from dpsql.sql.options import EMPTY, check_privacy_unit, merge_options
from dpsql.sql.params import bind_parameters
from dpsql.sql.parse import (
    DIALECT,
    EstimateBounds,
    Explain,
    Query,
    SetOption,
    ShowOption,
    Statement,
    parse_statement,
)
from dpsql.sql.validate import validate

__all__ = ["MAX_KEPT_PLANS", "VERSION", "Session"]

log = logging.getLogger("dpsql")
VERSION = "0.1.0"

# Plans a session keeps for statements it sees again, the oldest dropped first.
MAX_KEPT_PLANS = 256


# The unit types a sample's PRF reads as one text per unit (dpsql.analyze.sample).
_SAMPLED_UNITS = frozenset(
    {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER",
     "UBIGINT", "UHUGEINT", "VARCHAR"}
)  # fmt: skip


FAMILY_SERVED = (
    "served again from release {seq}: a workload family's answer to this query, combined by "
    "least squares (unrounded, and not clamped at 0)"
)


DERIVED = (
    "derived from the measurements of release {seq} (post-processing, free): an AVG from its "
    "noisy SUM and COUNT"
)
ASSEMBLED = (
    "derived from release(s) {seqs}: measurements of the same bounded rows (post-processing, "
    "free), weighted by their inverse variances where measured more than once; its accuracy is "
    "theirs, whatever this query's epsilon (SET dpsql.fresh = on for a fresh answer)"
)
FAMILY_DERIVED = (
    "derived from release {seq}, a workload family's measurements (post-processing, free): "
    "its cells are sums of the family's least-squares values (unrounded, and not clamped at 0)"
)


class Session(Settings, PlanKeys, EstimatedBounds, Probes):
    """A connection's state: policy, engine, budget filter, settings, analyst."""

    def __init__(
        self,
        policy: Policy | str | Path,
        analyst: str | None = None,
        memory_limit: str | None = None,
    ):
        self.policy = policy if isinstance(policy, Policy) else load_policy(policy)
        self.analyst = analyst
        store = open_store(self.policy)
        if store.identity.get("dataset", self.policy.dataset.id) != self.policy.dataset.id:
            raise LedgerError("the ledger belongs to another data set than the policy names")
        # Salt of the keyed hash that picks a unit's groups, kept with the ledger so every
        # session bounds the same rows; any value is private (the choice depends only on the
        # unit's own rows), secrecy only stops prediction.
        self.engine = open_engine(self.policy, int(store.identity["salt"]), memory_limit)
        try:
            check_against_schema(self.policy, self.engine.catalog)
        except PolicyError:
            self.engine.close()
            raise
        self.filter = budget_for(self.policy.dataset.id, self.policy.budget, store)
        self.cache = cache.ReleaseCache(store)
        self._settings: dict[str, object] = {}
        self._estimated: dict[tuple[str, str], tuple[Fraction, Fraction]] = {}
        self._bounds_seen = 0
        self._with_estimates: Policy | None = None
        self._plans: dict[tuple[object, ...], Planned] = {}
        self._version: tuple[Policy, str] | None = None

    # -- planning --------------------------------------------------------------------------------
    def plan(self, sql: str, params: Sequence[object] | None = None, **options: object) -> Plan:
        """Plan a SELECT without running or charging anything (what EXPLAIN shows)."""
        planned = self.planned(sql, params, options)
        if planned is None:
            raise ParameterError("only a SELECT query can be planned")
        return planned.plan

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
        checked = self._check_soon(plan, soon)
        # Keyed on the estimates the plan was made with (_prepare reads the ledger again).
        key = self.plan_key(sql, params, options, current=False)

        def finish() -> Planned:
            checked()
            k = cache.keys(plan, self.policy, self.policy_version())
            done = Planned(explain, plan, k, self._details(plan))
            if key is not None:
                if len(self._plans) >= MAX_KEPT_PLANS:
                    self._plans.pop(next(iter(self._plans)))
                self._plans[key] = done
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
        """The plan, before the engine's check of its bounded SQL (``_check_soon``).
        ``inline``: the statement's ``WITH DIFFERENTIAL_PRIVACY OPTIONS(...)``, under the
        call's keyword ``options`` (a keyword option given wins), over SET values.
        ``estimates``: use bounds estimated earlier where the policy declares none."""
        bad = set(options) - set(SETTINGS)
        if bad:
            raise ParameterError(f"unknown option(s): {', '.join(sorted(bad))}")
        given = merge_options(inline, options)
        settings = self.settings(given)
        # What the analyst asked for (SET, inline options, keywords), apart from the defaults.
        asked = frozenset(self._settings) | {k for k, v in given.items() if v is not None}
        # TABLESAMPLE is dpsql's to interpret, never the engine's (dpsql.analyze.sample).
        select, sampled, sampled_tables = take_sample(select)
        bound = bind_parameters(select, params)
        validate(bound)
        policy = self._effective_policy() if estimates else self.policy
        label = settings["other_label"]
        assert label is None or isinstance(label, str)  # check_setting normalised it
        analysis = self._engine_values(
            analyze(bound, policy, self.engine.catalog, self.engine.describe),
            other=bool(settings["other_group"]),
            label=label,
        )
        check_privacy_unit(inline, analysis.unit)
        options_ = self._options(settings, analysis.spec, asked)
        rate = sampled if sampled is not None else settings["sample_rate"]
        assert rate is None or isinstance(rate, Fraction)
        if rate is not None and implemented(rate) < 1:
            clause = sampled_tables if sampled is not None else None
            self._check_sample(analysis, policy, clause)
            options_ = replace(options_, sample=rate, sample_scale=bool(settings["sample_scale"]))
        target = target_of(settings)
        lines: list[str] = []
        if target is not None:
            # The cheapest epsilon that meets the target, from public quantities only.
            options_, lines = solve(analysis, options_, policy, target)
        plan = plan_query(analysis, options_, policy, query=bound.sql(dialect=DIALECT))
        if lines:
            plan = replace(plan, targets=tuple(lines))
        if self.engine.name != "duckdb":  # EXPLAIN shows the SQL this engine runs
            plan = replace(plan, shown=self.engine.shown_sql)
        elif rate is None and provably_binds(
            bound, self.engine.catalog.get(analysis.table.lower(), {})
        ):
            plan = replace(plan, binds=True)
        check_samplable(plan)
        return plan

    def _check_sample(
        self,
        analysis: Analysis,
        policy: Policy,
        clause: tuple[tuple[str, bool], ...] | None,
    ) -> None:
        """A unit-level sample samples every private table the query reads (a clause on some
        of them only is refused), and needs a unit with one text per unit: an
        integer, or a string compared byte by byte (under a collation two texts are one unit,
        and would be sampled apart).

        Every row of the query's relation belongs to one unit and depends only on that unit's
        rows (``dpsql.analyze.relations``), so keeping the relation's rows of the sampled units is
        the query on the sample of every private table: the filter reads ``_u`` once."""
        private = {t.lower() for t in analysis.tables if not policy.tables[t.lower()].public}
        # With TABLESAMPLE, every private table the query reads carries it: each occurrence in
        # the outer FROM and JOINs, and none read inside a subquery without it.
        sampled = {name for name, on in clause or () if on}
        bare = {name for name, on in clause or () if not on}
        if clause is not None and (private & bare or not private <= sampled):
            raise UnsupportedQueryError(
                "TABLESAMPLE must sample every private table the query reads, at one rate "
                f"({', '.join(sorted(private))}): one sample of the units for all of them"
            )
        kind = analysis.columns.get(analysis.unit, "") or analysis.columns.get(
            analysis.unit.lower(), ""
        )
        collated = any(
            self.engine.collations.get((t, str(policy.tables[t].privacy_unit).lower()))
            for t in private
        )
        if kind.upper() not in _SAMPLED_UNITS or (kind.upper() == "VARCHAR" and collated):
            raise UnsupportedQueryError(
                f"a unit-level sample needs a privacy unit of integer or plain text type, not "
                f"{kind or 'unknown'}{' with a collation' if collated else ''}"
            )

    def _check_soon(self, plan: Plan, soon: bool) -> Callable[[], None]:
        """Bind the bounded SQL and the post-processing: a query that cannot be typed is
        rejected before the charge, on the schema alone. The engine's part starts now; the
        function returned waits for it and binds the post-processing over the key types.

        Public keys carry the type the engine gave their expression (``_engine_values``),
        which the bounded SQL keeps (its keys come from the domain, cast to that type;
        ``tests/analyze/test_check_types.py``), so only a query with a key of no public domain needs
        the engine's DESCRIBE as well. ``soon``: in the engine's worker (else here and now)."""
        known = [key.engine_type for key in plan.analysis.keys]
        public = all(known)
        if plan.binds and public:
            # Sure to plan (dpsql.analyze.binds), and every key's type known: no engine check.
            wait: Callable[[], list[str]] = lambda: []  # noqa: E731
        elif soon:
            wait = self.engine.check_soon(plan.engine_sql, types=not public)
        else:
            described = self.engine.check(plan.engine_sql, types=not public)
            wait = lambda: described  # noqa: E731

        def finish() -> None:
            described = wait()
            types = [t for t in known if t is not None] if public else described[: len(known)]
            check_post_processing(plan, types)
            if plan.diagnosis is not None:
                # The diagnosis's SQL binds before the charge too, on the schema alone.
                self.engine.check(plan.diagnosis.engine_sql, types=False)

        return finish

    # -- execution -------------------------------------------------------------------------------
    def execute(
        self, sql: str, params: Sequence[object] | None = None, **options: object
    ) -> Result:
        """Run one statement. Raises a ``DpsqlError``; a rejected query is never charged."""
        key = self.plan_key(sql, params, options)
        known = self._plans.get(key) if key is not None else None
        if known is not None:
            # A kept plan skips only the pure steps: _answer still checks, charges, draws noise.
            return self._planned_result(known, options)
        statement = parse_statement(sql)
        if isinstance(statement, SetOption):
            if params:
                raise ParameterError("SET takes no parameters")
            self.set_option(statement.name, statement.value)
            return Result((), (), (), message=f"SET dpsql.{statement.name}")
        if isinstance(statement, ShowOption):
            return self._show(statement.name)
        if isinstance(statement, EstimateBounds):
            if params:
                raise ParameterError("ESTIMATE BOUNDS takes no parameters")
            return self._estimate_bounds(statement, options)
        planned = self.planned(sql, params, options, current=False, statement=statement)
        assert planned is not None  # parse_statement gave a SELECT or an EXPLAIN
        return self._planned_result(planned, options)

    def _planned_result(self, planned: Planned, options: Mapping[str, object]) -> Result:
        plan = planned.plan
        if planned.explain:
            lines = plan.explain()
            return Result(("plan",), ("VARCHAR",), tuple((line,) for line in lines), plan=plan)
        settings = self.settings(options)
        # The names of the ± columns are checked before the charge: a collision costs nothing.
        extra = accuracy_columns(plan) if settings["accuracy_columns"] else None
        # A fresh answer (not one served from the cache) is charged like any other, and a
        # plan reused from an earlier statement is charged and noised afresh in _answer.
        result = self._answer(plan, bool(settings["fresh"]), planned, bool(settings["share"]))
        return result if extra is None else _with_accuracy(result, extra)

    def _answer(
        self, plan: Plan, fresh: bool, planned: Planned | None = None, shared: bool = True
    ) -> Result:
        canonical = plan.query
        digest = hashlib.sha256(canonical.encode()).hexdigest()[:12]
        # The cache keys and the ledger details are pure functions of the plan and the policy.
        version = self.policy_version()
        k = planned.keys if planned is not None else cache.keys(plan, self.policy, version)
        details = planned.details if planned is not None else self._details(plan)
        hit = None if fresh else self.cache.lookup(plan, k, shared)
        if hit is not None:
            if hit.combined is not None:
                # Values combined from released measurements (a workload family's least squares,
                # a centred sum from a SUM and a COUNT): the half-widths of their combination.
                plan = replace(plan, measurements=tuple(
                    m if c is None else replace(m, combined=c)
                    for m, c in zip(plan.measurements, hit.combined, strict=True)))  # fmt: skip
            # Serving a released answer again is post-processing: recorded, never charged.
            reserve: dict[str, object] = {"query": canonical, "release": hit.release_seq}
            if hit.sources:
                reserve["releases"] = list(hit.sources)
            self.filter.store.append("reserve", reserve, self.analyst, synced=False)
            log.info("served query %s from release %d", digest, hit.release_seq)
            released = publish(plan, hit.noisy)
            out = self._result(plan, released, None, hit.release_seq, hit.noisy.diagnosis)
            note = {"member": FAMILY_SERVED, "family": FAMILY_DERIVED}.get(hit.source)
            if hit.source == "releases":
                note = ASSEMBLED.format(seqs=", ".join(map(str, hit.sources)))
            elif note is None and hit.derived:
                note = DERIVED
            if note is not None:
                return replace(out, note=note.format(seq=hit.release_seq))
            return out
        # Charge first: nothing runs unless the budget admits it, and the charge is durable
        # before the engine starts (a crash after it loses budget, never privacy).
        charge = self.filter.charge(plan.event, canonical, self.analyst, details)
        log.info(
            "charged query %s: epsilon=%s delta=%s analyst=%s",
            digest, decimal_text(plan.epsilon), decimal_text(plan.delta), self.analyst,
        )  # fmt: skip
        return self._run_charged(plan, k, charge)

    def _run_charged(self, plan: Plan, k: cache.Keys, charge: Charge) -> Result:
        """Run, noise, cache and publish ``plan``, whose loss ``charge`` has already committed
        (alone, or within a workload's one charge)."""
        canonical = plan.query
        digest = hashlib.sha256(canonical.encode()).hexdigest()[:12]
        try:
            _, rows = self.engine.run(plan.engine_sql)
            noisy = measure(plan, rows)
            if plan.diagnosis is not None:
                # Charged with the query above, in its one event: released only after it.
                _, patterns = self.engine.run(plan.diagnosis.engine_sql)
                noisy = replace(noisy, diagnosis=measure_diagnosis(plan.diagnosis, patterns))
        except (EngineError, MemoryError) as exc:
            raise self._failed(charge, getattr(exc, "cause", None) or type(exc).__name__) from None
        except KeyboardInterrupt:  # the shell's Ctrl-C: recorded, then left to the shell
            self._failed(charge, "KeyboardInterrupt")
            raise
        self.cache.record(plan, k, noisy, charge.seq, canonical)
        try:
            released = publish(plan, noisy)
        except (EngineError, MemoryError):
            raise self._failed(charge, "post-processing") from None
        log.info("released query %s: %d row(s)", digest, len(released.rows))
        return self._result(plan, released, charge, None, noisy.diagnosis)

    def _failed(self, charge: Charge, cause: str) -> EngineError:
        """The one error of a failure after the charge, which stays (whether the engine failed
        can depend on the data). The cause goes to a ``failure`` record, for the owner only;
        the record changes no budget."""
        log.warning("the query of charge %d failed after it: %s", charge.seq, cause)
        try:
            self.filter.store.append(
                "failure", {"charge": charge.seq, "cause": cause}, self.analyst
            )
        except (LedgerError, MemoryError) as error:
            log.error("the failure of charge %d is not recorded: %s", charge.seq, error)
        return EngineError()

    @staticmethod
    def _result(
        plan: Plan,
        released: Release,
        charge: Charge | None,
        cached: int | None,
        cells: tuple[int, ...] | None = None,
    ) -> Result:
        diagnosed = None
        if plan.diagnosis is not None and cells is not None:
            diagnosed = diagnose(plan.diagnosis, cells, plan.options.confidence)
        return Result(
            columns=released.columns,
            types=released.types,
            rows=released.rows,
            accuracy=released.accuracy,
            confidence=released.confidence,
            plan=plan,
            charge=charge,
            cached_from=cached,
            diagnosis=diagnosed,
        )

    def _details(self, plan: Plan) -> dict[str, object]:
        """What the ledger keeps beside a charge, so that a report can be reproduced later."""
        # The plan's lines without its bounded SQL (kept below as the engine runs it), since
        # parsing and pretty-printing the bounded SQL costs some 5 ms.
        header = plan.explain(sql=False)
        return {
            "plan": [line for line in header if not line.startswith("  ")],
            "bounded_sql": plan.engine_sql,
            **({"diagnosis_sql": plan.diagnosis.engine_sql} if plan.diagnosis is not None else {}),
            "engine": self.engine.name,  # the bounded SQL is DuckDB's; Spark runs its lowering
            "policy_version": self.policy_version(),
            "data_version": self.policy.dataset.data_version,
            "dpsql_version": VERSION,
        }

    def budget(self) -> BudgetReport:
        """A frozen report of the spent and remaining budget."""
        return self.filter.report(self.analyst)

    def close(self) -> None:
        self.engine.close()
