"""``SET dpsql.accuracy_columns = on``: a column of half-widths after each aggregate output,
named ``<name> ±``, for clients that show columns only (psql, BI tools); a name that would
repeat a result column is refused before the charge."""

from __future__ import annotations

import math

import pytest
from conftest import TinyPolicy

from dpsql.errors import ParameterError
from dpsql.session.session import Session

ROWS = [(u, ("east", "west")[u % 2], 18 + u % 60, float(u % 50)) for u in range(1, 300)]
GROUPED = "SELECT region, COUNT(*) AS n, AVG(spend) AS mean FROM visits GROUP BY region"


def test_off_by_default(tiny_policy: TinyPolicy) -> None:
    result = Session(tiny_policy(ROWS)).execute(GROUPED)
    assert result.columns == ("region", "n", "mean")


def test_each_aggregate_gets_its_half_width_column(tiny_policy: TinyPolicy) -> None:
    session = Session(tiny_policy(ROWS))
    session.execute("SET dpsql.accuracy_columns = on")
    result = session.execute(GROUPED)
    assert result.columns == ("region", "n", "n ±", "mean", "mean ±")
    assert result.types[2] == result.types[4] == "DOUBLE"
    plain = session.execute(GROUPED, accuracy_columns=False)  # the same release, from the cache
    assert plain.cached_from is not None and plain.columns == ("region", "n", "mean")
    for row, bare, widths in zip(result.rows, plain.rows, plain.accuracy, strict=True):
        assert (row[0], row[1], row[3]) == bare
        assert row[2] == widths[1] and row[4] == widths[2]
        assert row[2] > 0 and math.isfinite(row[4])
    # cursor.accuracy stays aligned with the columns: none for the key or a ± column.
    assert all(len(a) == 5 and a[0] is None and a[2] is None for a in result.accuracy)


@pytest.mark.parametrize(
    "sql",
    [
        'SELECT region, COUNT(*) AS n, SUM(age) AS "n ±" FROM visits GROUP BY region',
        'SELECT region, COUNT(*) AS n, MIN(age) AS "N ±" FROM visits GROUP BY region',
        'SELECT region AS "x ±", COUNT(*) AS x FROM visits GROUP BY region',
    ],
)
def test_a_colliding_name_is_refused_before_the_charge(tiny_policy: TinyPolicy, sql: str) -> None:
    session = Session(tiny_policy(ROWS))
    session.execute("SET dpsql.accuracy_columns = on")
    with pytest.raises(ParameterError, match="accuracy column"):
        session.execute(sql)
    assert session.budget().queries == 0
    session.execute("SET dpsql.accuracy_columns = off")
    assert session.execute(sql).columns[-1] in ("n ±", "N ±", "x")


def test_the_setting_is_a_boolean(tiny_policy: TinyPolicy) -> None:
    session = Session(tiny_policy(ROWS))
    with pytest.raises(ParameterError):
        session.execute("SET dpsql.accuracy_columns = 'maybe'")
