"""Lowering of dpsql's bounded query (DuckDB SQL) to Spark SQL with the same totals.

The bounded query (``dpsql.sql.rewrite``) is written for DuckDB. ``lower`` rewrites its tree,
node by node from an allow-list, into Spark SQL that returns the same pre-noise totals, with the
guarantees the privacy argument rests on (docs/engines.md):

- exact integer sums: HUGEINT arithmetic becomes DECIMAL(38, 0), never a float; an integer SUM
  sums DECIMAL(38, 0) (Spark's SUM of BIGINT overflows at 2^63); ``//`` is computed exactly in
  decimals (Spark's ``div`` on decimals returns a BIGINT that wraps silently);
- no construct Spark lacks: ``SELECT *`` (with EXCLUDE) becomes explicit columns, QUALIFY a
  subquery, ANTI/SEMI JOIN ``LEFT ANTI``/``LEFT SEMI``, ``IS NOT DISTINCT FROM`` ``<=>``, VALUES
  an inline table of one type per column, HISTOGRAM a count per value collected into a map;
- the keyed hash: DuckDB's ``hash(..., CAST($salt AS BIGINT))`` becomes ``xxhash64`` of the same
  arguments, and every window it orders gets the hash's arguments as tie-breakers, so the order
  is total: a recomputed stage cannot keep other rows (the engines pick different rows when a
  cap binds, each by its own 64-bit keyed hash);
- totality: inside DuckDB's ``TRY(...)`` every operation that could raise on Spark is made
  non-raising (``try_add``, ``try_cast``, ...), and only where its NULL reaches the ``TRY`` the
  way DuckDB's error would (an error under COALESCE, OR, LEAST ... is refused); outside TRY no
  cast can raise on any data (the bounded query clamps before it casts; others are refused);
- determinism: no non-deterministic function in the output (checked on the result), collected
  lists are sorted, floating sums are summed in sorted order;
- NULL ordering and the other points where Spark differs from DuckDB (NULL-skipping LEAST,
  ROUND, ISNAN of NULL, date_trunc's result type, list_slice with a step, ...) are spelled out.

Anything else raises ``NotSupportedOnEngineError`` naming the construct. ``lower`` is a pure
function of its inputs, kept in a small cache keyed by the text and the catalog.
"""

from __future__ import annotations

import datetime as dt
import functools
import itertools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation

import sqlglot
from sqlglot import exp
from sqlglot.dialects.spark import Spark
from sqlglot.generator import Generator

from dpsql.engine.spark_shape import reshape
from dpsql.errors import NotSupportedOnEngineError
from dpsql.sql.bounding import SALT_PARAMETER
from dpsql.sql.validate import describe

__all__ = ["lower"]


def _ordered_sql(generator: Generator, node: exp.Ordered) -> str:
    # Spark sorts NULLs first ascending, DuckDB last: every order states where NULLs go.
    direction = "DESC" if node.args.get("desc") else "ASC"
    nulls = "FIRST" if node.args.get("nulls_first") else "LAST"
    return f"{generator.sql(node, 'this')} {direction} NULLS {nulls}"


class _SparkOut(Spark):
    """Spark SQL as the lowering prints it: null-safe equality as ``<=>``, every TRY_CAST as
    TRY_CAST and every sort order with its NULLs spelled out."""

    class Generator(Spark.Generator):  # type: ignore[misc, valid-type]
        TRANSFORMS = {  # noqa: RUF012 - sqlglot's own class attribute, extended
            **Spark.Generator.TRANSFORMS,
            exp.NullSafeEQ: lambda self, e: self.binary(e, "<=>"),
            # Always TRY_CAST: a TRY_CAST printed as CAST would raise where DuckDB's gives NULL.
            exp.TryCast: lambda self, e: self.cast_sql(e, safe_prefix="TRY_"),
            exp.Ordered: _ordered_sql,
        }


def _refuse(what: str) -> NotSupportedOnEngineError:
    return NotSupportedOnEngineError(f"{what} is not supported on Spark")


# -- types -------------------------------------------------------------------------------------
# The DuckDB type of every lowered expression, as DuckDB names it: what DuckDB computes decides
# how the Spark expression must compute. "NULL" is an untyped NULL, "PARAM" the salt parameter,
# "HASH" a keyed hash, "LIST(T)" and "MAP(K,V)" the quantile machinery's, "?T" a type the
# lowering only passes through (it refuses to compute on it).

_INT_RANK = {"TINYINT": 1, "SMALLINT": 2, "INTEGER": 3, "BIGINT": 4, "HUGEINT": 5}
_INT_BY_RANK = {rank: name for name, rank in _INT_RANK.items()}
_INT_RANGE = {
    "TINYINT": (-(2**7), 2**7 - 1),
    "SMALLINT": (-(2**15), 2**15 - 1),
    "INTEGER": (-(2**31), 2**31 - 1),
    "BIGINT": (-(2**63), 2**63 - 1),
    "HUGEINT": (-(2**127), 2**127 - 1),
}
_FLOATS = ("FLOAT", "DOUBLE")
_SPARK_NAMES = {
    "BOOLEAN": "BOOLEAN",
    "TINYINT": "TINYINT",
    "SMALLINT": "SMALLINT",
    "INTEGER": "INT",
    "BIGINT": "BIGINT",
    "HUGEINT": "DECIMAL(38, 0)",  # no 128-bit integer on Spark: exact 38-digit decimals
    "FLOAT": "FLOAT",
    "DOUBLE": "DOUBLE",
    "VARCHAR": "STRING",
    "DATE": "DATE",
    "TIMESTAMP": "TIMESTAMP_NTZ",  # DuckDB's TIMESTAMP has no time zone, like TIMESTAMP_NTZ
}
_TYPE_ALIASES = {
    "INT1": "TINYINT",
    "INT2": "SMALLINT",
    "SHORT": "SMALLINT",
    "INT": "INTEGER",
    "INT4": "INTEGER",
    "SIGNED": "INTEGER",
    "INT8": "BIGINT",
    "LONG": "BIGINT",
    "INT128": "HUGEINT",
    "REAL": "FLOAT",
    "FLOAT4": "FLOAT",
    "FLOAT8": "DOUBLE",
    "TEXT": "VARCHAR",
    "STRING": "VARCHAR",
    "CHAR": "VARCHAR",
    "BPCHAR": "VARCHAR",
    "BOOL": "BOOLEAN",
    "LOGICAL": "BOOLEAN",
    "DATETIME": "TIMESTAMP",
    "TIMESTAMP WITHOUT TIME ZONE": "TIMESTAMP",
}
_DECIMAL = re.compile(r"^(?:DECIMAL|NUMERIC)\s*\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\)$")


def _norm_type(text: str) -> str:
    """A DuckDB type name in the lowering's spelling; "?NAME" for one it does not compute on."""
    name = " ".join(text.strip().upper().split())
    if name.startswith("VARCHAR("):
        return "VARCHAR"
    if name in ("DECIMAL", "NUMERIC"):
        return "DECIMAL(18,3)"  # DuckDB's default precision and scale
    match = _DECIMAL.match(name)
    if match:
        p, s = int(match.group(1)), int(match.group(2) or 0)
        return f"DECIMAL({p},{s})"
    name = _TYPE_ALIASES.get(name, name)
    return name if name in _SPARK_NAMES else f"?{name}"


def _is_int(t: str) -> bool:
    return t in _INT_RANK


def _is_float(t: str) -> bool:
    return t in _FLOATS


def _is_decimal(t: str) -> bool:
    return t.startswith("DECIMAL(")


def _is_num(t: str) -> bool:
    return _is_int(t) or _is_float(t) or _is_decimal(t)


def _elem(t: str) -> str:
    if not t.startswith("LIST(") or not t.endswith(")"):
        raise _refuse(f"a list operation on {t}")
    return t[5:-1]


def _spark_type(t: str) -> exp.DataType:
    if _is_decimal(t):
        return exp.DataType.build(t, dialect="spark")
    if t not in _SPARK_NAMES:
        raise _refuse(f"the type {t.lstrip('?')}")
    return exp.DataType.build(_SPARK_NAMES[t], dialect="spark")


def _unify(types: Sequence[str], what: str) -> str:
    """The type DuckDB gives a CASE, COALESCE, LEAST, VALUES column or comparison of these
    types; mixed kinds (text with numbers, dates with timestamps) are refused: DuckDB and Spark
    convert them by different rules."""
    known = [t for t in types if t != "NULL"]
    if not known:
        return "NULL"
    if all(t == known[0] for t in known):
        return known[0]
    if all(_is_int(t) for t in known):
        return _INT_BY_RANK[max(_INT_RANK[t] for t in known)]
    if all(_is_num(t) for t in known):
        if "DOUBLE" in known or ("FLOAT" in known and any(_is_decimal(t) for t in known)):
            return "DOUBLE"
        if "FLOAT" in known:  # a FLOAT with integers stays FLOAT on both engines
            return "FLOAT"
        scale = max(int(t[:-1].split(",")[1]) if _is_decimal(t) else 0 for t in known)
        return f"DECIMAL(38,{scale})"
    raise _refuse(f"{what} over values of types {', '.join(sorted(set(known)))}")


def _kind(t: str) -> str:
    """The class of values a comparison may mix: numbers with numbers, text with text, ..."""
    if _is_num(t):
        return "number"
    return t


# -- lowered expressions ------------------------------------------------------------------------


@dataclass(frozen=True)
class _E:
    """A lowered expression: its Spark tree and DuckDB type. ``fails``: inside TRY, it may be a
    NULL standing in for an error DuckDB raises, which only a strict path may carry to the TRY
    (where DuckDB's error makes the whole TRY NULL)."""

    node: exp.Expression
    type: str
    fails: bool = False
    bits: int | None = None  # an integer within ±2^bits on any data, when known


# The integer magnitude each type holds (±2^bits at most) and the largest that cannot overflow
# it on Spark (DECIMAL(38, 0) holds less than DuckDB's HUGEINT: below 10^38).
_TYPE_BITS = {"TINYINT": 7, "SMALLINT": 15, "INTEGER": 31, "BIGINT": 63, "HUGEINT": 127}
_CAPACITY = {"TINYINT": 6, "SMALLINT": 14, "INTEGER": 30, "BIGINT": 62, "HUGEINT": 126}


def _bits(*args: _E) -> int | None:
    """The magnitude bound of one of several values (CASE branches, LEAST, ...); a NULL has
    none to add."""
    known = [a.bits for a in args if a.type != "NULL"]
    if any(b is None for b in known):
        return None
    return max(b for b in known if b is not None) if known else 0


@dataclass
class _Source:
    """A relation in FROM: its alias and columns (name -> type, in order); ``star``: whether
    ``*`` lists it (the right side of a SEMI or ANTI join is only visible in ON)."""

    alias: str
    columns: dict[str, str]
    star: bool = True


@dataclass(frozen=True)
class _Ctx:
    sources: tuple[_Source, ...]
    ctes: Mapping[str, dict[str, str]]
    in_try: bool = False
    aggregates: bool = False  # aggregate functions allowed here (SELECT list, HAVING)
    windows: bool = False  # window functions allowed here (SELECT list)
    generators: bool = False  # UNNEST allowed here (SELECT list)
    qualified: bool = False  # qualify column references (more than one source)


_SIMPLE_NAME = re.compile(r"_[a-z0-9_]*")


def _ident(name: str) -> exp.Identifier:
    # Names dpsql generates (_u, _k0, ...) are printed bare; anything else is quoted.
    return exp.Identifier(this=name, quoted=not _SIMPLE_NAME.fullmatch(name))


def _col(name: str, table: str | None = None) -> exp.Column:
    return exp.Column(this=_ident(name), table=_ident(table) if table else None)


def _fn(name: str, *args: exp.Expression) -> exp.Expression:
    return exp.Anonymous(this=name, expressions=list(args))


_ATOMIC: tuple[type, ...] = (
    exp.Column, exp.Literal, exp.Null, exp.Boolean, exp.Paren, exp.Func, exp.Cast,
    exp.Placeholder, exp.Case, exp.Window, exp.Identifier,
)  # fmt: skip


def _p(node: exp.Expression) -> exp.Expression:
    """``node`` as an operand: parenthesized unless it is atomic (sqlglot prints the tree as
    built, without precedence)."""
    return node if isinstance(node, _ATOMIC) else exp.Paren(this=node)


def _cast(node: exp.Expression, t: str) -> exp.Expression:
    return exp.Cast(this=node, to=_spark_type(t))


def _try_cast(node: exp.Expression, t: str) -> exp.Expression:
    # safe=True: sqlglot prints a TryCast without it as a plain CAST on Spark (which raises).
    return exp.TryCast(this=node, to=_spark_type(t), safe=True)


def _double(text: str) -> exp.Expression:
    return exp.Cast(this=exp.Literal.string(text), to=exp.DataType.build("DOUBLE"))


_INF, _NINF, _NAN = "Infinity", "-Infinity", "NaN"


def _case(
    *whens: tuple[exp.Expression, exp.Expression], default: exp.Expression | None = None
) -> exp.Case:
    node = exp.Case(ifs=[exp.If(this=c, true=v) for c, v in whens])
    if default is not None:
        node.set("default", default)
    return node


def _is_null(node: exp.Expression) -> exp.Expression:
    return exp.Is(this=_p(node), expression=exp.Null())


def _number(node: exp.Expression) -> Decimal | None:
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


def _literal_type(value: Decimal, text: str) -> str:
    """DuckDB's type of a number literal: the smallest integer type holding it, DOUBLE with an
    exponent, DECIMAL otherwise."""
    if "e" in text.lower():
        return "DOUBLE"
    if value == value.to_integral_value() and "." not in text:
        for name in ("INTEGER", "BIGINT", "HUGEINT"):
            lo, hi = _INT_RANGE[name]
            if lo <= value <= hi:
                return name
        return "DOUBLE"
    digits = text.lstrip("-").lstrip("0")
    whole, _, frac = digits.partition(".")
    return f"DECIMAL({max(len(whole) + len(frac), 1)},{len(frac)})"


def _int_bits(value: Decimal, t: str) -> int | None:
    return int(abs(value)).bit_length() if _is_int(t) else None


def _small_literal_type(value: Decimal) -> str:
    """The integer type DuckDB gives an integer literal next to a narrower integer: the
    smallest that holds it (``smallint_col + 1`` is SMALLINT on DuckDB)."""
    for name in ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT"):
        lo, hi = _INT_RANGE[name]
        if lo <= value <= hi:
            return name
    return "HUGEINT"


_DATE_TEXT = re.compile(r"\d{4}-\d{2}-\d{2}")
_INT_TEXT = re.compile(r"\s*[+-]?\d{1,40}\s*")
_DECIMAL_TEXT = re.compile(r"\s*[+-]?\d{1,38}(\.\d{1,38})?\s*")
_TIMESTAMP_TEXT = re.compile(r"\d{4}-\d{2}-\d{2}( \d{2}:\d{2}:\d{2}(\.\d{1,6})?)?")


# Functions whose result depends on more than their arguments: never in the output.
_NONDETERMINISTIC = frozenset(
    {"RAND", "RANDN", "RANDOM", "UUID", "SHUFFLE", "NOW", "CURRENT_DATE", "CURRENT_TIMESTAMP",
     "CURRENT_TIME", "CURRENT_TIMEZONE", "CURRENT_USER", "CURRENT_CATALOG", "CURRENT_DATABASE",
     "CURRENT_SCHEMA", "LOCALTIMESTAMP", "UNIX_TIMESTAMP", "MONOTONICALLY_INCREASING_ID",
     "SPARK_PARTITION_ID", "INPUT_FILE_NAME", "INPUT_FILE_BLOCK_START",
     "INPUT_FILE_BLOCK_LENGTH", "FIRST", "LAST", "FIRST_VALUE", "LAST_VALUE", "ANY_VALUE",
     "APPROX_COUNT_DISTINCT", "APPROX_PERCENTILE", "PERCENTILE_APPROX", "REFLECT",
     "JAVA_METHOD", "TRY_REFLECT", "UNIFORM", "RANDSTR", "SESSION_USER", "USER",
     "APPROX_DISTINCT", "APPROX_QUANTILE", "TABLESAMPLE"}
)  # fmt: skip
# Aggregates whose result lists rows in the order they arrive: only under a sort.
_UNORDERED = frozenset({"COLLECT_LIST", "COLLECT_SET", "ARRAY_AGG"})


# -- the lowering -------------------------------------------------------------------------------


class _Lowerer:
    """One lowering of one bounded query over one catalog."""

    def __init__(self, catalog: Mapping[str, Mapping[str, str]]):
        self.catalog = {
            t.lower(): {c.lower(): _norm_type(ty) for c, ty in cols.items()}
            for t, cols in catalog.items()
        }
        self._fresh = itertools.count()

    def fresh(self, stem: str) -> str:
        # dpsql reserves names starting with _dpsql from analysts' queries: no clash.
        return f"_dpsql_{stem}{next(self._fresh)}"

    # -- queries --------------------------------------------------------------------------------

    def query(
        self, node: exp.Expression, ctes: Mapping[str, dict[str, str]]
    ) -> tuple[exp.Expression, dict[str, str]]:
        """A query (SELECT, UNION ALL, parenthesized) and its output columns."""
        if isinstance(node, exp.Subquery) and node.alias == "":
            return self.query(node.this, ctes)
        with_ = node.args.get("with_")
        ctes = dict(ctes)
        lowered_ctes: list[exp.CTE] = []
        if with_ is not None:
            if with_.args.get("recursive"):
                raise _refuse("WITH RECURSIVE")
            for cte in with_.expressions:
                body, columns = self.query(cte.this, ctes)
                ctes[cte.alias.lower()] = columns
                lowered_ctes.append(
                    exp.CTE(this=body, alias=exp.TableAlias(this=_ident(cte.alias.lower())))
                )
        if isinstance(node, exp.Select):
            out, columns = self.select(node, ctes)
        elif isinstance(node, exp.Union) and not isinstance(node, exp.Intersect | exp.Except):
            out, columns = self.union(node, ctes)
        else:
            raise _refuse(describe(node))
        if lowered_ctes:
            out.set("with_", exp.With(expressions=lowered_ctes))
        return out, columns

    def union(
        self, node: exp.Union, ctes: Mapping[str, dict[str, str]]
    ) -> tuple[exp.Expression, dict[str, str]]:
        left, lcols = self.query(node.this, ctes)
        right, rcols = self.query(node.expression, ctes)
        if len(lcols) != len(rcols):
            raise _refuse("UNION of queries with different numbers of columns")
        columns: dict[str, str] = {}
        for (name, lt), rt in zip(lcols.items(), rcols.values(), strict=True):
            # Numbers widen alike on both engines (BIGINT with DECIMAL(38, 0) is DECIMAL(38,
            # 0)); other mixed kinds are refused by _unify.
            columns[name] = _unify([lt, rt], "UNION")
        distinct = bool(node.args.get("distinct"))
        return exp.Union(this=left, expression=right, distinct=distinct), columns

    def select(
        self, sel: exp.Select, ctes: Mapping[str, dict[str, str]]
    ) -> tuple[exp.Expression, dict[str, str]]:
        if any(
            isinstance(node, exp.Anonymous) and node.name.upper() == "HISTOGRAM"
            for item in sel.expressions
            for node in item.walk()
        ):
            sel = _histogram_rewrite(sel, self.fresh)
        for key in ("limit", "offset", "order", "prewhere", "windows", "laterals", "pivots"):
            if sel.args.get(key):
                # A LIMIT or ORDER BY does not occur in a bounded query; a LIMIT would keep an
                # arbitrary subset of the rows on Spark.
                raise _refuse(f"{key.upper()} in the bounded query")
        group = sel.args.get("group")
        if group is not None and any(
            group.args.get(k) for k in ("grouping_sets", "rollup", "cube")
        ):
            raise _refuse("GROUPING SETS, ROLLUP or CUBE")
        out = exp.Select()
        sources: list[_Source] = []
        frm = sel.args.get("from_")
        if frm is not None:
            node, source = self.source(frm.this, ctes)
            out.set("from_", exp.From(this=node))
            sources.append(source)
        joins = []
        for join in sel.args.get("joins") or []:
            joins.append(self.join(join, sources, ctes))
        if joins:
            out.set("joins", joins)
        ctx = _Ctx(tuple(sources), ctes, qualified=len(sources) > 1)
        where = sel.args.get("where")
        if where is not None:
            cond = self.boolean(where.this, ctx, "WHERE")
            out.set("where", exp.Where(this=cond.node))
        if group is not None:
            # DuckDB groups by a SELECT alias when FROM has no such column: its expression.
            aliases = {i.alias.lower(): i.this for i in sel.expressions if isinstance(i, exp.Alias)}
            keys = []
            for g in group.expressions:
                name = g.name.lower() if isinstance(g, exp.Column) and not g.table else ""
                aliased = name in aliases and not any(name in src.columns for src in sources)
                keys.append(self.expr(aliases[name] if aliased else g, ctx).node)
            out.set("group", exp.Group(expressions=keys))
        having = sel.args.get("having")
        agg_ctx = replace(ctx, aggregates=True)
        if having is not None:
            cond = self.boolean(having.this, agg_ctx, "HAVING")
            out.set("having", exp.Having(this=cond.node))
        items, columns = self.projections(sel, replace(agg_ctx, windows=True))
        if sel.args.get("distinct"):
            if sel.args["distinct"].args.get("on"):
                raise _refuse("DISTINCT ON")
            out.set("distinct", exp.Distinct())
        out.set("expressions", items)
        qualify = sel.args.get("qualify")
        if qualify is not None:
            if sel.args.get("distinct"):
                raise _refuse("QUALIFY with DISTINCT")
            return self.qualify(out, columns, qualify.this, agg_ctx)
        return out, columns

    def projections(
        self, sel: exp.Select, ctx: _Ctx
    ) -> tuple[list[exp.Expression], dict[str, str]]:
        items: list[exp.Expression] = []
        columns: dict[str, str] = {}

        def add(name: str, node: exp.Expression, t: str, alias: bool) -> None:
            if name in columns:
                # Spark names a duplicate column differently; the bounded query has none.
                raise _refuse(f"two output columns named {name}")
            columns[name] = t
            items.append(exp.Alias(this=node, alias=_ident(name)) if alias else node)

        generators = 0
        for index, item in enumerate(sel.expressions):
            if isinstance(item.this if isinstance(item, exp.Alias) else item, exp.Explode):
                # UNNEST only as a whole SELECT item, one per SELECT (Spark's generators).
                generators += 1
                if generators > 1:
                    raise _refuse("two UNNESTs in one SELECT")
                item_ctx = replace(ctx, generators=True)
            else:
                item_ctx = ctx
            star = item if isinstance(item, exp.Star) else None
            table = None
            if isinstance(item, exp.Column) and isinstance(item.this, exp.Star):
                star, table = item.this, item.table.lower()
            if star is not None:
                # SELECT * (and * EXCLUDE) become explicit columns: Spark has no EXCLUDE, and
                # a QUALIFY rewrite must list exactly the columns the query had.
                excluded = {e.name.lower() for e in star.args.get("except_") or []}
                if star.args.get("replace") or star.args.get("rename"):
                    raise _refuse("SELECT * REPLACE")
                listed = [s for s in ctx.sources if (s.alias == table if table else s.star)]
                if table and not listed:
                    raise _refuse(f"{table}.* of no table in FROM")
                for source in listed:
                    for name, t in source.columns.items():
                        if name not in excluded:
                            ref = _col(name, source.alias if ctx.qualified or table else None)
                            add(name, ref, t, False)
                continue
            if isinstance(item, exp.Alias):
                lowered = self.expr(item.this, item_ctx)
                add(item.alias.lower(), lowered.node, lowered.type, True)
            elif isinstance(item, exp.Column):
                lowered = self.expr(item, item_ctx)
                add(item.name.lower(), lowered.node, lowered.type, False)
            else:
                lowered = self.expr(item, item_ctx)
                # An unnamed output: nothing refers to it by name (UNION takes the first
                # branch's names); named here only to be listed.
                add(f"_dpsql_c{index}", lowered.node, lowered.type, False)
        return items, columns

    def qualify(
        self, inner: exp.Select, columns: dict[str, str], condition: exp.Expression, ctx: _Ctx
    ) -> tuple[exp.Expression, dict[str, str]]:
        """``SELECT cols ... QUALIFY cond`` as ``SELECT cols FROM (SELECT cols, <windows> ...)
        WHERE cond'``: Spark has no QUALIFY, and the outer SELECT lists exactly the query's
        columns (a rewrite keeping ``*`` would add the window's column to the output)."""
        windows: dict[str, exp.Window] = {}

        def swap(node: exp.Expression) -> exp.Expression:
            if isinstance(node, exp.Window):
                name = self.fresh("w")
                windows[name] = node
                return exp.column(name)
            return node

        replaced = condition.copy().transform(swap)
        if not windows:
            raise _refuse("QUALIFY without a window function")
        win_ctx = replace(ctx, windows=True)
        extra: dict[str, str] = {}
        for name, window in windows.items():
            lowered = self.expr(window, win_ctx)
            inner.append("expressions", exp.Alias(this=lowered.node, alias=_ident(name)))
            extra[name] = lowered.type
        alias = self.fresh("q")
        outer_source = _Source(alias, {**columns, **extra})
        outer_ctx = _Ctx((outer_source,), ctx.ctes)
        for column in replaced.find_all(exp.Column):
            if column.name.lower() not in extra:
                raise _refuse("QUALIFY on a column outside its window functions")
        cond = self.boolean(replaced, outer_ctx, "QUALIFY")
        outer = exp.Select(expressions=[_col(n) for n in columns])
        outer.set(
            "from_",
            exp.From(this=exp.Subquery(this=inner, alias=exp.TableAlias(this=_ident(alias)))),
        )
        outer.set("where", exp.Where(this=cond.node))
        return outer, columns

    def source(
        self, node: exp.Expression, ctes: Mapping[str, dict[str, str]]
    ) -> tuple[exp.Expression, _Source]:
        if isinstance(node, exp.Table):
            if (
                node.args.get("db")
                or node.args.get("catalog")
                or not isinstance(node.this, exp.Identifier)
            ):
                raise _refuse("a qualified table name or table function")
            name = node.name.lower()
            alias = (node.alias or name).lower()
            if name in ctes:
                columns = dict(ctes[name])
            elif name in self.catalog:
                columns = dict(self.catalog[name])
            else:
                raise _refuse(f"the table {name}, which is not in the catalog,")
            if node.args.get("alias") is not None and node.args["alias"].columns:
                raise _refuse("column aliases on a table")
            table = exp.Table(this=_ident(name))
            if alias != name:
                table.set("alias", exp.TableAlias(this=_ident(alias)))
            return table, _Source(alias, columns)
        if isinstance(node, exp.Values):
            return self.values(node)
        if isinstance(node, exp.Subquery):
            body, columns = self.query(node.this, ctes)
            alias = (node.alias or self.fresh("s")).lower()
            alias_node = node.args.get("alias")
            renamed = alias_node.columns if alias_node is not None else []
            if renamed:
                if len(renamed) != len(columns):
                    raise _refuse("a column alias list of another length than its query")
                columns = dict(
                    zip([c.name.lower() for c in renamed], columns.values(), strict=True)
                )
            ta = exp.TableAlias(this=_ident(alias))
            if renamed:
                ta.set("columns", [_ident(c) for c in columns])
            return exp.Subquery(this=body, alias=ta), _Source(alias, columns)
        raise _refuse(f"{describe(node)} in FROM")

    def values(self, node: exp.Values) -> tuple[exp.Expression, _Source]:
        """VALUES: a Spark inline table whose every value is cast to its column's type (Spark
        would otherwise type a column by its own coercion rules)."""
        alias = node.args.get("alias")
        if alias is None or not alias.columns:
            raise _refuse("VALUES without column names")
        names = [c.name.lower() for c in alias.columns]
        ctx = _Ctx((), {})
        rows = []
        for row in node.expressions:
            values = row.expressions if isinstance(row, exp.Tuple) else [row]
            if len(values) != len(names):
                raise _refuse("VALUES rows of different lengths")
            rows.append([self.constant(v, ctx) for v in values])
        types = [_unify([r[i].type for r in rows], "VALUES") for i in range(len(names))]
        tuples = []
        for r in rows:
            cells = []
            for value, t in zip(r, types, strict=True):
                cells.append(value.node if t in (value.type, "NULL") else _cast(value.node, t))
            tuples.append(exp.Tuple(expressions=cells))
        table = exp.Values(
            expressions=tuples,
            alias=exp.TableAlias(
                this=_ident(alias.name.lower()), columns=[_ident(n) for n in names]
            ),
        )
        return table, _Source(alias.name.lower(), dict(zip(names, types, strict=True)))

    def constant(self, node: exp.Expression, ctx: _Ctx) -> _E:
        lowered = self.expr(node, ctx)
        if any(isinstance(n, exp.Column) for n in node.walk()):
            raise _refuse("a column in VALUES")
        return lowered

    def join(
        self, join: exp.Join, sources: list[_Source], ctes: Mapping[str, dict[str, str]]
    ) -> exp.Join:
        node, source = self.source(join.this, ctes)
        kind = (join.args.get("kind") or "").upper()
        side = (join.args.get("side") or "").upper()
        if join.args.get("using") or join.args.get("method"):
            raise _refuse("JOIN ... USING or NATURAL JOIN")
        out = exp.Join(this=node)
        if kind in ("SEMI", "ANTI"):
            if side not in ("", "LEFT"):
                raise _refuse(f"{side} {kind} JOIN")
            # DuckDB's SEMI and ANTI JOIN keep the left side's rows and columns, as Spark's
            # LEFT SEMI and LEFT ANTI JOIN do.
            out.set("side", "LEFT")
            out.set("kind", kind)
            source.star = False
        elif kind == "CROSS":
            out.set("kind", "CROSS")
        elif side == "LEFT" and kind in ("", "OUTER"):
            out.set("side", "LEFT")
        elif side == "" and kind in ("", "INNER"):
            pass  # an inner join
        else:
            raise _refuse(f"{side} {kind} JOIN".replace("  ", " "))
        sources.append(source)
        on = join.args.get("on")
        if on is not None:
            ctx = _Ctx(tuple(sources), ctes, qualified=True)
            cond = self.boolean(
                on, replace(ctx, sources=tuple(replace(s, star=True) for s in sources)), "ON"
            )
            out.set("on", cond.node)
        elif kind != "CROSS":
            raise _refuse("a JOIN without ON")
        return out

    # -- expressions ----------------------------------------------------------------------------

    def boolean(self, node: exp.Expression, ctx: _Ctx, where: str) -> _E:
        lowered = self.expr(node, ctx)
        if lowered.type not in ("BOOLEAN", "NULL"):
            raise _refuse(f"{where} on a value of type {lowered.type}")
        return lowered

    def expr(self, node: exp.Expression, ctx: _Ctx) -> _E:
        handler = _HANDLERS.get(type(node))
        if handler is None:
            raise _refuse(describe(node))
        return handler(self, node, ctx)

    def strict(self, what: str, *args: _E) -> bool:
        """Whether a NULL standing for an error reaches the result through ``what``, which is
        NULL whenever one of ``args`` is: then it still makes the TRY NULL."""
        return any(a.fails for a in args)

    def absorbing(self, what: str, *args: _E) -> None:
        """``what`` can turn a NULL argument into a value (COALESCE, OR, LEAST, IS NULL ...):
        an error DuckDB raises there makes the whole TRY NULL, a Spark try_* makes only that
        argument NULL, and the results would differ."""
        if any(a.fails for a in args):
            raise _refuse(f"{what} over arithmetic that may overflow inside a row-level expression")

    def column(self, node: exp.Column, ctx: _Ctx) -> _E:
        if isinstance(node.this, exp.Star):
            raise _refuse("* outside the SELECT list")
        name = node.name.lower()
        table = node.table.lower() if node.table else None
        if node.args.get("db") or node.args.get("catalog"):
            raise _refuse("a column qualified by schema")
        found = [
            s for s in ctx.sources if (s.alias == table if table else True) and name in s.columns
        ]
        if table is None and len(found) > 1:
            found = [s for s in found if s.star] or found
        if len(found) != 1:
            raise _refuse(f"the column {name}, {'unknown' if not found else 'ambiguous'} here,")
        source = found[0]
        qualify = table is not None or (ctx.qualified and len(ctx.sources) > 1)
        t = source.columns[name]
        return _E(_col(name, source.alias if qualify else None), t, bits=_TYPE_BITS.get(t))


def _histogram_rewrite(sel: exp.Select, fresh: Callable[[str], str]) -> exp.Select:
    """``SELECT keys, HISTOGRAM(b) FROM src GROUP BY keys`` (a map of value -> count, which
    Spark lacks) as ``SELECT keys, _DPSQL_HISTOGRAM(b, n) FROM (SELECT keys, b, COUNT(*) AS n
    FROM src GROUP BY keys, b) GROUP BY keys``: each value's count first, then one map per key."""
    group = sel.args.get("group")
    keys = list(group.expressions) if group is not None else []
    if not all(isinstance(k, exp.Column) for k in keys):
        raise _refuse("HISTOGRAM grouped by an expression")
    key_names = [k.name.lower() for k in keys]
    histogram: exp.Anonymous | None = None
    outputs: list[exp.Expression] = []
    for item in sel.expressions:
        inner = item.this if isinstance(item, exp.Alias) else item
        if isinstance(inner, exp.Anonymous) and inner.name.upper() == "HISTOGRAM":
            if histogram is not None:
                raise _refuse("two HISTOGRAMs in one SELECT")
            histogram = inner
            outputs.append(item)
        elif isinstance(inner, exp.Column) and inner.name.lower() in key_names:
            outputs.append(item)
        else:
            raise _refuse("HISTOGRAM next to other aggregates")
    assert histogram is not None
    if len(histogram.expressions) != 1 or not isinstance(histogram.expressions[0], exp.Column):
        raise _refuse("HISTOGRAM of an expression")
    if sel.args.get("having") or sel.args.get("qualify") or sel.args.get("distinct"):
        raise _refuse("HISTOGRAM with HAVING, QUALIFY or DISTINCT")
    value = histogram.expressions[0].name.lower()
    if value in key_names:
        raise _refuse("HISTOGRAM of a grouping key")
    count, alias = fresh("n"), fresh("h")
    inner_select = exp.Select(
        expressions=[*[k.copy() for k in keys], histogram.expressions[0].copy(),
                     exp.Alias(this=exp.Count(this=exp.Star()), alias=exp.to_identifier(count))]
    )  # fmt: skip
    for arg in ("from_", "joins", "where"):
        if sel.args.get(arg) is not None:
            inner_select.set(
                arg, sel.args[arg].copy() if arg != "joins" else [j.copy() for j in sel.args[arg]]
            )
    inner_select.set(
        "group", exp.Group(expressions=[*[k.copy() for k in keys], histogram.expressions[0].copy()])
    )
    outer_items: list[exp.Expression] = []
    for item in outputs:
        inner = item.this if isinstance(item, exp.Alias) else item
        if inner is histogram:
            agg = exp.Anonymous(
                this="_DPSQL_HISTOGRAM", expressions=[exp.column(value), exp.column(count)]
            )
            outer_items.append(
                exp.Alias(this=agg, alias=item.args["alias"].copy())
                if isinstance(item, exp.Alias)
                else agg
            )
        else:
            ref = exp.column(inner.name)
            outer_items.append(
                exp.Alias(this=ref, alias=item.args["alias"].copy())
                if isinstance(item, exp.Alias)
                else ref
            )
    outer = exp.Select(expressions=outer_items)
    outer.set(
        "from_",
        exp.From(
            this=exp.Subquery(
                this=inner_select, alias=exp.TableAlias(this=exp.to_identifier(alias))
            )
        ),
    )
    if keys:
        outer.set("group", exp.Group(expressions=[exp.column(n) for n in key_names]))
    return outer  # (a WITH of ``sel`` is lowered by ``query``, around it)


_Handler = Callable[[_Lowerer, exp.Expression, _Ctx], _E]
_HANDLERS: dict[type[exp.Expression], _Handler] = {}


def _handles(*types: type[exp.Expression]) -> Callable[[_Handler], _Handler]:
    def register(fn: _Handler) -> _Handler:
        for t in types:
            _HANDLERS[t] = fn
        return fn

    return register


# -- leaves -------------------------------------------------------------------------------------


@_handles(exp.Paren)
def _paren(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    inner = lw.expr(node.this, ctx)
    return replace(inner, node=exp.Paren(this=inner.node))


@_handles(exp.Column)
def _column(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    assert isinstance(node, exp.Column)
    return lw.column(node, ctx)


@_handles(exp.Literal)
def _literal(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    assert isinstance(node, exp.Literal)
    if node.is_string:
        return _E(exp.Literal.string(node.this), "VARCHAR")
    value = _number(node)
    if value is None or not value.is_finite():
        raise _refuse("this number literal")
    t = _literal_type(value, str(node.this))
    if t == "HUGEINT" and abs(value) >= 10**38:
        raise _refuse("an integer literal of more than 38 digits")  # beyond DECIMAL(38, 0)
    return _E(exp.Literal.number(node.this), t, bits=_int_bits(value, t))


@_handles(exp.Null)
def _null(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    return _E(exp.Null(), "NULL")


@_handles(exp.Boolean)
def _boolean(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    return _E(exp.Boolean(this=bool(node.this)), "BOOLEAN")


@_handles(exp.Placeholder, exp.Parameter)
def _parameter(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    # The one parameter of a bounded query is the secret salt, bound by the engine as :salt
    # (the text never holds it).
    if node.name != SALT_PARAMETER:
        raise _refuse("a query parameter other than the salt")
    return _E(exp.Placeholder(this=SALT_PARAMETER), "PARAM")


@_handles(exp.Try)
def _try(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    # DuckDB's TRY turns any error inside into NULL; Spark has no such catch-all, so the inside
    # is lowered so that nothing raises and every stand-in NULL reaches this point.
    inner = lw.expr(node.this, replace(ctx, in_try=True))
    return _E(inner.node, inner.type)


# -- casts --------------------------------------------------------------------------------------


def _clamp_range(node: exp.Expression) -> tuple[Decimal, Decimal] | None:
    """The range [lo, hi] a DuckDB expression cannot leave on any data: ROUND of, or,
    LEAST(GREATEST(x, lo), hi) (or GREATEST(LEAST(x, hi), lo)) with number literals, which on
    both engines skip NULL and map NaN and the infinities into the range (NaN is above every
    number on both)."""
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Round) and node.args.get("decimals") is None:
        return _clamp_range(node.this)
    if isinstance(node, exp.Least | exp.Greatest) and len(node.expressions) == 1:
        outer = _number(node.expressions[0])
        inner = node.this
        while isinstance(inner, exp.Paren):
            inner = inner.this
        other = exp.Greatest if isinstance(node, exp.Least) else exp.Least
        if outer is None or not isinstance(inner, other) or len(inner.expressions) != 1:
            return None
        bound = _number(inner.expressions[0])
        if bound is None:
            return None
        if isinstance(node, exp.Least):  # LEAST(GREATEST(x, lo), hi) lies in [min(lo, hi), hi]
            return min(bound, outer), outer
        return outer, max(bound, outer)  # GREATEST(LEAST(x, hi), lo) in [lo, max(lo, hi)]
    return None


def _is_round(node: exp.Expression) -> bool:
    while isinstance(node, exp.Paren):
        node = node.this
    return isinstance(node, exp.Round) and node.args.get("decimals") is None


# Doubles at or beyond these do not fit in the integer type; BIGINT's upper end 2^63 is exact
# as a double, and Spark casts 2^63 to 2^63 - 1 instead of failing: compared strictly.
_DOUBLE_LIMITS = {
    "TINYINT": ("-128.0", "127.0", False),
    "SMALLINT": ("-32768.0", "32767.0", False),
    "INTEGER": ("-2147483648.0", "2147483647.0", False),
    "BIGINT": ("-9223372036854775808.0", "9223372036854775808.0", True),
}


def _cast_value(lw: _Lowerer, node: exp.Cast, ctx: _Ctx, total: bool) -> _E:
    """CAST (``total``: TRY_CAST, NULL where DuckDB's cast would fail)."""
    target = _norm_type(node.to.sql("duckdb"))
    if target.startswith("?"):
        raise _refuse(f"a cast to {target[1:]}")
    source = lw.expr(node.this, ctx)
    s = source.type
    may_fail = not total and ctx.in_try  # a failing CAST inside TRY: DuckDB's error is NULL
    if s == "PARAM":
        if target != "BIGINT":
            raise _refuse("the salt cast to another type than BIGINT")
        return _E(exp.Cast(this=source.node, to=_spark_type("BIGINT")), "BIGINT")
    if s == target and target != "HUGEINT":
        return source
    if s == target:  # CAST(x AS INT128) of a HUGEINT: kept, as written
        return _E(_cast(source.node, target), target, source.fails, source.bits)
    if s == "NULL":
        return _E(_cast(exp.Null(), target), target)
    literal = _constant_cast(source, node.this, target)
    if literal is not None:
        return literal
    widening = (
        (_is_int(s) and _is_int(target) and _INT_RANK[s] <= _INT_RANK[target])
        or (_is_int(s) and _is_float(target))
        or (s == "FLOAT" and target == "DOUBLE")
        or (_is_decimal(s) and target == "DOUBLE")
        or (s == "BOOLEAN" and (_is_int(target) or target == "VARCHAR"))
        or (_is_int(s) and target in ("VARCHAR", "BOOLEAN"))
        or (s == "DATE" and target in ("TIMESTAMP", "VARCHAR"))
        or (s == "TIMESTAMP" and target == "DATE")
    )
    if widening:
        # Exact on both engines (integers, booleans and dates print alike), cannot fail.
        bits = source.bits if _is_int(s) or s == "BOOLEAN" else None
        return _E(
            _cast(source.node, target), target, source.fails, bits if _is_int(target) else None
        )
    if _is_int(s) and _is_int(target):
        if not (ctx.in_try or total):
            raise _refuse(f"a narrowing cast from {s} to {target} outside TRY")
        # Out of range: NULL, as DuckDB's TRY_CAST (or the error TRY catches).
        return _E(_try_cast(source.node, target), target, source.fails or may_fail)
    if _is_float(s) and _is_int(target) and target != "HUGEINT":
        guarded = ctx.in_try or total
        return _float_to_int(source, node.this, target, guarded=guarded, may_fail=may_fail)
    if _is_decimal(s) and _is_int(target) and (ctx.in_try or total):
        # DuckDB rounds a decimal half away from zero when it casts it to an integer, as
        # Spark's ROUND does; Spark's cast alone would truncate.
        rounded = _fn("ROUND", source.node)
        return _E(_try_cast(rounded, target), target, source.fails or may_fail)
    raise _refuse(f"a cast from {s.lstrip('?')} to {target}")


def _constant_cast(source: _E, original: exp.Expression, target: str) -> _E | None:
    """A cast of a literal, checked here: it would fail on any data or on none."""
    if isinstance(original, exp.Literal) and original.is_string:
        text = str(original.this)
        if target == "VARCHAR":
            return _E(exp.Literal.string(text), "VARCHAR")
        if target == "DATE" and _DATE_TEXT.fullmatch(text):
            try:
                dt.date.fromisoformat(text)
            except ValueError:
                raise _refuse("a cast of an invalid date literal") from None
            return _E(_cast(exp.Literal.string(text), "DATE"), "DATE")
        if target == "TIMESTAMP" and _TIMESTAMP_TEXT.fullmatch(text):
            try:
                dt.datetime.fromisoformat(text)
            except ValueError:
                raise _refuse("a cast of an invalid timestamp literal") from None
            return _E(_cast(exp.Literal.string(text), "TIMESTAMP"), "TIMESTAMP")
        if _is_float(target):
            special = {"inf": _INF, "+inf": _INF, "infinity": _INF, "-inf": _NINF,
                       "-infinity": _NINF, "nan": _NAN}  # fmt: skip
            name = special.get(text.strip().lower())
            if name is None:
                try:
                    name = repr(float(Decimal(text.strip())))
                except InvalidOperation:
                    raise _refuse("a cast of a text literal that is not a number") from None
            return _E(exp.Cast(this=exp.Literal.string(name), to=_spark_type(target)), target)
        if target == "BOOLEAN" and text.lower() in ("true", "false"):
            return _E(exp.Boolean(this=text.lower() == "true"), "BOOLEAN")
        if _is_int(target) and _INT_TEXT.fullmatch(text):
            # A key domain's canonical text cast back to the key's type (dpsql.sql.domains).
            number = exp.Literal.number(str(Decimal(text.strip())))
            return _constant_cast(_E(number, "HUGEINT"), number, target)
        if _is_decimal(target) and _DECIMAL_TEXT.fullmatch(text):
            precision, scale = (int(x) for x in target[8:-1].split(","))
            fixed = Decimal(text.strip())
            exponent = fixed.as_tuple().exponent
            assert isinstance(exponent, int)
            if exponent < -scale or abs(fixed) >= Decimal(10) ** (precision - scale):
                raise _refuse(f"a cast of a text literal to {target} that it does not fit")
            return _E(_cast(exp.Literal.number(str(fixed)), target), target)
        raise _refuse(f"a cast of a text literal to {target}")
    value = _number(original)
    if value is None:
        return None
    if _is_int(target):
        lo, hi = _INT_RANGE[target]
        if value != value.to_integral_value() or not lo <= value <= hi:
            raise _refuse(f"a cast of a number literal to {target} that it does not fit")
        return _E(_cast(source.node, target), target)
    if _is_float(target) or (target == "VARCHAR" and _is_int(source.type)):
        return _E(_cast(source.node, target), target)
    return None


def _float_to_int(
    source: _E, original: exp.Expression, target: str, *, guarded: bool, may_fail: bool
) -> _E:
    """A double cast to an integer type. DuckDB rounds half to even (Spark's cast truncates:
    BROUND first); out of range (NaN, the infinities) it fails: NULL with TRY_CAST."""
    lo, hi = _INT_RANGE[target]
    rounded = source.node if _is_round(original) else _fn("BROUND", source.node)
    clamp = _clamp_range(original)
    exact = 2**53  # a double holds every integer up to 2^53 exactly
    if clamp is not None and max(lo, -exact) <= clamp[0] and clamp[1] <= min(hi, exact):
        # Clamped to literal bounds that the type holds (and a double holds exactly): no value,
        # NaN or infinity included, can make this cast fail on either engine.
        bound = max(abs(clamp[0]), abs(clamp[1]))
        return _E(_cast(rounded, target), target, source.fails, int(bound).bit_length())
    if not guarded:
        raise _refuse("a cast of a floating value to an integer type that is not clamped first")
    low, high, strict = _DOUBLE_LIMITS[target]
    r = _p(rounded)
    above = exp.GTE(this=r, expression=_double(low))
    below = (exp.LT if strict else exp.LTE)(this=r, expression=_double(high))
    # NaN passes >= (it is above every number) and fails the upper test: NULL, as on DuckDB.
    in_range = _case((exp.And(this=above, expression=below), _cast(rounded, target)))
    return _E(in_range, target, source.fails or may_fail)


@_handles(exp.Cast)
def _cast_node(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    assert isinstance(node, exp.Cast)
    return _cast_value(lw, node, ctx, total=False)


@_handles(exp.TryCast)
def _try_cast_node(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    assert isinstance(node, exp.Cast)
    return _cast_value(lw, node, ctx, total=True)


# -- arithmetic ---------------------------------------------------------------------------------

_TRY_OPS: dict[type[exp.Expression], str] = {
    exp.Add: "TRY_ADD",
    exp.Sub: "TRY_SUBTRACT",
    exp.Mul: "TRY_MULTIPLY",
}


def _operand_types(a: _E, b: _E) -> tuple[str, str]:
    ta = b.type if a.type == "NULL" else a.type
    tb = a.type if b.type == "NULL" else b.type
    return ta, tb


def _int_result(a: _E, a_node: exp.Expression, b: _E, b_node: exp.Expression) -> str:
    """DuckDB's type of integer arithmetic: the wider operand's, an integer literal taking the
    other side's type when it fits (``smallint_col + 1`` is SMALLINT)."""
    types = []
    for side, node in ((a, a_node), (b, b_node)):
        value = _number(node)
        if value is not None and side.type in _INT_RANK and value == value.to_integral_value():
            types.append(_small_literal_type(value))
        elif side.type == "NULL":
            continue
        else:
            types.append(side.type)
    return _INT_BY_RANK[max(_INT_RANK[t] for t in types)] if types else "INTEGER"


def _spark_int(e: _E, node: exp.Expression) -> str:
    """The integer type Spark gives ``e``: an integer literal is INT (or wider)."""
    value = _number(node)
    if value is not None and e.type in _INT_RANK:
        return _literal_type(value, str(int(value)))
    return e.type


@_handles(exp.Add, exp.Sub, exp.Mul)
def _arith(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    a, b = lw.expr(node.this, ctx), lw.expr(node.expression, ctx)
    ta, tb = _operand_types(a, b)
    fails = lw.strict("arithmetic", a, b)
    if not (_is_num(ta) and _is_num(tb)):
        raise _refuse(f"{describe(node)} of {ta} and {tb}")
    if _is_float(ta) or _is_float(tb):
        # Floating arithmetic never raises on either engine (it overflows to infinity).
        result = "DOUBLE" if "DOUBLE" in (ta, tb) else "FLOAT"
        left, right = _p(a.node), _p(b.node)
        if result == "FLOAT":  # Spark would compute a FLOAT with a DECIMAL in DOUBLE
            left = (
                left
                if _is_float(ta) or ta in ("TINYINT", "SMALLINT", "INTEGER", "BIGINT")
                else _cast(a.node, result)
            )
            right = (
                right
                if _is_float(tb) or tb in ("TINYINT", "SMALLINT", "INTEGER", "BIGINT")
                else _cast(b.node, result)
            )
        return _E(node.__class__(this=left, expression=right), result, fails)
    if _is_decimal(ta) or _is_decimal(tb):
        # Spark and DuckDB size decimal results differently (and overflow at other points).
        raise _refuse("arithmetic on DECIMAL values")
    result = _int_result(a, node.this, b, node.expression)
    left, right = _int_operands(a, node.this, b, node.expression, result)
    bits = None
    if a.bits is not None and b.bits is not None:
        bits = a.bits + b.bits if isinstance(node, exp.Mul) else max(a.bits, b.bits) + 1
    if bits is not None and bits <= _CAPACITY[result]:
        # Within the type on any data (e.g. an INTEGER column widened to HUGEINT, plus 1): it
        # cannot overflow on either engine.
        return _E(node.__class__(this=left, expression=right), result, fails, bits)
    if ctx.in_try:
        # Integer overflow raises on Spark as on DuckDB; inside TRY it must give NULL instead.
        return _E(_fn(_TRY_OPS[type(node)], left, right), result, True)
    return _E(node.__class__(this=left, expression=right), result, fails)


def _int_operands(
    a: _E, a_node: exp.Expression, b: _E, b_node: exp.Expression, result: str
) -> tuple[exp.Expression, exp.Expression]:
    """The operands of integer arithmetic so that Spark computes it in ``result``, DuckDB's
    type (an integer literal is INT on Spark; beside a SMALLINT, DuckDB makes it SMALLINT)."""
    sa, sb = _spark_int(a, a_node), _spark_int(b, b_node)
    if result == "HUGEINT":
        if "HUGEINT" in (sa, sb):  # DECIMAL(38, 0) with any integer stays DECIMAL(38, 0)
            return _p(a.node), _p(b.node)
        return _cast(a.node, result), _cast(b.node, result)
    natural = _INT_BY_RANK[max(_INT_RANK.get(sa, 3), _INT_RANK.get(sb, 3))]
    if natural == result:
        return _p(a.node), _p(b.node)
    left = _p(a.node) if sa == result else _cast(a.node, result)
    right = _p(b.node) if sb == result else _cast(b.node, result)
    return left, right


def _ieee_divide(a: exp.Expression, b: exp.Expression) -> exp.Expression:
    """a / b on doubles as DuckDB computes it: IEEE, x / ±0 is ±inf (by the signs) and 0 / 0
    NaN, where Spark raises (ANSI) or gives NULL."""
    zero = exp.Literal.number(0)
    negative_zero = exp.EQ(this=_cast(b, "VARCHAR"), expression=exp.Literal.string("-0.0"))
    positive = exp.GT(this=a, expression=zero.copy())
    nan = exp.Or(this=_fn("ISNAN", a), expression=exp.EQ(this=a, expression=zero.copy()))
    by_zero = _case(
        (_is_null(a), _cast(exp.Null(), "DOUBLE")),
        (nan, _double(_NAN)),
        (
            exp.NEQ(this=exp.Paren(this=positive), expression=exp.Paren(this=negative_zero)),
            _double(_INF),
        ),
        default=_double(_NINF),
    )
    return _case((exp.EQ(this=b, expression=zero), by_zero), default=exp.Div(this=a, expression=b))


@_handles(exp.Div)
def _divide(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    a, b = lw.expr(node.this, ctx), lw.expr(node.expression, ctx)
    ta, tb = _operand_types(a, b)
    if not (_is_num(ta) and _is_num(tb)):
        raise _refuse(f"/ of {ta} and {tb}")
    fails = lw.strict("/", a, b)
    result = "FLOAT" if ta == tb == "FLOAT" else "DOUBLE"
    # DuckDB's / is floating division on every numeric type (integers included).
    left = _p(a.node) if _is_float(ta) else _cast(a.node, "DOUBLE")
    right = _p(b.node) if _is_float(tb) else _cast(b.node, "DOUBLE")
    divisor = _number(node.expression)
    if divisor is not None and divisor != 0:
        out: exp.Expression = exp.Div(this=left, expression=right)  # a non-zero literal
    else:
        out = _ieee_divide(left, right)
    return _E(out if result == "DOUBLE" else _cast(out, "FLOAT"), result, fails)


def _nonzero_divisor(node: exp.Expression) -> bool:
    """A divisor that cannot be zero: a non-zero literal, or NULLIF(d, 0) (as dpsql's
    totality rewrite writes every divisor of // and %)."""
    value = _number(node)
    if value is not None:
        return value != 0
    while isinstance(node, exp.Paren):
        node = node.this
    return isinstance(node, exp.Nullif) and _number(node.expression) == 0


@_handles(exp.IntDiv, exp.Mod)
def _int_div_mod(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    a, b = lw.expr(node.this, ctx), lw.expr(node.expression, ctx)
    ta, tb = _operand_types(a, b)
    if not (_is_num(ta) and _is_num(tb)):
        raise _refuse(f"{describe(node)} of {ta} and {tb}")
    fails = lw.strict(describe(node), a, b)
    safe = _nonzero_divisor(node.expression)
    mod = isinstance(node, exp.Mod)
    if _is_float(ta) or _is_float(tb):
        result = "FLOAT" if ta == tb == "FLOAT" else "DOUBLE"
        left = _p(a.node) if _is_float(ta) else _cast(a.node, "DOUBLE")
        right = _p(b.node) if _is_float(tb) else _cast(b.node, "DOUBLE")
        if mod:
            # DuckDB's % on doubles is fmod, NaN for a zero divisor (Spark raises there).
            fmod = _case(
                (_is_null(left), _cast(exp.Null(), "DOUBLE")),
                (exp.EQ(this=right, expression=exp.Literal.number(0)), _double(_NAN)),
                default=exp.Mod(this=left, expression=right),
            )
            return _E(fmod, result, fails)
        # DuckDB's // on doubles is plain division, failing on a zero divisor like Spark's /.
        if ctx.in_try and not safe:
            return _E(_fn("TRY_DIVIDE", left, right), result, True)
        return _E(exp.Div(this=left, expression=right), result, fails)
    if _is_decimal(ta) or _is_decimal(tb):
        raise _refuse(f"{describe(node)} on DECIMAL values")
    result = _int_result(a, node.this, b, node.expression)
    left, right = _int_operands(a, node.this, b, node.expression, result)
    if mod:
        # Integer % truncates (the result takes the dividend's sign) on both engines, and its
        # result is smaller than the divisor: it cannot overflow, only fail on a zero divisor.
        bits = None if a.bits is None or b.bits is None else min(a.bits, b.bits)
        if ctx.in_try and not safe:
            return _E(_fn("TRY_MOD", left, right), result, True)
        return _E(exp.Mod(this=left, expression=right), result, fails, bits)
    # Integer // truncates towards zero on DuckDB. Spark's div on decimals returns a BIGINT
    # that wraps silently past 2^63: the quotient is computed exactly in decimals instead, as
    # (a - a % b) / b, which divides exactly (a DECIMAL(38, 6) holds 32 integer digits; beyond,
    # Spark raises, or with try_divide gives NULL). Within BIGINT, Spark's div is exact and
    # raises on overflow (MIN div -1) as DuckDB does.
    # |a // b| <= |a|, and only MIN // -1 leaves the type: safe when a is within its capacity.
    bits = a.bits
    fits = bits is not None and bits <= _CAPACITY[result]
    if result != "HUGEINT" and (not ctx.in_try or (safe and fits)):
        div = exp.IntDiv(this=left, expression=right)
        return _E(div if result == "BIGINT" else _cast(div, result), result, fails, bits)
    big_a = _p(a.node) if a.type == "HUGEINT" else _cast(a.node, "HUGEINT")
    big_b = _p(b.node) if b.type == "HUGEINT" else _cast(b.node, "HUGEINT")
    # A quotient below 2^106 (< 10^32) fits the DECIMAL(38, 6) of Spark's division.
    if ctx.in_try and not (safe and bits is not None and bits <= 106):
        rest = _fn("TRY_MOD", big_a, big_b)
        quotient = _fn("TRY_DIVIDE", exp.Sub(this=big_a, expression=rest), big_b)
        return _E(_try_cast(quotient, result), result, True)
    rest = exp.Mod(this=big_a, expression=big_b)
    quotient = exp.Div(this=exp.Paren(this=exp.Sub(this=big_a, expression=rest)), expression=big_b)
    out = _cast(quotient, "HUGEINT")
    if result == "HUGEINT":
        return _E(out, result, fails, bits)
    if ctx.in_try:  # MIN // -1 leaves the type: NULL, as DuckDB's error inside TRY
        return _E(_try_cast(out, result), result, True)
    return _E(_cast(out, result), result, fails, bits)


@_handles(exp.Neg)
def _neg(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    value = _number(node)
    if value is not None:
        text = str(node.this.this) if isinstance(node.this, exp.Literal) else None
        if text is not None:
            t = _literal_type(value, "-" + text)
            return _E(exp.Neg(this=exp.Literal.number(text)), t, bits=_int_bits(value, t))
    a = lw.expr(node.this, ctx)
    if not _is_num(a.type) and a.type != "NULL":
        raise _refuse(f"- of {a.type}")
    fits = a.bits is not None and a.bits <= _CAPACITY.get(a.type, 0)
    if _is_int(a.type) and ctx.in_try and not fits:
        # -MIN overflows: NULL inside TRY.
        zero = _cast(exp.Literal.number(0), a.type)
        return _E(_fn("TRY_SUBTRACT", zero, a.node), a.type, True)
    return _E(exp.Neg(this=_p(a.node)), a.type, a.fails, a.bits)


@_handles(exp.Abs)
def _abs(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    a = lw.expr(node.this, ctx)
    if not _is_num(a.type) and a.type != "NULL":
        raise _refuse(f"ABS of {a.type}")
    fits = a.bits is not None and a.bits <= _CAPACITY.get(a.type, 0)
    if _is_int(a.type) and ctx.in_try and not fits:
        zero = _cast(exp.Literal.number(0), a.type)
        negated = _fn("TRY_SUBTRACT", zero, a.node)
        out = _case(
            (exp.LT(this=_p(a.node), expression=exp.Literal.number(0)), negated), default=a.node
        )
        return _E(out, a.type, True)
    return _E(_fn("ABS", a.node), a.type, a.fails, a.bits)


# -- comparisons and logic ----------------------------------------------------------------------


def _comparable(
    a: _E, a_node: exp.Expression, b: _E, b_node: exp.Expression, what: str
) -> tuple[exp.Expression, exp.Expression]:
    """The operands of a comparison, of one kind: numbers (each engine widens them the same
    way), text, dates, timestamps, booleans. A text literal next to a date is cast here, once
    it is checked to be a date (Spark and DuckDB parse other texts differently)."""
    ka, kb = _kind(a.type), _kind(b.type)
    if "NULL" in (ka, kb) or ka == kb:
        if (
            ka.startswith("?")
            or ka.startswith("LIST")
            or ka.startswith("MAP")
            or ka in ("HASH", "PARAM")
        ):
            raise _refuse(f"{what} of {ka.lstrip('?')} values")
        return _p(a.node), _p(b.node)
    for text_side, other, text_node in ((a, b, a_node), (b, a, b_node)):
        if (
            text_side.type == "VARCHAR"
            and other.type in ("DATE", "TIMESTAMP")
            and isinstance(text_node, exp.Literal)
        ):
            cast = _constant_cast(text_side, text_node, other.type)
            assert cast is not None
            if text_side is a:
                return cast.node, _p(b.node)
            return _p(a.node), cast.node
    raise _refuse(f"{what} of {a.type} and {b.type}")


@_handles(exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)
def _compare(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    # NaN equals NaN and lies above every number on both engines; NULL gives NULL (strict).
    a, b = lw.expr(node.this, ctx), lw.expr(node.expression, ctx)
    left, right = _comparable(a, node.this, b, node.expression, describe(node))
    return _E(node.__class__(this=left, expression=right), "BOOLEAN", lw.strict("=", a, b))


@_handles(exp.NullSafeEQ, exp.NullSafeNEQ)
def _null_safe(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    a, b = lw.expr(node.this, ctx), lw.expr(node.expression, ctx)
    lw.absorbing("IS [NOT] DISTINCT FROM", a, b)
    left, right = _comparable(a, node.this, b, node.expression, "IS NOT DISTINCT FROM")
    # IS NOT DISTINCT FROM is Spark's <=> (NULL <=> NULL is true); rows without a unit are one
    # unit in every ranking and join (dpsql.sql.caps).
    out: exp.Expression = exp.NullSafeEQ(this=left, expression=right)
    if isinstance(node, exp.NullSafeNEQ):
        out = exp.Not(this=exp.Paren(this=out))
    return _E(out, "BOOLEAN")


def _null_or_nan(node: exp.Expression) -> exp.Expression | None:
    """The x of ``x IS NULL OR ISNAN(x)`` (as the bounded query tests a missing value)."""
    left, right = node.this, node.expression
    if not (isinstance(node, exp.Or) and isinstance(left, exp.Is)):
        return None
    if not (isinstance(right, exp.IsNan) and isinstance(left.expression, exp.Null)):
        return None
    tested: exp.Expression = right.this
    return tested if left.this.sql("duckdb") == tested.sql("duckdb") else None


@_handles(exp.And, exp.Or)
def _connector(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    tested = _null_or_nan(node)
    if tested is not None:
        # ISNAN(NULL) is NULL on DuckDB, false on Spark; after "x IS NULL OR" either is TRUE.
        x = _float_arg(lw, tested, ctx, "ISNAN")
        lw.absorbing("IS NULL", x)
        test = exp.Or(this=_is_null(x.node), expression=_fn("ISNAN", x.node))
        return _E(test, "BOOLEAN")
    a, b = lw.expr(node.this, ctx), lw.expr(node.expression, ctx)
    for side in (a, b):
        if side.type not in ("BOOLEAN", "NULL"):
            raise _refuse(f"{describe(node)} of a {side.type} value")
    # FALSE AND NULL is FALSE: a NULL standing for an error would not reach the TRY.
    lw.absorbing(describe(node), a, b)
    return _E(node.__class__(this=_p(a.node), expression=_p(b.node)), "BOOLEAN")


@_handles(exp.Not)
def _not(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    a = lw.expr(node.this, ctx)
    if a.type not in ("BOOLEAN", "NULL"):
        raise _refuse(f"NOT of a {a.type} value")
    return _E(exp.Not(this=_p(a.node)), "BOOLEAN", a.fails)


@_handles(exp.Is)
def _is(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    a = lw.expr(node.this, ctx)
    lw.absorbing("IS", a)
    right = node.expression
    if isinstance(right, exp.Null):
        return _E(exp.Is(this=_p(a.node), expression=exp.Null()), "BOOLEAN")
    if isinstance(right, exp.Boolean) and a.type in ("BOOLEAN", "NULL"):
        return _E(exp.Is(this=_p(a.node), expression=exp.Boolean(this=bool(right.this))), "BOOLEAN")
    raise _refuse("IS with something other than NULL, TRUE or FALSE")


@_handles(exp.In)
def _in(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    a = lw.expr(node.this, ctx)
    if node.args.get("unnest") or node.args.get("field"):
        raise _refuse("IN UNNEST")
    query = node.args.get("query")
    if query is not None:
        body, columns = lw.query(query.this if isinstance(query, exp.Subquery) else query, ctx.ctes)
        if len(columns) != 1:
            raise _refuse("IN over a subquery of several columns")
        (t,) = columns.values()
        _comparable(a, node.this, _E(exp.Null(), t), exp.Null(), "IN")  # one kind, or refused
        return _E(exp.In(this=_p(a.node), query=exp.Subquery(this=body)), "BOOLEAN", a.fails)
    items = [lw.expr(e, ctx) for e in node.expressions]
    lw.absorbing("IN", *items)
    values = []
    for item, original in zip(items, node.expressions, strict=True):
        _, right = _comparable(a, node.this, item, original, "IN")
        values.append(right)
    return _E(exp.In(this=_p(a.node), expressions=values), "BOOLEAN", a.fails)


@_handles(exp.Between)
def _between(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    a = lw.expr(node.this, ctx)
    low, high = lw.expr(node.args["low"], ctx), lw.expr(node.args["high"], ctx)
    lw.absorbing("BETWEEN", low, high)
    left, lo = _comparable(a, node.this, low, node.args["low"], "BETWEEN")
    _, hi = _comparable(a, node.this, high, node.args["high"], "BETWEEN")
    return _E(exp.Between(this=left, low=lo, high=hi), "BOOLEAN", a.fails)


def _branches(values: list[_E], what: str) -> tuple[str, list[exp.Expression]]:
    """The result type of CASE-like branches: DuckDB's, which Spark's widening of the same
    numeric types gives too (INT with DECIMAL(38, 0) is DECIMAL(38, 0), INT with DOUBLE is
    DOUBLE); mixed kinds are refused by ``_unify``."""
    return _unify([v.type for v in values], what), [v.node for v in values]


@_handles(exp.Case)
def _case_node(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    if node.args.get("this") is not None:
        raise _refuse("CASE with an operand")
    conds, values = [], []
    for branch in node.args.get("ifs") or []:
        cond = lw.expr(branch.this, ctx)
        if cond.type not in ("BOOLEAN", "NULL"):
            raise _refuse(f"a CASE condition of type {cond.type}")
        conds.append(cond)
        values.append(lw.expr(branch.args["true"], ctx))
    default = node.args.get("default")
    values.append(lw.expr(default, ctx) if default is not None else _E(exp.Null(), "NULL"))
    # A NULL condition takes the next branch: an error there would not reach the TRY. A branch
    # is only evaluated where it is taken, on both engines.
    lw.absorbing("a CASE condition", *conds)
    t, nodes = _branches(values, "CASE")
    out = _case(*[(c.node, v) for c, v in zip(conds, nodes[:-1], strict=True)], default=nodes[-1])
    return _E(out, t, lw.strict("CASE", *values), _bits(*values) if _is_int(t) else None)


@_handles(exp.If)
def _if(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    cond = lw.expr(node.this, ctx)
    if cond.type not in ("BOOLEAN", "NULL"):
        raise _refuse(f"an IF condition of type {cond.type}")
    lw.absorbing("an IF condition", cond)
    true = lw.expr(node.args["true"], ctx)
    false_node = node.args.get("false")
    false = lw.expr(false_node, ctx) if false_node is not None else _E(exp.Null(), "NULL")
    t, (x, y) = _branches([true, false], "IF")
    return _E(
        _case((cond.node, x), default=y),
        t,
        lw.strict("IF", true, false),
        _bits(true, false) if _is_int(t) else None,
    )


@_handles(exp.Coalesce)
def _coalesce(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    args = [lw.expr(node.this, ctx), *(lw.expr(e, ctx) for e in node.expressions)]
    # Every argument but the last can turn into the next one's value: absorbing; the last is
    # evaluated only where all the others are NULL (on both engines), and its NULL is the
    # result.
    lw.absorbing("COALESCE", *args[:-1])
    t, nodes = _branches(args, "COALESCE")
    return _E(
        exp.Coalesce(this=nodes[0], expressions=nodes[1:]),
        t,
        args[-1].fails,
        _bits(*args) if _is_int(t) else None,
    )


@_handles(exp.Nullif)
def _nullif(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    a, b = lw.expr(node.this, ctx), lw.expr(node.expression, ctx)
    lw.absorbing("NULLIF", b)  # NULLIF(a, NULL) is a
    left, right = _comparable(a, node.this, b, node.expression, "NULLIF")
    return _E(exp.Nullif(this=left, expression=right), a.type, a.fails, a.bits)


@_handles(exp.Least, exp.Greatest)
def _least_greatest(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    args = [lw.expr(node.this, ctx), *(lw.expr(e, ctx) for e in node.expressions)]
    # Both engines skip NULL arguments (LEAST(NULL, 1) is 1) and order NaN above +inf, so the
    # bounded query's clamps map NULL to the bound, and NaN to the upper one, alike.
    lw.absorbing(describe(node), *args)
    for a in args:
        if a.type.startswith("?") or a.type.startswith("LIST") or a.type in ("HASH", "PARAM"):
            raise _refuse(f"{describe(node)} of {a.type.lstrip('?')}")
    t, nodes = _branches(args, describe(node))
    return _E(
        node.__class__(this=nodes[0], expressions=nodes[1:]),
        t,
        bits=_bits(*args) if _is_int(t) else None,
    )


# -- numeric and text functions -----------------------------------------------------------------


def _float_arg(lw: _Lowerer, node: exp.Expression, ctx: _Ctx, what: str) -> _E:
    a = lw.expr(node, ctx)
    if not _is_num(a.type) and a.type != "NULL":
        raise _refuse(f"{what} of {a.type}")
    return a


@_handles(exp.IsNan)
def _isnan(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    a = _float_arg(lw, node.this, ctx, "ISNAN")
    # Spark's isnan(NULL) is false, DuckDB's NULL: spelled out.
    out = _case((_is_null(a.node), exp.Null()), default=_fn("ISNAN", a.node))
    return _E(out, "BOOLEAN", a.fails)


@_handles(exp.IsInf)
def _isinf(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    a = _float_arg(lw, node.this, ctx, "ISINF")
    out = exp.EQ(this=_fn("ABS", a.node), expression=_double(_INF))
    return _E(out, "BOOLEAN", a.fails)


@_handles(exp.Round)
def _round(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    decimals = node.args.get("decimals")
    if decimals is not None and _number(decimals) != 0:
        # DuckDB rounds x * 10^d in binary, Spark the decimal text: they differ (1.005).
        raise _refuse("ROUND to a number of decimals")
    a = _float_arg(lw, node.this, ctx, "ROUND")
    # Halves round away from zero on both engines (Spark rounds the double's shortest decimal
    # text, which lies on the same side of every half as the double); NaN and the
    # infinities stay as they are.
    return _E(_fn("ROUND", a.node), a.type, a.fails)


@_handles(exp.Floor, exp.Ceil)
def _floor_ceil(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    if node.args.get("decimals") is not None:
        raise _refuse(f"{describe(node)} to a number of decimals")
    a = _float_arg(lw, node.this, ctx, describe(node))
    if _is_int(a.type):
        return a
    if not _is_float(a.type):
        return _E(_fn(node.key.upper(), a.node), a.type, a.fails)
    # DuckDB's FLOOR of a double is a double; Spark's a BIGINT (saturating). Below 2^52,
    # x - x % 1 (fmod: exact, with x's sign) is x truncated, exactly; one less for a negative x
    # with a fraction. Beyond 2^52, and for NaN and the infinities, x is its own floor.
    x = a.node if isinstance(node, exp.Floor) else exp.Neg(this=_p(a.node))
    big = exp.Or(
        this=exp.GTE(this=_fn("ABS", x), expression=_double("4503599627370496.0")),
        expression=_fn("ISNAN", x),
    )
    truncated = exp.Paren(
        this=exp.Sub(this=_p(x), expression=exp.Mod(this=_p(x), expression=_double("1.0")))
    )
    floor = _case(
        (big, x),
        (
            exp.LT(this=_p(x), expression=truncated),
            exp.Sub(this=truncated.copy(), expression=_double("1.0")),
        ),
        default=truncated.copy(),
    )
    out = floor if isinstance(node, exp.Floor) else exp.Neg(this=exp.Paren(this=floor))
    return _E(out, a.type, a.fails)


@_handles(exp.Length)
def _length(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    a = lw.expr(node.this, ctx)
    if a.type.startswith("LIST("):
        # array_size is NULL for a NULL list, as DuckDB's LENGTH (size() may give -1); BIGINT
        # as on DuckDB.
        return _E(_cast(_fn("ARRAY_SIZE", a.node), "BIGINT"), "BIGINT", a.fails, 31)
    if a.type in ("VARCHAR", "NULL"):
        # Characters (code points) on both engines.
        return _E(_cast(_fn("CHAR_LENGTH", a.node), "BIGINT"), "BIGINT", a.fails, 31)
    raise _refuse(f"LENGTH of {a.type}")


def _text(lw: _Lowerer, node: exp.Expression, ctx: _Ctx, what: str) -> _E:
    a = lw.expr(node, ctx)
    if a.type not in ("VARCHAR", "NULL"):
        # DuckDB formats numbers as text unlike Spark (1e+20, 1.0E20).
        raise _refuse(f"{what} of a {a.type} value")
    return a


@_handles(exp.DPipe)
def _dpipe(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    a, b = _text(lw, node.this, ctx, "||"), _text(lw, node.expression, ctx, "||")
    return _E(exp.DPipe(this=_p(a.node), expression=_p(b.node)), "VARCHAR", lw.strict("||", a, b))


@_handles(exp.Concat)
def _concat(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    args = [_text(lw, e, ctx, "CONCAT") for e in node.expressions]
    lw.absorbing("CONCAT", *args)
    # DuckDB's CONCAT skips NULL arguments, as Spark's concat_ws does (Spark's concat is NULL).
    return _E(_fn("CONCAT_WS", exp.Literal.string(""), *(a.node for a in args)), "VARCHAR")


@_handles(exp.Like)
def _like(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    a = _text(lw, node.this, ctx, "LIKE")
    pattern = node.expression
    if not (isinstance(pattern, exp.Literal) and pattern.is_string) or "\\" in str(pattern.this):
        # Spark's LIKE escapes with a backslash by default, DuckDB's does not.
        raise _refuse("LIKE with a pattern that is not a literal without backslashes")
    if node.args.get("escape"):
        raise _refuse("LIKE ... ESCAPE")
    return _E(
        exp.Like(this=_p(a.node), expression=exp.Literal.string(pattern.this)), "BOOLEAN", a.fails
    )


@_handles(exp.Substring)
def _substring(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    a = _text(lw, node.this, ctx, "SUBSTRING")
    start, length = node.args.get("start"), node.args.get("length")
    s = _number(start) if start is not None else None
    n = _number(length) if length is not None else Decimal(0)
    if s is None or n is None or s < 1 or n < 0 or length is None:
        # The engines read a start at or below 0 and a negative length differently.
        raise _refuse("SUBSTRING with a start or length that is not a positive literal")
    out = _fn("SUBSTRING", a.node, exp.Literal.number(int(s)), exp.Literal.number(int(n)))
    return _E(out, "VARCHAR", a.fails)


@_handles(exp.Trim)
def _trim(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    if node.args.get("expression") is not None or node.args.get("position"):
        raise _refuse("TRIM of given characters or one side")
    a = _text(lw, node.this, ctx, "TRIM")
    return _E(_fn("TRIM", a.node), "VARCHAR", a.fails)  # spaces, on both engines


@_handles(exp.StartsWith, exp.Contains)
def _starts_contains(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    a = _text(lw, node.this, ctx, describe(node))
    b = _text(lw, node.expression, ctx, describe(node))
    name = "STARTSWITH" if isinstance(node, exp.StartsWith) else "CONTAINS"
    return _E(_fn(name, a.node, b.node), "BOOLEAN", lw.strict(name, a, b))


# -- dates ------------------------------------------------------------------------------------

_PARTS = {
    "year": "YEAR",
    "month": "MONTH",
    "day": "DAY",
    "quarter": "QUARTER",
    "hour": "HOUR",
    "minute": "MINUTE",
    "dayofweek": "DAYOFWEEK",
    "dow": "DAYOFWEEK",
    "dayofyear": "DAYOFYEAR",
    "doy": "DAYOFYEAR",
}


def _date_part(lw: _Lowerer, part: str, arg: exp.Expression, ctx: _Ctx) -> _E:
    a = lw.expr(arg, ctx)
    if a.type not in ("DATE", "TIMESTAMP", "NULL"):
        raise _refuse(f"{part} of a {a.type} value")
    name = _PARTS.get(part)
    if name is None:
        raise _refuse(f"the date part {part}")
    if name in ("HOUR", "MINUTE") and a.type == "DATE":
        # A DATE is at midnight on DuckDB; Spark would convert it through the session's zone.
        return _E(
            _case(
                (_is_null(a.node), _cast(exp.Null(), "BIGINT")),
                default=_cast(exp.Literal.number(0), "BIGINT"),
            ),
            "BIGINT",
            a.fails,
        )
    out: exp.Expression = _fn(name, a.node)
    if name == "DAYOFWEEK":
        # DuckDB counts Sunday as 0, Spark as 1.
        out = exp.Sub(this=out, expression=exp.Literal.number(1))
    # DuckDB's date parts are BIGINT, Spark's INT.
    return _E(_cast(out, "BIGINT"), "BIGINT", a.fails, 31)


_DATE_FUNCTIONS: dict[type[exp.Expression], str] = {
    exp.Year: "year",
    exp.Month: "month",
    exp.Day: "day",
    exp.Quarter: "quarter",
    exp.Hour: "hour",
    exp.Minute: "minute",
    exp.DayOfWeek: "dayofweek",
}


@_handles(*_DATE_FUNCTIONS)
def _date_function(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    return _date_part(lw, _DATE_FUNCTIONS[type(node)], node.this, ctx)


@_handles(exp.Extract)
def _extract(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    return _date_part(lw, node.this.name.lower(), node.expression, ctx)


_TRUNC = {
    "year": "YEAR", "years": "YEAR", "quarter": "QUARTER", "quarters": "QUARTER",
    "month": "MONTH", "months": "MONTH", "day": "DAY", "days": "DAY", "hour": "HOUR",
    "hours": "HOUR", "minute": "MINUTE", "minutes": "MINUTE", "second": "SECOND",
    "seconds": "SECOND", "millisecond": "MILLISECOND", "milliseconds": "MILLISECOND",
    "microsecond": "MICROSECOND", "microseconds": "MICROSECOND",
}  # fmt: skip


@_handles(exp.TimestampTrunc, exp.DateTrunc)
def _date_trunc(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    unit = node.args.get("unit")
    name = _TRUNC.get(unit.name.lower() if unit is not None else "")
    if name is None:
        raise _refuse(f"date_trunc to {unit.name.lower() if unit is not None else 'this unit'}")
    a = lw.expr(node.this, ctx)
    if a.type == "DATE":
        # DuckDB's date_trunc of a DATE is a TIMESTAMP (midnight); Spark's trunc keeps a DATE,
        # cast to TIMESTAMP_NTZ without any time zone. Below a day, the date itself.
        if name in ("YEAR", "QUARTER", "MONTH"):
            out = _cast(_fn("TRUNC", a.node, exp.Literal.string(name)), "TIMESTAMP")
        else:
            out = _cast(a.node, "TIMESTAMP")
        return _E(out, "TIMESTAMP", a.fails)
    if a.type == "TIMESTAMP":
        # Spark's date_trunc returns a TIMESTAMP in the session's zone, pinned to UTC by
        # dpsql: cast back to the zone-less TIMESTAMP_NTZ, the same wall-clock value.
        out = _cast(_fn("DATE_TRUNC", exp.Literal.string(name), a.node), "TIMESTAMP")
        return _E(out, "TIMESTAMP", a.fails)
    raise _refuse(f"date_trunc of a {a.type} value")


# -- lists and the keyed hash --------------------------------------------------------------------


@_handles(exp.ArraySort)
def _list_sort(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    if node.args.get("expression") is not None:
        raise _refuse("LIST_SORT with a sort order")
    a = lw.expr(node.this, ctx)
    _elem(a.type)
    # Ascending, NULLs last, -0.0 beside 0.0 and NaN last: DuckDB's list_sort order.
    return _E(_fn("ARRAY_SORT", a.node), a.type, a.fails)


def _positive_step(node: exp.Expression) -> bool:
    """A list_slice step that is at least 1 on any data: a positive literal, or GREATEST of
    anything and a positive literal (as dpsql writes it)."""
    value = _number(node)
    if value is not None:
        return value >= 1 and value == value.to_integral_value()
    while isinstance(node, exp.Paren):
        node = node.this
    return isinstance(node, exp.Greatest) and any(
        (v := _number(e)) is not None and v >= 1 for e in [node.this, *node.expressions]
    )


def _list_slice(lw: _Lowerer, node: exp.Anonymous, ctx: _Ctx) -> _E:
    args = node.expressions
    if len(args) != 4:
        raise _refuse("LIST_SLICE without a step")
    lst, begin, end, step = args
    inner = lst.this if isinstance(lst, exp.ArraySort) else lst  # sorting keeps the length
    same_list = isinstance(end, exp.Length) and end.this.sql("duckdb") == inner.sql("duckdb")
    if _number(begin) != 1 or not same_list or not _positive_step(step):
        raise _refuse("LIST_SLICE other than from 1 to the list's length by a positive step")
    a, s = lw.expr(lst, ctx), lw.expr(step, ctx)
    if not _is_int(s.type):
        raise _refuse(f"LIST_SLICE by a step of type {s.type}")
    # Elements 1, 1 + step, ... of the list: those at a 0-based index divisible by the step
    # (Spark has no slice with a step).
    index = exp.to_identifier("_dpsql_i")
    keep = exp.EQ(
        this=exp.Mod(this=exp.column("_dpsql_i"), expression=_p(s.node)),
        expression=exp.Literal.number(0),
    )
    lam = exp.Lambda(this=keep, expressions=[exp.to_identifier("_dpsql_e"), index])
    return _E(_fn("FILTER", a.node, lam), a.type, lw.strict("LIST_SLICE", a, s))


def _hash(lw: _Lowerer, node: exp.Anonymous, ctx: _Ctx) -> tuple[_E, list[_E]]:
    """DuckDB's keyed hash, hash(a, ..., CAST($salt AS BIGINT)), as Spark's xxhash64 of the
    same arguments: a 64-bit hash keyed by the secret salt on either engine (they differ, so
    the engines keep different rows where a cap binds). Also returns the arguments."""
    args = [lw.expr(e, ctx) for e in node.expressions]
    last = node.expressions[-1] if node.expressions else None
    salted = isinstance(last, exp.Cast) and isinstance(last.this, exp.Placeholder | exp.Parameter)
    if not salted or any(
        isinstance(e.this, exp.Placeholder | exp.Parameter)
        for e in node.expressions[:-1]
        if isinstance(e, exp.Cast)
    ):
        # Unsalted, anyone could compute which rows a unit keeps.
        raise _refuse("HASH without the secret salt as its last argument")
    for a in args[:-1]:
        if a.type.startswith("?") or a.type.startswith("MAP") or a.type in ("HASH", "PARAM"):
            raise _refuse(f"HASH of a {a.type.lstrip('?')} value")
    return _E(_fn("XXHASH64", *(a.node for a in args)), "HASH"), args[:-1]


_AGGREGATE_ANON = frozenset({"FSUM", "FAVG", "_DPSQL_HISTOGRAM"})


@_handles(exp.Anonymous)
def _anonymous(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    assert isinstance(node, exp.Anonymous)
    name = node.name.upper()
    if name == "HASH":
        return _hash(lw, node, ctx)[0]
    if name == "LIST_SLICE":
        return _list_slice(lw, node, ctx)
    if name in _AGGREGATE_ANON:
        if not ctx.aggregates:
            raise _refuse(f"the aggregate {name} here")
        inner = replace(ctx, aggregates=False, windows=False, generators=False, in_try=False)
        if name == "_DPSQL_HISTOGRAM":
            return _histogram(lw, node, inner)
        return _float_sum(lw, node, inner, average=name == "FAVG")
    raise _refuse(describe(node))


def _histogram(lw: _Lowerer, node: exp.Anonymous, ctx: _Ctx) -> _E:
    """The map value -> count of one group, from the counts per value (``_histogram_rewrite``):
    sorted by value (a deterministic map), NULL values left out and NULL with no value, as
    DuckDB's HISTOGRAM."""
    value, count = (lw.expr(e, ctx) for e in node.expressions)
    entry = _case((_is_null(value.node), exp.Null()), default=_fn("STRUCT", value.node, count.node))
    entries = _fn("MAP_FROM_ENTRIES", _fn("ARRAY_SORT", _fn("COLLECT_LIST", entry)))
    none = exp.EQ(this=exp.Count(this=value.node), expression=exp.Literal.number(0))
    return _E(_case((none, exp.Null()), default=entries), f"MAP({value.type},BIGINT)")


def _float_sum(lw: _Lowerer, node: exp.Anonymous, ctx: _Ctx, average: bool) -> _E:
    """DuckDB's FSUM and FAVG: Neumaier's compensated sum (Kahan-Babuska; FAVG divides it by
    the count), a NaN or +inf with -inf giving NaN, otherwise an infinity winning, a finite sum
    that overflows staying infinite. DuckDB adds the values in the order they arrive; here they
    are added in order of magnitude (then value): a result that cannot depend on the order
    rows arrive in, so a recomputed stage gives the same, and that equals DuckDB's wherever its
    compensated sum is exact (small values first keep it so)."""
    if len(node.expressions) != 1:
        raise _refuse(f"{node.name.upper()} of several arguments")
    a = lw.expr(node.expressions[0], ctx)
    if not _is_num(a.type):
        raise _refuse(f"{node.name.upper()} of {a.type}")
    x = a.node if a.type == "DOUBLE" else _cast(a.node, "DOUBLE")
    inf, ninf = _double(_INF), _double(_NINF)
    finite = exp.Not(
        this=exp.Paren(
            this=exp.Or(this=_fn("ISNAN", x), expression=exp.EQ(this=_fn("ABS", x), expression=inf))
        )
    )
    by_size = _fn(
        "NAMED_STRUCT", exp.Literal.string("m"), _fn("ABS", x), exp.Literal.string("v"), x
    )
    values = _fn(
        "ARRAY_SORT",
        exp.Filter(this=_fn("COLLECT_LIST", by_size), expression=exp.Where(this=finite)),
    )
    s, c = exp.column("s", "_dpsql_a"), exp.column("c", "_dpsql_a")
    v = exp.column("v", "_dpsql_e")
    t = exp.Paren(this=exp.Add(this=s, expression=v))
    low = _case(
        # Past the largest double the sum stays infinite (its compensation is dropped).
        (exp.EQ(this=_fn("ABS", t), expression=inf), _double("0.0")),
        (
            exp.GTE(this=_fn("ABS", s), expression=_fn("ABS", v)),
            exp.Add(
                this=c,
                expression=exp.Paren(
                    this=exp.Add(this=exp.Paren(this=exp.Sub(this=s, expression=t)), expression=v)
                ),
            ),
        ),
        default=exp.Add(
            this=c,
            expression=exp.Paren(
                this=exp.Add(this=exp.Paren(this=exp.Sub(this=v, expression=t)), expression=s)
            ),
        ),
    )
    step = exp.Lambda(
        this=_fn("NAMED_STRUCT", exp.Literal.string("s"), t, exp.Literal.string("c"), low),
        expressions=[exp.to_identifier("_dpsql_a"), exp.to_identifier("_dpsql_e")],
    )
    zero = _double("0.0")
    start = _fn("NAMED_STRUCT", exp.Literal.string("s"), zero, exp.Literal.string("c"), zero.copy())
    finish = exp.Lambda(
        this=exp.Add(this=s.copy(), expression=c.copy()),
        expressions=[exp.to_identifier("_dpsql_a")],
    )
    total: exp.Expression = _fn("AGGREGATE", values, start, step, finish)
    if average:  # FAVG is FSUM / COUNT; an infinite or NaN sum stays what it is
        total = exp.Div(this=total, expression=_cast(exp.Count(this=x), "DOUBLE"))
    nan = _fn("BOOL_OR", _fn("ISNAN", x))
    pos = _fn("BOOL_OR", exp.EQ(this=x, expression=inf))
    neg = _fn("BOOL_OR", exp.EQ(this=x, expression=ninf))
    out = _case(
        (
            exp.EQ(this=exp.Count(this=x), expression=exp.Literal.number(0)),
            _cast(exp.Null(), "DOUBLE"),
        ),
        (
            exp.Or(this=nan, expression=exp.Paren(this=exp.And(this=pos, expression=neg))),
            _double(_NAN),
        ),
        (pos, inf),
        (neg, ninf),
        default=total,
    )
    return _E(out, "DOUBLE")


# -- aggregates, windows, UNNEST --------------------------------------------------------------


def _aggregate_ctx(ctx: _Ctx, what: str) -> _Ctx:
    if not ctx.aggregates:
        raise _refuse(f"the aggregate {what} here")
    return replace(ctx, aggregates=False, windows=False, generators=False, in_try=False)


@_handles(exp.Count)
def _count(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    inner = _aggregate_ctx(ctx, "COUNT")
    arg = node.this
    if arg is None or isinstance(arg, exp.Star):
        return _E(exp.Count(this=exp.Star()), "BIGINT", bits=63)
    if isinstance(arg, exp.Distinct):
        if len(arg.expressions) != 1:
            raise _refuse("COUNT(DISTINCT ...) of several values")
        a = lw.expr(arg.expressions[0], inner)
        if a.type.startswith("?") or a.type.startswith("MAP"):
            raise _refuse(f"COUNT(DISTINCT ...) of {a.type.lstrip('?')}")
        # Both engines count -0.0 with 0.0 and every NaN as one value.
        return _E(exp.Count(this=exp.Distinct(expressions=[a.node])), "BIGINT", bits=63)
    a = lw.expr(arg, inner)
    return _E(exp.Count(this=a.node), "BIGINT", bits=63)


def _sum_of(a: _E) -> exp.Expression:
    if _is_int(a.type):
        # DuckDB sums integers in HUGEINT; Spark's SUM of BIGINT raises past 2^63: exact
        # decimals instead.
        arg = a.node if a.type == "HUGEINT" else _cast(a.node, "HUGEINT")
        return exp.Sum(this=arg)
    # A floating SUM depends on the order of the rows on Spark; the bounded query has none.
    raise _refuse(f"SUM of {a.type} values")


@_handles(exp.Sum)
def _sum(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    inner = _aggregate_ctx(ctx, "SUM")
    if isinstance(node.this, exp.Distinct):
        raise _refuse("SUM(DISTINCT ...)")
    return _E(_sum_of(lw.expr(node.this, inner)), "HUGEINT")


@_handles(exp.Min, exp.Max)
def _min_max(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    inner = _aggregate_ctx(ctx, describe(node))
    if node.expressions:
        raise _refuse(f"{describe(node)} of several values")
    a = lw.expr(node.this, inner)
    if a.type.startswith("?") or a.type.startswith("LIST") or a.type.startswith("MAP"):
        raise _refuse(f"{describe(node)} of {a.type.lstrip('?')}")
    # Both engines order NaN above every number and text by its bytes.
    return _E(node.__class__(this=a.node), a.type)


def _not_null_test(cond: exp.Expression, value: exp.Expression) -> bool:
    """Whether the FILTER ``cond`` keeps only rows where ``value`` is not NULL."""
    while isinstance(cond, exp.Paren):
        cond = cond.this
    if isinstance(cond, exp.And):
        return _not_null_test(cond.this, value) or _not_null_test(cond.expression, value)
    target = value.sql("duckdb")
    if isinstance(cond, exp.Not) and isinstance(cond.this, exp.Is):
        inner = cond.this
        return isinstance(inner.expression, exp.Null) and inner.this.sql("duckdb") == target
    return False


@_handles(exp.Filter)
def _filter(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    where = node.expression
    assert isinstance(where, exp.Where)
    agg = node.this
    inner = _aggregate_ctx(ctx, "FILTER")
    cond = lw.boolean(where.this, inner, "FILTER")
    if isinstance(agg, exp.ArrayAgg):
        distinct = isinstance(agg.this, exp.Distinct)
        value = agg.this.expressions[0] if distinct else agg.this
        if distinct and len(agg.this.expressions) != 1:
            raise _refuse("ARRAY_AGG(DISTINCT ...) of several values")
        if not _not_null_test(where.this, value):
            # Spark's collect_list drops NULLs, DuckDB's list keeps them.
            raise _refuse("ARRAY_AGG without a FILTER that drops NULL values")
        a = lw.expr(value, inner)
        if a.type.startswith("?") or a.type.startswith("LIST") or a.type.startswith("MAP"):
            raise _refuse(f"ARRAY_AGG of {a.type.lstrip('?')}")
        collected: exp.Expression = exp.Filter(
            this=_fn("COLLECT_LIST", a.node), expression=exp.Where(this=cond.node)
        )
        if distinct:
            # array_distinct counts -0.0 with 0.0 and every NaN as one value, as DuckDB's
            # list(DISTINCT ...) does (collect_set keeps two NaNs).
            collected = _fn("ARRAY_DISTINCT", collected)
        # Sorted: the list's order cannot depend on the order rows arrive in (DuckDB's list
        # order is arbitrary too; what reads it sorts it or counts it).
        listed = _fn("ARRAY_SORT", collected)
        # DuckDB's list of no rows is NULL, Spark's an empty array.
        none = exp.EQ(
            this=exp.Filter(
                this=exp.Count(this=exp.Star()), expression=exp.Where(this=cond.node.copy())
            ),
            expression=exp.Literal.number(0),
        )
        return _E(_case((none, exp.Null()), default=listed), f"LIST({a.type})")
    lowered = lw.expr(agg, ctx)
    if not isinstance(lowered.node, exp.Count | exp.Sum | exp.Min | exp.Max):
        raise _refuse(f"FILTER on {describe(agg)}")
    return _E(exp.Filter(this=lowered.node, expression=exp.Where(this=cond.node)), lowered.type)


@_handles(exp.ArrayAgg)
def _array_agg(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    raise _refuse("ARRAY_AGG without a FILTER that drops NULL values")


@_handles(exp.ArgMin)
def _arg_min(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    inner = _aggregate_ctx(ctx, "ARG_MIN")
    order = node.expression
    if not (isinstance(order, exp.Anonymous) and order.name.upper() == "HASH"):
        raise _refuse("ARG_MIN by anything but the keyed hash")
    a = lw.expr(node.this, inner)
    hashed, _ = _hash(lw, order, inner)
    if a.type.startswith("?") or a.type.startswith("LIST") or a.type.startswith("MAP"):
        raise _refuse(f"ARG_MIN of {a.type.lstrip('?')}")
    # DuckDB's arg_min skips rows whose value is NULL; ties of the hash are broken by the value
    # itself, so the order is total and the pick cannot depend on the order rows arrive in.
    key = _case((_is_null(a.node), exp.Null()), default=_fn("STRUCT", hashed.node, a.node))
    return _E(_fn("MIN_BY", a.node, key), a.type)


@_handles(exp.Explode)
def _unnest(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    if not ctx.generators:
        raise _refuse("UNNEST outside the SELECT list")
    a = lw.expr(node.this, replace(ctx, generators=False, aggregates=False, windows=False))
    # One row per element; none for a NULL or empty list, on both engines.
    return _E(exp.Explode(this=a.node), _elem(a.type))


def _ordered(lw: _Lowerer, item: exp.Ordered, ctx: _Ctx) -> tuple[exp.Ordered, _E]:
    a = lw.expr(item.this, ctx)
    desc = bool(item.args.get("desc"))
    nulls_first = item.args.get("nulls_first")
    if nulls_first is None:
        nulls_first = False  # DuckDB's default: NULLS LAST, ascending or descending
    # Spark's default is NULLS FIRST ascending: DuckDB's order is spelled out.
    return exp.Ordered(this=a.node, desc=desc, nulls_first=bool(nulls_first)), a


@_handles(exp.Window)
def _window(lw: _Lowerer, node: exp.Expression, ctx: _Ctx) -> _E:
    if not ctx.windows:
        raise _refuse("a window function here")
    if node.args.get("alias") or node.args.get("first") is not None:
        raise _refuse("a named window")
    row_ctx = replace(ctx, aggregates=False, windows=False, generators=False, in_try=False)
    func = node.this
    if isinstance(func, exp.RowNumber):
        call: exp.Expression = exp.RowNumber()
        result = "BIGINT"
    elif isinstance(func, exp.Sum) and not isinstance(func.this, exp.Distinct):
        call = _sum_of(lw.expr(func.this, row_ctx))
        result = "HUGEINT"
    else:
        raise _refuse(f"the window function {describe(func)}")
    partition = [lw.expr(p, row_ctx) for p in node.args.get("partition_by") or []]
    order = node.args.get("order")
    items = list(order.expressions) if order is not None else []
    if not items or not (
        isinstance(items[0].this, exp.Anonymous) and items[0].this.name.upper() == "HASH"
    ):
        # Only the keyed hash makes a unit's ranking a function of its own rows; anything
        # else could tie, and ties are broken arbitrarily (differently by a recomputed stage).
        raise _refuse("a window not ordered by the keyed hash")
    lowered = [_ordered(lw, item, row_ctx)[0] for item in items]
    _, hash_args = _hash(lw, items[0].this, row_ctx)
    seen = {o.this.sql(dialect=_SparkOut) for o in lowered} | {
        p.node.sql(dialect=_SparkOut) for p in partition
    }
    for arg in hash_args:
        text = arg.node.sql(dialect=_SparkOut)
        if text not in seen:
            # The hash's own arguments break its ties: rows that still tie are identical in
            # every column the ranking reads, so the order is total.
            lowered.append(exp.Ordered(this=arg.node.copy(), desc=False, nulls_first=False))
            seen.add(text)
    spec = node.args.get("spec")
    out = exp.Window(
        this=call,
        partition_by=[p.node for p in partition],
        order=exp.Order(expressions=lowered),
        over="OVER",
    )
    if spec is not None:
        if str(spec.args.get("kind") or "").upper() != "ROWS":
            # A RANGE frame groups peers: ties again.
            raise _refuse("a window frame other than ROWS")
        out.set(
            "spec",
            exp.WindowSpec(
                **{
                    k: (v.copy() if isinstance(v, exp.Expression) else v)
                    for k, v in spec.args.items()
                }
            ),
        )
    return _E(out, result)


# -- the output and its checks ----------------------------------------------------------------


def _function_name(node: exp.Expression) -> str:
    if isinstance(node, exp.Anonymous):
        return node.name.upper()
    if isinstance(node, exp.Func):
        return node.sql_name().upper()
    return ""


def _enclosing(node: exp.Expression) -> exp.Expression | None:
    """The function applied to ``node``'s value (past a FILTER clause or parentheses)."""
    parent = node.parent
    while isinstance(parent, exp.Filter | exp.Paren):
        parent = parent.parent
    return parent if isinstance(parent, exp.Expression) else None


def _check_deterministic(tree: exp.Expression) -> None:
    """Every function in the output is deterministic, and every collected list is sorted
    (``collect_list`` lists rows in the order they arrive)."""
    for node in tree.walk():
        assert isinstance(node, exp.Expression)
        name = _function_name(node)
        if name in _NONDETERMINISTIC or isinstance(node, exp.Rand | exp.Randn | exp.Uuid):
            raise _refuse(f"the non-deterministic function {name}")
        if name in _UNORDERED:
            parent = _enclosing(node)
            if parent is not None and _function_name(parent) == "ARRAY_DISTINCT":
                parent = _enclosing(parent)
            if parent is None or _function_name(parent) != "ARRAY_SORT":
                raise _refuse(f"{name} outside a sort")


@functools.lru_cache(maxsize=256)
def _lower_cached(sql: str, catalog: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]) -> str:
    try:
        tree = sqlglot.parse_one(sql, read="duckdb")
    except sqlglot.errors.ParseError:
        raise _refuse("a bounded query sqlglot cannot read") from None
    except RecursionError:
        raise _refuse("a query nested this deeply") from None
    if not isinstance(tree, exp.Select | exp.Union):
        raise _refuse("a bounded query that is not a SELECT")
    tree = reshape(tree)
    lowerer = _Lowerer({t: dict(cols) for t, cols in catalog})
    try:
        out, _ = lowerer.query(tree, {})
        # A copy: the lowering shares subtrees between its rewrites (x in x IS NULL OR ...);
        # copied, every node has its own parent, as the check below reads them.
        out = out.copy()
        _check_deterministic(out)
        return out.sql(dialect=_SparkOut, pretty=True)
    except RecursionError:
        raise _refuse("a query nested this deeply") from None


def lower(sql: str, catalog: Mapping[str, Mapping[str, str]]) -> str:
    """The Spark SQL of a bounded query: ``sql`` as dpsql generates it (``plan.engine_sql``,
    DuckDB's dialect, the salt as ``$salt``), ``catalog`` the tables' columns and DuckDB types.
    The result runs as ``spark.sql(text, args={"salt": salt})``; it raises
    ``NotSupportedOnEngineError`` for a construct it cannot lower with the same guarantees."""
    key = tuple(
        (t.lower(), tuple((c.lower(), str(ty)) for c, ty in cols.items()))
        for t, cols in catalog.items()
    )
    return _lower_cached(sql, key)
