"""Parallel composition over the cells of partition families (McSherry 2009, Theorem 4).

A query pinned to a cell ``(family, key)`` touched only the units of that cell, and within one
family a unit lies in at most one cell, which the bounded query enforces (``dpsql.analyze.cells``).
Cells of different families overlap in units. So the history a unit is exposed to is the
unpinned queries plus, in each family, the queries of its own cell. We bound it by *views*: a
view chooses one cell per family and holds the unpinned queries and those of its chosen cells.
Every unit's history is contained in some view (a unit in no cell of a family: choose any), so
the worst view bounds every unit's loss under any accountant (each is monotone in the history).
Queries of two families therefore compose sequentially, and two cells of one family never meet
in a view.

When the families' cells make more than ``MAX_VIEWS`` (256) combinations, each view chooses the cell
of one family only and holds every query of the other families: a superset of the exact views,
so a valid (if more conservative) bound. Additive costs (basic composition) use the exact
worst view in closed form, ``worst``, whatever the number of cells.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from fractions import Fraction
from typing import TypeVar

T = TypeVar("T")
Cell = tuple[str, str]  # (family, key)
View = Mapping[str, Cell]  # family -> the cell the view chose; other families: all their cells
MAX_VIEWS = (
    256  # beyond it, each view is checked by every filter: the cost of a charge grows with it
)


def member(cell: Cell | None, view: View) -> bool:
    """Whether a query pinned to ``cell`` (None: unpinned) belongs to ``view``."""
    return cell is None or view.get(cell[0], cell) == cell


def choices(cells: Iterable[Cell]) -> list[View]:
    """The views over these cells: one cell per family in every combination, or one family's
    cell at a time when the combinations are too many; one empty view without cells."""
    by_family: dict[str, list[Cell]] = {}
    for cell in dict.fromkeys(cells):
        by_family.setdefault(cell[0], []).append(cell)
    if math.prod(len(v) for v in by_family.values()) > MAX_VIEWS:
        return [{cell[0]: cell} for group in by_family.values() for cell in group]
    return [
        dict(zip(by_family, combo, strict=True)) for combo in itertools.product(*by_family.values())
    ]


def views(items: Sequence[T], cell_of: Callable[[T], Cell | None]) -> list[list[T]]:
    """The histories that bound every unit's (the whole history when no query is pinned)."""
    cells = [c for x in items if (c := cell_of(x)) is not None]
    return [[x for x in items if member(cell_of(x), view)] for view in choices(cells)]


def views_with(items: Sequence[T], new: T, cell_of: Callable[[T], Cell | None]) -> list[list[T]]:
    """The views of ``items`` plus ``new`` that hold ``new`` (the last item of each): the ones
    an admission decision must check, since the others do not change."""
    history = [*items, new]
    target = cell_of(new)
    cells = [c for x in history if (c := cell_of(x)) is not None]
    return [
        [x for x in history if member(cell_of(x), view)]
        for view in choices(cells)
        if member(target, view)
    ]


def worst(base: Fraction, cells: Mapping[Cell, Fraction], within: Cell | None = None) -> Fraction:
    """The exact largest additive cost of a view: the unpinned ``base`` plus the costliest cell
    of each family; with ``within``, of the views that choose that cell (a new query's)."""
    best: dict[str, Fraction] = {}
    for cell, cost in cells.items():
        if within is None or cell[0] != within[0]:
            best[cell[0]] = max(best.get(cell[0], cost), cost)
    if within is not None:
        best[within[0]] = cells.get(within, Fraction(0))
    return base + sum(best.values(), Fraction(0))


def running_worst(items: Iterable[tuple[Cell | None, Fraction]]) -> Iterator[Fraction]:
    """After each (cell, cost) of a history, the additive cost of its worst view."""
    base = Fraction(0)
    cells: dict[Cell, Fraction] = {}
    for cell, cost in items:
        if cell is None:
            base += cost
        else:
            cells[cell] = cells.get(cell, Fraction(0)) + cost
        yield worst(base, cells)


__all__ = [
    "MAX_VIEWS",
    "Cell",
    "choices",
    "member",
    "running_worst",
    "views",
    "views_with",
    "worst",
]
