"""Helpers for the end-to-end tests of ``dpsql serve`` (tests/interfaces/test_server.py).

A data set written once per module (:func:`write_dataset`), a policy file with a fresh durable
ledger per server (:func:`write_policy`), a users file (:func:`write_users`), a server running
in a background thread with its own event loop (:class:`ServerThread`) or as a ``dpsql serve``
subprocess (:func:`start_subprocess`), and the two real clients: ``psql`` (:func:`psql`) and
psycopg (:func:`connect`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pytest

from dpsql.accounting.ledger.chain import Record
from dpsql.accounting.ledger.ledger import Ledger
from dpsql.accounting.ledger.store import create_ledger
from dpsql.interfaces.pgwire.config import Limits, ServerConfig
from dpsql.interfaces.pgwire.connection import Connection
from dpsql.interfaces.pgwire.server import DpsqlServer
from dpsql.interfaces.pgwire.users import add_user
from dpsql.interfaces.pgwire.worker import start_forkserver
from dpsql.policy import Policy, load_policy

PSQL = shutil.which("psql") or "psql"
REGIONS = ("central", "east", "north", "south", "west")
PASSWORDS = {"alice": "alice-secret", "bob": "bob-secret", "olga": "olga-secret"}
ROLES = {"alice": "analyst", "bob": "analyst", "olga": "owner"}
TOTAL_EPSILON = 6
SHARES = {"alice": 1, "bob": 3}
QUERY_EPSILON = "0.01"  # the policy default: many queries fit in any share
VISITS_ROWS = 3000


@dataclass(frozen=True)
class Dataset:
    """The files of the test data set."""

    visits: Path  # Parquet: private, unit user_id
    purchases: Path  # Parquet: private, unit uid
    regions: Path  # Parquet: public
    database: Path  # DuckDB: purchases (private) and salaries (which no policy declares)


def write_dataset(folder: Path, rows: int = VISITS_ROWS) -> Dataset:
    """``visits`` (3,000 rows, 1,000 users), ``purchases`` (1,500 rows, 500 users), public
    ``regions``, and a DuckDB database holding ``purchases`` and a ``salaries`` table."""
    folder.mkdir(parents=True, exist_ok=True)
    data = Dataset(
        folder / "visits.parquet",
        folder / "purchases.parquet",
        folder / "regions.parquet",
        folder / "warehouse.duckdb",
    )
    con = duckdb.connect(str(data.database))
    try:
        con.execute(
            """
            CREATE TEMP TABLE v AS
            SELECT (i % 1000)::BIGINT AS user_id,
                   ['central', 'east', 'north', 'south', 'west'][1 + (i * 7) % 5] AS region,
                   (18 + (i * 13) % 70)::INTEGER AS age,
                   ((i * 37) % 200)::DOUBLE AS spend,
                   DATE '2026-01-01' + ((i * 11) % 365)::INTEGER AS day
            FROM range(?) t(i)
            """,
            [rows],
        )
        con.execute(f"COPY v TO '{data.visits}' (FORMAT PARQUET)")
        con.execute(
            "CREATE TEMP TABLE r AS SELECT * FROM (VALUES "
            "('central', 10), ('east', 20), ('north', 30), ('south', 40), ('west', 50)"
            ") t(name, area)"
        )
        con.execute(f"COPY r TO '{data.regions}' (FORMAT PARQUET)")
        con.execute(
            "CREATE TABLE purchases AS SELECT (i % 500)::BIGINT AS uid, "
            "((i * 3) % 100)::DOUBLE AS amount FROM range(1500) t(i)"
        )
        con.execute(f"COPY purchases TO '{data.purchases}' (FORMAT PARQUET)")
        con.execute(
            "CREATE TABLE salaries AS SELECT i::BIGINT AS id, 'employee ' || i AS name, "
            "(50000 + i)::DOUBLE AS salary FROM range(10) t(i)"
        )
    finally:
        con.close()
    return data


def write_policy(
    folder: Path,
    data: Dataset,
    *,
    database: bool = False,
    shares: Mapping[str, float | Fraction] | None = None,
    total: float | Fraction = TOTAL_EPSILON,
    query_epsilon: str = QUERY_EPSILON,
) -> tuple[Path, Path]:
    """A policy file and a new durable ledger in ``folder``: ``(policy path, ledger path)``.

    Tables ``visits``, ``purchases`` (private) and ``regions`` (public) from Parquet files; with
    ``database``, ``purchases`` comes from a copy of the DuckDB database instead (a copy per
    policy: one process cannot open a database file under two configurations), and that
    database also holds ``salaries``, a table the policy does not declare.
    """
    folder.mkdir(parents=True, exist_ok=True)
    ledger = folder / "ledger.sqlite"
    share_lines = "".join(
        f'\n[budget.analysts.{name}]\nepsilon = "{epsilon}"\ndelta = "0.0000001"\n'
        for name, epsilon in (SHARES if shares is None else shares).items()
    )
    tables = {"visits": str(data.visits), "regions": str(data.regions)}
    source = ""
    if database:
        copy = folder / "warehouse.duckdb"
        shutil.copyfile(data.database, copy)
        source = f"database = {json.dumps(str(copy))}\n"
    else:
        tables["purchases"] = str(data.purchases)
    inline = ", ".join(f"{name} = {json.dumps(path)}" for name, path in tables.items())
    text = f"""
[dataset]
id = "server-test"
data_version = "1"

[data]
{source}tables = {{ {inline} }}

[ledger]
path = {json.dumps(str(ledger))}

[budget]
diagnose = false
epsilon = "{total}"
delta = "0.000001"
query_epsilon = "{query_epsilon}"
query_delta = "0.00000001"
{share_lines}
[tables.visits]
privacy_unit = "user_id"
max_groups_per_unit = 2
max_rows_per_unit_per_group = 5

[tables.visits.columns.age]
lower = 18
upper = 90

[tables.visits.columns.spend]
lower = 0
upper = 200

[tables.visits.columns.region]
public_values = {json.dumps(list(REGIONS))}

[tables.visits.columns.day]
date_range = [2026-01-01, 2026-12-31]

[tables.purchases]
privacy_unit = "uid"
max_groups_per_unit = 2
max_rows_per_unit_per_group = 5

[tables.purchases.columns.amount]
lower = 0
upper = 100

[tables.regions]
public = true
"""
    path = folder / "policy.toml"
    path.write_text(text, encoding="utf-8")
    create_ledger(load_policy(path))
    return path, ledger


def write_users(path: Path) -> Path:
    """alice and bob (analysts), olga (owner), with the passwords of ``PASSWORDS``."""
    for name, password in PASSWORDS.items():
        add_user(path, name, password, ROLES[name])  # type: ignore[arg-type]
    return path


# -- the ledger --------------------------------------------------------------------------------


def records(ledger: Path) -> list[Record]:
    """Every record, the chain verified against the anchor on the way."""
    return Ledger(ledger).records()


def charges(ledger: Path, analyst: str | None = None) -> list[Record]:
    return [
        r
        for r in records(ledger)
        if r.kind == "charge" and (analyst is None or r.analyst == analyst)
    ]


def spent(ledger: Path, analyst: str | None = None) -> Fraction:
    """The exact sum of the epsilons charged (to ``analyst``, or to anyone)."""
    return sum((Fraction(str(r.payload["epsilon"])) for r in charges(ledger, analyst)), Fraction(0))


# -- an in-process server in a background thread ------------------------------------------------


class ServerThread:
    """A :class:`DpsqlServer` on 127.0.0.1 (a free port), served by an event loop of its own in
    a daemon thread. ``stop()`` (or leaving the ``with`` block) shuts it down."""

    def __init__(
        self,
        policy: Path | Policy,
        users: Path,
        *,
        tls: tuple[Path, Path] | None = None,
        require_tls: bool = False,
        limits: Limits | None = None,
    ) -> None:
        self.policy = policy if isinstance(policy, Policy) else load_policy(policy)
        self.config = ServerConfig(
            policy=self.policy,
            users_file=users,
            host="127.0.0.1",
            port=0,
            tls_cert=tls[0] if tls else None,
            tls_key=tls[1] if tls else None,
            require_tls=require_tls,
            limits=limits or Limits(max_connections=32, statement_timeout=30.0),
        )
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.server: DpsqlServer | None = None
        self.port = 0

    def start(self) -> ServerThread:
        # Each worker runs the main module again, here pytest's script: preloaded, it costs
        # nothing (a forkserver some other test started first keeps its own preloads).
        start_forkserver(["pytest"])
        self.thread.start()

        async def boot() -> DpsqlServer:
            server = DpsqlServer(self.config)  # its Semaphore and Event belong to this loop
            await server.start()
            return server

        self.server = asyncio.run_coroutine_threadsafe(boot(), self.loop).result(timeout=30)
        self.port = self.server.port
        return self

    def stop(self, grace: float = 5.0) -> None:
        if self.server is not None:
            server, self.server = self.server, None
            asyncio.run_coroutine_threadsafe(server.shutdown(grace), self.loop).result(
                timeout=grace + 30
            )
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
        if not self.loop.is_running():
            self.loop.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- a ``dpsql serve`` subprocess ----------------------------------------------------------------

_LISTENING = re.compile(r"listening on [\d.]+:(\d+)")


@dataclass
class Served:
    """A test's server (``servers``), with its own ledger."""

    server: ServerThread
    ledger: Path

    @property
    def port(self) -> int:
        return self.server.port

    def connection(self, pid: int) -> Connection:
        assert self.server.server is not None
        return self.server.server.connections[pid]

    def busy(self) -> bool:
        """Whether some connection's worker is running a request (the server's own view)."""
        server = self.server.server
        assert server is not None
        return any(c.busy for c in list(server.connections.values()))


@contextlib.contextmanager
def servers(folder: Path, dataset: Dataset, users: Path) -> Iterator[Callable[..., Served]]:
    """A factory of servers, each with its own ledger under ``folder`` and its ``Limits``
    (``max_connections`` 8 unless given), all stopped at the end."""
    started: list[ServerThread] = []

    def make(**limits: Any) -> Served:
        policy, ledger = write_policy(folder / f"server{len(started)}", dataset)
        limits.setdefault("max_connections", 8)
        server = ServerThread(policy, users, limits=Limits(**limits)).start()
        started.append(server)
        return Served(server, ledger)

    try:
        yield make
    finally:
        for server in started:
            server.stop()


@dataclass
class ServeProcess:
    """A running ``dpsql serve``: the process, its port, and its stderr (read by a thread)."""

    process: subprocess.Popen[str]
    port: int
    log: list[str]
    reader: threading.Thread

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
        self.reader.join(timeout=10)
        if self.process.stderr is not None:
            self.process.stderr.close()


def start_subprocess(policy: Path, users: Path, *extra: str, timeout: float = 30.0) -> ServeProcess:
    """``dpsql --policy P serve --users-file U --listen 127.0.0.1:0`` (as
    tests/interfaces/test_cli.py runs the CLI: ``python -m dpsql.interfaces.cli.main``), once it
    logs the port it listens on."""
    command = [
        sys.executable, "-m", "dpsql.interfaces.cli.main", "--policy", str(policy), "serve",
        "--users-file", str(users), "--listen", "127.0.0.1:0", *extra,
    ]  # fmt: skip
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    log: list[str] = []
    port: list[int] = []
    ready = threading.Event()

    def drain() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            log.append(line)
            match = _LISTENING.search(line)
            if match and not port:
                port.append(int(match.group(1)))
                ready.set()
        ready.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    if not ready.wait(timeout) or not port:
        ServeProcess(process, 0, log, reader).stop()
        raise AssertionError("dpsql serve did not start:\n" + "".join(log))
    return ServeProcess(process, port[0], log, reader)


# -- the clients ------------------------------------------------------------------------------


def conninfo(port: int, user: str, *, sslmode: str = "disable", **extra: str) -> str:
    parts = {
        "host": "127.0.0.1",
        "port": str(port),
        "user": user,
        "dbname": "visits",
        "sslmode": sslmode,
        "connect_timeout": "10",
        **extra,
    }
    return " ".join(f"{k}={v}" for k, v in parts.items())


def psql(
    port: int,
    user: str,
    script: str,
    *,
    password: str | None = None,
    sslmode: str = "disable",
    args: Sequence[str] = ("-X", "-A", "-t", "-v", "ON_ERROR_STOP=1"),
    timeout: float = 30.0,
    **extra: str,
) -> subprocess.CompletedProcess[str]:
    """Run ``psql`` with ``script`` on stdin (so that backslash commands work) and the password
    in ``PGPASSWORD`` (``PASSWORDS[user]`` unless given). Skips the test without ``psql``."""
    return subprocess.run(
        [PSQL, *args, conninfo(port, user, sslmode=sslmode, **extra)],
        input=script,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_psql_env(user, password),
        check=False,
    )


def start_psql(
    port: int, user: str, command: str, *, args: Sequence[str] = ("-X", "-A", "-t")
) -> subprocess.Popen[str]:
    """``psql -c command`` running in the background (e.g. to be interrupted as Ctrl-C does,
    with SIGINT: psql then sends a CancelRequest). Skips the test without ``psql``."""
    return subprocess.Popen(
        [PSQL, *args, "-c", command, conninfo(port, user)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_psql_env(user, None),
    )


def _psql_env(user: str, password: str | None) -> dict[str, str]:
    if shutil.which(PSQL) is None:
        pytest.skip("needs the psql client")
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("PG")
    }  # no stray PGHOST, PGSERVICE...
    env["PGPASSWORD"] = PASSWORDS.get(user, "x") if password is None else password
    env["PGCONNECT_TIMEOUT"] = "10"
    env["PSQLRC"] = os.devnull
    return env


def connect(
    port: int,
    user: str,
    *,
    password: str | None = None,
    sslmode: str = "disable",
    autocommit: bool = True,
    **kwargs: Any,
) -> psycopg.Connection[Any]:
    return psycopg.connect(
        host="127.0.0.1",
        port=port,
        user=user,
        password=PASSWORDS.get(user, "x") if password is None else password,
        dbname="visits",
        sslmode=sslmode,
        connect_timeout=10,
        autocommit=autocommit,
        **kwargs,
    )


@contextlib.contextmanager
def notices(conn: psycopg.Connection[Any]) -> Iterator[list[str]]:
    """The NOTICE messages ``conn`` receives inside the block."""
    seen: list[str] = []

    def handler(diagnostic: psycopg.errors.Diagnostic) -> None:
        seen.append(diagnostic.message_primary or "")

    conn.add_notice_handler(handler)
    try:
        yield seen
    finally:
        conn.remove_notice_handler(handler)


# -- a raw protocol client, for what drivers never send ------------------------------------------


def startup_packet(user: str, database: str = "visits") -> bytes:
    body = struct.pack("!i", 196608)
    for key, value in (("user", user), ("database", database)):
        body += key.encode() + b"\0" + value.encode() + b"\0"
    body += b"\0"
    return struct.pack("!i", len(body) + 4) + body


def frame(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


def read_backend(sock: socket.socket) -> tuple[bytes, bytes]:
    """One backend message, or ``(b"", b"")`` when the server closed the connection."""
    head = _recv_exactly(sock, 5)
    if len(head) < 5:
        return b"", b""
    (length,) = struct.unpack("!i", head[1:])
    return head[:1], _recv_exactly(sock, length - 4)


def _recv_exactly(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        try:
            chunk = sock.recv(count - len(data))
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk
    return data


def error_fields(body: bytes) -> dict[str, str]:
    """The fields of an ErrorResponse or NoticeResponse body, by field type letter."""
    fields: dict[str, str] = {}
    for part in body.split(b"\0"):
        if part:
            fields[part[:1].decode()] = part[1:].decode()
    return fields


def read_until_closed(sock: socket.socket) -> list[tuple[bytes, bytes]]:
    """Every message up to the end of the stream."""
    seen: list[tuple[bytes, bytes]] = []
    while True:
        kind, body = read_backend(sock)
        if not kind:
            return seen
        seen.append((kind, body))


def client_final(password: str, first_bare: str, server_first: str) -> bytes:
    """SCRAM-SHA-256's client-final message (RFC 5802, 3), without channel binding."""
    attrs = dict(item.split("=", 1) for item in server_first.split(","))
    salted = hashlib.pbkdf2_hmac(
        "sha256", password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"])
    )
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    without_proof = f"c=biws,r={attrs['r']}"
    auth_message = f"{first_bare},{server_first},{without_proof}".encode()
    signature = hmac.digest(hashlib.sha256(client_key).digest(), auth_message, "sha256")
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()


def raw_login(port: int, user: str, password: str | None = None) -> socket.socket:
    """A socket past startup and SCRAM-SHA-256 authentication, at ReadyForQuery."""
    password = PASSWORDS[user] if password is None else password
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(startup_packet(user))
    kind, body = read_backend(sock)
    assert kind == b"R" and struct.unpack_from("!i", body)[0] == 10, (kind, body)
    nonce = base64.b64encode(secrets.token_bytes(18)).decode()
    first_bare = f"n=,r={nonce}"
    first = ("n,," + first_bare).encode()
    sock.sendall(frame(b"p", b"SCRAM-SHA-256\0" + struct.pack("!i", len(first)) + first))
    kind, body = read_backend(sock)
    assert kind == b"R" and struct.unpack_from("!i", body)[0] == 11, (kind, body)
    sock.sendall(frame(b"p", client_final(password, first_bare, body[4:].decode())))
    while True:
        kind, body = read_backend(sock)
        assert kind not in (b"E", b""), error_fields(body)
        if kind == b"Z":
            return sock


# -- waiting on a server -----------------------------------------------------------------------


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Poll ``condition`` every 10 ms until it holds; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


def alive(pid: int | None) -> bool:
    """Whether process ``pid`` runs (a zombie is gone too)."""
    assert pid is not None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        return stat.read().rpartition(")")[2].split()[0] != "Z"


def make_certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (its key mode 0600) in ``folder``, made by the
    openssl command (the test skips without it)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = folder / "server.crt", folder / "server.key"
    subprocess.run(
        [
            openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2",
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    key.chmod(0o600)
    return cert, key
