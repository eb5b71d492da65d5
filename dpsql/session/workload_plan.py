"""Planning a file of statements: each statement's step, decided before anything runs.

``plan_file`` plans every statement of a file in order (a ``SET`` applied for the statements
after it) and admits the charges on a trial budget over a copy of the ledger's records, with
the budget's own filter: a ``Step`` says whether a statement is free, charged, served from the
release cache, or refused because it does not fit. ``plan_lines`` is that plan as ``dpsql run``
prints it. Nothing here charges or runs anything; the commands are in ``batch.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any, Protocol

from dpsql.accounting.budget.budget import Budget
from dpsql.accounting.budget.periods import PeriodCharge
from dpsql.cache.families import family_key, released_family
from dpsql.cache.releases import ReleaseCache
from dpsql.engine.base import Engine
from dpsql.errors import (
    BudgetExceededError,
    DpsqlError,
    InputError,
    InternalError,
    ParseError,
    UnsupportedQueryError,
)
from dpsql.mechanisms.events import Composite, Event
from dpsql.plan.diagnosis import without_default
from dpsql.plan.plans import Plan
from dpsql.plan.workload.family import Family, Joint
from dpsql.plan.workload.joint import plan_joint
from dpsql.policy import Policy
from dpsql.session import planning
from dpsql.session.bounds import Estimates
from dpsql.session.effective import Settings, SetValues
from dpsql.session.pipeline import Pipeline
from dpsql.session.plans import Planned
from dpsql.session.steps import Step, blocks_read, kind_of
from dpsql.sql.parse import (
    EstimateBounds,
    SetOption,
    parse_statement,
)
from dpsql.sql.split import Piece

__all__ = [
    "MAX_STATEMENTS",
    "Session",
    "Step",
    "Workload",
    "blocks_read",
    "bounded_at",
    "one_line",
    "plan_file",
    "plan_workload",
    "statement_totals",
]


# Statements in one file planned as a workload (``dpsql run``).
MAX_STATEMENTS = 20_000


class Session(Protocol):
    """What planning and running a workload reads of ``dpsql.session.session.Session``."""

    policy: Policy
    analyst: str | None
    engine: Engine
    cache: ReleaseCache
    filter: Budget
    pipeline: Pipeline
    estimates: Estimates
    set_values: SetValues

    def policy_version(self) -> str: ...

    def settings(self, options: Mapping[str, object] | None = None) -> Settings: ...

    def set_option(self, name: str, value: object) -> None: ...

    def execute(
        self, sql: str, params: Sequence[object] | None = None, **options: object
    ) -> Any: ...

    def planned_soon(
        self,
        sql: str,
        params: Sequence[object] | None,
        options: Mapping[str, object],
        current: bool = True,
        statement: Any = None,
        *,
        soon: bool = True,
    ) -> Callable[[], Planned] | None: ...

    def apart(
        self,
        sql: str,
        params: Sequence[object] | None,
        options: Mapping[str, object],
        planned: Planned,
        moments: str = "separate",
    ) -> Planned: ...

    def _prepare(
        self,
        select: Any,
        params: Sequence[object] | None,
        options: Mapping[str, object],
        inline: Mapping[str, object] = ...,
        estimates: bool = True,
    ) -> Plan: ...

    def budget(self) -> Any: ...


@dataclass(frozen=True)
class Workload:
    """A file planned as one workload: its steps, the families of its joint plan, and the one
    event the filter admits for all of it (None: nothing to charge)."""

    steps: tuple[Step, ...]
    joint: Joint
    event: Composite | None
    fits: bool  # whether the filter admits ``event`` now (on a copy of the ledger)
    independent: tuple[Fraction, Fraction]  # the sum of the independent plans' costs
    # Families released before (the fine statement's index -> the ledger record): served
    # again, free, by post-processing of the measurements kept there.
    released: Mapping[int, int] = field(default_factory=dict)


def plan_file(session: Session, pieces: Sequence[Piece]) -> list[Step]:
    """The steps of ``plan_workload`` (without ``--partial``)."""
    return list(plan_workload(session, pieces).steps)


def plan_workload(session: Session, pieces: Sequence[Piece]) -> Workload:
    """Plan every statement, then the file as one workload (``dpsql.plan.workload.family``), and
    admit its one event on a copy of the budget. When it does not fit, the longest prefix of
    statements whose own joint plan fits is planned, its steps after it "refused" (``--partial``
    runs it; without, nothing runs). Nothing is charged and the session's settings are left as they
    were."""
    if len(pieces) > MAX_STATEMENTS:
        # Refused on the count alone, before any statement is planned: planning is linear in the
        # statements (benchmarks/planning.py), and the plan is free.
        raise InputError(
            f"the file has more than {MAX_STATEMENTS:,} statements; split it into several files"
        )
    steps = _plan_steps(session, pieces)
    # The budget's own filter over an in-memory copy of the ledger: a trial writes nothing.
    trial = session.filter.trial()
    whole = _joint(session, steps, trial)
    if whole.fits or not any(s.charged for s in steps):
        return whole
    # The longest prefix that fits, re-planned for that prefix: its cost grows with it, so a
    # binary search over the prefixes' own joint plans finds it (nothing is charged).
    low, high = 0, len(steps)  # the prefix of length low fits, of length high does not
    while high - low > 1:
        mid = (low + high) // 2
        if _joint(session, steps[:mid], trial).fits:
            low = mid
        else:
            high = mid
    kept = _joint(session, steps[:low], trial)
    # Every query after the prefix is left out, one served by a statement of it included: the
    # prefix runs, and nothing after it (which could otherwise be charged on its own).
    refused = [s if s.kind in ("set", "show", "view", "explain") else
               replace(s, source="refused", note="does not fit") for s in steps[low:]]  # fmt: skip
    return replace(kept, steps=kept.steps + tuple(refused), fits=False)


def _joint(session: Session, steps: Sequence[Step], trial: Budget) -> Workload:
    """The joint plan of ``steps`` and whether its event fits the budget now."""

    def plan_select(select: object, i: int) -> Plan:
        plan = session._prepare(select, None, {"moments": "separate", **steps[i].settings})
        planning.check_soon(session.engine, plan, soon=False)()
        return without_default(plan)

    # A statement asking for a fresh answer gets noise of its own: it shares no measurement
    # (two fresh statements alike are two draws, not one). One under SET dpsql.share = off is
    # bounded at its own grouping, as its analyst chose.
    # A statement diagnosed by the policy's default only may still share: a family member is
    # answered from the family's measurements, without a diagnosis of its own.
    plans = [without_default(s.plan) if s.plan is not None and s.charged and s.kind == "query"
             and not s.settings.get("fresh") and s.settings.get("share", True) else None
             for s in steps]  # fmt: skip
    joint = plan_joint(plans, plan_select)
    released = _released(session, steps, joint)
    out = []
    for i, s in enumerate(steps):
        found = joint.family_of(i)
        if found is None:
            out.append(s)
            continue
        family, _ = found
        member = replace(s, plan=plans[i], ratio=joint.ratios[i], family=bounded_at(steps, family))
        seq = released.get(family.fine_index)
        if seq is not None:
            member = replace(member, source="cache", note=f"release {seq}")
        out.append(member)
    events: list[Event] = []
    certified: list[tuple[Fraction, Fraction] | None] = []
    done: set[int] = set()
    for i, s in enumerate(out):
        if not s.charged:
            continue
        found = joint.family_of(i)
        if found is not None:
            family, _ = found
            if family.fine_index not in done and family.fine_index not in released:
                done.add(family.fine_index)
                events.extend(family.event)
            continue
        event = s.event if s.kind == "estimate" else (s.plan.event if s.plan else None)
        if event is None:
            raise InternalError("a charged statement has no event")
        events.extend(event.events)
        certified.append(event.certified)
    independent = statement_totals(out, "charge")
    event = _workload_event(events, independent, certified) if events else None
    fits = True
    if event is not None:
        # Decided as the charge will be: for a person under a person-within-period unit.
        person, details = event, {"blocks": blocks_read(out)}
        persons = session.pipeline.persons
        if persons is not None:
            person, details = persons.person(event, details)
        read = details.get("periods")
        period = PeriodCharge.of(read) if isinstance(read, Mapping) else None
        try:
            trial._decide(person, session.analyst, trial.store.records(), period)
        except BudgetExceededError:
            fits = False
    return Workload(tuple(out), joint, event, fits, independent, released)


def bounded_at(steps: Sequence[Step], family: Family) -> str:
    """What bounds ``family``, for the plan: its fine statement's number."""
    return str(steps[family.fine_index].piece.number)


def _released(session: Session, steps: Sequence[Step], joint: Joint) -> dict[int, int]:
    """The families of ``joint`` released before with the same key (``workload_run``); a
    statement asking for a fresh answer is in no family."""
    if not joint.families:
        return {}
    records = session.filter.store.records()
    out = {}
    for family in joint.families:
        key = family_key(family, session.policy.dataset.id, session.policy_version(),
                         session.policy.dataset.data_version)  # fmt: skip
        found = released_family(records, key)
        if found is not None:
            out[family.fine_index] = found.seq
    return out


def _workload_event(
    events: Sequence[Event],
    independent: tuple[Fraction, Fraction],
    certified: Sequence[tuple[Fraction, Fraction] | None],
) -> Composite:
    """The workload's one event: every measurement it takes, composed sequentially. When some
    statement certified its Gaussians jointly, the workload claims the sum of the statements'
    pairs (basic composition of their certificates, Dwork and Roth 2014, Theorem 3.16) if a
    theorem supports it for the events (``events.supports``), else none."""
    if any(c is not None for c in certified):
        try:
            return Composite(tuple(events), independent)
        except InternalError:
            pass
    return Composite(tuple(events))


def _plan_steps(session: Session, pieces: Sequence[Piece]) -> list[Step]:
    """Plan every statement in order (a SET applied for the statements after it); each query
    is charged, or served from the cache (a release, or an earlier statement of the file)."""
    planned: dict[str, int] = {}  # exact cache key -> the statement that will release it
    before = session.set_values.values()
    steps: list[Step] = []
    applied: set[str] = set()
    # Pipelined: while the engine checks statement i's bounded SQL (in its worker, without the
    # interpreter), statement i + 1 is parsed and planned here. Steps still complete in order
    # (statement i's trial charge before statement i + 1's), and the first statement in the
    # file's order that fails is the one reported.
    pending: tuple[Piece, Callable[[], Step]] | None = None
    try:
        for piece in pieces:
            try:
                finish = _plan_soon(session, piece, planned, applied)
            except DpsqlError as exc:
                if pending is not None:
                    steps.append(_complete(*pending))
                raise _located(exc, piece) from None
            if pending is not None:
                steps.append(_complete(*pending))
            pending = (piece, finish)
        if pending is not None:
            steps.append(_complete(*pending))
    finally:
        # The settings as they were before the plan (a shell's earlier SETs included).
        for name in applied:
            session.set_option(name, None)
        for name, value in before.items():
            session.set_option(name, value)
    return steps


def _located(exc: DpsqlError, piece: Piece) -> DpsqlError:
    where = f"statement {piece.number} (line {piece.line})"
    if isinstance(exc, ParseError) and exc.line is not None:
        # The position in the file, not in the statement.
        line = piece.line + exc.line - 1
        message = str(exc).rsplit(" (line ", 1)[0]
        return ParseError(f"{where}: {message}", line, exc.column)
    return type(exc)(f"{where}: {exc}")


def _complete(piece: Piece, finish: Callable[[], Step]) -> Step:
    try:
        return finish()
    except DpsqlError as exc:
        raise _located(exc, piece) from None


def _plan_soon(
    session: Session, piece: Piece, planned: dict[str, int], applied: set[str]
) -> Callable[[], Step]:
    """Plan ``piece`` now (a SET is applied now, for the statements after it) and start the
    engine's check; the function returned waits for the check and decides the step."""
    # A SELECT or EXPLAIN seen before (same text, same settings) reuses its plan: no parse.
    # The ledger's bounds estimates were read when the file's planning began (current=False):
    # the file is planned on one reading of the ledger, and every statement is planned again,
    # on a fresh reading, when it runs.
    settings = session.set_values.values()
    # A file's VARIANCE and STDDEV measure Q, S and N apart, unless the file SETs otherwise:
    # those are what a family shares with other statements (dpsql.plan.workload.family).
    shared = {} if "moments" in settings else {"moments": "separate"}
    checked = session.planned_soon(piece.text, None, shared, current=piece.number == 1)
    if checked is None:
        kind = kind_of(piece)
        if kind == "set":
            statement = parse_statement(piece.text)
            assert isinstance(statement, SetOption)
            session.set_option(statement.name, statement.value)
            applied.add(statement.name)
        if kind == "estimate":
            statement = parse_statement(piece.text)
            assert isinstance(statement, EstimateBounds)
            # Charged with the file (its estimates serve the statements of later files).
            estimate = session.estimates.plan(statement, session.settings())
            event = None if estimate.found is not None else estimate.event
            source = "charge" if event is not None else "cache"
            # Asked again in the file at the same epsilon (not fresh): served, free, from the
            # estimate the first one records when it runs (post-processing of its release).
            same = "estimate " + json.dumps(estimate.key, sort_keys=True)
            note = ""
            if event is not None and not session.settings().fresh:
                if same in planned:
                    event, source, note = None, "cache", f"statement {planned[same]}"
                else:
                    planned[same] = piece.number
            found = estimate.details.get("blocks")
            read = tuple((str(t), tuple(ids)) for t, ids in found.items()) if isinstance(
                found, Mapping) else ()  # fmt: skip
            return lambda: Step(piece, kind, None, source, note, settings=settings, event=event,
                                blocks=read)  # fmt: skip
        return lambda: Step(piece, kind, settings=settings)
    fresh = session.settings().fresh  # as SET before this statement left it
    return lambda: _decide(session, piece, checked(), planned, settings, fresh=fresh)


def _decide(
    session: Session, piece: Piece, known: Planned, planned: dict[str, int],
    settings: Mapping[str, object], *, fresh: bool,
) -> Step:  # fmt: skip
    if known.explain:  # planned, so a bad EXPLAIN refuses the file like a bad query
        return Step(piece, "explain", settings=settings)
    if not fresh:
        # Its variances measured apart here; one measured as a vector may have been released.
        known = session.apart(piece.text, None, {}, known, moments="joint")
    plan, keys = known.plan, known.keys
    if plan.auto is not None:
        # Its answer is planned after its walks run, so it cannot join one charge planned
        # before any statement runs (nor a family): refused with the file, nothing charged.
        raise UnsupportedQueryError(
            f"statement {piece.number} chooses its bounds per query (dpsql.bounds = auto), "
            "which a file planned as one cannot plan ahead; declare the bounds, run ESTIMATE "
            "BOUNDS first, or run the statement alone"
        )
    if not fresh:
        hit = session.cache.lookup(plan, keys, bool(settings.get("share", True)))
        if hit is not None:
            return Step(piece, "query", plan, "cache", hit.origin, settings)
        if keys.exact in planned:
            note = f"statement {planned[keys.exact]}"
            return Step(piece, "query", plan, "cache", note, settings)
    planned[keys.exact] = piece.number
    return Step(piece, "query", plan, "charge", settings=settings)


def one_line(text: str, width: int = 60) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


def statement_totals(steps: Sequence[Step], source: str) -> tuple[Fraction, Fraction]:
    """The sum of the independent costs of the steps from ``source``."""
    chosen = [s.plan.event if s.plan is not None else s.event for s in steps if s.source == source]
    events = [e for e in chosen if e is not None]
    return sum((e.epsilon for e in events), Fraction(0)), sum(
        (e.delta for e in events), Fraction(0)
    )
