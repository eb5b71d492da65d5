"""The log of ``dpsql serve`` keeps nothing private and cannot be flooded.

sqlglot's own messages (which may quote a statement) are withheld, in the server process and in
its workers, and repeated lines are rate-limited (``dpsql.interfaces.pgwire.logs``). The floods
run against a real ``dpsql serve`` process, whose standard error is the log.
"""

from __future__ import annotations

import logging
from pathlib import Path

import psycopg
import pytest
import sqlglot
from server_fixtures import connect, start_subprocess, write_dataset, write_policy, write_users

from dpsql.interfaces.pgwire import logs
from dpsql.interfaces.pgwire.logs import RepeatLimit

FLOOD = 100


def test_a_flood_writes_a_bounded_log_without_statement_text(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data")
    policy, _ = write_policy(tmp_path / "p", data)
    users = write_users(tmp_path / "users.json")
    served = start_subprocess(policy, users, "--max-statement-bytes", "200")
    try:
        with connect(served.port, "alice") as conn:
            for _ in range(FLOOD):
                # sqlglot warns that it falls back to a Command, quoting the statement.
                with pytest.raises(psycopg.errors.FeatureNotSupported):
                    conn.execute("VACUUM secret_table_name")
                with pytest.raises(psycopg.errors.ProgramLimitExceeded):
                    conn.execute("SELECT 1 -- " + "x" * 300)
            assert conn.execute("SELECT current_user").fetchone() == ("alice",)
    finally:
        served.stop()
    log = "".join(served.log)
    assert "secret_table_name" not in log
    assert "sqlglot warning withheld (it may quote a statement)" in log
    # Each kind of line at most BURST times (within one interval), whatever the flood's size.
    assert 0 < log.count("over the length limit") <= logs.BURST, log
    assert 0 < log.count("statement failed with 0A000") <= logs.BURST, log
    assert 0 < log.count("sqlglot warning withheld") <= logs.BURST, log
    assert len(served.log) < 4 * logs.BURST + 10, log


def test_sqlglot_messages_are_withheld_in_process(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    logs.quiet_sqlglot()
    sqlglot.parse("CALL private_procedure_name()", read="duckdb")
    assert "private_procedure_name" not in caplog.text
    # The one process-wide repeat limit may close an earlier test's window here (its count of
    # suppressed lines, from another logger): only the lines of this parse are read.
    own = [r for r in caplog.records if not r.getMessage().startswith("suppressed ")]
    assert [r.name for r in own] == ["dpsql"]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_repeat_limit_counts_what_it_suppressed(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dpsql.test")
    clock = Clock()
    limit = RepeatLimit(burst=3, interval=10.0, now=clock)
    log = logging.getLogger("dpsql.test")
    for i in range(50):
        limit.log(log, logging.INFO, "refused message %d", i)
        limit.log(log, logging.WARNING, "another kind %d", i)
    assert [r.getMessage() for r in caplog.records] == [
        "refused message 0", "another kind 0",
        "refused message 1", "another kind 1",
        "refused message 2", "another kind 2",
    ]  # fmt: skip
    caplog.clear()
    clock.t += 10
    limit.log(log, logging.INFO, "refused message %d", 50)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "suppressed 47 similar lines in 10 s: 'refused message %d'"),
        (logging.WARNING, "suppressed 47 similar lines in 10 s: 'another kind %d'"),
        (logging.INFO, "refused message 50"),
    ]
