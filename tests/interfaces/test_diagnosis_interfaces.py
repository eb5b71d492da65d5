"""The diagnosis of the bounds through every interface: the shell (its core and a real
terminal), ``dpsql run --diagnose`` and ``dpsql query``, the server over the wire with real
psql, and the DB-API; and every ± printed says what it covers."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
from interface_fixtures import example_data, shell  # noqa: F401  (fixtures)
from server_fixtures import ServerThread, psql, write_dataset, write_users
from server_fixtures import write_policy as write_server_policy
from test_batch import GROUP, invoke, sql_file
from test_batch import policy as batch_policy  # noqa: F401  (a fixture)
from test_shell import COUNT, write_policy

import dpsql
from dpsql.interfaces.shell.core import Shell

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "examples" / "data" / "visits.parquet"
SUMMARY = re.compile(r"noise only; bounds cut ~[\d.]+% of units")


def test_the_shell_toggles_the_diagnosis_and_says_what_the_plus_minus_covers(
    shell: Shell,  # noqa: F811
) -> None:
    plain = shell.handle(f"{COUNT};")
    assert "±: noise only\n" in plain and "diagnosis:" not in plain
    assert "diagnosis on" in shell.handle("\\diagnose")
    explained = shell.handle(f"\\explain {COUNT}")
    assert "(the diagnosis's epsilon 0.025 included)" in explained
    assert "would charge epsilon 0.275, delta 0" in explained
    shown = shell.handle("SET dpsql.max_rows_per_unit_per_group = 3; " + COUNT + ";")
    assert SUMMARY.search(shown), shown
    assert re.search(r"diagnosis: bounds cut ~[\d.]+% of units \(± [\d.]+%\): C ", shown)
    assert "charged epsilon 0.275, delta 0" in shown
    assert shell.handle("\\diagnose off") == "diagnosis off\n"
    assert "diagnosis:" not in shell.handle(f"{COUNT} WHERE age > 40;")
    assert "Error" in shell.handle("\\diagnose maybe")
    assert "\\diagnose" in shell.handle("\\help")


def test_the_diagnosis_in_a_real_terminal(tmp_path: Path) -> None:
    pexpect = pytest.importorskip("pexpect")
    policy = write_policy(tmp_path)
    # without COLUMNS/LINES, which a parallel test runner sets and which would override the
    # pseudo-terminal's size
    bare = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env = {**bare, "TERM": "dumb", "DPSQL_ANALYST": "ann"}
    child = pexpect.spawn(
        sys.executable,
        ["-m", "dpsql.interfaces.shell.shell", "--policy", str(policy), "--no-history"],
        env=env, encoding="utf-8", timeout=30, dimensions=(40, 160),
    )  # fmt: skip
    try:
        child.expect(re.escape("dpsql (eps 0/1)> "))
        child.send("\\diagnose on\r")
        child.expect("diagnosis on")
        child.expect(re.escape("dpsql (eps 0/1)> "))
        child.send(f"{COUNT};\r")
        child.expect(re.escape("dpsql (eps 0.275/1)> "))
        shown = child.before
        child.send("\\quit\r")  # not Ctrl-D on a dumb terminal (test_shell.py says why)
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, child.before
    assert re.search(r"\d+ ± \d+", shown) and "charged epsilon 0.275, delta 0" in shown
    assert SUMMARY.search(shown) and "diagnosis: bounds cut" in shown, shown


def test_dpsql_run_diagnose_plans_and_prints_the_diagnosis(
    batch_policy: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    path = sql_file(tmp_path, f"SET dpsql.max_rows_per_unit_per_group = 3;\n{COUNT};\n")
    planned = invoke(batch_policy, "run", "--plan", "--diagnose", str(path))
    assert planned.exit_code == 0, planned.output
    assert re.search(r"query\s+0\.275\s+0\s+charge", planned.output), planned.output
    run = invoke(batch_policy, "run", "--diagnose", "--quiet", str(path))
    assert run.exit_code == 0, run.output
    assert SUMMARY.search(run.output) and "diagnosis: bounds cut" in run.output
    out = tmp_path / "out"
    files = invoke(batch_policy, "run", "--diagnose", "--quiet", "--output", str(out),
                   "--format", "json", str(path))  # fmt: skip
    assert files.exit_code == 0, files.output
    assert "statement 2: diagnosis: bounds cut" in files.output
    document = json.loads((out / "02.json").read_text(encoding="utf-8"))
    assert SUMMARY.match(document["accuracy_covers"])
    assert set(document["diagnosis"]["flags"]) == {"C"}
    assert document["epsilon"] == "0" and document["cached_from"] is not None  # the repeat
    undiagnosed = invoke(batch_policy, "run", "--quiet", str(path))
    assert "±: noise only\n" in undiagnosed.output and "diagnosis" not in undiagnosed.output


def test_dpsql_query_prints_what_the_plus_minus_covers(
    batch_policy: Path,  # noqa: F811
) -> None:
    out = invoke(batch_policy, "query", COUNT)
    assert out.exit_code == 0 and "± at 0.95 confidence, noise only" in out.output
    sql = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(diagnose = true) COUNT(*) AS n FROM visits"
    out = invoke(batch_policy, "query", sql)
    assert out.exit_code == 0, out.output
    assert SUMMARY.search(out.output) and "diagnosis: bounds cut" in out.output
    assert GROUP.name == "dpsql"


def test_the_server_takes_the_setting_over_the_wire_and_its_notice_carries_the_diagnosis(
    tmp_path: Path,
) -> None:
    dataset = write_dataset(tmp_path / "data")
    users = write_users(tmp_path / "users.json")
    policy, _ = write_server_policy(tmp_path / "server", dataset)
    with ServerThread(policy, users) as server:
        plain = psql(server.port, "alice", "SELECT COUNT(*) FROM visits;")
        assert plain.returncode == 0, plain.stderr
        assert "± covers noise only" in plain.stderr and "diagnosis" not in plain.stderr
        script = (
            "SET dpsql.diagnose = on;\n"
            "SET dpsql.diagnose_epsilon = 0.1;\n"
            "SET dpsql.max_rows_per_unit_per_group = 2;\n"
            "EXPLAIN SELECT COUNT(*) FROM visits;\n"
            "SELECT COUNT(*) FROM visits;\n"
        )
        out = psql(server.port, "alice", script)
    assert out.returncode == 0, out.stderr
    # The diagnosis's epsilon as set (a tenth of the query's 0.01 would be mostly noise).
    assert "(the diagnosis's epsilon 0.1 included)" in out.stdout
    notice = [line for line in out.stderr.splitlines() if line.startswith("NOTICE:  dpsql: ch")]
    assert len(notice) == 1, out.stderr
    # Every one of the 1,000 users has 3 rows, more than C = 2.
    assert "epsilon 0.11, delta 0" in notice[0]
    assert "raise max_rows_per_unit_per_group" in notice[0]
    assert re.search(r"± covers noise only; bounds cut ~(9\d|100)% of units", notice[0])
    assert "diagnosis: bounds cut" in notice[0]


def test_the_dbapi_exposes_the_diagnosis_and_the_frames_say_what_the_plus_minus_covers(
    tmp_path: Path,
) -> None:
    with dpsql.connect(write_policy(tmp_path)) as conn:
        cur = conn.cursor()
        cur.execute(COUNT, diagnose=True, max_rows_per_unit_per_group=3)
        d = cur.diagnostics
        assert d is not None and cur.result is not None and cur.result.diagnosis is d
        assert 0 < d.fraction("C") <= 1 and d.fraction("any") == d.fraction("C")
        assert SUMMARY.match(cur.covers) and "raise max_rows_per_unit_per_group" in cur.covers
        assert d.as_dict()["flags"]["C"]["limit"] == 3  # type: ignore[index]
        assert SUMMARY.search(repr(cur.result))
        html = cur.result._repr_html_()
        assert "noise only; bounds cut" in html
        pd = pytest.importorskip("pandas")
        frame = cur.fetch_df()
        assert isinstance(frame, pd.DataFrame)
        assert frame.attrs["diagnosis"].startswith("bounds cut ~")


def test_over_the_wire_a_policy_s_default_diagnosis_needs_no_setting(tmp_path: Path) -> None:
    """A policy that leaves budget.diagnose as it is: one psql query, with no SET, is charged
    its diagnosis as well and its NOTICE says what the bounds cut."""
    dataset = write_dataset(tmp_path / "data")
    users = write_users(tmp_path / "users.json")
    policy, _ = write_server_policy(tmp_path / "server", dataset)
    text = policy.read_text(encoding="utf-8")
    assert "diagnose = false\n" in text
    policy.write_text(text.replace("diagnose = false\n", ""), encoding="utf-8")
    with ServerThread(policy, users) as server:
        out = psql(server.port, "alice", "SELECT COUNT(*) FROM visits;")
    assert out.returncode == 0, out.stderr
    notice = [line for line in out.stderr.splitlines() if line.startswith("NOTICE:  dpsql: ch")]
    assert len(notice) == 1, out.stderr
    # The query's epsilon 0.01 and a tenth of it for the diagnosis, in one charge.
    assert "charged: epsilon 0.011, delta 0" in notice[0]
    assert re.search(r"± covers noise only; bounds cut ~[\d.]+% of units \(± ", notice[0])
