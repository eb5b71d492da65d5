"""Clamping bounds estimated from the data, under differential privacy, when the user asks.

``ESTIMATE BOUNDS FOR table.column`` reads one value per unit and side: the unit's largest
value, rounded up to a rung of a fixed ladder, for the upper bound; its smallest, rounded down,
for the lower one. The ladder needs no prior range: ``0`` and ``±m·2^e`` for the mantissas
``m = 1, 1.25, 1.5, 1.75`` and ``e = -20, ..., 51``, up to ``±2^52`` (the largest bound a policy
may declare). All rungs are exact doubles, so the engine places each value exactly; the ladder
and the engine's query are ``dpsql.bound.estimates``'s.

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
from dpsql.analyze.units import unit_source
from dpsql.bound.estimates import TOP_INDEX, candidate, extremes_query
from dpsql.errors import SchemaError, UnsupportedQueryError
from dpsql.noise.sparse_vector import Walks, above_threshold, beyond_each, overrun
from dpsql.plan.auto import noise_per_unit
from dpsql.policy import Policy
from dpsql.sql.parse import DIALECT

UNITS_BEYOND = 6  # k·epsilon: units each bound may leave beyond it, up to the noise
RECORD_KIND = "bounds"  # ledger records of estimated bounds (post-processing, never charged)


def units_beyond(epsilon: Fraction) -> int:
    """``k``: how many units each bound leaves beyond it, up to the noise."""
    return max(1, math.ceil(UNITS_BEYOND / epsilon))


def check_column(policy: Policy, catalog: Any, table: str, column: str) -> tuple[str, str]:
    """(source, unit column) of ``table``'s rows (``dpsql.analyze.units.unit_source``), after
    checking that ``column`` can be estimated; refused on the schema and the policy alone,
    before anything is charged."""
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
    return unit_source(policy, catalog, table, [column])


def bounds_query(policy: Policy, catalog: Any, table: str, column: str) -> str:
    """The engine's SQL of the per-unit values (``dpsql.bound.estimates.extremes_query``), after
    the checks on public facts: per side and ladder index, how many units have their extreme
    value there."""
    table, column = table.lower(), column.lower()
    source, unit = check_column(policy, catalog, table, column)
    return extremes_query(unit, source, column).sql(dialect=DIALECT)


def walks(epsilon: Fraction) -> Walks:
    """Both walks at the estimate's epsilon, sensitivity 1 (one value per unit and side)."""
    return Walks(epsilon, 2)


def uncertainty(epsilon: Fraction, confidence: float) -> int:
    """How many units beyond its aim each bound may cut, at ``confidence`` (both walks: the
    shared threshold noise and every rung's query noise, ``sparse_vector.overrun``)."""
    return overrun(walks(epsilon), TOP_INDEX + 1, 1 - confidence)


def scales(epsilon: Fraction) -> tuple[Fraction, ...]:
    """Every discrete Laplace scale the release draws at ``epsilon`` (checked before the
    charge)."""
    w = walks(epsilon)
    return (w.threshold_scale, w.query_scale)


def beyond(rows: Sequence[tuple[Any, ...]]) -> list[list[int]]:
    """Per side, the units beyond each rung (``above[i]``: units at an index above i)."""
    hist = [[0] * (TOP_INDEX + 1) for _ in range(2)]
    for side, index, count in rows:
        hist[int(side)][int(index)] += int(count)
    return [beyond_each(h) for h in hist]


def release(
    epsilon: Fraction, rows: Sequence[tuple[Any, ...]], target: Fraction | None = None
) -> tuple[Fraction, Fraction]:
    """The noisy bounds from the engine's histogram (charged before this runs); ``target``:
    aimed at queries at that epsilon, ``k = √2/target`` units beyond each bound (the trade-off
    of ``dpsql.plan.auto``), else ``units_beyond(epsilon)``."""
    k = Fraction(units_beyond(epsilon)) if target is None else noise_per_unit([target])
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
