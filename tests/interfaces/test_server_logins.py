"""Logins to ``dpsql serve`` that cannot lock analysts out or be guessed cheaply.

Sockets that never log in have a pool of their own and a short timeout; failed logins are
throttled per client address (a token bucket, refused before SCRAM) and per user name (a delay
before every verdict); an unknown name's mock salt survives restarts (a secret file beside the
users file). Real servers and real clients; a raw client where the test must choose its source
address (libpq cannot) or stop mid-exchange. The throttle's arithmetic is tested on a fake clock.
"""

from __future__ import annotations

import base64
import os
import secrets
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from server_fixtures import (
    PASSWORDS,
    Dataset,
    ServerThread,
    client_final,
    connect,
    error_fields,
    frame,
    psql,
    read_backend,
    read_until_closed,
    start_subprocess,
    startup_packet,
    write_dataset,
    write_policy,
    write_users,
)

from dpsql.errors import PolicyError
from dpsql.interfaces.pgwire import logs, throttle
from dpsql.interfaces.pgwire.config import Limits
from dpsql.interfaces.pgwire.mock_secret import SECRET_BYTES, load_mock_secret, mock_secret_path
from dpsql.interfaces.pgwire.throttle import AddressBuckets, UserBackoff, address_key


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    return write_dataset(tmp_path_factory.mktemp("data"))


@pytest.fixture
def users(tmp_path: Path) -> Path:
    (tmp_path / "users").mkdir()
    return write_users(tmp_path / "users" / "users.json")


@pytest.fixture
def serve(tmp_path: Path, dataset: Dataset, users: Path) -> Iterator[Callable[..., ServerThread]]:
    started: list[ServerThread] = []

    def make(**limits: float) -> ServerThread:
        policy, _ = write_policy(tmp_path / f"server{len(started)}", dataset)
        defaults: dict[str, float] = {"max_connections": 4, "statement_timeout": 30.0}
        server = ServerThread(policy, users, limits=Limits(**{**defaults, **limits}))  # type: ignore[arg-type]
        started.append(server.start())
        return server

    yield make
    for server in started:
        server.stop()


# -- a raw SCRAM client that picks its source address ----------------------------------------------


def _open(port: int, source: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(15)
    sock.bind((source, 0))  # all of 127.0.0.0/8 is loopback on Linux
    sock.connect(("127.0.0.1", port))
    return sock


def _server_first(sock: socket.socket, user: str) -> tuple[str, str] | dict[str, str]:
    """Startup and client-first: ``(client-first-bare, server-first)``, or the error's fields."""
    sock.sendall(startup_packet(user))
    kind, body = read_backend(sock)
    if kind == b"E":
        return error_fields(body)
    assert kind == b"R" and struct.unpack_from("!i", body)[0] == 10, (kind, body)
    first_bare = f"n=,r={base64.b64encode(secrets.token_bytes(18)).decode()}"
    first = ("n,," + first_bare).encode()
    sock.sendall(frame(b"p", b"SCRAM-SHA-256\0" + struct.pack("!i", len(first)) + first))
    kind, body = read_backend(sock)
    assert kind == b"R" and struct.unpack_from("!i", body)[0] == 11, (kind, body)
    return first_bare, body[4:].decode()


def attempt(port: int, user: str, password: str, source: str = "127.0.0.1") -> str:
    """One login: ``"ok"`` at ReadyForQuery, else the SQLSTATE of the error."""
    with _open(port, source) as sock:
        opened = _server_first(sock, user)
        if isinstance(opened, dict):
            return opened["C"]
        sock.sendall(frame(b"p", client_final(password, *opened)))
        while True:
            kind, body = read_backend(sock)
            if kind == b"E":
                return error_fields(body)["C"]
            if kind in (b"Z", b""):
                return "ok" if kind == b"Z" else "closed"


def mock_salt(port: int, user: str) -> str:
    with _open(port, "127.0.0.1") as sock:
        opened = _server_first(sock, user)
        assert isinstance(opened, tuple), opened
        return dict(item.split("=", 1) for item in opened[1].split(","))["s"]


# -- sockets that never log in ---------------------------------------------------------------------


def test_idle_sockets_do_not_lock_out_a_login(serve: Callable[..., ServerThread]) -> None:
    """More idle sockets than either pool holds: a real login still gets in at once (well before
    the 30 s authentication timeout could free anything), and the oldest idle sockets of the
    flooding address are dropped to make room."""
    server = serve(max_connections=2, max_unauthenticated=4, auth_timeout=30.0)
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(12)]
    try:
        time.sleep(0.3)  # the server has accepted them all
        out = psql(server.port, "alice", "SELECT current_user;")
        assert (out.returncode, out.stdout) == (0, "alice\n"), out.stderr
        with connect(server.port, "bob") as conn:
            assert conn.execute("SELECT current_user").fetchone() == ("bob",)
        dropped = 0
        for sock in idle:
            sock.settimeout(0.2)
            try:
                dropped += sock.recv(1) == b""
            except ConnectionResetError:
                dropped += 1
            except TimeoutError:
                continue  # still waiting to log in: one of the pool's slots
        assert dropped >= 12 - 4, dropped  # evicted without waiting for the timeout
    finally:
        for sock in idle:
            sock.close()


def test_idle_sockets_are_dropped_after_the_authentication_timeout(
    serve: Callable[..., ServerThread],
) -> None:
    server = serve(auth_timeout=1.0)
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(3)]
    half = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    half.sendall(startup_packet("alice"))  # stops at the password
    try:
        start = time.monotonic()
        for sock in idle:
            assert read_until_closed(sock) == []
        kinds = [kind for kind, _ in read_until_closed(half)]
        assert kinds == [b"R"]  # the SASL request, then nothing: closed
        assert time.monotonic() - start < 9  # well before the sockets' own 10 s timeout
    finally:
        for sock in [*idle, half]:
            sock.close()


def test_session_slots_are_taken_only_after_authentication(
    serve: Callable[..., ServerThread],
) -> None:
    """``max_connections`` still bounds the sessions: past it, an authenticated client gets
    FATAL 53300 (as from PostgreSQL, after its password), and the slot comes back."""
    server = serve(max_connections=2)
    with connect(server.port, "alice"), connect(server.port, "bob"):
        assert attempt(server.port, "olga", PASSWORDS["olga"]) == "53300"
        out = psql(server.port, "alice", "SELECT current_user;")
        assert out.returncode == 2 and "too many connections" in out.stderr
        # A wrong password is told as usual: the session limit says nothing about it.
        assert attempt(server.port, "olga", "wrong") == "28P01"
    deadline = time.monotonic() + 10  # the slots come back once the workers have closed
    while (result := attempt(server.port, "olga", PASSWORDS["olga"])) != "ok":
        assert result == "53300" and time.monotonic() < deadline
        time.sleep(0.1)


# -- failed logins ---------------------------------------------------------------------------------


def test_failed_logins_from_one_address_are_throttled(serve: Callable[..., ServerThread]) -> None:
    server = serve(login_burst=3, login_refill=0.01, login_delay_cap=0.0)
    for _ in range(3):
        assert attempt(server.port, "alice", "guess") == "28P01"
    # The bucket is empty: refused before SCRAM, whoever is named and whatever the password.
    with _open(server.port, "127.0.0.1") as sock:
        refused = _server_first(sock, "mallory")
    assert isinstance(refused, dict) and refused["C"] == "28000", refused
    assert refused["M"].startswith("too many failed logins from this address; retry in ")
    assert attempt(server.port, "alice", PASSWORDS["alice"]) == "28000"
    # Another address is not throttled, and the right password is never refused there.
    assert attempt(server.port, "alice", PASSWORDS["alice"], source="127.0.0.2") == "ok"
    assert attempt(server.port, "bob", "guess", source="127.0.0.2") == "28P01"


def test_logins_that_do_not_fail_cost_no_token(serve: Callable[..., ServerThread]) -> None:
    """Successes, and clients that hang up before their proof (psql's first try), give their
    token back: an address that never fails is never throttled."""
    server = serve(login_burst=3, login_refill=0.01)  # 3: the last hang-up may be in flight
    for _ in range(4):
        assert attempt(server.port, "alice", PASSWORDS["alice"]) == "ok"
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(startup_packet("alice"))
            assert read_backend(sock)[0] == b"R"
    assert attempt(server.port, "alice", "guess") == "28P01"
    assert attempt(server.port, "alice", PASSWORDS["alice"]) == "ok"


def test_concurrent_guesses_from_one_address_are_bounded_by_the_burst(
    serve: Callable[..., ServerThread],
) -> None:
    """A token is taken when the attempt starts, so parallel connections cannot outrun it."""
    server = serve(login_burst=4, login_refill=0.01, login_delay_cap=0.0)
    results: list[str] = []

    def guess() -> None:
        results.append(attempt(server.port, "alice", "guess"))

    threads = [threading.Thread(target=guess) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(results) == ["28000"] * 8 + ["28P01"] * 4


def test_a_user_delay_slows_every_verdict_but_refuses_no_right_password(
    serve: Callable[..., ServerThread],
) -> None:
    cap = 0.5
    server = serve(login_burst=100, login_delay_cap=cap)
    assert server.server is not None
    for _ in range(6):
        assert attempt(server.port, "alice", "guess") == "28P01"
    backoff = server.server.backoff
    assert backoff.delay("alice") == cap
    # From an address that is not throttled, the right password gets in, after the same wait
    # as a wrong one: the verdict comes no sooner for being a failure.
    start = time.monotonic()
    assert attempt(server.port, "alice", PASSWORDS["alice"], source="127.0.0.2") == "ok"
    assert time.monotonic() - start >= cap
    start = time.monotonic()
    assert attempt(server.port, "alice", "guess", source="127.0.0.3") == "28P01"
    assert time.monotonic() - start >= cap
    # Names that do not exist are counted alike: the delay does not tell them apart.
    for _ in range(6):
        assert attempt(server.port, "mallory", "guess") == "28P01"
    assert backoff.delay("mallory") == backoff.delay("alice")
    assert backoff.delay("bob") == 0


def test_the_auth_failure_log_line_cannot_be_forged(
    serve: Callable[..., ServerThread],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(logs, "LIMIT", logs.RepeatLimit())  # earlier tests' lines count not
    server = serve()
    caplog.set_level("WARNING", logger="dpsql.interfaces.pgwire")
    forged = "x'\n2026-01-01 dpsql.interfaces.pgwire INFO user olga (owner) connected"
    assert attempt(server.port, forged, "guess") == "28P01"
    assert attempt(server.port, "eve", "guess") == "28P01"
    lines = [r.getMessage() for r in caplog.records if "authentication failed" in r.getMessage()]
    assert lines == [
        f"authentication failed for user (not a valid name, {len(forged)} characters) "
        "from 127.0.0.1",
        "authentication failed for user 'eve' from 127.0.0.1",
    ]


# -- the mock secret -------------------------------------------------------------------------------


def test_an_unknown_users_salt_survives_a_restart(dataset: Dataset, tmp_path: Path) -> None:
    """Two ``dpsql serve`` processes in turn: the salt an unknown name is offered is the same,
    as a real user's is, so a restart does not tell the two apart."""
    users = write_users(tmp_path / "users.json")
    policy, _ = write_policy(tmp_path / "p", dataset)
    salts = []
    for _ in range(2):
        served = start_subprocess(policy, users)
        try:
            salts.append((mock_salt(served.port, "mallory"), mock_salt(served.port, "alice")))
        finally:
            served.stop()
    assert salts[0] == salts[1]
    assert salts[0][0] != salts[0][1]
    secret = mock_secret_path(users)
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600
    assert os.path.getsize(secret) == SECRET_BYTES


def test_the_mock_secret_file_is_checked(tmp_path: Path) -> None:
    users = tmp_path / "users.json"
    first = load_mock_secret(users)
    assert load_mock_secret(users) == first and len(first) == SECRET_BYTES
    path = mock_secret_path(users)
    path.chmod(0o640)
    with pytest.raises(PolicyError, match="may be read by others; chmod 600 it"):
        load_mock_secret(users)
    path.chmod(0o600)
    path.write_bytes(b"short")
    with pytest.raises(PolicyError, match=f"is not {SECRET_BYTES} bytes long"):
        load_mock_secret(users)
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(PolicyError, match="cannot be read"):
        load_mock_secret(users)


def test_servers_starting_at_once_agree_on_one_secret(tmp_path: Path) -> None:
    users = tmp_path / "users.json"
    found: list[bytes] = []
    threads = [
        threading.Thread(target=lambda: found.append(load_mock_secret(users))) for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(found) == 8 and len(set(found)) == 1
    assert [p.name for p in tmp_path.iterdir()] == [mock_secret_path(users).name]


# -- the throttle's arithmetic, on a fake clock ----------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_bucket_burst_refill_and_give_back() -> None:
    clock = Clock()
    buckets = AddressBuckets(burst=3, refill=0.5, now=clock)
    assert [buckets.take("a") for _ in range(4)] == [True, True, True, False]
    assert buckets.take("b")  # another address has its own bucket
    assert buckets.wait("a") == pytest.approx(2.0)
    clock.t += 2.0
    assert buckets.take("a") and not buckets.take("a")
    buckets.give_back("a")
    assert buckets.take("a")
    clock.t += 1000
    assert [buckets.take("a") for _ in range(4)] == [True, True, True, False]  # never above 3


def test_bucket_table_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(throttle, "MAX_ENTRIES", 10)
    clock = Clock()
    buckets = AddressBuckets(burst=2, refill=1.0, now=clock)
    for i in range(100):
        buckets.take(f"10.0.0.{i}")
        clock.t += 0.01
    assert len(buckets._buckets) <= 10


def test_backoff_grows_caps_and_forgets() -> None:
    clock = Clock()
    backoff = UserBackoff(cap=2.0, now=clock)
    delays = []
    for _ in range(8):
        delays.append(backoff.delay("ann"))
        backoff.failed("ann")
    assert delays == [0, 0, 0.25, 0.5, 1.0, 2.0, 2.0, 2.0]
    clock.t += throttle.USER_MEMORY
    assert backoff.delay("ann") == 0
    assert UserBackoff(cap=0.0, now=clock).delay("ann") == 0


@pytest.mark.parametrize(
    ("peer", "key"),
    [
        (("10.1.2.3", 5000), "10.1.2.3"),
        (("::ffff:10.1.2.3", 5000, 0, 0), "10.1.2.3"),
        (("2001:db8:1:2:aaaa::1", 5000, 0, 0), "2001:db8:1:2::/64"),
        (("2001:db8:1:2:bbbb::9", 5000, 0, 0), "2001:db8:1:2::/64"),
        (("fe80::1%eth0", 5000, 0, 2), "fe80::/64"),
        (None, "None"),
    ],
)
def test_address_keys(peer: object, key: str) -> None:
    assert address_key(peer) == key
