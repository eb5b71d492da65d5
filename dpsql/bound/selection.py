"""The engine's query of a query's bound choices (``dpsql.bounds = auto``; ``dpsql.plan.auto``).

It reads the relation the query bounds (``dpsql.bound.relation``: after joins, WHERE, the
public domains and a pinned cell, before any bound), so each choice sees the rows the answer
will be bounded from, and returns histograms, one row per (statistic, value):

* ``_b = 0``: per unit, its rows (R's walk);
* ``_b = 1``: per unit, its groups (L0's walk);
* ``_b = 2``: per unit, its largest group's rows (C's walk over private keys);
* ``_b = 3``: per (unit, group) cell, its rows (C's walk over public keys: cells, not units);
* ``_b = 4 + i``: the same for the cells of the i-th group present (groups numbered by their
  keys' order, from 0): C's walk weighs each group by its noisy size (``dpsql.plan.auto``).

``_v`` is the value and ``_n`` how many units (cells) have it. Nothing here is released: the
walks (``dpsql.release.auto_bounds``) turn it into counts beyond each rung, each of which one
unit moves by at most one (G for the cells; one per group for a group's cells), in one
direction. A group's number depends on which groups are present, so nothing may read it as a
label: the walk treats the groups alike (a sum over them, absent ones as empty).
"""

from __future__ import annotations

from dataclasses import replace

from sqlglot import exp

from dpsql.analyze.analysis import Analysis
from dpsql.bound.nodes import (
    Type,
    alias,
    cast,
    column,
    columns,
    cte,
    func,
    number,
    select,
    table,
    union_all,
    window,
    with_ctes,
)
from dpsql.bound.relation import relation_ctes, relation_rows
from dpsql.bound.specs import Bounding
from dpsql.sql.parse import DIALECT

UNIT_ROWS, UNIT_GROUPS, LARGEST_GROUP, CELL_ROWS, GROUP_CELLS = 0, 1, 2, 3, 4


def _histogram(statistic: int, value: str, source: str) -> exp.Select:
    """``SELECT statistic AS _b, value AS _v, COUNT(*) AS _n FROM source GROUP BY value``."""
    return select(
        [alias(number(statistic), "_b"), alias(cast(column(value), Type.BIGINT), "_v"),
         alias(func("COUNT", exp.Star()), "_n")],
        table(source),
        group=[column(value)],
    )  # fmt: skip


def selection_query(analysis: Analysis, bounding: Bounding, grouped: bool) -> str:
    """The histograms (module docstring) as DuckDB text; the grouped ones with ``grouped``."""
    rows = relation_rows(analysis, replace(bounding, values=()))
    count = func("COUNT", exp.Star())
    ctes = [
        *relation_ctes(analysis),
        cte("_rows", rows),
        cte("_pu", select([column("_u"), alias(count, "_r")], table("_rows"),
                          group=[column("_u")])),
    ]  # fmt: skip
    query: exp.Select | exp.Union = _histogram(UNIT_ROWS, "_r", "_pu")
    if grouped:
        keys = [f"_k{i}" for i in range(len(analysis.keys))]
        cells = select([column("_u"), *columns(keys), alias(count.copy(), "_c")],
                       table("_rows"), group=columns(["_u", *keys]))  # fmt: skip
        # Each cell's group, numbered 0, 1, .. by the keys' order (NULL keys are one group).
        rank = window(func("DENSE_RANK"), [], columns(keys))
        numbered = select([column("_c"), alias(rank, "_i")], table("_cells"))
        units = select(
            [alias(count.copy(), "_g"), alias(func("MAX", column("_c")), "_m")],
            table("_cells"),
            group=[column("_u")],
        )
        ctes += [cte("_cells", cells), cte("_pg", units), cte("_cg", numbered)]
        for statistic, value, source in (
            (UNIT_GROUPS, "_g", "_pg"),
            (LARGEST_GROUP, "_m", "_pg"),
            (CELL_ROWS, "_c", "_cells"),
        ):
            query = union_all(query, _histogram(statistic, value, source))
        per_group = select(
            [alias(exp.Add(this=number(GROUP_CELLS - 1), expression=column("_i")), "_b"),
             alias(cast(column("_c"), Type.BIGINT), "_v"), alias(count.copy(), "_n")],
            table("_cg"),
            group=columns(["_i", "_c"]),
        )  # fmt: skip
        query = union_all(query, per_group)
    return with_ctes(query, ctes).sql(dialect=DIALECT)


__all__ = [
    "CELL_ROWS",
    "GROUP_CELLS",
    "LARGEST_GROUP",
    "UNIT_GROUPS",
    "UNIT_ROWS",
    "selection_query",
]
