"""Keyed-hash caps on one unit's contribution: R's window over a unit's rows (``row_cap``) and
L0's ranking of a unit's groups (``kept``), each applied only to the units that exceed it.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlglot import exp

from dpsql.bound.nodes import (
    Node,
    alias,
    column,
    columns,
    cte,
    first_rows,
    func,
    join,
    least,
    number,
    salted_hash,
    same,
    select,
    star,
    subquery,
    table,
    union_all,
    window,
)
from dpsql.bound.shape import Shape


def _ranked_where_needed(name: str, needing: str, qualify: Node) -> exp.Union:
    """``name``'s rows, the units listed in ``needing`` only through the ranking window
    ``qualify``: the others keep every row, which is what the window would keep too. IS NOT
    DISTINCT FROM: rows with a NULL unit are one unit here as everywhere else (USING would match
    no NULL, and such a unit would escape the window)."""

    def on() -> Node:
        return same(column("_u", name), column("_u", needing))

    rest = select([star()], table(name), joins=[join(table(needing), "ANTI", on=on())])
    heavy = select([star(name)], table(name), joins=[join(table(needing), "SEMI", on=on())])
    return union_all(rest, select([star()], subquery(heavy), qualify=qualify))


def _heavy(source: str, count: Node, limit: int) -> exp.Select:
    """The units of ``source`` whose ``count`` exceeds ``limit``."""
    return select(
        [column("_u")],
        table(source),
        group=[column("_u")],
        having=exp.GT(this=count, expression=number(limit)),
    )


def row_cap(shape: Shape, rows: exp.Expression) -> list[exp.CTE]:
    """The CTEs ending in ``_rows``: with a total row cap R, each unit keeps R of its rows,
    ranked by a keyed hash of the row (DESIGN.md section 3): a function of the unit's own rows,
    so stability holds.

    Rows that tie on the hash are ordered by the columns themselves, so what is left tied is
    identical in every column a measurement reads (the unit, the keys, the raw values): which
    copy is kept cannot change any total, and the kept multiset is a function of the unit's
    rows whatever order the engine meets them in. (Numbering the copies first, to hash each
    apart, costs a window over every row partitioned by all the columns.) Only the units with
    more than R rows (``_heavy``) are ranked, by a top-R aggregate (``_top_where_needed``): the
    others keep every row, which is what the ranking would keep too.
    """
    r = shape.bounding.max_total_rows
    if r is None:
        return [cte("_rows", rows)]
    if shape.weighted:
        return _weighted_row_cap(shape.keys, rows, r)
    names = shape.row_columns
    order = [salted_hash(column("_u"), *columns(names)), *columns(names)]
    return [
        cte("_all", rows),
        cte("_heavy", _heavy("_all", func("COUNT", exp.Star()), r)),
        cte(
            "_rows",
            _top_where_needed("_all", "_heavy", names, order, r)
            if names
            else _ranked_where_needed("_all", "_heavy", first_rows([column("_u")], order, r)),
        ),
    ]


def _top_where_needed(
    name: str, needing: str, names: Sequence[str], order: Sequence[Node], r: int
) -> exp.Union:
    """``name``'s rows, each unit listed in ``needing`` down to its first ``r`` rows in the order
    ``order``: a top-r aggregate per unit (``ARG_MIN(row, key, r)``, the rows whose key struct
    is least, then unnested), where a window would sort every row of the unit (measured 0.7x
    the window's time on 2.2M rows of heavy units, ``benchmarks/README.md``). The key holds
    every column after the hash, so ties are rows equal in every column and which copy is kept
    changes nothing; a struct orders field by field, NULL last and NaN above infinity, as the
    window's ORDER BY does. The other units keep every row, as in ``_ranked_where_needed``."""

    def on() -> Node:
        return same(column("_u", name), column("_u", needing))

    def fields(nodes: Sequence[tuple[str, Node]]) -> exp.Struct:
        return exp.Struct(
            expressions=[exp.PropertyEQ(this=exp.to_identifier(f), expression=n) for f, n in nodes]
        )

    rest = select([star()], table(name), joins=[join(table(needing), "ANTI", on=on())])
    heavy = select([star(name)], table(name), joins=[join(table(needing), "SEMI", on=on())])
    row = fields([(n, column(n)) for n in names])
    key = fields([(f"_o{i}", node.copy()) for i, node in enumerate(order)])
    top = exp.ArgMin(this=row, expression=key, count=number(r))
    kept = select([column("_u"), alias(exp.Explode(this=top), "_t")], subquery(heavy),
                  group=[column("_u")])  # fmt: skip
    back = [
        alias(exp.Bracket(this=column("_t"), expressions=[exp.Literal.string(n)]), n) for n in names
    ]
    return union_all(rest, select([column("_u"), *back], subquery(kept)))


def _weighted_row_cap(keys: Sequence[str], rows: exp.Expression, r: int) -> list[exp.CTE]:
    """R's window when the query reads no value, only the unit and the keys: the copies of one
    (unit, keys) row are counted first (``_w``), and each unit keeps, in the order of the keyed
    hash of its distinct rows, whole rows until R is reached and part of the next, which is what
    the window over the rows keeps (identical rows tie, and are taken in a block), ranking far
    fewer rows."""
    group = ["_u", *keys]
    copies = alias(func("COUNT", exp.Star()), "_w")
    counted = select([*columns(group), copies], subquery(rows), group=columns(group))

    def on() -> Node:
        return same(column("_u", "_all"), column("_u", "_heavy"))

    spec = exp.WindowSpec(kind="ROWS", start="UNBOUNDED", start_side="PRECEDING",
                          end=number(1), end_side="PRECEDING")  # fmt: skip
    order = [salted_hash(*columns(group)), *columns(keys)]
    running = window(func("SUM", column("_w")), [column("_u")], order, spec)
    before = alias(exp.Coalesce(this=running, expressions=[number(0)]), "_b")
    ranked = select([star(), before], table("_all"),
                    joins=[join(table("_heavy"), "SEMI", on=on())])  # fmt: skip
    left = exp.Sub(this=number(r), expression=column("_b"))
    partial = select(
        [exp.Star(except_=columns(["_w", "_b"])), alias(least(column("_w"), left), "_w")],
        subquery(ranked),
        where=exp.LT(this=column("_b"), expression=number(r)),
    )
    rest = select([star()], table("_all"), joins=[join(table("_heavy"), "ANTI", on=on())])
    return [
        cte("_all", counted),
        cte("_heavy", _heavy("_all", func("SUM", column("_w")), r)),
        cte("_rows", union_all(rest, partial)),
    ]


def kept(shape: Shape) -> list[exp.CTE]:
    """``_multi`` (if any) and ``_kept``: at most L0 groups per unit, ranked by a salted hash of
    (unit, keys), which depends only on the unit's own rows."""
    l0, keys = shape.bounding.max_groups, shape.keys
    if l0 is None or not keys:
        return [cte("_kept", select([star()], table("_units")))]
    # The salt is a parameter the engine binds: the plan, EXPLAIN and the bounded SQL text
    # never hold it (DESIGN.md section 3, step 4: a secret salt).
    window_ = first_rows([column("_u")], [salted_hash(*columns(["_u", *keys]))], l0)
    if shape.size is not None and shape.size >= 4 * l0:
        # Many more public key combinations than L0: most units are expected to exceed L0, and
        # finding those that do not would cost more than ranking them too (same kept groups).
        return [cte("_kept", select([star()], table("_units"), qualify=window_))]
    # Only units with more than L0 groups need the (expensive) ranking window.
    multi = _heavy("_units", func("COUNT", exp.Star()), l0)
    return [cte("_multi", multi), cte("_kept", _ranked_where_needed("_units", "_multi", window_))]


__all__ = ["kept", "row_cap"]
