"""``SET dpsql.accuracy_columns = on``: a column of half-widths after each aggregate output,
named ``<name> ±``, and one of its mostly-noise flags, ``<name> noise``, for clients that show
columns only (psql, BI tools); a name that would repeat a result column takes the first free
number (``<name> ± 2``)."""

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


def test_each_aggregate_gets_its_half_width_and_flag_columns(tiny_policy: TinyPolicy) -> None:
    session = Session(tiny_policy(ROWS))
    session.execute("SET dpsql.accuracy_columns = on")
    result = session.execute(GROUPED)
    assert result.columns == ("region", "n", "n ±", "n noise", "mean", "mean ±", "mean noise")
    assert result.types[2] == result.types[5] == "DOUBLE"
    assert result.types[3] == result.types[6] == "BOOLEAN"
    plain = session.execute(GROUPED, accuracy_columns=False)  # the same release, from the cache
    assert plain.cached_from is not None and plain.columns == ("region", "n", "mean")
    rows = zip(result.rows, plain.rows, plain.accuracy, plain.noise, strict=True)
    for row, bare, widths, flags in rows:
        assert (row[0], row[1], row[4]) == bare
        assert row[2] == widths[1] and row[5] == widths[2]
        assert row[2] > 0 and math.isfinite(row[5])
        assert (row[3], row[6]) == (flags[1], flags[2])
    # cursor.accuracy and cursor.noise stay aligned with the columns: none for the key or an
    # added column; the value columns keep their flags.
    assert all(len(a) == 7 and a[0] is None and a[2] is None for a in result.accuracy)
    for row, flags in zip(result.rows, result.noise, strict=True):
        assert flags == (False, row[3], False, False, row[6], False, False)


@pytest.mark.parametrize(
    ("sql", "columns"),
    [
        (
            'SELECT region, COUNT(*) AS n, SUM(age) AS "n ±" FROM visits GROUP BY region',
            ("region", "n", "n ± 2", "n noise", "n ±", "n ± ±", "n ± noise"),
        ),
        (
            'SELECT region, COUNT(*) AS n, SUM(age) AS "N ±" FROM visits GROUP BY region',
            ("region", "n", "n ± 2", "n noise", "N ±", "N ± ±", "N ± noise"),
        ),
        (
            'SELECT region AS "x ±", COUNT(*) AS x FROM visits GROUP BY region',
            ("x ±", "x", "x ± 2", "x noise"),
        ),
        (
            'SELECT COUNT(*) AS n, COUNT(*) AS n, 1 AS "n ± 2" FROM visits',
            ("n", "n ±", "n noise", "n", "n ± 3", "n noise 2", "n ± 2"),
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
