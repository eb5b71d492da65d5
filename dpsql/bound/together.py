"""A diagnosed query as one statement: the bounded answer and the diagnosis's histogram read
the relation's rows once.

The bounded query (``dpsql.bound.rewrite``) and the diagnosis (``dpsql.bound.diagnosis``) both
start from the same rows: the relation after joins, WHERE and the public domains' filter,
before any bound (``relation_rows``). Run apart, the engine computes those rows twice, and on
joined tables they are most of the work. Here they are one CTE, ``_rel``, with the columns of
both (the diagnosis's unclamped values besides the bounded query's), materialised once; the
bounded query's steps read its columns ``_u``, ``_k<i>`` and ``_x<i>`` as ``_rows``, exactly the
rows they read alone, and the diagnosis's chain reads ``_rel`` as it reads ``_rows`` alone.

The answer's rows come first, tagged ``_which = 0``, then the histogram's, tagged 1
(``split``). Nothing of the privacy contract changes: both outputs are computed by the same
trees as apart (same sensitivities, same event, charged before the statement runs).

>>> split([(0, "a", 3, None, None), (1, None, None, 0, 7)], 2)
([('a', 3)], [(0, 7)])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
    cte,
    number,
    select,
    table,
    union_all,
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
    extra, chain, histogram = diagnosis_parts(analysis, bounding, flags, limits, source="_rel")
    rel = cte("_rel", relation_rows(analysis, bounding, extra))
    # Read twice: materialised, so the engine computes the rows once whatever its default.
    rel.set("materialized", True)
    main = answer(shape)
    if any(isinstance(e, exp.Star) for e in main.expressions):
        raise InternalError("a bounded answer with a star among its columns")
    width = len(main.expressions)
    ctes = [
        *bounded_ctes(shape, rel),
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


def split(
    rows: list[tuple[Any, ...]], width: int
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The answer's rows (in the order the engine gave them) and the histogram's (pattern,
    units) rows, from the rows of ``diagnosed_query``."""
    answer_rows = [row[1 : 1 + width] for row in rows if row[0] == 0]
    patterns = [row[1 + width :] for row in rows if row[0] == 1]
    return answer_rows, patterns
