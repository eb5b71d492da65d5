"""Resolve a validated SELECT against the policy: the table, its unit, the group keys (with their
public domains), the aggregates (with the bounds of their arguments) and the outputs.

The result, an :class:`Analysis` (``dpsql.analyze.analysis``), is frozen data and a pure function
of the query, the policy and the catalog (column names and types, which are public). It decides
nothing about noise; the planner does.

Outputs, HAVING and ORDER BY are rewritten to refer to released values only: each aggregate call
becomes a column ``_a{i}`` and each group key ``_k{j}``, so that they can run as
post-processing over noisy values and never in the engine over private rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction

from sqlglot import exp

from dpsql.analyze.analysis import (
    _REF,
    Aggregate,
    Analysis,
    GroupKey,
    Output,
    aggregate_ref,
    key_ref,
)
from dpsql.analyze.cells import keyable_literal
from dpsql.analyze.intervals import Interval, interval_of
from dpsql.analyze.keys import _case_literals, _date_domain
from dpsql.analyze.relations import Builder
from dpsql.analyze.scope import NUMERIC, Describe, Relation, resolve_expr
from dpsql.errors import BoundsError, SchemaError, UnsupportedQueryError
from dpsql.policy import PERIOD_COLUMN, Policy, TableSpec
from dpsql.sql.aggregates import WITHIN_GROUP, AggregateFunction, aggregate_nodes, function_of
from dpsql.sql.totality import total
from dpsql.sql.tree import transform

# Catalog: table name -> column name -> DuckDB type name (all lower-case names).
Catalog = Mapping[str, Mapping[str, str]]


class _Analyzer:
    def __init__(
        self, select: exp.Select, policy: Policy, catalog: Catalog, describe: Describe | None
    ):
        self.select = select
        self.policy = policy
        self.catalog = catalog
        self.relation: Relation = Builder(policy, catalog, describe, total).from_clause(select)
        self.table = self.relation.table
        assert self.relation.spec is not None and self.relation.unit is not None
        self.spec = self.relation.spec
        self.columns = {n: c.type for n, c in self.relation.columns.items()}
        self.unit = self.relation.unit
        self.aggregates: list[Aggregate] = []
        self.keys: list[GroupKey] = []
        self.column_bounds = self.relation.bounds

    # -- columns -----------------------------------------------------------------------------
    def row_level(self, node: exp.Expression, where: str) -> exp.Expression:
        """A copy of a row-level expression with every column resolved and unqualified."""
        for agg in node.find_all(*aggregate_nodes()):
            raise UnsupportedQueryError(f"aggregate {agg.key.upper()} is not allowed in {where}")
        return resolve_expr(node, self.relation, where)

    # -- GROUP BY --------------------------------------------------------------------------
    def group_keys(self) -> None:
        group = self.select.args.get("group")
        if not group:
            return
        items = self.select.expressions
        aliases = {i.alias.lower(): i.this for i in items if isinstance(i, exp.Alias)}
        for index, node in enumerate(group.expressions):
            target = node
            if isinstance(node, exp.Literal) and not node.is_string:
                position = _position(node, len(items), "GROUP BY")
                target = items[position - 1].unalias()
            elif (
                isinstance(node, exp.Column)
                and not node.table
                and node.name.lower() in aliases
                and node.name.lower() not in self.columns
            ):
                target = aliases[node.name.lower()]
            expr = self.row_level(target, "GROUP BY")
            if any(c.name in self.relation.units for c in expr.find_all(exp.Column)):
                raise SchemaError("GROUP BY the privacy unit column is not allowed")
            self.keys.append(self._key(expr, index))

    def _key(self, expr: exp.Expression, index: int) -> GroupKey:
        name = expr.name if isinstance(expr, exp.Column) else f"_k{index}"
        if isinstance(expr, exp.Column):
            col = self.relation.columns[expr.name].spec
            if col is not None and col.public_values is not None:
                return GroupKey(expr, name, domain=col.public_values)
            if col is not None and col.public_values_from is not None:
                table, column = col.public_values_from.lower().split(".")
                if column not in self.catalog.get(table, {}):
                    raise SchemaError(f"the public domain of column {expr.name} does not exist")
                return GroupKey(expr, name, domain_table=(table, column))
            return GroupKey(expr, name)
        literals = _case_literals(expr)
        if literals is not None:
            return GroupKey(expr, name, domain=literals)
        dates = _date_domain(expr, self.relation)
        if dates is not None:
            return GroupKey(expr, name, domain=dates)
        return GroupKey(expr, name)

    # -- aggregates --------------------------------------------------------------------------
    def aggregate(self, node: exp.Expression) -> int:
        inner = node.this if isinstance(node, exp.WithinGroup) else None
        if any(n is not node and n is not inner for n in node.find_all(*aggregate_nodes())):
            raise UnsupportedQueryError("nested aggregates are not supported")
        function = function_of(node)
        assert function is not None  # only the calls of dpsql.sql.aggregates pass validate
        agg = self._aggregate(node, function)
        for i, existing in enumerate(self.aggregates):
            if existing.signature == agg.signature:
                return i
        self.aggregates.append(agg)
        return len(self.aggregates) - 1

    def _aggregate(self, node: exp.Expression, f: AggregateFunction) -> Aggregate:
        """The call read by the forms its function declares (``dpsql.sql.aggregates``)."""
        if f.order is not None:
            return self._quantile(node, f)
        arg = node.this
        name = f.sql_name(node)
        if isinstance(arg, exp.Distinct):
            values = arg.expressions
            if f.distinct is None or len(values) != 1:
                raise UnsupportedQueryError(f"{name}(DISTINCT ...) is not supported")
            target = self.row_level(values[0], f"{name}(DISTINCT)")
            unit = isinstance(target, exp.Column) and target.name in self.relation.units
            if f.units is not None and unit:
                return Aggregate(f.units, None, None)
            # One unit holds at most C distinct values per group after bounding (DESIGN.md
            # section 3): COUNT(DISTINCT x) then moves by at most C per group.
            return Aggregate(f.distinct, target, None)
        if f.star is not None and (isinstance(arg, exp.Star) or arg is None):
            return Aggregate(f.star, None, None)
        if f.pair:
            if f.extra_arguments(node) or node.expression is None:
                raise UnsupportedQueryError(f"{name} takes two arguments: {name}(y, x)")
            y, x = (self.row_level(a, name) for a in (arg, node.expression))
            return Aggregate(
                f.kind, x, self._bounds(x, name), arg2=y, bounds2=self._bounds(y, name)
            )
        target = self.row_level(arg, name)
        if f.star is not None and isinstance(target, exp.Literal):
            return Aggregate(f.star, None, None)
        return Aggregate(f.kind, target, self._bounds(target, name) if f.bounded else None)

    def _quantile(self, node: exp.Expression, f: AggregateFunction) -> Aggregate:
        """MEDIAN, QUANTILE_CONT/DISC(x, p), PERCENTILE_CONT/DISC(p) WITHIN GROUP (ORDER BY x),
        MIN and MAX (the quantiles 0 and 1), answered by the exponential mechanism."""
        name = f.sql_name(node)
        if f.order == WITHIN_GROUP:
            inner, order = node.this, node.expression
            keys = order.expressions if isinstance(order, exp.Order) else []
            if not isinstance(inner, exp.PercentileCont | exp.PercentileDisc) or len(keys) != 1:
                raise UnsupportedQueryError("WITHIN GROUP is supported for PERCENTILE_CONT/DISC")
            if keys[0].args.get("desc"):
                raise UnsupportedQueryError("PERCENTILE ... WITHIN GROUP (ORDER BY x DESC) is "
                                            "not supported; use 1 - p")  # fmt: skip
            arg, p_node = keys[0].this, inner.this
        elif isinstance(f.order, Fraction):
            if f.extra_arguments(node):
                raise UnsupportedQueryError(f"{name} takes one argument")
            arg, p_node = node.this, None
        else:
            assert f.order is not None  # only a quantile has an order
            arg, p_node = node.this, node.args.get(f.order)
        if isinstance(arg, exp.Distinct) or arg is None:
            raise UnsupportedQueryError(f"{name}(DISTINCT ...) is not supported")
        p = f.order if isinstance(f.order, Fraction) else _order(p_node, name)
        target = self.row_level(arg, name)
        return Aggregate(f.kind, target, self._bounds(target, name), p)

    def _bounds(self, target: exp.Expression, name: str) -> Interval:
        if isinstance(target, exp.Column):
            ctype = self.columns[target.name].lower()
            if ctype not in NUMERIC and not ctype.startswith("decimal"):
                raise UnsupportedQueryError(
                    f"{name} over column {target.name} of type {ctype.upper()} is not supported"
                )
        # Expressions of other types (LENGTH(s), a CASE) are typed by the engine before the
        # charge; their bounds come from interval arithmetic like any other.
        interval = interval_of(target, self.column_bounds)
        if not interval.finite:
            missing = sorted(
                {c.name for c in target.find_all(exp.Column) if not self.column_bounds(c).finite}
            )
            what = f"column {', '.join(missing)}" if missing else "the expression"
            raise BoundsError(
                f"{name}({target.sql('duckdb')}) needs finite bounds: {what} has no lower/upper "
                "bound in the policy; declare them, or clamp with LEAST(GREATEST(x, lo), hi)"
            )
        return interval

    # -- outputs -----------------------------------------------------------------------------
    def post_expression(self, node: exp.Expression, where: str) -> exp.Expression:
        """Rewrite an output, HAVING or ORDER BY expression onto ``_a{i}`` and ``_k{j}``."""
        keys = {k.expr.sql("duckdb"): i for i, k in enumerate(self.keys)}
        aggregates = aggregate_nodes()

        def swap(n: exp.Expression) -> exp.Expression:
            if isinstance(n, aggregates):
                return aggregate_ref(self.aggregate(n))
            if isinstance(n, exp.Column | exp.Case | exp.Func | exp.Binary | exp.Paren):
                try:
                    resolved = self.row_level(n, where) if not n.find(*aggregates) else None
                except (SchemaError, UnsupportedQueryError):
                    resolved = None
                if resolved is not None and resolved.sql("duckdb") in keys:
                    return key_ref(keys[resolved.sql("duckdb")])
            return n

        # transform is top-down and does not descend into a node it replaced.
        rewritten = transform(node, swap)
        for column in rewritten.find_all(exp.Column):
            if not column.meta.get(_REF):
                raise SchemaError(
                    f"column {column.name} in {where} must be in GROUP BY or inside an aggregate"
                )
        return rewritten

    def outputs(self) -> list[Output]:
        outputs = []
        for index, item in enumerate(self.select.expressions):
            if isinstance(item, exp.Star) or (
                isinstance(item, exp.Column) and isinstance(item.this, exp.Star)
            ):
                raise UnsupportedQueryError("SELECT * is not allowed: only aggregates are released")
            inner = item.unalias()
            name = item.alias_or_name if isinstance(item, exp.Alias) else _output_name(inner, index)
            outputs.append(Output(name, self.post_expression(inner, "the SELECT list")))
        return outputs

    def having(self, outputs: list[Output]) -> exp.Expression | None:
        having = self.select.args.get("having")
        if having is None:
            return None
        aliased = {o.name.lower(): o.expr for o in outputs}
        node = having.this.copy()
        for column in list(node.find_all(exp.Column)):
            name = column.name.lower()
            if not column.table and name in aliased and name not in self.columns:
                column.replace(aliased[name].copy())
        return self.post_expression(node, "HAVING")

    def order(self, outputs: list[Output]) -> tuple[exp.Ordered, ...]:
        order = self.select.args.get("order")
        if order is None:
            return ()
        names = {o.name.lower(): o for o in outputs}
        result = []
        for ordered in order.expressions:
            target = ordered.this
            if isinstance(target, exp.Literal) and not target.is_string:
                position = _position(target, len(outputs), "ORDER BY")
                expr: exp.Expression = outputs[position - 1].expr.copy()
            elif (
                isinstance(target, exp.Column)
                and not target.table
                and target.name.lower() in names
                and target.name.lower() not in self.columns
            ):
                expr = names[target.name.lower()].expr.copy()
            else:
                expr = self.post_expression(target, "ORDER BY")
            result.append(exp.Ordered(this=expr, desc=ordered.args.get("desc"),
                                      nulls_first=ordered.args.get("nulls_first")))  # fmt: skip
        return tuple(result)


def _output_name(node: exp.Expression, index: int) -> str:
    if isinstance(node, exp.Column):
        return node.name
    function = function_of(node)
    if function is not None:
        return function.column_name(node)
    return f"col{index}"


def _order(node: exp.Expression | None, name: str) -> Fraction:
    """A quantile's order written in the call: a number literal in [0, 1]."""
    if not (isinstance(node, exp.Literal) and not node.is_string):
        raise UnsupportedQueryError(f"the order of {name} must be a number literal")
    p = Fraction(str(node.this))
    if not 0 <= p <= 1:
        raise UnsupportedQueryError(f"the order of {name} must lie in [0, 1]")
    return p


def _cell_predicate(where: exp.Expression | None, spec: TableSpec) -> tuple[str, str] | None:
    """The first top-level conjunct ``column = constant`` of WHERE on a constant-per-unit
    column, as (column, constant SQL). Only the engine can say which cell the constant names
    (``DuckDBEngine.cell_key``): Python equality of literals is not the engine's."""
    if where is None or not spec.constant_per_unit:
        return None
    conjuncts = list(where.flatten()) if isinstance(where, exp.And) else [where]
    for conjunct in conjuncts:
        if not isinstance(conjunct, exp.EQ):
            continue
        for column, value in (
            (conjunct.this, conjunct.expression),
            (conjunct.expression, conjunct.this),
        ):
            if (
                isinstance(column, exp.Column)
                and column.name in spec.constant_per_unit
                and keyable_literal(value)
            ):
                return (column.name, value.sql(dialect="duckdb"))
    return None


def _position(node: exp.Literal, count: int, clause: str) -> int:
    """A 1-based ``GROUP BY`` / ``ORDER BY`` position: digits only (``1.5``, ``1e0`` are not
    positions), within the SELECT list."""
    text = str(node.this)
    if not (text.isascii() and text.isdigit() and len(text) <= 6 and 1 <= int(text) <= count):
        raise UnsupportedQueryError(
            f"{clause} position must be a whole number from 1 to {count} (the SELECT list)"
        )
    return int(text)


def _limit(select: exp.Select, name: str) -> int | None:
    clause = select.args.get(name)
    if clause is None:
        return None
    value = clause.expression
    if not (isinstance(value, exp.Literal) and not value.is_string and str(value.this).isdigit()):
        raise UnsupportedQueryError(f"{name.upper()} must be a non-negative integer literal")
    return int(value.this)


def _period(policy: Policy, table: str, base: bool, tables: tuple[str, ...]) -> str | None:
    """The column of each row's period when the query reads the table of a person-within-period
    unit (``dpsql.policy.periods``), which it must read alone: the unit is then the person and
    that column, and a join or subquery would not carry it."""
    periods = policy.periods
    if periods is None or periods.table not in {table, *tables}:
        return None
    if not base or table != periods.table:
        raise UnsupportedQueryError(
            f"{periods.table} has a person-within-period unit (periods.table): a query reads it "
            "alone, without a join or subquery"
        )
    return PERIOD_COLUMN


def analyze(
    select: exp.Select, policy: Policy, catalog: Catalog, describe: Describe | None = None
) -> Analysis:
    """Analyze a validated, parameter-bound SELECT. Raises a ``QueryError`` subclass.

    ``describe`` types a derived relation (a join or subquery) without reading rows."""
    analyzer = _Analyzer(select, policy, catalog, describe)
    where = select.args.get("where")
    where_expr = analyzer.row_level(where.this, "WHERE") if where is not None else None
    analyzer.group_keys()
    outputs = analyzer.outputs()
    having = analyzer.having(outputs)
    order = analyzer.order(outputs)
    if not analyzer.aggregates:
        raise UnsupportedQueryError("a query must compute at least one aggregate")
    period = _period(policy, analyzer.table, analyzer.relation.base, analyzer.relation.tables)
    return Analysis(
        table=analyzer.table,
        spec=analyzer.spec,
        unit=analyzer.unit,
        columns=analyzer.columns,
        where=where_expr,
        keys=tuple(analyzer.keys),
        aggregates=tuple(analyzer.aggregates),
        outputs=tuple(outputs),
        having=having,
        order=order,
        limit=_limit(select, "limit"),
        offset=_limit(select, "offset"),
        cell_predicate=_cell_predicate(where_expr, analyzer.spec)
        if analyzer.relation.base
        else None,
        source=analyzer.relation.sql
        if analyzer.relation.base
        else f"{analyzer.relation.sql} AS _src",
        base=analyzer.relation.base,
        tables=analyzer.relation.tables,
        unit_rows=analyzer.relation.unit_rows,
        period=period,
        bounds={
            n: (c.interval.lower, c.interval.upper)
            for n, c in analyzer.relation.columns.items()
            if c.interval.lower is not None and c.interval.upper is not None
        },
    )


__all__ = ["Catalog", "analyze"]
