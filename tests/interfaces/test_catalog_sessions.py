"""Recorded catalog sessions of real clients, replayed against ``dpsql serve``.

``tests/interfaces/fixtures/catalog_sessions/`` holds, per client, the statements it sent to a
real PostgreSQL 15 server (how they were recorded: the README.md there): psql's backslash
commands, SQLAlchemy's reflection and pandas' ``read_sql`` over psycopg, the PostgreSQL JDBC
driver's ``DatabaseMetaData`` (what DBeaver and Metabase call), and, rendered from their source,
DBeaver's own navigator queries and Metabase's own sync queries.
Each statement is sent again, with its recorded parameters, over a real psycopg connection: each
is answered, and nothing is charged. These sessions are where the allow-list of catalog
functions comes from (``dpsql.interfaces.pgwire.catalog_objects``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from server_fixtures import ServerThread, connect, records, write_dataset, write_policy, write_users

SESSIONS = Path(__file__).parent / "fixtures" / "catalog_sessions"
CLIENTS = ("psql", "psql_completion", "sqlalchemy", "psycopg", "jdbc", "metabase", "dbeaver")


def recorded(client: str) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = json.loads((SESSIONS / f"{client}.json").read_text("utf-8"))
    return entries


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    folder = tmp_path_factory.mktemp("sessions")
    data = write_dataset(folder / "data", 300)
    policy, _ = write_policy(folder / "policy", data, database=True)
    with ServerThread(policy, write_users(folder / "users.json")) as server:
        yield server


@pytest.mark.parametrize("client", CLIENTS)
def test_each_recorded_statement_is_answered_free(served: ServerThread, client: str) -> None:
    ledger = Path(served.policy.ledger.path)  # type: ignore[union-attr]
    before = records(ledger)
    failures = []
    with connect(served.port, "alice") as conn:
        for index, entry in enumerate(recorded(client)):
            sql = entry["sql"].encode()
            params = [None if p is None else str(p).encode() for p in entry["params"]]
            # The wire as the client used it: the extended protocol with text parameters for a
            # statement that had them, the simple protocol otherwise.
            result = conn.pgconn.exec_params(sql, params) if params else conn.pgconn.exec_(sql)
            if result.error_message:
                failures.append(
                    f"{index}: {result.error_message.decode().strip()} in {entry['sql'][:80]!r}"
                )
            conn.pgconn.exec_(b"ROLLBACK")
    assert not failures, "\n".join(failures)
    assert records(ledger) == before


def test_the_jdbc_drivers_expandarray_gives_each_element_with_its_position(
    served: ServerThread,
) -> None:
    """``information_schema._pg_expandarray``, which the driver's getPrimaryKeys and
    getIndexInfo read as ``(...).x`` and ``(...).n``."""
    query = (
        "SELECT (e.k).x, (e.k).n FROM (SELECT information_schema._pg_expandarray(ARRAY[7, 9]) "
        "AS k) e, pg_catalog.pg_namespace ns WHERE ns.nspname = 'main' ORDER BY 2"
    )
    with connect(served.port, "alice") as conn:
        assert conn.execute(query).fetchall() == [(7, 1), (9, 2)]
