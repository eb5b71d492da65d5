"""Recorded catalog sessions of real clients, replayed against ``dpsql serve``.

``tests/interfaces/fixtures/catalog_sessions/`` holds, per client, the statements it sent to a
real PostgreSQL 15 server (how they were recorded: the README.md there): psql's backslash
commands, SQLAlchemy's reflection and pandas' ``read_sql`` over psycopg, the PostgreSQL JDBC
driver's ``DatabaseMetaData`` (what DBeaver and Metabase call), and Metabase's own sync queries.
Each statement is sent again, with its recorded parameters, over a real psycopg connection: each
is answered, and nothing is charged. The few a fixture marks ``refused`` (the JDBC driver's
primary keys and index columns, through ``information_schema._pg_expandarray``) are refused
with 0A000, free, as any catalog function dpsql does not provide. These sessions are where the
allow-list of catalog functions comes from (``dpsql.interfaces.pgwire.catalog_objects``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from server_fixtures import ServerThread, connect, records, write_dataset, write_policy, write_users

SESSIONS = Path(__file__).parent / "fixtures" / "catalog_sessions"
CLIENTS = ("psql", "sqlalchemy", "psycopg", "jdbc", "metabase")


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
            if "refused" in entry:  # a known gap, refused as any catalog function dpsql lacks
                if result.error_field(0x43) != b"0A000":  # C: the SQLSTATE
                    failures.append(f"{index}: not refused with 0A000")
            elif result.error_message:
                failures.append(
                    f"{index}: {result.error_message.decode().strip()} in {entry['sql'][:80]!r}"
                )
            conn.pgconn.exec_(b"ROLLBACK")
    assert not failures, "\n".join(failures)
    assert records(ledger) == before
