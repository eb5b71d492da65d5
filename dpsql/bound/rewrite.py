"""The bounded query: contribution bounding by per-unit pre-aggregation inside the engine.

The steps of DESIGN.md section 3, each a CTE built as a sqlglot tree by one function of
``STEPS``, in pipeline order:

1. ``_rows`` (``relation``, ``rows``): the table's rows after WHERE, with the unit, the group
   keys and the raw values, every row-level expression made total; rows outside a public
   key's domain dropped or mapped onto its other group (``dpsql.bound.relation``). With a
   total row cap R, each unit keeps R rows first (``dpsql.bound.caps.row_cap``).
2. ``_vals`` (``vals``): values rounded to their grid and clamped to the grid-aligned bounds,
   as integers (``dpsql.bound.values``).
3. ``_units``: per (unit, group): rows ``n``, non-NULL values ``n_i`` and exact integer sums;
   for a variance, also the exact sum of squared centred values ``Σ(2·v - lower - upper)²``.
4. ``_kept``: at most L0 groups per unit, ranked by a salted hash of (unit, keys), which depends
   only on the unit's own rows; units with at most L0 groups (``_multi`` lists the others)
   skip the ranking window, unless the public keys have at least 4·L0 combinations (then most
   units are ranked anyway, and finding the others costs more than it saves). Over few public
   key combinations, counts rank per unit in one row instead (``_pivot``: ``dpsql.bound.pivot``).
5. ``_capped``: ``n' = min(n, C)``; sums scaled to ``n'·S/n`` and clamped to ``[n'·lo, n'·hi]``;
   sums of squares scaled to ``C·Q/n`` when ``n > C`` and clamped to ``[0, C·width²]``
   (``dpsql.bound.per_unit``; steps 3 to 5 are ``units``).
6. ``_x<j>`` and ``_agg`` (``list_measures``, ``aggregated``), then the answer: the cross-unit
   aggregate per group; with a public domain, every key of the domain
   (``dpsql.bound.aggregate``).

Steps the plan proves unable to bind are left out (``dpsql.plan.steps._steps``); with
``Bounding.direct`` steps 3 to 5 are the identity and the aggregate reads the rows. Every choice
between two forms of a step rests on public numbers only (``dpsql.bound.shape.Shape``), and both
forms return the same totals. The engine runs the tree's DuckDB text, generated once
(``bounded_query``); no SQL text is parsed again but what ``dpsql.analyze`` gives as text
(``dpsql.bound.nodes.fragment``).
"""

from __future__ import annotations

from collections.abc import Callable

import sqlglot
from sqlglot import exp

from dpsql.analyze.analysis import Analysis
from dpsql.bound.aggregate import aggregated, answer, list_measures
from dpsql.bound.caps import kept, row_cap
from dpsql.bound.nodes import alias, column, columns, cte, select, table, with_ctes
from dpsql.bound.per_unit import aggregates, capped, direct, listed
from dpsql.bound.pivot import pivot_cells, pivoted
from dpsql.bound.relation import relation_ctes, relation_rows
from dpsql.bound.shape import Shape
from dpsql.bound.specs import Bounding
from dpsql.bound.values import counted, grid_units
from dpsql.errors import UnsupportedQueryError
from dpsql.sql.parse import DIALECT

Step = Callable[[Shape], list[exp.CTE]]


def relation(shape: Shape) -> list[exp.CTE]:
    """What the relation's rows read: a pinned cell's units, the public keys' domains."""
    return relation_ctes(shape.analysis)


def rows(shape: Shape) -> list[exp.CTE]:
    """``_rows``: the relation's rows, at most R per unit when R is set."""
    return row_cap(shape, relation_rows(shape.analysis, shape.bounding))


def vals(shape: Shape) -> list[exp.CTE]:
    """``_vals``: each value in grid units (or, counted only, NaN as NULL)."""
    out = [column("_u"), *columns(shape.keys), *([column("_w")] if shape.weighted else [])]
    for i, v in enumerate(shape.bounding.values):
        value = grid_units(i, v.grid) if v.grid is not None else counted(i, v.expr, shape.analysis)
        out.append(alias(value, f"_v{i}"))
    return [cte("_vals", select(out, table("_rows")))]


def units(shape: Shape) -> list[exp.CTE]:
    """``_units``, ``_kept`` and ``_capped``: per (unit, group), L0's choice of groups and C's
    cap; or, where no per-unit bound can bind, the rows as they are."""
    bounding, keys = shape.bounding, shape.keys
    if bounding.direct:
        return [cte("_capped", direct(keys, bounding, shape.squared, shape.weighted))]
    per_unit = aggregates(bounding, shape.squared, shape.weighted)
    cells = pivot_cells(shape.analysis.keys, bounding)
    if cells is not None:
        assert bounding.max_groups is not None  # pivot_cells: only where L0 ranks
        ranked = pivoted(per_unit, cells, bounding.max_groups)
    else:
        grouped = columns(["_u", *keys])
        out = [*grouped, *(alias(a.node(), a.name) for a in per_unit)]
        out += [listed(i, v) for i, v in enumerate(bounding.values) if v.listed]
        by_unit = select(out, table("_vals"), group=columns(["_u", *keys]))
        ranked = [cte("_units", by_unit), *kept(shape)]
    return [*ranked, cte("_capped", capped(keys, bounding, shape.squared))]


def aggregate(shape: Shape) -> list[exp.CTE]:
    """``_x<j>`` for each listed measurement, then ``_agg``."""
    return [*list_measures(shape), aggregated(shape)]


# The CTE steps in pipeline order; the answer (``dpsql.bound.aggregate.answer``) reads the last.
STEPS: tuple[Step, ...] = (relation, rows, vals, units, aggregate)


def bounded_ctes(shape: Shape, rows_from: exp.CTE | None = None) -> list[exp.CTE]:
    """The bounded query's CTEs in pipeline order. ``rows_from``: a CTE of the relation's rows
    (``relation_rows``, with any more columns) that the steps then read instead of building
    the relation themselves (``dpsql.bound.together``)."""
    if rows_from is None:
        return [c for step in STEPS for c in step(shape)]
    names = ["_u", *shape.keys, *(f"_x{i}" for i in range(len(shape.bounding.values)))]
    own = select(columns(names), table(rows_from.alias))
    after = STEPS[STEPS.index(rows) + 1 :]
    return [
        *relation(shape),
        rows_from,
        *row_cap(shape, own),
        *(c for s in after for c in s(shape)),
    ]


def bound_contributions(analysis: Analysis, bounding: Bounding) -> exp.Select:
    """The bounded query of ``analysis`` as a tree: one row per group, one column per
    measurement."""
    shape = Shape.of(analysis, bounding)
    return with_ctes(answer(shape), bounded_ctes(shape))


def bounded_query(analysis: Analysis, bounding: Bounding) -> str:
    """The bounded query as the engine runs it (``Plan.engine_sql``): the DuckDB text of a tree
    built for it alone, which the generator may change in place instead of copying it first."""
    return bound_contributions(analysis, bounding).sql(dialect=DIALECT, copy=False)


def parse_bounded(text: str) -> exp.Select:
    """The tree of a bounded query's text (an engine's EXPLAIN of the text it runs)."""
    try:
        parsed = sqlglot.parse_one(text, read=DIALECT)
    except RecursionError:
        raise UnsupportedQueryError("the query is nested too deeply") from None
    assert isinstance(parsed, exp.Select)
    return parsed


__all__ = ["STEPS", "bound_contributions", "bounded_ctes", "bounded_query", "parse_bounded"]
