"""Planning a file of statements: each statement's step, decided before anything runs.

``plan_file`` plans every statement of a file in order (a ``SET`` applied for the statements
after it) and admits the charges on a trial budget over a copy of the ledger's records, with
the budget's own filter: a ``Step`` says whether a statement is free, charged, served from the
release cache, or refused because it does not fit. ``plan_lines`` is that plan as ``dpsql run``
prints it. Nothing here charges or runs anything; the commands are in ``batch.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from dpsql.accounting.filter import Budget, MemoryLedger, budget_for
from dpsql.errors import BudgetExceededError, DpsqlError, ParseError
from dpsql.interfaces.report import exact
from dpsql.plan.planner import Plan
from dpsql.session import Planned, Session
from dpsql.sql.parse import Explain, SetOption, ShowOption, parse_statement
from dpsql.sql.split import Piece

__all__ = ["Step", "plan_file", "plan_lines"]


@dataclass(frozen=True)
class Step:
    """A planned statement: its kind, its plan (queries), where its answer comes from."""

    piece: Piece
    kind: str  # "set", "show", "explain" or "query"
    plan: Plan | None = None
    source: str = "free"  # "free", "charge", "cache" or "refused"
    note: str = ""

    @property
    def charged(self) -> bool:
        return self.source == "charge"


def _kind(piece: Piece) -> str:
    statement = parse_statement(piece.text)
    if isinstance(statement, SetOption):
        return "set"
    if isinstance(statement, ShowOption):
        return "show"
    return "explain" if isinstance(statement, Explain) else "query"


def plan_file(session: Session, pieces: Sequence[Piece]) -> list[Step]:
    """Plan every statement in order, admitting the charges on a copy of the budget; nothing
    is charged and the session's settings are left as they were (a fresh session's)."""
    copy = MemoryLedger()  # decides on its records in place: O(1) per trial charge
    for record in session.filter.store.records():
        copy.append(record.kind, record.payload, record.analyst)
    trial = budget_for(session.policy.dataset.id, session.policy.budget, copy)
    planned: dict[str, int] = {}  # exact cache key -> the statement that will release it
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
                finish = _plan_soon(session, piece, trial, planned, applied)
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
        for name in applied:
            session.set_option(name, None)
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
    session: Session, piece: Piece, trial: Budget, planned: dict[str, int], applied: set[str]
) -> Callable[[], Step]:
    """Plan ``piece`` now (a SET is applied now, for the statements after it) and start the
    engine's check; the function returned waits for the check and decides the step."""
    # A SELECT or EXPLAIN seen before (same text, same settings) reuses its plan: no parse.
    # The ledger's bounds estimates were read when the file's planning began (current=False):
    # the file is planned on one reading of the ledger, and every statement is planned again,
    # on a fresh reading, when it runs.
    checked = session.planned_soon(piece.text, None, {}, current=piece.number == 1)
    if checked is None:
        kind = _kind(piece)
        if kind == "set":
            statement = parse_statement(piece.text)
            assert isinstance(statement, SetOption)
            session.set_option(statement.name, statement.value)
            applied.add(statement.name)
        return lambda: Step(piece, kind)
    fresh = bool(session.settings()["fresh"])  # as SET before this statement left it
    return lambda: _decide(session, piece, checked(), trial, planned, fresh=fresh)


def _decide(
    session: Session, piece: Piece, known: Planned, trial: Budget, planned: dict[str, int],
    *, fresh: bool,
) -> Step:  # fmt: skip
    if known.explain:  # planned, so a bad EXPLAIN refuses the file like a bad query
        return Step(piece, "explain")
    plan, keys = known.plan, known.keys
    if not fresh:
        hit = session.cache.lookup(plan, keys)
        if hit is not None:
            return Step(piece, "query", plan, "cache", f"release {hit.release_seq}")
        if keys.exact in planned:
            return Step(piece, "query", plan, "cache", f"statement {planned[keys.exact]}")
    try:
        trial.charge(plan.event, plan.query, session.analyst)
    except BudgetExceededError:
        return Step(piece, "query", plan, "refused", "does not fit")
    planned[keys.exact] = piece.number
    return Step(piece, "query", plan, "charge")


def _one_line(text: str, width: int = 60) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


def _totals(steps: Sequence[Step], source: str) -> tuple[Fraction, Fraction]:
    chosen = [s.plan for s in steps if s.source == source and s.plan is not None]
    return sum((p.epsilon for p in chosen), Fraction(0)), sum(
        (p.delta for p in chosen), Fraction(0)
    )


def plan_lines(session: Session, name: str, steps: Sequence[Step]) -> list[str]:
    """The cost plan of a file, as printed by ``dpsql run`` before anything runs."""
    lines = [f"plan of {name}: {len(steps)} statement(s)"]
    lines.append(f"{'#':>3}  {'line':>4}  {'kind':<7}  {'epsilon':<10}  {'delta':<12}  source")
    for s in steps:
        cost = (exact(s.plan.epsilon), exact(s.plan.delta)) if s.plan else ("-", "-")
        source = s.source + (f" ({s.note})" if s.note else "")
        lines.append(
            f"{s.piece.number:>3}  {s.piece.line:>4}  {s.kind:<7}  {cost[0]!s:<10}  "
            f"{cost[1]!s:<12}  "
            f"{source:<26}  {_one_line(s.piece.text)}"
        )
    eps, delta = _totals(steps, "charge")
    report = session.budget()
    refused = [s.piece.number for s in steps if s.source == "refused"]
    lines.append(
        f"to charge (basic composition, the sum): epsilon {exact(eps)}, delta {exact(delta)}"
    )
    lines.append(
        f"remaining under the {report.accountant} filter: epsilon "
        f"{exact(report.epsilon_remaining)}, delta {exact(report.delta_remaining)}"
    )
    if refused:
        listed = ", ".join(map(str, refused))
        lines.append(f"fits: no: the {report.accountant} filter refuses statement(s) {listed}")
    else:
        lines.append(f"fits: yes (every charge admitted by the {report.accountant} filter)")
    return lines
