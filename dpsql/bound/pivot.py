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
from collections.abc import Sequence
from dataclasses import dataclass

from dpsql.analyze.analysis import GroupKey
from dpsql.analyze.domains import value_sql
from dpsql.bound.specs import SALT_PARAMETER, Bounding

# Key combinations up to which L0's ranking runs per unit in one row: each adds a column per
# per-unit aggregate, and the rank of each combination compares it with every other (K² terms).
PIVOT_CELLS = 8


@dataclass(frozen=True)
class Aggregate:
    """One per-(unit, keys) aggregate of ``_units``: ``COUNT(arg)`` or ``COALESCE(SUM(arg), 0)``
    (``arg`` "*" for COUNT(*)), named ``name``."""

    function: str  # "COUNT" or "SUM"
    arg: str
    name: str
    # A SUM over no row is NULL: 0 instead (a group's rows all NULL; a combination with no row)
    zero: bool = True

    def sql(self, only: str | None = None) -> str:
        """The aggregate over the rows (of one key combination, where ``only`` holds)."""
        arg = self.arg
        if only is not None:
            arg = f"CASE WHEN {only} THEN {'1' if arg == '*' else arg} END"
        if self.function == "SUM":
            return f"COALESCE(SUM({arg}), 0)" if self.zero or only is not None else f"SUM({arg})"
        return f"COUNT({arg})"


def pivot_cells(keys: Sequence[GroupKey], bounding: Bounding) -> list[tuple[str, ...]] | None:
    """Every public key combination as SQL of the keys' types, when ``_kept`` may rank per unit
    in one row; None otherwise: no ranking, a total row cap (R's window comes first), a value
    summed or listed (a sum, a quantile, distinct values: see below), a workload family's
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
        or bounding.select_at is not None
        or any(v.listed or v.grid is not None for v in bounding.values)
        or not keys
    ):
        return None
    per_key: list[list[str]] = []
    for key in keys:
        if key.engine_type is None or key.domain is None or key.domain_table is not None:
            return None
        texts = [None if v is None else str(v) for v in key.domain]
        values = [value_sql(t, key.engine_type) for t in texts]
        if key.other:
            values.append(value_sql(key.other_text, key.engine_type))
        per_key.append(values)
    cells = list(itertools.product(*per_key))
    if not bounding.max_groups < len(cells) <= PIVOT_CELLS:
        return None
    return cells


def pivoted(aggregates: Sequence[Aggregate], cells: Sequence[tuple[str, ...]], l0: int) -> str:
    """The CTEs ``_pivot`` and ``_kept`` (each with its trailing comma) that replace ``_units``
    and ``_kept``: ``_kept`` has ``_units``' columns, one row per group a unit keeps."""
    n_keys = len(cells[0])
    salt = f"CAST(${SALT_PARAMETER} AS BIGINT)"
    columns = ["_u"]
    for j, cell in enumerate(cells):
        only = " AND ".join(f"_k{i} IS NOT DISTINCT FROM {value}" for i, value in enumerate(cell))
        columns += [f"{a.sql(only)} AS {a.name}__{j}" for a in aggregates]
        columns.append(f"hash(_u, {', '.join(cell)}, {salt}) AS _h__{j}")
    pivot = f"_pivot AS (SELECT {', '.join(columns)} FROM _vals GROUP BY _u), "

    def pick(name: str) -> str:
        branches = " ".join(f"WHEN _d._j = {j} THEN {name}__{j}" for j in range(len(cells)))
        return f"CASE {branches} END"

    def ahead(i: int, j: int) -> str:
        # Combination i comes before j in the order (hash, index): the window's order and ties.
        before = "<=" if i < j else "<"
        return f"CASE WHEN _n__{i} > 0 AND _h__{i} {before} _h__{j} THEN 1 ELSE 0 END"

    kept_if = " ".join(
        f"WHEN _d._j = {j} THEN _n__{j} > 0 AND "
        f"{' + '.join(ahead(i, j) for i in range(len(cells)) if i != j)} < {l0}"
        for j in range(len(cells))
    )
    listed = ", ".join(f"({j}, {', '.join(cell)})" for j, cell in enumerate(cells))
    names = ", ".join(["_j", *(f"_k{i}" for i in range(n_keys))])
    selected = ", ".join(
        ["_pivot._u", *(f"_d._k{i}" for i in range(n_keys))]
        + [f"{pick(a.name)} AS {a.name}" for a in aggregates]
    )
    kept = (
        f"_kept AS (SELECT {selected} FROM _pivot CROSS JOIN (VALUES {listed}) AS _d({names}) "
        f"WHERE CASE {kept_if} END), "
    )
    return pivot + kept


__all__ = ["PIVOT_CELLS", "Aggregate", "pivot_cells", "pivoted"]
