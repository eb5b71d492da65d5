"""COVAR_POP, COVAR_SAMP, CORR, REGR_SLOPE and REGR_INTERCEPT of y on x (``F(y, x)``, as in
DuckDB and PostgreSQL), from noisy measurements of the pairs' rows (both present):

* P, the sum of products of centred values Σ(x - m_x)(y - m_y), in units of (g_x/2)(g_y/2),
  m the midpoint of each value's grid-aligned bounds (a public point);
* S_x and S_y, the centred sums, in units of g_x/2 and g_y/2; N, the count of pairs;
* Q_x (CORR, REGR_SLOPE, REGR_INTERCEPT) and Q_y (CORR), centred sums of squares.

A pair is a row where both x and y are present (NULL and NaN are missing, as everywhere): each
value is read as ``CASE WHEN <other> IS NULL OR isnan(<other>) THEN NULL ELSE <value> END``
(``paired``), so every measurement reads the same rows. One unit's C rows move P by at most
C·width_x·width_y (each centred product lies within ±width_x·width_y; docs/privacy.md), each
other measurement as for AVG and VARIANCE.

Estimates, with n = max(N, 1), in value units: cov = P/n - (S_x/n)(S_y/n), clamped to
±W_x·W_y (W half the range of a value's bounds: no covariance of values in the bounds is
larger); COVAR_SAMP = cov·n/max(n - 1, 1), clamped to ±2·W_x·W_y; var = max(Q/n - (S/n)², 0);
CORR = cov/√(var_x·var_y), clamped to [-1, 1]; REGR_SLOPE = cov/var_x; REGR_INTERCEPT =
mean_y - slope·mean_x. Post-processing of noisy values.

Half-widths: every measurement's noise within its half-width at confidence c^(1/k) (k of them,
independent draws; ``dpsql.plan.estimators._each``), the estimator's range over that box by
sound interval arithmetic, clamped like the estimate. Where the box holds a variance at or
below 0 (CORR, the REGR_ functions) or no positive count, no interval exists: the half-width is
+inf, released as no ± and the mostly-noise flag (``dpsql.release.post``). It covers the noise
only.

Weights in the optimal split (``dpsql.plan.split``), first order as for VARIANCE: n·d cov =
dP - m_y·dS_x - m_x·dS_y - (P/n - 2·m_x·m_y)·dN, with the centred means uniform in ±W and the
covariance uniform in ±W_x·W_y: 1 on P, W_y²/3 on S_x, W_x²/3 on S_y, 4·W_x²·W_y²/9 on N; a
variance Q_x in CORR and the slope weighs (W_y/W_x)²/12 (CORR's Q_y (W_x/W_y)²/12): the
derivative of cov/√(var_x·var_y) in var_x is -corr/(2·var_x), with corr² averaging 1/3.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt
from sqlglot import exp

from dpsql.analyze.analysis import Aggregate
from dpsql.bound.grid import Grid, value_grid
from dpsql.bound.specs import MeasurementSpec
from dpsql.errors import UnsupportedQueryError
from dpsql.plan.aggregates.rule import AggregateRule, Builder, Ratio
from dpsql.plan.aggregates.spreads import _ROUNDING, _moment_range, square_range
from dpsql.plan.estimators import FloatArray, _each, half_width, within
from dpsql.plan.plans import Estimate, Measurement
from dpsql.sql.aggregates import AggregateKind

# Each kind's centred sums of squares: of x, and of y.
_SQUARES: dict[AggregateKind, tuple[bool, bool]] = {
    "covar_pop": (False, False),
    "covar_samp": (False, False),
    "corr": (True, True),
    "regr_slope": (True, False),
    "regr_intercept": (True, False),
}
_NAMES: dict[AggregateKind, str] = {
    "covar_pop": "COVAR_POP",
    "covar_samp": "COVAR_SAMP",
    "corr": "CORR",
    "regr_slope": "REGR_SLOPE",
    "regr_intercept": "REGR_INTERCEPT",
}

Pair = tuple[FloatArray, FloatArray]


def paired(value: exp.Expression, other: exp.Expression) -> exp.Expression:
    """``value`` on the rows where ``other`` is present too, else NULL: SQL's pair aggregates
    read only the rows where both arguments are non-NULL (and dpsql reads NaN as NULL)."""
    as_double = exp.cast(other.copy(), exp.DataType.Type.DOUBLE)
    missing = exp.Or(
        this=exp.Is(this=other.copy(), expression=exp.Null()),
        expression=exp.IsNan(this=as_double),
    )
    return exp.Case(ifs=[exp.If(this=missing, true=exp.Null())], default=value.copy())


def unpaired(expr: exp.Expression) -> tuple[exp.Expression, exp.Expression] | None:
    """(value, other) of a ``paired`` expression, else None: how labels name it."""
    if not isinstance(expr, exp.Case) or len(expr.args.get("ifs") or []) != 1:
        return None
    (branch,) = expr.args["ifs"]
    condition, default = branch.this, expr.args.get("default")
    if (
        default is None
        or not isinstance(branch.args.get("true"), exp.Null)
        or not isinstance(condition, exp.Or)
        or not isinstance(condition.this, exp.Is)
    ):
        return None
    other = condition.this.this
    if paired(default, other) != expr:
        return None
    return default, other


def _measure(agg: Aggregate, builder: Builder) -> Estimate:
    """(P, S_x, S_y, N, then Q_x and Q_y where the kind needs them) of the pairs' rows."""
    assert agg.arg is not None and agg.arg2 is not None
    assert agg.bounds is not None and agg.bounds2 is not None
    gx, gy = value_grid(agg.bounds), value_grid(agg.bounds2)
    vx = builder.value(paired(agg.arg, agg.arg2), gx)
    vy = builder.value(paired(agg.arg2, agg.arg), gy)
    parts = [
        builder.measure(MeasurementSpec("centred_products", vx, other=vy)),
        builder.measure(MeasurementSpec("centred", vx)),
        builder.measure(MeasurementSpec("centred", vy)),
        builder.measure(MeasurementSpec("count", vx)),
    ]
    square_x, square_y = _SQUARES[agg.kind]
    if square_x:
        parts.append(builder.measure(MeasurementSpec("centred_squares", vx)))
    if square_y:
        parts.append(builder.measure(MeasurementSpec("centred_squares", vy)))
    return Estimate(agg.kind, tuple(parts), gx, gy)


def _half(grid: Grid) -> float:
    """W, half the range of a value's grid-aligned bounds, in value units."""
    return float(grid.upper_value - grid.lower_value) / 2


def _mul(a: Pair, b: Pair) -> Pair:
    products = [a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1]]
    return np.minimum.reduce(products), np.maximum.reduce(products)


def _widen(a: Pair) -> Pair:
    """An interval widened by ``_ROUNDING`` of its size, for the float rounding of its terms."""
    size = np.maximum(np.abs(a[0]), np.abs(a[1])) * _ROUNDING
    return a[0] - size, a[1] + size


def _divide(a: Pair, b: Pair) -> Pair:
    """a / b for b within positive ends (elsewhere the caller has no interval)."""
    safe = (np.where(b[0] > 0, b[0], 1.0), np.where(b[1] > 0, b[1], 1.0))
    return _widen(_mul(a, (1.0 / safe[1], 1.0 / safe[0])))


@dataclass(frozen=True)
class _Box:
    """The noisy measurements of one pair aggregate over the released groups, and the box
    every noise lies in with the joint confidence (module docstring)."""

    arrays: list[FloatArray]  # P, S_x, S_y, N, then Q_x and Q_y where measured
    k: list[float]  # each one's half-width at the joint confidence
    units: tuple[float, float]  # g_x/2 and g_y/2
    centres: tuple[float, float]
    top: float  # W_x·W_y, the largest covariance of values in the bounds
    n1: FloatArray  # max(N, 1)
    u: Pair  # 1/N over the box
    cov: FloatArray  # the covariance, in value units
    cov_box: Pair
    hopeless: npt.NDArray[np.bool_]  # no plausible positive count

    def around(self, i: int) -> Pair:
        return self.arrays[i] - self.k[i], self.arrays[i] + self.k[i]

    def variance(self, i: int) -> tuple[FloatArray, Pair]:
        """Var of x (i = 0) or y (i = 1) and its range over the box, in value units: the
        range of Q/N - (S/N)² (``spreads._moment_range``)."""
        q, s, k_q, k_s = self.arrays[4 + i], self.arrays[1 + i], self.k[4 + i], self.k[1 + i]
        unit = self.units[i] ** 2
        var = np.maximum(q / self.n1 - (s / self.n1) ** 2, 0.0) * unit
        low, high = _moment_range((q - k_q, q + k_q), square_range(s, k_s), self.u)
        return var, (low * unit, high * unit)

    def mean(self, i: int) -> tuple[FloatArray, Pair]:
        """The mean of x (i = 0) or y (i = 1) and its range over the box."""
        s, c, unit = self.arrays[1 + i], self.centres[i], self.units[i]
        box = _mul(self.around(1 + i), self.u)
        return c + s / self.n1 * unit, _widen((c + box[0] * unit, c + box[1] * unit))


def _box(
    estimate: Estimate,
    measurements: Sequence[Measurement],
    noisy: Sequence[npt.ArrayLike],
    confidence: float,
) -> _Box:
    gx, gy = estimate.grid, estimate.grid2
    assert gx is not None and gy is not None
    used = estimate.measurements
    arrays = [np.asarray(noisy[i], dtype=np.float64) for i in used]
    p, sx, sy, n = arrays[:4]
    ux, uy = float(gx.step) / 2, float(gy.step) / 2
    # Independent noises: each within its c^(1/k) half-width, all hold with probability >= c.
    joint = _each(confidence, measurements, used,
                  math.nextafter(confidence ** (1 / len(used)), 1.0))  # fmt: skip
    k = [float(half_width(measurements[i], joint)) for i in used]
    n1 = np.maximum(n, 1.0)
    cov = (p / n1 - (sx / n1) * (sy / n1)) * ux * uy
    u: Pair = (1.0 / np.maximum(n + k[3], 1.0), 1.0 / np.maximum(n - k[3], 1.0))
    # cov = P·u - S_x·S_y·u², u = 1/N > 0: each term's range, then their difference.
    first = _mul((p - k[0], p + k[0]), u)
    second = _mul(_mul((sx - k[1], sx + k[1]), (sy - k[2], sy + k[2])), (u[0] ** 2, u[1] ** 2))
    cov_box = _widen(((first[0] - second[1]) * ux * uy, (first[1] - second[0]) * ux * uy))
    return _Box(arrays, k, (ux, uy), (float(gx.centre), float(gy.centre)),
                _half(gx) * _half(gy), n1, u, cov, cov_box, n + k[3] < 1)  # fmt: skip


def _covariance(b: _Box, samp: bool) -> tuple[FloatArray, FloatArray]:
    """COVAR_POP (COVAR_SAMP), clamped to ±W_x·W_y (±2·W_x·W_y), and its half-width: the
    whole range where no count is plausible."""
    top = 2 * b.top if samp else b.top
    if samp:
        bessel = b.n1 / np.maximum(b.n1 - 1.0, 1.0)
        value = np.clip(b.cov * bessel, -top, top)
        # n/(n - 1) (n/1 below 2) lies in [1, 2]: its range over the box of counts.
        lo_n, hi_n = 1.0 / b.u[1], 1.0 / b.u[0]
        ends = (lo_n / np.maximum(lo_n - 1.0, 1.0), hi_n / np.maximum(hi_n - 1.0, 1.0))
        b_hi = np.where((lo_n <= 2.0) & (hi_n >= 2.0), 2.0, np.maximum(*ends))
        low, high = _widen(_mul(b.cov_box, (np.minimum(*ends), b_hi)))
    else:
        value = np.clip(b.cov, -top, top)
        low, high = b.cov_box
    low, high = within(low, high, -top, top)
    width = np.maximum(value - low, high - value)
    return value, np.nextafter(np.where(b.hopeless, 2 * top, width), np.inf)


def _regression(b: _Box, kind: AggregateKind) -> tuple[FloatArray, FloatArray]:
    """CORR, REGR_SLOPE or REGR_INTERCEPT and its half-width; +inf (no ±, flagged) where the
    box holds a variance at or below 0, or no positive count."""
    var_x, box_x = b.variance(0)
    valid = (box_x[0] > 0) & ~b.hopeless
    if kind == "corr":
        var_y, box_y = b.variance(1)
        both = (var_x > 0) & (var_y > 0)
        scale = np.sqrt(np.where(both, var_x * var_y, 1.0))
        value = np.where(both, np.clip(b.cov / scale, -1.0, 1.0), 0.0)
        valid = valid & (box_y[0] > 0)
        product = _mul(box_x, box_y)
        root = (np.sqrt(np.maximum(product[0], 0.0)), np.sqrt(np.maximum(product[1], 0.0)))
        low, high = _divide(b.cov_box, root)
        low, high = within(low, high, -1.0, 1.0)
    else:
        defined = var_x > 0
        slope = np.where(defined, b.cov / np.where(defined, var_x, 1.0), 0.0)
        slope_box = _divide(b.cov_box, box_x)
        if kind == "regr_slope":
            value, (low, high) = slope, slope_box
        else:
            (mean_x, mx), (mean_y, my) = b.mean(0), b.mean(1)
            value = mean_y - slope * mean_x
            term = _mul(slope_box, mx)
            low, high = _widen((my[0] - term[1], my[1] - term[0]))
    width = np.maximum(value - low, high - value)
    return value, np.where(valid, np.nextafter(width, np.inf), np.inf)


def _pairs(
    estimate: Estimate,
    measurements: Sequence[Measurement],
    noisy: Sequence[npt.ArrayLike],
    confidence: float,
) -> tuple[FloatArray, FloatArray]:
    """The kind's estimates and half-widths over the released groups (module docstring)."""
    b = _box(estimate, measurements, noisy, confidence)
    if estimate.kind in ("covar_pop", "covar_samp"):
        return _covariance(b, estimate.kind == "covar_samp")
    return _regression(b, estimate.kind)


def _weights(estimate: Estimate) -> tuple[Fraction, ...]:
    gx, gy = estimate.grid, estimate.grid2
    assert gx is not None and gy is not None
    wx = (gx.upper_value - gx.lower_value) / 2
    wy = (gy.upper_value - gy.lower_value) / 2
    out = [Fraction(1), wy**2 / 3, wx**2 / 3, 4 * wx**2 * wy**2 / 9]
    square_x, square_y = _SQUARES[estimate.kind]
    if square_x:
        out.append((wy / wx) ** 2 / 12 if wx else Fraction(0))
    if square_y:
        out.append((wx / wy) ** 2 / 12 if wy else Fraction(0))
    return tuple(out)


def _width(
    estimate: Estimate, measurements: Sequence[Measurement], confidence: float, n: int
) -> float:
    """An accuracy target in groups of at least n units is not offered for these kinds yet."""
    raise UnsupportedQueryError(
        f"dpsql.min_group is not supported for {_NAMES[estimate.kind]}: set dpsql.halfwidth "
        "without it (each measurement's ± is bounded) or leave the target out"
    )


def _bounds(estimate: Estimate) -> tuple[float, float] | None:
    gx, gy = estimate.grid, estimate.grid2
    assert gx is not None and gy is not None
    top = _half(gx) * _half(gy)
    return {
        "covar_pop": (-top, top),
        "covar_samp": (-2 * top, 2 * top),
        "corr": (-1.0, 1.0),
    }.get(estimate.kind)


PAIRS = tuple(
    AggregateRule(
        kind,
        _measure,
        _pairs,
        _weights,
        Ratio(_width, grid_key=lambda g: (g.width, g.step)),
        _NAMES[kind] + "({arg2}, {arg})",
        bounds=_bounds,
    )
    for kind in _SQUARES
)

__all__ = ["PAIRS", "paired", "unpaired"]
