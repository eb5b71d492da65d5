"""A linear-time ``transform`` for sqlglot trees.

sqlglot's ``Expression.transform`` replaces a child of a list argument with ``set(key, node,
index)``, which re-parents the whole list: one call per child makes a wide list (a
``COALESCE`` of 8,000 arguments, within the statement length limit) quadratic, 15 s of CPU for
one query before it is even planned. This one rebuilds each list once.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp

from dpsql.errors import UnsupportedQueryError


def transform(
    node: exp.Expression, fun: Callable[[exp.Expression], exp.Expression]
) -> exp.Expression:
    """A copy of ``node`` with ``fun`` applied top-down, as sqlglot's ``transform`` does: each
    node is passed to ``fun`` before its children, and a node ``fun`` replaces is not descended
    into. Refuses a tree nested too deeply for the interpreter's stack."""
    try:
        return _visit(node.copy(), fun)
    except RecursionError:
        raise UnsupportedQueryError("the query is nested too deeply") from None


def _visit(node: exp.Expression, fun: Callable[[exp.Expression], exp.Expression]) -> exp.Expression:
    new = fun(node)
    if new is not node:
        return new
    for key, value in list(node.args.items()):
        if isinstance(value, exp.Expression):
            child = _visit(value, fun)
            if child is not value:
                node.set(key, child)
        elif isinstance(value, list):
            children = [_visit(v, fun) if isinstance(v, exp.Expression) else v for v in value]
            if any(c is not v for c, v in zip(children, value, strict=True)):
                node.set(key, children)
    return node
