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
the bounds). VARIANCE and STDDEV (``_spread``): the box of the three measurements, each at
confidence c^(1/3), and the estimator's range over it by sound interval arithmetic.
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

from dpsql.errors import (
    CHECK_OUT_OF_MEMORY,
    BoundsError,
    EngineError,
    ParameterError,
    UnsupportedQueryError,
)
from dpsql.noise.exponential import exponential_mechanism, quantile_scores
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
from dpsql.sql.totality import total

FloatArray = npt.NDArray[np.float64]


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


def _noisy(totals: list[int], m: Measurement) -> list[int]:
    if m.scale is not None:
        noise = discrete_laplace(m.scale, len(totals))
    else:
        assert m.sigma2 is not None
        noise = discrete_gaussian(m.sigma2, len(totals))
    return [int(t) + int(z) for t, z in zip(totals, noise, strict=True)]


def _quantiles(histograms: list[Any], m: Measurement) -> list[int]:
    """Per group, the exponential mechanism over the grid candidates (Smith 2011), sampled
    exactly (Ilvento 2020): the chosen candidate, in grid units."""
    assert m.scale is not None and m.spec.p is not None
    grid = m.grid
    assert grid is not None
    gamma = 1 / (2 * m.scale)  # weights exp(-score/(2·scale)): epsilon = sensitivity/scale
    chosen = []
    for histogram in histograms:
        counts = {int(k): int(v) for k, v in (histogram or {}).items()}
        scores = quantile_scores(counts, grid.lower, grid.upper, m.spec.p)
        chosen.append(grid.lower + exponential_mechanism(scores, gamma))
    return chosen


# A half-width is a function of the noise's parameters and the confidence alone (public, no
# data): kept, since a repeated query asks for the same ones (some 0.1 ms each, in Decimal).
_laplace_half_width = functools.lru_cache(maxsize=1024)(discrete_laplace_half_width)
_gaussian_half_width = functools.lru_cache(maxsize=1024)(discrete_gaussian_half_width)


def half_width(m: Measurement, confidence: float) -> int:
    """The noise half-width of one measurement, in its integer units, from the exact discrete
    distribution sampled: the smallest k with P(|Z| <= k) >= confidence."""
    if m.scale is not None:
        return _laplace_half_width(m.scale, confidence)
    assert m.sigma2 is not None
    return _gaussian_half_width(m.sigma2, confidence)


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


# Relative widening of the variance interval's ends: the bounds and the estimator are evaluated
# by different float operations, each within a few ulps (2**-52) of its terms; 1e-12 covers both.
_ROUNDING = 1e-12


def _bessel(n: FloatArray) -> FloatArray:
    """The sample-variance factor N/max(N - 1, 1) of a count N >= 1."""
    return n / np.maximum(n - 1.0, 1.0)


def _moment_range(
    q: tuple[FloatArray, FloatArray],
    s2: tuple[FloatArray, FloatArray],
    u: tuple[FloatArray, FloatArray],
) -> tuple[FloatArray, FloatArray]:
    """The range of f = Q/N - S²/N² over the box Q in ``q``, S² in ``s2`` (S² >= 0) and
    u = 1/N in ``u`` (0 < u <= 1), each a (low, high) pair of arrays.

    f = Q·u - S²·u² rises with Q and falls with S², so its minimum has (q_lo, s2_hi) and its
    maximum (q_hi, s2_lo). In u each is a concave parabola (a·u - b·u², b >= 0): the minimum
    is at an end of [u_lo, u_hi], the maximum at the vertex a/(2b) clipped into it. Exact over
    the box, then widened by ``_ROUNDING`` of the terms' size for float rounding.
    """
    q_lo, q_hi = q
    s2_lo, s2_hi = s2
    u_lo, u_hi = u
    low = np.minimum(q_lo * u_lo - s2_hi * u_lo * u_lo, q_lo * u_hi - s2_hi * u_hi * u_hi)
    # With b = 0 the parabola is a line, highest at u_hi if a >= 0 and at u_lo otherwise.
    line = np.where(q_hi >= 0.0, np.inf, -np.inf)
    vertex = np.divide(q_hi, 2.0 * s2_lo, out=line, where=s2_lo > 0.0)
    top = np.clip(vertex, u_lo, u_hi)
    high = q_hi * top - s2_lo * top * top
    size = np.maximum(np.abs(q_lo), np.abs(q_hi)) * u_hi + s2_hi * u_hi * u_hi
    return low - _ROUNDING * size, high + _ROUNDING * size


def _spread(
    estimate: Estimate, plan: Plan, noisy: list[list[int]], confidence: float
) -> tuple[FloatArray, FloatArray]:
    """VAR_POP, VAR_SAMP, STDDEV_POP and STDDEV_SAMP, and their half-widths, vectorized.

    The estimate, from the noisy centred sum of squares Q (units of (g/2)²), centred sum S
    (units of g/2) and count: with N = max(count, 1), var_pop = max(Q/N - (S/N)², 0) and
    var_samp = var_pop·N/max(N - 1, 1), clamped to the largest variance a value in the bounds
    can have, ((hi_g - lo_g)/2)²; STDDEV is the square root. Post-processing of noisy values.

    The half-width: each measurement gets its exact noise half-width at confidence c^(1/3), and
    the interval is the estimator's range over that box (Q ± k_Q, S ± k_S, count ± k_N), by
    sound interval arithmetic: the range of Q/N - (S/N)² (exact over the box, ``_moment_range``),
    floored at 0, times the range of N/max(N - 1, 1) for the samples' variance, clamped like the
    estimate, square roots of the ends for STDDEV. Like AVG's, it covers the noise only, and
    depends on the noisy values, so it is post-processing too.
    """
    grid = estimate.grid
    assert grid is not None
    i_squares, i_sum, i_count = estimate.measurements
    samp = estimate.kind in ("var_samp", "stddev_samp")
    top = float(grid.width) ** 2  # ((hi_g - lo_g)/2)², the largest variance, in (g/2)²
    q = np.asarray(noisy[i_squares], dtype=np.float64)
    s = np.asarray(noisy[i_sum], dtype=np.float64)
    n = np.asarray(noisy[i_count], dtype=np.float64)
    n1 = np.maximum(n, 1.0)
    mean = s / n1
    var = np.maximum(q / n1 - mean * mean, 0.0)
    value = np.clip(var * _bessel(n1) if samp else var, 0.0, top)
    # Independent noises: each within its c^(1/3) half-width, all three hold with probability
    # >= c (one ulp up keeps the rounded cube root from falling short of it).
    joint = math.nextafter(confidence ** (1 / 3), 1.0)
    k_q, k_s, k_n = (float(half_width(plan.measurements[i], joint)) for i in estimate.measurements)
    n_lo, n_hi = np.maximum(n - k_n, 1.0), np.maximum(n + k_n, 1.0)
    a_lo, a_hi = np.abs(s - k_s), np.abs(s + k_s)
    # The range of |S|: from 0 when the interval of S holds 0, else from its nearer end.
    s_min = np.where(np.abs(s) <= k_s, 0.0, np.minimum(a_lo, a_hi))
    s_max = np.maximum(a_lo, a_hi)
    low, high = _moment_range((q - k_q, q + k_q), (s_min**2, s_max**2), (1.0 / n_hi, 1.0 / n_lo))
    low, high = np.maximum(low, 0.0), np.maximum(high, 0.0)
    if samp:
        # N/(N - 1) (N/1 below 2) rises on [1, 2] and falls after: its peak 2 is at N = 2.
        ends = (_bessel(n_lo), _bessel(n_hi))
        low = low * np.minimum(*ends) * (1.0 - _ROUNDING)
        high = high * np.where((n_lo <= 2.0) & (n_hi >= 2.0), 2.0, np.maximum(*ends))
        high = high * (1.0 + _ROUNDING)
    unit = (float(grid.step) / 2) ** 2
    ends3 = [v * unit for v in (value, np.clip(low, 0.0, top), np.clip(high, 0.0, top))]
    if estimate.kind in ("stddev_pop", "stddev_samp"):
        ends3 = [np.sqrt(v) for v in ends3]
    value, lower, upper = ends3
    # One ulp up: the rounded difference could leave value ± width a hair inside an end.
    return value, np.nextafter(np.maximum(value - lower, upper - value), np.inf)


def _estimates(
    plan: Plan, noisy: list[list[int]], confidence: float
) -> tuple[list[Any], list[Any]]:
    values: list[Any] = []
    widths: list[Any] = []
    for est in plan.estimates:
        m = plan.measurements[est.measurements[0]]
        if est.kind == "quantile":
            # The exponential mechanism's choice is a grid point: its value, and no interval.
            chosen = noisy[est.measurements[0]]
            values.append(np.array([float(v * m.unit) for v in chosen], dtype=np.float64))
            widths.append(np.full(len(chosen), np.nan))
            continue
        if est.kind == "avg":
            value, width = _avg(est, plan, noisy, confidence)
            values.append(value)
            widths.append(width)
            continue
        if est.kind in SPREAD_KINDS:
            value, width = _spread(est, plan, noisy, confidence)
            values.append(value)
            widths.append(width)
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
            est.kind in ("count_rows", "count", "count_units", "count_distinct", "sum")
            and plan.measurements[est.measurements[0]].unit == 1
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


def measure(plan: Plan, rows: list[tuple[Any, ...]]) -> Noisy:
    """Add noise to the bounded totals, then keep the groups partition selection releases."""
    n_keys = len(plan.analysis.keys)
    keys = [[row[i] for row in rows] for i in range(n_keys)]
    noisy = [
        _quantiles([row[n_keys + j] for row in rows], m)
        if m.exponential
        else _noisy([int(row[n_keys + j] or 0) for row in rows], m)
        for j, m in enumerate(plan.measurements)
    ]
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
