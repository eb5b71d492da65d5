"""What ``dpsql serve`` says about itself: fixed, public constants, alone or combined.

The single probes clients send on connect (``version()``, ``current_user``, ...) are answered
combined in one SELECT too, over psql and psycopg, as docs/server.md promises. ``pg_settings``,
``SHOW ALL`` and ``current_setting`` give the server's public constants only: no row names a
path of the server machine (its working directory, the service account's home, the temporary
directory, the policy's, data's or ledger's files).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_fixtures import (
    ServerThread,
    connect,
    psql,
    records,
    write_dataset,
    write_policy,
    write_users,
)

from dpsql.interfaces.pgwire.statements import SERVER_VERSION

VERSION = f"PostgreSQL {SERVER_VERSION}"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("constants")


@pytest.fixture(scope="module")
def served(folder: Path) -> Iterator[ServerThread]:
    data = write_dataset(folder / "data", 300)
    policy, _ = write_policy(folder / "policy", data)
    with ServerThread(policy, write_users(folder / "users.json")) as server:
        yield server


COMBINED = [
    ("SELECT version(), current_user", (VERSION, "alice")),
    ("SELECT current_database(), current_schema()", ("visits", "main")),
    ("SELECT version() AS v, current_setting('server_version')", (VERSION, SERVER_VERSION)),
    ("SELECT current_user, session_user, current_database()", ("alice", "alice", "visits")),
    ("select pg_catalog.version(), current_catalog", (VERSION, "visits")),
    ("SELECT session_user, user", ("alice", "alice")),
]


@pytest.mark.parametrize(("query", "expected"), COMBINED)
def test_combined_probes_answer_over_psycopg(
    served: ServerThread, query: str, expected: tuple[str, ...]
) -> None:
    ledger = Path(served.policy.ledger.path)  # type: ignore[union-attr]
    before = records(ledger)
    with connect(served.port, "alice") as conn:
        assert conn.execute(query).fetchone() == expected
    assert records(ledger) == before


def test_combined_probes_answer_over_psql(served: ServerThread) -> None:
    script = "".join(f"{query};\n" for query, _ in COMBINED)
    out = psql(served.port, "alice", script)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["|".join(expected) for _, expected in COMBINED]


def _server_paths(served: ServerThread, folder: Path) -> list[str]:
    paths = {os.getcwd(), str(Path.home()), tempfile.gettempdir(), "/tmp", str(folder)}
    paths |= {str(Path(served.policy.ledger.path).parent)}  # type: ignore[union-attr]
    for table in served.policy.tables.values():
        paths.add(str(Path(str(getattr(table, "path", None) or folder)).parent))
    return sorted(p for p in paths if p and p != "/")


@pytest.mark.parametrize(
    "query",
    [
        "SELECT * FROM pg_settings",
        "SELECT * FROM pg_catalog.pg_settings ORDER BY name",
        "SHOW ALL",
        "SELECT current_setting('temp_directory'), current_setting('home_directory'), "
        "current_setting('extension_directory'), current_setting('secret_directory'), "
        "current_setting('server_version'), version()",
    ],
)
def test_no_setting_names_a_path_of_the_server(
    served: ServerThread, folder: Path, query: str
) -> None:
    with connect(served.port, "alice") as conn:
        rows = conn.execute(query).fetchall()
    assert rows
    text = "\n".join(str(v) for row in rows for v in row if v is not None)
    for path in _server_paths(served, folder):
        assert path not in text, path
    assert "/" not in text  # no path at all, whatever the machine
