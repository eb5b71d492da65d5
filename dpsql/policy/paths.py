"""Privacy units through foreign keys: a private table's ``unit_path``.

A normalised table need not hold the unit's column. Lab results hang off admissions, and
admissions off patients; TPC-H's ``lineitem`` hangs off ``orders``, and ``orders`` off
``customer``. Such a table declares its unit as a path of foreign keys, each link a column of the
table it starts from equal to a key of its parent, ending at a table with a ``privacy_unit``::

    [tables.lineitem]
    unit_path = ["l_orderkey -> orders.o_orderkey", "o_custkey -> customer.c_custkey"]

The first link starts from the table itself, each later one from the previous link's parent.
The path is resolved with join semantics inside the bounded query (``dpsql.analyze.units``): a
row yields one resolved row for each root row its path reaches, carrying that root row's unit,
and a row that reaches none (a NULL or dangling key) is dropped before anything is bounded.
Nothing checks that keys are unique: duplicate keys change what one unit's data contains (a row
reached twice is two rows, one per unit), never a bound, and no refusal or cost depends on which
rows resolve. The path is part of the policy's version, so of every release key.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, model_validator

from dpsql.policy.frozen import Frozen

__all__ = ["MAX_PATH_LINKS", "UnitLink"]

MAX_PATH_LINKS = 8  # links in one unit path, at most
_NAME = r"^[a-z_][a-z0-9_]*$"
_LINK = re.compile(
    r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*->\s*([A-Za-z_][A-Za-z0-9_]*)\s*\.\s*([A-Za-z_][A-Za-z0-9_]*)"
    r"\s*$"
)


class UnitLink(Frozen):
    """One foreign key of a unit path: ``column`` (of the table the link starts from) equals
    ``key`` of the parent ``table``."""

    column: str = Field(pattern=_NAME)
    table: str = Field(pattern=_NAME)
    key: str = Field(pattern=_NAME)

    @model_validator(mode="before")
    @classmethod
    def _parse(cls, value: Any) -> Any:
        if isinstance(value, str):
            match = _LINK.match(value)
            if match is None:
                raise ValueError(
                    "a unit path link is written 'column -> table.key', plain SQL identifiers"
                )
            column, table, key = match.groups()
            value = {"column": column, "table": table, "key": key}
        if isinstance(value, dict):
            # SQL identifiers are case-insensitive; the policy matches them the same way.
            return {k: v.lower() if isinstance(v, str) else v for k, v in value.items()}
        return value

    def text(self) -> str:
        return f"{self.column} -> {self.table}.{self.key}"
