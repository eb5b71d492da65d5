"""A planned statement of a file (``Step``), its kind, and the blocks the charged ones read
(a part of ``dpsql.session.workload_plan``, which re-exports them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dpsql.mechanisms.events import Composite
from dpsql.plan.plans import Plan
from dpsql.sql.parse import (
    EstimateBounds,
    Explain,
    ReadView,
    SetOption,
    ShowOption,
    parse_statement,
)
from dpsql.sql.split import Piece

__all__ = ["Step", "blocks_read", "kind_of"]


@dataclass(frozen=True)
class Step:
    """A planned statement: its kind, its plan (queries), where its answer comes from."""

    piece: Piece
    kind: str  # "set", "show", "view", "explain", "query" or "estimate" (ESTIMATE BOUNDS)
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
    # The blocks an ESTIMATE BOUNDS reads, by table (a query's are its plan's).
    blocks: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def charged(self) -> bool:
        return self.source == "charge"


def blocks_read(steps: Sequence[Step]) -> dict[str, list[str]]:
    """The blocks the charged statements read, by table: each query's plan's, each ESTIMATE
    BOUNDS's own (the charge's details keep them; the person's charge reads them)."""
    read: dict[str, list[str]] = {}
    for step in steps:
        if not step.charged:
            continue
        for table, ids in step.plan.blocks if step.plan is not None else step.blocks:
            read[table] = sorted({*read.get(table, []), *ids})
    return read


def kind_of(piece: Piece) -> str:
    statement = parse_statement(piece.text)
    if isinstance(statement, SetOption):
        return "set"
    if isinstance(statement, ShowOption):
        return "show"
    if isinstance(statement, ReadView):
        return "view"  # a continual-release view's released values: free
    if isinstance(statement, EstimateBounds):
        return "estimate"
    return "explain" if isinstance(statement, Explain) else "query"
