"""How a released value's accuracy is kept and printed: a half-width (±), or a quantile's
interval ``(lo, hi)`` (``Accuracy``); when a value is mostly noise; and the text every
interface shows, rounded so that it never looks more accurate than it is. Post-processing of
released values and public numbers only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from decimal import ROUND_CEILING, Decimal
from typing import Any

from dpsql.plan.aggregates.registry import rule_of
from dpsql.plan.plans import Plan

# A cell's accuracy: a half-width (±), an interval (lo, hi) that holds the truth with the
# confidence (a quantile's: asymmetric, never shown as ±), or None (a key, an expression).
Accuracy = float | tuple[float, float] | None

INTERVALS_COVER = (
    "intervals of each quantile of the kept rows (noise and rounding; not the bounds' cut)"
)
NOISE_MARK = " (mostly noise)"


def mostly_noise(value: Any, width: Accuracy, bounds: tuple[float, float] | None) -> bool:
    """A published value that is mostly noise: its ± is at least its own magnitude, or its
    interval spans the whole range its estimate is clamped to; a quantile's interval (lo, hi)
    spans most (over half) of its grid's range, or the value sits on the grid's edge. Read from
    the published value, its accuracy and public bounds only (post-processing)."""
    if width is None or value is None or isinstance(value, bool):
        return False
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        return False
    if isinstance(width, tuple):
        if bounds is None or not math.isfinite(v):
            return False
        lower, upper = bounds
        return width[1] - width[0] > (upper - lower) / 2 or v <= lower or v >= upper
    if width == math.inf:
        return True  # no valid interval exists (dpsql.plan.aggregates.pairs): no ±, flagged
    if not math.isfinite(v) or not math.isfinite(width):
        return False
    if width >= abs(v):
        return True
    return bounds is not None and v - width <= bounds[0] and v + width >= bounds[1]


def accuracy_forms(accuracy: Iterable[Iterable[Accuracy]]) -> tuple[bool, bool]:
    """Whether a result's cells hold half-widths (±), and whether they hold intervals: what
    its footer must say it covers."""
    cells = [w for row in accuracy for w in row if w is not None]
    return any(not isinstance(w, tuple) for w in cells), any(isinstance(w, tuple) for w in cells)


def width_of(value: Any) -> float | None:
    """NaN marks an unknown half-width (a derived estimate); it is reported as None."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return float(value)


def accuracy_of(width: Any, lo: Any, hi: Any) -> Accuracy:
    """A cell's interval where its kind releases one, else its half-width (``_width``)."""
    low, high = (
        width_of(None if lo is None else float(lo)),
        width_of(None if hi is None else float(hi)),
    )
    if low is not None and high is not None:
        return (low, high)
    return width_of(None if width is None else float(width))


def cell(value: Any, width: Accuracy, noise: bool = False) -> str:
    """``value ± half-width`` as every text interface prints it (the shell, ``dpsql run`` and
    ``dpsql query`` tables, notebooks): the value rounded to the precision its accuracy
    supports, the half-width at the same precision rounded **up**, so that rounding never
    makes an answer look more accurate than it is. A quantile's interval is printed as
    ``value [lo, hi]``, never as a ±: lo rounded down, hi up (``interval_text``).

    A value that is mostly noise (``noise``) is marked so wherever it is read.

    >>> cell(1234.56, 12.4), cell(0.5123, 0.0123), cell(7, None), cell(2.0, 0.25)
    ('1235 ± 13', '0.512 ± 0.013', '7', '2.00 ± 0.25')
    >>> cell(0, 40755.2, noise=True)
    '0 ± 40756 (mostly noise)'
    >>> cell(3622.0, (3410.5, 3890.25)), cell(0.5, (0.25, 0.875))
    ('3622 [3410, 3891]', '0.50 [0.25, 0.88]')
    """
    return _cell(value, width) + (NOISE_MARK if noise else "")


def interval_text(interval: tuple[float, float], digits: int | None = None) -> str:
    """``[lo, hi]`` at ``digits`` decimals (by default, those its width supports), lo rounded
    down and hi up, so that rounding never narrows it.

    >>> interval_text((1.234, 5.678)), interval_text((-0.05, 0.05))
    ('[1.2, 5.7]', '[-0.050, 0.050]')
    """
    lo, hi = interval
    if digits is None:
        digits = _digits((hi - lo) / 2)
    scale = Decimal(10) ** digits
    low = math.floor(Decimal(repr(float(lo))) * scale) / scale
    high = math.ceil(Decimal(repr(float(hi))) * scale) / scale
    return f"[{float(low):.{digits}f}, {float(high):.{digits}f}]"


def _digits(width: float) -> int:
    """The decimals a half-width supports: none from 10 up, two significant digits below."""
    return 0 if width >= 10 or width <= 0 else min(6, 1 - math.floor(math.log10(width)))


def _cell(value: Any, width: Accuracy) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(width, tuple):
        if not all(math.isfinite(w) for w in width):
            return f"{value:.6g}" if isinstance(value, float) else str(value)
        digits = _digits((width[1] - width[0]) / 2)
        return f"{value:.{digits}f} {interval_text(width, digits)}"
    if width is None or not math.isfinite(width):
        return f"{value:.6g}" if isinstance(value, float) else str(value)
    digits = _digits(width)
    up = math.ceil(Decimal(repr(float(width))).scaleb(digits)) / Decimal(10) ** digits
    return f"{value:.{digits}f} ± {float(up):.{digits}f}"


def half_width(value: float, digits: int = 4) -> str:
    """A half-width as people read it, to ``digits`` significant digits, rounded **up** (so
    that rounding never makes an answer look more accurate than it is).

    >>> half_width(12.3441), half_width(0.000123456), half_width(150.0), half_width(2e7)
    ('12.35', '0.0001235', '150', '2e+07')
    """
    if not math.isfinite(value) or value <= 0:
        return f"{value:.{digits}g}"
    exponent = math.floor(math.log10(value)) - digits + 1
    scaled = Decimal(repr(value)).scaleb(-exponent)
    up = int(scaled.to_integral_value(rounding=ROUND_CEILING))
    return f"{float(Decimal(up).scaleb(exponent)):.{digits}g}"


ACCURACY_SUFFIX = " ±"
INTERVAL_SUFFIX = " interval"  # a quantile's accuracy column: its interval, as text
NOISE_SUFFIX = " noise"


def accuracy_columns(plan: Plan) -> list[tuple[int, str, str]]:
    """For ``SET dpsql.accuracy_columns = on``: (output index, accuracy column, flag column)
    added after each output that is exactly an aggregate: ``<name> ±``, the half-width (a
    quantile's ``<name> interval``, its interval as text ``[lo, hi]``), and ``<name> noise``,
    whether the value is mostly noise (``mostly_noise``). A name that would
    repeat a result column's (or another one's), in any letter case, takes the first free
    number: ``<name> ± 2``, ``<name> noise 2``... (a function of the query's text only)."""
    names = [o.name for o in plan.analysis.outputs]
    seen = {name.lower() for name in names}

    def free(base: str) -> str:
        name, n = base, 1
        while name.lower() in seen:
            n += 1
            name = f"{base} {n}"
        seen.add(name.lower())
        return name

    out = []
    for i, agg in enumerate(bare_aggregates(plan)):
        if agg is None:
            continue
        interval = rule_of(plan.estimates[agg].kind).interval is not None
        suffix = INTERVAL_SUFFIX if interval else ACCURACY_SUFFIX
        out.append((i, free(names[i] + suffix), free(names[i] + NOISE_SUFFIX)))
    return out


def bare_aggregates(plan: Plan) -> list[int | None]:
    """For each output, the aggregate it is exactly (alias aside), else None."""
    result: list[int | None] = []
    for o in plan.analysis.outputs:
        name = o.expr.name if o.expr.key == "column" else ""
        result.append(int(name[2:]) if name.startswith("_a") else None)
    return result


__all__ = [
    "ACCURACY_SUFFIX",
    "INTERVALS_COVER",
    "INTERVAL_SUFFIX",
    "NOISE_MARK",
    "NOISE_SUFFIX",
    "Accuracy",
    "accuracy_columns",
    "accuracy_forms",
    "accuracy_of",
    "bare_aggregates",
    "cell",
    "half_width",
    "interval_text",
    "mostly_noise",
    "width_of",
]
