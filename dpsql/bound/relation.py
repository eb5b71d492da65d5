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
from dpsql.analyze.sample import sample_filter
from dpsql.analyze.scope import COMPARABLE
from dpsql.bound.filters import (
    Total,
    cell_join,
    domain_ctes,
    domain_filter,
    enforced_cell,
    other_rows,
)
from dpsql.bound.nodes import Node, alias, all_of, fragment, quoted, select, table
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
        # hash join, not a cross product filtered row by row); the rest is made total.
        terms = [t for c in _conjuncts(analysis.where) for t in _factored(c, analysis)]
        bare = [c for c in terms if _plain_equality(c, analysis)]
        others = [c for c in terms if not _plain_equality(c, analysis)]
        filters += [c.copy() for c in bare]
        if others:
            rest = analysis.where if not bare else all_of([c.copy() for c in others])
            filters.append(exp.Is(this=total_(as_boolean(rest)), expression=exp.true()))
    for i, key in enumerate(analysis.keys):
        test = domain_filter(key, i, _built(total_, key.expr))
        if test is not None:
            filters.append(test)
    return filters


def _conjuncts(node: exp.Expression) -> list[exp.Expression]:
    """The top-level AND terms of a condition (parentheses around one are looked through)."""
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.And):
        return [*_conjuncts(node.this), *_conjuncts(node.expression)]
    return [node]


def _disjuncts(node: exp.Expression) -> list[exp.Expression]:
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Or):
        return [*_disjuncts(node.this), *_disjuncts(node.expression)]
    return [node]


def _factored(term: exp.Expression, analysis: Analysis) -> list[exp.Expression]:
    """``term``, or, for an OR whose every branch holds the same plain equalities (TPC-H Q19:
    ``(p_partkey = l_partkey AND ...) OR (p_partkey = l_partkey AND ...)``), those equalities
    and the OR of what is left: (A AND B) OR (A AND C) is A AND (B OR C) in SQL's three-valued
    logic too (a distributive lattice), and A cannot raise."""
    branches = [_conjuncts(b) for b in _disjuncts(term)]
    if len(branches) < 2:
        return [term]
    texts = [{c.sql(dialect=DIALECT) for c in b} for b in branches]
    common = [
        c
        for c in branches[0]
        if _plain_equality(c, analysis) and all(c.sql(dialect=DIALECT) in t for t in texts)
    ]
    if not common:
        return [term]
    shared = {c.sql(dialect=DIALECT) for c in common}
    rests = [[c for c in b if c.sql(dialect=DIALECT) not in shared] for b in branches]
    if any(not rest for rest in rests):
        return common  # a branch is the common part alone: the OR holds whenever it does
    parts = [exp.Paren(this=all_of([c.copy() for c in rest])) for rest in rests]
    either: exp.Expression = parts[0]
    for part in parts[1:]:
        either = exp.Or(this=either, expression=part)
    return [*common, either]


def _plain_equality(node: exp.Expression, analysis: Analysis) -> bool:
    """``a = b`` of two columns of the relation whose types are the same, or both numbers: the
    engine compares them without a cast that could fail on a value. Not of floating-point
    columns: NaN equals NaN to DuckDB and is missing from Parquet's statistics, so such a
    filter stays inside TRY, never pushed into a scan (the note on the engine's config)."""
    if not isinstance(node, exp.EQ):
        return False
    sides = (node.this, node.expression)
    if not all(isinstance(c, exp.Column) and c.name in analysis.columns for c in sides):
        return False
    types = {analysis.columns[c.name].lower() for c in sides}
    if types & _FLOATS:
        return False
    return len(types) == 1 or types <= COMPARABLE


_FLOATS = {"float", "double", "real"}


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
    projections = [
        alias(quoted(analysis.unit), "_u"),
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
