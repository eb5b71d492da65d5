"""What the analysis of a query holds: the :class:`Analysis` the planner reads, and its parts
(the aggregates, the group keys and the outputs).

All of it is frozen data about the query, the policy and the catalog, nothing about the data.
Outputs, HAVING and ORDER BY refer to released values only, through the references made here:
``_a{i}`` for each aggregate call (``aggregate_ref``) and ``_k{j}`` for each group key
(``key_ref``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from sqlglot import exp

from dpsql.analyze.cells import Cell
from dpsql.analyze.intervals import Interval
from dpsql.policy import PublicValue, TableSpec
from dpsql.sql.aggregates import AggregateKind


@dataclass(frozen=True)
class Aggregate:
    """One aggregate call of the query (deduplicated by kind and argument); its kind names the
    SQL function it was read from (``dpsql.sql.aggregates``) and its rule in planning
    (``dpsql.plan.aggregates.registry``)."""

    kind: AggregateKind
    arg: exp.Expression | None  # row-level argument, columns unqualified
    bounds: Interval | None  # finite range of the argument, for SUM, AVG, spreads, quantiles
    p: Fraction | None = None  # the quantile's order, in [0, 1]
    # The other argument of F(y, x) (COVAR_POP, CORR, REGR_SLOPE...): ``arg`` is x, the
    # second argument written, ``arg2`` y, the first; ``bounds2`` y's finite range.
    arg2: exp.Expression | None = None
    bounds2: Interval | None = None

    @property
    def signature(self) -> str:
        arg = self.arg.sql("duckdb") if self.arg is not None else ""
        if self.arg2 is not None:
            arg = f"{self.arg2.sql('duckdb')}, {arg}"
        return f"{self.kind}:{arg}:{self.p}"


@dataclass(frozen=True)
class GroupKey:
    """A GROUP BY key: a row-level expression and, if public, its domain of values."""

    expr: exp.Expression
    name: str
    domain: tuple[PublicValue, ...] | None = None  # declared or written in the query
    domain_table: tuple[str, str] | None = None  # (public table, column) holding the domain
    # The key's type as the engine types the key expression. Once set (by the session, before
    # the charge), ``domain`` holds the engine's text of each distinct value of that type
    # (``dpsql.analyze.domains``): a set as the engine compares keys.
    engine_type: str | None = None
    # With ``dpsql.other_group``: rows whose key is outside ``domain`` keep one more group,
    # keyed ``other_text`` (the engine's text of the label in the key's type; None: NULL),
    # checked before the charge not to be a value of the domain (``dpsql.session.probes``).
    other: bool = False
    other_text: str | None = None

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
    # (column, literal SQL) when WHERE requires a constant-per-unit column to equal a literal;
    # the session has the engine key it (``dpsql.analyze.cells``) into ``cell``, which the bounded
    # query then enforces: the query touches only the units of that cell.
    cell_predicate: tuple[str, str] | None = None
    cell: Cell | None = None
    # The relation the rows come from: the table itself, or the SQL of a join or subquery.
    source: str = ""
    base: bool = True
    tables: tuple[str, ...] = ()
    # Finite bounds of the relation's columns (declared, or derived by interval arithmetic).
    bounds: Mapping[str, tuple[Fraction, Fraction]] = field(default_factory=dict)
    # Rows per unit the relation holds at most by construction (1 after GROUP BY the unit).
    unit_rows: int | None = None
    # Under a person-within-period unit (``dpsql.policy.periods``): the column of each row's
    # period, which the bounded query pairs with ``unit`` to make the unit; None otherwise.
    period: str | None = None

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
