"""What a statement gives back: ``Result``, a table with its plan, its charge and its ±.

``_with_accuracy`` is the form of a Result with ``SET dpsql.accuracy_columns = on``: a column
of half-widths after each output that has them. ``Result`` is importable from
``dpsql.session.session`` as well, which returns it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from dpsql.accounting.budget.build import Charge
from dpsql.plan.planner import Plan
from dpsql.release import frames
from dpsql.release.diagnosis import Diagnosed


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
    # The diagnosis of the bounds, when asked for (``SET dpsql.diagnose = on``).
    diagnosis: Diagnosed | None = None
    # How the answer was computed when it is not from measurements of its own (a workload's
    # least squares, ``dpsql.plan.workload.family``): shown beside the table.
    note: str = ""

    def __repr__(self) -> str:
        shown = ", ".join(self.columns[:6]) + (", ..." if len(self.columns) > 6 else "")
        what = f"{len(self.rows)} row(s) of {shown}" if self.columns else self.message or "empty"
        return f"<Result: {what}; {frames.summary(self)}>"

    def _repr_html_(self) -> str:
        """A notebook's display: the values with their ±, and the cost."""
        return frames.to_html(self)


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
