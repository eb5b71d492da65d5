"""Clamping bounds estimated from the data, under differential privacy, when the user asks.

``ESTIMATE BOUNDS FOR table.column`` reads one value per unit and side: the unit's largest
value, rounded up to a rung of a fixed ladder, for the upper bound; its smallest, rounded down,
for the lower one. The ladder needs no prior range: ``0`` and ``±m·2^e`` for the mantissas
``m = 1, 1.25, 1.5, 1.75`` and ``e = -20, ..., 51``, up to ``±2^52`` (the largest bound a policy
may declare). All rungs are exact doubles, so the engine places each value exactly.

For each rung, the number of units whose value lies beyond it is a count that one unit moves by
at most 1, and in one direction for all rungs and both sides at once (adding a unit never lowers
one). Walking up the ladder from its bottom (for the lower bound, down from its top), the upper
bound is the first rung with at most about ``k`` units beyond it, by the sparse vector technique
over both walks together (``dpsql.noise.sparse_vector``): Durfee's unbounded quantile walk
("Unbounded Differentially Private Quantile and Maximum Estimation", NeurIPS 2023) with the
monotone-query noise of Lyu, Su and Li (2017). ``k = ceil(6/epsilon)`` units: leaving out about
as many units as the noise's scale is what bounds a sum's clamping bias by its noise (Amin et
al., "Bounding User Contributions", ICML 2019), and with 200 units it reads between the 90th
percentile and a little past the largest value. Rungs below the data count every unit and never
stop the walk, so, unlike quantiles by the exponential mechanism over the ladder, the many rungs
beyond the data cannot attract the answer.

The release is pure epsilon-DP (one ``PureDP`` event); the bounds are post-processing of it,
recorded beside the charge, and later queries over a column with no declared bounds use them
(for the same policy and data version), as if the data owner had declared them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from dpsql.analyze.scope import NUMERIC
from dpsql.errors import SchemaError, UnsupportedQueryError
from dpsql.noise.sparse_vector import Walks, above_threshold
from dpsql.policy import Policy

LOWEST_POWER = -20  # the smallest non-zero magnitude on the ladder, 2^-20
HIGHEST_POWER = 52  # the largest, 2^52 (the largest bound a policy may declare)
PER_OCTAVE = 4  # rungs per doubling: mantissas 1, 1.25, 1.5, 1.75
_RUNGS = (HIGHEST_POWER - LOWEST_POWER) * PER_OCTAVE + 1  # positive rungs
ZERO_INDEX = _RUNGS  # the index of the candidate 0
TOP_INDEX = 2 * _RUNGS  # the index of +2^52 (0 is -2^52)
UNITS_BEYOND = 6  # k·epsilon: units each bound may leave beyond it, up to the noise
RECORD_KIND = "bounds"  # ledger records of estimated bounds (post-processing, never charged)
_TOP = float(2**HIGHEST_POWER)
_SMALLEST = float(Fraction(2) ** LOWEST_POWER)


def _positive(k: int) -> Fraction:
    """The k-th positive rung, from 2^LOWEST_POWER (k = 0) to 2^HIGHEST_POWER."""
    octave, step = divmod(k, PER_OCTAVE)
    return Fraction(2) ** (LOWEST_POWER + octave) * (1 + Fraction(step, PER_OCTAVE))


def candidate(index: int) -> Fraction:
    """The ladder value at ``index`` in [0, TOP_INDEX]."""
    if not 0 <= index <= TOP_INDEX:
        raise ValueError("a ladder index out of range")
    if index == ZERO_INDEX:
        return Fraction(0)
    if index > ZERO_INDEX:
        return _positive(index - ZERO_INDEX - 1)
    return -_positive(ZERO_INDEX - 1 - index)


def units_beyond(epsilon: Fraction) -> int:
    """``k``: how many units each bound leaves beyond it, up to the noise."""
    return max(1, math.ceil(UNITS_BEYOND / epsilon))


def _octave(a: str) -> str:
    """floor(log2(a)) for a double in [2^-20, 2^52], exactly: LOG2 may round an argument just
    below a power of two up to it (or just above, down), so the estimate is corrected against
    the exact power."""
    e = f"FLOOR(LOG2({a}))"
    fix = f"CASE WHEN {a} < POW(2.0, {e}) THEN 1 WHEN {a} >= POW(2.0, {e} + 1) THEN -1 ELSE 0 END"
    return f"({e} - {fix})"


def _bucket(column: str, up: bool = True) -> str:
    """Row-level SQL: a value's ladder index, NULL and NaN staying NULL.

    ``up``: the smallest rung at or above the value (for the upper bound); otherwise the largest
    rung at or below it (for the lower bound), which is minus the rung above the negated value.
    Either way the estimated bound lies beyond the data it was read from, never inside it.
    Values beyond ±2^52 (infinities included) go to the ends of the ladder.
    """
    raw = f'TRY_CAST("{column}" AS DOUBLE)' if up else f'(-TRY_CAST("{column}" AS DOUBLE))'
    x = f"LEAST(GREATEST({raw}, {-_TOP}), {_TOP})"
    a = f"(-{x})"
    # x > 0: the k-th positive rung at or above x, k = (e - LOW)·P + ceil((x/2^e - 1)·P), exact:
    # x/2^e and (m - 1)·P are exact in binary floating point. x < 0: minus the largest rung at
    # or below |x| (floor instead of ceil), or 0 when |x| < 2^-20.
    e_up, e_dn = _octave(x), _octave(a)
    p, low = PER_OCTAVE, LOWEST_POWER
    up_k = f"({e_up} - ({low})) * {p} + CEIL(({x} / POW(2.0, {e_up}) - 1) * {p})"
    dn_k = f"({e_dn} - ({low})) * {p} + FLOOR(({a} / POW(2.0, {e_dn}) - 1) * {p})"
    ladder = (
        f"CASE WHEN {x} = 0 THEN {ZERO_INDEX} "
        f"WHEN {x} > 0 AND {x} <= {_SMALLEST} THEN {ZERO_INDEX + 1} "
        f"WHEN {x} > 0 THEN {ZERO_INDEX + 1} + {up_k} "
        f"WHEN {a} < {_SMALLEST} THEN {ZERO_INDEX} "
        f"ELSE {ZERO_INDEX - 1} - ({dn_k}) END"
    )
    index = ladder if up else f"{TOP_INDEX} - ({ladder})"
    # DuckDB's GREATEST skips NULL and orders NaN above every number, so the NULL/NaN test
    # sits outside the clamp.
    return (
        f"CASE WHEN {raw} IS NULL OR isnan({raw}) THEN NULL "
        f"ELSE CAST(LEAST(GREATEST({index}, 0), {TOP_INDEX}) AS BIGINT) END"
    )


def check_column(policy: Policy, catalog: Any, table: str, column: str) -> str:
    """The privacy unit of ``table``, after checking that ``column`` can be estimated; refused
    on the schema and the policy alone, before anything is charged."""
    spec = policy.tables.get(table)
    if spec is None or table not in catalog:
        raise SchemaError(f"unknown table {table}")
    if not spec.is_private:
        raise UnsupportedQueryError(f"table {table} is public: its bounds need no estimate")
    ctype = catalog[table].get(column)
    if ctype is None:
        raise SchemaError(f"unknown column {column} in table {table}")
    if ctype.lower() not in NUMERIC and not ctype.lower().startswith("decimal"):
        raise UnsupportedQueryError(f"bounds can be estimated for numeric columns only; "
                                    f"{column} is {ctype.upper()}")  # fmt: skip
    if column == spec.privacy_unit:
        raise UnsupportedQueryError("the privacy unit column has no bounds to estimate")
    return str(spec.privacy_unit)


def bounds_query(policy: Policy, catalog: Any, table: str, column: str) -> str:
    """The engine query of the per-unit values: per side (0 upper, 1 lower, mirrored so that
    both walk up) and ladder index, how many units have their extreme value there. One row per
    unit before the histogram, whatever the unit's rows: a unit moves each count by at most 1.
    A unit whose values are all NULL or NaN is in no count."""
    table, column = table.lower(), column.lower()
    unit = check_column(policy, catalog, table, column)
    mirrored = f"{TOP_INDEX} - {_bucket(column, up=False)}"
    return (
        f'WITH _b AS (SELECT "{unit}" AS _u, {_bucket(column)} AS _hi, {mirrored} AS _lo '
        f'FROM "{table}"), _p AS (SELECT _u, MAX(_hi) AS _hi, MAX(_lo) AS _lo FROM _b GROUP BY _u) '
        "SELECT 0 AS _side, _hi AS _i, COUNT(*) AS _n FROM _p WHERE _hi IS NOT NULL GROUP BY _hi "
        "UNION ALL "
        "SELECT 1 AS _side, _lo AS _i, COUNT(*) AS _n FROM _p WHERE _lo IS NOT NULL GROUP BY _lo"
    )


def walks(epsilon: Fraction) -> Walks:
    """Both walks at the estimate's epsilon, sensitivity 1 (one value per unit and side)."""
    return Walks(epsilon, 2)


def beyond(rows: Sequence[tuple[Any, ...]]) -> list[list[int]]:
    """Per side, the units beyond each rung (``above[i]``: units at an index above i)."""
    hist = [[0] * (TOP_INDEX + 1) for _ in range(2)]
    for side, index, count in rows:
        hist[int(side)][int(index)] += int(count)
    out = []
    for h in hist:
        above, total = [], sum(h)
        for count in h:
            total -= count
            above.append(total)
        out.append(above)
    return out


def release(epsilon: Fraction, rows: Sequence[tuple[Any, ...]]) -> tuple[Fraction, Fraction]:
    """The noisy bounds from the engine's histogram (charged before this runs)."""
    k = Fraction(units_beyond(epsilon))
    upper_index, lower_mirrored = above_threshold(walks(epsilon), beyond(rows), [k, k])
    return from_release(TOP_INDEX - lower_mirrored, upper_index)


def from_release(lower_index: int, upper_index: int) -> tuple[Fraction, Fraction]:
    """The bounds from the two released ladder indices (post-processing).

    The lower bound never exceeds the upper one; equal rungs are widened by one rung up (a
    policy's bounds must satisfy lower < upper).
    """
    low, high = sorted((lower_index, upper_index))
    if low == high:
        high = min(high + 1, TOP_INDEX)
        if low == high:
            low -= 1
    return candidate(low), candidate(high)
