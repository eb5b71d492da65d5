"""Acceptance tests of ``dpsql serve`` through real clients: ``psql`` and psycopg.

One module-scoped server (a background thread with its own event loop, port 0) answers the
tests that do not care about the budget; tests that spend a share to its edge, need TLS or
small limits start their own (``fresh``). Every server has its own durable ledger, which the
tests read back to check what was charged, to whom, and that refused statements charged nothing.
Helpers live in tests/server_fixtures.py.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import errors as pg_errors
from psycopg.pq import TransactionStatus
from server_fixtures import (
    PASSWORDS,
    PSQL,
    REGIONS,
    Dataset,
    ServerThread,
    charges,
    connect,
    error_fields,
    frame,
    make_certificate,
    notices,
    psql,
    raw_login,
    read_backend,
    read_until_closed,
    records,
    spent,
    start_subprocess,
    startup_packet,
    write_dataset,
    write_policy,
    write_users,
)

from dpsql.accounting.ledger.ledger import Ledger
from dpsql.interfaces.pgwire.config import Limits
from dpsql.interfaces.pgwire.statements import engine_failure
from dpsql.session.session import Session

COUNT = "SELECT COUNT(*) FROM visits WHERE age > %s"


@dataclass
class Served:
    server: ServerThread
    policy: Path
    ledger: Path

    @property
    def port(self) -> int:
        return self.server.port


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    return write_dataset(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def users(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_users(tmp_path_factory.mktemp("users") / "users.json")


@pytest.fixture(scope="module")
def main(
    tmp_path_factory: pytest.TempPathFactory, dataset: Dataset, users: Path
) -> Iterator[Served]:
    """Total epsilon 6, alice's share 1, bob's 3; each query costs 0.01 by default."""
    policy, ledger = write_policy(tmp_path_factory.mktemp("main"), dataset)
    with ServerThread(policy, users) as server:
        yield Served(server, policy, ledger)


@pytest.fixture(scope="module")
def warehouse(
    tmp_path_factory: pytest.TempPathFactory, dataset: Dataset, users: Path
) -> Iterator[Served]:
    """A server whose policy also reads a DuckDB database, which holds a ``salaries`` table
    the policy does not declare."""
    policy, ledger = write_policy(tmp_path_factory.mktemp("warehouse"), dataset, database=True)
    with ServerThread(policy, users) as server:
        yield Served(server, policy, ledger)


@pytest.fixture(scope="module")
def warehouse_alice(warehouse: Served) -> Iterator[psycopg.Connection[Any]]:
    """alice's one connection to ``warehouse``, shared by the tests that use it: see
    test_two_clients_at_once_over_a_duckdb_database for why there is only one."""
    with connect(warehouse.port, "alice") as conn:
        yield conn


@pytest.fixture
def fresh(tmp_path: Path, dataset: Dataset, users: Path) -> Iterator[Callable[..., Served]]:
    """A factory of servers with their own policy and ledger, stopped after the test."""
    started: list[ServerThread] = []

    def make(
        *,
        database: bool = False,
        shares: dict[str, Any] | None = None,
        total: float | Fraction = 6,
        tls: tuple[Path, Path] | None = None,
        require_tls: bool = False,
        limits: Limits | None = None,
    ) -> Served:
        folder = tmp_path / f"server{len(started)}"
        policy, ledger = write_policy(
            folder, dataset, database=database, shares=shares, total=total
        )
        server = ServerThread(policy, users, tls=tls, require_tls=require_tls, limits=limits)
        started.append(server.start())
        return Served(server, policy, ledger)

    yield make
    for server in started:
        server.stop()


@contextlib.contextmanager
def nothing_charged(ledger: Path) -> Iterator[None]:
    """The block appends no ledger record: no charge, no release, no cache re-serve."""
    before = records(ledger)
    yield
    assert records(ledger) == before


def assert_serving(port: int) -> None:
    """The server still authenticates and answers a client."""
    with connect(port, "bob") as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("bob",)


# -- 1. psql --------------------------------------------------------------------------------------


def test_psql_answers_an_authenticated_query(main: Served) -> None:
    out = psql(main.port, "alice", "SELECT COUNT(*) FROM visits WHERE age >= 30;")
    assert out.returncode == 0, out.stderr
    int(out.stdout.strip())  # one noisy integer, unaligned and tuples only
    assert "NOTICE:  dpsql: charged: epsilon 0.01, delta 0" in out.stderr
    last = charges(main.ledger)[-1]
    assert (last.analyst, last.payload["query"]) == (
        "alice",
        "SELECT COUNT(*) FROM visits WHERE age >= 30",
    )


def test_psql_session_probes_and_transactions(main: Served) -> None:
    script = (
        "SELECT current_user;\nSHOW server_version;\nSELECT version();\n"
        "BEGIN;\nSELECT COUNT(*) FROM visits WHERE age >= 31;\nROLLBACK;\n"
        "SET application_name = 'report';\nSHOW dpsql.epsilon;\n"
    )
    out = psql(main.port, "bob", script)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "bob"
    assert lines[1].startswith("15.0 (dpsql ")
    assert lines[2].startswith("PostgreSQL 15.0 (dpsql ")
    assert lines[3] == "BEGIN"
    int(lines[4])
    assert lines[5:] == ["ROLLBACK", "SET", "0.01"]
    # A rollback does not undo a charge: the answer was released.
    assert charges(main.ledger)[-1].payload["query"].endswith("age >= 31")


@pytest.mark.parametrize(
    ("user", "password"),
    [
        ("alice", "wrong"),
        ("bob", PASSWORDS["alice"]),
        ("mallory", "anything"),
        ("olga", "OLGA-SECRET"),
    ],
    ids=["wrong-password", "another-users-password", "unknown-user", "wrong-case"],
)
def test_psql_authentication_failure_says_nothing_more(
    main: Served, user: str, password: str
) -> None:
    with nothing_charged(main.ledger):
        out = psql(main.port, user, "SELECT COUNT(*) FROM visits;", password=password)
    assert out.returncode == 2
    assert out.stdout == ""
    # Identical whatever failed, once the name is taken out: no hint that the user exists.
    message = out.stderr.replace(f'"{user}"', '"USER"').replace(str(main.port), "PORT")
    assert message == (
        'psql: error: connection to server at "127.0.0.1", port PORT failed: '
        'FATAL:  password authentication failed for user "USER"\n'
    )


def test_psql_variables_are_interpolated(main: Served) -> None:
    script = (
        "\\set low 44\n\\set region east\n"
        "SELECT COUNT(*) FROM visits WHERE age > :low AND region = :'region';\n"
    )
    out = psql(main.port, "alice", script)
    assert out.returncode == 0, out.stderr
    assert charges(main.ledger)[-1].payload["query"] == (
        "SELECT COUNT(*) FROM visits WHERE age > 44 AND region = 'east'"
    )


def psql_major() -> int:
    if shutil.which(PSQL) is None:
        pytest.skip("needs the psql client")
    version = subprocess.run([PSQL, "--version"], capture_output=True, text=True, check=True)
    match = re.search(r"(\d+)\.", version.stdout)
    assert match is not None
    return int(match.group(1))


def test_psql_bind_sends_parameters(main: Served) -> None:
    if psql_major() < 16:
        pytest.skip("psql has \\bind (the extended protocol with parameters) from version 16")
    out = psql(main.port, "alice", "SELECT COUNT(*) FROM visits WHERE age > $1 \\bind 45 \\g\n")
    assert out.returncode == 0, out.stderr
    assert charges(main.ledger)[-1].payload["query"].endswith("age > 45")


def test_psql_syntax_error_stops_the_script(main: Served) -> None:
    script = (
        "\\set VERBOSITY verbose\n"
        "SELEC COUNT(*) FROM visits;\nSELECT COUNT(*) FROM visits WHERE age > 46;\n"
    )
    with nothing_charged(main.ledger):
        out = psql(main.port, "alice", script)
    assert out.returncode == 3
    assert out.stdout == ""
    assert re.search(r"^ERROR:  42601: syntax error", out.stderr, re.MULTILINE), out.stderr


def test_psql_explain_shows_the_bounded_sql(main: Served) -> None:
    with nothing_charged(main.ledger):
        out = psql(
            main.port, "alice", "EXPLAIN VERBOSE SELECT AVG(spend) FROM visits WHERE age > 30;"
        )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "table visits: privacy unit user_id; user-level, add/remove one unit"
    assert "cost: epsilon 0.01, delta 0" in lines
    assert "bounded SQL:" in lines
    assert any("LEAST(_n0, 5)" in line for line in lines)  # C = 5 is applied in the SQL
    assert "NOTICE" not in out.stderr


def test_psql_show_budget(main: Served) -> None:
    out = psql(main.port, "bob", "SHOW dpsql.budget;")
    assert out.returncode == 0, out.stderr
    assert re.fullmatch(
        r"analyst bob: epsilon [\d.]+ spent of their share 3 \([\d.]+ left\), delta \S+ of "
        r"0\.0000001; \d+ charged queries; "
        r"dataset server-test: epsilon [\d.]+ spent of 6 \([\d.]+ left\), delta \S+ of "
        r"0\.000001; \d+ charged queries; basic composition decides\n",
        out.stdout,
    ), out.stdout


def test_psql_budget_exhaustion_shows_its_sqlstate(fresh: Callable[..., Served]) -> None:
    served = fresh()
    script = (
        "\\set VERBOSITY verbose\nSET dpsql.epsilon = 0.6;\n"
        "SELECT COUNT(*) FROM visits;\nSELECT COUNT(*) FROM visits WHERE age > 20;\n"
        "SELECT COUNT(*) FROM visits WHERE age > 21;\n"
    )
    out = psql(served.port, "alice", script)
    assert out.returncode == 3
    assert out.stdout.count("\n") == 2  # SET, then the one answer
    assert re.search(
        r"^ERROR:  53R01: this query \(epsilon 0\.6\) would take analyst alice over their share of "
        r"the budget \(its sums would reach epsilon 1\.2 of 1, delta 0 of 0\.0000001; epsilon "
        r"0\.4 of 1 left, delta 0\.0000001 of 0\.0000001\); nothing was charged; the largest "
        r"epsilon that fits now is 0\.4 \(OPTIONS\(epsilon = 0\.4\), or SET dpsql\.epsilon\); "
        r"the data owner can add budget \(dpsql budget add\)$",
        out.stderr,
        re.MULTILINE,
    ), out.stderr
    assert [r.payload["query"] for r in charges(served.ledger)] == ["SELECT COUNT(*) FROM visits"]


# -- 2. psycopg -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "params", "expected"),
    [
        (COUNT, [47], "SELECT COUNT(*) FROM visits WHERE age > 47"),
        (
            "SELECT COUNT(*) FROM visits WHERE day >= %s",
            [date(2026, 3, 1)],
            "SELECT COUNT(*) FROM visits WHERE day >= CAST('2026-03-01' AS DATE)",
        ),
        (
            "SELECT COUNT(*) FROM visits WHERE spend < %s",
            [12.5],
            "SELECT COUNT(*) FROM visits WHERE spend < 12.5",
        ),
        (
            "SELECT COUNT(*) FROM visits WHERE spend > %s",
            [Decimal("150.25")],
            "SELECT COUNT(*) FROM visits WHERE spend > 150.25",
        ),
        (
            "SELECT COUNT(*) FROM visits WHERE region = %s",
            ["o'brien; DROP TABLE visits"],
            "SELECT COUNT(*) FROM visits WHERE region = 'o''brien; DROP TABLE visits'",
        ),
        (
            "SELECT COUNT(*) FROM visits WHERE age > %(age)s AND region = %(region)s",
            {"age": 48, "region": "west"},
            "SELECT COUNT(*) FROM visits WHERE age > 48 AND region = 'west'",
        ),
        (
            "SELECT COUNT(*) FROM visits WHERE region <> '$1' AND age > %s",
            [49],
            "SELECT COUNT(*) FROM visits WHERE region <> '$1' AND age > 49",
        ),
        ("SELECT COUNT(*) FROM visits WHERE age > %b", [50], None),  # a binary parameter
    ],
    ids=["int", "date", "float", "decimal", "string", "named", "dollar-in-string", "binary"],
)
def test_psycopg_parameters_are_bound_on_the_server(
    main: Served, query: str, params: Any, expected: str | None
) -> None:
    with connect(main.port, "alice") as conn, notices(conn) as seen:
        cursor = conn.execute(query, params)
        assert cursor.description is not None and cursor.description[0].name == "count"
        (row,) = cursor.fetchall()
        assert isinstance(row[0], int)
    assert seen[0].startswith("dpsql: charged: epsilon 0.01, delta 0")
    last = charges(main.ledger)[-1]
    assert last.analyst == "alice"
    assert last.payload["query"] == (expected or "SELECT COUNT(*) FROM visits WHERE age > 50")


def test_psycopg_result_types(main: Served) -> None:
    with connect(main.port, "bob") as conn:
        for binary in (False, True):
            row = conn.execute(
                "SELECT AVG(spend) AS a, SUM(spend) AS s, COUNT(*) AS n FROM visits "
                f"WHERE age < {60 + binary}",
                binary=binary,
            ).fetchone()
            assert row is not None
            assert [type(v) for v in row] == [float, float, int]
        months = conn.execute(
            "SELECT date_trunc('month', day) AS m, COUNT(*) FROM visits GROUP BY m ORDER BY m"
        ).fetchall()
    assert [m for m, _ in months] == [datetime(2026, month, 1) for month in range(1, 13)]


@pytest.mark.parametrize(
    ("query", "params", "error", "code"),
    [
        ("SELEC COUNT(*) FROM visits", None, pg_errors.SyntaxError, "42601"),
        ("SELEC COUNT(*) FROM visits WHERE age > %s", [1], pg_errors.SyntaxError, "42601"),
        ("COPY visits TO '/tmp/visits.csv'", None, pg_errors.FeatureNotSupported, "0A000"),
        ("SELECT * FROM visits", None, pg_errors.FeatureNotSupported, "0A000"),
        ("SELECT COUNT(*) FROM nope", None, pg_errors.UndefinedTable, "42P01"),
        ("SELECT COUNT(*) FROM nope WHERE age > %s", [1], pg_errors.UndefinedTable, "42P01"),
        ("SELECT COUNT(*) FROM visits WHERE nope > 1", None, pg_errors.UndefinedColumn, "42703"),
        ("SET dpsql.epsilon = 100", None, pg_errors.InvalidParameterValue, "22023"),
        (
            "SELECT COUNT(*) FROM visits WHERE age > %s AND spend < ?",
            [1],
            pg_errors.InvalidParameterValue,
            "22023",
        ),
        ("SHOW dpsql.report", None, pg_errors.InsufficientPrivilege, "42501"),
    ],
)
def test_psycopg_error_classes(
    main: Served, query: str, params: Any, error: type[psycopg.Error], code: str
) -> None:
    with connect(main.port, "alice") as conn:
        with nothing_charged(main.ledger), pytest.raises(error) as info:
            conn.execute(query, params)
        assert info.value.sqlstate == code
        assert info.value.diag.severity == "ERROR"
        # An ordinary error: the connection stays usable.
        assert conn.execute("SELECT current_user").fetchone() == ("alice",)


def test_psycopg_budget_exhaustion(fresh: Callable[..., Served]) -> None:
    served = fresh()
    with connect(served.port, "alice") as conn:
        conn.execute("SET dpsql.epsilon = 0.4")
        for age in (20, 21):
            conn.execute(COUNT, [age]).fetchone()
        before = records(served.ledger)
        with pytest.raises(psycopg.OperationalError) as info:
            conn.execute(COUNT, [22])
        assert info.value.sqlstate == "53R01"
        assert "over their share of the budget (its sums would reach epsilon 1.2 of 1" in str(
            info.value
        )
        assert "delta 0.0000001 of 0.0000001); nothing was charged; the largest epsilon" in str(
            info.value
        )
        assert str(info.value).endswith("the data owner can add budget (dpsql budget add)")
        assert records(served.ledger) == before  # the refused query charged nothing
        # A released answer is served again for free, even with the share spent.
        with notices(conn) as seen:
            conn.execute(COUNT, [20]).fetchone()
        assert len(seen) == 1
        assert seen[0].startswith("dpsql: served from the cache, free: epsilon 0.4, delta 0")
    assert spent(served.ledger, "alice") == Fraction(4, 5)
    session = Session(served.server.policy, analyst="alice")
    try:
        report = session.budget()
    finally:
        session.close()
    assert (report.epsilon_spent, report.queries) == (Fraction(4, 5), 2)


def test_psycopg_explain_charges_nothing(main: Served) -> None:
    with connect(main.port, "bob") as conn, nothing_charged(main.ledger):
        cursor = conn.execute("EXPLAIN VERBOSE SELECT COUNT(*) FROM visits WHERE age > %s", [51])
        assert cursor.statusmessage == "EXPLAIN"
        assert cursor.description is not None and cursor.description[0].name == "plan"
        lines = [line for (line,) in cursor.fetchall()]
    assert "bounded SQL:" in lines
    assert '      TRY("age" > 51) IS TRUE' in lines


def status(conn: psycopg.Connection[Any]) -> str:
    """The transaction status of the last ReadyForQuery, by name."""
    return TransactionStatus(conn.info.transaction_status).name


def test_psycopg_transactions(main: Served) -> None:
    with connect(main.port, "bob", autocommit=False) as conn:
        assert status(conn) == "IDLE"
        conn.execute(COUNT, [61]).fetchone()  # psycopg sends BEGIN first
        assert status(conn) == "INTRANS"
        conn.rollback()
        assert status(conn) == "IDLE"
        conn.execute(COUNT, [62]).fetchone()
        conn.commit()
        assert status(conn) == "IDLE"
        with pytest.raises(pg_errors.UndefinedTable):
            conn.execute("SELECT COUNT(*) FROM nope")
        assert status(conn) == "INERROR"
        with nothing_charged(main.ledger), pytest.raises(psycopg.Error) as failed:
            conn.execute(COUNT, [63])
        assert "current transaction is aborted" in str(failed.value)
        conn.rollback()
        with conn.transaction():
            conn.execute(COUNT, [64]).fetchone()
        assert status(conn) == "IDLE"
    with connect(main.port, "bob") as conn:  # autocommit: explicit statements
        conn.execute("BEGIN")
        assert status(conn) == "INTRANS"
        conn.execute(COUNT, [65]).fetchone()
        conn.execute("ROLLBACK")
        assert status(conn) == "IDLE"
    queries = [r.payload["query"] for r in charges(main.ledger, "bob")]
    # Rolled back or not, an answered query stays charged; the refused one was not.
    assert [q[-2:] for q in queries[-4:]] == ["61", "62", "64", "65"]


def test_aborted_transaction_sqlstate(main: Served) -> None:
    """PostgreSQL's 25P02, which drivers map to InFailedSqlTransaction."""
    with connect(main.port, "bob", autocommit=False) as conn:
        with pytest.raises(pg_errors.UndefinedTable):
            conn.execute("SELECT COUNT(*) FROM nope")
        with nothing_charged(main.ledger), pytest.raises(pg_errors.InFailedSqlTransaction):
            conn.execute(COUNT, [66])


def test_psycopg_fetchmany_over_a_grouped_answer(main: Served) -> None:
    with connect(main.port, "alice") as conn:
        cursor = conn.execute(
            "SELECT region, COUNT(*) AS n FROM visits WHERE age > %s GROUP BY region "
            "ORDER BY region",
            [52],
        )
        assert cursor.rowcount == 5
        pages = [cursor.fetchmany(2) for _ in range(4)]
    assert [len(page) for page in pages] == [2, 2, 1, 0]
    assert [region for page in pages for region, _ in page] == [
        "central", "east", "north", "south", "west",
    ]  # fmt: skip


def test_psycopg_prepared_statements_are_served_from_the_cache(main: Served) -> None:
    before = len(charges(main.ledger))
    with connect(main.port, "alice") as conn, notices(conn) as seen:
        for _ in range(4):
            conn.execute(COUNT, [53], prepare=True).fetchone()
        conn.execute(COUNT, [53], prepare=False).fetchone()
    assert len(charges(main.ledger)) == before + 1
    assert seen[0].startswith("dpsql: charged: ")
    assert all(s.startswith("dpsql: served from the cache, free") for s in seen[1:])
    assert len(seen) == 5


def test_set_fresh_true_as_documented(main: Served) -> None:
    with connect(main.port, "alice") as conn:
        conn.execute(COUNT, [54]).fetchone()
        conn.execute("SET dpsql.fresh = true")
        conn.execute(COUNT, [54]).fetchone()
    assert len([r for r in charges(main.ledger) if r.payload["query"].endswith("> 54")]) == 2


# -- 3. concurrent clients ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shares", "total"),
    [({"alice": 1, "bob": 3}, 6), ({"alice": 1, "bob": Fraction(3, 2)}, Fraction(3, 2))],
    ids=["shares-bind", "total-binds"],
)
def test_concurrent_clients_race_at_the_edge(
    fresh: Callable[..., Served], shares: dict[str, float], total: Fraction
) -> None:
    served = fresh(shares=shares, total=total)
    users = ["alice", "bob"] * 4
    cost = Fraction(3, 20)
    per_thread = 8
    answered: list[tuple[str, int]] = []
    refused: list[tuple[str, int]] = []
    failures: list[BaseException] = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(users))

    def work(thread: int, user: str) -> None:
        try:
            with connect(served.port, user) as conn:
                conn.execute("SET dpsql.epsilon = 0.15")
                conn.execute("SET dpsql.fresh = 'true'")
                barrier.wait(timeout=30)
                for i in range(per_thread):
                    literal = 1000 + 100 * thread + i  # unique: the cache never serves
                    try:
                        conn.execute(
                            "SELECT COUNT(*) FROM visits WHERE spend < %s", [literal]
                        ).fetchone()
                    except psycopg.OperationalError as exc:
                        assert exc.sqlstate == "53R01", exc
                        with lock:
                            refused.append((user, literal))
                    else:
                        with lock:
                            answered.append((user, literal))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(k, u)) for k, u in enumerate(users)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures, failures
    assert len(answered) + len(refused) == len(users) * per_thread

    ledger = Ledger(served.ledger)
    ledger.verify()
    charged = {}
    for record in ledger.records():
        if record.kind == "charge":
            match = re.fullmatch(r"SELECT COUNT\(\*\) FROM visits WHERE spend < (\d+)",
                                 record.payload["query"])  # fmt: skip
            assert match is not None
            assert Fraction(record.payload["epsilon"]) == cost
            charged[int(match.group(1))] = record.analyst
    # One charge per answer, under the name that authenticated the connection; none for a refusal.
    assert charged == {literal: user for user, literal in answered}
    for name, share in shares.items():
        assert spent(served.ledger, name) <= share
    assert spent(served.ledger) <= total
    # They raced to the edge: each refusal was needed, no budget was left unused by more than
    # one query.
    per_user = {name: sum(1 for u, _ in answered if u == name) for name in shares}
    if total == 6:
        assert per_user == {"alice": 6, "bob": 20}  # 6 x 0.15 = 0.9 <= 1, 20 x 0.15 = 3
    else:
        assert sum(per_user.values()) == 10  # 10 x 0.15 = 1.5
        assert per_user["alice"] <= 6


# -- 4. isolation ---------------------------------------------------------------------------------

REFUSED = [
    ("SELECT COUNT(*) FROM read_csv('/etc/passwd')", "0A000"),
    ("SELECT * FROM read_csv_auto('/etc/passwd')", "0A000"),
    (
        "SELECT COUNT(*) FROM visits WHERE region = (SELECT content FROM read_text('/etc/passwd'))",
        "0A000",
    ),
    ("SELECT COUNT(*) FROM visits, LATERAL (SELECT * FROM read_csv('/etc/passwd')) t", "0A000"),
    ("SELECT COUNT(*) FROM glob('/etc/*')", "0A000"),
    ("SELECT COUNT(*) FROM visits WHERE getenv('HOME') = '/root'", "0A000"),
    ("COPY visits TO '{tmp}/out.csv'", "0A000"),
    ("COPY (SELECT * FROM visits) TO '{tmp}/out.csv'", "0A000"),
    ("EXPORT DATABASE '{tmp}/export'", "42601"),
    ("ATTACH '{ledger}' AS stolen", "0A000"),
    ("ATTACH '{ledger}' AS stolen (TYPE sqlite)", "0A000"),
    ("SELECT COUNT(*) FROM sqlite_scan('{ledger}', 'records')", "0A000"),
    ("SELECT COUNT(*) FROM '{ledger}'", "42P01"),
    ("INSTALL httpfs", "0A000"),
    ("LOAD httpfs", "0A000"),
    ("SELECT COUNT(*) FROM '{visits}'", "42P01"),
    ("SELECT COUNT(*) FROM read_parquet('{visits}')", "0A000"),
    ("SELECT COUNT(*) FROM salaries", "42P01"),
    ("SELECT AVG(salary) FROM salaries", "42P01"),
    ("SELECT COUNT(*) FROM visits JOIN salaries ON visits.user_id = salaries.id", "42P01"),
    ("SELECT COUNT(*) FROM warehouse.salaries", "0A000"),
    # Catalog relations answer from the policy's empty schema
    # (tests/interfaces/test_server_catalog.py), but never with a relation that is not one, nor with
    # a table function.
    ("SELECT COUNT(*) FROM information_schema.tables, salaries", "0A000"),
    ("SELECT * FROM pg_catalog.pg_tables, read_csv('/etc/passwd')", "0A000"),
    ("SELECT relname FROM pg_class WHERE relname IN (SELECT name FROM salaries)", "42P01"),
    ("SELECT COUNT(*) FROM duckdb_tables()", "0A000"),
    ("SELECT * FROM duckdb_settings()", "0A000"),
    ("SHOW TABLES", "0A000"),
    ("DESCRIBE salaries", "0A000"),
    ("PRAGMA database_list", "0A000"),
    ("SHOW memory_limit", "0A000"),
    ("SELECT current_setting('memory_limit')", "0A000"),
    ("SHOW dpsql.ledger", "42501"),
    ("SHOW dpsql.report", "42501"),
    ("SELECT name FROM regions", "0A000"),  # a public table alone: nothing private to answer
    ("SELECT user_id FROM visits", "42703"),  # the privacy unit is never output
    ("CREATE TABLE copy AS SELECT * FROM visits", "0A000"),
    ("DROP TABLE visits", "0A000"),
    ("DETACH warehouse", "0A000"),
    ("USE warehouse", "42601"),
]


@pytest.mark.parametrize(("template", "code"), REFUSED, ids=[q for q, _ in REFUSED])
def test_isolation_statement_is_refused(
    warehouse: Served,
    warehouse_alice: psycopg.Connection[Any],
    *,
    dataset: Dataset,
    tmp_path: Path,
    template: str,
    code: str,
) -> None:
    query = template.format(tmp=tmp_path, ledger=warehouse.ledger, visits=dataset.visits)
    conn = warehouse_alice
    with nothing_charged(warehouse.ledger):
        with pytest.raises(psycopg.Error) as info:
            conn.execute(query)
        assert info.value.sqlstate == code, info.value
        assert "root:" not in str(info.value)
        assert "employee" not in str(info.value)
        assert conn.execute("SELECT current_user").fetchone() == ("alice",)
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_policy_tables_answer(
    warehouse: Served, warehouse_alice: psycopg.Connection[Any], main: Served
) -> None:
    """What the policy declares is reachable, from Parquet files and from the database."""

    def check(conn: psycopg.Connection[Any], ledger: Path) -> None:
        for query in (
            "SELECT SUM(amount) FROM purchases WHERE amount > 10",
            "SELECT COUNT(*) FROM visits JOIN regions ON visits.region = regions.name "
            "WHERE regions.area > 15",
        ):
            assert conn.execute(query).fetchall()
            assert charges(ledger)[-1].payload["query"].split()[:2] == query.split()[:2]

    check(warehouse_alice, warehouse.ledger)
    with connect(main.port, "alice") as conn:
        check(conn, main.ledger)


def test_two_clients_at_once_over_a_duckdb_database(fresh: Callable[..., Served]) -> None:
    served = fresh(database=True)
    with connect(served.port, "alice") as alice, connect(served.port, "bob") as bob:
        assert alice.execute(COUNT, [20]).fetchone() is not None
        assert bob.execute(COUNT, [20]).fetchone() is not None


def test_client_settings_change_nothing(main: Served) -> None:
    """``SET x = y`` for a DuckDB setting is accepted (drivers send such statements) and
    ignored: external access stays off, the configuration stays locked."""
    with connect(main.port, "alice") as conn, nothing_charged(main.ledger):
        for statement in (
            "SET enable_external_access = true",
            "SET lock_configuration = false",
            "SET memory_limit = '1GB'",
            "SET SESSION allow_unsigned_extensions TO true",
            "RESET ALL",
        ):
            assert conn.execute(statement).statusmessage == statement.split()[0]
        for probe in (
            "SELECT COUNT(*) FROM read_csv('/etc/passwd')",
            "SELECT COUNT(*) FROM '/etc/passwd'",
            "SHOW enable_external_access",
        ):
            with pytest.raises(psycopg.Error) as info:
                conn.execute(probe)
            assert info.value.sqlstate in ("0A000", "42P01")
            assert "root:" not in str(info.value)


def test_psql_owner_only_statements(main: Served) -> None:
    script = "\\set VERBOSITY verbose\nSHOW dpsql.ledger;\n"
    with nothing_charged(main.ledger):
        refused = psql(main.port, "alice", script)
        answered = psql(main.port, "olga", script + "SHOW dpsql.report;\n")
    assert refused.returncode == 3
    assert "ERROR:  42501: SHOW dpsql.ledger is reserved to the data owner" in refused.stderr
    assert answered.returncode == 0, answered.stderr
    lines = answered.stdout.splitlines()
    assert re.fullmatch(r"ledger verified: \d+ record\(s\)", lines[0])
    assert lines[1] == "# Privacy report: data set `server-test`"


def test_an_owner_without_a_share_cannot_spend(main: Served) -> None:
    with (
        connect(main.port, "olga") as conn,
        nothing_charged(main.ledger),
        pytest.raises(psycopg.OperationalError) as info,
    ):
        conn.execute(COUNT, [55])
    assert info.value.sqlstate == "53R01"


def test_an_analyst_cannot_spend_another_share(fresh: Callable[..., Served]) -> None:
    served = fresh()
    with connect(served.port, "alice") as alice, connect(served.port, "bob") as bob:
        for conn in (alice, bob):
            conn.execute("SET dpsql.epsilon = 0.5")
        alice.execute(COUNT, [20]).fetchone()
        alice.execute(COUNT, [21]).fetchone()
        with pytest.raises(psycopg.OperationalError) as info:
            alice.execute(COUNT, [22])  # alice's share (1) is spent
        assert info.value.sqlstate == "53R01"
        bob.execute(COUNT, [30]).fetchone()  # bob's is not
        bob.execute(COUNT, [31]).fetchone()
        with pytest.raises(psycopg.OperationalError):
            alice.execute(COUNT, [23])  # and bob's spending gave alice nothing
    # alice cannot log in as bob with her own password, through either client.
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        connect(served.port, "bob", password=PASSWORDS["alice"])
    out = psql(served.port, "bob", "SELECT COUNT(*) FROM visits;", password=PASSWORDS["alice"])
    assert out.returncode == 2
    by_name = {
        name: [r.payload["query"][-2:] for r in charges(served.ledger, name)]
        for name in ("alice", "bob")
    }
    assert by_name == {"alice": ["20", "21"], "bob": ["30", "31"]}
    assert len(charges(served.ledger)) == 4  # no charge without a name
    assert spent(served.ledger, "alice") == 1


def test_the_authenticated_name_cannot_change(main: Served) -> None:
    """Neither startup options nor SET statements make alice's queries anyone else's. A
    ``dpsql.*`` startup option is a SET the analyst may send (here a smaller epsilon); one that
    is no setting (``dpsql.analyst``) refuses the connection."""
    with pytest.raises(psycopg.OperationalError):
        connect(main.port, "alice", options="-c dpsql.analyst=bob").close()
    options = "-c session_authorization=bob -c role=bob -c dpsql.epsilon=0.02"
    with connect(main.port, "alice", options=options) as conn:
        for statement in (
            "SET SESSION AUTHORIZATION bob",
            "SET ROLE bob",
            "SET dpsql.analyst = 'bob'",
            "RESET SESSION AUTHORIZATION",
        ):
            with contextlib.suppress(psycopg.Error):  # refused (42501, 22023) or ignored
                conn.execute(statement)
        for probe in ("SELECT current_user", "SELECT session_user", "SHOW session_authorization"):
            assert conn.execute(probe).fetchone() == ("alice",)
        assert conn.execute("SHOW dpsql.epsilon").fetchone() == ("0.02",)
        conn.execute(COUNT, [67]).fetchone()
    last = charges(main.ledger)[-1]
    assert (last.analyst, last.payload["epsilon"]) == ("alice", "1/50")
    assert last.payload["query"].endswith("> 67")


def test_statement_timeout(fresh: Callable[..., Served]) -> None:
    """A statement cut off fails as any engine failure after the charge does, with the same
    SQLSTATE and message (whether a query ends in time depends on the data, so a code of its own
    would tell); a charge made before the cut stands, in full."""
    served = fresh(limits=Limits(statement_timeout=0.001))
    code, message = engine_failure()
    with connect(served.port, "alice") as conn:
        with pytest.raises(psycopg.Error) as info:
            conn.execute(COUNT, [68])
        assert (info.value.sqlstate, info.value.diag.message_primary) == (code, message)
        assert info.value.diag.severity == "ERROR"
        assert not conn.broken  # the connection stays (its next statement would be cut too)
    assert Ledger(served.ledger).verify() >= 0
    assert [(r.analyst, r.payload["epsilon"]) for r in charges(served.ledger)] in (
        [],
        [("alice", "1/100")],
    )


# -- 5. SIGTERM -----------------------------------------------------------------------------------


def test_sigterm_stops_the_server_cleanly(tmp_path: Path, dataset: Dataset, users: Path) -> None:
    policy, ledger = write_policy(tmp_path, dataset)
    serve = start_subprocess(policy, users)
    try:
        out = psql(serve.port, "alice", "SELECT COUNT(*) FROM visits WHERE age > 56;")
        assert out.returncode == 0, out.stderr
        idle = connect(serve.port, "bob")
        idle.execute(COUNT, [57]).fetchone()
        signalled = time.monotonic()
        serve.process.send_signal(signal.SIGTERM)
        assert serve.process.wait(timeout=15) == 0
        assert time.monotonic() - signalled < 5
        with pytest.raises(psycopg.OperationalError) as info:
            idle.execute(COUNT, [58])
        # The FATAL sent before the close (libpq reads it first), or the close itself.
        assert info.value.sqlstate == "57P01" or "closed" in str(info.value), info.value
        idle.close()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", serve.port), timeout=2).close()
    finally:
        serve.stop()
    log = "".join(serve.log)
    assert "dpsql serve stopped" in log
    assert "Traceback" not in log
    assert Ledger(ledger).verify() == 5  # the budget, two charges and their releases, chained
    assert [(r.analyst, r.payload["query"][-2:]) for r in charges(ledger)] == [
        ("alice", "56"),
        ("bob", "57"),
    ]


# -- 6. TLS ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_certificate(tmp_path_factory.mktemp("tls"))


def test_tls_required(fresh: Callable[..., Served], certificate: tuple[Path, Path]) -> None:
    served = fresh(tls=certificate, require_tls=True)
    out = psql(
        served.port, "alice", "\\conninfo\nSELECT COUNT(*) FROM visits;\n", sslmode="require"
    )
    assert out.returncode == 0, out.stderr
    assert re.search(r"SSL connection \(protocol: TLSv1\.[23]", out.stdout), out.stdout
    refused = psql(served.port, "alice", "SELECT COUNT(*) FROM visits;", sslmode="disable")
    assert refused.returncode == 2
    assert "FATAL:  this server requires TLS" in refused.stderr
    # The SQLSTATE, read off the wire, before any authentication.
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        sock.sendall(startup_packet("alice"))
        kind, body = read_backend(sock)
        assert kind == b"E"
        assert error_fields(body)["C"] == "28000"
        assert error_fields(body)["S"] == "FATAL"
        assert read_backend(sock) == (b"", b"")
    with connect(served.port, "bob", sslmode="require") as conn:
        assert conn.pgconn.ssl_in_use
        assert conn.execute(COUNT, [40]).fetchone() is not None
    with pytest.raises(psycopg.OperationalError, match="requires TLS"):
        connect(served.port, "bob", sslmode="disable")
    assert [r.analyst for r in charges(served.ledger)] == ["alice", "bob"]


def test_tls_offered(
    fresh: Callable[..., Served], main: Served, certificate: tuple[Path, Path]
) -> None:
    served = fresh(tls=certificate)
    for mode, encrypted in (("require", True), ("prefer", True), ("disable", False)):
        with connect(served.port, "alice", sslmode=mode) as conn:
            assert conn.pgconn.ssl_in_use is encrypted
            assert conn.execute("SELECT current_user").fetchone() == ("alice",)
    # Without a certificate the server declines the SSLRequest; prefer falls back, require fails.
    with connect(main.port, "alice", sslmode="prefer") as conn:
        assert not conn.pgconn.ssl_in_use
    out = psql(main.port, "alice", "SELECT current_user;", sslmode="require")
    assert out.returncode == 2
    assert "server does not support SSL" in out.stderr


# -- 7. protocol robustness -----------------------------------------------------------------------


def test_garbage_before_startup(main: Served) -> None:
    with socket.create_connection(("127.0.0.1", main.port), timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: example\r\n\r\n")
        messages = read_until_closed(sock)
    assert [kind for kind, _ in messages] == [b"E"]
    assert error_fields(messages[0][1])["C"] == "08P01"
    assert_serving(main.port)


@pytest.mark.parametrize(
    "packet",
    [
        struct.pack("!i", 100) + struct.pack("!i", 196608) + b"user\0ali",  # cut short
        struct.pack("!i", 3),  # a length below the minimum
        struct.pack("!ii", 16, 80877102) + b"\0\0",  # a CancelRequest cut short
        struct.pack("!i", 12) + struct.pack("!i", 196608) + b"user",  # no NUL terminators
    ],
    ids=["truncated", "too-short", "cancel-truncated", "no-nul"],
)
def test_malformed_startup(main: Served, packet: bytes) -> None:
    with socket.create_connection(("127.0.0.1", main.port), timeout=10) as sock:
        sock.sendall(packet)
        sock.shutdown(socket.SHUT_WR)
        messages = read_until_closed(sock)
    assert [kind for kind, _ in messages] == [b"E"], messages
    assert error_fields(messages[0][1])["C"] == "08P01"
    assert_serving(main.port)


def test_garbage_after_a_declined_ssl_request(main: Served) -> None:
    with socket.create_connection(("127.0.0.1", main.port), timeout=10) as sock:
        sock.sendall(struct.pack("!ii", 8, 80877103))
        assert sock.recv(1) == b"N"  # no certificate: TLS declined, a startup packet expected
        sock.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # a TLS ClientHello
        messages = read_until_closed(sock)
    assert [kind for kind, _ in messages] == [b"E"]
    assert error_fields(messages[0][1])["C"] == "08P01"
    assert_serving(main.port)


def test_old_protocol_version_is_refused(main: Served) -> None:
    with socket.create_connection(("127.0.0.1", main.port), timeout=10) as sock:
        body = struct.pack("!i", 2 << 16) + b"user\0alice\0\0"
        sock.sendall(struct.pack("!i", len(body) + 4) + body)
        messages = read_until_closed(sock)
    assert [kind for kind, _ in messages] == [b"E"]
    assert error_fields(messages[0][1])["C"] == "0A000"


def test_a_stalled_startup_does_not_block_others(main: Served) -> None:
    with socket.create_connection(("127.0.0.1", main.port), timeout=10) as sock:
        sock.sendall(struct.pack("!i", 100) + b"\0\3")  # and then nothing
        assert_serving(main.port)
        out = psql(main.port, "alice", "SELECT current_user;")
        assert (out.returncode, out.stdout) == (0, "alice\n")


@pytest.mark.parametrize(
    "message",
    [
        b"Q" + struct.pack("!i", 1 << 30) + b"SELECT",  # claims a 1 GiB query
        b"Q" + struct.pack("!i", (1 << 20) + 5 + 4) + b"SELECT",  # just above the 1 MiB cap
        b"Q" + struct.pack("!i", 2),  # a length below 4
        frame(b"Q", b"SELECT 1"),  # no NUL terminator
        frame(b"Q", b"\xff\xfe\0"),  # not UTF-8
        frame(b"!", b""),  # an unknown message type
        frame(b"P", b"\0SELECT 1\0\0\5"),  # a Parse whose counts run past the end
        frame(b"B", b"\0\0\0\0\0\1\0\0\0\x10ab\0\0"),  # a Bind whose value runs past the end
    ],
    ids=["huge", "over-cap", "short-length", "no-nul", "not-utf8", "unknown", "parse", "bind"],
)
def test_malformed_message_after_authentication(main: Served, message: bytes) -> None:
    with nothing_charged(main.ledger), raw_login(main.port, "alice") as sock:
        sock.sendall(message)
        messages = read_until_closed(sock)
    assert [kind for kind, _ in messages] == [b"E"], messages
    fields = error_fields(messages[0][1])
    assert (fields["S"], fields["C"]) == ("FATAL", "08P01")
    assert_serving(main.port)


def test_extended_protocol_errors_recover_at_sync(main: Served) -> None:
    with raw_login(main.port, "alice") as sock:
        sock.sendall(
            frame(b"B", b"\0nope\0\0\0\0\0\0\0")  # Bind to a statement never parsed
            + frame(b"E", b"\0\0\0\0\0")  # skipped until Sync
            + frame(b"S", b"")
        )
        kinds = [read_backend(sock) for _ in range(2)]
        assert kinds[0][0] == b"E" and kinds[1] == (b"Z", b"I")
        # The connection goes on: a parameterised count through Parse/Bind/Describe/Execute.
        query = b"SELECT COUNT(*) FROM visits WHERE age > $1\0"
        sock.sendall(
            frame(b"P", b"s1\0" + query + b"\0\0")
            + frame(b"B", b"p1\0s1\0\0\0\0\1\0\0\0\x0259\0\0")
            + frame(b"D", b"Pp1\0")
            + frame(b"E", b"p1\0\0\0\0\0")
            + frame(b"S", b"")
        )
        seen = []
        while True:
            kind, _ = read_backend(sock)
            seen.append(kind)
            if kind in (b"Z", b""):
                break
        # Describe runs (and charges) the statement: its columns are known only then.
        assert seen == [b"1", b"2", b"T", b"N", b"D", b"C", b"Z"], seen
        sock.sendall(frame(b"X", b""))
        assert read_backend(sock) == (b"", b"")
    # An untyped (OID 0) parameter arrives as text: a string literal, which DuckDB casts.
    assert charges(main.ledger)[-1].payload["query"].endswith("age > '59'")


def execute_in_pages(port: int, age: int) -> tuple[bytes, list[str]]:
    """A grouped count through Parse, Bind, Describe and three Execute(max_rows=2), as JDBC's
    fetch size sends it: the message types received, and the regions of the DataRows."""
    query = (
        f"SELECT region, COUNT(*) FROM visits WHERE age > {age} GROUP BY region ORDER BY region"
    ).encode()
    with raw_login(port, "alice") as sock:
        sock.sendall(
            frame(b"P", b"\0" + query + b"\0\0\0")
            + frame(b"B", b"p\0\0\0\0\0\0\0\0")
            + frame(b"D", b"Pp\0")
            + b"".join(frame(b"E", b"p\0" + struct.pack("!i", 2)) for _ in range(3))
            + frame(b"S", b"")
        )
        kinds = b""
        regions: list[str] = []
        while True:
            kind, body = read_backend(sock)
            kinds += kind
            if kind == b"D":
                (size,) = struct.unpack_from("!i", body, 2)
                regions.append(body[6 : 6 + size].decode())
            if kind in (b"Z", b""):
                return kinds, regions


def test_execute_with_a_row_limit_suspends_the_portal(main: Served) -> None:
    before = len(charges(main.ledger))
    kinds, regions = execute_in_pages(main.port, 69)
    # ParseComplete, BindComplete, RowDescription, then pages of 2, 2 and 1 rows.
    assert kinds.replace(b"N", b"") == b"12TDDsDDsDCZ", kinds
    assert regions == ["central", "east", "north", "south", "west"]
    assert len(charges(main.ledger)) == before + 1


def test_a_paged_answer_reports_its_charge_once(main: Served) -> None:
    kinds, _ = execute_in_pages(main.port, 70)
    assert kinds.count(b"N") == 1, kinds


def test_a_stranger_cancel_request_is_ignored(main: Served) -> None:
    with socket.create_connection(("127.0.0.1", main.port), timeout=10) as sock:
        sock.sendall(struct.pack("!iiii", 16, 80877102, 12345, 67890))
        assert read_until_closed(sock) == []
    assert_serving(main.port)


def test_connection_limit_and_authentication_timeout(fresh: Callable[..., Served]) -> None:
    """Sockets that never authenticate take no session slot (the flood of them is in
    test_server_logins.py); past ``max_connections`` sessions, an authenticated client is
    refused with 53300."""
    served = fresh(limits=Limits(max_connections=2, auth_timeout=3.0))
    silent = [socket.create_connection(("127.0.0.1", served.port), timeout=10) for _ in range(2)]
    try:
        time.sleep(0.2)  # the server has accepted both
        with connect(served.port, "alice"), connect(served.port, "bob"):
            out = psql(served.port, "alice", "SELECT current_user;")
            assert out.returncode == 2 and "too many connections" in out.stderr
        # Who never authenticates is cut off.
        for sock in silent:
            assert read_until_closed(sock) == []
    finally:
        for sock in silent:
            sock.close()
    deadline = time.monotonic() + 10
    while True:
        out = psql(served.port, "alice", "SELECT current_user;")
        if out.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert (out.returncode, out.stdout) == (0, "alice\n"), out.stderr


def test_a_session_that_does_not_open_in_time_is_a_fatal_error(
    fresh: Callable[..., Served],
) -> None:
    """Opening the worker's session has its own limit, after authentication's: a client is told
    why (57P03), not dropped, and nothing is charged."""
    served = fresh(limits=Limits(open_timeout=0.001))
    out = psql(served.port, "alice", "SELECT COUNT(*) FROM visits;")
    assert out.returncode == 2, out
    assert "did not open within 0.001 s" in out.stderr, out.stderr
    assert charges(served.ledger) == []


# -- the server as a library ----------------------------------------------------------------------


def test_in_process_server_in_a_fresh_interpreter(
    tmp_path: Path, dataset: Dataset, users: Path
) -> None:
    policy, _ = write_policy(tmp_path, dataset)
    script = textwrap.dedent(
        """
        import asyncio, sys
        from pathlib import Path
        import psycopg
        from dpsql.policy import load_policy
        from dpsql.interfaces.pgwire.server import DpsqlServer, ServerConfig

        async def main():
            config = ServerConfig(policy=load_policy(sys.argv[1]), users_file=Path(sys.argv[2]),
                                  port=0)
            server = DpsqlServer(config)
            await server.start()

            def client():
                with psycopg.connect(host="127.0.0.1", port=server.port, user="alice",
                                     password=sys.argv[3], dbname="visits", sslmode="disable",
                                     autocommit=True) as conn:
                    return conn.execute("SELECT COUNT(*) FROM visits").fetchone()

            try:
                print(await asyncio.to_thread(client))
            finally:
                await server.shutdown(1)

        asyncio.run(main())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(policy), str(users), PASSWORDS["alice"]],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr


def test_the_other_group_over_the_wire(main: Served) -> None:
    by_region = "SELECT region, COUNT(*) AS n FROM visits GROUP BY region"
    with connect(main.port, "bob") as conn:
        conn.execute("SET dpsql.other_group = on")
        conn.execute("SET dpsql.other_label = 'elsewhere'")
        rows = conn.execute(by_region).fetchall()
        # Every visit's region is in the domain: the other group is released, empty.
        assert sorted(r[0] for r in rows) == sorted([*REGIONS, "elsewhere"])
        plan = conn.execute("EXPLAIN " + by_region).fetchall()
        assert any("other group keyed 'elsewhere'" in r[0] for r in plan)
        conn.execute("SET dpsql.other_label = 'east'")
        with nothing_charged(main.ledger), pytest.raises(psycopg.Error) as info:
            conn.execute(by_region)
        assert "dpsql.other_label equals a value" in str(info.value)
        assert info.value.sqlstate == "22023"  # invalid parameter value
