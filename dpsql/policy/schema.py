"""The policy checked against the data's schema.

At connect, every table and column the policy names must exist in the data (names only, and for
CSV files the declared types, never row values); a typo is a ``PolicyError`` naming the field,
with a hint from ``did_you_mean`` built from schema names only.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

from dpsql.errors import PolicyError
from dpsql.policy.spec import Policy

__all__ = ["check_against_schema", "did_you_mean", "schema_mismatches"]


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``"; did you mean x?"`` for the closest of ``known`` names (schema names the caller may
    see, never a data value), else ``""``."""
    close = difflib.get_close_matches(name.lower(), sorted({k.lower() for k in known}), 1, 0.6)
    return f"; did you mean {close[0]}?" if close else ""


def check_against_schema(policy: Policy, catalog: Mapping[str, Mapping[str, str]]) -> None:
    """Every table and column the policy names exists in the data: checked at connect, on the
    names (and, for CSV files, the declared types, ``dpsql.engine``), never on row values, so a
    typo is a ``PolicyError`` naming the field, not a puzzling error at the first query."""
    for _, mismatch in schema_mismatches(policy, catalog):
        raise PolicyError(mismatch)


def schema_mismatches(
    policy: Policy, catalog: Mapping[str, Mapping[str, str]]
) -> list[tuple[str, str]]:
    """Each table and column the policy names that the data (``catalog``: table -> column ->
    type) does not hold, as (the policy's table, a message naming the field): all of them, for
    the owner's ``dpsql check``; the first is the connection's refusal."""
    found: list[tuple[str, str]] = []
    for tname, table in policy.tables.items():
        if tname not in catalog and tname in policy.data.blocks:
            continue  # no block registered yet: each block's columns are checked as it comes
        if tname not in catalog:
            hint = did_you_mean(tname, catalog)
            found.append((tname, f"tables.{tname}: the data has no table {tname}{hint}"))
            continue
        columns = catalog[tname]
        named = [("privacy_unit", table.privacy_unit)] if table.privacy_unit else []
        named += [("constant_per_unit", c) for c in table.constant_per_unit]
        named += [(f"columns.{c}", c) for c in table.columns]
        # Every column a unit path names in this table (its links' or a key another path
        # reaches): refused at connect, not only when a query reads the path.
        named += [("unit_path", c) for c in sorted(policy.path_columns(tname))]
        for field, column in named:
            if column.lower() not in columns:
                hint = did_you_mean(column, columns)
                message = f"tables.{tname}.{field}: the table {tname} has no column {column}"
                found.append((tname, message + hint))
        for cname, spec in table.columns.items():
            ref = spec.public_values_from
            if ref is None:
                continue
            other, column = (part.lower() for part in ref.split("."))
            if column not in catalog.get(other, {}):
                hint = did_you_mean(column, catalog.get(other, {}))
                found.append(
                    (
                        tname,
                        f"tables.{tname}.columns.{cname}.public_values_from: the table {other} "
                        f"has no column {column}{hint}",
                    )
                )
    return found
