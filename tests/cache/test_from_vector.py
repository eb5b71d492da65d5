"""COUNT(x), SUM(x) and AVG(x) served from a released Bernstein vector of x, free.

A VARIANCE or STDDEV under the Laplace releases x's three Bernstein coordinates
(``dpsql.plan.aggregates.bernstein``); N, the centred sum and SUM are linear in them, so a later
COUNT, SUM or AVG of x over the same bounded rows is post-processing of that release
(``dpsql.cache.derive._from_vector``). Checked: nothing is charged and the release served is
the vector's; on zero noise the derived answers are a fresh query's exactly where no bound
binds, and the count is exact where one does; the half-widths cover the noise (end to end,
with a power check); what the vector cannot give (COUNT(*), another value) is charged.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_bernstein import coverage_policy, covers, plain_sql
from test_variance import make_policy, small_rows

from dpsql.noise import measure
from dpsql.session.session import Session

VAR = "SELECT region, VAR_POP(spend) FROM visits GROUP BY region"
DERIVED = "SELECT region, COUNT(spend), SUM(spend), AVG(spend) FROM visits GROUP BY region"


@pytest.fixture
def zero_noise(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every noise draw is 0: the released values are the bounded totals."""

    def zeros(_scale: object, size: int) -> np.ndarray[Any, Any]:
        return np.zeros(size, dtype=np.int64)

    monkeypatch.setattr(measure, "discrete_laplace", zeros)
    yield


def test_count_sum_and_avg_after_a_variance_are_served_free(tmp_path: Path) -> None:
    session = Session(make_policy(tmp_path, small_rows()))
    var = session.execute(VAR)
    assert var.charge is not None and session.plan(VAR).estimates[0].joint
    spent = session.budget().epsilon_spent
    served = session.execute(VAR).cached_from  # the vector's release record
    assert served is not None
    for sql in (
        DERIVED,
        "SELECT region, COUNT(spend) FROM visits GROUP BY region",
        "SELECT region, SUM(spend) FROM visits GROUP BY region",
        "SELECT region, AVG(spend) FROM visits GROUP BY region",
    ):
        result = session.execute(sql)
        assert result.charge is None and result.cached_from == served, sql
        assert all(w is not None for row in result.accuracy for w in row[1:]), sql
    assert session.budget().epsilon_spent == spent
    # What the vector does not measure is charged: the rows, another value.
    assert session.execute("SELECT region, COUNT(*) FROM visits GROUP BY region").charge
    assert session.execute("SELECT region, SUM(age) FROM visits GROUP BY region").charge


def _hostile_rows() -> list[tuple[Any, ...]]:
    """small_rows, and units holding more than C = 3 rows in a region (their cells scaled),
    values at and past the bounds, NaN and NULL."""
    rows = small_rows()
    for user in range(100, 106):
        for i in range(9):
            spend = [float("nan"), None, -50.0, 0.0, 199.5, 200.0, 1e9, 37.25, 3.5][i]
            rows.append((user, "north" if user % 2 else "south", spend, 40))
    return rows


@pytest.mark.parametrize("hostile", [False, True])
def test_on_zero_noise_the_derived_answers_are_the_bounded_ones(
    tmp_path: Path, zero_noise: None, hostile: bool
) -> None:
    """The count is a fresh COUNT's bounded total exactly (each cell's vector has L1 4w²·c).
    SUM and AVG are a fresh query's exactly where no cell is scaled, and within the roundings of
    the scaled cells' coordinates where some are."""
    rows = _hostile_rows() if hostile else small_rows()
    served = Session(make_policy(tmp_path, rows, name="served"))
    assert served.execute(VAR).charge is not None
    derived = served.execute(DERIVED)
    assert derived.charge is None
    fresh = Session(make_policy(tmp_path, rows, name="fresh")).execute(DERIVED)
    assert fresh.charge is not None
    for (group, n, s, a), (group2, n2, s2, a2) in zip(derived.rows, fresh.rows, strict=True):
        assert group == group2 and n == n2 and isinstance(n, int)
        if hostile:
            # At most 6 scaled cells, each's centred sum off by under one step of g/2 = 1/16384.
            assert abs(s - s2) <= 6 / 16384 and abs(a - a2) <= 1e-6 * max(1.0, abs(a2))
        else:
            assert (s, a) == (s2, a2)


@pytest.mark.statistical
def test_the_derived_half_widths_cover_the_noise(tiny_policy: Any) -> None:
    """COUNT(age) and SUM(age) served from 120 fresh variance releases over 20 groups (no bound
    binds, so the truth is the plain SQL's): each lies within its half-width of the truth in at
    least 95 % of the 2 400 draws (one-sided binomial test at 1e-6), and the widths shrunk to
    40 % are rejected by the same test."""
    policy = coverage_policy(tiny_policy, 5)
    truth = plain_sql(policy, "COUNT(age), SUM(age)")
    session = Session(policy)
    var = "SELECT region, VAR_POP(age) FROM visits GROUP BY region"
    asked = "SELECT region, COUNT(age), SUM(age) FROM visits GROUP BY region"
    errors: dict[int, list[float]] = {0: [], 1: []}
    widths: dict[int, list[float]] = {0: [], 1: []}
    last = 0
    for _ in range(120):
        assert session.execute(var, fresh=True, confidence=0.95).charge is not None
        result = session.execute(asked, confidence=0.95)
        # Served from the release just made (the latest of its core), free.
        assert result.charge is None and result.cached_from is not None
        assert result.cached_from > last
        last = result.cached_from
        for row, accuracy in zip(result.rows, result.accuracy, strict=True):
            for j in (0, 1):
                width = accuracy[j + 1]
                assert width is not None
                errors[j].append(abs(row[j + 1] - truth[row[0]][j]))
                widths[j].append(width)

    for j in (0, 1):
        assert covers(errors[j], widths[j], 1.0)
        assert not covers(errors[j], widths[j], 0.4)
