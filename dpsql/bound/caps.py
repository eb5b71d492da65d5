"""Keyed-hash caps on one unit's contribution: R's window over a unit's rows (``_row_cap``)
and L0's ranking of a unit's groups (``_kept``), each applied only to the units that exceed it.
"""

from __future__ import annotations

from dpsql.bound.specs import SALT_PARAMETER, Bounding


def _ranked_where_needed(table: str, needing: str, qualify: str) -> str:
    """``table``'s rows, the units listed in ``needing`` only through the ranking window
    ``qualify``: the others keep every row, which is what the window would keep too. IS NOT
    DISTINCT FROM: rows with a NULL unit are one unit here as everywhere else (USING would match
    no NULL, and such a unit would escape the window)."""
    on = f"{table}._u IS NOT DISTINCT FROM {needing}._u"
    return (
        f"SELECT * FROM {table} ANTI JOIN {needing} ON {on} UNION ALL "
        f"SELECT * FROM (SELECT {table}.* FROM {table} SEMI JOIN {needing} ON {on}) {qualify}"
    )


def _row_cap(rows: str, keys: list[str], n_values: int, r: int | None, weighted: bool) -> str:
    """The CTEs ending in ``_rows``: with a total row cap R, each unit keeps R of its rows,
    ranked by a keyed hash of the row (DESIGN.md section 3): a function of the unit's own rows,
    so stability holds.

    Rows that tie on the hash are ordered by the columns themselves, so what is left tied is
    identical in every column a measurement reads (the unit, the keys, the raw values): which
    copy is kept cannot change any total, and the kept multiset is a function of the unit's
    rows whatever order the engine meets them in. (Numbering the copies first, to hash each
    apart, costs a window over every row partitioned by all the columns.) Only the units with
    more than R rows (``_heavy``) go through the window: the others keep every row, which is
    what the window would keep too.
    """
    if r is None:
        return f"_rows AS ({rows}), "
    if weighted:
        return _weighted_row_cap(rows, keys, r)
    columns = [*keys, *(f"_x{i}" for i in range(n_values))]
    order = ", ".join(["_u", *columns, f"CAST(${SALT_PARAMETER} AS BIGINT)"])
    ties = "".join(f", {c}" for c in columns)
    window = f"QUALIFY ROW_NUMBER() OVER (PARTITION BY _u ORDER BY hash({order}){ties}) <= {r}"
    return (
        f"_all AS ({rows}), "
        f"_heavy AS (SELECT _u FROM _all GROUP BY _u HAVING COUNT(*) > {r}), "
        f"_rows AS ({_ranked_where_needed('_all', '_heavy', window)}), "
    )


def _weighted_row_cap(rows: str, keys: list[str], r: int) -> str:
    """R's window when the query reads no value, only the unit and the keys: the copies of one
    (unit, keys) row are counted first (``_w``), and each unit keeps, in the order of the keyed
    hash of its distinct rows, whole rows until R is reached and part of the next, which is what
    the window over the rows keeps (identical rows tie, and are taken in a block), ranking far
    fewer rows."""
    group = ", ".join(["_u", *keys])
    order = ", ".join(["_u", *keys, f"CAST(${SALT_PARAMETER} AS BIGINT)"])
    ties = "".join(f", {k}" for k in keys)
    on = "_all._u IS NOT DISTINCT FROM _heavy._u"
    before = (
        f"COALESCE(SUM(_w) OVER (PARTITION BY _u ORDER BY hash({order}){ties} "
        "ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)"
    )
    return (
        f"_all AS (SELECT {group}, COUNT(*) AS _w FROM ({rows}) GROUP BY {group}), "
        f"_heavy AS (SELECT _u FROM _all GROUP BY _u HAVING SUM(_w) > {r}), "
        f"_rows AS (SELECT * FROM _all ANTI JOIN _heavy ON {on} UNION ALL "
        f"SELECT * EXCLUDE (_w, _b), LEAST(_w, {r} - _b) AS _w FROM (SELECT *, {before} AS _b "
        f"FROM _all SEMI JOIN _heavy ON {on}) WHERE _b < {r}), "
    )


def _picked(keys: list[str], bounding: Bounding) -> str:
    """The CTEs ending in ``_picked`` (a workload family's bounding, ``Bounding.select_at``):
    each unit keeps its L0 groups of the chosen keys, ranked by the keyed hash of (unit, those
    keys) exactly as a query grouped by them alone ranks its groups (``_kept``), then at most C
    of its rows in each such group, ranked by the keyed hash of the row. Both depend on the
    unit's own rows only; ties left in the row order are identical in every column a
    measurement reads, so which copy is kept cannot change a total."""
    assert bounding.select_at is not None
    chosen = [keys[p] for p in bounding.select_at]
    salt = f"CAST(${SALT_PARAMETER} AS BIGINT)"
    listed = ", ".join(chosen)
    groups = f"_gs AS (SELECT _u, {listed} FROM _rows GROUP BY _u, {listed}), "
    ranked = "SELECT * FROM _gs"
    if bounding.max_groups is not None:
        order = ", ".join(["_u", *chosen, salt])
        ranked += (f" QUALIFY ROW_NUMBER() OVER (PARTITION BY _u ORDER BY hash({order})"
                   f"{''.join(f', {k}' for k in chosen)}) <= {bounding.max_groups}")  # fmt: skip
    on = " AND ".join(f"_rows.{k} IS NOT DISTINCT FROM _gk.{k}" for k in ["_u", *chosen])
    columns = [*keys, *(f"_x{i}" for i in range(len(bounding.values)))]
    row_order = ", ".join(["_u", *columns, salt])
    ties = "".join(f", {c}" for c in columns)
    window = (f"QUALIFY ROW_NUMBER() OVER (PARTITION BY _u, {listed} ORDER BY "
              f"hash({row_order}){ties}) <= {bounding.max_rows}")  # fmt: skip
    return (
        f"{groups}_gk AS ({ranked}), "
        f"_picked AS (SELECT * FROM (SELECT _rows.* FROM _rows SEMI JOIN _gk ON {on}) {window}), "
    )


def _kept(bounding: Bounding, keys: list[str], size: int | None) -> tuple[str, str]:
    """The ``_multi`` CTE (if any) and the query of ``_kept``: at most L0 groups per unit,
    ranked by a salted hash of (unit, keys), which depends only on the unit's own rows."""
    l0 = bounding.max_groups
    if bounding.direct:
        return "", ""
    if l0 is None or not keys:
        return "", "SELECT * FROM _units"
    # The salt is a parameter the engine binds: the plan, EXPLAIN and the bounded SQL text
    # never hold it (DESIGN.md section 3, step 4: a secret salt).
    order = ", ".join(["_u", *keys, f"CAST(${SALT_PARAMETER} AS BIGINT)"])
    window = f"QUALIFY ROW_NUMBER() OVER (PARTITION BY _u ORDER BY hash({order})) <= {l0}"
    if size is not None and size >= 4 * l0:
        # Many more public key combinations than L0: most units are expected to exceed L0, and
        # finding those that do not would cost more than ranking them too (same kept groups).
        return "", f"SELECT * FROM _units {window}"
    # Only units with more than L0 groups need the (expensive) ranking window.
    multi = f"_multi AS (SELECT _u FROM _units GROUP BY _u HAVING COUNT(*) > {l0}), "
    return multi, _ranked_where_needed("_units", "_multi", window)
