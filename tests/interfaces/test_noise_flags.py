"""A value that is mostly noise is flagged in every interface (docs/reading.md).

What must hold:

- the rule: a published value is flagged exactly when its ± is at least its magnitude or its
  interval spans the whole range its estimate is clamped to; keys, expressions and values
  without a ± never are (generated cases);
- the release computes it on both of its paths (the scratch database and the direct one);
- the shell and ``dpsql query`` print ``(mostly noise)``, the notebook marks the cell,
  ``cursor.noise`` holds the flags, CSV has ``<name> noise`` columns, JSON a ``noise`` array,
  and the server's NOTICE names the flagged columns (real psql);
- accuracy columns add no flag of their own, and a cached repeat flags the same cells.
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
        assert flags[2]  # the average's interval spans [0, 200]


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
        assert cur.fetchall() == rows and all(f[2] for f in cur.noise)
        cur.execute(CLEAR)
        cur.fetchall()
        assert not any(any(f) for f in cur.noise)  # thousands of rows per region: clear
        cur.execute("SET dpsql.accuracy_columns = on")
        cur.execute(NOISY)
        assert cur.description is not None
        names = [d[0] for d in cur.description]
        assert names == ["region", "n", "n ±", "m", "m ±"]
        assert all(f[2] is False and f[4] is False for f in cur.noise)  # ± columns: no flag
        assert all(f[3] for f in cur.noise)
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
    table = invoke(batch_policy, "query", sql)
    assert table.exit_code == 0, table.stderr
    body = [
        line for line in table.stdout.splitlines()[1:] if " ± " in line and "charged" not in line
    ]
    assert body and all(line.endswith("(mostly noise)") for line in body)
    rows = list(csv.reader(io.StringIO(invoke(batch_policy, "query", sql, "--format", "csv")
                                       .stdout)))  # fmt: skip
    assert rows[0] == ["region", "m", "m ±", "m noise"]
    assert all(r[3] == "True" for r in rows[1:])
    doc = json.loads(invoke(batch_policy, "query", sql, "--format", "json").stdout)
    assert [flags for flags in doc["noise"]] == [[False, True]] * len(doc["rows"])


def test_the_server_names_the_flagged_columns_in_its_notice(tmp_path: Path) -> None:
    dataset = write_dataset(tmp_path / "data")
    users = write_users(tmp_path / "users.json")
    policy, _ = write_server_policy(tmp_path / "server", dataset)
    with ServerThread(policy, users) as server:
        # 1,000 users, none older than the bound: an AVG over no row spans its bounds.
        out = psql(server.port, "alice", "SELECT AVG(age) AS a FROM visits WHERE age > 200;")
        clear = psql(server.port, "alice", "SELECT COUNT(*) AS n FROM visits;")
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
