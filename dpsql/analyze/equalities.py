"""Which terms of a WHERE may reach the engine bare: equalities of two columns that cannot
raise, so that the engine sees a join condition in them (``FROM lineitem, part WHERE
l_partkey = p_partkey`` is then a hash join, not a cross product filtered row by row inside
TRY). The rest is made total, as every row-level expression is (``dpsql.sql.totality``). Used
by the bounded query's WHERE (``dpsql.bound.relation``) and a FROM-subquery's
(``dpsql.analyze.relations``).
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlglot import exp

from dpsql.analyze.scope import COMPARABLE

DIALECT = "duckdb"


def split_where(
    where: exp.Expression, types: Mapping[str, str]
) -> tuple[list[exp.Expression], list[exp.Expression]]:
    """(the bare equalities; the other terms, each to make total on its own), copies.

    Each term made total alone keeps the rows the whole condition made total keeps: a row is
    kept when every term is TRUE without raising, either way. Apart, a term that reads one
    table (``n_name = 'SAUDI ARABIA'``) is a filter the engine applies before the joins, where
    ``TRY(a AND b AND c)`` over three tables is one condition on the joined rows (TPC-H Q21 at
    scale factor 10 spent 25 s of 26 on it). Each stays ``TRY(...) IS TRUE``, which the engine
    never pushes into a file scan (the note on the engine's configuration)."""
    terms = [t for c in conjuncts(where) for t in _factored(c, types)]
    bare = [c.copy() for c in terms if _plain_equality(c, types)]
    return bare, [c.copy() for c in terms if not _plain_equality(c, types)]


def conjuncts(node: exp.Expression) -> list[exp.Expression]:
    """The top-level AND terms of a condition (parentheses around one are looked through)."""
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.And):
        return [*conjuncts(node.this), *conjuncts(node.expression)]
    return [node]


def _disjuncts(node: exp.Expression) -> list[exp.Expression]:
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Or):
        return [*_disjuncts(node.this), *_disjuncts(node.expression)]
    return [node]


def _factored(term: exp.Expression, types: Mapping[str, str]) -> list[exp.Expression]:
    """``term``, or, for an OR whose every branch holds the same terms (TPC-H Q19:
    ``(p_partkey = l_partkey AND l_shipmode IN (...) AND ...) OR (p_partkey = l_partkey AND
    l_shipmode IN (...) AND ...)``), those terms and the OR of what is left: (A AND B) OR
    (A AND C) is A AND (B OR C) in SQL's three-valued logic too (a distributive lattice), and
    made total apart they keep the same rows: a row is kept when A is TRUE and B or C is, each
    evaluated without raising, either way. A plain equality among them is left bare (it cannot
    raise); any other, made total on its own, is a filter the engine can apply before a join."""
    branches = [conjuncts(b) for b in _disjuncts(term)]
    if len(branches) < 2:
        return [term]
    texts = [{c.sql(dialect=DIALECT) for c in b} for b in branches]
    common = [c for c in branches[0] if all(c.sql(dialect=DIALECT) in t for t in texts)]
    if not common:
        return [term]
    shared = {c.sql(dialect=DIALECT) for c in common}
    rests = [[c for c in b if c.sql(dialect=DIALECT) not in shared] for b in branches]
    if any(not rest for rest in rests):
        return common  # a branch is the common part alone: the OR holds whenever it does
    parts = [exp.Paren(this=_all_of([c.copy() for c in rest])) for rest in rests]
    either: exp.Expression = parts[0]
    for part in parts[1:]:
        either = exp.Or(this=either, expression=part)
    return [*common, either]


def _plain_equality(node: exp.Expression, types: Mapping[str, str]) -> bool:
    """``a = b`` of two columns of the relation (``types``: name -> type) whose types are the
    same, or both numbers: the engine compares them without a cast that could fail on a value.
    Not of floating-point columns: NaN equals NaN to DuckDB and is missing from Parquet's
    statistics, so such a filter stays inside TRY, never pushed into a scan (the note on the
    engine's config)."""
    if not isinstance(node, exp.EQ):
        return False
    sides = (node.this, node.expression)
    if not all(isinstance(c, exp.Column) and c.name in types for c in sides):
        return False
    kinds = {types[c.name].lower() for c in sides}
    if kinds & _FLOATS:
        return False
    return len(kinds) == 1 or kinds <= COMPARABLE


_FLOATS = {"float", "double", "real"}


def _all_of(conditions: list[exp.Expression]) -> exp.Expression:
    """The AND of ``conditions``. A term that binds more loosely than AND (an OR, taken out of
    its parentheses by ``conjuncts``) is put back in them: ``exp.And`` prints its operands as
    they are, and ``A OR B AND C`` is ``A OR (B AND C)``."""
    terms = [_tight(c) for c in conditions]
    out = terms[0]
    for condition in terms[1:]:
        out = exp.And(this=out, expression=condition)
    return out


def _tight(node: exp.Expression) -> exp.Expression:
    if isinstance(node, exp.Or | exp.Xor):
        return exp.Paren(this=node)
    return node


__all__ = ["conjuncts", "split_where"]
