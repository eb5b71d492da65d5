"""Tables made of blocks from every interface: the owner's ``dpsql blocks`` commands, a running
``dpsql serve`` that sees a block registered under it before a connection's next statement,
``dpsql run`` and ``dpsql query``, the DB-API, the shell, ``dpsql budget`` and the report.

Real server (in a thread, a worker process per connection), real psycopg, real DuckDB and
SQLite; the CLI through click's runner, as tests/interfaces/test_cli.py runs it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner, Result
from server_fixtures import ServerThread, charges, connect, write_users

import dpsql
from dpsql.accounting.ledger.store import create_ledger
from dpsql.interfaces.cli import main as cli
from dpsql.interfaces.shell.core import Shell
from dpsql.policy import load_policy
from dpsql.session.session import Session

REGIONS = ["central", "east", "north", "south", "west"]
POLICY = """
[dataset]
id = "blocks-interfaces"

[data]
blocks = {{ visits = {{ period = "day" }} }}

[ledger]
path = "ledger.sqlite"

[budget]
diagnose = false
epsilon = "50"
delta = "0.000001"
query_epsilon = "0.5"
query_delta = "0.00000001"

[tables.visits]
privacy_unit = "user_id"
max_groups_per_unit = 2
max_rows_per_unit_per_group = 5

[tables.visits.columns.spend]
lower = 0
upper = 200

[tables.visits.columns.region]
public_values = {regions}
"""
JANUARY = "SELECT region, COUNT(*) FROM visits WHERE day < DATE '2026-02-01' GROUP BY region"
EVERY = "SELECT COUNT(*) FROM visits"


def _months(folder: Path) -> list[Path]:
    """Three monthly files of 2026: 600 rows of 200 users each."""
    con = duckdb.connect(":memory:")
    paths = []
    try:
        for month in (1, 2, 3):
            path = folder / f"visits-{month}.parquet"
            con.execute(
                f"""COPY (SELECT (i % 200)::BIGINT AS user_id,
                    {REGIONS}[1 + (i * 7) % 5] AS region, ((i * 37) % 200)::DOUBLE AS spend,
                    DATE '2026-{month:02d}-01' + (i % 28)::INTEGER AS day
                    FROM range(600) t(i)) TO '{path}' (FORMAT PARQUET)"""
            )
            paths.append(path)
    finally:
        con.close()
    return paths


@pytest.fixture
def owned(tmp_path: Path) -> tuple[Path, list[Path]]:
    """A policy with a durable ledger, and the three months' files (none registered)."""
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY.format(regions=json.dumps(REGIONS)), encoding="utf-8")
    create_ledger(load_policy(policy)).close()
    return policy, _months(tmp_path)


def _cli(policy: Path, *args: str) -> Result:
    return CliRunner().invoke(cli.cli, ["--policy", str(policy), *args])


def _add(policy: Path, month: int, path: Path, *replace: str) -> Result:
    command = ["blocks", "replace", "visits", *replace] if replace else ["blocks", "add", "visits"]
    result = _cli(policy, *command, f"2026-{month:02d}", str(path),
                  "--start", f"2026-{month:02d}-01", "--end", f"2026-{month + 1:02d}-01",
                  "--by", "owner")  # fmt: skip
    return result


def test_the_owner_commands_and_the_cli_answers(owned: tuple[Path, list[Path]]) -> None:
    policy, months = owned
    result = _add(policy, 1, months[0])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("record 2: block 2026-01 of table visits, 2026-01-01 to")
    refused = _add(policy, 1, months[1])  # the id is taken
    assert refused.exit_code == 3 and "already has a block 2026-01" in refused.output
    assert _cli(policy, "query", JANUARY).exit_code == 0
    assert _add(policy, 2, months[1]).exit_code == 0
    # dpsql run: January's answer again, free; every month's, charged.
    script = policy.parent / "dashboard.sql"
    script.write_text(f"{JANUARY};\n{EVERY};\n", encoding="utf-8")
    ran = _cli(policy, "run", str(script))
    assert ran.exit_code == 0, ran.output
    ledger = policy.parent / "ledger.sqlite"
    assert len(charges(ledger)) == 2  # the first query, then the run's one charge for EVERY
    explained = _cli(policy, "explain", EVERY)
    assert "blocks of visits read: 2026-01, 2026-02" in explained.output
    # A correction of January retires the first charge and the run's (both read January).
    fixed = _cli(policy, "blocks", "replace", "visits", "2026-01", "2026-01-fix", str(months[0]),
                 "--start", "2026-01-01", "--end", "2026-02-01")  # fmt: skip
    assert fixed.exit_code == 0, fixed.output
    listed = _cli(policy, "blocks", "list").output.splitlines()
    assert listed[:3] == [
        "visits 2026-01: 2026-01-01 to 2026-02-01, 1 file(s), record 2; replaced by 2026-01-fix",
        "visits 2026-02: 2026-02-01 to 2026-03-01, 1 file(s), record 5; active",
        "visits 2026-01-fix: 2026-01-01 to 2026-02-01, 1 file(s), record 9, replaces 2026-01; "
        "active",
    ]
    seqs = [r.seq for r in charges(ledger)]
    assert listed[3:] == [
        f"retired: record {s} (charge) read block(s) visits 2026-01, gone" for s in seqs
    ]
    assert "Blocks:" in _cli(policy, "budget").output
    report = json.loads(_cli(policy, "report", "--format", "json").output)
    assert [(b["id"], b["retired_charges"]) for b in report["blocks"]] == [
        ("2026-01", seqs), ("2026-02", []), ("2026-01-fix", [])
    ]  # fmt: skip
    # Retention: February removed with no replacement; the run's charge read it too.
    removed = _cli(policy, "blocks", "remove", "visits", "2026-02", "--by", "owner")
    assert removed.exit_code == 0, removed.output
    assert removed.output == "record 10: block 2026-02 of table visits: removed\n"
    listed = _cli(policy, "blocks", "list").output.splitlines()
    assert listed[1] == (
        "visits 2026-02: 2026-02-01 to 2026-03-01, 1 file(s), record 5; removed (record 10)"
    )
    assert listed[-1] == f"retired: record {seqs[1]} (charge) read block(s) visits 2026-01, " + (
        "visits 2026-02, gone"
    )
    again = _cli(policy, "blocks", "remove", "visits", "2026-02")
    assert again.exit_code == 3 and "no active block 2026-02 to remove" in again.output


def test_a_running_server_sees_a_block_before_the_next_statement(
    owned: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    policy, months = owned
    assert _add(policy, 1, months[0]).exit_code == 0
    users = write_users(tmp_path / "users.json")
    ledger = policy.parent / "ledger.sqlite"
    with ServerThread(policy, users) as server, connect(server.port, "alice") as conn:
        first = conn.execute(JANUARY).fetchall()
        one = conn.execute(EVERY).fetchall()
        # The owner registers February while the connection is open: no restart.
        assert _add(policy, 2, months[1]).exit_code == 0
        count = len(charges(ledger))
        assert conn.execute(JANUARY).fetchall() == first  # the same blocks: served, free
        assert len(charges(ledger)) == count
        plan = "\n".join(row[0] for row in conn.execute("EXPLAIN " + EVERY).fetchall())
        assert "blocks of visits read: 2026-01, 2026-02" in plan
        two = conn.execute(EVERY).fetchall()
        assert len(charges(ledger)) == count + 1
        assert two[0][0] > one[0][0]  # 600 more rows than January's 600, well beyond the noise


def test_the_dbapi_and_the_shell(owned: tuple[Path, list[Path]]) -> None:
    policy, months = owned
    assert _add(policy, 1, months[0]).exit_code == 0
    with dpsql.connect(policy) as conn:
        cur = conn.cursor()
        cur.execute(JANUARY)
        rows = cur.fetchall()
        assert _add(policy, 2, months[1]).exit_code == 0
        cur.execute(JANUARY)
        assert cur.fetchall() == rows
    session = Session(policy, "ann")
    try:
        shell = Shell(session)
        shown = shell.handle(JANUARY + ";")
        assert "served from the cache" in shown
        assert "charged" in shell.handle(EVERY + ";")
    finally:
        session.close()


def test_dpsql_check_reads_each_active_block(owned: tuple[Path, list[Path]]) -> None:
    """The owner's check: each active block, its rows outside its period counted (a warning:
    they are no rows of the table), a file rewritten since its registration an error."""
    policy, months = owned
    assert _cli(policy, "check").output.splitlines()[1:3] == [
        "table visits (Parquet blocks)",
        "  note: the table visits has no block registered: no query reads it yet",
    ]
    assert _add(policy, 1, months[0]).exit_code == 0
    # February's file registered as March: every one of its 600 rows is outside the period.
    wrong = _cli(policy, "blocks", "add", "visits", "2026-03", str(months[1]),
                 "--start", "2026-03-01", "--end", "2026-04-01")  # fmt: skip
    assert wrong.exit_code == 0, wrong.output
    checked = _cli(policy, "check")
    assert checked.exit_code == 1, checked.output
    assert (
        "  warning: block 2026-03: 600 of its 600 row(s) lie outside its period 2026-03-01 to "
        "2026-04-01 (or have no day): they are no rows of the table"
    ) in checked.output.splitlines()
    assert "block 2026-01:" in checked.output and "2026-01: 0" not in checked.output
    os.utime(months[0], ns=(1, 1))  # the same bytes, another modification time
    rewritten = _cli(policy, "check")
    assert rewritten.exit_code == 7, rewritten.output
    assert "a file of block 2026-01 changed since it was registered" in rewritten.output


def test_the_servers_catalog_follows_the_blocks(
    owned: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    """A table made of blocks with none registered is in no catalog; registered under an open
    connection, its catalog query then lists it, with the columns its blocks declare."""
    policy, months = owned
    users = write_users(tmp_path / "users.json")
    query = (
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'visits' "
        "ORDER BY column_name"
    )
    with ServerThread(policy, users) as server, connect(server.port, "alice") as conn:
        assert conn.execute(query).fetchall() == []
        assert _add(policy, 1, months[0]).exit_code == 0
        assert [c for (c,) in conn.execute(query).fetchall()] == [
            "day", "region", "spend", "user_id"
        ]  # fmt: skip


def test_the_commands_paths_are_the_working_folders(
    owned: tuple[Path, list[Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """FILES relative to where the owner runs the command, not to the policy's folder."""
    policy, months = owned
    elsewhere = policy.parent / "monthly"
    elsewhere.mkdir()
    moved = elsewhere / months[0].name
    months[0].rename(moved)
    monkeypatch.chdir(elsewhere)
    result = _add(policy, 1, Path(moved.name))
    assert result.exit_code == 0, result.output
    assert "visits 2026-01" in _cli(policy, "blocks", "list").output
