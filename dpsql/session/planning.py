"""The steps before the check: bind -> validate -> analyze -> probe -> plan -> the engine's bind.

Every step here is a pure function of the query, its settings, the policy and the schema (the
engine is asked only what it can say without reading a row): a query refused here reveals
nothing about the data and costs nothing. ``prepare`` makes the plan; ``check_soon`` has the
engine bind its bounded SQL (and the post-processing over the key types), so that a query that
cannot run is refused before the charge, not after.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from sqlglot import exp

from dpsql.analyze.analysis import Analysis
from dpsql.analyze.analyze import analyze
from dpsql.analyze.binds import provably_binds
from dpsql.analyze.sample import implemented, take_sample
from dpsql.analyze.scope import Catalog
from dpsql.engine.base import Engine
from dpsql.errors import UnsupportedQueryError
from dpsql.noise.measure import check_samplable
from dpsql.plan.planner import plan_query
from dpsql.plan.plans import Plan, QueryOptions
from dpsql.plan.targets import solve
from dpsql.policy import Policy
from dpsql.policy.files import FileSet
from dpsql.release.post import check_post_processing
from dpsql.session import auto
from dpsql.session.effective import Settings
from dpsql.session.probes import Probes
from dpsql.sql.dates import fold_intervals
from dpsql.sql.options import check_privacy_unit
from dpsql.sql.params import bind_parameters
from dpsql.sql.parse import DIALECT
from dpsql.sql.validate import validate

__all__ = ["check_soon", "files_read", "prepare"]

# The unit types a sample's PRF reads as one text per unit (dpsql.analyze.sample).
_SAMPLED_UNITS = frozenset(
    {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER",
     "UBIGINT", "UHUGEINT", "VARCHAR"}
)  # fmt: skip


def prepare(
    select: Any,
    params: Sequence[object] | None,
    *,
    settings: Settings,
    inline: Mapping[str, object],
    policy: Policy,
    probes: Probes,
    chosen: Mapping[str, object] | None = None,
) -> Plan:
    """The plan of a SELECT under ``settings`` and ``policy`` (with the bounds estimated so
    far), before the engine's check of its bounded SQL (``check_soon``). ``inline``: the
    statement's ``WITH DIFFERENTIAL_PRIVACY OPTIONS(...)``, whose privacy unit is checked
    against the table's."""
    engine = probes.engine
    # TABLESAMPLE is dpsql's to interpret, never the engine's (dpsql.analyze.sample).
    original = select
    select, sampled, sampled_tables = take_sample(select)
    # Constant date ± INTERVAL folded into its date (dpsql.sql.dates), then validated.
    bound = fold_intervals(bind_parameters(select, params))
    assert isinstance(bound, exp.Select)
    validate(bound)
    # Bounds a query may choose (dpsql.session.auto): clamps at their widest candidates, so
    # that it can be analysed before any is chosen; after the choice, at the chosen values.
    filled: frozenset[tuple[str, str]] = frozenset()
    analysed, named = policy, frozenset[str]()
    if auto.wanted(settings, policy):
        named = frozenset(c.name.lower() for c in bound.find_all(exp.Column))
        analysed, filled = auto.placeholders(policy, settings, engine.catalog, named)
        if chosen is not None:
            analysed = auto.with_chosen(analysed, chosen)
    analysis = probes.engine_values(
        analyze(bound, analysed, engine.catalog, engine.describe),
        other=settings.other_group,
        label=settings.other_label,
    )
    check_privacy_unit(inline, analysis.unit)
    options = settings.query_options(analysis.spec, policy)
    if auto.wanted(settings, policy):
        needs = auto.needs(analysis, options, filled)
        if (not needs.bounds and not needs.clamps) or not auto.opted_in(
            settings, policy, analysis, needs
        ):
            if filled:  # nothing to choose: the policy's own bounds (or its refusal)
                return prepare(original, params, settings=replace(settings, bounds="declared"),
                               inline=inline, policy=_declared(policy), probes=probes)  # fmt: skip
        else:
            rate = settings.sample_rate
            sampling = sampled is not None or (rate is not None and implemented(rate) < 1)
            auto.refuse(options, settings, sampling, needs)
            auto.stray(analysis, filled, needs, named)
            args = (original, params, settings, inline, policy, probes)
            return _auto_plan(analysis, options, needs, analysed, bound=bound, args=args,
                              chosen=chosen, catalog=engine.catalog)  # fmt: skip
    rate = sampled if sampled is not None else settings.sample_rate
    if rate is not None and implemented(rate) < 1:
        clause = sampled_tables if sampled is not None else None
        check_sample(engine, analysis, policy, clause)
        options = replace(options, sample=rate, sample_scale=settings.sample_scale)
    target = settings.target
    lines: list[str] = []
    if target is not None:
        # The cheapest epsilon that meets the target, from public quantities only.
        options, lines = solve(analysis, options, policy, target)
    plan = plan_query(analysis, options, policy, query=bound.sql(dialect=DIALECT))
    if lines:
        plan = replace(plan, targets=tuple(lines))
    if engine.name != "duckdb":  # EXPLAIN shows the SQL this engine runs
        plan = replace(plan, shown=engine.shown_sql)
    elif rate is None and provably_binds(bound, engine.catalog.get(analysis.table.lower(), {})):
        plan = replace(plan, binds=True)
    check_samplable(plan)
    return plan


def _declared(policy: Policy) -> Policy:
    """``policy`` with no table's bounds left to dpsql: what a query that chooses none runs."""
    tables = {n: t.model_copy(update={"bounds": None}) if t.bounds is not None else t
              for n, t in policy.tables.items()}  # fmt: skip
    return policy.model_copy(update={"tables": tables})


def _auto_plan(
    analysis: Analysis,
    options: QueryOptions,
    needs: auto.Needs,
    analysed: Policy,
    *,
    bound: Any,
    args: tuple[Any, Any, Settings, Mapping[str, object], Policy, Probes],
    chosen: Mapping[str, object] | None,
    catalog: Catalog,
) -> Plan:
    """The plan of a query that chooses bounds: at the top candidates, with the choices' plan
    and the charged event (``chosen`` None); else the answer at the chosen values."""
    original, params, settings, inline, policy, probes = args
    share = settings.bounds_share
    answer = auto.answer_options(options, needs, share)
    query = bound.sql(dialect=DIALECT)
    if chosen is not None:
        plan = plan_query(analysis, auto.with_bounds(answer, chosen), analysed, query=query)
        check_samplable(plan)
        return plan
    plan = plan_query(analysis, answer, analysed, query=query)
    check_samplable(plan)  # the top candidates: the most noise any choice gives
    planned = auto.plan_choices(plan, needs, share, options.epsilon, policy, catalog=catalog)
    if not planned.choices:
        # Nothing to walk (L0 every public combination, or distinct units only): the answer
        # takes the whole epsilon at those fixed values.
        whole = auto.with_bounds(replace(answer, epsilon=options.epsilon), dict(planned.fixed))
        plan = plan_query(analysis, whole, analysed, query=query)
        check_samplable(plan)
        return plan

    def replan(values: Mapping[str, object]) -> Plan:
        return prepare(original, params, settings=settings, inline=inline, policy=policy,
                       probes=probes, chosen=values)  # fmt: skip

    return replace(plan, auto=planned, event=planned.event(plan.event), replan=replan)


def check_sample(
    engine: Engine,
    analysis: Analysis,
    policy: Policy,
    clause: tuple[tuple[str, bool], ...] | None,
) -> None:
    """A unit-level sample samples every private table the query reads (a clause on some of
    them only is refused), and needs a unit with one text per unit: an integer, or a string
    compared byte by byte (under a collation two texts are one unit, and would be sampled
    apart).

    Every row of the query's relation belongs to one unit and depends only on that unit's rows
    (``dpsql.analyze.relations``), so keeping the relation's rows of the sampled units is the
    query on the sample of every private table: the filter reads ``_u`` once."""
    private = {t.lower() for t in analysis.tables if not policy.tables[t.lower()].public}
    # With TABLESAMPLE, every private table the query reads carries it: each occurrence in the
    # outer FROM and JOINs, and none read inside a subquery without it. A table read only
    # through a sampled table's unit path is sampled with it: the sample keeps resolved units.
    sampled = {name for name, on in clause or () if on}
    bare = {name for name, on in clause or () if not on}
    written = sampled | bare
    private -= {
        link.table
        for t in sampled
        for link in policy.tables[t].unit_path
        if link.table not in written
    }
    if clause is not None and (private & bare or not private <= sampled):
        raise UnsupportedQueryError(
            "TABLESAMPLE must sample every private table the query reads, at one rate "
            f"({', '.join(sorted(private))}): one sample of the units for all of them"
        )
    kind = analysis.columns.get(analysis.unit, "") or analysis.columns.get(
        analysis.unit.lower(), ""
    )
    roots = {policy.unit_table(t) for t in private}
    collated = any(
        engine.collations.get((t, str(policy.tables[t].privacy_unit).lower())) for t in roots
    )
    if kind.upper() not in _SAMPLED_UNITS or (kind.upper() == "VARCHAR" and collated):
        raise UnsupportedQueryError(
            f"a unit-level sample needs a privacy unit of integer or plain text type, not "
            f"{kind or 'unknown'}{' with a collation' if collated else ''}"
        )


def files_read(engine: Engine, plan: Plan) -> FileSet:
    """The files the plan's bounded SQL (and its diagnosis) reads, as the engine bound them:
    those of the relation's tables and of a public table a key's domain comes from (a subquery
    outside FROM is refused). Fixed here, checked before the charge (``Pipeline.charge``)."""
    a = plan.analysis
    domains = (key.domain_table[0] for key in a.keys if key.domain_table is not None)
    return engine.files.only({a.table, *a.tables, *domains})


def check_soon(engine: Engine, plan: Plan, soon: bool) -> Callable[[], list[str]]:
    """Bind the bounded SQL and the post-processing: a query that cannot be typed is rejected
    before the charge, on the schema alone. The engine's part starts now; the function returned
    waits for it and binds the post-processing over the key types.

    Public keys carry the type the engine gave their expression (``Probes.engine_values``),
    which the bounded SQL keeps (its keys come from the domain, cast to that type;
    ``tests/analyze/test_check_types.py``), so only a query with a key of no public domain needs
    the engine's DESCRIBE as well. ``soon``: in the engine's worker (else here and now)."""
    known = [key.engine_type for key in plan.analysis.keys]
    public = all(known)
    if plan.binds and public:
        # Sure to plan (dpsql.analyze.binds), and every key's type known: no engine check.
        wait: Callable[[], list[str]] = lambda: []  # noqa: E731
    elif soon:
        wait = engine.check_soon(plan.engine_sql, types=not public)
    else:
        described = engine.check(plan.engine_sql, types=not public)
        wait = lambda: described  # noqa: E731

    def finish() -> list[str]:
        described = wait()
        types = [t for t in known if t is not None] if public else described[: len(known)]
        check_post_processing(plan, types)
        if plan.diagnosis is not None:
            # The diagnosis's SQL binds before the charge too, on the schema alone, as the
            # engine will run it.
            d = plan.diagnosis
            engine.check(d.together_sql if engine.shares_rows else d.engine_sql, types=False)
        return types

    return finish
