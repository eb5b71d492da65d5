"""What every part of the lowering shares: the lowered expression (``Lowered``: a Spark tree and
its DuckDB type), the context it is lowered in (``Context``, the ``Source`` relations in FROM),
what a handler may ask of the lowering (``Lowering``) and the handlers' signatures (``Handler``,
``FunctionHandler``, the values of ``handlers``' tables), the rules of TRY (``strict``,
``absorbing``) and of aggregate arguments (``aggregate_context``), the small builders of Spark
trees (``col``, ``fn``, ``cast_to``, ``try_cast_to``, ``case_when``, ...) and the types of number
literals.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from typing import Protocol

from sqlglot import exp

from dpsql.engine.spark.dialect import refuse
from dpsql.engine.spark.types import INT_RANGE, is_int, spark_type

# -- lowered expressions ------------------------------------------------------------------------


@dataclass(frozen=True)
class Lowered:
    """A lowered expression: its Spark tree and DuckDB type. ``fails``: inside TRY, it may be a
    NULL standing in for an error DuckDB raises, which only a strict path may carry to the TRY
    (where DuckDB's error makes the whole TRY NULL)."""

    node: exp.Expression
    type: str
    fails: bool = False
    bits: int | None = None  # an integer within ±2^bits on any data, when known


def max_bits(*args: Lowered) -> int | None:
    """The magnitude bound of one of several values (CASE branches, LEAST, ...); a NULL has
    none to add."""
    known = [a.bits for a in args if a.type != "NULL"]
    if any(b is None for b in known):
        return None
    return max(b for b in known if b is not None) if known else 0


@dataclass
class Source:
    """A relation in FROM: its alias and columns (name -> type, in order); ``star``: whether
    ``*`` lists it (the right side of a SEMI or ANTI join is only visible in ON)."""

    alias: str
    columns: dict[str, str]
    star: bool = True


@dataclass(frozen=True)
class Context:
    sources: tuple[Source, ...]
    ctes: Mapping[str, dict[str, str]]
    in_try: bool = False
    aggregates: bool = False  # aggregate functions allowed here (SELECT list, HAVING)
    windows: bool = False  # window functions allowed here (SELECT list)
    generators: bool = False  # UNNEST allowed here (SELECT list)
    qualified: bool = False  # qualify column references (more than one source)


def aggregate_context(ctx: Context, what: str) -> Context:
    """The context of the arguments of the aggregate ``what``, refused where ``ctx`` allows no
    aggregate: inside them no aggregate, window or UNNEST, and no TRY (an aggregate is not a
    row-level expression)."""
    if not ctx.aggregates:
        raise refuse(f"the aggregate {what} here")
    return replace(ctx, aggregates=False, windows=False, generators=False, in_try=False)


def strict(what: str, *args: Lowered) -> bool:
    """Whether a NULL standing for an error reaches the result through ``what``, which is NULL
    whenever one of ``args`` is: then it still makes the TRY NULL."""
    return any(a.fails for a in args)


def absorbing(what: str, *args: Lowered) -> None:
    """``what`` can turn a NULL argument into a value (COALESCE, OR, LEAST, IS NULL ...): an
    error DuckDB raises there makes the whole TRY NULL, a Spark try_* makes only that argument
    NULL, and the results would differ."""
    if any(a.fails for a in args):
        raise refuse(f"{what} over arithmetic that may overflow inside a row-level expression")


# -- handlers -----------------------------------------------------------------------------------


class Lowering(Protocol):
    """What a handler asks of the lowering that calls it (``lowerer.Lowerer``): to lower an
    operand, a condition or a subquery. Handlers see only this, so they need not import the
    lowerer, which reads their table."""

    def expr(self, node: exp.Expression, ctx: Context) -> Lowered: ...

    def boolean(self, node: exp.Expression, ctx: Context, where: str) -> Lowered: ...

    def query(
        self, node: exp.Expression, ctes: Mapping[str, dict[str, str]]
    ) -> tuple[exp.Expression, dict[str, str]]: ...


# The lowering of one kind of node (``handlers.HANDLERS``), and of one function sqlglot parses
# as an anonymous call (``handlers.FUNCTIONS``, by name).
Handler = Callable[[Lowering, exp.Expression, Context], Lowered]
FunctionHandler = Callable[[Lowering, exp.Anonymous, Context], Lowered]


# -- Spark trees --------------------------------------------------------------------------------


_SIMPLE_NAME = re.compile(r"_[a-z0-9_]*")


def ident(name: str) -> exp.Identifier:
    # Names dpsql generates (_u, _k0, ...) are printed bare; anything else is quoted.
    return exp.Identifier(this=name, quoted=not _SIMPLE_NAME.fullmatch(name))


def col(name: str, table: str | None = None) -> exp.Column:
    return exp.Column(this=ident(name), table=ident(table) if table else None)


def fn(name: str, *args: exp.Expression) -> exp.Expression:
    return exp.Anonymous(this=name, expressions=list(args))


_ATOMIC: tuple[type, ...] = (
    exp.Column, exp.Literal, exp.Null, exp.Boolean, exp.Paren, exp.Func, exp.Cast,
    exp.Placeholder, exp.Case, exp.Window, exp.Identifier,
)  # fmt: skip


def operand(node: exp.Expression) -> exp.Expression:
    """``node`` as an operand: parenthesized unless it is atomic (sqlglot prints the tree as
    built, without precedence)."""
    return node if isinstance(node, _ATOMIC) else exp.Paren(this=node)


def cast_to(node: exp.Expression, t: str) -> exp.Expression:
    return exp.Cast(this=node, to=spark_type(t))


def try_cast_to(node: exp.Expression, t: str) -> exp.Expression:
    # safe=True: sqlglot prints a TryCast without it as a plain CAST on Spark (which raises).
    return exp.TryCast(this=node, to=spark_type(t), safe=True)


def double_literal(text: str) -> exp.Expression:
    return exp.Cast(this=exp.Literal.string(text), to=exp.DataType.build("DOUBLE"))


INF, NINF, NAN = "Infinity", "-Infinity", "NaN"


def case_when(
    *whens: tuple[exp.Expression, exp.Expression], default: exp.Expression | None = None
) -> exp.Case:
    node = exp.Case(ifs=[exp.If(this=c, true=v) for c, v in whens])
    if default is not None:
        node.set("default", default)
    return node


def is_null(node: exp.Expression) -> exp.Expression:
    return exp.Is(this=operand(node), expression=exp.Null())


def literal_value(node: exp.Expression) -> Decimal | None:
    """The value of a numeric literal (possibly negated or parenthesized), else None."""
    sign = 1
    while isinstance(node, exp.Paren | exp.Neg):
        if isinstance(node, exp.Neg):
            sign = -sign
        node = node.this
    if isinstance(node, exp.Literal) and not node.is_string:
        try:
            return sign * Decimal(str(node.this))
        except InvalidOperation:
            return None
    return None


def literal_type(value: Decimal, text: str) -> str:
    """DuckDB's type of a number literal: the smallest integer type holding it, DOUBLE with an
    exponent, DECIMAL otherwise."""
    if "e" in text.lower():
        return "DOUBLE"
    if value == value.to_integral_value() and "." not in text:
        for name in ("INTEGER", "BIGINT", "HUGEINT"):
            lo, hi = INT_RANGE[name]
            if lo <= value <= hi:
                return name
        return "DOUBLE"
    digits = text.lstrip("-").lstrip("0")
    whole, _, frac = digits.partition(".")
    return f"DECIMAL({max(len(whole) + len(frac), 1)},{len(frac)})"


def int_bits(value: Decimal, t: str) -> int | None:
    return int(abs(value)).bit_length() if is_int(t) else None


def small_literal_type(value: Decimal) -> str:
    """The integer type DuckDB gives an integer literal next to a narrower integer: the
    smallest that holds it (``smallint_col + 1`` is SMALLINT on DuckDB)."""
    for name in ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT"):
        lo, hi = INT_RANGE[name]
        if lo <= value <= hi:
            return name
    return "HUGEINT"
