"""Noisy values and post-processing: from the bounded totals to the released table.

Everything after the noise is post-processing of noisy values (DESIGN.md section 2): partition
selection's threshold, AVG = m + noisy centred sum / noisy count, clamping an average to its
bounds, the output expressions, HAVING, ORDER BY and LIMIT. These run in a scratch in-memory
DuckDB that holds only noisy values and released keys, never the private rows.

Accuracy: each output that is a bare aggregate gets the half-width of a confidence interval
that covers the noise only (not the bias of clamping and contribution bounds), computed from
the discrete distribution actually sampled. Counts and sums: the exact discrete Laplace or
discrete Gaussian quantile. AVG: the box [sum ± k1] x [count ± k2], each at confidence
sqrt(c), which covers both independent noises with probability at least c; the half-width is
the larger distance from the estimate to the ends of the ratio's range over the box (clamped to
the bounds). VARIANCE and STDDEV (``_spread``): no interval is reported (accuracy None).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np
import numpy.typing as npt
from sqlglot import exp

from dpsql.errors import BoundsError, EngineError, UnsupportedQueryError
from dpsql.noise.samplers import (
    MAX_SCALE,
    MAX_SIGMA2,
    discrete_gaussian,
    discrete_gaussian_half_width,
    discrete_laplace,
    discrete_laplace_half_width,
)
from dpsql.plan.planner import Estimate, Measurement, Plan
from dpsql.sql.analyze import SPREAD_KINDS
from dpsql.sql.parse import DIALECT
from dpsql.sql.rewrite import total

FloatArray = npt.NDArray[np.float64]


def _sql(node: Any) -> str:
    return str(node.sql(dialect=DIALECT))


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


def _noisy(totals: list[int], m: Measurement) -> list[int]:
    if m.scale is not None:
        noise = discrete_laplace(m.scale, len(totals))
    else:
        assert m.sigma2 is not None
        noise = discrete_gaussian(m.sigma2, len(totals))
    return [int(t) + int(z) for t, z in zip(totals, noise, strict=True)]


def half_width(m: Measurement, confidence: float) -> int:
    """The noise half-width of one measurement, in its integer units, from the exact discrete
    distribution sampled: the smallest k with P(|Z| <= k) >= confidence."""
    if m.scale is not None:
        return discrete_laplace_half_width(m.scale, confidence)
    assert m.sigma2 is not None
    return discrete_gaussian_half_width(m.sigma2, confidence)


def _avg(
    estimate: Estimate, plan: Plan, noisy: list[list[int]], confidence: float
) -> tuple[FloatArray, FloatArray]:
    """AVG estimates and their half-widths, vectorized over the released groups."""
    grid = estimate.grid
    assert grid is not None
    i_sum, i_count = estimate.measurements
    half = float(grid.step) / 2
    lo, hi, centre = float(grid.lower_value), float(grid.upper_value), float(grid.centre)
    s = np.asarray(noisy[i_sum], dtype=np.float64)
    n = np.asarray(noisy[i_count], dtype=np.float64)
    value = np.clip(centre + s * half / np.maximum(n, 1.0), lo, hi)
    joint = math.sqrt(confidence)
    k_s = half_width(plan.measurements[i_sum], joint)
    k_n = half_width(plan.measurements[i_count], joint)
    n_lo = np.maximum(n - k_n, 1.0)
    n_hi = np.maximum(n + k_n, 1.0)
    s_lo, s_hi = s - k_s, s + k_s
    low = np.minimum(s_lo / n_lo, s_lo / n_hi)
    high = np.maximum(s_hi / n_lo, s_hi / n_hi)
    lower = np.clip(centre + low * half, lo, hi)
    upper = np.clip(centre + high * half, lo, hi)
    # With no plausible positive count the average may be anywhere in the bounds.
    hopeless = n + k_n < 1
    lower = np.where(hopeless, lo, lower)
    upper = np.where(hopeless, hi, upper)
    width = np.maximum(value - lower, upper - value)
    return value, width


def _spread(estimate: Estimate, noisy: list[list[int]]) -> FloatArray:
    """VAR_POP, VAR_SAMP, STDDEV_POP and STDDEV_SAMP from the noisy centred sum of squares Q
    (units of (g/2)²), centred sum S (units of g/2) and count: with N = max(count, 1),
    var_pop = max(Q/N - (S/N)², 0) and var_samp = var_pop·N/max(N - 1, 1), clamped to the
    largest variance a value in the bounds can have, ((hi_g - lo_g)/2)²; STDDEV is the square
    root. Post-processing of noisy values only. The noise of the three measurements does not
    combine into a cheap valid interval, so no accuracy is reported for these (None).
    """
    grid = estimate.grid
    assert grid is not None
    i_squares, i_sum, i_count = estimate.measurements
    half = float(grid.step) / 2
    q = np.asarray(noisy[i_squares], dtype=np.float64)
    s = np.asarray(noisy[i_sum], dtype=np.float64)
    n = np.maximum(np.asarray(noisy[i_count], dtype=np.float64), 1.0)
    mean = s / n
    var = np.maximum(q / n - mean * mean, 0.0) * half * half
    if estimate.kind in ("var_samp", "stddev_samp"):
        var = var * n / np.maximum(n - 1.0, 1.0)
    var = np.clip(var, 0.0, (grid.width * half) ** 2)
    if estimate.kind in ("stddev_pop", "stddev_samp"):
        return np.sqrt(var)
    return var


def _estimates(
    plan: Plan, noisy: list[list[int]], confidence: float
) -> tuple[list[Any], list[Any]]:
    values: list[Any] = []
    widths: list[Any] = []
    for est in plan.estimates:
        m = plan.measurements[est.measurements[0]]
        if est.kind == "avg":
            value, width = _avg(est, plan, noisy, confidence)
            values.append(value)
            widths.append(width)
            continue
        if est.kind in SPREAD_KINDS:
            value = _spread(est, noisy)
            values.append(value)
            widths.append(np.full(len(value), np.nan))  # no interval: accuracy None
            continue
        k = half_width(m, confidence)
        raw = noisy[est.measurements[0]]
        if m.unit == 1:
            values.append(np.array(raw, dtype=object))
        else:
            values.append(np.array([float(v * m.unit) for v in raw], dtype=np.float64))
        widths.append(np.full(len(raw), float(k * m.unit)))
    return values, widths


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


def check_samplable(plan: Plan) -> None:
    """Refuse, before any charge, noise the exact samplers cannot draw (sensitivities that huge
    come from extreme bounds or contribution limits, and would make useless answers)."""
    for m in plan.measurements:
        if (m.scale is not None and m.scale > MAX_SCALE) or (
            m.sigma2 is not None and m.sigma2 > MAX_SIGMA2
        ):
            raise BoundsError(
                f"the noise of {m.label} would be too large to sample exactly; lower the bounds "
                "or the contribution limits"
            )


def check_post_processing(plan: Plan, key_types: list[str]) -> None:
    """Bind the post-processing SQL over an empty table of the right types, before the charge.

    A query whose outputs, HAVING or ORDER BY cannot be typed (say, UPPER of a count) is then
    rejected for free instead of failing after its charge.
    """
    columns = [f"CAST(NULL AS {t}) AS _k{i}" for i, t in enumerate(key_types)]
    for i, est in enumerate(plan.estimates):
        exact = (
            est.kind in ("count_rows", "count", "count_units", "sum")
            and plan.measurements[est.measurements[0]].unit == 1
        )
        columns.append(f"CAST(NULL AS {'BIGINT' if exact else 'DOUBLE'}) AS _a{i}")
        columns.append(f"CAST(NULL AS DOUBLE) AS _a{i}_hw")
    sql = _post_sql(plan, _bare_aggregate(plan))
    empty = f"(SELECT {', '.join(columns)} WHERE false) AS _noisy"
    cursor = _scratch().cursor()
    try:
        cursor.execute("DESCRIBE " + sql.replace("FROM _noisy", f"FROM {empty}", 1)).fetchall()
    except duckdb.Error:
        raise UnsupportedQueryError(
            "an output, HAVING or ORDER BY expression cannot be typed over the aggregates"
        ) from None
    finally:
        cursor.close()


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


def measure(plan: Plan, rows: list[tuple[Any, ...]]) -> Noisy:
    """Add noise to the bounded totals, then keep the groups partition selection releases."""
    n_keys = len(plan.analysis.keys)
    keys = [[row[i] for row in rows] for i in range(n_keys)]
    totals = [[int(row[n_keys + j] or 0) for row in rows] for j in range(len(plan.measurements))]
    noisy = [_noisy(t, m) for t, m in zip(totals, plan.measurements, strict=True)]
    if plan.selection is not None:
        units = noisy[plan.selection.measurement]
        keep = [j for j, u in enumerate(units) if u >= plan.selection.threshold]
        keys = [[col[j] for j in keep] for col in keys]
        noisy = [[col[j] for j in keep] for col in noisy]
    return Noisy(tuple(tuple(c) for c in keys), tuple(tuple(c) for c in noisy))


def release(plan: Plan, rows: list[tuple[Any, ...]]) -> Release:
    """Add noise to the bounded totals and post-process; the charge was committed before."""
    return publish(plan, measure(plan, rows))


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
