"""Bind ``?`` parameters on the AST, as literal nodes: values are never pasted into SQL text.

A string parameter becomes one string literal node whatever it contains, so
``"x' OR 1=1 --"`` is compared as that exact string and cannot change the query's shape.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from decimal import Decimal

from sqlglot import exp

from dpsql.errors import ParameterError


def literal_for(value: object, position: int) -> exp.Expression:
    """The AST literal for one parameter value."""
    if value is None:
        return exp.Null()
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int):
        return exp.Literal.number(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ParameterError(f"parameter {position} must be a finite number")
        return exp.Literal.number(repr(value))
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ParameterError(f"parameter {position} must be a finite number")
        return exp.Literal.number(str(value))
    if isinstance(value, str):
        return exp.Literal.string(value)
    if isinstance(value, dt.datetime):
        return exp.cast(exp.Literal.string(value.isoformat(sep=" ")), exp.DataType.Type.TIMESTAMP)
    if isinstance(value, dt.date):
        return exp.cast(exp.Literal.string(value.isoformat()), exp.DataType.Type.DATE)
    raise ParameterError(
        f"parameter {position} has an unsupported type {type(value).__name__}; use None, bool, "
        "int, float, Decimal, str, date or datetime"
    )


def bind_parameters(select: exp.Select, params: Sequence[object] | None) -> exp.Select:
    """A copy of ``select`` with each ``?`` replaced, in order, by the matching parameter."""
    if params is not None and (isinstance(params, str | bytes) or not isinstance(params, Sequence)):
        raise ParameterError("parameters must be a sequence (qmark style), e.g. a tuple")
    values = list(params or ())
    bound = select.copy()
    # Depth-first pre-order visits the nodes of a SELECT in the order they are written, which
    # is the order users number their parameters by.
    found = list(bound.find_all(exp.Placeholder, bfs=False))
    placeholders = [p for p in found if not p.this]
    named = [p for p in found if p.this]
    if named:
        raise ParameterError("only ? (qmark) parameters are supported")
    if len(placeholders) != len(values):
        raise ParameterError(
            f"the query has {len(placeholders)} parameter marker(s) but {len(values)} "
            "value(s) were given"
        )
    for i, (node, value) in enumerate(zip(placeholders, values, strict=True), start=1):
        node.replace(literal_for(value, i))
    return bound
