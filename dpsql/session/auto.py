"""Bounds chosen per query in a session (``dpsql.plan.auto``): which a query needs, its plan, and
its release.

``placeholders`` fills the clamps a query may choose with the widest candidates, so that the
query can be analysed and planned before anything is chosen; ``plan_auto`` decides, from the
analysis and the options alone (public facts), which bounds the query needs that nothing
declares, refuses what ``auto`` does not cover, and plans the answer at the top candidates (the
noise there is the largest any choice gives: checked samplable before the charge) with the
charged event of ``AutoBounds.event``. ``AutoRequest`` then runs the walks after the charge,
plans the answer again with the values chosen, and releases both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from sqlglot import exp

from dpsql.accounting.budget.report import Charge
from dpsql.analyze.analysis import Analysis
from dpsql.analyze.scope import NUMERIC, Catalog
from dpsql.analyze.units import unit_source
from dpsql.bound.estimates import TOP_INDEX, candidate, extremes_query
from dpsql.bound.selection import selection_query
from dpsql.bound.shape import public_size
from dpsql.engine.base import Engine
from dpsql.errors import (
    BoundsError,
    DpsqlError,
    EngineError,
    InternalError,
    UndeclaredMechanismError,
    UnsupportedQueryError,
)
from dpsql.mechanisms.laplace import MAX_SCALE
from dpsql.noise.measure import Noisy, measure
from dpsql.plan.auto import (
    ALL_GROUPS,
    CLAMPS,
    GROUPS,
    ROWS,
    ROWS_PER_GROUP,
    TOP,
    AutoBounds,
    Choice,
    noise_per_unit,
)
from dpsql.plan.plans import Plan, QueryOptions
from dpsql.policy import ColumnSpec, Policy
from dpsql.release import auto_bounds
from dpsql.release.post import publish
from dpsql.release.result import Result
from dpsql.session.effective import Settings
from dpsql.session.pipeline import Pipeline, QueryRequest, result
from dpsql.sql.parse import DIALECT

WIDEST = (candidate(0), candidate(TOP_INDEX))  # ±2^52: every clamp candidate lies within


def wanted(settings: Settings, policy: Policy) -> bool:
    """Whether any bound may be chosen at all (the fast path skips everything here)."""
    return settings.bounds == "auto" or any(t.bounds is not None for t in policy.tables.values())


def _may(settings: Settings, policy: Policy, table: str, name: str) -> bool:
    spec = policy.tables.get(table)
    return settings.bounds == "auto" or (spec is not None and spec.auto(name))


def placeholders(
    policy: Policy,
    settings: Settings,
    catalog: Mapping[str, Mapping[str, str]],
    named: frozenset[str],
) -> tuple[Policy, frozenset[tuple[str, str]]]:
    """``policy`` with the widest clamps for every numeric column the statement names
    (``named``) that declares none, in each private table whose clamps may be chosen, and which
    (table, column) were filled. A statement naming no such column is analysed once, as
    without ``auto``."""
    tables = dict(policy.tables)
    filled = set()
    for name, spec in policy.tables.items():
        if not spec.is_private or not _may(settings, policy, name, CLAMPS):
            continue
        columns = dict(spec.columns)
        for raw, ctype in catalog.get(name, {}).items():
            column = raw.lower()
            declared = columns.get(column)
            numeric = ctype.lower() in NUMERIC or ctype.lower().startswith("decimal")
            if not numeric or column == spec.privacy_unit or column not in named:
                continue
            if declared is not None and declared.bounds is not None:
                continue
            base = declared or ColumnSpec()
            columns[column] = base.model_copy(update={"lower": WIDEST[0], "upper": WIDEST[1]})
            filled.add((name, column))
        tables[name] = spec.model_copy(update={"columns": columns})
    if not filled:
        return policy, frozenset()
    return policy.model_copy(update={"tables": tables}), frozenset(filled)


def with_chosen(policy: Policy, chosen: Mapping[str, object]) -> Policy:
    """``policy`` with the chosen clamps of ``table.column`` (post-processing of the walks)."""
    tables = dict(policy.tables)
    for name, value in chosen.items():
        if "." not in name or not isinstance(value, tuple):
            continue
        table, column = name.split(".", 1)
        spec = tables[table]
        base = spec.columns.get(column) or ColumnSpec()
        col = base.model_copy(update={"lower": value[0], "upper": value[1]})
        tables[table] = spec.model_copy(update={"columns": {**spec.columns, column: col}})
    return policy.model_copy(update={"tables": tables})


@dataclass(frozen=True)
class Needs:
    """The bounds a query needs that nothing declares, by name, and its clamped columns."""

    bounds: tuple[str, ...]
    clamps: tuple[tuple[str, str], ...]


def needs(analysis: Analysis, options: QueryOptions, filled: frozenset[tuple[str, str]]) -> Needs:
    """What the query needs chosen: from the analysis and the options (public facts)."""
    bounds: list[str] = []
    capped = options.max_rows_per_unit is not None
    if not analysis.keys:
        if options.max_rows_per_unit_per_group is None and not capped:
            bounds.append(ROWS)
    else:
        if options.max_groups_per_unit is None and not capped:
            bounds.append(GROUPS)
        if options.max_rows_per_unit_per_group is None and not capped:
            bounds.append(ROWS_PER_GROUP)
    clamps = []
    tables = {t.lower() for t in analysis.tables}
    for agg in analysis.aggregates:
        if agg.arg is None or agg.bounds is None:
            continue
        names = {c.name.lower() for c in agg.arg.find_all(exp.Column)}
        for table, column in sorted(filled):
            if table in tables and column in names:
                if agg.kind == "quantile":  # MEDIAN, MIN, MAX, PERCENTILE_* too
                    raise BoundsError(
                        f"a quantile (MEDIAN, MIN, MAX) over {column} needs declared bounds: they "
                        "keep their own clamps (dpsql.bounds = auto chooses those of sums and "
                        "averages); declare lower/upper in the policy"
                    )
                if (table, column) not in clamps:
                    clamps.append((table, column))
    return Needs(tuple(bounds), tuple(clamps))


def stray(
    analysis: Analysis, filled: frozenset[tuple[str, str]], n: Needs, referenced: frozenset[str]
) -> None:
    """A join or subquery reading a column whose clamps would be chosen, other than as the
    argument of its own SUM or AVG (say, through a per-unit subquery's SUM): its bounds would
    be the widest candidates, not a choice. Refused, as without ``auto``."""
    if analysis.base:
        return
    tables = {t.lower() for t in analysis.tables}
    for table, column in sorted(filled):
        if table in tables and column in referenced and (table, column) not in n.clamps:
            raise BoundsError(
                f"column {column} has no lower/upper bound in the policy, and dpsql.bounds = "
                "auto chooses only the clamps of the columns a top-level SUM, AVG or variance "
                "reads; declare them"
            )


def refuse(options: QueryOptions, settings: Settings, sampled: bool, n: Needs) -> None:
    """What ``auto`` does not cover, refused on public facts before anything is charged."""
    what = ", ".join([*n.bounds, *(f"{t}.{c}" for t, c in n.clamps)])
    if options.declared is not None:
        raise UndeclaredMechanismError(
            f"choosing {what} is a sparse vector release, and the pld filter admits only its "
            "declared mechanism: declare the bounds in the policy instead"
        )
    if options.mechanism != "laplace":
        raise UnsupportedQueryError(
            f"bounds chosen per query ({what}) work with the laplace mechanism only; declare "
            "them or SET dpsql.mechanism = laplace"
        )
    if sampled:
        raise UnsupportedQueryError(f"a sampled query cannot choose its bounds ({what}); "
                                    "declare them")  # fmt: skip
    if settings.target is not None:
        raise UnsupportedQueryError(
            f"an accuracy target needs known bounds ({what} are chosen per query); declare them"
        )
    if options.diagnose and options.diagnose_asked:
        raise UnsupportedQueryError(
            "bounds chosen per query are not diagnosed (they aim at cutting few units); "
            "SET dpsql.diagnose = off"
        )


def opted_in(settings: Settings, policy: Policy, analysis: Analysis, n: Needs) -> bool:
    """Every bound the query needs is one the session or the table's policy leaves to dpsql."""
    table = analysis.spec
    ok = settings.bounds == "auto" or all(table.auto(name) for name in n.bounds)
    return ok and all(_may(settings, policy, t, CLAMPS) for t, _ in n.clamps)


def with_bounds(options: QueryOptions, values: Mapping[str, object]) -> QueryOptions:
    """``options`` with the contribution bounds among ``values`` (by name) set."""

    def get(name: str, default: int | None) -> int | None:
        value = values.get(name, default)
        return value if isinstance(value, int) else default

    return replace(
        options,
        max_rows_per_unit=get(ROWS, options.max_rows_per_unit),
        max_groups_per_unit=get(GROUPS, options.max_groups_per_unit),
        max_rows_per_unit_per_group=get(ROWS_PER_GROUP, options.max_rows_per_unit_per_group),
    )


def answer_options(options: QueryOptions, n: Needs, share: Fraction) -> QueryOptions:
    """The answer's options at the top candidates, at (1 - share) of the epsilon."""
    top = dict.fromkeys(n.bounds, TOP)
    answer = replace(options, epsilon=options.epsilon * (1 - share), diagnose=False)
    return with_bounds(answer, top)


def plan_choices(
    plan: Plan, n: Needs, share: Fraction, epsilon: Fraction, policy: Policy, *, catalog: Catalog
) -> AutoBounds:
    """The public plan of the choices of ``plan`` (planned at the top candidates)."""
    a = plan.analysis
    kinds = {m.spec.kind for m in plan.measurements}
    only_units = kinds <= {"units"}
    groups = public_size(a.keys)
    # A query that measures distinct units only: no total depends on R or C (1, free).
    fixed = [(b, 1) for b in n.bounds if only_units and b != GROUPS]
    wanted_bounds = [b for b in n.bounds if not (only_units and b != GROUPS)]
    if GROUPS in wanted_bounds and groups is not None and groups <= ALL_GROUPS:
        fixed.append((GROUPS, groups))  # every public key combination: a public fact, free
        wanted_bounds.remove(GROUPS)
    count = len(wanted_bounds) + len(n.clamps)
    selection = epsilon * share if count else Fraction(0)
    each = selection / count if count else Fraction(0)
    cells = groups is not None and groups <= ALL_GROUPS
    choices = []
    for bound in wanted_bounds:
        if bound == ROWS_PER_GROUP and cells:
            assert groups is not None
            choices.append(Choice(bound, each, "cells", groups))
        else:
            choices.append(Choice(bound, each))
    clamp_sql = []
    for table, column in n.clamps:
        choices.append(Choice(CLAMPS, each, table=table, column=column))
        # The column's units as the query bounds them (through a unit path if it has one).
        source, unit = unit_source(policy, catalog, table, [column])
        clamp_sql.append(extremes_query(unit, source, column).sql(dialect=DIALECT))
    laplace = [e.epsilon for e in plan.event.events if e.epsilon > 0]
    sql = None
    if any(c.bound != CLAMPS for c in choices):
        assert plan.bounding is not None
        sql = selection_query(a, plan.bounding, bool(a.keys))
    auto = AutoBounds(
        share=share if count else Fraction(0),
        epsilon=selection,
        answer_epsilon=plan.event.epsilon,
        choices=tuple(choices),
        fixed=tuple(fixed),
        groups=groups,
        noise=noise_per_unit(laplace or [plan.event.epsilon]),
        sql=sql,
        clamp_sql=tuple(clamp_sql),
    )
    if any(s > MAX_SCALE for s in auto_bounds.scales(auto)):
        raise BoundsError(
            "the noise of the bound choices would be too large to sample exactly at this "
            "epsilon; raise dpsql.epsilon or dpsql.bounds_share"
        )
    return auto


class AutoRequest(QueryRequest):
    """A SELECT whose bounds are chosen after its charge: the walks, the answer planned again
    at the chosen values, its noise; served again (free) from the release it recorded, with the
    values recorded there."""

    def __init__(
        self,
        plan: Plan,
        keys: Any,
        details: Mapping[str, object],
        replan: Callable[[Mapping[str, object]], Plan],
        **kwargs: Any,
    ) -> None:
        super().__init__(plan, keys, details, **kwargs)
        self.replan = replan
        self.answered: Plan | None = None
        self.chosen: dict[str, object] = {}

    def lookup(self, pipeline: Pipeline) -> Result | None:
        if self.fresh:
            return None
        found = pipeline.cache.lookup_auto(self.keys)
        if found is None:
            return None
        noisy, seq, chosen = found
        plan = self.replan(chosen)
        # Serving a released answer again is post-processing: recorded, never charged.
        pipeline.reserve(self.plan.query, seq)
        released = publish(plan, noisy)
        out = result(plan, released, None, seq, None)
        return replace(out, bounds_note=auto_bounds.describe(chosen))

    def measure(self, engine: Engine) -> Noisy:
        auto = self.plan.auto
        assert auto is not None
        rows: Sequence[tuple[Any, ...]] = []
        if auto.sql is not None:
            _, rows = engine.run(auto.sql)
        clamp_rows = [engine.run(sql)[1] for sql in auto.clamp_sql]
        chosen = {**auto_bounds.choose(auto, rows, clamp_rows)}
        try:
            plan = self.replan(chosen)
        except DpsqlError as exc:
            # A function of the released choice alone, after the charge: the charge stands and
            # the cause goes to the ledger for the owner, as for any failure after it.
            raise EngineError(cause=f"auto bounds: {type(exc).__name__}") from None
        # Any chosen bounds give an answer of the charged epsilon and delta (dpsql.plan.auto).
        if (plan.event.epsilon, plan.event.delta) != (auto.answer_epsilon, self.plan.delta):
            raise InternalError("the answer at the chosen bounds is not the one charged")
        _, answer_rows = engine.run(plan.engine_sql)
        self.answered, self.chosen = plan, chosen
        return measure(plan, answer_rows)

    def record(self, pipeline: Pipeline, charge: Charge, measured: Noisy) -> None:
        assert self.answered is not None
        pipeline.cache.record_auto(self.keys, measured, charge.seq, self.plan.query, self.chosen,
                                   self.answered.engine_sql)  # fmt: skip

    def publish(self, pipeline: Pipeline, charge: Charge, measured: Noisy) -> Result:
        plan = self.answered
        assert plan is not None
        try:
            released = publish(plan, measured)
        except MemoryError:
            raise pipeline.failed(charge, "post-processing") from None
        out = result(plan, released, charge, None, None)
        return replace(out, bounds_note=auto_bounds.describe(self.chosen))


__all__ = [
    "AutoRequest",
    "Needs",
    "answer_options",
    "needs",
    "opted_in",
    "placeholders",
    "plan_choices",
    "refuse",
    "stray",
    "wanted",
    "with_bounds",
    "with_chosen",
]
