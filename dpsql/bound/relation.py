"""Step 1 of the bounded query: the relation it bounds (``_rows``), before any bound.

One row per row of the relation after joins, WHERE and the public domains' filter, with the
unit ``_u``, the keys ``_k<i>`` and the raw values ``_x<i>``; every row-level expression made
total (``dpsql.sql.totality``: ``TRY``, ``TRY_CAST``), so no data value can make the query
fail. Rows whose public key lies outside its domain are dropped here, so they never use up a
unit's group budget; with ``dpsql.other_group`` they are mapped onto the key's other group
instead (``dpsql.bound.filters.other_rows``), before any bounding. The diagnosis of the bounds
(``dpsql.bound.diagnosis``) reads the same rows as the bounded query.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from sqlglot import exp

from dpsql.analyze.analysis import Analysis
from dpsql.analyze.equalities import split_where
from dpsql.analyze.sample import sample_filter
from dpsql.bound.filters import (
    Total,
    cell_join,
    domain_ctes,
    domain_filter,
    enforced_cell,
    other_rows,
)
from dpsql.bound.nodes import Node, alias, all_of, fragment, func, quoted, select, table
from dpsql.bound.specs import Bounding
from dpsql.bound.values import summed_value
from dpsql.sql.parse import DIALECT
from dpsql.sql.totality import WIDENED, as_boolean, total


def total_of(analysis: Analysis) -> Total:
    """A row-level expression made total (``dpsql.sql.totality``), a new tree on every call;
    integer columns under arithmetic widened."""
    ints = frozenset(n for n, t in analysis.columns.items() if t.lower() in WIDENED)

    def total_(node: exp.Expression) -> exp.Expression:
        return total(node, ints)

    return total_


def relation_ctes(analysis: Analysis) -> list[exp.CTE]:
    """The CTEs the relation's rows read (a pinned cell, public key domains): what comes
    before ``relation_rows``."""
    return [*enforced_cell(analysis), *domain_ctes(analysis, total_of(analysis))]


def _source(analysis: Analysis) -> Node:
    """The relation's FROM: a policy table, or the join or subquery ``dpsql.analyze`` gives as
    SQL text (``Analysis.source``), read here."""
    if analysis.base:
        return table(analysis.table, quote=True)
    relation = fragment(f"FROM {analysis.source}", into=exp.From).this
    assert isinstance(relation, exp.Expression)
    return relation


def _built(total_: Total, expr: exp.Expression) -> Callable[[], Node]:
    """``expr`` made total, anew on every call."""
    return lambda: total_(expr)


def _filters(analysis: Analysis, bounding: Bounding, total_: Total) -> list[Node]:
    """WHERE's conditions: the unit's sample, the query's WHERE, the public domains."""
    filters: list[Node] = []
    if bounding.sample is not None and (
        kept := sample_filter(quoted(analysis.unit).sql(dialect=DIALECT), bounding.sample)
    ):
        # Each unit in or out as a whole, by a keyed PRF, before any bound (dpsql.analyze.sample).
        filters.append(fragment(kept))
    if analysis.where is not None:
        # An equality of two columns of one type cannot raise: left bare, so that the engine
        # sees a join condition in it (FROM lineitem, part WHERE l_partkey = p_partkey is a
        # hash join, not a cross product filtered row by row); each other term is made total.
        bare, rest = split_where(analysis.where, analysis.columns)
        filters += bare
        filters += [exp.Is(this=total_(as_boolean(c)), expression=exp.true()) for c in rest]
    for i, key in enumerate(analysis.keys):
        test = domain_filter(key, i, _built(total_, key.expr))
        if test is not None:
            filters.append(test)
    return filters


def relation_rows(
    analysis: Analysis, bounding: Bounding, extra: Mapping[str, Node] | None = None
) -> exp.Select:
    """The relation the query bounds, before any bound (step 1): one row per row after joins,
    WHERE and the public domains' filter, with the unit ``_u``, the keys ``_k<i>``, the raw
    values ``_x<i>`` (bounded columns inside an expression already clamped) and ``extra``
    (more row-level columns over the relation's names, name -> tree), then each key's other
    group mapped (``other_rows``)."""
    total_ = total_of(analysis)
    raw = [
        total_(v.expr) if v.grid is None else summed_value(v.expr, analysis, total_)
        for v in bounding.values
    ]
    unit: Node = quoted(analysis.unit)
    if analysis.period is not None:
        # A person-within-period unit: the person and the row's period (dpsql.policy.periods).
        unit = func("ROW", quoted(analysis.unit), quoted(analysis.period))
    projections = [
        alias(unit, "_u"),
        *(alias(total_(k.expr), f"_k{i}") for i, k in enumerate(analysis.keys)),
        *(alias(expr, f"_x{i}") for i, expr in enumerate(raw)),
        *(alias(expr, name) for name, expr in (extra or {}).items()),
    ]
    filters = _filters(analysis, bounding, total_)
    rows = select(
        projections,
        _source(analysis),
        joins=cell_join(analysis),
        where=all_of(filters) if filters else None,
    )
    # Each key with an other group mapped onto its domain, row by row, before any bound.
    return other_rows(rows, analysis.keys, len(bounding.values), list(extra or {}))


__all__ = ["relation_ctes", "relation_rows", "total_of"]
