"""The Spark SQL dialect the lowering prints (``SparkOut``), and the error of a construct it
refuses (``refuse``).
"""

from __future__ import annotations

from sqlglot import exp
from sqlglot.dialects.spark import Spark
from sqlglot.generator import Generator

from dpsql.errors import NotSupportedOnEngineError


def _ordered_sql(generator: Generator, node: exp.Ordered) -> str:
    # Spark sorts NULLs first ascending, DuckDB last: every order states where NULLs go.
    direction = "DESC" if node.args.get("desc") else "ASC"
    nulls = "FIRST" if node.args.get("nulls_first") else "LAST"
    return f"{generator.sql(node, 'this')} {direction} NULLS {nulls}"


class SparkOut(Spark):
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


def refuse(what: str) -> NotSupportedOnEngineError:
    return NotSupportedOnEngineError(f"{what} is not supported on Spark")
