"""The synthetic catalog of ``dpsql serve``, through real clients: psql's ``\\d`` family,
SQLAlchemy 2 with psycopg (``create_engine``, ``inspect``), and pandas' ``read_sql``.

What must hold: the catalog shows exactly the policy's tables and columns, with their declared
or stored types, and sizes and statistics that are constants (two servers over different data
answer every catalog query identically); a catalog query charges nothing; a statement that
reads anything but catalog relations (a private table, an undeclared table, a table function)
is never answered by the catalog; a catalog query that runs too long is cut off.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import psycopg
import pytest
import sqlalchemy as sa
from server_fixtures import (
    PASSWORDS,
    Dataset,
    ServerThread,
    connect,
    psql,
    records,
    write_dataset,
    write_policy,
    write_users,
)

from dpsql import errors
from dpsql.interfaces.pgwire.catalog import Catalog, wire_type
from dpsql.interfaces.pgwire.catalog_rewrite import catalog_sql
from dpsql.interfaces.pgwire.config import Limits
from dpsql.interfaces.pgwire.statements import engine_failure, public_settings

POLICY_TABLES = ["purchases", "regions", "visits"]
VISITS_COLUMNS = [
    ("user_id", "bigint"),
    ("region", "character varying"),
    ("age", "integer"),
    ("spend", "double precision"),
    ("day", "date"),
]


@pytest.fixture(scope="module")
def users(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_users(tmp_path_factory.mktemp("users") / "users.json")


def _server(folder: Path, users: Path, rows: int, **limits: Any) -> ServerThread:
    """A server over a data set of ``rows`` visits; its policy also reads a DuckDB database
    holding ``salaries``, which the policy does not declare."""
    data: Dataset = write_dataset(folder / "data", rows)
    policy, _ = write_policy(folder / "policy", data, database=True)
    return ServerThread(policy, users, limits=Limits(**limits) if limits else None)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, users: Path) -> Iterator[ServerThread]:
    with _server(tmp_path_factory.mktemp("catalog"), users, 3000) as server:
        yield server


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory, users: Path) -> Iterator[ServerThread]:
    """The same policy over ten times the rows."""
    with _server(tmp_path_factory.mktemp("catalog-other"), users, 30000) as server:
        yield server


@contextlib.contextmanager
def nothing_recorded(server: ServerThread) -> Iterator[None]:
    ledger = Path(server.policy.ledger.path)  # type: ignore[union-attr]
    before = records(ledger)
    yield
    assert records(ledger) == before


def _engine(server: ServerThread, user: str = "alice") -> sa.Engine:
    url = f"postgresql+psycopg://{user}:{PASSWORDS[user]}@127.0.0.1:{server.port}/visits"
    return sa.create_engine(url, poolclass=sa.pool.NullPool)


# -- real clients -----------------------------------------------------------------------------


def test_psql_lists_exactly_the_policy_tables(served: ServerThread) -> None:
    with nothing_recorded(served):
        out = psql(served.port, "alice", "\\dt\n\\d\n")
    assert out.returncode == 0, out.stderr
    listed = [line.split("|") for line in out.stdout.splitlines() if line]
    assert [row[1] for row in listed] == POLICY_TABLES * 2  # \dt, then \d
    assert all(row[0] == "main" and row[2] == "table" for row in listed)
    assert "salaries" not in out.stdout  # in the database file, not in the policy


def test_psql_describes_a_table_with_its_declared_types(served: ServerThread) -> None:
    with nothing_recorded(served):
        out = psql(served.port, "alice", "\\d visits\n", args=("-X", "-A", "-v", "ON_ERROR_STOP=1"))
    assert out.returncode == 0, out.stderr
    rows = [line.split("|") for line in out.stdout.splitlines() if line.count("|") >= 2]
    assert [(r[0], r[1]) for r in rows[1:]] == VISITS_COLUMNS  # after the header line
    assert 'Table "main.visits"' in out.stdout


@pytest.mark.parametrize("command", ["\\d+ visits", "\\dn", "\\l", "\\du", "\\dv", "\\di", "\\dx"])
def test_other_psql_catalog_commands_answer(served: ServerThread, command: str) -> None:
    with nothing_recorded(served):
        out = psql(served.port, "alice", command + "\n")
    assert out.returncode == 0, out.stderr
    assert "salaries" not in out.stdout and "employee" not in out.stdout


def test_sqlalchemy_inspects_the_schema(served: ServerThread) -> None:
    engine = _engine(served)
    try:
        with nothing_recorded(served):
            inspector = sa.inspect(engine)
            assert sorted(inspector.get_table_names()) == POLICY_TABLES
            columns = inspector.get_columns("visits")
            assert inspector.get_pk_constraint("visits")["constrained_columns"] == []
            assert inspector.get_indexes("visits") == []
            assert inspector.get_foreign_keys("visits") == []
            assert inspector.has_table("visits") and not inspector.has_table("salaries")
            assert inspector.get_schema_names() == ["main"]
    finally:
        engine.dispose()
    assert [(c["name"], type(c["type"]).__name__) for c in columns] == [
        ("user_id", "BIGINT"),
        ("region", "VARCHAR"),
        ("age", "INTEGER"),
        ("spend", "DOUBLE_PRECISION"),
        ("day", "DATE"),
    ]


def test_pandas_reads_a_noisy_answer_through_sqlalchemy(served: ServerThread) -> None:
    ledger = Path(served.policy.ledger.path)  # type: ignore[union-attr]
    before = len(records(ledger))
    engine = _engine(served, "bob")
    try:
        frame = pd.read_sql(
            "SELECT region, COUNT(*) AS n FROM visits WHERE age > 40 GROUP BY region", engine
        )
    finally:
        engine.dispose()
    assert list(frame.columns) == ["region", "n"]
    assert sorted(frame["region"]) == ["central", "east", "north", "south", "west"]
    new = records(ledger)[before:]
    assert [r.kind for r in new] == ["charge", "release"]  # the connect's probes charge nothing
    assert new[0].analyst == "bob"


# -- nothing from the data ---------------------------------------------------------------------

CONSTANT_QUERIES = [
    "SELECT relname, reltuples, relpages FROM pg_catalog.pg_class ORDER BY relname",
    "SELECT pg_catalog.pg_total_relation_size('visits'), pg_relation_size('visits')",
    "SELECT relname, n_live_tup FROM pg_catalog.pg_stat_user_tables ORDER BY relname",
    "SELECT COUNT(*) FROM pg_catalog.pg_stats WHERE tablename = 'visits'",
    "SELECT table_name, column_name, data_type FROM information_schema.columns "
    "ORDER BY table_name, ordinal_position",
    "SELECT table_name FROM information_schema.tables ORDER BY 1",
    "SELECT attname, pg_catalog.format_type(atttypid, atttypmod) FROM pg_catalog.pg_attribute a "
    "JOIN pg_catalog.pg_class c ON c.oid = a.attrelid WHERE c.relname = 'visits' ORDER BY attnum",
    "SELECT pg_catalog.version(), current_database(), current_user",
]


@pytest.mark.parametrize("query", CONSTANT_QUERIES)
def test_catalog_answers_do_not_depend_on_the_data(
    served: ServerThread, other: ServerThread, query: str
) -> None:
    """Two servers of one policy over 3,000 and 30,000 rows answer alike, and charge nothing."""
    answers = []
    for server in (served, other):
        with nothing_recorded(server), connect(server.port, "alice") as conn:
            answers.append(conn.execute(query).fetchall())
    assert answers[0] == answers[1]
    assert answers[0]  # answered, not empty
    flat = [v for row in answers[0] for v in row]
    assert "salaries" not in flat and 3000 not in flat and 30000 not in flat


def test_size_and_statistics_fields_are_constants(served: ServerThread) -> None:
    with connect(served.port, "alice") as conn:
        rows = conn.execute(
            "SELECT reltuples, relpages FROM pg_catalog.pg_class WHERE relname = 'visits'"
        ).fetchall()
        assert rows == [(0.0, 0)]
        assert conn.execute("SELECT COUNT(*) FROM pg_catalog.pg_stats").fetchone() == (0,)
        assert conn.execute("SELECT pg_catalog.pg_total_relation_size('visits')").fetchone() == (0,)


# -- what is not a catalog query ----------------------------------------------------------------

NOT_CATALOG = [
    "SELECT * FROM pg_catalog.pg_class, visits",
    "SELECT relname FROM pg_class WHERE EXISTS (SELECT 1 FROM visits)",
    "SELECT (SELECT COUNT(*) FROM visits) FROM pg_catalog.pg_class",
    "SELECT relname FROM pg_class c JOIN main.visits v ON true",
    "SELECT relname FROM pg_class, salaries",
    "SELECT * FROM pg_class, read_csv('/etc/passwd')",
    "SELECT * FROM pg_class WHERE relname IN (SELECT * FROM glob('/etc/*'))",
    "SELECT relname FROM pg_class, duckdb_settings()",
    "SELECT relname FROM memory.main.pg_class",
    "SELECT COUNT(*) FROM visits",
    "SELECT 1 + 1",
]


@pytest.mark.parametrize("query", NOT_CATALOG)
def test_a_statement_reading_anything_else_is_not_a_catalog_query(query: str) -> None:
    assert catalog_sql(query, public_settings("alice", "visits")) is None


@pytest.mark.parametrize(
    "query",
    [
        "SELECT pg_sleep(30)",
        "SELECT pg_catalog.pg_sleep(30) FROM pg_class",
        "SELECT relname FROM pg_class WHERE pg_catalog.current_query() IS NOT NULL",
        "SELECT inet_server_addr() FROM pg_class",
        "SELECT * FROM pg_catalog.pg_shadow",
        "SELECT * FROM information_schema.routines",
    ],
)
def test_catalog_queries_dpsql_does_not_provide_are_refused(query: str) -> None:
    with pytest.raises(errors.UnsupportedQueryError):
        catalog_sql(query, public_settings("alice", "visits"))


@pytest.mark.parametrize("query", NOT_CATALOG[:9])
def test_over_the_wire_they_are_refused_and_charge_nothing(
    served: ServerThread, query: str
) -> None:
    with nothing_recorded(served), connect(served.port, "alice") as conn:
        with pytest.raises(psycopg.Error) as info:
            conn.execute(query)
        assert info.value.sqlstate in ("0A000", "42P01", "42703"), info.value
        assert "root:" not in str(info.value) and "employee" not in str(info.value)


def test_the_catalog_connection_reads_no_file(tmp_path: Path) -> None:
    secret = tmp_path / "secret.csv"
    secret.write_text("a\n1\n", encoding="utf-8")
    catalog = Catalog({"visits": {"user_id": "BIGINT"}})
    try:
        for sql in (
            f"SELECT * FROM read_csv('{secret}')",
            f"SELECT * FROM '{secret}'",
            f"ATTACH '{tmp_path / 'x.duckdb'}' AS x",
            "SET enable_external_access = true",
        ):
            with pytest.raises(errors.UnsupportedQueryError):
                catalog.answer(sql, None)
        assert catalog.answer("SELECT COUNT(*) FROM visits", None)[1] == [(0,)]  # empty
    finally:
        catalog.close()
    assert not (tmp_path / "x.duckdb").exists()


def test_a_long_catalog_query_is_cut_off(tmp_path: Path, users: Path) -> None:
    """A cross join of catalog views runs until the statement timeout cuts it, like any query;
    the connection stays usable."""
    with _server(tmp_path, users, 300, statement_timeout=0.5) as server:
        code, message = engine_failure()
        with nothing_recorded(server), connect(server.port, "alice") as conn:
            with pytest.raises(psycopg.Error) as info:
                conn.execute(
                    "SELECT COUNT(*) FROM pg_catalog.pg_proc a, pg_catalog.pg_proc b, "
                    "pg_catalog.pg_proc c, pg_catalog.pg_proc d"
                )
            assert (info.value.sqlstate, info.value.diag.message_primary) == (code, message)
            assert conn.execute("SELECT current_user").fetchone() == ("alice",)


@pytest.mark.parametrize(
    ("declared", "wire"),
    [
        ("BIGINT", "BIGINT"),
        ("UTINYINT", "SMALLINT"),
        ("UINTEGER", "BIGINT"),
        ("HUGEINT", "DECIMAL(38,0)"),
        ("DECIMAL(18,3)", "DECIMAL(18,3)"),
        ("TIMESTAMP_NS", "TIMESTAMP"),
        ("STRUCT(a INTEGER)", "VARCHAR"),
        ("VARCHAR", "VARCHAR"),
    ],
)
def test_catalog_types_are_the_types_sent_over_the_wire(declared: str, wire: str) -> None:
    assert wire_type(declared) == wire
    duckdb.connect().execute(f"SELECT CAST(NULL AS {wire})")  # a type DuckDB has


def test_savepoints_and_the_isolation_level_are_answered(served: ServerThread) -> None:
    """psycopg's nested blocks (SAVEPOINT, RELEASE, ROLLBACK TO), which SQLAlchemy opens on
    connect, are no-ops; ROLLBACK TO makes a failed block usable again."""
    with nothing_recorded(served), connect(served.port, "alice", autocommit=False) as conn:
        with conn.transaction():
            with conn.transaction():
                assert conn.execute("SELECT 1").fetchone() == (1,)
            with pytest.raises(psycopg.Error), conn.transaction():
                conn.execute("SELECT user_id FROM visits")  # refused: the block fails
            assert conn.execute("SELECT current_user").fetchone() == ("alice",)
        level = conn.execute("SHOW TRANSACTION ISOLATION LEVEL").fetchone()
        assert level == ("read committed",)


def test_show_budget_gives_the_callers_share(tmp_path: Path, users: Path) -> None:
    """SHOW dpsql.budget over the wire: the connected analyst's share first, then the data
    set's totals; another analyst sees their own."""
    with _server(tmp_path, users, 300) as server:
        with connect(server.port, "alice") as conn:
            conn.execute("SELECT COUNT(*) FROM visits WHERE age > 30").fetchall()
            (line,) = conn.execute("SHOW dpsql.budget").fetchone()  # type: ignore[misc]
        assert line.startswith("analyst alice: epsilon 0.01 spent of their share 1 (0.99 left)")
        assert "dataset server-test: epsilon 0.01 spent of 6" in line
        with connect(server.port, "bob") as conn:
            (line,) = conn.execute("SHOW dpsql.budget").fetchone()  # type: ignore[misc]
        assert line.startswith("analyst bob: epsilon 0 spent of their share 3 (3 left)")


def test_accuracy_columns_over_the_wire(served: ServerThread) -> None:
    """psql and BI tools see a ± per value of a grouped answer as a column of its own, and
    whether the value is mostly noise as another."""
    with connect(served.port, "bob") as conn:
        conn.execute("SET dpsql.accuracy_columns = on")
        cursor = conn.execute("SELECT region, COUNT(*) AS n FROM visits GROUP BY region")
        assert [d.name for d in cursor.description or []] == ["region", "n", "n ±", "n noise"]
        rows = cursor.fetchall()
        assert len(rows) == 5 and all(isinstance(r[2], float) and r[2] > 0 for r in rows)
        assert all(r[3] is (r[2] >= abs(r[1])) for r in rows)  # a BOOLEAN over the wire
    out = psql(
        served.port,
        "bob",
        "SET dpsql.accuracy_columns = on;\nSELECT COUNT(*) AS n FROM visits WHERE age > 20;\n",
        args=("-X", "-A", "-v", "ON_ERROR_STOP=1"),
    )
    assert out.returncode == 0, out.stderr
    assert "n|n ±|n noise" in out.stdout


def test_psql_tab_completion_queries_answer(served: ServerThread) -> None:
    """psql completes table and column names with quote_ident over pg_class and pg_attribute;
    the answer columns are named as PostgreSQL names them."""
    completion = (
        "SELECT pg_catalog.quote_ident(c.relname) FROM pg_catalog.pg_class c WHERE c.relkind IN "
        "('r', 'S', 'v', 'm', 'f', 'p') AND substring(pg_catalog.quote_ident(c.relname),1,2)='vi'"
        " AND pg_catalog.pg_table_is_visible(c.oid) LIMIT 1000"
    )
    columns = (
        "SELECT pg_catalog.quote_ident(attname) FROM pg_catalog.pg_attribute a, "
        "pg_catalog.pg_class c WHERE c.oid = a.attrelid AND a.attnum > 0 AND NOT a.attisdropped "
        "AND substring(pg_catalog.quote_ident(attname),1,1)='r' AND "
        "(pg_catalog.quote_ident(relname)='visits' OR '\"' || relname || '\"'='visits') "
        "AND pg_catalog.pg_table_is_visible(c.oid) LIMIT 1000"
    )
    with nothing_recorded(served), connect(served.port, "alice") as conn:
        cursor = conn.execute(completion)
        assert [d.name for d in cursor.description or []] == ["quote_ident"]
        assert cursor.fetchall() == [("visits",)]
        assert conn.execute(columns).fetchall() == [("region",)]
        named = conn.execute("SELECT pg_catalog.version(), current_database()")
        assert [d.name for d in named.description or []] == ["version", "current_database"]


def test_an_overlong_catalog_text_is_refused_unparsed(served: ServerThread) -> None:
    """The length limit of every query holds before the catalog parses anything."""
    padding = " OR relname = 'x'" * 8000  # ~136,000 characters
    text = f"SELECT relname FROM pg_catalog.pg_class WHERE relname = 'visits'{padding}"
    assert catalog_sql(text, public_settings("alice", "visits")) is None
    with nothing_recorded(served), connect(served.port, "alice") as conn:
        with pytest.raises(psycopg.Error) as info:
            conn.execute(text)
        assert info.value.sqlstate in ("42601", "54000"), info.value  # the loop refuses it first
