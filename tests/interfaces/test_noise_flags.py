"""A value that is mostly noise is flagged in every interface (docs/reading.md).

What must hold:

- the rule: a published value is flagged exactly when its ± is at least its magnitude or its
  interval spans the whole range its estimate is clamped to; keys, expressions and values
  without a ± never are (generated cases);
- the release computes it on both of its paths (the scratch database and the direct one);
- the shell and ``dpsql query`` print ``(mostly noise)``, the notebook marks the cell,
  ``cursor.noise`` holds the flags, CSV has ``<name> noise`` columns, JSON a ``noise`` array,
  and the server's NOTICE names the flagged columns (real psql);
- with accuracy columns on, a ``<name> noise`` column after each ``<name> ±`` holds the flags
  (psql, BI tools); a cached repeat flags the same cells.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from server_fixtures import ServerThread, psql, write_dataset, write_users
from server_fixtures import write_policy as write_server_policy
from test_batch import invoke
from test_batch import policy as batch_policy  # noqa: F401  (a fixture)

import dpsql
from dpsql.interfaces.shell.core import Shell
from dpsql.release.post import mostly_noise
from dpsql.release.result import to_html
from dpsql.session.session import Session

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "policy.toml"
# Almost no row has spend above 199.99: each group's count and average are mostly noise.
NOISY = (
    "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon = 0.05) region, COUNT(*) AS n, "
    "AVG(spend) AS m FROM visits WHERE spend > 199.99 GROUP BY region"
)
CLEAR = "SELECT region, COUNT(*) AS n FROM visits GROUP BY region"
REGIONS = ("central", "east", "north", "south", "west")

finite = st.floats(-1e12, 1e12, allow_nan=False)


@settings(max_examples=examples(200))
@given(value=finite, width=st.floats(0, 1e12), lo=finite, span=st.floats(0, 1e12))
def test_the_rule(value: float, width: float, lo: float, span: float) -> None:
    hi = lo + span
    spans = value - width <= lo and value + width >= hi
    assert mostly_noise(value, width, (lo, hi)) == (width >= abs(value) or spans)
    assert mostly_noise(value, width, None) == (width >= abs(value))
    assert not mostly_noise(value, None, (lo, hi))
    assert not mostly_noise(None, width, None)
    assert not mostly_noise("east", width, None)
    assert not mostly_noise(True, width, None)
    assert not mostly_noise(math.nan, width, None)


def _check(
    result_noise: tuple[tuple[bool, ...], ...],
    rows: list[tuple[object, ...]],
    accuracy: tuple[tuple[float | None, ...], ...],
) -> None:
    assert len(result_noise) == len(rows)
    for row, widths, flags in zip(rows, accuracy, result_noise, strict=True):
        assert flags[0] is False  # the key
        n = row[1]
        assert isinstance(n, int) and n >= 0 and widths[1] is not None
        assert flags[1] == (widths[1] >= abs(n))
        # The average of spend in [0, 200]: flagged when its ± reaches its size or its
        # interval spans the bounds (nearly always here: a noisy count near 0).
        m, w = row[2], widths[2]
        assert isinstance(m, float) and w is not None
        assert flags[2] == (w >= abs(m) or (m - w <= 0 and m + w >= 200))


def test_the_release_and_the_cursor_flag_each_cell() -> None:
    conn = dpsql.connect(str(EXAMPLE))
    try:
        cur = conn.cursor()
        cur.execute(NOISY)
        rows = cur.fetchall()
        _check(cur.noise, rows, cur.accuracy)
        assert any(flags[1] for flags in cur.noise)
        cur.execute(NOISY)  # served again from the cache: the same flags
        assert cur.result is not None and cur.result.cached_from is not None
        assert cur.fetchall() == rows
        _check(cur.noise, rows, cur.accuracy)
        cur.execute(CLEAR)
        cur.fetchall()
        assert not any(any(f) for f in cur.noise)  # thousands of rows per region: clear
        cur.execute("SET dpsql.accuracy_columns = on")
        cur.execute(NOISY)
        assert cur.description is not None
        names = [d[0] for d in cur.description]
        assert names == ["region", "n", "n ±", "n noise", "m", "m ±", "m noise"]
        rows = cur.fetchall()
        # The flag columns hold the flags; the added columns have none of their own.
        assert [r[3] for r in rows] == [f[1] for f in cur.noise]
        assert [r[6] for r in rows] == [f[4] for f in cur.noise]
        assert not any(f[2] or f[3] or f[5] or f[6] for f in cur.noise)
    finally:
        conn.close()


def test_the_notebook_and_the_shell_mark_it() -> None:
    session = Session(EXAMPLE)
    try:
        result = session.execute(NOISY)
        page = to_html(result)
        assert page.count("<em>mostly noise</em>") == sum(map(sum, result.noise))
        shown = Shell(session).handle(f"{NOISY};")
        assert shown.count("(mostly noise)") == sum(map(sum, result.noise))
        clear = Shell(session).handle(f"{CLEAR};")
        assert "mostly noise" not in clear
    finally:
        session.close()


def test_dpsql_query_marks_it_in_every_format(batch_policy: Path) -> None:  # noqa: F811
    sql = (
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon = 0.05) region, AVG(spend) AS m "
        "FROM visits WHERE spend > 199.99 GROUP BY region"
    )
    # One release, charged once; the text and CSV are served again from the cache.
    doc = json.loads(invoke(batch_policy, "query", sql, "--format", "json").stdout)
    flags = [row[1] for row in doc["noise"]]
    assert [row[0] for row in doc["noise"]] == [False] * len(doc["rows"])
    for (_, m), (_, w), flag in zip(doc["rows"], doc["accuracy"], flags, strict=True):
        assert flag == (w >= abs(m) or (m - w <= 0 and m + w >= 200))
    assert any(flags)
    table = invoke(batch_policy, "query", sql)
    assert table.exit_code == 0, table.stderr
    body = [line for line in table.stdout.splitlines()[1:] if line.split()[0] in REGIONS]
    assert [line.endswith("(mostly noise)") for line in body] == flags
    rows = list(csv.reader(io.StringIO(invoke(batch_policy, "query", sql, "--format", "csv")
                                       .stdout)))  # fmt: skip
    assert rows[0] == ["region", "m", "m ±", "m noise"]
    assert [r[3] == "True" for r in rows[1:]] == flags


def test_the_server_names_the_flagged_columns_in_its_notice(tmp_path: Path) -> None:
    dataset = write_dataset(tmp_path / "data")
    users = write_users(tmp_path / "users.json")
    policy, _ = write_server_policy(tmp_path / "server", dataset)
    with ServerThread(policy, users) as server:
        # 1,000 users, none older than the bound: an AVG over no row spans its bounds.
        out = psql(server.port, "alice", "SELECT AVG(age) AS a FROM visits WHERE age > 200;")
        # At epsilon 0.5 the count's ± is about 30 beside some 3,000: never mostly noise (at the
        # policy's 0.01 it is about 1,500, and one run in 40 drew a count below it).
        clear = psql(
            server.port, "alice", "SET dpsql.epsilon = 0.5;\nSELECT COUNT(*) AS n FROM visits;"
        )
    assert out.returncode == 0 and clear.returncode == 0, out.stderr + clear.stderr
    notice = [line for line in out.stderr.splitlines() if line.startswith("NOTICE:  dpsql: ch")]
    assert len(notice) == 1 and "mostly noise (± at least the value) in: a" in notice[0]
    assert "mostly noise" not in clear.stderr


@pytest.mark.parametrize("mechanism", ["laplace", "gaussian"])
def test_both_release_paths_agree(mechanism: str) -> None:
    """A query that only picks columns takes the direct path; one with an expression the
    scratch database: the flags of the common columns are the same rule's."""
    session = Session(EXAMPLE)
    try:
        direct = session.execute(NOISY, mechanism=mechanism, fresh=True)
        scratch = session.execute(NOISY.replace("AS m ", "AS m, 1 + 1 AS two "),
                                  mechanism=mechanism, fresh=True)  # fmt: skip
        for result in (direct, scratch):
            _check(result.noise, list(result.rows), result.accuracy)
        assert all(not f[3] for f in scratch.noise)  # an expression's value has no ±
    finally:
        session.close()
