"""Post-processing: from the noisy measurements to the released table.

Everything after the noise is post-processing of noisy values (DESIGN.md section 2): partition
selection's threshold, AVG = m + noisy centred sum / noisy count, clamping an average to its
bounds, the output expressions, HAVING, ORDER BY and LIMIT. These run in a scratch in-memory
DuckDB that holds only noisy values and released keys, never the private rows.

The estimates and their half-widths are computed in ``release_estimates``; this module holds
the released table, the scratch database, the post-processing SQL and its check before the
charge, and the accuracy columns.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np
from sqlglot import exp

from dpsql.errors import CHECK_OUT_OF_MEMORY, EngineError, ParameterError, UnsupportedQueryError
from dpsql.noise.release_estimates import TOTALS, _estimates, scaled
from dpsql.plan.planner import Plan
from dpsql.sql.parse import DIALECT
from dpsql.sql.totality import total

__all__ = [
    "ACCURACY_SUFFIX",
    "Noisy",
    "Release",
    "accuracy_columns",
    "check_post_processing",
    "publish",
]


def _sql(node: Any) -> str:
    """Print a tree of its own (every caller passes a new one from ``total``), uncopied."""
    return str(node.sql(dialect=DIALECT, copy=False))


@dataclass(frozen=True)
class Release:
    """The released table: column names and DuckDB types, rows, per-cell half-widths."""

    columns: tuple[str, ...]
    types: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    accuracy: tuple[tuple[float | None, ...], ...]
    confidence: float


@functools.cache
def _scratch() -> duckdb.DuckDBPyConnection:
    """One empty in-memory database for post-processing; each release uses its own cursor.

    Opening a DuckDB database costs ~17 ms; a cursor on an open one, under 1 ms. It holds no
    private data: only the noisy values registered by each cursor, dropped when it closes.
    """
    return duckdb.connect(":memory:")


def _post_sql(plan: Plan, hw_columns: list[int | None]) -> str:
    a = plan.analysis
    # TRY: an expression over noisy values (say, a division by a noisy zero) must not fail.
    select = [
        f'{_sql(total(o.expr))} AS "{o.name.replace(chr(34), chr(34) * 2)}"' for o in a.outputs
    ]
    select += [f"_a{i}_hw" if i is not None else "NULL" for i in hw_columns]
    sql = f"SELECT {', '.join(select)} FROM _noisy"
    if a.having is not None:
        sql += f" WHERE {_sql(total(a.having))} IS TRUE"
    # Released rows are sorted by key before any LIMIT: a hash aggregate's order would
    # otherwise depend on the data (DESIGN.md section 5).
    order = [
        exp.Ordered(
            this=total(o.this), desc=o.args.get("desc"), nulls_first=o.args.get("nulls_first")
        ).sql(DIALECT)
        for o in a.order
    ] + [f"_k{i} ASC NULLS LAST" for i in range(len(a.keys))]
    if order:
        sql += " ORDER BY " + ", ".join(order)
    if a.limit is not None:
        sql += f" LIMIT {a.limit}"
    if a.offset is not None:
        sql += f" OFFSET {a.offset}"
    return sql


_TYPED: dict[str, None] = {}  # post-processing texts that bound, oldest first
_MAX_TYPED = 1024


def check_post_processing(plan: Plan, key_types: list[str]) -> None:
    """Bind the post-processing SQL over an empty table of the right types, before the charge.

    A query whose outputs, HAVING or ORDER BY cannot be typed (say, UPPER of a count) is then
    rejected for free instead of failing after its charge.
    """
    columns = [f"CAST(NULL AS {t}) AS _k{i}" for i, t in enumerate(key_types)]
    for i, est in enumerate(plan.estimates):
        exact = (
            est.kind in TOTALS
            and plan.measurements[est.measurements[0]].unit == 1
            and scaled(plan, est) is None  # a total scaled by 1/q is a DOUBLE
        )
        columns.append(f"CAST(NULL AS {'BIGINT' if exact else 'DOUBLE'}) AS _a{i}")
        columns.append(f"CAST(NULL AS DOUBLE) AS _a{i}_hw")
    sql = _post_sql(plan, _bare_aggregate(plan))
    empty = f"(SELECT {', '.join(columns)} WHERE false) AS _noisy"
    text = "DESCRIBE " + sql.replace("FROM _noisy", f"FROM {empty}", 1)
    # The text reads an empty table of literal types only: its outcome is a function of the
    # text, so a passed check is kept (texts differing only in WHERE share it).
    if text in _TYPED:
        return
    cursor = _scratch().cursor()
    try:
        cursor.execute(text).fetchall()
    except duckdb.OutOfMemoryException:
        # Over an empty table: the memory ran out in this process, whatever the data.
        raise UnsupportedQueryError(CHECK_OUT_OF_MEMORY) from None
    except duckdb.Error:
        raise UnsupportedQueryError(
            "an output, HAVING or ORDER BY expression cannot be typed over the aggregates"
        ) from None
    finally:
        cursor.close()
    if len(_TYPED) >= _MAX_TYPED:
        _TYPED.pop(next(iter(_TYPED)), None)
    _TYPED[text] = None


ACCURACY_SUFFIX = " ±"


def accuracy_columns(plan: Plan) -> list[tuple[int, str]]:
    """For ``SET dpsql.accuracy_columns = on``: (output index, column name) of the half-width
    column added after each output that is exactly an aggregate (``<name> ±``). A name that
    would repeat a result column's (or another one's), in any letter case, is refused before
    the charge (``ParameterError``)."""
    names = [o.name for o in plan.analysis.outputs]
    extra = [
        (i, names[i] + ACCURACY_SUFFIX)
        for i, agg in enumerate(_bare_aggregate(plan))
        if agg is not None
    ]
    seen: set[str] = set()
    for name in [*names, *(n for _, n in extra)]:
        if name.lower() in seen:
            raise ParameterError(
                f"the accuracy column {name!r} would repeat a column name of the result; "
                "rename that column or SET dpsql.accuracy_columns = off"
            )
        seen.add(name.lower())
    return extra


def _bare_aggregate(plan: Plan) -> list[int | None]:
    """For each output, the aggregate it is exactly (alias aside), else None."""
    result: list[int | None] = []
    for o in plan.analysis.outputs:
        name = o.expr.name if o.expr.key == "column" else ""
        result.append(int(name[2:]) if name.startswith("_a") else None)
    return result


@dataclass(frozen=True)
class Noisy:
    """The released noisy measurements: group keys (one tuple per column) and, per measurement,
    the noisy integer total of each released group. This is what a cache keeps: everything
    after it is post-processing. ``derived`` lists the estimates computed from other
    measurements than their own (their half-width is not known)."""

    keys: tuple[tuple[Any, ...], ...]
    totals: tuple[tuple[int, ...], ...]
    derived: frozenset[int] = frozenset()
    # The noisy histogram of the diagnosis, one count per flag pattern (None: not diagnosed).
    diagnosis: tuple[int, ...] | None = None


def publish(plan: Plan, noisy: Noisy) -> Release:
    """Post-processing only: estimates, accuracy, outputs, HAVING, ORDER BY, LIMIT."""
    confidence = plan.options.confidence
    values, widths = _estimates(plan, [list(c) for c in noisy.totals], confidence)
    for i in noisy.derived:
        widths[i] = np.full(len(noisy.keys[0]) if noisy.keys else 1, np.nan)
    table: dict[str, Any] = {
        f"_k{i}": np.array(col, dtype=object) for i, col in enumerate(noisy.keys)
    }
    for i, (value, width) in enumerate(zip(values, widths, strict=True)):
        table[f"_a{i}"] = value
        table[f"_a{i}_hw"] = width
    hw_columns = _bare_aggregate(plan)
    scratch = _scratch().cursor()
    try:
        scratch.register("_noisy", table)
        cursor = scratch.execute(_post_sql(plan, hw_columns))
        description = cursor.description or []
        out = cursor.fetchall()
    except duckdb.Error:
        raise EngineError("post-processing of the noisy values failed; the charge stands") from None
    finally:
        scratch.close()
    n_out = len(plan.analysis.outputs)
    return Release(
        columns=tuple(o.name for o in plan.analysis.outputs),
        types=tuple(str(d[1]) for d in description[:n_out]),
        rows=tuple(tuple(r[:n_out]) for r in out),
        accuracy=tuple(tuple(_width(w) for w in r[n_out:]) for r in out),
        confidence=confidence,
    )


def _width(value: Any) -> float | None:
    """NaN marks an unknown half-width (a derived estimate); it is reported as None."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return float(value)
