"""A private table's rows resolved to their units through its ``unit_path``
(``dpsql.policy.paths``).

The resolved relation is the table's columns and one more, ``UNIT_COLUMN``: the root table's
``privacy_unit`` of the row the path reaches. It is an inner join along the path, written by dpsql
and never by the analyst::

    (SELECT "_r0"."l_orderkey", ..., "_r2"."c_custkey" AS "_dpsql_unit"
     FROM "lineitem" AS "_r0"
     JOIN "orders" AS "_r1" ON "_r0"."l_orderkey" = "_r1"."o_orderkey"
     JOIN "customer" AS "_r2" ON "_r1"."o_custkey" = "_r2"."c_custkey")

So a row yields one row per root row its path reaches (a key listed twice is two rows, one per
unit), and a row that reaches none, through a NULL or a dangling key, is dropped. Every row of
the result is one unit's and depends only on that unit's rows (the root row, and the
intermediate rows that carry it there), which is what bounding needs (``dpsql.analyze.relations``).
The keys of a link must be of one type, or both numbers, so that the engine's comparison never
raises on a value: checked on the schema, before anything runs.
"""

from __future__ import annotations

from dpsql.analyze.scope import COMPARABLE, UNIT_COLUMN, Catalog, _quote
from dpsql.errors import SchemaError
from dpsql.policy import PERIOD_COLUMN, Policy

__all__ = ["resolved_sql", "unit_source", "unit_type"]


def _type(catalog: Catalog, table: str, column: str, table_name: str, link: str) -> str:
    types = catalog.get(table)
    if types is None or column not in types:
        raise SchemaError(
            f"column {table}.{column} named by the unit path of {table_name} ({link}) is missing"
        )
    return types[column].lower()


def _check(policy: Policy, catalog: Catalog, name: str) -> None:
    at = name
    for link in policy.tables[name].unit_path:
        here = _type(catalog, at, link.column, name, link.text())
        there = _type(catalog, link.table, link.key, name, link.text())
        if here != there and not (here in COMPARABLE and there in COMPARABLE):
            raise SchemaError(
                f"the unit path of {name} compares {at}.{link.column} ({here.upper()}) with "
                f"{link.table}.{link.key} ({there.upper()}): its keys must be of one type"
            )
        at = link.table


def unit_type(policy: Policy, catalog: Catalog, name: str) -> str:
    """The DuckDB type of ``name``'s resolved unit: the root table's ``privacy_unit``'s."""
    root = policy.unit_table(name)
    unit = policy.tables[root].privacy_unit
    assert unit is not None
    return _type(catalog, root, unit, name, "its end")


def resolved_sql(policy: Policy, catalog: Catalog, name: str, columns: list[str]) -> str:
    """FROM-able SQL of ``name``'s rows resolved along its unit path (module docstring):
    ``columns`` of the table, then ``UNIT_COLUMN``. Schema errors name the path, never a
    value."""
    _check(policy, catalog, name)
    path = policy.tables[name].unit_path
    root = policy.tables[path[-1].table]
    assert root.privacy_unit is not None
    unit_type(policy, catalog, name)
    select = [f"{_quote('_r0')}.{_quote(c)}" for c in columns]
    select.append(
        f"{_quote(f'_r{len(path)}')}.{_quote(root.privacy_unit)} AS {_quote(UNIT_COLUMN)}"
    )
    joins = []
    for i, link in enumerate(path):
        joins.append(
            f"JOIN {_quote(link.table)} AS {_quote(f'_r{i + 1}')} ON "
            f"{_quote(f'_r{i}')}.{_quote(link.column)} = {_quote(f'_r{i + 1}')}.{_quote(link.key)}"
        )
    return f"(SELECT {', '.join(select)} FROM {_quote(name)} AS {_quote('_r0')} {' '.join(joins)})"


def unit_source(policy: Policy, catalog: Catalog, name: str, columns: list[str]) -> tuple[str, str]:
    """(source, unit column) of private table ``name``'s rows, each its unit's: the table's
    name and its ``privacy_unit``, or the parenthesised SQL of its rows resolved along its unit
    path (with ``columns``) and ``UNIT_COLUMN``. What an estimate reads (``ESTIMATE BOUNDS``, a
    clamp's walks), so that it sees the units the queries bound."""
    spec = policy.tables[name]
    if policy.periods is not None and policy.periods.table == name:
        # A person-within-period unit: the person and the row's period (dpsql.policy.periods).
        assert spec.privacy_unit is not None  # policy-validated
        unit = f"ROW({_quote(spec.privacy_unit)}, {_quote(PERIOD_COLUMN)})"
        return f"(SELECT *, {unit} AS {_quote(UNIT_COLUMN)} FROM {_quote(name)})", UNIT_COLUMN
    if spec.privacy_unit is not None:
        return name, spec.privacy_unit
    return resolved_sql(policy, catalog, name, columns), UNIT_COLUMN
