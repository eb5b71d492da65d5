"""Which columns of a table the engine shows: those the policy declares, unless it says more.

A DuckDB database file often holds more than the policy means to serve (a table with a salary
beside the columns declared). A column of a database table that the policy does not name is
hidden by default: the engine's view of the table selects only the declared columns, so it is
in no catalog (``information_schema``, ``pg_catalog``, the analysis's catalog) and a reference
to it anywhere (the select list, ``WHERE``, a join) is the usual unknown-column error.
Declared means named by the table's policy: its ``privacy_unit``, a key of its ``columns``, one
of its ``constant_per_unit``, or a column a unit path names (``dpsql.policy.paths``).
``tables.<t>.expose_undeclared = true`` shows every column.

A Parquet or CSV file is a file the owner wrote for dpsql, and its columns are shown by default
(as they always were: policies in use query columns they do not declare, e.g. a ``WHERE`` on a
flag); ``expose_undeclared = false`` hides its undeclared columns the same way. A public table
shows every column either way: it holds nothing private, by the owner's declaration.

The flag is not part of the policy's version (``Policy.version``): it changes which queries are
refused, never the answer to one that is answered.
"""

from __future__ import annotations

from collections.abc import Iterable

from dpsql.policy.spec import Policy

__all__ = ["hides", "visible_columns"]


def hides(policy: Policy, table: str, database: bool = False) -> bool:
    """Whether ``table`` hides its undeclared columns. ``database``: the table is one of a
    DuckDB database file (hidden by default)."""
    spec = policy.tables.get(table.lower())
    if spec is None or spec.public:
        return False
    return not (spec.expose_undeclared if spec.expose_undeclared is not None else not database)


def visible_columns(
    policy: Policy, table: str, columns: Iterable[str], database: bool = False
) -> list[str] | None:
    """The columns of ``table`` (in ``columns``' order: the file's) the engine shows, or None
    when it shows every one (nothing hidden: the table's view needs no column list)."""
    if not hides(policy, table, database):
        return None
    spec = policy.tables[table.lower()]
    declared = {spec.privacy_unit, *spec.columns, *spec.constant_per_unit,
                *policy.path_columns(table.lower())}  # fmt: skip
    names = list(columns)
    shown = [c for c in names if c.lower() in declared]
    return None if len(shown) == len(names) else shown
