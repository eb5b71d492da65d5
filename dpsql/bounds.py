"""Clamping bounds estimated from the data, under differential privacy, when the user asks.

``ESTIMATE BOUNDS FOR table.column`` answers an ordinary dpsql query,

    SELECT QUANTILE_CONT(<bucket of column>, 0.01), QUANTILE_CONT(<bucket of column>, 0.99)
    FROM table

where the bucket maps a value to its index on a fixed, data-independent ladder of candidates
``0, ±2^-8, ±2^-7, ..., ±2^52`` (rounded down to a rung for the lower bound, up for the upper
one, so that each bound lies beyond the values it was read from). The two
quantiles are exponential-mechanism releases like any other (charged, cached, recorded in the
ledger), so the bounds they give are post-processing of released values: public from then on.
The estimate is recorded beside the release, and later queries over a column with no declared
bounds use it (for the same policy and data version), as if the data owner had declared it.

This is the coarse-ladder approach of Smith's "Privacy-preserving statistical estimation with
optimal convergence rates" (STOC 2011) and of the clamping-bound estimators of OpenDP and
Tumult: a geometric grid needs no prior range, and rounding outwards errs towards wider bounds
(more noise) rather than towards clamping more of the data.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from dpsql.errors import SchemaError, UnsupportedQueryError
from dpsql.policy import Policy
from dpsql.sql.relations import NUMERIC

LOWEST_POWER = -8  # the smallest magnitude on the ladder, 2^-8
HIGHEST_POWER = 52  # the largest, 2^52 (the largest bound a policy may declare)
_RUNGS = HIGHEST_POWER - LOWEST_POWER + 1
ZERO_INDEX = _RUNGS  # the index of the candidate 0
TOP_INDEX = 2 * _RUNGS  # the index of +2^52 (0 is -2^52)
LOWER_P = Fraction(1, 100)  # the quantiles the bounds are read at
UPPER_P = Fraction(99, 100)
RECORD_KIND = "bounds"  # ledger records of estimated bounds (post-processing, never charged)


def candidate(index: int) -> Fraction:
    """The ladder value at ``index`` in [0, TOP_INDEX]."""
    if not 0 <= index <= TOP_INDEX:
        raise ValueError("a ladder index out of range")
    if index == ZERO_INDEX:
        return Fraction(0)
    if index > ZERO_INDEX:
        return Fraction(2) ** (LOWEST_POWER + index - ZERO_INDEX - 1)
    return -(Fraction(2) ** (LOWEST_POWER + ZERO_INDEX - index - 1))


def _bucket(column: str, up: bool = True) -> str:
    """Row-level SQL: a value's ladder index, NULL and NaN staying NULL.

    ``up``: the smallest rung at or above the value (for the upper bound); otherwise the largest
    rung at or below it (for the lower bound), which is minus the rung above the negated value.
    Either way the estimated bound lies beyond the data it was read from, never inside it.
    Values beyond ±2^52 go to the ends of the ladder.
    """
    x = f'CAST("{column}" AS DOUBLE)' if up else f'(-CAST("{column}" AS DOUBLE))'
    ceil = f"LEAST(GREATEST(CEIL(LOG2({x})), {LOWEST_POWER}), {HIGHEST_POWER})"
    floor = f"LEAST(FLOOR(LOG2(-{x})), {HIGHEST_POWER})"
    above = ZERO_INDEX + 1 - LOWEST_POWER
    below = ZERO_INDEX - 1 + LOWEST_POWER
    # x > 0: the rung 2^ceil(log2 x); x < 0: -2^floor(log2 |x|), or 0 when |x| < 2^-8.
    ladder = (
        f"CASE WHEN {x} = 0 THEN {ZERO_INDEX} WHEN {x} > 0 THEN {above} + {ceil} "
        f"WHEN -{x} < {float(Fraction(2) ** LOWEST_POWER)} THEN {ZERO_INDEX} "
        f"ELSE {below} - {floor} END"
    )
    index = ladder if up else f"{TOP_INDEX} - ({ladder})"
    # DuckDB's GREATEST skips NULL, so the NULL/NaN test must sit outside the clamp.
    return (
        f"CASE WHEN {x} IS NULL OR isnan({x}) THEN NULL "
        f"ELSE LEAST(GREATEST({index}, 0), {TOP_INDEX}) END"
    )


def bounds_query(policy: Policy, catalog: Any, table: str, column: str) -> str:
    """The dpsql query whose two quantile releases give the bounds of ``table.column``."""
    table, column = table.lower(), column.lower()
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
    return (
        f"SELECT QUANTILE_CONT({_bucket(column, up=False)}, {float(LOWER_P)}) AS lower_index, "
        f'QUANTILE_CONT({_bucket(column)}, {float(UPPER_P)}) AS upper_index FROM "{table}"'
    )


def from_release(lower_index: float, upper_index: float) -> tuple[Fraction, Fraction]:
    """The bounds from the two released ladder indices (post-processing).

    The lower bound never exceeds the upper one; equal rungs are widened by one rung up (a
    policy's bounds must satisfy lower < upper).
    """
    low, high = sorted((round(lower_index), round(upper_index)))
    if low == high:
        high = min(high + 1, TOP_INDEX)
        if low == high:
            low -= 1
    return candidate(low), candidate(high)
