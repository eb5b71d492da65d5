"""A diagnosed query as one statement: the bounded answer and the diagnosis's histogram read
the relation's rows once.

The bounded query (``dpsql.bound.rewrite``) and the diagnosis (``dpsql.bound.diagnosis``) both
start from the same rows: the relation after joins, WHERE and the public domains' filter,
before any bound (``relation_rows``). Run apart, the engine computes those rows twice, and on
joined tables they are most of the work. Here they are one CTE, ``_rel``, with the columns of
both (the diagnosis's unclamped values besides the bounded query's), materialised once; the
bounded query's steps read its columns ``_u``, ``_k<i>`` and ``_x<i>`` as ``_rows``, exactly the
rows they read alone, and the diagnosis's chain reads ``_rel`` as it reads ``_rows`` alone.

Both also count each unit's rows, and the diagnosis's per-unit row (``_du``) is what R's and L0's
"which units exceed the cap" steps group by again: here those steps read it instead
(``_shared``), so a unit's rows are counted once, and a count-only query's (unit, keys) counts,
which R's weighted window already computes (``_all``), are the diagnosis's as they are.

The answer's rows come first, tagged ``_which = 0``, then the histogram's, tagged 1
(``split``). Nothing of the privacy contract changes: both outputs are computed by the same
trees as apart (same sensitivities, same event, charged before the statement runs).

>>> split([(0, "a", 3, None, None), (1, None, None, 0, 7)], 2)
([('a', 3)], [(0, 7)])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from sqlglot import exp

from dpsql.analyze.analysis import Analysis
from dpsql.bound.aggregate import answer
from dpsql.bound.diagnosis import diagnosis_parts
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
    when,
    with_ctes,
)
from dpsql.bound.relation import relation_rows
from dpsql.bound.rewrite import bounded_ctes
from dpsql.bound.shape import Shape
from dpsql.bound.specs import Bounding
from dpsql.errors import InternalError

__all__ = ["diagnosed_query", "split"]


def diagnosed_query(
    analysis: Analysis, bounding: Bounding, flags: Sequence[str], limits: Mapping[str, int]
) -> tuple[exp.Union, int]:
    """The one statement, and the number of the answer's columns (``split`` needs it)."""
    shape = Shape.of(analysis, bounding)
    if bounding.max_total_rows is not None and not bounding.values:
        # R's window over (unit, keys) rows with their copies keeps the rows the window over
        # rows keeps (``caps._weighted_row_cap``); the diagnosis groups those rows anyway, so the
        # weighted form costs nothing more here, whatever the number of key combinations.
        shape = replace(shape, weighted=True)
    extra, flag, chain, histogram = diagnosis_parts(
        analysis, bounding, flags, limits, source="_rel"
    )
    rel = cte("_rel", relation_rows(analysis, bounding, extra))
    bounded, chain = _shared(shape, bounded_ctes(shape, rel), chain, flag)
    if sum(_reads(c.this, "_rel") for c in bounded) > 1:
        # Read twice: materialised, so the engine computes the rows once whatever its default.
        rel.set("materialized", True)
    main = answer(shape)
    if any(isinstance(e, exp.Star) for e in main.expressions):
        raise InternalError("a bounded answer with a star among its columns")
    width = len(main.expressions)
    ctes = [
        *bounded,
        *chain,
        cte("_main", main),
        cte("_hist", histogram),
    ]
    nothing = cast(exp.null(), Type.BIGINT)
    first = select(
        [alias(number(0), "_which"), exp.Column(this=exp.Star(), table=exp.to_identifier("_main")),
         alias(nothing, "_p"), alias(nothing.copy(), "_z")],
        table("_main"),
    )  # fmt: skip
    second = select(
        [number(1), *(exp.null() for _ in range(width)), column("_p"), column("_z")],
        table("_hist"),
    )
    return with_ctes(union_all(first, second), ctes), width


def _reads(node: exp.Expression, name: str) -> bool:
    return any(t.name == name for t in node.find_all(exp.Table))


def _shared(
    shape: Shape, bounded: list[exp.CTE], chain: list[exp.CTE], flag: exp.Expression
) -> tuple[list[exp.CTE], list[exp.CTE]]:
    """The bounded CTEs with the diagnosis's ``_dg`` and ``_du`` among them, and the rest of its
    chain (``_dp``). Each rewrite reads the same rows as the CTE it replaces, so the totals and
    the histogram are unchanged:

    * R's ``_heavy`` (units of ``_all`` with more than R rows) is the units whose ``_tot``
      exceeds R: ``_du`` counts the rows of ``_rel``, which ``_all`` holds one for one (or, for a
      weighted ``_all``, as ``_w`` copies of each (unit, keys) row);
    * without R, L0's ``_multi`` (units of ``_units`` in more than L0 groups) is the units whose
      ``_g`` exceeds L0: ``_units`` groups ``_rel``'s rows by (unit, keys) as ``_dg`` does;
    * a weighted ``_all`` is ``_dg`` itself: the same grouping of the same rows, its ``_w`` the
      diagnosis's ``_n``; no value is aggregated, so no clamp can flag a unit (``_cl`` = 0);
    * over few public key combinations, ``_du`` reads ``_pivot``'s row per unit
      (``_from_pivot``), and no ``_dg`` is needed;
    * without R, ``_units`` is ``_dg`` too: it groups every row of ``_rel`` by (unit, keys), its
      ``_n`` their count; the rows carry the clamp flag (``row_flag``) through ``_vals`` to a
      ``MAX`` in ``_units``, the diagnosis's ``_cl``.

    Where ``_dg`` no longer reads ``_rel``, ``_rel`` is read once and is not materialised.
    """
    dg, du, rest = chain[0], chain[1], chain[2:]
    names = [c.alias for c in bounded]
    r, l0 = shape.bounding.max_total_rows, shape.bounding.max_groups
    keys = columns(["_u", *shape.keys])
    if shape.weighted:  # no value is read (``Shape.of``), so no clamp and no extra column
        dg = cte("_dg", select([*keys, alias(column("_w"), "_n"), alias(number(0), "_cl")],
                               table("_all")))  # fmt: skip
        after = names.index("_all") + 1
    elif r is None and "_units" in names:
        by_name = {c.alias: c.this for c in bounded}
        by_name["_rows"].select(alias(flag, "_f"), copy=False)
        by_name["_vals"].select(column("_f"), copy=False)
        by_name["_units"].select(alias(func("MAX", column("_f")), "_cl"), copy=False)
        dg = cte("_dg", select([*keys, column("_n"), column("_cl")], table("_units")))
        after = names.index("_units") + 1
    elif "_pivot" in names:
        # Counts only (``pivot_cells``): no clamp, and each unit's row holds its cells' counts.
        return _from_pivot(bounded, du), rest
    else:
        after = names.index("_rel") + 1
    over = {"_heavy": (r, "_tot"), "_multi": (l0 if r is None else None, "_g")}
    out = []
    for c in bounded:
        limit, what = over.get(c.alias, (None, ""))
        out.append(c if limit is None else cte(c.alias, _units_over(limit, what)))
    return [*out[:after], dg, du, *out[after:]], rest


def _from_pivot(bounded: list[exp.CTE], du: exp.CTE) -> list[exp.CTE]:
    """The bounded CTEs with ``_du`` read from ``_pivot``'s row per unit instead of grouping the
    rows again: the unit's groups are its cells with a row, its largest group's rows the most of
    its cells' counts, its rows their sum (every row of ``_rel`` lies in one cell of the public
    domain, the other group included)."""
    names = [c.alias for c in bounded]
    pivot = bounded[names.index("_pivot")].this
    cells = sum(1 for e in pivot.expressions if e.alias.startswith("_h__"))
    counts = [column(f"_n__{j}") for j in range(cells)]
    present = [when((exp.GT(this=n.copy(), expression=number(0)), number(1)), otherwise=number(0))
               for n in counts]  # fmt: skip
    per_unit = select(
        [column("_u"), alias(_added(present), "_g"),
         alias(exp.Greatest(this=counts[0].copy(), expressions=[n.copy() for n in counts[1:]]),
               "_mx"),
         alias(_added(counts), "_tot"), alias(number(0), "_cl")],
        table("_pivot"),
    )  # fmt: skip
    after = names.index("_pivot") + 1
    return [*bounded[:after], cte(du.alias, per_unit), *bounded[after:]]


def _added(terms: Sequence[exp.Expression]) -> exp.Expression:
    out = terms[0].copy()
    for term in terms[1:]:
        out = exp.Add(this=out, expression=term.copy())
    return out


def _units_over(limit: int, what: str) -> exp.Select:
    """The units of ``_du`` whose ``what`` exceeds ``limit``."""
    over = exp.GT(this=column(what), expression=number(limit))
    return select([column("_u")], table("_du"), where=over)


def split(
    rows: list[tuple[Any, ...]], width: int
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The answer's rows (in the order the engine gave them) and the histogram's (pattern,
    units) rows, from the rows of ``diagnosed_query``."""
    answer_rows = [row[1 : 1 + width] for row in rows if row[0] == 0]
    patterns = [row[1 + width :] for row in rows if row[0] == 1]
    return answer_rows, patterns
