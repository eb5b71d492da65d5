"""The one orchestrator: parse -> validate -> analyze -> plan -> check -> charge -> execute ->
noise -> release. Every interface (DB-API, CLI, later the shell and the server) is a thin face
over ``Session``.

Every step before the charge is a pure function of the query, the policy, the settings and the
catalog; the charge is committed before the engine runs, so a crash after it loses budget,
never privacy. A rejected query is never charged.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

from dpsql import bounds, cache
from dpsql.accounting.filter import BudgetReport, Charge, budget_for, open_store
from dpsql.engine.duckdb import DuckDBEngine
from dpsql.errors import (
    BoundsError,
    EngineError,
    LedgerError,
    ParameterError,
    PolicyError,
    UnsupportedQueryError,
)
from dpsql.interfaces import frames
from dpsql.noise.release import (
    Release,
    accuracy_columns,
    check_post_processing,
    check_samplable,
    measure,
    publish,
)
from dpsql.plan.planner import Plan, QueryOptions, plan_query
from dpsql.policy import (
    MAX_CONTRIBUTION_BOUND,
    MAX_QUERY_EPSILON,
    ColumnSpec,
    Policy,
    TableSpec,
    check_against_schema,
    check_delta,
    check_epsilon,
    load_policy,
    to_fraction,
)
from dpsql.sql.analyze import Analysis, analyze
from dpsql.sql.cells import Cell
from dpsql.sql.domains import probe_sql
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
    parse_select,
    parse_statement,
)
from dpsql.sql.rewrite import key_sql, literal_sql
from dpsql.sql.validate import validate

log = logging.getLogger("dpsql")
VERSION = "0.1.0"

SETTINGS = (
    "epsilon",
    "delta",
    "max_groups_per_unit",
    "max_rows_per_unit_per_group",
    "max_rows_per_unit",
    "confidence",
    "mechanism",
    "rho",
    "sigma",
    "fresh",
    "accuracy_columns",
)
# A per-query rho above this is refused as absurd (it certifies epsilon > 20 at any delta).
MAX_QUERY_RHO = Fraction(10)
# sigma is a noise multiplier (noise standard deviation per unit of L2 sensitivity).
MAX_NOISE_MULTIPLIER = Fraction(10**6)
DEFAULT_CONFIDENCE = 0.95
# Plans a session keeps for statements it sees again, the oldest dropped first.
MAX_KEPT_PLANS = 256
# Values a plan key may hold: with their type name, they identify the input exactly.
_KEYABLE = (type(None), bool, int, float, str, Fraction)


@dataclass(frozen=True)
class Planned:
    """A statement planned once, kept under its ``Session.plan_key``: everything before the
    check that a repeat of the same key may reuse. Never a charge, never noise: each fresh
    answer is still checked, charged and noised on its own."""

    explain: bool
    plan: Plan
    keys: cache.Keys
    details: Mapping[str, object]


def _keyable(values: Sequence[object] | Mapping[str, object] | None) -> tuple[object, ...] | None:
    """``values`` as a hashable tuple that tells any two inputs apart (each value with its type
    name; a float by its repr, since -0.0 == 0.0), or None when one value is of a type outside
    ``_KEYABLE`` (the plan is then not kept). No value is converted to decimal text: a huge
    integer is refused by validation later, not here."""
    if values is None:
        return ()
    named: list[tuple[str | None, object]] = (
        sorted(values.items()) if isinstance(values, Mapping) else [(None, v) for v in values]
    )
    if any(type(value) not in _KEYABLE for _, value in named):
        return None
    return tuple(
        (name, type(value).__name__, repr(value) if isinstance(value, float) else value)
        for name, value in named
    )


@dataclass(frozen=True)
class Result:
    """What one statement returns: a table (possibly empty) and, for queries, the plan."""

    columns: tuple[str, ...]
    types: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    accuracy: tuple[tuple[float | None, ...], ...] = ()
    confidence: float | None = None
    plan: Plan | None = None
    charge: Charge | None = None
    message: str = ""
    cached_from: int | None = None  # the ledger record of the release served again, if any

    def __repr__(self) -> str:
        shown = ", ".join(self.columns[:6]) + (", ..." if len(self.columns) > 6 else "")
        what = f"{len(self.rows)} row(s) of {shown}" if self.columns else self.message or "empty"
        return f"<Result: {what}; {frames.summary(self)}>"

    def _repr_html_(self) -> str:
        """A notebook's display: the values with their ±, and the cost."""
        return frames.to_html(self)


def _positive_int(value: object, name: str) -> int:
    message = f"{name} must be an integer from 1 to {MAX_CONTRIBUTION_BOUND}"
    # to_fraction bounds the text before any arithmetic ("1e999999999" is refused unexpanded).
    number = to_fraction(value, name)
    if number.denominator != 1 or not 1 <= number <= MAX_CONTRIBUTION_BOUND:
        raise ParameterError(message)
    return int(number)


_TRUE, _FALSE = ("true", "on", "1", "yes"), ("false", "off", "0", "no")


def _boolean(value: object, name: str) -> bool:
    if isinstance(value, bool):
        return value
    # Only a word or 0/1 is read: str() of an arbitrary object (or of a 5,000-digit integer,
    # which raises ValueError) is never taken.
    if isinstance(value, int) and value in (0, 1):
        return value == 1
    text = value.strip().lower() if isinstance(value, str) and len(value) <= 16 else None
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ParameterError(f"{name} must be true or false")


def _confidence(value: object) -> float:
    message = "confidence must be a number in [0.5, 0.9999]"
    try:
        number = to_fraction(value, "confidence")
    except ParameterError:
        raise ParameterError(message) from None
    if not Fraction(1, 2) <= number <= Fraction(9999, 10000):
        raise ParameterError(message)
    return float(number)


def _mechanism(value: object) -> str:
    mechanism = value.strip().lower() if isinstance(value, str) and len(value) <= 16 else None
    if mechanism not in ("laplace", "gaussian"):
        raise ParameterError("mechanism must be 'laplace' or 'gaussian'")
    return mechanism


def _setting_name(name: object) -> str:
    """A setting's name as a message may show it: the user's text, cut short."""
    text = name if isinstance(name, str) else type(name).__name__
    return text if len(text) <= 64 else text[:61] + "..."


def check_setting(name: str, value: object) -> object:
    """Validate one per-query setting; returns its normalised value."""
    if name == "epsilon":
        return check_epsilon(value, "epsilon", MAX_QUERY_EPSILON)
    if name == "delta":
        return check_delta(value, "delta")
    if name in ("max_groups_per_unit", "max_rows_per_unit_per_group", "max_rows_per_unit"):
        return _positive_int(value, name)
    if name == "confidence":
        return _confidence(value)
    if name == "mechanism":
        return _mechanism(value)
    if name == "rho":
        return check_epsilon(value, "rho", MAX_QUERY_RHO)
    if name == "sigma":
        sigma = check_epsilon(value, "sigma", MAX_NOISE_MULTIPLIER)
        # Below this noise multiplier one measurement of sensitivity 1 alone costs more than
        # the largest per-query rho (rho = 1/(2 sigma^2)): refused as absurd, like that rho.
        if 2 * sigma * sigma * MAX_QUERY_RHO < 1:
            raise ParameterError(f"sigma must be at least sqrt(1/{2 * MAX_QUERY_RHO})")
        return sigma
    if name in ("fresh", "accuracy_columns"):
        return _boolean(value, name)
    raise ParameterError(
        f"unknown setting dpsql.{_setting_name(name)}; known: {', '.join(SETTINGS)}"
    )


class Session:
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
        self.engine = DuckDBEngine(self.policy, int(store.identity["salt"]), memory_limit)
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

    # -- settings ------------------------------------------------------------------------------
    def set_option(self, name: str, value: object) -> None:
        """``SET dpsql.name = value``; ``None`` resets to the policy default."""
        name = name.lower()
        if value is None:
            if name not in SETTINGS:
                raise ParameterError(f"unknown setting dpsql.{name}")
            self._settings.pop(name, None)
            return
        self._settings[name] = check_setting(name, value)

    def settings(self, overrides: Mapping[str, object] | None = None) -> dict[str, object]:
        """The effective settings: policy defaults, then SET values, then ``overrides``."""
        budget = self.policy.budget
        merged: dict[str, object] = {
            "epsilon": budget.query_epsilon,
            "delta": budget.query_delta,
            "max_groups_per_unit": None,
            "max_rows_per_unit_per_group": None,
            "max_rows_per_unit": None,
            "confidence": DEFAULT_CONFIDENCE,
            "mechanism": budget.mechanism,
            "rho": None,
            "sigma": None,
            "fresh": False,
            "accuracy_columns": False,
        }
        merged.update(self._settings)
        for name, value in (overrides or {}).items():
            if value is not None:
                merged[name] = check_setting(name, value)
        return merged

    def _options(self, settings: Mapping[str, object], spec: TableSpec) -> QueryOptions:
        epsilon, delta = settings["epsilon"], settings["delta"]
        groups = settings["max_groups_per_unit"] or spec.max_groups_per_unit
        rows = settings["max_rows_per_unit_per_group"] or spec.max_rows_per_unit_per_group
        total_rows = settings["max_rows_per_unit"] or spec.max_rows_per_unit
        confidence, mechanism = settings["confidence"], settings["mechanism"]
        rho, sigma = settings["rho"], settings["sigma"]
        # check_setting normalised every value; these asserts only narrow the types.
        assert isinstance(epsilon, Fraction) and isinstance(delta, Fraction)
        assert groups is None or isinstance(groups, int)
        assert rows is None or isinstance(rows, int)
        assert total_rows is None or isinstance(total_rows, int)
        assert isinstance(confidence, float)
        assert mechanism in ("laplace", "gaussian")
        assert rho is None or isinstance(rho, Fraction)
        assert sigma is None or isinstance(sigma, Fraction)
        if mechanism == "gaussian" and delta == 0:
            raise ParameterError("the gaussian mechanism needs delta > 0; SET dpsql.delta")
        if (rho is not None or sigma is not None) and mechanism != "gaussian":
            raise ParameterError("rho and sigma set the noise of the gaussian mechanism only")
        if rho is not None and sigma is not None:
            raise ParameterError("give rho or sigma, not both")
        return QueryOptions(
            epsilon, delta, groups, rows, confidence, mechanism, rho, sigma, total_rows
        )

    # -- planning --------------------------------------------------------------------------------
    def plan(self, sql: str, params: Sequence[object] | None = None, **options: object) -> Plan:
        """Plan a SELECT without running or charging anything (what EXPLAIN shows)."""
        planned = self.planned(sql, params, options)
        if planned is None:
            raise ParameterError("only a SELECT query can be planned")
        return planned.plan

    def policy_version(self) -> str:
        """The policy's content digest, computed once per policy object (a Policy is frozen)."""
        if self._version is None or self._version[0] is not self.policy:
            self._version = (self.policy, self.policy.version)
        return self._version[1]

    def plan_key(
        self,
        sql: str,
        params: Sequence[object] | None,
        options: Mapping[str, object],
        current: bool = True,
    ) -> tuple[object, ...] | None:
        """What a plan is a pure function of: the statement's text, its parameters and options,
        every SET value, the analyst, the policy's content digest, the data version the owner
        declares and the bounds estimated so far (the engine's key domains and cell keys are
        functions of the query and the schema, which the data version covers). None when a
        value cannot be keyed exactly: the statement is then planned afresh. ``current=False``
        keys on the bounds estimates read so far, without reading the ledger again (a caller
        planning many statements at once reads it once)."""
        # Only a list or tuple is read here: a generator would be used up before binding.
        bound = _keyable(params) if params is None or isinstance(params, list | tuple) else None
        given = _keyable(options)
        settings = _keyable(self._settings)
        if not isinstance(sql, str) or bound is None or given is None or settings is None:
            return None
        if current:
            self._effective_policy()  # reads bounds estimated since the last statement
        estimated = tuple(sorted((k, str(lo), str(hi)) for k, (lo, hi) in self._estimated.items()))
        data = self.policy.dataset.data_version
        return (sql, bound, given, settings, self.analyst, self.policy_version(), data, estimated)

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
        # version or a new bounds estimate each plan afresh (tests/test_plan_cache.py).
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
        settings = self.settings(merge_options(inline, options))
        bound = bind_parameters(select, params)
        validate(bound)
        policy = self._effective_policy() if estimates else self.policy
        analysis = self._engine_values(
            analyze(bound, policy, self.engine.catalog, self.engine.describe)
        )
        check_privacy_unit(inline, analysis.unit)
        options_ = self._options(settings, analysis.spec)
        plan = plan_query(analysis, options_, policy, query=bound.sql(dialect=DIALECT))
        check_samplable(plan)
        return plan

    def _check_soon(self, plan: Plan, soon: bool) -> Callable[[], None]:
        """Bind the bounded SQL and the post-processing: a query that cannot be typed is
        rejected before the charge, on the schema alone. The engine's part starts now; the
        function returned waits for it and binds the post-processing over the key types.

        Public keys carry the type the engine gave their expression (``_engine_values``),
        which the bounded SQL keeps (its keys come from the domain, cast to that type;
        ``tests/test_check_types.py``), so only a query with a key of no public domain needs
        the engine's DESCRIBE as well. ``soon``: in the engine's worker (else here and now)."""
        known = [key.engine_type for key in plan.analysis.keys]
        public = all(known)
        if soon:
            wait = self.engine.check_soon(plan.engine_sql, types=not public)
        else:
            described = self.engine.check(plan.engine_sql, types=not public)
            wait = lambda: described  # noqa: E731

        def finish() -> None:
            described = wait()
            types = [t for t in known if t is not None] if public else described[: len(known)]
            check_post_processing(plan, types)

        return finish

    def _engine_values(self, analysis: Analysis) -> Analysis:
        """What only the engine can say about a query's constants, asked before the check
        (reading no rows, so it depends on the query and the schema only): the key of the cell
        a WHERE pins (``dpsql.sql.cells``, on a connection without data; None composes
        sequentially), and each public key's type and domain as a set in that type
        (``dpsql.sql.domains``)."""
        cell = None
        if analysis.cell_predicate is not None:
            column, literal = analysis.cell_predicate
            text = self.engine.cell_key(analysis.table, column, literal)
            if text is not None:
                collation = self.engine.collations.get((analysis.table, column))
                cell = Cell(column, text, collation)
        keys = []
        for index, key in enumerate(analysis.keys):
            if not key.public:
                keys.append(key)
                continue
            expression = key_sql(analysis, index)
            ((_, engine_type),) = self.engine.describe(
                f"SELECT {expression} AS _k FROM {analysis.source}"
            )
            if engine_type.upper() == "NULL":
                raise UnsupportedQueryError(f"GROUP BY key {key.name} is NULL on every row")
            domain = key.domain
            if domain is not None:
                literals = [None if v is None else literal_sql(v) for v in domain]
                probe = probe_sql(analysis.source, expression, engine_type, literals)
                domain = tuple(self.engine.key_domain(probe))
                if not domain:
                    raise BoundsError(
                        f"the public domain of GROUP BY key {key.name} holds no value of the "
                        f"key's type {engine_type}"
                    )
            keys.append(replace(key, domain=domain, engine_type=engine_type))
        return replace(analysis, cell=cell, keys=tuple(keys))

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
        result = self._answer(plan, bool(settings["fresh"]), planned)
        return result if extra is None else _with_accuracy(result, extra)

    def _answer(self, plan: Plan, fresh: bool, planned: Planned | None = None) -> Result:
        canonical = plan.query
        digest = hashlib.sha256(canonical.encode()).hexdigest()[:12]
        # The cache keys and the ledger details are pure functions of the plan and the policy.
        version = self.policy_version()
        k = planned.keys if planned is not None else cache.keys(plan, self.policy, version)
        details = planned.details if planned is not None else self._details(plan)
        hit = None if fresh else self.cache.lookup(plan, k)
        if hit is not None:
            # Serving a released answer again is post-processing: recorded, never charged.
            self.filter.store.append(
                "reserve", {"query": canonical, "release": hit.release_seq}, self.analyst
            )
            log.info("served query %s from release %d", digest, hit.release_seq)
            return self._result(plan, publish(plan, hit.noisy), None, hit.release_seq)
        # Charge first: nothing runs unless the budget admits it, and the charge is durable
        # before the engine starts (a crash after it loses budget, never privacy).
        charge = self.filter.charge(plan.event, canonical, self.analyst, details)
        log.info(
            "charged query %s: epsilon=%s delta=%s analyst=%s",
            digest, plan.epsilon, plan.delta, self.analyst,
        )  # fmt: skip
        try:
            _, rows = self.engine.run(plan.engine_sql)
            noisy = measure(plan, rows)
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
        return self._result(plan, released, charge, None)

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
    def _result(plan: Plan, released: Release, charge: Charge | None, cached: int | None) -> Result:
        return Result(
            columns=released.columns,
            types=released.types,
            rows=released.rows,
            accuracy=released.accuracy,
            confidence=released.confidence,
            plan=plan,
            charge=charge,
            cached_from=cached,
        )

    # -- bounds estimated from the data ------------------------------------------------------
    def _estimate_bounds(self, statement: EstimateBounds, options: Mapping[str, object]) -> Result:
        """Two quantile releases on a fixed ladder give the bounds (``dpsql.bounds``); they are
        charged and cached like any query, then recorded for later queries to use."""
        sql = bounds.bounds_query(
            self.policy, self.engine.catalog, statement.table, statement.column
        )
        # On the declared policy: an earlier estimate must not clamp the values of a new one.
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

    def _details(self, plan: Plan) -> dict[str, object]:
        """What the ledger keeps beside a charge, so that a report can be reproduced later."""
        # The plan's lines without its bounded SQL (kept below as the engine runs it), since
        # parsing and pretty-printing the bounded SQL costs some 5 ms.
        header = plan.explain(sql=False)
        return {
            "plan": [line for line in header if not line.startswith("  ")],
            "bounded_sql": plan.engine_sql,
            "policy_version": self.policy_version(),
            "data_version": self.policy.dataset.data_version,
            "dpsql_version": VERSION,
        }

    def _show(self, name: str) -> Result:
        if name == "budget":
            report = self.budget()
            return Result(("budget",), ("VARCHAR",), ((str(report),),))
        settings = self.settings()
        if name == "all":
            rows = tuple((k, _show_value(settings[k])) for k in SETTINGS)
            return Result(("name", "setting"), ("VARCHAR", "VARCHAR"), rows)
        if name not in settings:
            raise ParameterError(
                f"unknown setting dpsql.{name}; known: {', '.join(SETTINGS)}, budget, all"
            )
        return Result((name,), ("VARCHAR",), ((_show_value(settings[name]),),))

    def budget(self) -> BudgetReport:
        """A frozen report of the spent and remaining budget."""
        return self.filter.report(self.analyst)

    def close(self) -> None:
        self.engine.close()


def _with_accuracy(result: Result, extra: Sequence[tuple[int, str]]) -> Result:
    """``result`` with a column of half-widths after each output that has them
    (``SET dpsql.accuracy_columns = on``): for clients that show columns only (psql, BI tools)."""
    after = {i: name for i, name in extra}
    columns: list[str] = []
    types: list[str] = []
    for i, (name, dtype) in enumerate(zip(result.columns, result.types, strict=True)):
        columns.append(name)
        types.append(dtype)
        if i in after:
            columns.append(after[i])
            types.append("DOUBLE")
    rows, accuracy = [], []
    for r, row in enumerate(result.rows):
        widths = result.accuracy[r] if r < len(result.accuracy) else ()
        out: list[Any] = []
        kept: list[float | None] = []
        for i, value in enumerate(row):
            width = widths[i] if i < len(widths) else None
            out.append(value)
            kept.append(width)
            if i in after:
                out.append(width)
                kept.append(None)  # a half-width column has none of its own
        rows.append(tuple(out))
        accuracy.append(tuple(kept))
    return replace(
        result,
        columns=tuple(columns),
        types=tuple(types),
        rows=tuple(rows),
        accuracy=tuple(accuracy),
    )


def _show_value(value: object) -> str:
    if value is None:
        return "(policy default)"
    if isinstance(value, Fraction):
        return str(float(value)) if value.denominator != 1 else str(value.numerator)
    return str(value)
