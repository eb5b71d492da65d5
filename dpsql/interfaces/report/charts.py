"""Composition curves: cumulative epsilon against the number of queries, under each accountant.

The picture from teaching material on composition: for a history (the ledger's charges, or N
identical hypothetical queries) the epsilon that each accountant registered with a curve style
(``dpsql.accounting.registry``: basic, advanced, Renyi (RDP) and PLD accounting) proves after
each prefix, at one delta, beside a horizontal budget cap.

Each point is a fresh reading of the prefix by the registered odometers (the same ones
``Budget.report`` uses), never an extrapolation: the last point of the history's curves is the
report's figure. Where queries pinned to cells compose in parallel, a prefix's reading is the
worst of its views (``Budget.views``), as in the report. Basic composition is the sum of the
charged epsilons (each query's certified epsilon when it has one: ``BasicSpend``).

Drawing uses matplotlib's object API on the Agg canvas (no pyplot state, so safe in a server),
with SVG text kept as text (``svg.fonttype = "none"``) so labels can be read and searched, and no
date in the metadata, so the same curves give the same file.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path

from dpsql.accounting import registry
from dpsql.accounting.budget.budget import Budget
from dpsql.accounting.budget.report import UNBOUNDED
from dpsql.accounting.budget.state import events_for
from dpsql.accounting.theorems.base import Accountant
from dpsql.errors import OutputError
from dpsql.mechanisms.events import Composite

__all__ = [
    "CURVES",
    "Curves",
    "chart_format",
    "composite_curves",
    "draw",
    "history_curves",
    "inline_svg",
    "label",
    "points",
    "write_chart",
]

# The accountants drawn, in the registry's order: those registered with a colour (a live view:
# one registered later is drawn too).
CURVES = registry.Names(lambda r: r.colour is not None)
FORMATS = {".png": "png", ".svg": "svg"}
MAX_POINTS = 200  # prefixes read per curve; a long ledger is sampled evenly (its end always)


def accountants() -> list[Accountant]:
    """Fresh odometers for the curves (each caches prefixes of the history it reads)."""
    return [registry.get(name).odometer() for name in CURVES]


def label(name: str) -> str:
    """A curve's legend entry, with the validity label of its figure (whether it holds only for
    parameters fixed before the first query: ``Accountant.fixed_in_advance``)."""
    drawn = registry.get(name)
    return f"{drawn.label}: {drawn.validity}"


@dataclass(frozen=True)
class Curves:
    """Cumulative epsilon at ``delta`` after ``queries[i]`` queries, per accountant (any of
    ``CURVES``, drawn in that order)."""

    queries: tuple[int, ...]
    epsilons: dict[str, tuple[float, ...]]
    delta: float
    cap: float
    cap_label: str
    title: str
    # The cap as it was over time: (queries charged before it, the cap from then on), one per
    # top-up after the first entry (the cap the ledger started with); empty: ``cap`` throughout.
    cap_steps: tuple[tuple[int, float], ...] = ()


def points(n: int, most: int = MAX_POINTS) -> list[int]:
    """0..n, or ``most`` evenly spaced prefix lengths including 0 and n."""
    if n + 1 <= most:
        return list(range(n + 1))
    return sorted({round(i * n / (most - 1)) for i in range(most)})


def _reading(
    views: Sequence[Sequence[Composite]], delta: float, readers: Sequence[Accountant]
) -> dict[str, float]:
    """Every curve's epsilon for one prefix: the worst of its views."""
    result = {}
    for accountant in readers:
        result[accountant.name] = max(
            accountant.epsilon(events_for(accountant.name, list(v)), delta) if v else 0.0
            for v in views
        )
    return result


def composite_curves(
    views_of: Callable[[int], Sequence[Sequence[Composite]]],
    n: int,
    delta: float,
    cap: tuple[float, str],
    title: str,
    *,
    most: int = MAX_POINTS,
) -> Curves:
    """The curves of a history of ``n`` queries whose k-prefix has the views ``views_of(k)``,
    read at ``most`` prefixes at most."""
    readers = accountants()
    xs = points(n, most)
    rows = [_reading(views_of(k), delta, readers) for k in xs]
    epsilons = {r.name: tuple(row[r.name] for row in rows) for r in readers}
    return Curves(tuple(xs), epsilons, delta, cap[0], cap[1], title)


def history_curves(budget: Budget) -> Curves:
    """The ledger's actual history, at the budget's delta, with the budget's epsilon cap as it
    was over time (each top-up raises it from the query it came after)."""
    charges = budget.charges
    report = budget.report()
    delta = float(report.delta_total)
    curves = composite_curves(
        lambda k: budget.views(charges[:k]),
        len(charges),
        delta,
        (float(report.epsilon_total), f"budget cap ε = {float(report.epsilon_total):g}"),
        f"Data set {report.dataset}: ε of the actual history at δ = {delta:g}",
    )
    count, added, steps = 0, Fraction(0), []
    for record in budget.store.records():
        if record.kind == "charge":
            count += 1
        elif record.kind == "budget_add":
            amount = Fraction(str(record.payload["epsilon"]))
            added += amount
            steps.append((count, amount))
    if not steps:
        return curves
    cap, running = report.epsilon_total - added, []
    running.append((0, float(cap)))
    for at, amount in steps:
        cap += amount
        running.append((at, float(cap)))
    return replace(curves, cap_steps=tuple(running))


def chart_format(path: Path) -> str:
    """``png`` or ``svg`` from a file name; ValueError for anything else."""
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ValueError("the chart file must end in .png or .svg")
    return fmt


def draw(curves: Curves, fmt: str) -> bytes:
    """The chart as PNG or SVG bytes."""
    # matplotlib takes about 0.3 s to import: only a command that draws pays for it.
    import matplotlib as mpl  # noqa: PLC0415
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

    with mpl.rc_context({"svg.fonttype": "none", "svg.hashsalt": "dpsql"}):
        figure = Figure(figsize=(7.0, 4.2), dpi=100)
        FigureCanvasAgg(figure)
        axes = figure.add_subplot()
        for name in (n for n in CURVES if n in curves.epsilons):
            # An unbounded reading (inf) is left out of the line rather than drawn off-scale.
            ys = [y if math.isfinite(y) else math.nan for y in curves.epsilons[name]]
            entry = (
                label(name) if any(math.isfinite(y) for y in ys) else f"{label(name)}: {UNBOUNDED}"
            )
            style = registry.get(name)
            axes.plot(
                curves.queries,
                ys,
                style.line,
                color=style.colour,
                linewidth=1.8,
                label=entry,
            )
        if curves.cap_steps:
            # The cap as it was: a step at each top-up, marked by a dotted line.
            xs = [x for x, _ in curves.cap_steps] + [max(1, curves.queries[-1])]
            ys = [y for _, y in curves.cap_steps] + [curves.cap_steps[-1][1]]
            axes.step(xs, ys, where="post", color="black", linewidth=1.2, label=curves.cap_label)
            for i, (x, _) in enumerate(curves.cap_steps[1:]):
                axes.axvline(x, color="grey", linestyle=":", linewidth=1.0,
                             label="top-up" if i == 0 else None)  # fmt: skip
        else:
            axes.axhline(curves.cap, color="black", linewidth=1.2, label=curves.cap_label)
        axes.set_xlabel("number of queries")
        axes.set_ylabel(f"cumulative ε at δ = {curves.delta:g}")
        axes.set_title(curves.title, fontsize=10)
        axes.set_xlim(left=0, right=max(1, curves.queries[-1]))
        axes.set_ylim(bottom=0)
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize=8, loc="upper left")
        figure.tight_layout()
        out = io.BytesIO()
        metadata: dict[str, str | None] = {"Date": None} if fmt == "svg" else {"Software": None}
        figure.savefig(out, format=fmt, metadata=metadata)
        return out.getvalue()


def write_chart(curves: Curves, path: Path) -> None:
    """Draw the chart in the format the file name asks for; a file that cannot be written is
    an ``OutputError`` naming it."""
    image = draw(curves, chart_format(path))
    try:
        path.write_bytes(image)
    except OSError as exc:
        reason = exc.strerror.lower() if exc.strerror else "failed"
        raise OutputError(f"cannot write the chart {path}: {reason}") from None


def inline_svg(curves: Curves) -> str:
    """The SVG chart as an element to put inside an HTML page (no XML prolog, no DOCTYPE)."""
    text = draw(curves, "svg").decode("utf-8")
    return re.sub(r"^\s*(?:<\?xml[^>]*\?>\s*)?(?:<!DOCTYPE[^>]*>\s*)?", "", text).strip()
