"""``SET dpsql.accuracy_columns = on``: a column of half-widths after each aggregate output,
named ``<name> ±``, for clients that show columns only (psql, BI tools); a name that would
repeat a result column takes the first free number (``<name> ± 2``)."""

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
    ("sql", "columns"),
    [
        (
            'SELECT region, COUNT(*) AS n, SUM(age) AS "n ±" FROM visits GROUP BY region',
            ("region", "n", "n ± 2", "n ±", "n ± ±"),
        ),
        (
            'SELECT region, COUNT(*) AS n, SUM(age) AS "N ±" FROM visits GROUP BY region',
            ("region", "n", "n ± 2", "N ±", "N ± ±"),
        ),
        (
            'SELECT region AS "x ±", COUNT(*) AS x FROM visits GROUP BY region',
            ("x ±", "x", "x ± 2"),
        ),
        (
            'SELECT COUNT(*) AS n, COUNT(*) AS n, 1 AS "n ± 2" FROM visits',
            ("n", "n ±", "n", "n ± 3", "n ± 2"),
        ),
    ],
)
def test_a_colliding_name_takes_the_next_free_number(
    tiny_policy: TinyPolicy, sql: str, columns: tuple[str, ...]
) -> None:
    session = Session(tiny_policy(ROWS))
    session.execute("SET dpsql.accuracy_columns = on")
    result = session.execute(sql)
    assert result.columns == columns
    assert len({c.lower() for c in columns if c not in ("n", "x")}) == len(
        [c for c in columns if c not in ("n", "x")]
    )
    session.execute("SET dpsql.accuracy_columns = off")
    assert session.execute(sql).cached_from is not None  # the same release, free


def test_the_setting_is_a_boolean(tiny_policy: TinyPolicy) -> None:
    session = Session(tiny_policy(ROWS))
    with pytest.raises(ParameterError):
        session.execute("SET dpsql.accuracy_columns = 'maybe'")
