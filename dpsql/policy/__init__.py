"""The policy: what data dpsql serves, who the privacy unit is, which bounds hold, the budget.

A policy is a TOML file (see ``docs/policy.md``) loaded into frozen pydantic models. Privacy
parameters and value bounds are exact rationals parsed from their decimal text: TOML floats are
read as ``Decimal`` so that ``0.01`` is exactly 1/100 (``Fraction(0.01)`` is slightly above it,
and a budget check on it would be off by one query in a hundred).

Its parts: ``dpsql.policy.numbers`` (exact numbers and their limits), ``dpsql.policy.spec``
(the pydantic models), ``dpsql.policy.load`` (reading and validating a policy),
``dpsql.policy.schema`` (the check against the data's schema), ``dpsql.policy.files`` (the data
files' identities, checked before each charge) and ``dpsql.policy.exposure`` (which columns a
table shows); this module re-exports the first four's names.
"""

from __future__ import annotations

from dpsql.policy.engine import EngineSpec
from dpsql.policy.load import MAX_POLICY_BYTES, MAX_POLICY_DEPTH, load_policy, read_limited
from dpsql.policy.numbers import (
    LARGEST_NUMBER,
    MAX_ABS_BOUND,
    MAX_CONTRIBUTION_BOUND,
    MAX_NUMBER_BITS,
    MAX_NUMBER_TEXT,
    MAX_QUERY_EPSILON,
    MAX_TOTAL_EPSILON,
    SMALLEST_NUMBER,
    Exact,
    check_delta,
    check_epsilon,
    to_fraction,
)
from dpsql.policy.periods import PERIOD_COLUMN, PeriodsSpec
from dpsql.policy.schema import check_against_schema, did_you_mean
from dpsql.policy.spec import (
    FILTER_VERSION,
    MAX_DATE_RANGE_DAYS,
    BudgetSpec,
    ColumnSpec,
    DatasetSpec,
    DataSpec,
    DeclaredMechanism,
    FilterVersion,
    LedgerSpec,
    Mechanism,
    Policy,
    PublicValue,
    ShareSpec,
    TableSpec,
    UnitLink,
)

__all__ = [
    "FILTER_VERSION",
    "LARGEST_NUMBER",
    "MAX_ABS_BOUND",
    "MAX_CONTRIBUTION_BOUND",
    "MAX_DATE_RANGE_DAYS",
    "MAX_NUMBER_BITS",
    "MAX_NUMBER_TEXT",
    "MAX_POLICY_BYTES",
    "MAX_POLICY_DEPTH",
    "MAX_QUERY_EPSILON",
    "MAX_TOTAL_EPSILON",
    "PERIOD_COLUMN",
    "SMALLEST_NUMBER",
    "BudgetSpec",
    "ColumnSpec",
    "DataSpec",
    "DatasetSpec",
    "DeclaredMechanism",
    "EngineSpec",
    "Exact",
    "FilterVersion",
    "LedgerSpec",
    "Mechanism",
    "PeriodsSpec",
    "Policy",
    "PublicValue",
    "ShareSpec",
    "TableSpec",
    "UnitLink",
    "check_against_schema",
    "check_delta",
    "check_epsilon",
    "did_you_mean",
    "load_policy",
    "read_limited",
    "to_fraction",
]
