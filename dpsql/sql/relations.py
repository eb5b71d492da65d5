"""The relation a query aggregates: one table, a join, a CTE or a FROM-subquery.

Every FROM item becomes a :class:`Relation`: SQL the engine can read, its columns (with their
DuckDB types, their bounds and any public domain) and, when it holds private rows, the column
that names each row's privacy unit. The rule that keeps contribution bounding valid is simple:
**every row of a private relation belongs to exactly one unit, and depends only on that unit's
rows** (plus public tables). Bounding then happens after the relation is built (DESIGN.md
section 3, step 1: joins and row-level work first), so a unit's rows, however many a join
made of them, are capped by the same L0 and C as a table's.

* A private table: each row is its unit's.
* ``private JOIN public`` (inner, LEFT from the private side, SEMI, ANTI, CROSS): a joined row
  is one private row with public columns attached, so it is still that row's unit's.
* ``private JOIN private`` on equal units (same table, or tables declaring the same
  ``unit_domain``): a joined row pairs two rows of one unit. Join fan-out multiplies a unit's
  rows but never mixes units; the bounding after the join caps it.
* A row-level subquery (filters, derived columns) maps each row to at most one row.
* A subquery that aggregates and groups by the unit: each output row summarises one unit's rows.

Anything else (RIGHT and FULL joins, which keep rows with no unit; private tables joined on
other columns, which pair rows of different units; subqueries with LIMIT or DISTINCT, whose
rows depend on other units' rows) is refused with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction

from sqlglot import exp

from dpsql.errors import SchemaError, UnsupportedQueryError
from dpsql.policy import ColumnSpec, Policy, TableSpec, did_you_mean
from dpsql.sql.intervals import Interval, interval_of
from dpsql.sql.totality import WIDENED, as_boolean
from dpsql.sql.tree import transform

# Catalog: table name -> column name -> DuckDB type name (all lower-case names).
Catalog = Mapping[str, Mapping[str, str]]
# The engine's DESCRIBE of a SELECT: its output column names and DuckDB types (no data read).
Describe = Callable[[str], list[tuple[str, str]]]

UNIT_COLUMN = "_dpsql_unit"  # the unit column a derived relation adds when it is not selected
_MAX_NESTING = 8

NUMERIC = {
    "tinyint", "smallint", "integer", "bigint", "hugeint", "utinyint", "usmallint",
    "uinteger", "ubigint", "uhugeint", "float", "double", "real",
}  # fmt: skip
INTEGER = {t for t in NUMERIC if t not in {"float", "double", "real"}}


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


class Builder:
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
        self.ctes: dict[str, exp.Select] = {}
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
                if not isinstance(body, exp.Select):
                    raise UnsupportedQueryError("a CTE must be a single SELECT")
                self.ctes[cte.alias.lower()] = body
        from_ = select.args.get("from_") or select.args.get("from")
        if from_ is None:
            raise UnsupportedQueryError("a query needs FROM a private table")
        first = self.item(from_.this)
        joins = select.args.get("joins") or []
        relation = self.joined(first, joins) if joins else first
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
                relation = self.derived(self.ctes[name], name)
                return _realias(relation, alias or name)
            return self.table(name, alias)
        if isinstance(node, exp.Subquery):
            body = node.this
            if not isinstance(body, exp.Select):
                raise UnsupportedQueryError("a FROM subquery must be a single SELECT")
            alias = node.alias.lower() if node.alias else "_subquery"
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
        if unit is not None:
            for column in (unit, *spec.constant_per_unit):
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
        )

    # -- joins -------------------------------------------------------------------------------
    def joined(self, first: Relation, joins: list[exp.Join]) -> Relation:
        inputs = [first]
        aliases = [_alias_of(first)]
        clauses: list[str] = []
        kinds: list[str] = []
        self.using = {}
        for join in joins:
            right = self.item(join.this)
            side = (join.args.get("side") or "").upper()
            kind = (join.args.get("kind") or "").upper()
            if side in ("RIGHT", "FULL"):
                raise UnsupportedQueryError(
                    f"{side} JOIN keeps rows that belong to no privacy unit; write it as a LEFT "
                    "JOIN from the private table"
                )
            method = str(join.args.get("method") or "").upper()
            if method or kind in ("ASOF", "POSITIONAL", "NATURAL"):
                raise UnsupportedQueryError(
                    f"{method or kind} JOIN is not supported; name the columns with ON or USING"
                )
            left_private = [r for r in inputs if r.private]
            filtering = kind in ("SEMI", "ANTI")
            if right.private and not left_private and (side == "LEFT" or filtering):
                raise UnsupportedQueryError(
                    "a private table must be on the preserved (left) side of a LEFT, SEMI or "
                    "ANTI JOIN: otherwise a row's existence depends on other units' rows"
                )
            alias = _alias_of(right)
            if alias in aliases:
                raise SchemaError(f"table name or alias {alias} is used twice in FROM")
            inputs.append(right)
            aliases.append(alias)
            on = self._on(join, inputs, kind)
            if right.private and left_private:
                self._check_unit_join(left_private, on, inputs)
            word = {"SEMI": "SEMI JOIN", "ANTI": "ANTI JOIN", "CROSS": "CROSS JOIN"}.get(
                kind, "LEFT JOIN" if side == "LEFT" else "JOIN"
            )
            condition = f" ON {on.sql(dialect='duckdb')}" if kind != "CROSS" else ""
            clauses.append(f"{word} {right.sql} AS {_quote(f'_j{len(inputs) - 1}')}{condition}")
            kinds.append("LEFT" if side == "LEFT" else kind)
        return self._combine(inputs, aliases, clauses, kinds)

    @staticmethod
    def _resolve_in(column: exp.Column, inputs: list[Relation]) -> tuple[int, str]:
        """(input index, relation column) a reference names among the joined inputs."""
        qualifier = column.table.lower() if column.table else None
        matches: list[tuple[int, str]] = []
        for i, relation in enumerate(inputs):
            if qualifier is not None and qualifier not in relation.scope:
                continue
            try:
                probe = column if qualifier is not None else exp.column(column.name)
                matches.append((i, relation.resolve(probe)))
            except SchemaError:
                continue
        if not matches:
            raise SchemaError(f"unknown column {column.name.lower()} in the joined tables")
        if len(matches) > 1:
            raise SchemaError(
                f"column {column.name.lower()} is ambiguous; qualify it with its table"
            )
        return matches[0]

    def _on(self, join: exp.Join, inputs: list[Relation], kind: str) -> exp.Expression:
        right = len(inputs) - 1
        using = join.args.get("using") or []
        on = join.args.get("on")
        if kind == "CROSS" or (on is None and not using):
            if kind not in ("CROSS", ""):
                raise UnsupportedQueryError(f"{kind} JOIN needs ON or USING")
            return exp.true()
        conjuncts: list[exp.Expression] = []
        for ident in using:
            name = ident.name.lower()
            left_index, left_col = self._resolve_in(exp.column(name), inputs[:right])
            right_col = inputs[right].resolve(exp.column(name))
            # USING merges the two columns into one, as in SQL: the right one is not output.
            self.using.setdefault(right, {})[right_col] = (left_index, left_col)
            conjuncts.append(
                exp.EQ(
                    this=exp.column(left_col, table=f"_j{left_index}", quoted=True),
                    expression=exp.column(right_col, table=f"_j{right}", quoted=True),
                )
            )
        if on is not None:
            _reject_nested_queries(on, "ON")
            for agg in on.find_all(exp.AggFunc):
                raise UnsupportedQueryError(f"aggregate {agg.key.upper()} is not allowed in ON")

            def swap(n: exp.Expression) -> exp.Expression:
                if isinstance(n, exp.Column):
                    index, name = self._resolve_in(n, inputs)
                    return exp.column(name, table=f"_j{index}", quoted=True)
                return n

            resolved = transform(on, swap)
            conjuncts.extend(_conjuncts(resolved))
        integers: frozenset[str] = frozenset()  # TRY covers what can raise in a join condition
        parts = []
        for conjunct in conjuncts:
            if _column_equality(conjunct) and self._same_kind(conjunct, inputs):
                parts.append(conjunct)  # cannot raise; kept bare so the engine can hash-join
            else:
                # A condition the engine casts to BOOLEAN, on the data: cast it totally.
                checked = self.total(as_boolean(conjunct), integers)
                parts.append(exp.Is(this=checked, expression=exp.true()))
        return exp.and_(*parts) if len(parts) > 1 else parts[0]  # type: ignore[return-value]

    @staticmethod
    def _same_kind(conjunct: exp.Expression, inputs: list[Relation]) -> bool:
        """Whether ``a = b`` compares columns of one type, or two numbers: only then can it not
        raise (DuckDB casts the other side implicitly, and '1' = 'east' fails on the data)."""
        types = []
        for column in (conjunct.this, conjunct.expression):
            assert isinstance(column, exp.Column)
            types.append(inputs[int(column.table[2:])].columns[column.name].type.lower())
        return types[0] == types[1] or all(t in NUMERIC for t in types)

    @staticmethod
    def _check_unit_join(
        left_private: list[Relation], on: exp.Expression, inputs: list[Relation]
    ) -> None:
        """Two private relations join only on equal units of one unit domain."""
        right = inputs[-1]
        domain = left_private[0].domain
        if right.domain != domain:
            raise UnsupportedQueryError(
                f"tables {left_private[0].table} and {right.table} have different privacy units; "
                "they can be joined only if the policy gives both the same unit_domain"
            )
        right_index = len(inputs) - 1
        units = {(i, r.unit) for i, r in enumerate(inputs[:right_index]) if r.private and r.unit}
        assert right.unit is not None
        for conjunct in _conjuncts(on):
            if not _column_equality(conjunct):
                continue
            a, b = conjunct.this, conjunct.expression
            ends = {(int(a.table[2:]), a.name), (int(b.table[2:]), b.name)}
            if (right_index, right.unit) in ends and ends & units:
                return
        raise UnsupportedQueryError(
            f"joining private tables {left_private[0].table} and {right.table} needs ON "
            "equality of their privacy unit columns: rows of different units must never pair"
        )

    def _combine(
        self, inputs: list[Relation], aliases: list[str], clauses: list[str], kinds: list[str]
    ) -> Relation:
        # SEMI and ANTI joins only filter: their right side's columns are not visible.
        visible = [True] + [k not in ("SEMI", "ANTI") for k in kinds]
        counts: dict[str, int] = {}
        for i, (relation, show) in enumerate(zip(inputs, visible, strict=True)):
            if show:
                for name in relation.columns:
                    counts[name] = counts.get(name, 0) + (name not in self.using.get(i, {}))
        mappings: list[dict[str, str]] = []
        columns: dict[str, RelColumn] = {}
        select: list[str] = []
        scope: dict[str, dict[str, str]] = {}
        anchor = next(i for i, r in enumerate(inputs) if r.private)
        unit_name = ""
        units: set[str] = set()
        kinds_of = ["", *kinds]
        for i, (relation, alias, show) in enumerate(zip(inputs, aliases, visible, strict=True)):
            if not show:
                mappings.append({})
                continue
            mapping: dict[str, str] = {}
            mappings.append(mapping)
            for name, column in relation.columns.items():
                merged = self.using.get(i, {}).get(name)
                if merged is not None and merged[1] in mappings[merged[0]]:
                    mapping[name] = mappings[merged[0]][merged[1]]
                    continue
                out = name if counts[name] == 1 else f"{alias}_{name}"
                while out in columns:
                    out = "_" + out
                columns[out] = column
                mapping[name] = out
                select.append(f"{_quote('_j' + str(i))}.{_quote(name)} AS {_quote(out)}")
            for qualifier, names in relation.scope.items():
                scope[qualifier] = {
                    written: mapping[target]
                    for written, target in names.items()
                    if target in mapping
                }
            if i == anchor:
                assert relation.unit is not None
                unit_name = mapping[relation.unit]
            if relation.private and kinds_of[i] not in ("LEFT",):
                # Inner joins on the unit make every private input's unit column equal to it.
                units.update(mapping[u] for u in relation.units if u in mapping)
        private = [r for r in inputs if r.private]
        spec = _merged_spec([r.spec for r in private if r.spec is not None])
        sql = (
            f"(SELECT {', '.join(select)} FROM {inputs[0].sql} AS {_quote('_j0')} "
            + " ".join(clauses)
            + ")"
        )
        tables = tuple(dict.fromkeys(t for r in inputs for t in r.tables))
        return Relation(
            sql=sql,
            base=False,
            table=private[0].table if private else inputs[0].table,
            tables=tables,
            unit=unit_name or None,
            spec=spec,
            domain=private[0].domain if private else None,
            columns=columns,
            scope=scope,
            unit_columns=frozenset(units),
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
            total_condition = self.total(as_boolean(condition), integers)
            filters = f" WHERE {total_condition.sql(dialect='duckdb')} IS TRUE"
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

    def _per_unit(  # noqa: PLR0915 - one pass over the subquery's clauses
        self, select: exp.Select, source: Relation, filters: str, name: str
    ) -> Relation:
        """A subquery that aggregates per unit: GROUP BY must hold the unit column itself."""
        group = select.args.get("group")
        keys = [resolve_expr(k, source, "GROUP BY") for k in (group.expressions if group else [])]
        assert source.unit is not None
        if not any(isinstance(k, exp.Column) and k.name == source.unit for k in keys):
            raise UnsupportedQueryError(
                f"a subquery that aggregates must GROUP BY the privacy unit {source.unit}: "
                "otherwise its rows combine several units"
            )
        integers = frozenset(c for c, col in source.columns.items() if col.type.lower() in WIDENED)
        key_sql = {k.sql(dialect="duckdb"): i for i, k in enumerate(keys)}
        aggregates: list[str] = []
        intervals: dict[str, Interval] = {}
        for i, k in enumerate(keys):
            intervals[f"_g{i}"] = interval_of(k, source.bounds)

        counts: set[str] = set()

        def lift(node: exp.Expression) -> exp.Expression:
            """Replace each aggregate and key by a reference into the grouped inner SELECT."""

            def swap(n: exp.Expression) -> exp.Expression:
                if isinstance(n, exp.AggFunc):
                    ref = f"_v{len(aggregates)}"
                    sql, interval = self._inner_aggregate(n, source, integers)
                    aggregates.append(f"{sql} AS {ref}")
                    intervals[ref] = interval
                    if sql.startswith("COUNT("):
                        counts.add(ref)  # BIGINT: widened under arithmetic, like a column
                    return exp.column(ref)
                if not isinstance(n, exp.Literal):
                    text = n.sql(dialect="duckdb")
                    if text in key_sql:
                        return exp.column(f"_g{key_sql[text]}")
                return n

            lifted = transform(node, swap)
            for column in lifted.find_all(exp.Column):
                if not (column.name.startswith("_g") or column.name.startswith("_v")):
                    raise SchemaError(
                        f"column {column.name} in subquery {name} must be in GROUP BY or inside "
                        "an aggregate"
                    )
            return lifted

        outputs: dict[str, tuple[exp.Expression, RelColumn]] = {}
        for index, item in enumerate(select.expressions):
            if isinstance(item, exp.Star):
                raise UnsupportedQueryError("SELECT * is not allowed in a subquery with GROUP BY")
            resolved = resolve_expr(item.unalias(), source, "a subquery's SELECT list")
            out = _item_name(item, index)
            if out in outputs:
                raise SchemaError(f"the subquery {name} has two columns named {out}")
            lifted = lift(resolved)
            interval = interval_of(lifted, lambda c: intervals.get(c.name, Interval(None, None)))
            spec = None
            if isinstance(resolved, exp.Column) and resolved.sql(dialect="duckdb") in key_sql:
                spec = source.columns[resolved.name].spec
            outputs[out] = (lifted, RelColumn("", interval, spec))
        having = select.args.get("having")
        post = ""
        if having is not None:
            condition = lift(resolve_expr(having.this, source, "HAVING"))
            checked = self.total(as_boolean(condition), frozenset(counts))
            post = f" WHERE {checked.sql(dialect='duckdb')} IS TRUE"
        unit_key = next(
            i for i, k in enumerate(keys) if isinstance(k, exp.Column) and k.name == source.unit
        )
        unit = _output_named(outputs, f"_g{unit_key}")
        if unit is None:
            unit = UNIT_COLUMN
            outputs[unit] = (exp.column(f"_g{unit_key}"), source.columns[source.unit])
        grouped = ", ".join(
            [
                f"{self.total(k, integers).sql(dialect='duckdb')} AS _g{i}"
                for i, k in enumerate(keys)
            ]
            + aggregates
        )
        group_by = ", ".join(f"_g{i}" for i in range(len(keys)))
        inner = f"(SELECT {grouped} FROM {source.sql} AS _s{filters} GROUP BY {group_by})"
        outer = ", ".join(
            f"{self.total(e, frozenset(counts)).sql(dialect='duckdb')} AS {_quote(o)}"
            for o, (e, _) in outputs.items()
        )
        sql = f"(SELECT {outer} FROM {inner} AS _p{post})"
        # GROUP BY the unit alone leaves one row per unit (DESIGN.md section 3: C' = L0' = 1).
        one_row = len(keys) == 1
        columns = {o: c for o, (_, c) in outputs.items()}
        return self._typed(sql, source, unit, columns, name, 1 if one_row else None)

    def _inner_aggregate(
        self, node: exp.Expression, source: Relation, integers: frozenset[str]
    ) -> tuple[str, Interval]:
        """An aggregate inside a per-unit subquery: its SQL and the range of its value."""
        arg = node.this
        if isinstance(node, exp.Count):
            if isinstance(arg, exp.Distinct):
                inner = ", ".join(
                    self.total(e, integers).sql(dialect="duckdb") for e in arg.expressions
                )
                return f"COUNT(DISTINCT {inner})", Interval(Fraction(0), None, True)
            if arg is None or isinstance(arg, exp.Star):
                return "COUNT(*)", Interval(Fraction(0), None, True)
            return (
                f"COUNT({self.total(arg, integers).sql(dialect='duckdb')})",
                Interval(Fraction(0), None, True),
            )
        kinds = {exp.Sum: "SUM", exp.Avg: "AVG", exp.Min: "MIN", exp.Max: "MAX"}
        word = next((w for t, w in kinds.items() if isinstance(node, t)), None)
        if word is not None and isinstance(arg, exp.Distinct):
            raise UnsupportedQueryError(f"{word}(DISTINCT ...) is not supported in a subquery")
        if word is None:
            raise UnsupportedQueryError(
                f"{node.key.upper()} is not supported inside a per-unit subquery "
                "(COUNT, SUM, AVG, MIN and MAX are)"
            )
        value = self.total(arg, integers).sql(dialect="duckdb")
        iv = interval_of(arg, source.bounds)
        if word in ("SUM", "AVG"):
            # An integer or DECIMAL SUM (and AVG) raises on overflow, which one unit's many or
            # huge values trigger: whether the query fails would depend on the data. fsum and
            # favg add in DOUBLE (compensated), which saturates at inf instead; the outer query
            # clamps the value to its bounds like any other.
            word = "FSUM" if word == "SUM" else "FAVG"
        if word == "FSUM":
            # A sum of n values has no bound without a bound on n: only its sign is known.
            lower = Fraction(0) if iv.lower is not None and iv.lower >= 0 else None
            upper = Fraction(0) if iv.upper is not None and iv.upper <= 0 else None
            iv = Interval(lower, upper, iv.integral)
        elif word == "FAVG":
            iv = Interval(iv.lower, iv.upper, False)
        return f"{word}({value})", iv

    def _typed(  # noqa: PLR0917 - the parts of one derived relation
        self,
        sql: str,
        source: Relation,
        unit: str,
        columns: dict[str, RelColumn],
        name: str,
        unit_rows: int | None,
    ) -> Relation:
        """Fill in the DuckDB types of a derived relation (DESCRIBE reads no rows)."""
        if self.describe is None:
            raise UnsupportedQueryError("subqueries need the engine's catalog")
        described = dict(self.describe(f"SELECT * FROM {sql} AS _t"))
        typed = {
            o: RelColumn(described.get(o, c.type) or c.type, c.interval, c.spec)
            for o, c in columns.items()
        }
        spec = source.spec
        if spec is not None and source.base:
            # constant_per_unit is enforced on base tables only: a derived relation has none.
            spec = spec.model_copy(update={"constant_per_unit": (), "columns": {}})
        return Relation(
            sql=sql,
            base=False,
            table=source.table,
            tables=source.tables,
            unit=unit,
            spec=spec,
            domain=source.domain,
            columns=typed,
            scope={name: {o: o for o in typed if o != UNIT_COLUMN}},
            unit_rows=unit_rows,
        )


def _output_named(outputs: Mapping[str, tuple[exp.Expression, RelColumn]], name: str) -> str | None:
    """The output that is exactly the column ``name``, if any."""
    return next(
        (o for o, (e, _) in outputs.items() if isinstance(e, exp.Column) and e.name == name),
        None,
    )


def _conjuncts(node: exp.Expression) -> list[exp.Expression]:
    if not isinstance(node, exp.And):
        return [node]
    return [n for n in node.flatten() if isinstance(n, exp.Expression)]


def _column_equality(node: exp.Expression) -> bool:
    return (
        isinstance(node, exp.EQ)
        and isinstance(node.this, exp.Column)
        and isinstance(node.expression, exp.Column)
    )


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


def _item_name(item: exp.Expression, index: int) -> str:
    if isinstance(item, exp.Alias):
        name = item.alias.lower()
    elif isinstance(item, exp.Column):
        name = item.name.lower()
    else:
        name = f"col{index}"
    if name.startswith("_dpsql"):
        raise SchemaError("column names starting with _dpsql are reserved")
    return name


def _merged_spec(specs: list[TableSpec]) -> TableSpec | None:
    """The bounds of a join of private tables: the smallest each table declares (any bounds
    are valid, since they are enforced after the join; the smallest is what every table's owner
    accepts)."""
    if not specs:
        return None
    first = specs[0]

    def smallest(values: list[int | None]) -> int | None:
        known = [v for v in values if v is not None]
        return min(known) if known else None

    return first.model_copy(
        update={
            "max_groups_per_unit": smallest([s.max_groups_per_unit for s in specs]),
            "max_rows_per_unit_per_group": smallest([s.max_rows_per_unit_per_group for s in specs]),
            "max_rows_per_unit": smallest([s.max_rows_per_unit for s in specs]),
            "constant_per_unit": (),
        }
    )
