"""The bounds that keep a free catalog answer as small as the catalog it reads.

A catalog query of ``dpsql serve`` is answered without a charge, so a function that makes more
rows or wider values than the catalog holds would let an analyst fill the server's memory for
free (a ``generate_series`` of 100,000 rows, ``md5`` or ``repeat`` of any width). Such functions
are not on the allow-list (``catalog_objects.CATALOG_FUNCTIONS``); the few that recorded clients
do call are bounded here:

- ``generate_series`` only between integer constants of at most :data:`MAX_SERIES` in size, or
  the bound of a catalog array (``array_upper(indkey, 1)``: psql's and the JDBC driver's use);
- arrays built from rows (``array_agg``, ``ARRAY(SELECT ...)``) keep their first
  :data:`MAX_ELEMENTS` elements; so ``unnest`` of them yields as many rows at most;
- strings built from several values (``string_agg``, ``array_to_string``, ``replace``,
  ``format``, ``concat``) keep their first :data:`MAX_TEXT` characters;
- ``format`` is written out for DuckDB with its plain conversions only (``%s``, ``%I``, ``%L``,
  ``%%``; no width, which would pad a value to any size).

The ``||`` operator and joins of catalog relations are bounded by the row limit of a catalog
answer and the server's byte cap on every answer, not here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from sqlglot import exp

from dpsql import errors

# PostgreSQL's limit on the columns of a table (MaxHeapAttributeNumber): an index key, a
# constraint's columns or a table's attribute numbers never run past it.
MAX_SERIES = 1600
MAX_ELEMENTS = 1600
# 64-byte names of up to 1,600 columns, with separators, fit twice over.
MAX_TEXT = 262_144
_ARRAY_BOUNDS = frozenset({"array_upper", "array_lower", "array_length", "cardinality"})
_CAPPED_TEXT = frozenset({"string_agg", "array_to_string", "replace", "format", "concat",
                          "concat_ws"})  # fmt: skip
_FORMAT = re.compile(r"%(.)")


def _arguments(node: exp.Func) -> list[exp.Expression]:
    if isinstance(node, exp.Anonymous):
        return list(node.expressions)
    found: list[exp.Expression] = []
    for value in node.args.values():
        if isinstance(value, exp.Expression):
            found.append(value)
        elif isinstance(value, list):
            found.extend(v for v in value if isinstance(v, exp.Expression))
    return found


def _integer(node: exp.Expression) -> int | None:
    while isinstance(node, exp.Cast | exp.Paren):
        node = node.this
    if isinstance(node, exp.Neg):
        inner = _integer(node.this)
        return None if inner is None else -inner
    if isinstance(node, exp.Literal) and not node.is_string and node.name.isdigit():
        return int(node.name)
    return None


def check_series(node: exp.Func, name_of: object) -> None:
    """Refuse a ``generate_series`` whose bounds the query chooses beyond :data:`MAX_SERIES`:
    its rows would cost nothing and have no limit but the answer's."""
    for argument in _arguments(node):
        value = _integer(argument)
        if value is not None and abs(value) <= MAX_SERIES:
            continue
        inner = argument
        while isinstance(inner, exp.Cast | exp.Paren | exp.Dot):  # pg_catalog.array_upper(...)
            inner = inner.expression if isinstance(inner, exp.Dot) else inner.this
        if isinstance(inner, exp.Func) and callable(name_of) and name_of(inner) in _ARRAY_BOUNDS:
            continue  # the length of an array: a catalog one, or one capped at MAX_ELEMENTS
        raise errors.UnsupportedQueryError(
            "generate_series in a catalog query runs only between integer constants of at most "
            f"{MAX_SERIES} or to the bound of an array"
        )


def capped(node: exp.Expr, name: str) -> exp.Expr:
    """``node`` (already rewritten for DuckDB) cut to its bound, if its function has one."""
    if name in _CAPPED_TEXT:
        return exp.Anonymous(this="left", expressions=[node, exp.Literal.number(MAX_TEXT)])
    if name == "array_agg" or (name == "array" and node.find(exp.Select) is not None):
        return exp.Anonymous(
            this="list_slice",
            expressions=[node, exp.Literal.number(1), exp.Literal.number(MAX_ELEMENTS)],
        )
    return node


def format_call(node: exp.Func) -> exp.Expression:
    """PostgreSQL's ``format(template, ...)`` as a DuckDB ``concat``: ``%s`` a value as text,
    ``%I`` a quoted identifier, ``%L`` a quoted literal, ``%%`` a percent sign. Any other
    conversion (a width, a position) is refused: a width pads a value to any size."""
    arguments = _arguments(node)
    template = arguments[0] if arguments else None
    if not isinstance(template, exp.Literal) or not template.is_string:
        raise errors.UnsupportedQueryError("format in a catalog query needs a constant template")
    values = iter(arguments[1:])
    parts: list[exp.Expression] = []
    text = template.name
    position = 0
    for match in _FORMAT.finditer(text):
        if match.start() > position:
            parts.append(exp.Literal.string(text[position : match.start()]))
        position = match.end()
        kind = match.group(1)
        if kind == "%":
            parts.append(exp.Literal.string("%"))
            continue
        value = next(values, None)
        if kind not in "sIL" or value is None:
            raise errors.UnsupportedQueryError(
                "format in a catalog query takes only %s, %I, %L and %% with one argument each"
            )
        as_text = exp.cast(value, exp.DataType.Type.VARCHAR)
        if kind == "I":
            parts.append(exp.Anonymous(this="dpsql_quote_ident", expressions=[as_text]))
        elif kind == "L":
            quoted = exp.Anonymous(this="dpsql_quote_literal", expressions=[as_text])
            parts.append(exp.Coalesce(this=quoted, expressions=[exp.Literal.string("NULL")]))
        else:
            parts.append(as_text)
    if position < len(text):
        parts.append(exp.Literal.string(text[position:]))
    return exp.Anonymous(this="concat", expressions=parts or [exp.Literal.string("")])


def setting_call(node: exp.Func, settings: Mapping[str, str]) -> exp.Expression:
    """``current_setting(name)``: the server's public constant of that name, else NULL. Never
    DuckDB's own setting, which could name a path of the server machine."""
    arguments = _arguments(node)
    if not arguments:
        raise errors.UnsupportedQueryError("current_setting needs the name of a setting")
    cases = exp.Case(this=exp.Lower(this=exp.cast(arguments[0], exp.DataType.Type.VARCHAR)))
    for key, value in settings.items():
        cases = cases.when(exp.Literal.string(key), exp.Literal.string(value))
    return cases.else_(exp.cast(exp.Null(), exp.DataType.Type.VARCHAR))


__all__ = ["MAX_ELEMENTS", "MAX_SERIES", "MAX_TEXT", "capped", "check_series", "format_call",
           "setting_call"]  # fmt: skip
