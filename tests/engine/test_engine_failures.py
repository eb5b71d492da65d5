"""Failures of the engine after the charge: one error, one message, one SQLSTATE; the cause is
the owner's.

The failures are real (no mocked engine): DuckDB out of memory under a tiny ``memory_limit``,
and interrupts sent from another thread at generated moments. Whatever the cause, the analyst
gets the same ``EngineError`` (``EngineFailure`` through the DB-API, exit code 5, SQLSTATE
58R01) and the charge stays; the ledger gains a ``failure`` record with the charge's seq and
the engine exception's class name, which only the owner's views show, and which changes no
budget and keeps the chain verifiable.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pytest
from click.testing import CliRunner
from conftest import examples
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from server_fixtures import ServerThread, write_dataset, write_policy, write_users
from server_fixtures import connect as wire_connect

import dpsql as dbapi
from dpsql import errors
from dpsql.accounting.ledger.ledger import Ledger
from dpsql.accounting.ledger.store import create_ledger
from dpsql.interfaces.cli import main as cli
from dpsql.interfaces.pgwire.config import Limits
from dpsql.interfaces.pgwire.statements import ENGINE_FAILED, sqlstate
from dpsql.interfaces.shell.core import Shell
from dpsql.policy import load_policy
from dpsql.session.session import Session

# No public GROUP BY key: its domain is typed by the engine before the charge, which a starved
# engine cannot do either (refused, free); this query's first allocation is after the charge.
QUERY = "SELECT SUM(spend) AS s, COUNT(*) AS n FROM visits"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("engine-failures")
    con = duckdb.connect()
    con.execute(
        f"""COPY (
            SELECT (i % 50000)::BIGINT AS user_id,
                   ['north', 'south', 'east', 'west'][1 + i % 4] AS region,
                   (i % 200)::DOUBLE AS spend
            FROM range(400000) r(i)) TO '{folder / "visits.parquet"}' (FORMAT parquet)"""
    )
    con.close()
    return folder


def make_policy(folder: Path, name: str) -> Path:
    """A policy over the module's data with a fresh durable ledger of its own."""
    ledger = folder / f"{name}.ledger"
    path = folder / f"{name}.toml"
    path.write_text(
        f"""
[dataset]
id = "engine-failures"
[data]
tables = {{ visits = "{folder / "visits.parquet"}" }}
[ledger]
path = "{ledger}"
[budget]
diagnose = false
epsilon = 100
delta = 0.000001
query_epsilon = 0.1
[tables.visits]
privacy_unit = "user_id"
max_groups_per_unit = 2
max_rows_per_unit_per_group = 10
max_rows_per_unit = 10
[tables.visits.columns.spend]
lower = 0
upper = 200
[tables.visits.columns.region]
public_values = ["east", "north", "south", "west"]
""",
        encoding="utf-8",
    )
    create_ledger(load_policy(path))
    return path


def kinds(session: Session) -> list[str]:
    """The kinds of the session's ledger records after the one that pins the budget."""
    return [r.kind for r in session.filter.store.records() if r.kind != "budget"]


def failures(session: Session) -> list[dict[str, Any]]:
    return [dict(r.payload) for r in session.filter.store.records() if r.kind == "failure"]


@pytest.fixture
def starved_policy(folder: Path, request: pytest.FixtureRequest) -> Path:
    return make_policy(folder, request.node.name[:40])


@pytest.fixture
def starved(starved_policy: Path) -> Iterator[Session]:
    """A session whose engine has 2 MB of memory: the bounded query runs out of it."""
    session = Session(starved_policy, "ann", memory_limit="2MB")
    yield session
    session.close()


def test_out_of_memory_is_the_one_engine_error_and_the_charge_stays(starved: Session) -> None:
    with pytest.raises(errors.EngineError) as info:
        starved.execute(QUERY)
    assert type(info.value) is errors.EngineError
    assert str(info.value) == errors.ENGINE_FAILURE
    assert info.value.cause is None  # the cause is never handed to the analyst
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert sqlstate(info.value) == ENGINE_FAILED == "58R01"
    report = starved.budget()
    assert report.queries == 1 and report.epsilon_spent == Fraction(1, 10)
    assert kinds(starved) == ["charge", "failure"]  # no release: nothing was answered
    charge = next(r for r in starved.filter.store.records() if r.kind == "charge")
    assert failures(starved) == [{"charge": charge.seq, "cause": "OutOfMemoryException"}]
    # A failure record changes no budget: the report is the same as before it was written.
    assert starved.budget() == report
    assert starved.filter.store.verify() == 3  # type: ignore[attr-defined]


def test_the_failure_is_never_refunded(starved: Session) -> None:
    for _ in range(3):
        with pytest.raises(errors.EngineError):
            starved.execute(QUERY)
    assert starved.budget().queries == 3
    assert kinds(starved) == ["charge", "failure"] * 3
    # Not from the cache: a failed query released nothing, so it is charged again each time.
    assert starved.budget().epsilon_spent == Fraction(3, 10)


def test_the_analyst_s_views_show_no_cause(starved: Session) -> None:
    with pytest.raises(errors.EngineError):
        starved.execute(QUERY)
    shown = Shell(starved).handle(QUERY + ";") + Shell(starved).handle("\\ledger")
    assert "Error: EngineError: " + errors.ENGINE_FAILURE in shown
    assert "failure" in shown and "OutOfMemory" not in shown


def test_the_dbapi_raises_engine_failure(folder: Path) -> None:
    policy = load_policy(make_policy(folder, "dbapi"))
    with dbapi.Connection(Session(policy, "ann", memory_limit="2MB")) as conn:
        with pytest.raises(dbapi.EngineFailure) as info:
            conn.cursor().execute(QUERY)
        assert isinstance(info.value, dbapi.OperationalError)
        assert str(info.value) == errors.ENGINE_FAILURE
        assert not hasattr(info.value, "cause") or info.value.cause is None
        assert conn.budget().queries == 1


def test_the_owner_reads_the_cause(starved: Session, starved_policy: Path) -> None:
    with pytest.raises(errors.EngineError):
        starved.execute(QUERY)
    policy = str(starved_policy)
    runner = CliRunner()
    exported = runner.invoke(cli.cli, ["--policy", policy, "ledger", "export"])
    assert exported.exit_code == 0, exported.output
    last = json.loads(exported.stdout.splitlines()[-1])
    assert last["kind"] == "failure" and last["payload"]["cause"] == "OutOfMemoryException"
    report = runner.invoke(cli.cli, ["--policy", policy, "report"])
    assert report.exit_code == 0
    assert "failure of charge 2 in the engine (OutOfMemoryException)" in report.stdout
    as_json = json.loads(runner.invoke(cli.cli, ["--policy", policy, "report", "--format",
                                                 "json"]).stdout)  # fmt: skip
    entry = as_json["schedule"][-1]
    assert (entry["kind"], entry["charge_seq"], entry["cause"]) == (
        "failure", 2, "OutOfMemoryException",  # record 1 pins the budget
    )  # fmt: skip
    assert runner.invoke(cli.cli, ["--policy", policy, "ledger", "verify"]).exit_code == 0
    shown = runner.invoke(cli.cli, ["--policy", policy, "budget"])
    assert shown.exit_code == 0 and "1 charged queries" in shown.stdout


# -- interrupts at generated moments -------------------------------------------------------


@pytest.fixture(scope="module")
def interrupted(folder: Path) -> Iterator[Session]:
    session = Session(make_policy(folder, "interrupts"), "ann")
    yield session
    session.close()


@settings(
    max_examples=examples(25),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(delay=st.floats(0, 0.4), fresh=st.booleans())
def test_an_interrupt_at_any_moment_is_free_or_charged_never_both(
    interrupted: Session, delay: float, fresh: bool
) -> None:
    session = interrupted
    before = session.filter.store.records()
    stop = threading.Event()

    def keep_interrupting() -> None:
        time.sleep(delay)
        while not stop.is_set():
            session.engine.interrupt()
            time.sleep(0.001)

    thread = threading.Thread(target=keep_interrupting)
    thread.start()
    try:
        session.execute(QUERY, fresh=fresh)  # fresh: the engine runs; else maybe the cache
        outcome = "answered"
    except errors.EngineError as exc:
        assert str(exc) == errors.ENGINE_FAILURE and exc.cause is None
        outcome = "failed"
    except errors.QueryError:  # interrupted while it was checked, before any charge
        outcome = "refused"
    finally:
        stop.set()
        thread.join()
    event(outcome)
    new = session.filter.store.records()[len(before) :]
    new_kinds = [r.kind for r in new]
    if outcome == "answered":
        assert new_kinds in (["charge", "release"], ["reserve"])
    elif outcome == "failed":
        assert new_kinds == ["charge", "failure"]
        assert dict(new[1].payload) == {"charge": new[0].seq, "cause": "InterruptException"}
    else:
        assert new_kinds == []
    assert session.filter.store.verify() == len(before) + len(new)  # type: ignore[attr-defined]


# -- over the wire --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def starved_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    folder = tmp_path_factory.mktemp("engine-failures-wire")
    dataset = write_dataset(folder / "data")
    policy, ledger = write_policy(folder, dataset)
    users = write_users(folder / "users.json")
    limits = Limits(max_connections=4, statement_timeout=30.0, memory_limit="1MB")
    with ServerThread(load_policy(policy), users, limits=limits) as server:
        yield server.port, ledger


def test_out_of_memory_over_the_wire_is_sqlstate_58r01(starved_server: tuple[int, Path]) -> None:
    port, ledger = starved_server
    before = Ledger(ledger).records()
    with wire_connect(port, "alice") as client:
        with pytest.raises(psycopg.Error) as info:
            client.execute("SELECT age, SUM(spend) FROM visits GROUP BY age")
        assert info.value.sqlstate == "58R01"
        assert info.value.diag.message_primary == errors.ENGINE_FAILURE
        assert client.execute("SELECT 1").fetchone() is not None  # the connection stays
    new = Ledger(ledger).records()[len(before) :]
    assert [r.kind for r in new] == ["charge", "failure"]
    assert new[1].payload["cause"] == "OutOfMemoryException"


# -- out of memory at the operating system's limit -------------------------------------------

CHILD = """
import json, resource, sys
from dpsql import errors
from dpsql.session.session import Session
session = Session(sys.argv[1], "ann")
session.plan(sys.argv[2])  # the imports and the check's code paths are warm
size = next(int(line.split()[1]) for line in open("/proc/self/status")
            if line.startswith("VmSize")) * 1024
resource.setrlimit(resource.RLIMIT_AS, (size + int(sys.argv[3]) * 2**20, resource.RLIM_INFINITY))
try:
    session.execute(sys.argv[2], fresh=True)
    outcome = {"outcome": "answered"}
except errors.DpsqlError as exc:
    outcome = {"outcome": type(exc).__name__, "message": str(exc)}
except BaseException as exc:
    outcome = {"outcome": "raw " + type(exc).__name__}
resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
print(json.dumps(outcome))
"""


@pytest.mark.parametrize("headroom_mib", [0, 4, 16, 64])
def test_the_address_space_running_out(folder: Path, tmp_path: Path, headroom_mib: int) -> None:
    """A process limit (RLIMIT_AS) a few MiB above what the session holds: wherever the
    allocation fails (SQLite reading the ledger, DuckDB, Python), the outcome is typed, and a
    charge is either answered, or kept with its failure record, or never made."""
    policy = make_policy(folder, f"address-space-{headroom_mib}")
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(policy), QUERY, str(headroom_mib)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    outcome = json.loads(done.stdout.splitlines()[-1])
    records = Ledger(policy.parent / f"address-space-{headroom_mib}.ledger").records()
    new = [r.kind for r in records if r.kind != "budget"]
    if outcome["outcome"] == "answered":
        assert new == ["charge", "release"]
    elif outcome["outcome"] == "EngineError":
        assert outcome["message"] == errors.ENGINE_FAILURE
        assert new in (["charge", "failure"], ["charge"])  # the record itself may not fit
    elif outcome["outcome"] == "UnsupportedQueryError":  # the check ran out, before the charge
        assert outcome["message"].startswith("the engine ran out of memory while checking")
        assert new == []
    else:  # the ledger could not be read, or write the release: nothing was released
        assert outcome["outcome"] == "LedgerError", outcome
        assert new in ([], ["charge"])
