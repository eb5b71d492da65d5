"""The Spark engine as a Spark Connect client (``[engine] remote = "sc://..."``), against a real
Spark Connect server: it keeps DuckDB's exact totals, charges once, explains with the salt as a
placeholder, is interrupted and closed cleanly, and holds the pinned settings or refuses.

The server is a separate process started once for this module, from pyspark's own install,
with the very command docs/engines.md gives (``dpsql.engine.spark.session.connect_server_command``)
on a free port of 127.0.0.1, so it never meets the classic local Spark other modules run in this
process. Its defaults for two session settings differ on purpose (no ANSI mode, another zone):
each engine must set dpsql's on its own server session.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from server_fixtures import ServerThread, charges, psql, write_users
from spark_fixtures import SOCKET_WARNINGS

from dpsql.accounting.ledger.ledger import Ledger
from dpsql.accounting.ledger.store import create_ledger
from dpsql.engine.base import Engine, open_engine
from dpsql.engine.spark.session import connect_server_command
from dpsql.errors import EngineError, PolicyError
from dpsql.interfaces.pgwire.config import Limits
from dpsql.policy import load_policy
from dpsql.policy.engine import SPARK_PINNED
from dpsql.session.session import Session

pytestmark = [pytest.mark.spark, *SOCKET_WARNINGS]

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "examples" / "data" / "visits.parquet"
# Bounds that cannot bind on the example (as in test_spark_engine.py): where no cap binds, the
# engines' different keyed hashes keep the same rows, so their exact totals agree.
LOOSE = {"max_groups_per_unit": 12, "max_rows_per_unit_per_group": 1000}
QUERIES = (
    "SELECT COUNT(*) AS n FROM visits",
    "SELECT region, COUNT(*) AS n, AVG(spend) AS s FROM visits GROUP BY region",
    "SELECT date_trunc('month', day) AS m, SUM(spend) AS s FROM visits GROUP BY 1",
    "SELECT COUNT(DISTINCT user_id) AS users, STDDEV(age) AS sd FROM visits",
)
# The server's own defaults for these differ from the pinned values: the engine sets its own.
SERVER_DEFAULTS = {"spark.sql.ansi.enabled": "false", "spark.sql.session.timeZone": "Asia/Tokyo"}
STARTUP_SECONDS = 240.0  # a JVM's start on a busy two-core machine


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_for(port: int, server: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if server.poll() is not None:
            tail = log.read_text(encoding="utf-8", errors="replace")[-2000:]
            pytest.fail(f"the Spark Connect server exited ({server.returncode}): {tail}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    pytest.fail(f"the Spark Connect server did not listen within {STARTUP_SECONDS:.0f} s")


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``sc://localhost:<port>`` of a Spark Connect server run for this module."""
    pytest.importorskip("pyspark", reason="pyspark is not installed")
    pytest.importorskip(
        "pyspark.sql.connect.session", reason="the Spark Connect client (pyspark[connect])"
    )
    if shutil.which("java") is None:
        pytest.skip("Spark needs Java: no java on PATH")
    if not DATA.exists():
        pytest.skip("run `make demo` (or examples/make_data.py) to create the example data")
    port = _free_port()
    command = connect_server_command(port=port, master="local[1]")
    # As the classic test session: few shuffle partitions and the JVM's quick compiler only
    # (no answer depends on either), then the server defaults this module checks.
    command += ["--driver-java-options", "-XX:TieredStopAtLevel=1"]
    extra = {"spark.sql.shuffle.partitions": "2", **SERVER_DEFAULTS}
    for name, value in extra.items():
        command += ["--conf", f"{name}={value}"]  # a later --conf wins
    log = tmp_path_factory.mktemp("spark-connect") / "server.log"
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_HOME", "SPARK_REMOTE")}
    began = time.monotonic()
    with log.open("wb") as out:
        server = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env
        )
    try:
        _wait_for(port, server, log)
        print(f"Spark Connect server listening after {time.monotonic() - began:.1f} s")
        yield f"sc://localhost:{port}"
    finally:
        server.terminate()  # spark-submit execs the JVM: this is the server itself
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=30)


def _policy_text(tmp_path: Path, remote: str | None, conf: str = "") -> Path:
    text = (ROOT / "examples" / "policy.toml").read_text(encoding="utf-8")
    text = text.replace('"data/visits.parquet"', f'"{DATA}"')
    for name, value in LOOSE.items():
        text = re.sub(rf"^{name} = \d+", f"{name} = {value}", text, flags=re.M)
    engine = "" if remote is None else f'[engine]\nname = "spark"\nremote = "{remote}"\n{conf}\n'
    path = tmp_path / ("connect.toml" if remote else "duckdb.toml")
    path.write_text(engine + text, encoding="utf-8")
    return path


def _engine(tmp_path: Path, remote: str, salt: int = 7, conf: str = "") -> Engine:
    return open_engine(load_policy(_policy_text(tmp_path, remote, conf)), salt=salt)


def _bare(remote: str) -> Any:
    """A plain client session of the server: its defaults, as dpsql found them."""
    from pyspark.sql.connect.session import SparkSession

    return SparkSession(connection=remote)


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory, remote: str) -> Iterator[tuple[Session, ...]]:
    folder = tmp_path_factory.mktemp("policies")
    duck = Session(_policy_text(folder, None))
    on_connect = Session(_policy_text(folder, remote))
    try:
        yield duck, on_connect
    finally:
        duck.close()
        on_connect.close()


@pytest.fixture
def session(tmp_path: Path, remote: str) -> Iterator[Session]:
    opened = Session(_policy_text(tmp_path, remote))
    try:
        yield opened
    finally:
        opened.close()


def test_the_engine_is_a_client_of_the_server(both: tuple[Session, ...]) -> None:
    duck, on_connect = both
    assert on_connect.engine.name == "spark"
    assert type(on_connect.engine._session).__module__ == "pyspark.sql.connect.session"  # type: ignore[attr-defined]
    assert on_connect.engine.catalog == duck.engine.catalog  # Spark's schema, in DuckDB's types
    # The client never marks the process as Spark Connect: a classic session of this process
    # (the other Spark modules') stays classic.
    assert "SPARK_CONNECT_MODE_ENABLED" not in os.environ
    assert "SPARK_REMOTE" not in os.environ


@pytest.mark.parametrize("sql", QUERIES)
def test_the_exact_totals_are_duckdb_s(both: tuple[Session, ...], sql: str) -> None:
    duck, on_connect = both
    plan = duck.plan(sql)
    assert on_connect.plan(sql).engine_sql == plan.engine_sql  # one bounded query for both
    _, expected = duck.engine.run(plan.engine_sql)
    _, got = on_connect.engine.run(plan.engine_sql)
    assert sorted(map(repr, got)) == sorted(map(repr, expected))  # same values, same types


def test_an_answer_is_charged_once_and_then_served_from_the_cache(session: Session) -> None:
    sql = "SELECT region, COUNT(*) AS n FROM visits GROUP BY region"
    result = session.execute(sql)
    assert [row[0] for row in result.rows] == sorted(row[0] for row in result.rows)
    assert all(isinstance(row[1], int) for row in result.rows)
    # The query's epsilon 0.5 and its diagnosis's tenth of it (run on Spark too), one charge.
    assert result.diagnosis is not None
    assert session.budget().epsilon_spent == Fraction(11, 20)
    again = session.execute(sql)
    assert again.cached_from is not None and again.rows == result.rows
    assert session.budget().epsilon_spent == Fraction(11, 20) and session.budget().queries == 1


def test_explain_shows_the_spark_sql_with_the_salt_as_a_placeholder(session: Session) -> None:
    session.execute("SET dpsql.max_groups_per_unit = 2")  # so that the keyed hash ranks groups
    result = session.execute(
        "EXPLAIN VERBOSE SELECT region, COUNT(*) AS n FROM visits GROUP BY region"
    )
    text = "\n".join(row[0] for row in result.rows)
    assert "XXHASH64(" in text.upper() and ":salt" in text
    assert str(session.engine.salt) not in text
    assert session.budget().queries == 0


def test_the_pinned_settings_hold_though_the_server_s_defaults_differ(
    tmp_path: Path, remote: str
) -> None:
    bare = _bare(remote)
    try:
        for name, value in SERVER_DEFAULTS.items():
            assert bare.conf.get(name) == value  # the server's own: not dpsql's
    finally:
        bare.stop()
    engine = _engine(tmp_path, remote)
    try:
        conf = engine._session.conf  # type: ignore[attr-defined]
        for name, value in SPARK_PINNED.items():
            assert conf.get(name).lower() == value.lower(), name
        # Overflow raises in ANSI mode: an exact total never wraps round.
        with pytest.raises(EngineError):
            engine.run("SELECT SUM(user_id * 9223372036854775807) AS s FROM visits")
    finally:
        engine.close()


@pytest.mark.parametrize(
    ("name", "value", "found"),
    [
        ("spark.ui.enabled", "true", "false"),  # a static setting the server has otherwise
        ("spark.eventLog.enabled", "false", "not set"),  # one it leaves to Spark's default
    ],
)
def test_a_server_that_differs_from_a_pinned_setting_is_refused(
    tmp_path: Path,
    remote: str,
    monkeypatch: pytest.MonkeyPatch,
    *,
    name: str,
    value: str,
    found: str,
) -> None:
    """A client cannot change the server's static settings: the engine reads each one back and
    refuses to open, naming it (as if dpsql pinned these values)."""
    monkeypatch.setitem(SPARK_PINNED, name, value)  # the one dict every module reads
    with pytest.raises(PolicyError, match=rf"{re.escape(name)} is {found} on this Spark"):
        _engine(tmp_path, remote)


def test_each_engine_has_a_server_session_of_its_own(tmp_path: Path, remote: str) -> None:
    first, second = _engine(tmp_path, remote, salt=1), _engine(tmp_path, remote, salt=2)
    mine, theirs = first._session, second._session  # type: ignore[attr-defined]
    try:
        assert mine.session_id != theirs.session_id
        mine.sql("SELECT 1 AS x").createOrReplaceTempView("only_mine")
        assert mine.catalog.tableExists("only_mine")
        assert not theirs.catalog.tableExists("only_mine")  # views never meet
        first.close()
        assert mine.is_stopped  # released on the server, with its views
        first.close()  # a second close does nothing
        # The other engine's views and session are untouched.
        _, rows = second.run("SELECT COUNT(*) AS n FROM visits")
        assert len(rows) == 1 and rows[0][0] > 0
    finally:
        first.close()
        second.close()
    assert theirs.is_stopped


# Joins by shuffle, not broadcast: Spark stops a cancelled task cooperatively, and the tasks of
# a broadcast join were seen to run on to their end (a minute of the server's one core) after
# their query was cancelled. The policy's own settings reach the engine's session.
SHUFFLED = (
    'conf = { "spark.sql.autoBroadcastJoinThreshold" = "-1", '
    '"spark.sql.shuffle.partitions" = "16" }'
)


def test_an_interrupt_cancels_the_running_query_on_the_server(tmp_path: Path, remote: str) -> None:
    engine = _engine(tmp_path, remote, conf=SHUFFLED)
    assert engine._session.conf.get("spark.sql.shuffle.partitions") == "16"  # type: ignore[attr-defined]
    outcome: list[object] = []

    def long_query() -> None:
        # Each user's rows three times over: 7.6e10 rows (one user has 800), minutes of work.
        try:
            engine.run(
                "SELECT COUNT(*) AS n FROM visits a JOIN visits b ON a.user_id = b.user_id "
                "JOIN visits c ON a.user_id = c.user_id"
            )
            outcome.append("finished")
        except EngineError as exc:
            outcome.append(exc)

    try:
        engine.interrupt()  # nothing runs: nothing to do
        thread = threading.Thread(target=long_query)
        began = time.monotonic()
        thread.start()
        time.sleep(2.0)  # the query reaches the server and its join
        while thread.is_alive() and time.monotonic() - began < 60:
            engine.interrupt()  # as the server's worker does: until the query ends
            thread.join(timeout=0.1)
        assert not thread.is_alive(), "the interrupt did not reach the server"
        assert len(outcome) == 1 and isinstance(outcome[0], EngineError), outcome
        assert time.monotonic() - began < 30
        # The session serves the next query at once: the server's tasks stopped too, and only
        # the tagged operation was cancelled.
        began = time.monotonic()
        _, rows = engine.run("SELECT COUNT(*) AS n FROM visits")
        assert len(rows) == 1 and rows[0][0] > 0
        assert time.monotonic() - began < 20
    finally:
        engine.close()
    engine.interrupt()  # after close: nothing to do, no error


def test_dpsql_serve_answers_psql_over_spark_connect(tmp_path: Path, remote: str) -> None:
    """``dpsql serve`` in front of the Connect server: each connection's worker process opens
    an engine of its own (a session on the one server), psql gets noisy answers, each fresh
    answer is charged once in the durable ledger and a repeat is served from the cache."""
    policy = _policy_text(tmp_path, remote)
    ledger = tmp_path / "connect.ledger"
    text = policy.read_text(encoding="utf-8")
    policy.write_text(text + f'\n[ledger]\npath = "{ledger}"\n', encoding="utf-8")
    create_ledger(load_policy(policy))
    users = write_users(tmp_path / "users.json")
    grouped = "SELECT region, COUNT(*) AS n FROM visits GROUP BY region ORDER BY region;"
    limits = Limits(max_connections=4, statement_timeout=180.0)
    with ServerThread(policy, users, limits=limits) as server:
        first = psql(server.port, "alice", grouped, timeout=240)
        assert first.returncode == 0, first.stderr
        lines = first.stdout.splitlines()
        assert [line.split("|")[0] for line in lines] == sorted(
            ["central", "east", "north", "south", "west"]
        )
        assert all(line.split("|")[1].lstrip("-").isdigit() for line in lines)
        # Another connection (another worker, another server session) gets the released answer.
        again = psql(server.port, "bob", grouped, timeout=240)
        assert again.returncode == 0, again.stderr
        assert again.stdout == first.stdout
    assert len(charges(ledger)) == 1
    Ledger(ledger).verify()
