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
        return [term, *_implied(branches)]
    shared = {c.sql(dialect=DIALECT) for c in common}
    rests = [[c for c in b if c.sql(dialect=DIALECT) not in shared] for b in branches]
    if any(not rest for rest in rests):
        # A branch is the common part alone, so the OR holds whenever it does, but for a row
        # on which another branch's term raises: made total whole, the OR drops that row, so
        # it stays beside the common part (tests/analyze/test_where_equalities.py).
        return [*common, term]
    return [*common, _any_of(rests), *_implied(rests)]


def _any_of(branches: list[list[exp.Expression]]) -> exp.Expression:
    parts = [exp.Paren(this=_all_of([c.copy() for c in branch])) for branch in branches]
    either: exp.Expression = parts[0]
    for part in parts[1:]:
        either = exp.Or(this=either, expression=part)
    return either


def _implied(branches: list[list[exp.Expression]]) -> list[exp.Expression]:
    """Filters on one column each that an OR of ``branches`` implies, to add beside it (TPC-H
    Q7: ``(n1.n_name = 'FRANCE' AND n2.n_name = 'GERMANY') OR (n1.n_name = 'GERMANY' AND
    n2.n_name = 'FRANCE')`` implies ``n1.n_name = 'FRANCE' OR n1.n_name = 'GERMANY'``, a filter
    on one nation before the joins, where the OR itself can only be tested on joined rows).

    For a column that every branch tests with terms of that column alone (comparisons with
    constants, nothing volatile), the implied filter is the OR over the branches of the AND of
    those terms. It keeps the same rows: where the OR is TRUE, some branch's terms are all TRUE,
    so the filter is (Kleene's three-valued logic), and it reads a subset of the OR's terms, so
    made total it raises only where the OR does, whose TRY then drops the row anyway (TRY
    evaluates every operand of AND and OR, without short-circuit:
    tests/analyze/test_where_equalities.py). It only adds a filter; the OR stays."""
    read: set[str] = set()
    per_branch: list[dict[str, list[exp.Expression]]] = []
    for branch in branches:
        terms: dict[str, list[exp.Expression]] = {}
        for t in branch:
            names = {c.sql(dialect=DIALECT) for c in t.find_all(exp.Column)}
            read |= names
            if len(names) == 1 and _plain(t):
                terms.setdefault(next(iter(names)), []).append(t)
        per_branch.append(terms)
    if len(read) < 2:
        return []  # the OR reads one column already: it is the filter
    return [
        _any_of([terms[name] for terms in per_branch])
        for name in per_branch[0]
        if all(name in terms for terms in per_branch[1:])
    ]


# What a term may hold to give an implied filter: a column compared with constants.
_PLAIN = (
    exp.Column,
    exp.Identifier,
    exp.Literal,
    exp.Null,
    exp.Boolean,
    exp.Paren,
    exp.EQ,
    exp.NEQ,
    exp.GT,
    exp.GTE,
    exp.LT,
    exp.LTE,
    exp.In,
    exp.Between,
    exp.Like,
    exp.ILike,
    exp.Is,
    exp.Not,
    exp.And,
    exp.Or,
    exp.Neg,
    exp.DataType,
    exp.DataTypeParam,
    exp.Cast,
)


def _plain(term: exp.Expression) -> bool:
    return all(
        isinstance(n, _PLAIN) and not (isinstance(n, exp.Cast) and n.find(exp.Column))
        for n in term.walk()
    )


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
