"""Post-processing: from the noisy measurements to the released table.

Everything after the noise is post-processing of noisy values (DESIGN.md section 2): partition
selection's threshold, AVG = m + noisy centred sum / noisy count, clamping an average to its
bounds, a count (or a sum of values bounded at or above 0) shown at 0 or above, the output
expressions, HAVING, ORDER BY and LIMIT. These run in a scratch in-memory DuckDB that holds only
noisy values and released keys, never the private rows.

Each aggregate's values and half-widths are computed by its kind's estimator
(``dpsql.plan.aggregates``), and a total is scaled to the whole table on a sample when asked
(``_estimates``); this module holds that, the released table, the scratch database, the
post-processing SQL and its check before the charge, and the accuracy columns.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np
from sqlglot import exp

from dpsql.errors import CHECK_OUT_OF_MEMORY, EngineError, UnsupportedQueryError
from dpsql.noise.measure import Noisy, measure
from dpsql.plan.aggregates.registry import rule_of
from dpsql.plan.plans import Estimate, Plan
from dpsql.release.cells import (
    ACCURACY_SUFFIX,
    INTERVAL_SUFFIX,
    NOISE_SUFFIX,
    Accuracy,
    accuracy_columns,
    accuracy_of,
    bare_aggregates,
    mostly_noise,
)
from dpsql.sql.parse import DIALECT
from dpsql.sql.totality import total

__all__ = [
    "ACCURACY_SUFFIX",
    "INTERVAL_SUFFIX",
    "NOISE_SUFFIX",
    "Accuracy",
    "Release",
    "accuracy_columns",
    "check_post_processing",
    "mostly_noise",
    "publish",
]


def _sql(node: Any) -> str:
    """Print a tree of its own (every caller passes a new one from ``total``), uncopied."""
    return str(node.sql(dialect=DIALECT, copy=False))


@dataclass(frozen=True)
class Release:
    """The released table: column names and DuckDB types, rows, per-cell accuracy."""

    columns: tuple[str, ...]
    types: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    accuracy: tuple[tuple[Accuracy, ...], ...]
    confidence: float
    # Per cell: the value is mostly noise (``mostly_noise``); False where no ± is known.
    noise: tuple[tuple[bool, ...], ...] = ()


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
    select += [
        f"_a{i}_{end}" if i is not None else "NULL" for i in hw_columns for end in ("lo", "hi")
    ]
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


def _typed_keys(plan: Plan) -> str:
    """The released table with each public key cast to the type the engine gave its
    expression, the type the post-processing check binds it in (``check_post_processing``):
    the registered Python values would otherwise be typed by their values (a BIGINT key of
    small values as INTEGER), or as text after a durable cache's round trip."""
    keys = plan.analysis.keys
    checked = plan.key_types or ()
    types = [
        key.engine_type or (checked[i] if i < len(checked) else None) for i, key in enumerate(keys)
    ]
    # A private key is cast too, to the type the check bound it in: with no group released its
    # column is empty, and an empty column has no type (YEAR(k) would not bind).
    casts = ", ".join(f"CAST(_k{i} AS {t}) AS _k{i}" for i, t in enumerate(types) if t)
    if not casts:
        return "_released"
    return f"(SELECT * REPLACE ({casts}) FROM _released)"


_PUBLISHED: dict[int, tuple[Plan, str]] = {}  # id(plan) -> (plan, its SQL), oldest first
_MAX_PUBLISHED = 256


def _published_sql(plan: Plan) -> str:
    """The post-processing SQL of ``plan`` over its released table: a pure function of the
    plan, kept by identity (printing it takes sqlglot a few tenths of a millisecond; a plan
    is a large tree to hash)."""
    kept = _PUBLISHED.get(id(plan))
    if kept is not None and kept[0] is plan:
        return kept[1]
    sql = _post_sql(plan, bare_aggregates(plan))
    sql = sql.replace("FROM _noisy", f"FROM {_typed_keys(plan)} AS _noisy", 1)
    if len(_PUBLISHED) >= _MAX_PUBLISHED:
        _PUBLISHED.pop(next(iter(_PUBLISHED)), None)
    _PUBLISHED[id(plan)] = (plan, sql)
    return sql


_TYPED: dict[str, None] = {}  # post-processing texts that bound, oldest first
_MAX_TYPED = 1024


def check_post_processing(plan: Plan, key_types: list[str]) -> None:
    """Bind the post-processing SQL over an empty table of the right types, before the charge.

    A query whose outputs, HAVING or ORDER BY cannot be typed (say, UPPER of a count) is then
    rejected for free instead of failing after its charge.
    """
    if _picks_only(plan):
        # Columns picked by name, sorted and sliced: nothing in it can fail to bind.
        return
    columns = [f"CAST(NULL AS {t}) AS _k{i}" for i, t in enumerate(key_types)]
    for i, est in enumerate(plan.estimates):
        exact = (
            rule_of(est.kind).exact
            and plan.measurements[est.measurements[0]].unit == 1
            and _scaled(plan, est) is None  # a total scaled by 1/q is a DOUBLE
        )
        columns.append(f"CAST(NULL AS {'BIGINT' if exact else 'DOUBLE'}) AS _a{i}")
        columns.append(f"CAST(NULL AS DOUBLE) AS _a{i}_hw")
        columns.append(f"CAST(NULL AS DOUBLE) AS _a{i}_lo")
        columns.append(f"CAST(NULL AS DOUBLE) AS _a{i}_hi")
    sql = _post_sql(plan, bare_aggregates(plan))
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


def _scaled(plan: Plan, estimate: Estimate) -> float | None:
    """1/q for a total released as an estimate of the whole table from a sample at rate q
    (``SET dpsql.sample_scale = on``), else None. Post-processing of the noisy total."""
    if plan.sample is None or not plan.options.sample_scale or not rule_of(estimate.kind).total:
        return None
    return 1.0 / float(plan.sample.rate)


def _estimates(
    plan: Plan, noisy: list[list[int]], confidence: float
) -> tuple[list[Any], list[Any], list[Any]]:
    """Each aggregate's released values, half-widths and intervals (lows, highs; NaN where it
    has none) over the released groups, by its kind's rule; a total on a sample, with its
    half-width, times 1/q when asked."""
    values: list[Any] = []
    widths: list[Any] = []
    intervals: list[Any] = []
    for est in plan.estimates:
        rule = rule_of(est.kind)
        value, width = rule.estimator(est, plan.measurements, noisy, confidence)
        n = len(np.asarray(width))
        if rule.interval is not None:
            intervals.append(rule.interval(est, plan.measurements, noisy))
        else:
            intervals.append((np.full(n, np.nan), np.full(n, np.nan)))
        factor = _scaled(plan, est)
        if factor is not None:
            value, width = np.asarray(value, dtype=np.float64) * factor, width * factor
        if rule.nonnegative(est):
            value = _at_least_zero(value)
        values.append(value)
        widths.append(width)
    return values, widths, intervals


def _at_least_zero(value: Any) -> Any:
    """A count's (or a sum of values bounded at or above 0) published estimate, shown at 0 or
    above: post-processing of the noisy value (DESIGN.md section 2), which never widens the
    error (the truth is at or above 0). Only what is published: the ledger, the cache, derived
    answers, combinations and workload fits read the noisy measurements, unclamped. NaN stays."""
    array = np.asarray(value)
    if array.dtype == object:  # integers past 64 bits
        return np.array([v if v is None or v >= 0 else type(v)(0) for v in array], dtype=object)
    return np.where(array < 0, np.zeros_like(array), array)


def publish(plan: Plan, noisy: Noisy) -> Release:
    """Post-processing only: estimates, accuracy, outputs, HAVING, ORDER BY, LIMIT."""
    confidence = plan.options.confidence
    values, widths, intervals = _estimates(plan, [list(c) for c in noisy.totals], confidence)
    for i in noisy.derived:
        widths[i] = np.full(len(noisy.keys[0]) if noisy.keys else 1, np.nan)
    direct = _direct(plan, noisy.keys, values, widths, intervals)
    if direct is not None:
        return direct
    table: dict[str, Any] = {
        f"_k{i}": np.array(col, dtype=object) for i, col in enumerate(noisy.keys)
    }
    for i, (value, width) in enumerate(zip(values, widths, strict=True)):
        table[f"_a{i}"] = value
        table[f"_a{i}_hw"] = width
        table[f"_a{i}_lo"], table[f"_a{i}_hi"] = intervals[i]
    scratch = _scratch().cursor()
    try:
        scratch.register("_released", table)
        cursor = scratch.execute(_published_sql(plan))
        description = cursor.description or []
        out = cursor.fetchall()
    except duckdb.Error:
        raise EngineError("post-processing of the noisy values failed; the charge stands") from None
    finally:
        scratch.close()
    n_out = len(plan.analysis.outputs)
    rows = tuple(tuple(r[:n_out]) for r in out)
    accuracy = tuple(
        tuple(
            accuracy_of(w, r[2 * n_out + 2 * j], r[2 * n_out + 2 * j + 1])
            for j, w in enumerate(r[n_out : 2 * n_out])
        )
        for r in out
    )
    return Release(
        columns=tuple(o.name for o in plan.analysis.outputs),
        types=tuple(str(d[1]) for d in description[:n_out]),
        rows=rows,
        accuracy=_known(accuracy),
        confidence=confidence,
        noise=_flags(plan, rows, accuracy),
    )


# Key types whose released Python values sort in Python as DuckDB sorts them (text by code
# point, which is UTF-8's byte order; integers, booleans and dates by value), with the Python
# type each holds. Floating keys (NaN, -0.0) and the rest go through the scratch database.
_DIRECT_KEYS: dict[str, tuple[type, ...]] = {
    "VARCHAR": (str,),
    "BOOLEAN": (bool,),
    "TINYINT": (int,),
    "SMALLINT": (int,),
    "INTEGER": (int,),
    "BIGINT": (int,),
    "DATE": (dt.date,),
}


def _column(node: exp.Expression) -> tuple[str, int] | None:
    """("k", i) or ("a", i) when ``node`` is exactly the column _k{i} or _a{i}."""
    if not isinstance(node, exp.Column) or node.table:
        return None
    name = node.name
    if len(name) > 2 and name[:2] in ("_k", "_a") and name[2:].isdigit():
        return name[1], int(name[2:])
    return None


def _picks_only(plan: Plan) -> bool:
    """Post-processing that only picks key and aggregate columns, sorts and slices."""
    a = plan.analysis
    return (
        a.having is None
        and all(_column(o.expr) is not None for o in a.outputs)
        and all(_column(o.this) is not None for o in a.order)
    )


def _direct(
    plan: Plan,
    keys: tuple[tuple[Any, ...], ...],
    values: list[Any],
    widths: list[Any],
    intervals: list[Any],
) -> Release | None:
    """The release computed in Python where the post-processing only picks columns, sorts and
    slices (no expression, no HAVING): the same columns, types, rows, order and half-widths as
    the scratch database gives (``tests/release/test_publish_direct.py`` compares the two), without
    its one to two milliseconds. None where it does not apply."""
    a = plan.analysis
    if not _picks_only(plan):
        return None
    picked = [_column(o.expr) for o in a.outputs]
    ordered = [_column(o.this) for o in a.order]
    types: dict[tuple[str, int], str] = {}
    for i, key in enumerate(a.keys):
        allowed = _DIRECT_KEYS.get(key.engine_type or "")
        if allowed is None:
            return None
        for v in keys[i]:
            # bool is an int in Python, datetime a date: neither may pass for the other.
            if v is not None and (type(v) not in allowed):
                return None
        types["k", i] = str(key.engine_type)
    columns: dict[tuple[str, int], list[Any]] = {("k", i): list(c) for i, c in enumerate(keys)}
    for i, value in enumerate(values):
        if value.dtype == np.int64:
            types["a", i] = "BIGINT"
            columns["a", i] = [int(v) for v in value]
        elif value.dtype == np.float64:
            types["a", i] = "DOUBLE"
            columns["a", i] = [float(v) for v in value]
        else:  # integers past 64 bits, or a histogram: typed by the scratch database
            return None
    n = len(keys[0]) if keys else (len(values[0]) if values else 1)
    order = list(range(n))
    # Stable sorts from the last sort key to the first: ORDER BY's items, then every key.
    steps = [
        (p, bool(o.args.get("desc")), o.args.get("nulls_first"))
        for p, o in zip(ordered, a.order, strict=True)
    ]
    steps += [(("k", i), False, False) for i in range(len(a.keys))]
    for column, desc, nulls_first in reversed(steps):
        assert column is not None
        data = columns[column]
        present = [r for r in order if data[r] is not None]
        absent = [r for r in order if data[r] is None]
        # Without NaN a column's values are their own order (_sort_key's (0, v) sorts as v).
        nan = any(type(v) is float and math.isnan(v) for v in data)
        ranks = [_sort_key(v) for v in data] if nan else data
        present.sort(key=ranks.__getitem__, reverse=desc)
        # DuckDB's default: NULLS LAST whatever the direction (sqlglot spells it out).
        order = absent + present if nulls_first else present + absent
    if a.offset is not None:
        order = order[a.offset :]
    if a.limit is not None:
        order = order[: a.limit]
    hw = bare_aggregates(plan)
    rows = tuple(tuple(columns[p][r] for p in picked if p is not None) for r in order)
    accuracy = tuple(
        tuple(
            None if i is None else accuracy_of(widths[i][r], intervals[i][0][r], intervals[i][1][r])
            for i in hw
        )
        for r in order
    )
    return Release(
        columns=tuple(o.name for o in a.outputs),
        types=tuple(types[p] for p in picked if p is not None),
        rows=rows,
        accuracy=_known(accuracy),
        confidence=plan.options.confidence,
        noise=_flags(plan, rows, accuracy),
    )


def _sort_key(value: Any) -> Any:
    """DuckDB's order of a DOUBLE: NaN after every number (+inf included)."""
    if isinstance(value, float) and math.isnan(value):
        return (1, 0.0)
    return (0, value) if isinstance(value, float) else value


def _known(accuracy: tuple[tuple[Accuracy, ...], ...]) -> tuple[tuple[Accuracy, ...], ...]:
    """The published accuracy: an infinite half-width (no valid interval exists, e.g. a CORR
    whose variances may be 0 within the noise) is released as no ±; its cell is flagged as
    mostly noise (``_flags`` reads the infinite one)."""
    return tuple(
        tuple(None if isinstance(w, float) and w == math.inf else w for w in row)
        for row in accuracy
    )


def _flags(
    plan: Plan, rows: tuple[tuple[Any, ...], ...], accuracy: tuple[tuple[Accuracy, ...], ...]
) -> tuple[tuple[bool, ...], ...]:
    """``mostly_noise`` of each published cell (False for a key or an expression's value)."""
    bounds = [
        None if i is None else rule_of(plan.estimates[i].kind).bounds(plan.estimates[i])
        for i in bare_aggregates(plan)
    ]
    return tuple(
        tuple(mostly_noise(v, w, b) for v, w, b in zip(row, widths, bounds, strict=True))
        for row, widths in zip(rows, accuracy, strict=True)
    )


def release(plan: Plan, rows: list[tuple[Any, ...]]) -> Release:
    """Add noise to the bounded totals and post-process; the charge was committed before."""
    return publish(plan, measure(plan, rows))
