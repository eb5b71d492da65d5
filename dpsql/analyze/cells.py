"""Cells of a partition family: the units a query pinned to one value of a constant column touch.

Queries restricted to different values of a column the policy declares ``constant_per_unit``
compose in parallel only if no unit can be in two of them (McSherry 2009, parallel
composition). A policy declaration alone never makes that so; the bounded query does
(DESIGN.md section 4):

1. each unit keeps one value of the column, chosen by a keyed hash among all its rows of the
   table before any filter (``_chosen``), so the choice depends on the unit's own rows only;
2. the query touches only the units whose chosen value, in *normal form*, renders to the
   cell's key text, and only their rows with that value.

A unit has one chosen value, so it lies in at most one cell of the family, whatever the data
and whatever the query's own WHERE says: two queries with different key texts touch disjoint
units by construction. The key is computed by the engine itself, casting the query's literal to
the column's type (two spellings of one double, ``0.1`` and ``0.10000000000000001``, are one
key; so are ``-0.0`` and ``0.0``, every NaN, and strings equal under the column's collation),
then rendering the normal form as text. The same SQL renders the chosen value in the bounded
query, so the key the budget composes by is the key the engine enforces.

A family is one column of one table at one declared data version: cells of two families (two
columns, or two tables sharing a unit domain) overlap in units and compose sequentially, and so
do queries on data the owner re-declared (a refresh may move a unit to another cell).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

_FLOATS = {"float", "double", "real", "float4", "float8"}
# DuckDB's built-in collations and the normal form that makes equal strings identical: NOCASE
# compares lower(), NOACCENT strip_accents(), NFC nfc_normalize() (DuckDB's definitions).
_COLLATIONS = {"nocase": "lower", "noaccent": "strip_accents", "nfc": "nfc_normalize"}


@dataclass(frozen=True)
class Cell:
    """A query's cell: the constant column, the key text, and the column's collation."""

    column: str
    key: str
    collation: str | None = None


def keyable_literal(node: exp.Expression) -> bool:
    """Whether a cell predicate's right-hand side is a constant the engine can key: a literal,
    possibly negated, or a cast of one (``DATE '2026-01-01'``, ``'nan'::DOUBLE``). Anything
    else (a function, a range, another column) makes the query compose sequentially."""
    if isinstance(node, exp.Cast):  # TryCast is a Cast
        node = node.this
    if isinstance(node, exp.Neg):
        node = node.this
    return isinstance(node, exp.Literal | exp.Boolean)


def normal_text(value_sql: str, column_type: str, collation: str | None) -> str | None:
    """SQL rendering ``value_sql`` (of ``column_type``) in normal form as VARCHAR, or None when
    no normal form is known (an ICU collation): then the query composes sequentially."""
    value = value_sql
    if collation:
        for part in collation.lower().split("."):
            function = _COLLATIONS.get(part)
            if function is None:
                return None
            value = f"{function}({value})"
    if column_type.lower() in _FLOATS:
        # -0.0 and 0.0 are equal but render differently; every NaN renders as 'nan'.
        value = f"CASE WHEN {value} = 0 THEN CAST(0 AS {column_type}) ELSE {value} END"
    return f"CAST({value} AS VARCHAR)"


def key_query(literal_sql: str, column_type: str, collation: str | None) -> str | None:
    """The constant query the engine answers with a cell's key: the literal after the cast to
    the column's type, in normal form (NULL when the literal is not a value of that type)."""
    text = normal_text(f"TRY_CAST({literal_sql} AS {column_type})", column_type, collation)
    return None if text is None else f"SELECT {text}"


__all__ = ["Cell", "key_query", "keyable_literal", "normal_text"]
