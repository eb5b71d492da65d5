"""Planning a file of statements: each statement's step, decided before anything runs.

``plan_file`` plans every statement of a file in order (a ``SET`` applied for the statements
after it) and admits the charges on a trial budget over a copy of the ledger's records, with
the budget's own filter: a ``Step`` says whether a statement is free, charged, served from the
release cache, or refused because it does not fit. ``plan_lines`` is that plan as ``dpsql run``
prints it. Nothing here charges or runs anything; the commands are in ``batch.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction

from dpsql.accounting.budget.budget import Budget
from dpsql.accounting.budget.build import budget_for
from dpsql.accounting.ledger.store import MemoryLedger
from dpsql.cache.families import family_key, released_family
from dpsql.errors import BudgetExceededError, DpsqlError, InternalError, ParseError
from dpsql.mechanisms.events import Composite, Event
from dpsql.plan.aggregates.registry import rule_of
from dpsql.plan.estimators import half_width
from dpsql.plan.plans import Plan
from dpsql.plan.workload.family import Family, Joint, plan_joint
from dpsql.policy.numbers import exact
from dpsql.session.plans import Planned
from dpsql.session.session import Session
from dpsql.sql.parse import EstimateBounds, Explain, SetOption, ShowOption, parse_statement
from dpsql.sql.split import Piece

__all__ = ["Step", "Workload", "plan_file", "plan_lines", "plan_workload"]


@dataclass(frozen=True)
class Step:
    """A planned statement: its kind, its plan (queries), where its answer comes from."""

    piece: Piece
    kind: str  # "set", "show", "explain", "query" or "estimate" (ESTIMATE BOUNDS)
    plan: Plan | None = None
    source: str = "free"  # "free", "charge", "cache" or "refused"
    note: str = ""
    # The SET values in force at this statement (a family's bounded query is planned with
    # the fine statement's), and the loss of an ESTIMATE BOUNDS.
    settings: Mapping[str, object] = field(default_factory=dict)
    event: Composite | None = None
    # Under the workload's joint plan: its variance over its independent plan's (None: on its
    # own), and what bounds its family: the number of the statement whose grouping it is, or
    # "(keys)" for the union of its members' keys.
    ratio: float | None = None
    family: str | None = None

    @property
    def charged(self) -> bool:
        return self.source == "charge"


def _kind(piece: Piece) -> str:
    statement = parse_statement(piece.text)
    if isinstance(statement, SetOption):
        return "set"
    if isinstance(statement, ShowOption):
        return "show"
    if isinstance(statement, EstimateBounds):
        return "estimate"
    return "explain" if isinstance(statement, Explain) else "query"


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
    steps = _plan_steps(session, pieces)
    trial = _trial(session)
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
    refused = [s if s.kind in ("set", "show", "explain") else
               replace(s, source="refused", note="does not fit") for s in steps[low:]]  # fmt: skip
    return replace(kept, steps=kept.steps + tuple(refused), fits=False)


def _trial(session: Session) -> Budget:
    """The budget's own filter over a copy of the ledger's records, in memory: it decides as
    the ledger would, and a trial writes nothing."""
    copy = MemoryLedger()  # decides on its records in place
    for record in session.filter.store.records():
        copy.append(record.kind, record.payload, record.analyst)
    return budget_for(session.policy.dataset.id, session.policy.budget, copy)


def _joint(session: Session, steps: Sequence[Step], trial: Budget) -> Workload:
    """The joint plan of ``steps`` and whether its event fits the budget now."""

    def plan_select(select: object, i: int) -> Plan:
        plan = session._prepare(select, None, steps[i].settings)
        session._check_soon(plan, soon=False)()
        return plan

    # A statement asking for a fresh answer gets noise of its own: it shares no measurement
    # (two fresh statements alike are two draws, not one). One under SET dpsql.share = off is
    # bounded at its own grouping, as its analyst chose.
    plans = [s.plan if s.charged and s.kind == "query" and not s.settings.get("fresh")
             and s.settings.get("share", True) else None for s in steps]  # fmt: skip
    joint = plan_joint(plans, plan_select)
    released = _released(session, steps, joint)
    out = []
    for i, s in enumerate(steps):
        found = joint.family_of(i)
        if found is None:
            out.append(s)
            continue
        family, _ = found
        member = replace(s, ratio=joint.ratios[i], family=_bounded_at(steps, family))
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
    independent = _totals(out, "charge")
    event = _workload_event(events, independent, certified) if events else None
    fits = True
    if event is not None:
        try:
            trial._decide(event, session.analyst, trial.store.records())
        except BudgetExceededError:
            fits = False
    return Workload(tuple(out), joint, event, fits, independent, released)


def _bounded_at(steps: Sequence[Step], family: Family) -> str:
    """What bounds ``family``, for the plan: its fine statement's number, or its keys."""
    if family.union:
        return f"({family.grouping})"
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
    before = dict(session._settings)
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
    checked = session.planned_soon(piece.text, None, {}, current=piece.number == 1)
    settings = dict(session._settings)
    if checked is None:
        kind = _kind(piece)
        if kind == "set":
            statement = parse_statement(piece.text)
            assert isinstance(statement, SetOption)
            session.set_option(statement.name, statement.value)
            applied.add(statement.name)
        if kind == "estimate":
            statement = parse_statement(piece.text)
            assert isinstance(statement, EstimateBounds)
            # Charged with the file (its estimates serve the statements of later files).
            event = session.estimate_event(statement, {})
            source = "charge" if event is not None else "cache"
            return lambda: Step(piece, kind, None, source, settings=settings, event=event)
        return lambda: Step(piece, kind, settings=settings)
    fresh = bool(session.settings()["fresh"])  # as SET before this statement left it
    return lambda: _decide(session, piece, checked(), planned, settings, fresh=fresh)


def _decide(
    session: Session, piece: Piece, known: Planned, planned: dict[str, int],
    settings: Mapping[str, object], *, fresh: bool,
) -> Step:  # fmt: skip
    if known.explain:  # planned, so a bad EXPLAIN refuses the file like a bad query
        return Step(piece, "explain", settings=settings)
    plan, keys = known.plan, known.keys
    if not fresh:
        hit = session.cache.lookup(plan, keys, bool(settings.get("share", True)))
        if hit is not None:
            return Step(piece, "query", plan, "cache", hit.origin, settings)
        if keys.exact in planned:
            note = f"statement {planned[keys.exact]}"
            return Step(piece, "query", plan, "cache", note, settings)
    planned[keys.exact] = piece.number
    return Step(piece, "query", plan, "charge", settings=settings)


def _one_line(text: str, width: int = 60) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


def _totals(steps: Sequence[Step], source: str) -> tuple[Fraction, Fraction]:
    """The sum of the independent costs of the steps from ``source``."""
    chosen = [s.plan.event if s.plan is not None else s.event for s in steps if s.source == source]
    events = [e for e in chosen if e is not None]
    return sum((e.epsilon for e in events), Fraction(0)), sum(
        (e.delta for e in events), Fraction(0)
    )


def _joint_text(step: Step) -> str:
    """A statement's predicted accuracy under the joint plan against its independent one."""
    if step.ratio is None or step.plan is None:
        return "-"
    factor = math.sqrt(step.ratio)
    plan = step.plan
    estimates = plan.estimates
    if len(estimates) == 1 and rule_of(estimates[0].kind).total:
        m = plan.measurements[estimates[0].measurements[0]]
        alone = float(half_width(m, plan.options.confidence) * m.unit)
        return f"±{alone:.4g} -> ±{alone * factor:.4g} (x{factor:.3f})"
    return f"x{factor:.3f} of its half-widths"


def plan_lines(session: Session, name: str, given: Sequence[Step] | Workload) -> list[str]:
    """The cost plan of a file, as printed by ``dpsql run`` before anything runs."""
    workload = given if isinstance(given, Workload) else None
    steps = list(given.steps) if isinstance(given, Workload) else list(given)
    lines = [f"plan of {name}: {len(steps)} statement(s)"]
    lines.append(
        f"{'#':>3}  {'line':>4}  {'kind':<8}  {'epsilon':<10}  {'delta':<12}  {'source':<26}  "
        "joint plan (predicted half-width, independent -> joint)  statement"
    )
    for s in steps:
        event = s.plan.event if s.plan is not None else s.event
        cost = (exact(event.epsilon), exact(event.delta)) if event is not None else ("-", "-")
        source = s.source + (f" ({s.note})" if s.note else "")
        joint = _joint_text(s) + (f" [family at {s.family}]" if s.family is not None else "")
        lines.append(
            f"{s.piece.number:>3}  {s.piece.line:>4}  {s.kind:<8}  {cost[0]!s:<10}  "
            f"{cost[1]!s:<12}  {source:<26}  {joint:<55}  {_one_line(s.piece.text)}"
        )
    eps, delta = _totals(steps, "charge")
    report = session.budget()
    refused = [s.piece.number for s in steps if s.source == "refused"]
    lines.append(
        f"to charge (basic composition, the sum): epsilon {exact(eps)}, delta {exact(delta)}, "
        "in one charge for the whole file, before anything runs"
    )
    if workload is not None:
        for family in workload.joint.families:
            numbers = ", ".join(str(steps[m.index].piece.number) for m in family.members)
            at = _bounded_at(steps, family)
            grouping = (
                f"({family.grouping}), the union of their keys"
                if family.union
                else (f"of statement {at}")
            )
            b = family.fine.bounding
            chosen = ""
            if b is not None and b.select_at is not None:
                names = ", ".join(family.fine.analysis.keys[p].name for p in b.select_at)
                chosen = f", each unit's L0 groups chosen at ({names}) with C rows in each"
            lines.append(
                f"joint: statements {numbers} bounded once at the grouping {grouping} "
                f"(L0 = {family.fine.max_groups}, C = {family.fine.max_rows}{chosen}); coarser "
                "cells are sums of its cells, so their L1 = L2 = L0·C; measured:"
            )
            for t in family.taken:
                m = t.measurement
                lines.append(
                    f"  {m.label}: L1 sensitivity {m.sensitivity * m.unit}, "
                    f"epsilon {exact(t.epsilon)}"
                )
            total = sum(family.ratios)
            lines.append(
                f"  variance over the independent plans, summed over these {len(family.ratios)} "
                f"statement(s): {total:.3f} (least squares, released unrounded: children sum "
                "to parents)"
            )
        ratios = [
            s.ratio if s.ratio is not None else 1.0
            for s in steps
            if s.charged and s.kind == "query"
        ]
        if ratios:
            lines.append(
                f"joint plan: the sum over the {len(ratios)} charged queries of (joint variance / "
                f"independent variance) is {sum(ratios):.3f} (independent: {len(ratios)})"
            )
    lines.append(
        f"remaining under the {report.accountant} filter: epsilon "
        f"{exact(report.epsilon_remaining)}, delta {exact(report.delta_remaining)}"
    )
    if refused:
        listed = ", ".join(map(str, refused))
        lines.append(f"fits: no: the {report.accountant} filter refuses statement(s) {listed}")
    else:
        lines.append(f"fits: yes (the whole file admitted by the {report.accountant} filter)")
    return lines
