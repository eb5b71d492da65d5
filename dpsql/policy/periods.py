"""The policy's ``periods`` section: a person-within-period privacy unit under a lifetime cap.

A table made of blocks (``data.blocks``) may declare its unit to be a person within a period:
the unit is (the table's ``privacy_unit``, the block a row lies in), and each block is a period.
Two budgets then apply (docs/privacy.md, "Periods"):

- **the lifetime cap per person** is the data set's budget (``budget.epsilon``, or ``budget.rho``
  under zCDP), and it is the guarantee: each query is charged there for one person, whose rows
  can lie in every period the query reads (group privacy over min(|P|, m) person-periods,
  ``dpsql.mechanisms.group``), and composed under the deciding filter;
- **each period's budget** (``epsilon``, ``delta`` here) is an admission rule beneath it, for
  the person-period unit: the basic sum of the unit-level costs of the queries that read the
  period (``dpsql.accounting.budget.periods``). A query is refused when it would take any period
  it reads over this budget, or the lifetime cap over its own.
"""

from __future__ import annotations

from fractions import Fraction

from pydantic import Field, field_validator, model_validator

from dpsql.errors import ParameterError
from dpsql.policy.frozen import Frozen as _Frozen
from dpsql.policy.numbers import MAX_TOTAL_EPSILON, Exact, check_delta, check_epsilon

__all__ = ["PERIOD_COLUMN", "PeriodsSpec"]

# The column of a table made of blocks that holds each row's period: the start date of the
# block whose period the row lies in (``dpsql.engine.duckdb.views.block_source``). A block's
# files may not have it (registration refuses them, ``dpsql.session.blocks``).
PERIOD_COLUMN = "_dpsql_period"


class PeriodsSpec(_Frozen):
    """A person-within-period unit on ``table`` (a table made of blocks, whose blocks are the
    periods), each period's admission budget, and the largest number of periods a person is
    counted in."""

    table: str = Field(min_length=1, max_length=200)
    # Each period's budget for the person-period unit: the basic sum of the unit-level costs
    # (epsilon, delta) of the queries that read the period.
    epsilon: Exact
    delta: Exact = Fraction(0)

    @field_validator("table")
    @classmethod
    def _lower(cls, value: str) -> str:
        return value.lower()

    @model_validator(mode="after")
    def _valid(self) -> PeriodsSpec:
        try:
            check_epsilon(self.epsilon, "periods.epsilon", MAX_TOTAL_EPSILON)
            check_delta(self.delta, "periods.delta")
        except ParameterError as exc:
            raise ValueError(str(exc)) from None
        return self
