"""Every noisy measurement's exact total fits 38 digits on any data, proven from public bounds.

A group's total sums at most one unit's per-group bound from each unit, and no table holds more
than 2^63 - 1 rows: a plan whose bound times 2^63 - 1 exceeds 10^38 - 1 (Spark's DECIMAL(38,0))
is refused before the charge, on every engine alike; one just inside is planned.
"""

from __future__ import annotations

import pytest
from conftest import TINY_COLUMNS, TinyPolicy

from dpsql.errors import BoundsError
from dpsql.plan.plans import MAX_EXACT_TOTAL, MAX_ROWS
from dpsql.session.session import Session

ROWS = [(1, "east", 30, 2.0**31), (2, "west", 40, 2.0**31 + 1)]
# spend in [2^31, 2^31 + 1]: a grid of 2^-20, so about 2^51 grid units a row
OFF_CENTRE = {**TINY_COLUMNS, "spend": {"lower": 2**31, "upper": 2**31 + 1}}


def test_a_total_that_could_pass_38_digits_is_refused_before_the_charge(
    tiny_policy: TinyPolicy,
) -> None:
    # 10,000 rows a group: about 2^64.3 units a group per unit, times 2^63 units: past 10^38.
    session = Session(tiny_policy(ROWS, max_rows=10_000, columns=OFF_CENTRE))
    try:
        before = session.budget().epsilon_spent
        with pytest.raises(BoundsError, match="38 digits"):
            session.execute("SELECT SUM(spend) AS s FROM visits")
        assert session.budget().epsilon_spent == before
        session.execute("SELECT COUNT(*) AS n FROM visits")  # a count's bound is C: it fits
    finally:
        session.close()


def test_a_total_inside_38_digits_is_planned_and_answered(tiny_policy: TinyPolicy) -> None:
    session = Session(tiny_policy(ROWS, max_rows=1, columns=OFF_CENTRE))
    try:
        plan = session.plan("SELECT SUM(spend) AS s FROM visits")
        (m,) = plan.measurements
        assert m.per_group > 2**50  # about 2^51 units a row, one row a group
        assert m.per_group * MAX_ROWS <= MAX_EXACT_TOTAL
        session.execute("SELECT SUM(spend) AS s FROM visits")
    finally:
        session.close()
