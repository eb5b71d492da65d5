"""The engine's query of a query's bound choices (``dpsql.bounds = auto``; ``dpsql.plan.auto``).

It reads the relation the query bounds (``dpsql.bound.relation``: after joins, WHERE, the
public domains and a pinned cell, before any bound), so each choice sees the rows the answer
will be bounded from, and returns histograms, one row per (statistic, value):

* ``_b = 0``: per unit, its rows (R's walk);
* ``_b = 1``: per unit, its groups (L0's walk);
* ``_b = 2``: per unit, its largest group's rows (C's walk over private keys);
* ``_b = 3``: per (unit, group) cell, its rows (C's walk over public keys: cells, not units).

``_v`` is the value and ``_n`` how many units (cells) have it. Nothing here is released: the
walks (``dpsql.release.auto_bounds``) turn it into counts beyond each rung, each of which one
unit moves by at most one (G for the cells), in one direction.
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
    with_ctes,
)
from dpsql.bound.relation import relation_ctes, relation_rows
from dpsql.bound.specs import Bounding
from dpsql.sql.parse import DIALECT

UNIT_ROWS, UNIT_GROUPS, LARGEST_GROUP, CELL_ROWS = 0, 1, 2, 3


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
        cells = select([column("_u"), alias(count.copy(), "_c")], table("_rows"),
                       group=columns(["_u", *keys]))  # fmt: skip
        units = select(
            [alias(count.copy(), "_g"), alias(func("MAX", column("_c")), "_m")],
            table("_cells"),
            group=[column("_u")],
        )
        ctes += [cte("_cells", cells), cte("_pg", units)]
        for statistic, value, source in (
            (UNIT_GROUPS, "_g", "_pg"),
            (LARGEST_GROUP, "_m", "_pg"),
            (CELL_ROWS, "_c", "_cells"),
        ):
            query = union_all(query, _histogram(statistic, value, source))
    return with_ctes(query, ctes).sql(dialect=DIALECT)


__all__ = ["CELL_ROWS", "LARGEST_GROUP", "UNIT_GROUPS", "UNIT_ROWS", "selection_query"]
