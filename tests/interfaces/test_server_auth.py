"""SCRAM-SHA-256 for ``dpsql serve``: RFC 7677's vector, a client written here, the users file
and ``dpsql users`` through click's CliRunner.

The client below follows RFC 5802 section 3 step by step, independently of the server code
(only SASLprep is shared, and that is checked against libpq's own on its own).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import stat
import threading
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsql.errors import ParameterError, PolicyError
from dpsql.interfaces.cli.context import EXIT_CODES
from dpsql.interfaces.cli.users import users as users_group
from dpsql.interfaces.pgwire import auth
from dpsql.interfaces.pgwire.auth import AuthenticationFailed, ScramExchange, ScramMessageError
from dpsql.interfaces.pgwire.users import (
    User,
    add_user,
    check_name,
    load_users,
    remove_user,
    save_users,
    set_password,
)
from dpsql.interfaces.pgwire.verifiers import make_verifier, saslprep

# RFC 7677 section 3
RFC_SALT = "W22ZaJ0SNY7soEsUEjb6gQ=="
RFC_CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_FIRST = (
    b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
)
RFC_CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


class Client:
    """The client side of SCRAM-SHA-256 (RFC 5802 section 3), as a PostgreSQL driver does it."""

    def __init__(self, password: str, gs2_header: str = "n,,", nonce: str | None = None) -> None:
        self.password = password
        self.gs2_header = gs2_header
        self.nonce = nonce or base64.b64encode(secrets.token_bytes(18)).decode()
        self.bare = f"n=,r={self.nonce}"
        self.server_signature = b""

    def first(self) -> bytes:
        return (self.gs2_header + self.bare).encode()

    def final(self, server_first: bytes) -> bytes:
        fields = dict(item.split("=", 1) for item in server_first.decode().split(","))
        assert fields["r"].startswith(self.nonce) and len(fields["r"]) > len(self.nonce)
        salted = hashlib.pbkdf2_hmac(
            "sha256", saslprep(self.password).encode(), base64.b64decode(fields["s"]),
            int(fields["i"]),
        )  # fmt: skip
        client_key = hmac.digest(salted, b"Client Key", "sha256")
        stored_key = hashlib.sha256(client_key).digest()
        binding = base64.b64encode(self.gs2_header.encode()).decode()
        without_proof = f"c={binding},r={fields['r']}"
        auth_message = f"{self.bare},{server_first.decode()},{without_proof}".encode()
        signature = hmac.digest(stored_key, auth_message, "sha256")
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        server_key = hmac.digest(salted, b"Server Key", "sha256")
        self.server_signature = hmac.digest(server_key, auth_message, "sha256")
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def check(self, server_final: bytes) -> None:
        assert server_final == b"v=" + base64.b64encode(self.server_signature)


def run(users: dict[str, User], username: str, client: Client) -> ScramExchange:
    exchange = ScramExchange(users, username)
    client.check(exchange.client_final(client.final(exchange.client_first(client.first()))))
    return exchange


@pytest.fixture(scope="module")
def alice() -> User:
    return User("alice", "analyst", make_verifier("correct horse"))


# -- RFC 7677 ----------------------------------------------------------------------------------
def test_rfc7677_vector() -> None:
    verifier = make_verifier("pencil", 4096, base64.b64decode(RFC_SALT))
    assert verifier.startswith(f"SCRAM-SHA-256$4096:{RFC_SALT}$")
    exchange = ScramExchange(
        {"user": User("user", "analyst", verifier)}, "user", server_nonce=RFC_SERVER_NONCE
    )
    assert exchange.user is None
    assert exchange.client_first(RFC_CLIENT_FIRST) == RFC_SERVER_FIRST
    assert exchange.user is None
    assert exchange.client_final(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL
    assert exchange.user == User("user", "analyst", verifier)


def test_the_test_client_reproduces_the_rfc7677_proof() -> None:
    client = Client("pencil", nonce=RFC_CLIENT_NONCE)
    client.bare = f"n=user,r={RFC_CLIENT_NONCE}"  # the RFC's client names the user
    assert client.first() == RFC_CLIENT_FIRST
    assert client.final(RFC_SERVER_FIRST) == RFC_CLIENT_FINAL
    client.check(RFC_SERVER_FINAL)


# -- SASLprep and verifiers --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("password", "prepared"),
    [
        ("pencil", "pencil"),  # ASCII is kept as is, even control characters (as libpq)
        ("a\x07b", "a\x07b"),
        ("I\u00adX", "IX"),  # RFC 4013 section 3 examples: soft hyphen mapped to nothing
        ("\u00aa", "a"),  # NFKC
        ("\u2168", "IX"),
        ("\u3000x\u00e9", " x\u00e9"),  # non-ASCII space mapped to a space
        ("e\u0301", "\u00e9"),  # NFKC composes
        ("\u00e9\u0007", "\u00e9\u0007"),  # prohibited: used unchanged
        ("\u0627\u0031", "\u0627\u0031"),  # RFC 4013's bidi failure: used unchanged
        ("\u00ad", "\u00ad"),  # maps to nothing: used unchanged
        ("\u0340a", "\u0340a"),  # libpq checks the mapped string, before NFKC
    ],
)
def test_saslprep(password: str, prepared: str) -> None:
    assert saslprep(password) == prepared


PASSWORDS = ["pencil", "I\u00adX", "\u2168", "\u0627\u0031", "caf\u00e9", "e\u0301", "\u00aa"]
PASSWORDS += ["a\x07\u00e9", "\u3000x", "\u0340a", "\u05d0\u05d1", "\u05d0a\u05d1", "\U0001f600"]


@pytest.mark.parametrize("password", PASSWORDS)
def test_verifiers_match_libpq(password: str) -> None:
    # libpq's PQencryptPasswordConn (through psycopg) is what psql and psycopg log in with.
    pq = pytest.importorskip("psycopg.pq")
    conn = pq.PGconn.connect_start(b"host=/nonexistent-dpsql-test")
    try:
        theirs = conn.encrypt_password(password.encode(), b"someone", b"scram-sha-256").decode()
    finally:
        conn.finish()
    salt = base64.b64decode(theirs.split("$")[1].split(":")[1])
    assert make_verifier(password, 4096, salt) == theirs


def test_make_verifier_format_and_fresh_salts() -> None:
    first, second = make_verifier("pencil"), make_verifier("pencil")
    assert first != second  # a fresh salt each time
    mechanism, params, keys = first.split("$")
    iterations, salt = params.split(":")
    stored, server = keys.split(":")
    assert (mechanism, iterations) == ("SCRAM-SHA-256", "4096")
    assert len(base64.b64decode(salt)) == 16
    assert len(base64.b64decode(stored)) == len(base64.b64decode(server)) == 32
    assert make_verifier("pencil", 5000, b"salt").startswith("SCRAM-SHA-256$5000:c2FsdA==$")


@pytest.mark.parametrize(
    "kwargs",
    [{"password": ""}, {"iterations": 4095}, {"iterations": 2**31}, {"salt": b""}],
    ids=["empty password", "few iterations", "many iterations", "empty salt"],
)
def test_make_verifier_rejects(kwargs: dict[str, object]) -> None:
    arguments: dict[str, object] = {"password": "pencil", **kwargs}
    with pytest.raises(ParameterError):
        make_verifier(**arguments)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["a", "_x", "A.b-c_9", "a" * 63])
def test_valid_names(name: str) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize("name", ["", "9a", ".a", "-a", "a b", "a/b", "ä", "a" * 64, "a\n"])
def test_invalid_names(name: str) -> None:
    with pytest.raises(ParameterError):
        check_name(name)


def test_user_validates_itself_and_hides_its_verifier(alice: User) -> None:
    assert alice.verifier not in repr(alice)
    for name, role, verifier in [
        ("bad name", "analyst", alice.verifier),
        ("bob", "admin", alice.verifier),
        ("bob", "analyst", "md5abc"),
        ("bob", "analyst", alice.verifier.replace("$4096:", "$100:")),
        ("bob", "analyst", alice.verifier[:-4]),
    ]:
        with pytest.raises(ParameterError) as info:
            User(name, role, verifier)  # type: ignore[arg-type]
        assert alice.verifier not in str(info.value)


# -- the exchange ------------------------------------------------------------------------------
@pytest.mark.parametrize("gs2_header", ["n,,", "y,,"])
def test_full_exchange(alice: User, gs2_header: str) -> None:
    exchange = run({"alice": alice}, "alice", Client("correct horse", gs2_header))
    assert exchange.user == alice


def test_unicode_password_exchange() -> None:
    user = User("u", "owner", make_verifier("I\u00adX\u2168"))
    assert run({"u": user}, "u", Client("IX\u2168")).user == user  # same after SASLprep


def test_wrong_password_fails_at_the_proof(alice: User) -> None:
    exchange = ScramExchange({"alice": alice}, "alice")
    client = Client("wrong horse")
    final = client.final(exchange.client_first(client.first()))
    with pytest.raises(AuthenticationFailed) as info:
        exchange.client_final(final)
    assert type(info.value) is AuthenticationFailed
    assert exchange.user is None
    with pytest.raises(ScramMessageError):  # the exchange is spent
        exchange.client_final(final)


def _failure(users: dict[str, User], username: str, password: str) -> tuple[bytes, str]:
    exchange = ScramExchange(users, username)
    client = Client(password)
    server_first = exchange.client_first(client.first())
    with pytest.raises(AuthenticationFailed) as info:
        exchange.client_final(client.final(server_first))
    assert type(info.value) is AuthenticationFailed and exchange.user is None
    return server_first, str(info.value)


def _fields(server_first: bytes) -> dict[str, str]:
    return dict(item.split("=", 1) for item in server_first.decode().split(","))


def test_unknown_user_fails_like_a_wrong_password(alice: User) -> None:
    users = {"alice": alice}
    known_first, known_message = _failure(users, "alice", "wrong")
    unknown_first, unknown_message = _failure(users, "mallory", "wrong")
    assert unknown_message == known_message
    known, unknown = _fields(known_first), _fields(unknown_first)
    assert unknown.keys() == known.keys() and unknown["i"] == known["i"] == "4096"
    assert len(base64.b64decode(unknown["s"])) == len(base64.b64decode(known["s"])) == 16
    # The mock salt is stable per name, as a real user's is, and differs between names.
    assert _fields(_failure(users, "mallory", "other")[0])["s"] == unknown["s"]
    assert _fields(_failure(users, "eve", "wrong")[0])["s"] != unknown["s"]
    assert _fields(_failure({}, "", "x")[0])["i"] == "4096"


def test_unknown_user_shows_the_usual_iteration_count() -> None:
    users = {
        name: User(name, "analyst", make_verifier("pw", 5000 if name != "c" else 4096))
        for name in ("a", "b", "c")
    }
    assert _fields(_failure(users, "nobody", "pw")[0])["i"] == "5000"


def test_mock_secret_keys_the_mock_salt() -> None:
    def salt(secret: bytes) -> str:
        exchange = ScramExchange({}, "mallory", mock_secret=secret)
        return _fields(exchange.client_first(Client("x").first()))["s"]

    assert salt(b"k" * 32) == salt(b"k" * 32) != salt(b"j" * 32)


def test_unknown_user_fails_even_if_the_mock_proof_matched(
    alice: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Defence in depth: a proof that matches the mock verifier authenticates nobody.
    monkeypatch.setattr(auth, "_mock_verifier", lambda *_: make_verifier("guessable"))
    exchange = ScramExchange({"alice": alice}, "mallory")
    client = Client("guessable")
    final = client.final(exchange.client_first(client.first()))
    with pytest.raises(AuthenticationFailed):
        exchange.client_final(final)
    assert exchange.user is None


def test_channel_binding_is_refused(alice: User) -> None:
    exchange = ScramExchange({"alice": alice}, "alice")
    with pytest.raises(ScramMessageError, match="channel binding is not supported"):
        exchange.client_first(b"p=tls-server-end-point,,n=,r=abcdef")
    assert exchange.user is None


def test_the_gs2_header_is_bound_into_the_final_message(alice: User) -> None:
    # A client that said "y" must send c=eSws ("y,,"), not c=biws ("n,,").
    exchange = ScramExchange({"alice": alice}, "alice")
    server_first = exchange.client_first(b"y,,n=,r=abcdef")
    client = Client("correct horse", "n,,", "abcdef")
    with pytest.raises(ScramMessageError, match="channel binding"):
        exchange.client_final(client.final(server_first))


FIRST_MALFORMED = [
    b"",
    b"n,,",
    b"n,",
    b"x,,n=,r=abc",
    b"n,a=alice,n=,r=abc",  # an authorization identity
    b"n,,m=ext,n=,r=abc",  # a mandatory extension
    b"n,,r=abc",
    b"n,,n=",
    b"n,,n=,s=abc",
    b"n,,n=,r=",
    b"n,,n=,r=a\x7fb",
    b"n,,n=,r=ab\xc3\xa9",  # a nonce must be printable ASCII
    b"n,,n=,r=abc,=x",
    b"n,,n=,r=abc,1=x",
    b"n,,n=,r=\xff\xfe",  # not UTF-8
    b"n,,n=,r=" + b"a" * 5000,  # too long
]


@pytest.mark.parametrize("message", FIRST_MALFORMED)
def test_malformed_client_first(alice: User, message: bytes) -> None:
    exchange = ScramExchange({"alice": alice}, "alice")
    with pytest.raises(ScramMessageError):
        exchange.client_first(message)
    with pytest.raises(ScramMessageError):  # spent
        exchange.client_first(b"n,,n=,r=abc")


def test_extensions_are_ignored(alice: User) -> None:
    exchange = ScramExchange({"alice": alice}, "alice", server_nonce="S")
    assert exchange.client_first(b"n,,n=whoever,r=abc,x=1,y=").startswith(b"r=abcS,s=")


def _final_variants(good: bytes) -> list[bytes]:
    binding, nonce, proof = good.split(b",")
    return [
        b"",
        binding + b"," + nonce,  # no proof
        nonce + b"," + binding + b"," + proof,  # attributes out of order
        b"c=eSws," + nonce + b"," + proof,  # wrong gs2 header
        b"c=biws," + nonce[:-1] + b"," + proof,  # wrong nonce
        b"c=biws,r=," + proof,
        binding + b"," + nonce + b",p=abc",  # bad base64
        binding + b"," + nonce + b",p=" + base64.b64encode(b"x" * 31),  # short proof
        binding + b"," + nonce + b"," + proof + b",x=1",  # the proof must come last
        b"c=bi\xffws," + nonce + b"," + proof,
        binding + b"," + nonce + b",1=x," + proof,
        binding + b"," + b"r=\xc3\xa9" + b"," + proof,
    ]


@pytest.mark.parametrize("index", range(12))
def test_malformed_client_final(alice: User, index: int) -> None:
    exchange = ScramExchange({"alice": alice}, "alice")
    client = Client("correct horse")
    good = client.final(exchange.client_first(client.first()))
    with pytest.raises(ScramMessageError):
        exchange.client_final(_final_variants(good)[index])
    assert exchange.user is None


def test_out_of_order_and_non_bytes(alice: User) -> None:
    with pytest.raises(ScramMessageError):
        ScramExchange({"alice": alice}, "alice").client_final(b"c=biws,r=abc,p=abc")
    with pytest.raises(ScramMessageError):
        ScramExchange({"alice": alice}, "alice").client_first("n,,n=,r=abc")  # type: ignore[arg-type]
    exchange = run({"alice": alice}, "alice", Client("correct horse"))
    with pytest.raises(ScramMessageError):
        exchange.client_first(b"n,,n=,r=abc")
    assert exchange.user == alice  # a later bad message does not undo the success


def test_server_nonce_must_be_printable() -> None:
    with pytest.raises(ScramMessageError):
        ScramExchange({}, "x", server_nonce="a,b")


@settings(max_examples=examples(300), deadline=None)
@given(first=st.binary(max_size=200), final=st.binary(max_size=200))
def test_arbitrary_bytes_raise_only_authentication_failed(first: bytes, final: bytes) -> None:
    users = {"user": User("user", "analyst", make_verifier("pencil", salt=b"s"))}
    for username in ("user", "nobody"):
        exchange = ScramExchange(users, username)
        try:
            exchange.client_first(first)
            exchange.client_final(final)
        except AuthenticationFailed:
            pass
        assert exchange.user is None


@settings(max_examples=examples(100), deadline=None)
@given(
    nonce=st.text(
        st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters=","), min_size=1
    ),
    proof=st.binary(min_size=32, max_size=32),
)
def test_any_nonce_and_a_guessed_proof_fail(nonce: str, proof: bytes) -> None:
    users = {"user": User("user", "analyst", make_verifier("pencil", salt=b"s"))}
    exchange = ScramExchange(users, "user")
    combined = exchange.client_first(f"n,,n=,r={nonce}".encode()).split(b",")[0]
    assert combined.startswith(f"r={nonce}".encode())
    with pytest.raises(AuthenticationFailed) as info:
        exchange.client_final(b"c=biws," + combined + b",p=" + base64.b64encode(proof))
    assert type(info.value) is AuthenticationFailed  # well formed: it fails at the proof
    assert exchange.user is None


# -- the users file ----------------------------------------------------------------------------
def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_users_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    old_umask = os.umask(0)  # the file is 0600 whatever the umask
    try:
        alice = add_user(path, "alice", "s3cret-\u00e9", "analyst")
    finally:
        os.umask(old_umask)
    owner = add_user(path, "olga", "hunter2", "owner")
    assert _mode(path) == 0o600
    assert load_users(path) == {"alice": alice, "olga": owner}
    raw = path.read_bytes()
    for secret in ("s3cret-\u00e9", "hunter2"):
        assert secret.encode() not in raw
        assert base64.b64encode(secret.encode()) not in raw
    document = json.loads(raw)
    assert document == {
        "version": 1,
        "users": {
            "alice": {"role": "analyst", "verifier": alice.verifier},
            "olga": {"role": "owner", "verifier": owner.verifier},
        },
    }
    assert run(load_users(path), "olga", Client("hunter2")).user == owner

    renewed = set_password(path, "alice", "new one")
    assert renewed.verifier != alice.verifier and _mode(path) == 0o600
    users = load_users(path)
    assert run(users, "alice", Client("new one")).user == renewed
    with pytest.raises(AuthenticationFailed):
        run(users, "alice", Client("s3cret-\u00e9"))

    remove_user(path, "alice")
    assert set(load_users(path)) == {"olga"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["users.json", "users.json.lock"]


def test_users_file_refuses(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    add_user(path, "alice", "pw")
    with pytest.raises(ParameterError, match="already exists"):
        add_user(path, "alice", "other")
    with pytest.raises(ParameterError, match="no user"):
        remove_user(path, "bob")
    with pytest.raises(ParameterError, match="no user"):
        set_password(path, "bob", "pw")
    with pytest.raises(ParameterError):
        add_user(path, "bad name", "pw")
    with pytest.raises(ParameterError):
        add_user(path, "bob", "")
    with pytest.raises(PolicyError, match="does not exist"):
        load_users(tmp_path / "missing.json")
    with pytest.raises(PolicyError, match="does not exist"):
        remove_user(tmp_path / "missing.json", "alice")
    assert set(load_users(path)) == {"alice"}


def test_a_failed_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "users.json"
    add_user(path, "alice", "pw")
    before = path.read_bytes()

    def broken(*_: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(PolicyError, match="could not be written"):
        add_user(path, "bob", "pw")
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["users.json", "users.json.lock"]


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    names = [f"user{i}" for i in range(12)]
    errors: list[BaseException] = []

    def add(name: str) -> None:
        try:
            add_user(path, name, "pw")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert sorted(load_users(path)) == sorted(names)


def _write(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)
    return path


GOOD_VERIFIER = make_verifier("pw", salt=b"salt")
BAD_FILES: dict[str, str] = {
    "not json": "{",
    "a list": "[]",
    "no version": json.dumps({"users": {}}),
    "extra key": json.dumps({"version": 1, "users": {}, "x": 1}),
    "version 2": json.dumps({"version": 2, "users": {}}),
    "version true": json.dumps({"version": True, "users": {}}),
    "users a list": json.dumps({"version": 1, "users": []}),
    "entry a string": json.dumps({"version": 1, "users": {"a": "x"}}),
    "entry missing role": json.dumps({"version": 1, "users": {"a": {"verifier": GOOD_VERIFIER}}}),
    "bad role": json.dumps(
        {"version": 1, "users": {"a": {"role": "root", "verifier": GOOD_VERIFIER}}}
    ),
    "role not a string": json.dumps(
        {"version": 1, "users": {"a": {"role": ["owner"], "verifier": GOOD_VERIFIER}}}
    ),
    "bad verifier": json.dumps({"version": 1, "users": {"a": {"role": "owner", "verifier": "x"}}}),
    "bad name": json.dumps(
        {"version": 1, "users": {"a b": {"role": "owner", "verifier": GOOD_VERIFIER}}}
    ),
    "duplicate user": (
        f'{{"version": 1, "users": {{"a": {{"role": "owner", "verifier": "{GOOD_VERIFIER}"}}, '
        f'"a": {{"role": "analyst", "verifier": "{GOOD_VERIFIER}"}}}}}}'
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_users_files(tmp_path: Path, case: str) -> None:
    path = _write(tmp_path / "users.json", BAD_FILES[case])
    with pytest.raises(PolicyError) as info:
        load_users(path)
    assert GOOD_VERIFIER not in str(info.value)


def test_a_users_file_others_may_read_is_refused(tmp_path: Path) -> None:
    good = json.dumps({"version": 1, "users": {"a": {"role": "owner", "verifier": GOOD_VERIFIER}}})
    assert set(load_users(_write(tmp_path / "ok.json", good))) == {"a"}
    for mode in (0o640, 0o604, 0o660):
        with pytest.raises(PolicyError, match="chmod 600"):
            load_users(_write(tmp_path / "users.json", good, mode))
    with pytest.raises(PolicyError, match="regular file"):
        load_users(tmp_path)


def test_save_users_writes_what_load_users_reads(tmp_path: Path, alice: User) -> None:
    path = tmp_path / "users.json"
    save_users(path, {"alice": alice})
    assert load_users(path) == {"alice": alice} and _mode(path) == 0o600


# -- dpsql users -------------------------------------------------------------------------------
def _invoke(args: list[str], stdin: str | None = None, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(users_group, args, input=stdin, env=env)


def test_cli_add_list_passwd_remove(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    file_args = ["--users-file", str(path)]
    result = _invoke(["add", "alice", *file_args, "--password-stdin"], "first pw\n")
    assert result.exit_code == 0, result.output
    assert result.output == f"added user alice (analyst) to {path}\n"
    result = _invoke(["add", "olga", "--role", "owner", *file_args], "hunter2\nhunter2\n")
    assert result.exit_code == 0, result.output
    assert "hunter2" not in result.output
    assert _mode(path) == 0o600

    result = _invoke(["list", *file_args])
    assert result.exit_code == 0
    assert result.output == "alice\tanalyst\nolga\towner\n"
    users = load_users(path)
    assert run(users, "alice", Client("first pw")).user == users["alice"]
    assert run(users, "olga", Client("hunter2")).user == users["olga"]

    result = _invoke(["passwd", "alice", *file_args], "second\nsecond\n")
    assert result.exit_code == 0, result.output
    assert result.output.endswith(f"changed the password of alice in {path}\n")
    assert run(load_users(path), "alice", Client("second")).user is not None

    result = _invoke(["remove", "alice"], env={"DPSQL_USERS_FILE": str(path)})
    assert result.exit_code == 0, result.output
    assert result.output == f"removed user alice from {path}\n"
    assert set(load_users(path)) == {"olga"}
    for secret in (b"first pw", b"hunter2", b"second"):
        assert secret not in path.read_bytes()


def test_cli_list_never_prints_a_verifier(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    user = add_user(path, "alice", "pw")
    result = _invoke(["list", "--users-file", str(path)])
    assert result.exit_code == 0
    assert user.verifier.split("$")[2].split(":")[0] not in result.output
    assert "SCRAM" not in result.output


def test_cli_errors_map_to_exit_codes(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    file_args = ["--users-file", str(path)]
    assert _invoke(["add", "alice", *file_args, "--password-stdin"], "pw").exit_code == 0
    cases = [
        (["add", "alice", *file_args, "--password-stdin"], "pw", 3, "already exists"),
        (["add", "bad name", *file_args, "--password-stdin"], "pw", 2, "user name"),
        (["add", "bob", "--role", "root", *file_args], "pw\npw\n", 2, "root"),
        (["add", "bob", *file_args, "--password-stdin"], "\n", 2, "must not be empty"),
        (["add", "bob", *file_args], "pw\nother\n", 1, "Repeat"),  # mismatch, then EOF: abort
        (["remove", "bob", *file_args], None, 3, "no user"),
        (["passwd", "bob", *file_args], "pw\npw\n", 3, "no user"),
        (["list", "--users-file", str(tmp_path / "none.json")], None, 7, "does not exist"),
        (["list"], None, 2, "--users-file"),
    ]
    for args, stdin, code, text in cases:
        result = _invoke(args, stdin)
        assert result.exit_code == code, (args, result.output)
        assert text in result.output, (args, result.output)
        assert "Traceback" not in result.output
    assert set(load_users(path)) == {"alice"}


def test_cli_passwd_does_not_prompt_for_an_unknown_user(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    add_user(path, "alice", "pw")
    result = _invoke(["passwd", "bob", "--users-file", str(path)], "")
    assert result.exit_code == 3 and "Password" not in result.output


def test_cli_every_command_and_option_has_help() -> None:
    assert users_group.help
    for name, command in users_group.commands.items():
        assert command.help, name
        for param in command.params:
            if isinstance(param, click.Option):
                assert param.help, (name, param.name)


def test_dpsql_users_through_the_main_group(tmp_path: Path) -> None:
    from dpsql.interfaces.cli import main as cli

    path = tmp_path / "users.json"
    file_args = ["--users-file", str(path)]
    runner = CliRunner()
    result = runner.invoke(
        cli.cli, ["users", "add", "olga", "--role", "owner", *file_args], "pw\npw\n"
    )
    assert result.exit_code == 0, result.output
    result = runner.invoke(cli.cli, ["users", "remove", "bob", *file_args])
    assert result.exit_code == EXIT_CODES[ParameterError.__mro__[1]]  # QueryError: 3
    assert result.output == "Error: ParameterError: there is no user 'bob'\n"
    assert runner.invoke(cli.cli, ["users", "list", *file_args]).output == "olga\towner\n"
