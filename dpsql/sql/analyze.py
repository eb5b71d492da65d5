"""Resolve a validated SELECT against the policy: the table, its unit, the group keys (with their
public domains), the aggregates (with the bounds of their arguments) and the outputs.

The result is frozen data and a pure function of the query, the policy and the catalog (column
names and types, which are public). It decides nothing about noise; the planner does.

Outputs, HAVING and ORDER BY are rewritten to refer to released values only: each aggregate call
becomes a column ``_a{i}`` and each group key ``_k{j}``, so that they can run as
post-processing over noisy values and never in the engine over private rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from sqlglot import exp

from dpsql.errors import BoundsError, SchemaError, UnsupportedQueryError
from dpsql.policy import Policy, PublicValue, TableSpec
from dpsql.sql.intervals import Interval, declared_bounds, interval_of
from dpsql.sql.validate import AGGREGATES

# Catalog: table name -> column name -> DuckDB type name (all lower-case names).
Catalog = Mapping[str, Mapping[str, str]]

AggregateKind = Literal[
    "count_rows", "count", "count_units", "sum", "avg",
    "var_pop", "var_samp", "stddev_pop", "stddev_samp",
]  # fmt: skip
# Variances and standard deviations with DuckDB's meanings (VARIANCE = VAR_SAMP, STDDEV =
# STDDEV_SAMP); like AVG, their argument needs finite bounds.
_SPREAD: dict[type[exp.Expression], AggregateKind] = {
    exp.Variance: "var_samp",
    exp.VariancePop: "var_pop",
    exp.Stddev: "stddev_samp",
    exp.StddevSamp: "stddev_samp",
    exp.StddevPop: "stddev_pop",
}
SPREAD_KINDS: frozenset[str] = frozenset(_SPREAD.values())

_NUMERIC = {
    "tinyint", "smallint", "integer", "bigint", "hugeint", "utinyint", "usmallint",
    "uinteger", "ubigint", "uhugeint", "float", "double", "real",
}  # fmt: skip
_INTEGER = {t for t in _NUMERIC if t not in {"float", "double", "real"}}


@dataclass(frozen=True)
class Aggregate:
    """One aggregate call of the query (deduplicated by kind and argument)."""

    kind: AggregateKind
    arg: exp.Expression | None  # row-level argument, columns unqualified
    bounds: Interval | None  # finite range of the argument, for SUM, AVG and the spreads

    @property
    def signature(self) -> str:
        return f"{self.kind}:{self.arg.sql('duckdb') if self.arg is not None else ''}"


@dataclass(frozen=True)
class GroupKey:
    """A GROUP BY key: a row-level expression and, if public, its domain of values."""

    expr: exp.Expression
    name: str
    domain: tuple[PublicValue, ...] | None = None  # declared or written in the query
    domain_table: tuple[str, str] | None = None  # (public table, column) holding the domain

    @property
    def public(self) -> bool:
        return self.domain is not None or self.domain_table is not None


@dataclass(frozen=True)
class Output:
    """One output column: its name and an expression over ``_a{i}`` and ``_k{j}``."""

    name: str
    expr: exp.Expression


@dataclass(frozen=True)
class Analysis:
    """Everything the planner needs to know about a query, and nothing about the data."""

    table: str
    spec: TableSpec
    unit: str
    columns: Mapping[str, str]
    where: exp.Expression | None
    keys: tuple[GroupKey, ...]
    aggregates: tuple[Aggregate, ...]
    outputs: tuple[Output, ...]
    having: exp.Expression | None
    order: tuple[exp.Ordered, ...]
    limit: int | None
    offset: int | None
    # (column, value) when WHERE requires a constant-per-unit column to equal one literal: the
    # query then touches only the units whose (enforced) value is that one.
    cell: tuple[str, str | Fraction | bool] | None = None

    @property
    def grouped(self) -> bool:
        return bool(self.keys)


_REF = "dpsql_ref"


def key_ref(index: int) -> exp.Column:
    ref = exp.column(f"_k{index}")
    ref.meta[_REF] = True  # marks references dpsql made; a user cannot write one
    return ref


def aggregate_ref(index: int) -> exp.Column:
    ref = exp.column(f"_a{index}")
    ref.meta[_REF] = True
    return ref


class _Analyzer:
    def __init__(self, select: exp.Select, policy: Policy, catalog: Catalog):
        self.select = select
        self.policy = policy
        self.catalog = catalog
        self.table, self.alias = self._table()
        self.spec = policy.tables[self.table]
        assert self.spec.privacy_unit is not None
        self.columns = catalog[self.table]
        self.unit = self.spec.privacy_unit.lower()
        for name in (self.unit, *self.spec.constant_per_unit):
            if name not in self.columns:
                raise SchemaError(f"column {name} named by the policy of {self.table} is missing")
        self.aggregates: list[Aggregate] = []
        self.keys: list[GroupKey] = []
        bounds = {n: c.bounds for n, c in self.spec.columns.items() if c.bounds}
        integral = {n: t.lower() in _INTEGER for n, t in self.columns.items()}
        self.column_bounds = declared_bounds(bounds, integral)

    # -- FROM ------------------------------------------------------------------------------
    def _table(self) -> tuple[str, str | None]:
        from_ = self.select.args.get("from_") or self.select.args.get("from")
        if from_ is None:
            raise UnsupportedQueryError("a query needs FROM a private table")
        table = from_.this
        if not isinstance(table, exp.Table):
            raise UnsupportedQueryError("FROM must name one table")
        name = table.name.lower()
        spec = self.policy.tables.get(name)
        if spec is None or name not in self.catalog:
            raise SchemaError(f"unknown table {name}")
        if not spec.is_private:
            raise UnsupportedQueryError(
                f"table {name} is public; dpsql answers queries over private tables"
            )
        alias = table.alias.lower() if table.alias else None
        return name, alias

    # -- columns -----------------------------------------------------------------------------
    def row_level(self, node: exp.Expression, where: str) -> exp.Expression:
        """A copy of a row-level expression with every column resolved and unqualified."""
        for agg in node.find_all(*AGGREGATES):
            raise UnsupportedQueryError(f"aggregate {agg.key.upper()} is not allowed in {where}")
        # transform copies the tree and also replaces the root when it is itself a column.
        return node.transform(lambda n: self.resolve(n) if isinstance(n, exp.Column) else n)

    def resolve(self, column: exp.Column) -> exp.Column:
        qualifier = column.table.lower() if column.table else None
        if qualifier and qualifier not in {self.table, self.alias}:
            raise SchemaError(f"unknown table or alias {qualifier}")
        if isinstance(column.this, exp.Star):
            raise UnsupportedQueryError("SELECT * is not allowed: only aggregates are released")
        name = column.name.lower()
        if name not in self.columns:
            raise SchemaError(f"unknown column {name} in table {self.table}")
        return exp.column(name, quoted=True)

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
                position = int(node.this)
                if not 1 <= position <= len(items):
                    raise UnsupportedQueryError(f"GROUP BY position {position} is out of range")
                target = items[position - 1].unalias()
            elif (
                isinstance(node, exp.Column)
                and not node.table
                and node.name.lower() in aliases
                and node.name.lower() not in self.columns
            ):
                target = aliases[node.name.lower()]
            expr = self.row_level(target, "GROUP BY")
            if any(c.name == self.unit for c in expr.find_all(exp.Column)):
                raise SchemaError("GROUP BY the privacy unit column is not allowed")
            self.keys.append(self._key(expr, index))

    def _key(self, expr: exp.Expression, index: int) -> GroupKey:
        name = expr.name if isinstance(expr, exp.Column) else f"_k{index}"
        if isinstance(expr, exp.Column):
            col = self.spec.columns.get(expr.name)
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
        return GroupKey(expr, name)

    # -- aggregates --------------------------------------------------------------------------
    def aggregate(self, node: exp.Expression) -> int:
        if any(node.find_all(*AGGREGATES)) and any(
            n is not node for n in node.find_all(*AGGREGATES)
        ):
            raise UnsupportedQueryError("nested aggregates are not supported")
        agg = self._aggregate(node)
        for i, existing in enumerate(self.aggregates):
            if existing.signature == agg.signature:
                return i
        self.aggregates.append(agg)
        return len(self.aggregates) - 1

    def _aggregate(self, node: exp.Expression) -> Aggregate:
        arg = node.this
        name = node.key.upper()
        if isinstance(arg, exp.Distinct):
            values = arg.expressions
            if not isinstance(node, exp.Count) or len(values) != 1:
                raise UnsupportedQueryError(f"{name}(DISTINCT ...) is not supported")
            target = self.row_level(values[0], "COUNT(DISTINCT)")
            if not (isinstance(target, exp.Column) and target.name == self.unit):
                raise UnsupportedQueryError(
                    "COUNT(DISTINCT column) is supported only for the privacy unit column"
                )
            return Aggregate("count_units", None, None)
        if isinstance(node, exp.Count):
            if isinstance(arg, exp.Star) or arg is None:
                return Aggregate("count_rows", None, None)
            target = self.row_level(arg, "COUNT")
            if isinstance(target, exp.Literal):
                return Aggregate("count_rows", None, None)
            return Aggregate("count", target, None)
        target = self.row_level(arg, name)
        bounds = self._bounds(target, name)
        kind: AggregateKind = "sum" if isinstance(node, exp.Sum) else "avg"
        kind = _SPREAD.get(type(node), kind)
        return Aggregate(kind, target, bounds)

    def _bounds(self, target: exp.Expression, name: str) -> Interval:
        for column in target.find_all(exp.Column):
            ctype = self.columns[column.name].lower()
            if ctype not in _NUMERIC and not ctype.startswith("decimal"):
                raise UnsupportedQueryError(
                    f"{name} over column {column.name} of type {ctype.upper()} is not supported"
                )
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

        def swap(n: exp.Expression) -> exp.Expression:
            if isinstance(n, AGGREGATES):
                return aggregate_ref(self.aggregate(n))
            if isinstance(n, exp.Column | exp.Case | exp.Func | exp.Binary | exp.Paren):
                try:
                    resolved = self.row_level(n, where) if not n.find(*AGGREGATES) else None
                except (SchemaError, UnsupportedQueryError):
                    resolved = None
                if resolved is not None and resolved.sql("duckdb") in keys:
                    return key_ref(keys[resolved.sql("duckdb")])
            return n

        # transform is top-down and does not descend into a node it replaced.
        rewritten = node.transform(swap)
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
                position = int(target.this)
                if not 1 <= position <= len(outputs):
                    raise UnsupportedQueryError(f"ORDER BY position {position} is out of range")
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


_NAMES = {"variancepop": "var_pop", "stddevsamp": "stddev_samp", "stddevpop": "stddev_pop"}


def _output_name(node: exp.Expression, index: int) -> str:
    if isinstance(node, exp.Column):
        return node.name
    if isinstance(node, AGGREGATES):
        return _NAMES.get(node.key, node.key.lower())
    return f"col{index}"


def _case_literals(expr: exp.Expression) -> tuple[PublicValue, ...] | None:
    """The values of a CASE whose every branch is a literal (the keys the query writes)."""
    if not isinstance(expr, exp.Case):
        return None
    branches = [b.args.get("true") for b in expr.args.get("ifs") or []]
    default = expr.args.get("default")
    values: list[PublicValue] = []
    for branch in [*branches, default]:
        if branch is None or isinstance(branch, exp.Null):
            value: PublicValue = None
        elif isinstance(branch, exp.Literal):
            value = branch.this if branch.is_string else _number(str(branch.this))
        elif isinstance(branch, exp.Boolean):
            value = bool(branch.this)
        else:
            return None
        if value not in values:
            values.append(value)
    return tuple(values)


def _number(text: str) -> int | float:
    value = Fraction(text)
    return int(value) if value.denominator == 1 else float(value)


def _cell(
    where: exp.Expression | None, spec: TableSpec, columns: Mapping[str, str]
) -> tuple[str, str | Fraction | bool] | None:
    """The partition cell a WHERE pins, read from the AST: a top-level conjunct
    ``column = literal`` on a constant-per-unit column, with the literal of the column's own
    kind (a string for text, a number for numbers), so that equal values are one cell."""
    if where is None or not spec.constant_per_unit:
        return None
    conjuncts = list(where.flatten()) if isinstance(where, exp.And) else [where]
    for conjunct in conjuncts:
        if not isinstance(conjunct, exp.EQ):
            continue
        for column, literal in (
            (conjunct.this, conjunct.expression),
            (conjunct.expression, conjunct.this),
        ):
            if not (isinstance(column, exp.Column) and column.name in spec.constant_per_unit):
                continue
            ctype = columns[column.name].lower()
            if isinstance(literal, exp.Literal) and literal.is_string and ctype == "varchar":
                return (column.name, str(literal.this))
            if isinstance(literal, exp.Literal) and not literal.is_string and ctype in _NUMERIC:
                return (column.name, Fraction(str(literal.this)))
            if isinstance(literal, exp.Boolean) and ctype == "boolean":
                return (column.name, bool(literal.this))
    return None


def _limit(select: exp.Select, name: str) -> int | None:
    clause = select.args.get(name)
    if clause is None:
        return None
    value = clause.expression
    if not (isinstance(value, exp.Literal) and not value.is_string and str(value.this).isdigit()):
        raise UnsupportedQueryError(f"{name.upper()} must be a non-negative integer literal")
    return int(value.this)


def analyze(select: exp.Select, policy: Policy, catalog: Catalog) -> Analysis:
    """Analyze a validated, parameter-bound SELECT. Raises a ``QueryError`` subclass."""
    analyzer = _Analyzer(select, policy, catalog)
    where = select.args.get("where")
    where_expr = analyzer.row_level(where.this, "WHERE") if where is not None else None
    analyzer.group_keys()
    outputs = analyzer.outputs()
    having = analyzer.having(outputs)
    order = analyzer.order(outputs)
    if not analyzer.aggregates:
        raise UnsupportedQueryError("a query must compute at least one aggregate")
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
        cell=_cell(where_expr, analyzer.spec, analyzer.columns),
    )
