"""The diagnosis of a query's bounds: per unit, which contribution bounds and clamps cut it.

``diagnosis_query`` reads the relation the bounded query bounds (``relation_rows``: after joins,
WHERE and the public domains' filter, before R, L0 and C) and returns, for each pattern of
flags, the number of units whose rows show it:

* ``L0``: the unit touches more than L0 groups;
* ``C``: the unit has more than C rows in some group;
* ``R``: the unit has more than R rows in total (only when R is set);
* ``clamped``: some value of an aggregated expression is changed by a clamp: a bounded column
  inside it lies outside its bounds, or its value lies outside the expression's grid-aligned
  bounds (NULL and NaN are skipped, not clamped, and are never flagged).

Each flag is a function of the unit's own rows (and public tables), read before any bound, so
every unit lands in exactly one pattern: adding or removing one unit moves one cell of the
histogram by one (L1 = L2 = 1, the sensitivity of a histogram: Dwork, McSherry, Nissim, Smith
2006), which ``dpsql.plan.diagnosis`` calibrates. The cells are public (2^k patterns), so the
empty ones are filled with 0 after the engine runs; NULL units are one unit, as everywhere.

>>> pattern(("L0", "C"), {"L0": 2, "C": 5}).sql("duckdb")
'CASE WHEN _g > 2 THEN 1 ELSE 0 END + CASE WHEN _mx > 5 THEN 2 ELSE 0 END'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlglot import exp

from dpsql.analyze.analysis import Analysis
from dpsql.bound.nodes import (
    Node,
    Type,
    alias,
    all_of,
    any_of,
    cast,
    column,
    columns,
    cte,
    func,
    not_null,
    number,
    paren,
    select,
    table,
    when,
    with_ctes,
)
from dpsql.bound.relation import relation_ctes, relation_rows, total_of
from dpsql.bound.specs import Bounding
from dpsql.bound.values import bound_value, unclamped_value

__all__ = ["FLAGS", "diagnosis_parts", "diagnosis_query", "pattern"]

# Every flag a diagnosis may carry, in the order of their bits.
FLAGS = ("L0", "C", "R", "clamped")

# What each flag compares, over the per-unit row of ``diagnosis_query``.
_COLUMN = {"L0": "_g", "C": "_mx", "R": "_tot"}


def pattern(flags: Sequence[str], limits: Mapping[str, int]) -> Node:
    """The pattern of a unit's flags as an integer: bit j set when flag j holds."""
    terms: list[Node] = []
    for j, flag in enumerate(flags):
        if flag == "clamped":
            test: Node = exp.EQ(this=column("_cl"), expression=number(1))
        else:
            test = exp.GT(this=column(_COLUMN[flag]), expression=number(limits[flag]))
        terms.append(when((test, number(2**j)), otherwise=number(0)))
    if not terms:
        return number(0)
    out = terms[0]
    for term in terms[1:]:
        out = exp.Add(this=out, expression=term)
    return out


def _clamped(analysis: Analysis, bounding: Bounding) -> list[tuple[int, Node | None, Node]]:
    """Per value on a grid: its index i, its value with no column clamped (``_o<i>``; None for
    a bare column, where it is the raw value ``_x<i>``) and the row-level test "a clamp changes
    this value": the value lies beyond the grid-aligned bounds, where the grid clamp acts, or a
    column clamp inside the expression changed it."""
    total_ = total_of(analysis)
    out = []
    for i, v in enumerate(bounding.values):
        if v.grid is None:
            continue
        unclamped = unclamped_value(v.expr, analysis, total_)
        o = f"_x{i}" if unclamped is None else f"_o{i}"
        beyond: list[Node] = [
            exp.LT(this=column(o), expression=bound_value(v.grid.lower_value)),
            exp.GT(this=column(o), expression=bound_value(v.grid.upper_value)),
        ]
        if unclamped is not None:
            beyond.append(exp.NullSafeNEQ(this=column(f"_x{i}"), expression=column(o)))
        # NULL and NaN are skipped by every aggregate, never clamped.
        test = all_of([
            not_null(column(o)), exp.Not(this=func("isnan", column(o))), paren(any_of(beyond))
        ])  # fmt: skip
        out.append((i, unclamped, test))
    return out


def row_flag(analysis: Analysis, bounding: Bounding) -> tuple[dict[str, Node], Node]:
    """The row-level columns the diagnosis needs beyond the bounded query's (``extra`` of
    ``relation_rows``) and the row's ``clamped`` flag over them: 1 when a clamp changes one of
    its values, else 0."""
    clamps = _clamped(analysis, bounding)
    extra = {f"_o{i}": node for i, node, _ in clamps if node is not None}
    tests = [paren(test) for _, _, test in clamps]
    flagged = any_of(tests) if tests else exp.false()
    return extra, when((flagged, number(1)), otherwise=number(0))


def diagnosis_parts(
    analysis: Analysis,
    bounding: Bounding,
    flags: Sequence[str],
    limits: Mapping[str, int],
    source: str = "_rows",
) -> tuple[dict[str, Node], Node, list[exp.CTE], exp.Select]:
    """The diagnosis over the relation's rows in the CTE ``source``: the row-level columns it
    needs beyond the bounded query's and the row's clamp flag (``row_flag``), its CTEs after the
    rows, and the histogram that reads them."""
    keys = [f"_k{i}" for i in range(len(analysis.keys))]
    extra, flag = row_flag(analysis, bounding)
    group = ["_u", *keys]
    count = func("COUNT", exp.Star())
    per_group = select(
        [*columns(group), alias(count, "_n"), alias(func("MAX", flag), "_cl")],
        table(source),
        group=columns(group),
    )  # fmt: skip
    if keys:
        per_unit = select(
            [column("_u"), alias(count.copy(), "_g"), alias(func("MAX", column("_n")), "_mx"),
             alias(func("SUM", column("_n")), "_tot"), alias(func("MAX", column("_cl")), "_cl")],
            table("_dg"),
            group=[column("_u")],
        )  # fmt: skip
    else:
        # One group: a unit's row of _dg is already its only one (a second grouping by the
        # unit would cost a third of the diagnosis's time and change nothing).
        per_unit = select(
            [column("_u"), alias(number(1), "_g"), alias(column("_n"), "_mx"),
             alias(column("_n"), "_tot"), column("_cl")],
            table("_dg"),
        )  # fmt: skip
    patterns = select([alias(cast(pattern(flags, limits), Type.BIGINT), "_p")], table("_du"))
    histogram = select([column("_p"), alias(count.copy(), "_z")], table("_dp"),
                       group=[column("_p")])  # fmt: skip
    chain = [cte("_dg", per_group), cte("_du", per_unit), cte("_dp", patterns)]
    return extra, flag, chain, histogram


def diagnosis_query(
    analysis: Analysis, bounding: Bounding, flags: Sequence[str], limits: Mapping[str, int]
) -> exp.Select:
    """One row per flag pattern present: ``_p`` the pattern, ``_z`` its number of units."""
    extra, _, chain, histogram = diagnosis_parts(analysis, bounding, flags, limits)
    rows = cte("_rows", relation_rows(analysis, bounding, extra))
    return with_ctes(histogram, [*relation_ctes(analysis), rows, *chain])
