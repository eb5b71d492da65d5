"""L0's ranking per unit in one row: the ``_units`` and ``_kept`` steps when the public keys have
few combinations (at most ``PIVOT_CELLS``).

``_kept`` (``dpsql.bound.caps``) ranks a unit's (unit, keys) groups by the keyed hash
``hash(_u, keys, salt)`` and keeps the first L0: a window partitioned by the unit over the
per-(unit, keys) rows. With a public domain of K key combinations the same choice is made per
unit in one row: aggregate each combination's rows in a column of its own (``_pivot``: one
GROUP BY of the units instead of (unit, keys) and a second pass by unit), compute the K hashes of
(unit, combination, salt), and keep combination j iff the unit has a row there and fewer than
L0 of its other present combinations come first in the order (hash, j). That is the window's
order (hash, then its ties, which only a collision of a 64-bit keyed hash makes), over the
groups the unit has, so the same groups are kept with the same aggregates. The rows then come
back as (unit, keys) rows (``_kept``: a cross join with the K combinations) for the C cap.

Only a speed choice, on public numbers: Spark shuffles the (unit, keys) rows twice and sorts
them for the window, where this form shuffles per-unit rows once.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from sqlglot import exp

from dpsql.analyze.analysis import GroupKey
from dpsql.bound.filters import typed_value
from dpsql.bound.nodes import (
    Node,
    alias,
    all_of,
    column,
    cte,
    join,
    number,
    salted_hash,
    same,
    select,
    table,
    values,
    when,
)
from dpsql.bound.per_unit import Aggregate
from dpsql.bound.specs import Bounding

# Key combinations up to which L0's ranking runs per unit in one row: each adds a column per
# per-unit aggregate, and the rank of each combination compares it with every other (K² terms).
PIVOT_CELLS = 8

# A key combination: one value per key, each built anew on every call.
Cell = tuple[Callable[[], Node], ...]


def pivot_cells(keys: Sequence[GroupKey], bounding: Bounding) -> list[Cell] | None:
    """Every public key combination as values of the keys' types, when ``_kept`` may rank per
    unit in one row; None otherwise: no ranking, a total row cap (R's window comes first), a
    value summed or listed (a sum, a quantile, distinct values: see below), a workload family's
    bounding, a key whose domain is a table, or more than ``PIVOT_CELLS`` combinations.

    Counts only: with K combinations each row updates K aggregates of the unit, and K exact
    sums (HUGEINT on DuckDB, DECIMAL(38,0) on Spark) per row cost more than the window saves
    (measured at 10M rows: SUM 1.1x and STDDEV 2.2x the window's time on Spark, 1.6-2.4x on
    DuckDB; COUNT 0.53x and a CASE histogram 0.38x on Spark, 0.95-1.01x and 0.75x on
    DuckDB)."""
    if (
        bounding.max_groups is None
        or bounding.direct
        or bounding.max_total_rows is not None
        or any(v.listed or v.grid is not None for v in bounding.values)
        or not keys
    ):
        return None
    per_key: list[list[Callable[[], Node]]] = []
    for key in keys:
        if key.engine_type is None or key.domain is None or key.domain_table is not None:
            return None
        texts = [None if v is None else str(v) for v in key.domain]
        if key.other:
            texts.append(key.other_text)
        per_key.append([_value(t, key.engine_type) for t in texts])
    cells = list(itertools.product(*per_key))
    if not bounding.max_groups < len(cells) <= PIVOT_CELLS:
        return None
    return cells


def _value(text: str | None, engine_type: str) -> Callable[[], Node]:
    return lambda: typed_value(text, engine_type)


def _pivot(aggregates: Sequence[Aggregate], cells: Sequence[Cell]) -> exp.Select:
    """Per unit, each aggregate over the rows of each combination j (``<name>__<j>``), and the
    combination's keyed hash ``_h__<j>``."""
    out: list[Node] = [column("_u")]
    for j, cell in enumerate(cells):
        only = all_of([same(column(f"_k{i}"), value()) for i, value in enumerate(cell)])
        out += [alias(a.node(only.copy()), f"{a.name}__{j}") for a in aggregates]
        out.append(alias(salted_hash(column("_u"), *(value() for value in cell)), f"_h__{j}"))
    return select(out, table("_vals"), group=[column("_u")])


def _is(j: int) -> exp.EQ:
    return exp.EQ(this=column("_j", "_d"), expression=number(j))


def _kept_if(j: int, n_cells: int, l0: int) -> Node:
    """Combination j is kept: the unit has a row there, and fewer than L0 of its other present
    combinations come before it in the order (hash, index), the window's order and ties."""

    def ahead(i: int) -> Node:
        before = exp.LTE if i < j else exp.LT
        comes = before(this=column(f"_h__{i}"), expression=column(f"_h__{j}"))
        test = exp.And(this=_present(i), expression=comes)
        return when((test, number(1)), otherwise=number(0))

    others = [ahead(i) for i in range(n_cells) if i != j]
    count = others[0]
    for term in others[1:]:
        count = exp.Add(this=count, expression=term)
    return exp.And(this=_present(j), expression=exp.LT(this=count, expression=number(l0)))


def _present(j: int) -> Node:
    return exp.GT(this=column(f"_n__{j}"), expression=number(0))


def pivoted(aggregates: Sequence[Aggregate], cells: Sequence[Cell], l0: int) -> list[exp.CTE]:
    """The CTEs ``_pivot`` and ``_kept`` that replace ``_units`` and ``_kept``: ``_kept`` has
    ``_units``' columns, one row per group a unit keeps."""
    n_keys, n_cells = len(cells[0]), len(cells)
    keys = [f"_k{i}" for i in range(n_keys)]

    def pick(name: str) -> Node:
        return exp.Case(
            ifs=[exp.If(this=_is(j), true=column(f"{name}__{j}")) for j in range(n_cells)]
        )

    kept_if = exp.Case(
        ifs=[exp.If(this=_is(j), true=_kept_if(j, n_cells, l0)) for j in range(n_cells)]
    )
    rows = [[number(j), *(value() for value in cell)] for j, cell in enumerate(cells)]
    combinations = values(rows, "_d", ["_j", *keys])
    selected: list[Node] = [column("_u", "_pivot"), *(column(k, "_d") for k in keys)]
    selected += [alias(pick(a.name), a.name) for a in aggregates]
    kept = select(selected, table("_pivot"), joins=[join(combinations, "CROSS")], where=kept_if)
    return [cte("_pivot", _pivot(aggregates, cells)), cte("_kept", kept)]


__all__ = ["PIVOT_CELLS", "pivot_cells", "pivoted"]
