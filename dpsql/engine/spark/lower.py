"""Lowering of dpsql's bounded query (DuckDB SQL) to Spark SQL with the same totals.

The bounded query (``dpsql.bound.rewrite``) is written for DuckDB. ``lower`` rewrites its tree,
node by node from an allow-list (the dispatch table of ``handlers``, read by ``lowerer``), into
Spark SQL that returns the same pre-noise totals, with the guarantees the privacy argument rests
on (docs/engines.md):

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
  ROUND, ISNAN of NULL, date_trunc's result type, list_slice with a step, ...) are spelled out;
- speed, with the same rows: before lowering, ``shape.reshape`` ranks every unit in one
  window where DuckDB's form splits off the units within the cap, and writes literal key
  domains as IN lists.

Anything else raises ``NotSupportedOnEngineError`` naming the construct. ``lower`` is a pure
function of its inputs, kept in a small cache keyed by the text and the catalog.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import sqlglot
from sqlglot import exp

from dpsql.engine.spark.dialect import SparkOut, refuse
from dpsql.engine.spark.lowerer import Lowerer
from dpsql.engine.spark.shape import reshape

__all__ = ["lower"]


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
            raise refuse(f"the non-deterministic function {name}")
        if name in _UNORDERED:
            parent = _enclosing(node)
            if parent is not None and _function_name(parent) == "ARRAY_DISTINCT":
                parent = _enclosing(parent)
            if parent is None or _function_name(parent) != "ARRAY_SORT":
                raise refuse(f"{name} outside a sort")


@functools.lru_cache(maxsize=256)
def _lower_cached(sql: str, catalog: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]) -> str:
    try:
        tree = sqlglot.parse_one(sql, read="duckdb")
    except sqlglot.errors.ParseError:
        raise refuse("a bounded query sqlglot cannot read") from None
    except RecursionError:
        raise refuse("a query nested this deeply") from None
    if not isinstance(tree, exp.Select | exp.Union):
        raise refuse("a bounded query that is not a SELECT")
    tree = reshape(tree)
    lowerer = Lowerer({t: dict(cols) for t, cols in catalog})
    try:
        out, _ = lowerer.query(tree, {})
        # A copy: the lowering shares subtrees between its rewrites (x in x IS NULL OR ...);
        # copied, every node has its own parent, as the check below reads them.
        out = out.copy()
        _check_deterministic(out)
        return out.sql(dialect=SparkOut, pretty=True)
    except RecursionError:
        raise refuse("a query nested this deeply") from None


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
