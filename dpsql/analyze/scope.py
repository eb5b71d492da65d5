"""A relation's columns and names: the :class:`Relation` a FROM item becomes, and how a
query's column references resolve in its scope.

A relation maps each qualifier (a table name or alias) to the columns written under it; a
reference resolves to exactly one relation column or is refused as unknown or ambiguous.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from sqlglot import exp

from dpsql.analyze.intervals import Interval
from dpsql.errors import SchemaError, UnsupportedQueryError
from dpsql.policy import ColumnSpec, TableSpec, did_you_mean
from dpsql.sql.tree import transform

# Catalog: table name -> column name -> DuckDB type name (all lower-case names).
Catalog = Mapping[str, Mapping[str, str]]
# The engine's DESCRIBE of a SELECT: its output column names and DuckDB types (no data read).
Describe = Callable[[str], list[tuple[str, str]]]

UNIT_COLUMN = "_dpsql_unit"  # the unit column a derived relation adds when it is not selected

NUMERIC = {
    "tinyint", "smallint", "integer", "bigint", "hugeint", "utinyint", "usmallint",
    "uinteger", "ubigint", "uhugeint", "float", "double", "real",
}  # fmt: skip
INTEGER = {t for t in NUMERIC if t not in {"float", "double", "real"}}
# Numbers of two different types that the engine compares, joins or unions without a cast that
# can fail on a value: UHUGEINT beside a signed integer is cast to INT128, which raises past
# 2^127 (DuckDB 2.0.1), so it is comparable with UHUGEINT only.
COMPARABLE = NUMERIC - {"uhugeint"}
# DuckDB's signed integer types, as its DESCRIBE names them, and the values each holds.
SIGNED_RANGES = {
    "TINYINT": (-(2**7), 2**7 - 1),
    "SMALLINT": (-(2**15), 2**15 - 1),
    "INTEGER": (-(2**31), 2**31 - 1),
    "BIGINT": (-(2**63), 2**63 - 1),
    "HUGEINT": (-(2**127), 2**127 - 1),
}


@dataclass(frozen=True)
class RelColumn:
    """A column of a relation: its type, its range (possibly unbounded) and its policy spec."""

    type: str
    interval: Interval
    spec: ColumnSpec | None = None


@dataclass(frozen=True)
class Relation:
    sql: str  # FROM-able SQL: a quoted table name, or a parenthesised SELECT
    base: bool  # a single policy table read directly
    table: str  # the (first) private table, for messages and budgets
    tables: tuple[str, ...]  # every policy table read
    unit: str | None  # the unit column, for a private relation
    spec: TableSpec | None  # contribution bounds (and constant_per_unit for a base table)
    domain: str | None  # the unit domain: rows of equal domains may be joined on the unit
    columns: dict[str, RelColumn]
    # qualifier -> {column name as written -> relation column}
    scope: dict[str, dict[str, str]] = field(default_factory=dict)
    # Every column equal to the unit on every row (the unit columns of a join on the unit).
    unit_columns: frozenset[str] = frozenset()
    # At most this many rows per unit, by construction: 1 after GROUP BY the unit alone, and
    # kept by row-level subqueries (None: unknown, as after a join).
    unit_rows: int | None = None
    # The columns are those of ``table`` itself, as stored (a table read directly, or resolved
    # along its unit path): a join may then follow a foreign key the policy declares.
    direct: bool = False

    @property
    def units(self) -> frozenset[str]:
        return self.unit_columns | ({self.unit} if self.unit else set())

    @property
    def private(self) -> bool:
        return self.unit is not None

    def resolve(self, column: exp.Column) -> str:
        """The relation column a reference names; unknown or ambiguous names raise."""
        name = column.name.lower()
        qualifier = column.table.lower() if column.table else None
        if qualifier is not None:
            names = self.scope.get(qualifier)
            if names is None:
                hint = did_you_mean(qualifier, self.scope)
                raise SchemaError(f"unknown table or alias {qualifier}{hint}")
            if name not in names:
                raise SchemaError(
                    f"unknown column {name} in {qualifier}{did_you_mean(name, names)}"
                )
            return names[name]
        found = {names[name] for names in self.scope.values() if name in names}
        if not found and name in self.columns and not name.startswith("_dpsql"):
            return name
        if not found:
            visible = {n for names in self.scope.values() for n in names} | {
                c for c in self.columns if not c.startswith("_dpsql")
            }
            hint = did_you_mean(name, visible)
            raise SchemaError(f"unknown column {name} in table {self.table}{hint}")
        if len(found) > 1:
            raise SchemaError(f"column {name} is ambiguous; qualify it with its table")
        return found.pop()

    def bounds(self, column: exp.Column) -> Interval:
        col = self.columns.get(column.name.lower())
        return col.interval if col is not None else Interval(None, None)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _reject_nested_queries(node: exp.Expression, where: str) -> None:
    if node.find(exp.Select, exp.Subquery) is not None:
        raise UnsupportedQueryError(
            f"a subquery inside {where} is not supported; join the table instead"
        )


def resolve_expr(node: exp.Expression, relation: Relation, where: str) -> exp.Expression:
    """A copy of ``node`` with each column replaced by its relation column, unqualified."""
    _reject_nested_queries(node, where)

    def swap(n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.Column):
            if isinstance(n.this, exp.Star):
                raise UnsupportedQueryError("SELECT * is not allowed: only aggregates are released")
            return exp.column(relation.resolve(n), quoted=True)
        return n

    return transform(node, swap)


def _alias_of(relation: Relation) -> str:
    return next(iter(relation.scope), relation.table)


def _realias(relation: Relation, alias: str) -> Relation:
    """The relation under one qualifier (a subquery's or CTE's alias) naming all its columns."""
    names = {}
    for mapping in relation.scope.values():
        names.update(mapping)
    return replace(relation, scope={alias: names})


def _star(relation: Relation, qualifier: str) -> list[tuple[str, str]]:
    if qualifier:
        names = relation.scope.get(qualifier)
        if names is None:
            raise SchemaError(f"unknown table or alias {qualifier}")
        return list(names.items())
    seen: dict[str, str] = {}
    for names in relation.scope.values():
        for target in names.values():
            seen.setdefault(target, target)
    return [(t, t) for t in seen if t != UNIT_COLUMN]
