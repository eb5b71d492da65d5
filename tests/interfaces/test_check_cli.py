"""``dpsql check``, through the real CLI: what it reports, and its exit status for cron.

0 when nothing is found beyond notes (``--quiet`` then prints nothing), 1 when rows are dropped,
fields NULLed or columns shown undeclared, 7 when a connection would be refused or the policy
is invalid. It charges nothing, creates no ledger, names lines and columns and never a value,
and no analyst interface reaches it
(``tests/house/test_layout.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
from click.testing import CliRunner, Result

from dpsql.interfaces.cli import main as cli


def _dpsql(policy: Path, *args: str) -> Result:
    return CliRunner().invoke(cli.cli, ["--policy", str(policy), "check", *args])


def _policy(folder: Path, tables: str, extra: str = "") -> Path:
    path = folder / "policy.toml"
    path.write_text(
        f"""
[dataset]
id = "hospital"

[data]
tables = {{ {tables} }}

[budget]
epsilon = 5

[ledger]
path = "hospital.ledger"
{extra}
""",
        encoding="utf-8",
    )
    return path


VISITS = """
[tables.visits]
privacy_unit = "patient"

[tables.visits.columns.age]
type = "SMALLINT"
lower = 0
upper = 120

[tables.visits.columns.day]
type = "DATE"

[tables.visits.columns.cost]
type = "DECIMAL(8,2)"
"""
CLEAN = "patient,age,day,cost\np1,30,2024-01-05,12.50\np2,41,2024-03-01,7\n"


def test_clean_data_exits_0_and_quiet_prints_nothing(tmp_path: Path) -> None:
    (tmp_path / "visits.csv").write_text(CLEAN, encoding="utf-8")
    policy = _policy(tmp_path, 'visits = "visits.csv"', VISITS)
    out = _dpsql(policy)
    assert out.exit_code == 0, out.output
    assert "table visits (CSV" in out.stdout and "3 line(s), 2 row(s)" in out.stdout
    assert out.stdout.rstrip().endswith("result: clean (exit status 0)")
    quiet = _dpsql(policy, "--quiet")
    assert (quiet.exit_code, quiet.stdout) == (0, "")
    assert not (tmp_path / "hospital.ledger").exists()  # nothing charged, no ledger made


def test_each_malformed_line_is_named_with_its_column_and_reason(tmp_path: Path) -> None:
    lines = [
        "patient,age,day,cost",
        "p1,30,2024-01-05,12.50",
        "p2,thirty,2024-01-05,1",  # line 3: age NULL
        "p3,41",  # line 4: dropped
        "p4,52,2024-02-30,1",  # line 5: day NULL
        "p5,33,2024-01-05,1234567.5",  # line 6: cost NULL (7 integer digits)
        "p6,40,2024-01-05,1,extra",  # line 7: text ignored
    ]
    (tmp_path / "visits.csv").write_text("\r\n".join(lines) + "\r\n", encoding="utf-8")
    policy = _policy(tmp_path, 'visits = "visits.csv"', VISITS)
    out = _dpsql(policy)
    assert out.exit_code == 1, out.output
    for expected in (
        "line 3, column age: NULL: not an integer",
        "line 4: dropped: fewer fields than the header's 4",
        "line 5, column day: NULL: no such day",
        "line 6, column cost: NULL: more than 6 integer digit(s) for DECIMAL(8,2)",
        "line 7: ignored: more fields than the header's 4",
        "warning: 1 line(s) dropped",
        "warning: 3 field(s) read as NULL",
        "result: findings (exit status 1)",
    ):
        assert expected in out.stdout, (expected, out.stdout)
    for value in ("thirty", "p3", "1234567", "extra"):  # lines and columns, never a value
        assert value not in out.stdout
    limited = _dpsql(policy, "--lines", "2")
    assert "... and 3 more (--lines N lists more)" in limited.stdout
    assert "line 5" not in limited.stdout and limited.exit_code == 1
    document = json.loads(_dpsql(policy, "--json").stdout)
    assert document["exit"] == 1 and document["status"] == "warning"
    (table,) = document["tables"]
    assert table["lines"] == {"total": 7, "rows": 5, "empty": 0, "repeated_headers": 0}
    assert {(f["line"], f["what"], f["column"]) for f in table["listed"]} == {
        (3, "null", "age"),
        (4, "dropped", None),
        (5, "null", "day"),
        (6, "null", "cost"),
        (7, "ignored", None),
    }


def test_what_a_connection_would_refuse_exits_7(tmp_path: Path) -> None:
    (tmp_path / "visits.csv").write_text(CLEAN, encoding="utf-8")
    (tmp_path / "broken.parquet").write_bytes(b"not parquet at all")
    os.mkfifo(tmp_path / "pipe.csv")  # would make a reader wait forever: never opened
    duckdb.sql(
        f"COPY (SELECT 1 AS wid, 'x' AS ward, 2.5 AS beds) TO '{tmp_path / 'wards.parquet'}' "
        "(FORMAT PARQUET)"
    )
    tables = (
        'visits = "visits.csv", gone = "gone.csv", broken = "broken.parquet", '
        'pipe = "pipe.csv", wards = "wards.parquet"'
    )
    extra = VISITS + "".join(
        f'\n[tables.{name}]\nprivacy_unit = "k"\n' for name in ("gone", "broken", "pipe")
    )
    extra += """
[tables.wards]
privacy_unit = "wid"
expose_undeclared = false
[tables.wards.columns.bed]
lower = 0
upper = 10
[tables.wards.columns.ward]
lower = 0
upper = 1
"""
    out = _dpsql(_policy(tmp_path, tables, extra))
    assert out.exit_code == 7, out.output
    for expected in (
        "error: data.tables.gone does not exist",
        "error: data.tables.broken cannot be read as Parquet",
        "error: data.tables.pipe is not a regular file",
        "error: tables.wards.columns.bed: the table wards has no column bed; did you mean beds?",
        "error: tables.wards.columns.ward has bounds, but the column is VARCHAR",
        "note: undeclared column(s), hidden from analysts: beds",
        "result: errors: the policy cannot be served as written (exit status 7)",
    ):
        assert expected in out.stdout, (expected, out.stdout)
    assert "table visits (CSV" in out.stdout  # the other tables are still checked


def test_a_database_table_the_policy_names_and_the_file_lacks(tmp_path: Path) -> None:
    database = tmp_path / "hospital.duckdb"
    with duckdb.connect(str(database)) as con:
        con.execute("CREATE TABLE admissions (pid INTEGER, ward VARCHAR, salary DOUBLE)")
        con.execute("CREATE TABLE staff (sid INTEGER)")
    policy = tmp_path / "policy.toml"
    policy.write_text(
        """
[dataset]
id = "hospital"
[data]
database = "hospital.duckdb"
[budget]
epsilon = 5
[tables.admissions]
privacy_unit = "pid"
[tables.admissions.columns.ward]
[tables.admission]
privacy_unit = "pid"
""",
        encoding="utf-8",
    )
    out = _dpsql(policy)
    assert out.exit_code == 7, out.output
    assert "the data has no table admission; did you mean admissions?" in out.stdout
    assert "note: undeclared column(s), hidden from analysts: salary" in out.stdout
    assert "note: the table staff is not declared under [tables]" in out.stdout


def test_undeclared_columns_warn_until_the_owner_chooses(tmp_path: Path) -> None:
    (tmp_path / "visits.csv").write_text("patient,age,notes\np1,30,fine\n", encoding="utf-8")
    shown = _dpsql(
        _policy(
            tmp_path,
            'visits = "visits.csv"',
            '[tables.visits]\nprivacy_unit = "patient"\n[tables.visits.columns.age]\n',
        )
    )
    assert shown.exit_code == 1
    assert "warning: undeclared column(s), shown to analysts by default: notes" in shown.stdout
    chosen = _dpsql(
        _policy(
            tmp_path,
            'visits = "visits.csv"',
            '[tables.visits]\nprivacy_unit = "patient"\nexpose_undeclared = true\n'
            "[tables.visits.columns.age]\n",
        )
    )
    assert chosen.exit_code == 0
    assert "note: undeclared column(s), shown (expose_undeclared): notes" in chosen.stdout


def test_an_invalid_policy_exits_7_with_one_error_line(tmp_path: Path) -> None:
    (tmp_path / "visits.csv").write_text(CLEAN, encoding="utf-8")
    policy = _policy(tmp_path, 'visits = "visits.csv"', VISITS.replace("lower = 0", "lowr = 0"))
    out = _dpsql(policy)
    assert out.exit_code == 7
    assert out.stderr.startswith("Error: PolicyError:") and "did you mean lower?" in out.stderr


def test_the_console_script_gives_cron_its_status(tmp_path: Path) -> None:
    (tmp_path / "visits.csv").write_text(CLEAN + "p3,x,2024-01-01,1\n", encoding="utf-8")
    policy = _policy(tmp_path, 'visits = "visits.csv"', VISITS)
    done = subprocess.run(
        [sys.executable, "-m", "dpsql.interfaces.cli.main", "--policy", str(policy), "check",
         "--quiet"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1 and "line 4, column age: NULL" in done.stdout, done.stderr


def test_a_type_the_spark_engine_refuses_is_an_error_under_spark(tmp_path: Path) -> None:
    (tmp_path / "visits.csv").write_text("patient,n\np1,5\n", encoding="utf-8")
    extra = '[engine]\nname = "spark"\n[tables.visits]\nprivacy_unit = "patient"\n'
    extra += '[tables.visits.columns.n]\ntype = "HUGEINT"\n'
    out = _dpsql(_policy(tmp_path, 'visits = "visits.csv"', extra))
    assert out.exit_code == 7, out.output
    assert "tables.visits.columns.n.type HUGEINT has no Spark type" in out.stdout
