"""The relation a query aggregates: one table, a join, a CTE or a FROM-subquery.

Every FROM item becomes a :class:`Relation`: SQL the engine can read, its columns (with their
DuckDB types, their bounds and any public domain) and, when it holds private rows, the column
that names each row's privacy unit. The rule that keeps contribution bounding valid is simple:
**every row of a private relation belongs to exactly one unit, and depends only on that unit's
rows** (plus public tables). Bounding then happens after the relation is built (DESIGN.md
section 3, step 1: joins and row-level work first), so a unit's rows, however many a join
made of them, are capped by the same L0 and C as a table's.

* A private table: each row is its unit's.
* Joins on a public table or on the unit keep it (``dpsql.analyze.joins``).
* A row-level subquery (filters, derived columns) maps each row to at most one row.
* A subquery that aggregates and groups by the unit keeps it too (``dpsql.analyze.per_unit``).

Anything else (RIGHT and FULL joins, which keep rows with no unit; private tables joined on
other columns, which pair rows of different units; subqueries with LIMIT or DISTINCT, whose
rows depend on other units' rows) is refused with the reason.

This module builds the relation (:class:`Builder`: tables, FROM items, CTEs and subqueries);
the relation and its names are ``dpsql.analyze.scope``.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp

from dpsql.analyze.equalities import split_where
from dpsql.analyze.intervals import Interval, interval_of
from dpsql.analyze.joins import Joins
from dpsql.analyze.per_unit import PerUnit, _item_name, _output_named
from dpsql.analyze.scope import (
    INTEGER,
    UNIT_COLUMN,
    Catalog,
    Describe,
    Relation,
    RelColumn,
    _quote,
    _realias,
    _star,
    resolve_expr,
)
from dpsql.analyze.setops import SetOps
from dpsql.analyze.units import resolved_sql, unit_type
from dpsql.errors import SchemaError, UnsupportedQueryError
from dpsql.policy import Policy, TableSpec, did_you_mean
from dpsql.sql.totality import WIDENED, as_boolean

_MAX_NESTING = 8


class Builder(Joins, PerUnit, SetOps):
    """Builds the relation of a SELECT's FROM clause (with its joins, CTEs and subqueries)."""

    def __init__(
        self,
        policy: Policy,
        catalog: Catalog,
        describe: Describe | None,
        total: Callable[[exp.Expression, frozenset[str]], exp.Expression],
    ):
        self.policy = policy
        self.catalog = catalog
        self.describe = describe
        self.total = total
        self.ctes: dict[str, exp.Select | exp.SetOperation] = {}
        self.depth = 0
        # Per joined input: its USING columns -> (input, column) of the left side they merge with.
        self.using: dict[int, dict[str, tuple[int, str]]] = {}

    # -- entry ---------------------------------------------------------------------------------
    def from_clause(self, select: exp.Select) -> Relation:
        with_ = select.args.get("with_") or select.args.get("with")
        if with_ is not None:
            if with_.args.get("recursive"):
                raise UnsupportedQueryError("WITH RECURSIVE is not supported")
            for cte in with_.expressions:
                body = cte.this
                if not isinstance(body, exp.Select | exp.SetOperation):
                    raise UnsupportedQueryError("a CTE must be a SELECT or a set operation")
                self.ctes[cte.alias.lower()] = body
        from_ = select.args.get("from_") or select.args.get("from")
        if from_ is None:
            raise UnsupportedQueryError("a query needs FROM a private table")
        first = self.item(from_.this)
        joins = select.args.get("joins") or []
        where = select.args.get("where")
        relation = self.joined(first, joins, where.this if where else None) if joins else first
        if not relation.private:
            raise UnsupportedQueryError(
                f"table {relation.table} is public; dpsql answers queries over private tables"
            )
        return relation

    # -- one FROM item ---------------------------------------------------------------------
    def item(self, node: exp.Expression) -> Relation:
        if isinstance(node, exp.Table):
            name = node.name.lower()
            alias = node.alias.lower() if node.alias else None
            if name in self.ctes:
                body = self.ctes[name]
                if isinstance(body, exp.SetOperation):
                    return _realias(self.combined(body, name), alias or name)
                relation = self.derived(body, name)
                return _realias(relation, alias or name)
            return self.table(name, alias)
        if isinstance(node, exp.Subquery):
            body = node.this
            alias = node.alias.lower() if node.alias else "_subquery"
            if isinstance(body, exp.SetOperation):
                return _realias(self.combined(body, alias), alias)
            if not isinstance(body, exp.Select):
                raise UnsupportedQueryError("a FROM subquery must be a SELECT or a set operation")
            return _realias(self.derived(body, alias), alias)
        raise UnsupportedQueryError(f"{node.key.upper()} is not supported in FROM")

    def table(self, name: str, alias: str | None) -> Relation:
        spec = self.policy.tables.get(name)
        if spec is None or name not in self.catalog:
            # Suggested from the policy's tables only: a table of the data it does not declare
            # is never named.
            hint = did_you_mean(name, [t for t in self.policy.tables if t in self.catalog])
            raise SchemaError(f"unknown table {name}{hint}")
        types = self.catalog[name]
        unit = spec.privacy_unit
        for column in (*([unit] if unit is not None else []), *spec.constant_per_unit):
            if column not in types:
                raise SchemaError(f"column {column} named by the policy of {name} is missing")
        columns = {}
        for column, ctype in types.items():
            cspec = spec.columns.get(column)
            bounds = cspec.bounds if cspec is not None else None
            integral = ctype.lower() in INTEGER
            if bounds is None:
                interval = Interval(None, None, integral)
            else:
                lo, hi = bounds
                # Clamping an integer column to fractional bounds yields fractional values.
                whole = integral and lo.denominator == 1 and hi.denominator == 1
                interval = Interval(lo, hi, whole)
            columns[column] = RelColumn(ctype, interval, cspec)
        names = {c: c for c in types}
        scope = {name: names}
        if alias is not None:
            scope = {alias: names} if alias != name else scope
        if spec.unit_path:
            return self._resolved(name, spec, columns, scope)
        return Relation(
            sql=_quote(name),
            base=True,
            table=name,
            tables=(name,),
            unit=unit,
            spec=spec if spec.is_private else None,
            domain=(spec.unit_domain or f"table {name}") if spec.is_private else None,
            columns=columns,
            scope=scope,
            direct=True,
        )

    def _resolved(
        self,
        name: str,
        spec: TableSpec,
        columns: dict[str, RelColumn],
        scope: dict[str, dict[str, str]],
    ) -> Relation:
        """A table whose unit is a path of foreign keys: its rows resolved to their units
        (``dpsql.analyze.units``), each resolved row its unit's, bounded like any relation's.
        The unit column is dpsql's own (``UNIT_COLUMN``: no query names it); the domain is the
        root table's."""
        root = self.policy.unit_table(name)
        root_spec = self.policy.tables[root]
        sql = resolved_sql(self.policy, self.catalog, name, list(columns))
        kind = unit_type(self.policy, self.catalog, name)
        return Relation(
            sql=sql,
            base=False,
            table=name,
            tables=(name, *(link.table for link in spec.unit_path)),
            unit=UNIT_COLUMN,
            spec=spec,
            domain=root_spec.unit_domain or f"table {root}",
            columns={**columns, UNIT_COLUMN: RelColumn(kind, Interval(None, None, False))},
            scope=scope,
            direct=True,
        )

    # -- subqueries and CTEs -----------------------------------------------------------------
    def derived(self, select: exp.Select, name: str) -> Relation:
        """A FROM-subquery or CTE: row-level, or a per-unit pre-aggregation."""
        self.depth += 1
        try:
            if self.depth > _MAX_NESTING:
                raise UnsupportedQueryError("subqueries are nested too deeply")
            return self._derived(select, name)
        finally:
            self.depth -= 1

    def _derived(self, select: exp.Select, name: str) -> Relation:
        for clause, why in (
            ("distinct", "DISTINCT in a subquery mixes the rows of different units"),
            ("limit", "LIMIT in a subquery makes a unit's rows depend on other units' rows"),
            ("offset", "OFFSET in a subquery makes a unit's rows depend on other units' rows"),
            ("order", "ORDER BY in a subquery has no effect on an aggregate; remove it"),
            ("with_", "WITH inside a subquery is not supported; put every CTE at the top"),
        ):
            if select.args.get(clause):
                raise UnsupportedQueryError(why)
        inner = Builder(self.policy, self.catalog, self.describe, self.total)
        inner.ctes = self.ctes
        inner.depth = self.depth
        source = inner.from_clause(select)
        where = select.args.get("where")
        integers = frozenset(c for c, col in source.columns.items() if col.type.lower() in WIDENED)
        filters = ""
        if where is not None:
            condition = resolve_expr(where.this, source, "WHERE")
            if condition.find(exp.AggFunc):
                raise UnsupportedQueryError("an aggregate is not allowed in WHERE")
            # Plain equalities bare (a comma join's condition), the rest made total.
            bare, rest = split_where(condition, {n: c.type for n, c in source.columns.items()})
            parts = [b.sql(dialect="duckdb") for b in bare]
            for term in rest:
                total_condition = self.total(as_boolean(term), integers)
                parts.append(f"{total_condition.sql(dialect='duckdb')} IS TRUE")
            filters = " WHERE " + " AND ".join(parts)
        if select.args.get("group") or any(e.find(exp.AggFunc) for e in select.expressions):
            return self._per_unit(select, source, filters, name)
        if select.args.get("having"):
            raise UnsupportedQueryError("HAVING needs GROUP BY")
        items: list[tuple[str, exp.Expression]] = []
        for index, item in enumerate(select.expressions):
            if isinstance(item, exp.Star) or (
                isinstance(item, exp.Column) and isinstance(item.this, exp.Star)
            ):
                qualifier = item.table.lower() if isinstance(item, exp.Column) else ""
                for written, target in _star(source, qualifier):
                    items.append((written, exp.column(target, quoted=True)))
                continue
            expr = resolve_expr(item.unalias(), source, "a subquery's SELECT list")
            items.append((_item_name(item, index), expr))
        assert source.unit is not None
        outputs: dict[str, tuple[exp.Expression, RelColumn]] = {}
        for out, expr in items:
            if out in outputs:
                raise SchemaError(f"the subquery {name} has two columns named {out}")
            if isinstance(expr, exp.Column):
                column = source.columns[expr.name]
            else:
                column = RelColumn("", interval_of(expr, source.bounds))
            outputs[out] = (expr, column)
        unit = _output_named(outputs, source.unit)
        if unit is None:
            unit = UNIT_COLUMN
            outputs[unit] = (exp.column(source.unit, quoted=True), source.columns[source.unit])
        select_sql = ", ".join(
            f"{self.total(e, integers).sql(dialect='duckdb')} AS {_quote(o)}"
            for o, (e, _) in outputs.items()
        )
        sql = f"(SELECT {select_sql} FROM {source.sql} AS _s{filters})"
        columns = {o: c for o, (_, c) in outputs.items()}
        return self._typed(sql, source, unit, columns, name, source.unit_rows)


__all__ = ["Builder"]
