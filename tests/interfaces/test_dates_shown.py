"""A month from ``date_trunc('month', a_date)`` (a TIMESTAMP in DuckDB and PostgreSQL alike)
is shown as a date in the shell, the notebook, CSV and JSON, with no spurious ``00:00:00``;
the cursor, the frames and the wire keep the engine's TIMESTAMP. A timestamp column with a
time of day in any row keeps its times everywhere."""

from __future__ import annotations

import csv
import datetime
import io
import json
from pathlib import Path

import pytest
from test_batch import invoke
from test_batch import policy as batch_policy  # noqa: F401  (a fixture)

import dpsql
from dpsql.interfaces.shell.core import Shell
from dpsql.release.result import Result, shown_rows, to_html
from dpsql.session.session import Session

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "policy.toml"
MONTHS = "SELECT date_trunc('month', day) AS m, COUNT(*) AS n FROM visits GROUP BY 1"


def test_the_cursor_keeps_the_engine_s_timestamp_and_text_shows_dates() -> None:
    conn = dpsql.connect(str(EXAMPLE))
    try:
        cur = conn.cursor()
        cur.execute(MONTHS)
        assert cur.description is not None and cur.description[0][1] == "TIMESTAMP"
        rows = cur.fetchall()
        assert all(isinstance(m, datetime.datetime) for m, _ in rows)
        assert cur.result is not None
        page = to_html(cur.result)
        assert "2026-01-01</td>" in page and "00:00:00" not in page
    finally:
        conn.close()


def test_the_shell_shows_dates() -> None:
    session = Session(EXAMPLE)
    try:
        shown = Shell(session).handle(f"{MONTHS};")
        assert "2026-03-01" in shown and "00:00:00" not in shown
    finally:
        session.close()


def test_dpsql_query_shows_dates_in_text_csv_and_json(batch_policy: Path) -> None:  # noqa: F811
    table = invoke(batch_policy, "query", MONTHS)
    assert table.exit_code == 0, table.stderr
    assert "2026-01-01" in table.stdout and "00:00:00" not in table.stdout
    rows = list(csv.reader(io.StringIO(invoke(batch_policy, "query", MONTHS, "--format", "csv")
                                       .stdout)))  # fmt: skip
    assert rows[1][0] == "2026-01-01"
    doc = json.loads(invoke(batch_policy, "query", MONTHS, "--format", "json").stdout)
    assert doc["rows"][0][0] == "2026-01-01" and doc["types"][0] == "TIMESTAMP"


@pytest.mark.parametrize(
    ("values", "shown"),
    [
        (
            [datetime.datetime(2026, 1, 1), None, datetime.datetime(2026, 2, 1)],
            [datetime.date(2026, 1, 1), None, datetime.date(2026, 2, 1)],
        ),
        (
            [datetime.datetime(2026, 1, 1), datetime.datetime(2026, 1, 1, 12, 30)],
            [datetime.datetime(2026, 1, 1), datetime.datetime(2026, 1, 1, 12, 30)],
        ),
        ([None, None], [None, None]),
    ],
)
def test_only_a_column_all_at_midnight_shows_dates(
    values: list[datetime.datetime | None], shown: list[object]
) -> None:
    result = Result(
        columns=("t", "n"),
        types=("TIMESTAMP", "BIGINT"),
        rows=tuple((v, 1) for v in values),
    )
    assert [row[0] for row in shown_rows(result)] == shown
    varchar = Result(columns=("t",), types=("VARCHAR",), rows=tuple((v,) for v in values))
    assert shown_rows(varchar) == varchar.rows
