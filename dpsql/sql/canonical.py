"""Canonical SQL text for cache keys: equal meaning, equal text, as far as it is cheap to tell.

Identifiers are already resolved and lower-cased by the analyzer, parameters are inlined as
literals, and aliases do not reach the measurement core. What remains is the order of the
operands of AND and OR, which does not change a row-level condition: they are sorted.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.sql.parse import DIALECT


def canonical_sql(node: exp.Expression | None) -> str:
    """The canonical text of a row-level expression (``""`` for none).

    >>> import sqlglot
    >>> a = sqlglot.parse_one("x = 1 AND (y > 2 OR z < 3)", read="duckdb")
    >>> b = sqlglot.parse_one("(z < 3 OR y > 2) AND x = 1", read="duckdb")
    >>> canonical_sql(a) == canonical_sql(b)
    True
    >>> c = sqlglot.parse_one("x = 1 OR (y > 2 AND z < 3)", read="duckdb")
    >>> canonical_sql(a) == canonical_sql(c)
    False
    >>> canonical_sql(sqlglot.parse_one("NOT (d AND c)", read="duckdb"))
    'NOT (c AND d)'
    """
    if node is None:
        return ""
    return _sorted(node.copy()).sql(dialect=DIALECT, copy=False)  # a private copy


def _sorted(node: exp.Expression) -> exp.Expression:
    if isinstance(node, exp.Paren):
        # Kept: a parenthesised AND under an AND reads as a different key (a cache miss, not
        # a wrong hit).
        return exp.Paren(this=_sorted(node.this))
    if isinstance(node, exp.And | exp.Or):
        kind = type(node)
        # Operands that are themselves AND/OR keep their parentheses, so that precedence, and
        # with it the meaning, survives: "(a OR b) AND c" must not read "a OR b AND c".
        operands = [p for p in node.flatten() if isinstance(p, exp.Expression)]
        parts = sorted((_wrapped(_sorted(p)) for p in operands), key=lambda p: p.sql(DIALECT))
        combined = parts[0]
        for part in parts[1:]:
            combined = kind(this=combined, expression=part)
        return combined
    for key, value in list(node.args.items()):
        if isinstance(value, exp.Expression):
            node.set(key, _sorted(value))
        elif isinstance(value, list):
            node.set(key, [_sorted(v) if isinstance(v, exp.Expression) else v for v in value])
    return node


def _wrapped(node: exp.Expression) -> exp.Expression:
    if isinstance(node, exp.And | exp.Or):
        return exp.Paren(this=node)
    return node
