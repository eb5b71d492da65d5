"""The sqlglot nodes the bounded query is made of, built from names, trees and public numbers.

Every step of the bounded query (``dpsql.bound.rewrite``) builds its CTE with these, never from
SQL text. Each builds the tree DuckDB's parser gives for the same SQL (functions through the
dialect's own builders, ``func``), so the text generated from it once (``Plan.engine_sql``),
which the engine runs and Spark's lowering (``dpsql.engine.spark.lower``) parses, reads back as
the tree that was built. A sqlglot node has one parent: a name read twice is built twice, and a
tree placed twice is copied.

>>> clamp(column("_x0"), number(0), number(10)).sql("duckdb")
'LEAST(GREATEST(_x0, 0), 10)'
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from functools import cache, lru_cache, partial
from typing import TypeVar

import sqlglot
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.expressions import DType

from dpsql.bound.specs import SALT_PARAMETER
from dpsql.errors import UnsupportedQueryError
from dpsql.sql.parse import DIALECT

Node = exp.Expression
Type = DType  # the engine types a cast names: Type.BIGINT, Type.INT128, Type.DOUBLE
Q = TypeVar("Q", bound=exp.Query)


def column(name: str, table: str | None = None) -> exp.Column:
    """A name the bounded query makes (``_u``, ``_k0``, ``_x1``...), of ``table`` if given."""
    of = exp.Identifier(this=table, quoted=False) if table is not None else None
    return exp.Column(this=exp.Identifier(this=name, quoted=False), table=of)


def columns(names: Iterable[str], table: str | None = None) -> list[exp.Expression]:
    return [column(name, table) for name in names]


def quoted(name: str, table: str | None = None) -> exp.Column:
    """A name of the policy's schema (a table's column), quoted: it may be any identifier."""
    return exp.column(name, table, quoted=True)


def star(table: str | None = None) -> exp.Expression:
    """``*``, or ``table.*``."""
    if table is None:
        return exp.Star()
    return exp.Column(this=exp.Star(), table=exp.to_identifier(table))


def number(value: int) -> exp.Expression:
    """An integer literal (a negative one as the parser reads it: minus a literal)."""
    return exp.Literal.number(value)


def cast(node: Node, to: DType) -> exp.Cast:
    return exp.Cast(this=node, to=exp.DataType(this=to))


def hugeint(node: Node) -> exp.Cast:
    """Exact integer arithmetic in 128 bits (DuckDB's HUGEINT; Spark lowers it)."""
    return cast(node, Type.INT128)


def engine_type(name: str) -> exp.DataType:
    """A type as the engine names it (a key's ``engine_type``: ``VARCHAR``, ``DECIMAL(9,2)``,
    or ``NULL``, the type of a CASE of NULLs), read once as the type of a CAST: some names are
    types only there (``DataType.build`` refuses ``NULL``)."""
    return _engine_type(name).copy()


@lru_cache(maxsize=256)
def _engine_type(name: str) -> exp.DataType:
    cast_ = fragment(f"CAST(NULL AS {name})")
    assert isinstance(cast_, exp.Cast)
    return cast_.to


def func(name: str, *args: Node) -> exp.Expression:
    """``name(args)`` as DuckDB's parser reads it (``isnan`` an ``exp.IsNan``, ``hash`` an
    anonymous function): what ``exp.func`` builds, with the dialect's builder looked up once."""
    build = _builder(name.upper())
    node = exp.Anonymous(this=name, expressions=list(args)) if build is None else build(list(args))
    assert isinstance(node, exp.Expression)
    return node


@cache
def _builder(name: str) -> Callable[[list[Node]], exp.Expr] | None:
    dialect = Dialect.get_or_raise(DIALECT)
    build: Callable[..., exp.Expr] | None = dialect.parser_class.FUNCTIONS.get(name)
    if build is not None and "dialect" in inspect.signature(build).parameters:
        return partial(build, dialect=dialect)
    return build


def alias(node: Node, name: str) -> exp.Alias:
    return exp.Alias(this=node, alias=exp.to_identifier(name))


def paren(node: Node) -> exp.Paren:
    return exp.Paren(this=node)


def is_null(node: Node) -> exp.Is:
    return exp.Is(this=node, expression=exp.Null())


def not_null(node: Node) -> exp.Not:
    return exp.Not(this=is_null(node))


def same(left: Node, right: Node) -> exp.NullSafeEQ:
    """``left IS NOT DISTINCT FROM right``: NULL matches NULL (a NULL unit is one unit)."""
    return exp.NullSafeEQ(this=left, expression=right)


def all_of(conditions: Sequence[Node]) -> Node:
    """``a AND b AND c``, grouped from the left as the parser groups it."""
    out = conditions[0]
    for condition in conditions[1:]:
        out = exp.And(this=out, expression=condition)
    return out


def any_of(conditions: Sequence[Node]) -> Node:
    out = conditions[0]
    for condition in conditions[1:]:
        out = exp.Or(this=out, expression=condition)
    return out


def when(*branches: tuple[Node, Node], otherwise: Node | None = None) -> exp.Case:
    """``CASE WHEN test THEN value ... [ELSE otherwise] END``."""
    ifs = [exp.If(this=test, true=value) for test, value in branches]
    return exp.Case(ifs=ifs, default=otherwise)


def least(left: Node, right: Node) -> exp.Least:
    return exp.Least(this=left, expressions=[right], ignore_nulls=True)


def greatest(left: Node, right: Node) -> exp.Greatest:
    return exp.Greatest(this=left, expressions=[right], ignore_nulls=True)


def clamp(node: Node, low: Node, high: Node) -> exp.Least:
    """``LEAST(GREATEST(node, low), high)``; DuckDB's GREATEST skips NULL, so a caller keeps
    NULL apart where it must stay NULL."""
    return least(greatest(node, low), high)


def salt() -> exp.Cast:
    """The secret salt, a parameter the engine binds: the plan, EXPLAIN and the bounded SQL
    never hold it (DESIGN.md section 3, step 4)."""
    return cast(exp.Placeholder(this=SALT_PARAMETER), Type.BIGINT)


def salted_hash(*nodes: Node) -> exp.Expression:
    """The keyed hash ``hash(nodes, salt)`` that ranks a unit's groups and rows."""
    return func("hash", *nodes, salt())


def table(name: str, as_: str | None = None, quote: bool = False) -> exp.Table:
    alias_ = exp.TableAlias(this=exp.to_identifier(as_)) if as_ is not None else None
    return exp.Table(this=exp.to_identifier(name, quoted=quote), alias=alias_)


def subquery(query: Node, as_: str | None = None) -> exp.Subquery:
    alias_ = exp.TableAlias(this=exp.to_identifier(as_)) if as_ is not None else None
    return exp.Subquery(this=query, alias=alias_)


def values(rows: Sequence[Sequence[Node]], as_: str, names: Sequence[str]) -> exp.Values:
    """``(VALUES (..), ..) AS as_(names)``."""
    return exp.Values(
        expressions=[exp.Tuple(expressions=list(row)) for row in rows],
        alias=exp.TableAlias(
            this=exp.to_identifier(as_), columns=[exp.to_identifier(n) for n in names]
        ),
    )


def join(this: Node, kind: str | None = None, side: str | None = None,
         on: Node | None = None) -> exp.Join:  # fmt: skip
    """A join clause: ``kind`` ANTI, SEMI or CROSS; ``side`` LEFT."""
    return exp.Join(this=this, kind=kind, side=side, on=on)


def select(
    projections: Sequence[Node],
    source: Node,
    *,
    joins: Sequence[exp.Join] = (),
    where: Node | None = None,
    group: Sequence[Node] = (),
    having: Node | None = None,
    qualify: Node | None = None,
) -> exp.Select:
    """``SELECT projections FROM source joins WHERE .. GROUP BY .. HAVING .. QUALIFY ..``."""
    return exp.Select(
        expressions=list(projections),
        from_=exp.From(this=source),
        joins=list(joins) or None,
        where=exp.Where(this=where) if where is not None else None,
        group=exp.Group(expressions=list(group)) if group else None,
        having=exp.Having(this=having) if having is not None else None,
        qualify=exp.Qualify(this=qualify) if qualify is not None else None,
    )


def union_all(first: Node, second: Node) -> exp.Union:
    return exp.Union(this=first, expression=second, distinct=False)


def cte(name: str, query: Node) -> exp.CTE:
    return exp.CTE(this=query, alias=exp.TableAlias(this=exp.to_identifier(name)))


def with_ctes(query: Q, ctes: Sequence[exp.CTE]) -> Q:
    """``WITH ctes query``."""
    if ctes:
        query.set("with_", exp.With(expressions=list(ctes)))
    return query


def window(
    function: Node,
    partition: Sequence[Node],
    order: Sequence[Node],
    spec: exp.WindowSpec | None = None,
) -> exp.Window:
    """``function OVER (PARTITION BY .. ORDER BY .. spec)``."""
    ordered = [exp.Ordered(this=o, nulls_first=False) for o in order]
    return exp.Window(
        this=function,
        partition_by=list(partition),
        order=exp.Order(expressions=ordered),
        spec=spec,
        over="OVER",
    )


def first_rows(partition: Sequence[Node], order: Sequence[Node], limit: int) -> exp.LTE:
    """``ROW_NUMBER() OVER (PARTITION BY .. ORDER BY ..) <= limit``: a QUALIFY keeping the first
    ``limit`` rows of each partition."""
    return exp.LTE(this=window(exp.RowNumber(), partition, order), expression=number(limit))


def fragment(text: str, into: type[exp.Expression] | None = None) -> exp.Expression:
    """SQL an earlier stage gives as text (the relation of a join or subquery, a public table's
    domain, a cell's normal form, a sample's filter: ``dpsql.analyze``), read once; as an
    ``into`` clause if given."""
    try:
        parsed = sqlglot.parse_one(text, read=DIALECT, into=into)
    except RecursionError:
        raise UnsupportedQueryError("the query is nested too deeply") from None
    assert isinstance(parsed, exp.Expression)
    return parsed


__all__ = [
    "Node",
    "Type",
    "alias",
    "all_of",
    "any_of",
    "cast",
    "clamp",
    "column",
    "columns",
    "cte",
    "engine_type",
    "first_rows",
    "fragment",
    "func",
    "greatest",
    "hugeint",
    "is_null",
    "join",
    "least",
    "not_null",
    "number",
    "paren",
    "quoted",
    "salt",
    "salted_hash",
    "same",
    "select",
    "star",
    "subquery",
    "table",
    "union_all",
    "values",
    "when",
    "window",
    "with_ctes",
]
