"""One unit's values must never change how another unit's rows are bounded.

DuckDB folds expressions from a file's column statistics, and Parquet's min and max leave NaN
out. With the statistics optimizer on, a Parquet file of values {1.0, NaN} gave isnan(NaN) =
true, and the same file plus one unit's 201.0 gave isnan(NaN) = false and NaN > 200 = true: a
thousand units' NaN, skipped on D, were each counted and clamped to 200 on D' = D plus one unit.
The engine computes every row (``disabled_optimizers``), so on neighbouring files each exact
total and the diagnosis's histogram move by at most what one unit can move them.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from conftest import TinyPolicy

from dpsql.session.session import Session

NAN_UNITS = 50
QUERIES = [
    "SELECT COUNT(spend) FROM visits",
    "SELECT SUM(spend) FROM visits",
    "SELECT AVG(spend) FROM visits",
    "SELECT VARIANCE(spend) FROM visits",
    "SELECT MEDIAN(spend) FROM visits",
]


def _rows(extra: bool) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = [(0, "north", 30, 1.0)]
    rows += [(u, "north", 30, math.nan) for u in range(1, NAN_UNITS + 1)]
    return rows + ([(999, "north", 30, 201.0)] if extra else [])


def _totals(s: Session, sql: str, **kw: Any) -> list[Any]:
    plan = s.plan(sql, **kw)
    return list(s.engine.run(plan.bounded_sql)[1][0])


@pytest.mark.parametrize("sql", QUERIES)
def test_a_unit_s_large_value_leaves_the_other_units_nan_skipped(
    tiny_policy: TinyPolicy, sql: str
) -> None:
    d = Session(tiny_policy(_rows(False), max_groups=1, max_rows=1))
    d2 = Session(tiny_policy(_rows(True), max_groups=1, max_rows=1))
    plan = d.plan(sql)
    a, b = _totals(d, sql), _totals(d2, sql)
    for j, m in enumerate(plan.measurements):
        if m.exponential:
            # The histogram of grid points: one more row, in one bin.
            moved = sum(abs(b[j].get(k, 0) - a[j].get(k, 0)) for k in set(a[j]) | set(b[j]))
            assert moved <= 1, (sql, a, b)
        else:
            assert abs(int(b[j]) - int(a[j])) <= m.sensitivity, (sql, m.label, a, b)
    if "COUNT" in sql:
        assert (a[0], b[0]) == (1, 2)  # the NaN are skipped on both


@pytest.mark.parametrize(
    "where",
    [
        "spend > 150",
        "spend >= 0",
        "isnan(spend)",
        "spend <> 1",
        # Several terms, each made total on its own (dpsql.analyze.equalities): none a scan filter.
        "spend > 150 AND age > 0",
        "age > 0 AND region = 'north' AND spend > 150",
        "(spend > 150 OR age < 0) AND region = 'north'",
    ],
)
def test_a_filter_keeps_the_same_rows_of_the_other_units(
    tiny_policy: TinyPolicy, where: str
) -> None:
    """A WHERE on the float column: the NaN rows of the other units pass it or not on D and on
    D' alike, never as the file's statistics (which D' widens) say."""
    sql = f"SELECT COUNT(*) FROM visits WHERE {where}"
    d = Session(tiny_policy(_rows(False), max_groups=1, max_rows=1))
    d2 = Session(tiny_policy(_rows(True), max_groups=1, max_rows=1))
    (a,), (b,) = _totals(d, sql), _totals(d2, sql)
    assert 0 <= int(b) - int(a) <= 1, (where, a, b)


def test_the_diagnosis_flags_no_other_unit_s_nan(tiny_policy: TinyPolicy) -> None:
    sql = "SELECT SUM(spend) FROM visits"
    hist = []
    for extra in (False, True):
        s = Session(tiny_policy(_rows(extra), max_groups=1, max_rows=1))
        plan = s.plan(sql, diagnose=True)
        assert plan.diagnosis is not None
        cells = [0] * plan.diagnosis.cells
        for pattern, units in s.engine.run(plan.diagnosis.engine_sql)[1]:
            cells[int(pattern)] = int(units)
        hist.append(cells)
    assert sum(abs(x - y) for x, y in zip(*hist, strict=True)) == 1
