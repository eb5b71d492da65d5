"""SCRAM-SHA-256 for ``dpsql serve``: verifiers, the users file, the server side of the exchange.

A user is a name, a role (``owner`` or ``analyst``) and a SCRAM verifier in PostgreSQL's format
(``SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>``, RFC 5802 and RFC 7677). The
plain password is never stored: only StoredKey = H(HMAC(SaltedPassword, "Client Key")) and
ServerKey = HMAC(SaltedPassword, "Server Key"), with SaltedPassword = PBKDF2-HMAC-SHA-256.

The users file is JSON, because the standard library both reads and writes it (``tomllib`` only
reads, and a hand-written TOML writer is one more parser to get wrong)::

    {"version": 1, "users": {"alice": {"role": "analyst", "verifier": "SCRAM-SHA-256$4096:..."}}}

It is replaced atomically (a 0600 temporary file in the same folder, fsync, ``os.replace``, fsync
of the folder), writers are serialised by an ``flock`` on ``<file>.lock``, and a file that the
group or others may access is refused: with StoredKey and one recorded exchange an eavesdropper
recovers ClientKey and can log in, and StoredKey alone allows an offline dictionary attack.

:class:`ScramExchange` is one server-side exchange. Only ``SCRAM-SHA-256`` is offered, never
``SCRAM-SHA-256-PLUS``, so a client's ``y`` flag (it could bind, but thinks the server cannot) is
the truth and is accepted, and a ``p=`` request is refused. An unknown user goes through the
same steps with a mock verifier derived from the name and a per-process secret, as PostgreSQL
does, and fails at the proof: messages and timing do not say whether the user exists. Every
failure is an :class:`AuthenticationFailed` (a malformed message the subclass
:class:`ScramMessageError`), which the server reports as SQLSTATE 28P01.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
import stat
import stringprep
import unicodedata
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast, get_args

from dpsql.errors import ParameterError, PolicyError

Role = Literal["owner", "analyst"]
ROLES: tuple[str, ...] = get_args(Role)
MECHANISM = "SCRAM-SHA-256"
DEFAULT_ITERATIONS = 4096  # PostgreSQL's scram_iterations default; RFC 7677's minimum
MAX_ITERATIONS = 2**31 - 1
SALT_BYTES = 16  # as PostgreSQL
MAX_MESSAGE = 4096  # bytes; real SCRAM messages are ~100 bytes
FILE_VERSION = 1
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,62}")
# Keys the unknown users' mock verifiers; per process, so they change on restart (PostgreSQL
# keeps its mock nonce in the cluster). A server may pass a persistent one as ``mock_secret``.
_MOCK_SECRET = secrets.token_bytes(32)


class AuthenticationFailed(Exception):  # noqa: N818 - the server's name for SQLSTATE 28P01
    """The SCRAM exchange failed: wrong password, unknown user, or a bad message."""


class ScramMessageError(AuthenticationFailed):
    """A SCRAM message is malformed or asks for something unsupported (channel binding)."""


# -- SASLprep and verifiers --------------------------------------------------------------------
def _prohibited(char: str) -> bool:
    return any(
        check(char)
        for check in (
            stringprep.in_table_a1,  # unassigned in Unicode 3.2: prohibited in stored strings
            stringprep.in_table_c12,
            stringprep.in_table_c21_c22,
            stringprep.in_table_c3,
            stringprep.in_table_c4,
            stringprep.in_table_c5,
            stringprep.in_table_c6,
            stringprep.in_table_c7,
            stringprep.in_table_c8,
            stringprep.in_table_c9,
        )
    )


def saslprep(password: str) -> str:
    """The password as PostgreSQL prepares it (RFC 4013 SASLprep, as libpq's pg_saslprep).

    ASCII is kept as it is. Otherwise non-ASCII spaces map to a space, the "commonly mapped to
    nothing" characters are removed, and the result is NFKC-normalised. As in libpq, the
    prohibited-character and bidi checks look at the mapped string, and a password that fails
    them (or maps to nothing) is used unchanged: client and server must derive the same key.

    >>> saslprep("I\\u00adX"), saslprep("\\u2168"), saslprep("pencil")
    ('IX', 'IX', 'pencil')
    """
    if password.isascii():
        return password
    mapped = "".join(
        " " if stringprep.in_table_c12(c) else c for c in password if not stringprep.in_table_b1(c)
    )
    if not mapped or any(_prohibited(c) for c in mapped):
        return password
    if any(stringprep.in_table_d1(c) for c in mapped) and (
        any(stringprep.in_table_d2(c) for c in mapped)
        or not stringprep.in_table_d1(mapped[0])
        or not stringprep.in_table_d1(mapped[-1])
    ):
        return password
    return unicodedata.normalize("NFKC", mapped)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    """Strict base64 (alphabet and padding checked); ValueError otherwise."""
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise ValueError("not base64") from None


@dataclass(frozen=True)
class _Verifier:
    iterations: int
    salt: bytes
    stored_key: bytes
    server_key: bytes

    def __str__(self) -> str:
        return (
            f"{MECHANISM}${self.iterations}:{_b64(self.salt)}"
            f"${_b64(self.stored_key)}:{_b64(self.server_key)}"
        )


def _parse_verifier(text: str) -> _Verifier:
    """The parts of a verifier; ParameterError (never quoting it) if it is malformed."""
    try:
        mechanism, params, keys = text.split("$")
        iterations, salt = params.split(":")
        stored, server = keys.split(":")
        if mechanism != MECHANISM or not iterations.isdigit() or not iterations.isascii():
            raise ValueError
        parsed = _Verifier(int(iterations), _unb64(salt), _unb64(stored), _unb64(server))
    except ValueError:
        raise ParameterError(
            f"a verifier must read {MECHANISM}$i:salt$StoredKey:ServerKey"
        ) from None
    if not DEFAULT_ITERATIONS <= parsed.iterations <= MAX_ITERATIONS:
        raise ParameterError(f"a verifier's iteration count must be at least {DEFAULT_ITERATIONS}")
    if not parsed.salt or len(parsed.stored_key) != 32 or len(parsed.server_key) != 32:
        raise ParameterError("a verifier needs a salt and two 32-byte keys")
    return parsed


def make_verifier(
    password: str, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None
) -> str:
    """The SCRAM-SHA-256 verifier of ``password`` in PostgreSQL's format (a fresh 16-byte salt
    unless one is given). The password is SASLprep'd first (:func:`saslprep`)."""
    if not password:
        raise ParameterError("the password must not be empty")
    if isinstance(iterations, bool) or not DEFAULT_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ParameterError(
            f"iterations must be between {DEFAULT_ITERATIONS} and {MAX_ITERATIONS}"
        )
    if salt is None:
        salt = secrets.token_bytes(SALT_BYTES)
    elif not salt:
        raise ParameterError("the salt must not be empty")
    try:
        secret = saslprep(password).encode("utf-8")
    except UnicodeEncodeError:
        raise ParameterError("the password is not valid Unicode text") from None
    salted = hashlib.pbkdf2_hmac("sha256", secret, salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    server_key = hmac.digest(salted, b"Server Key", "sha256")
    return str(_Verifier(iterations, salt, hashlib.sha256(client_key).digest(), server_key))


def check_name(name: str) -> str:
    """``name`` if it is a valid user name (1-63 characters, ``[A-Za-z_][A-Za-z0-9_.-]*``)."""
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise ParameterError(
            "a user name has 1-63 characters: a letter or _, then letters, digits, _ . or -"
        )
    return name


@dataclass(frozen=True)
class User:
    """A user of ``dpsql serve``: checked on construction; the verifier is kept out of repr."""

    name: str
    role: Role
    verifier: str = field(repr=False)

    def __post_init__(self) -> None:
        check_name(self.name)
        if self.role not in ROLES:
            raise ParameterError(f"a role is one of {', '.join(ROLES)}")
        _parse_verifier(self.verifier)


# -- the users file ----------------------------------------------------------------------------
def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    if len(keys) != len(set(keys)):
        raise PolicyError("the users file repeats a key")
    return dict(pairs)


# About two hundred bytes a user: a megabyte holds thousands, and no more is ever read.
MAX_USERS_BYTES = 1 << 20


def _read(path: Path) -> str:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise PolicyError(f"the users file {path} does not exist") from None
    except OSError:
        raise PolicyError(f"the users file {path} cannot be read") from None
    try:
        mode = os.fstat(fd).st_mode  # of the file opened, not of whatever the path names later
        if not stat.S_ISREG(mode):
            raise PolicyError(f"the users file {path} is not a regular file")
        if mode & 0o077:
            raise PolicyError(f"the users file {path} may be read by others; chmod 600 it")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(MAX_USERS_BYTES + 1)
        if len(data) > MAX_USERS_BYTES:
            raise PolicyError(f"the users file {path} is larger than {MAX_USERS_BYTES} bytes")
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        raise PolicyError(f"the users file {path} cannot be read as UTF-8 text") from None
    finally:
        os.close(fd)


def load_users(path: str | os.PathLike[str]) -> dict[str, User]:
    """The users of the file at ``path``, by name. PolicyError names what is wrong with it."""
    path = Path(path)
    try:
        data = json.loads(_read(path), object_pairs_hook=_unique)
    except ValueError:
        raise PolicyError(f"the users file {path} is not valid JSON") from None
    if not isinstance(data, dict) or set(data) != {"version", "users"}:
        raise PolicyError("the users file must hold exactly the keys 'version' and 'users'")
    if data["version"] != FILE_VERSION or isinstance(data["version"], bool):
        raise PolicyError(f"the users file's version must be {FILE_VERSION}")
    if not isinstance(data["users"], dict):
        raise PolicyError("the users file's 'users' must be an object")
    users: dict[str, User] = {}
    for name, entry in data["users"].items():
        if not isinstance(entry, dict) or set(entry) != {"role", "verifier"}:
            raise PolicyError(f"users file: user {name[:63]!r} needs exactly 'role' and 'verifier'")
        role, verifier = entry["role"], entry["verifier"]
        if role not in ROLES or not isinstance(verifier, str):
            raise PolicyError(
                f"users file: user {name[:63]!r}: a role is one of {', '.join(ROLES)}"
            )
        try:
            users[name] = User(name, cast(Role, role), verifier)
        except ParameterError as exc:
            raise PolicyError(f"users file: user {name[:63]!r}: {exc}") from None
    return users


def save_users(path: str | os.PathLike[str], users: Mapping[str, User]) -> None:
    """Replace the file at ``path`` atomically with ``users`` (mode 0600)."""
    path = Path(path)
    document = {
        "version": FILE_VERSION,
        "users": {
            user.name: {"role": user.role, "verifier": user.verifier}
            for user in sorted(users.values(), key=lambda u: u.name)
        },
    }
    text = json.dumps(document, indent=2, sort_keys=True) + "\n"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.fchmod(fd, 0o600)  # exactly 0600, whatever the umask
            with os.fdopen(fd, "wb", closefd=False) as handle:
                handle.write(text.encode("utf-8"))
                handle.flush()
                os.fsync(handle.fileno())
        finally:
            os.close(fd)
        os.replace(tmp, path)
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise PolicyError(f"the users file {path} could not be written") from None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialise read-modify-write cycles across processes; readers need no lock."""
    try:
        fd = os.open(path.with_name(path.name + ".lock"), os.O_CREAT | os.O_RDWR, 0o600)
    except OSError:
        raise PolicyError(f"the users file {path} cannot be locked") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def add_user(
    path: str | os.PathLike[str], name: str, password: str, role: Role = "analyst"
) -> User:
    """Add a user (creating the file if it does not exist); ParameterError if the name is taken."""
    path = Path(path)
    user = User(check_name(name), role, make_verifier(password))
    with _locked(path):
        users = load_users(path) if path.exists() else {}
        if name in users:
            raise ParameterError(f"the user {name!r} already exists")
        save_users(path, {**users, name: user})
    return user


def remove_user(path: str | os.PathLike[str], name: str) -> None:
    """Remove a user; ParameterError if there is none by that name."""
    path = Path(path)
    with _locked(path):
        users = load_users(path)
        if name not in users:
            raise ParameterError(f"there is no user {name[:63]!r}")
        save_users(path, {n: u for n, u in users.items() if n != name})


def set_password(path: str | os.PathLike[str], name: str, password: str) -> User:
    """Give a user a new password (a new salt too); ParameterError if there is no such user."""
    path = Path(path)
    verifier = make_verifier(password)
    with _locked(path):
        users = load_users(path)
        if name not in users:
            raise ParameterError(f"there is no user {name[:63]!r}")
        user = User(name, users[name].role, verifier)
        save_users(path, {**users, name: user})
    return user


# -- the exchange ------------------------------------------------------------------------------
def _mock_verifier(username: str, iterations: int, secret: bytes) -> str:
    def derive(label: bytes) -> bytes:
        return hmac.digest(secret, label + b"\0" + username.encode("utf-8", "replace"), "sha256")

    return str(
        _Verifier(iterations, derive(b"salt")[:SALT_BYTES], derive(b"stored"), derive(b"server"))
    )


def _usual_iterations(users: Mapping[str, User]) -> int:
    """The most common iteration count (the larger on ties): what a mock verifier shows."""
    counts = Counter(int(user.verifier.split("$")[1].split(":")[0]) for user in users.values())
    if not counts:
        return DEFAULT_ITERATIONS
    return max(counts.items(), key=lambda item: (item[1], item[0]))[0]


def _decode(data: bytes) -> str:
    if not isinstance(data, bytes | bytearray) or len(data) > MAX_MESSAGE:
        raise ScramMessageError("malformed SCRAM message")
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        raise ScramMessageError("malformed SCRAM message (not UTF-8)") from None


def _check_nonce(nonce: str) -> str:
    # RFC 5802: printable = %x21-2B / %x2D-7E (no comma)
    if not nonce or any(not "\x21" <= c <= "\x7e" or c == "," for c in nonce):
        raise ScramMessageError("malformed SCRAM message (nonce)")
    return nonce


def _check_extensions(attributes: list[str]) -> None:
    for attribute in attributes:
        if len(attribute) < 2 or attribute[1] != "=" or not attribute[0].isascii():
            raise ScramMessageError("malformed SCRAM message (attribute)")
        if not attribute[0].isalpha():
            raise ScramMessageError("malformed SCRAM message (attribute)")


class ScramExchange:
    """The server side of one SCRAM-SHA-256 exchange for the user named in the startup message.

    Call :meth:`client_first`, then :meth:`client_final`; each returns the server's answer or
    raises :class:`AuthenticationFailed`, after which the exchange is spent. The ``n=`` user of
    the client's message is ignored (PostgreSQL clients send it empty). ``server_nonce`` fixes the
    server's nonce (tests only); ``mock_secret`` keys unknown users' mock verifiers.
    """

    def __init__(
        self,
        users: Mapping[str, User],
        username: str,
        *,
        server_nonce: str | None = None,
        mock_secret: bytes | None = None,
    ) -> None:
        known = users.get(username)
        # The mock verifier is computed for every user so that both paths cost the same.
        mock = _mock_verifier(username, _usual_iterations(users), mock_secret or _MOCK_SECRET)
        self._verifier = _parse_verifier(known.verifier if known is not None else mock)
        self._candidate = known
        self._server_nonce = _check_nonce(server_nonce or _b64(secrets.token_bytes(18)))
        self._state: Literal["start", "first", "done", "failed"] = "start"
        self._gs2_header = self._client_first_bare = self._server_first = self._nonce = ""
        self._user: User | None = None

    @property
    def user(self) -> User | None:
        """The authenticated user once :meth:`client_final` has succeeded, else None."""
        return self._user

    def client_first(self, data: bytes) -> bytes:
        """The server-first-message ``r=<nonce>,s=<salt>,i=<iterations>`` for the client's."""
        try:
            if self._state != "start":
                raise ScramMessageError("unexpected SCRAM message")
            self._state = "failed"
            flag, authzid, bare = self._parse_first(_decode(data))
            self._gs2_header = f"{flag},{authzid},"
            self._client_first_bare = bare
            salt = _b64(self._verifier.salt)
            self._server_first = f"r={self._nonce},s={salt},i={self._verifier.iterations}"
            self._state = "first"
            return self._server_first.encode("ascii")
        except AuthenticationFailed:
            self._state = "failed"
            raise

    def _parse_first(self, text: str) -> tuple[str, str, str]:
        parts = text.split(",", 2)
        if len(parts) != 3:
            raise ScramMessageError("malformed SCRAM message (gs2 header)")
        flag, authzid, bare = parts
        if flag.startswith("p="):
            raise ScramMessageError(f"channel binding is not supported: use {MECHANISM}")
        if flag not in ("n", "y"):
            raise ScramMessageError("malformed SCRAM message (channel binding flag)")
        if authzid:
            raise ScramMessageError("an authorization identity is not supported")
        attributes = bare.split(",")
        if attributes[0].startswith("m="):
            raise ScramMessageError("mandatory SCRAM extensions are not supported")
        if len(attributes) < 2 or not attributes[0].startswith("n="):
            raise ScramMessageError("malformed SCRAM message (username)")
        if not attributes[1].startswith("r="):
            raise ScramMessageError("malformed SCRAM message (nonce)")
        self._nonce = _check_nonce(attributes[1][2:]) + self._server_nonce
        _check_extensions(attributes[2:])
        return flag, authzid, bare

    def client_final(self, data: bytes) -> bytes:
        """Check the client's proof; the server-final-message ``v=<ServerSignature>``."""
        try:
            if self._state != "first":
                raise ScramMessageError("unexpected SCRAM message")
            self._state = "failed"
            without_proof, proof = self._parse_final(_decode(data))
            auth_message = ",".join((self._client_first_bare, self._server_first, without_proof))
            signature = hmac.digest(self._verifier.stored_key, auth_message.encode(), "sha256")
            client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
            matches = hmac.compare_digest(
                hashlib.sha256(client_key).digest(), self._verifier.stored_key
            )
            # The mock verifier's keys are nobody's, but a match there must still fail.
            if not matches or self._candidate is None:
                raise AuthenticationFailed("password authentication failed")
            server = hmac.digest(self._verifier.server_key, auth_message.encode(), "sha256")
            self._user = self._candidate
            self._state = "done"
            return f"v={_b64(server)}".encode("ascii")
        except AuthenticationFailed:
            self._state = "failed"
            raise

    def _parse_final(self, text: str) -> tuple[str, bytes]:
        attributes = text.split(",")
        if len(attributes) < 3 or not attributes[-1].startswith("p="):
            raise ScramMessageError("malformed SCRAM message (proof)")
        binding, nonce = attributes[0], attributes[1]
        if not binding.startswith("c="):
            raise ScramMessageError("malformed SCRAM message (channel binding)")
        try:
            if _unb64(binding[2:]) != self._gs2_header.encode():
                raise ScramMessageError("SCRAM channel binding check failed")
            proof = _unb64(attributes[-1][2:])
        except ValueError:
            raise ScramMessageError("malformed SCRAM message (base64)") from None
        if not nonce.startswith("r=") or not hmac.compare_digest(
            nonce[2:].encode(), self._nonce.encode()
        ):
            raise ScramMessageError("SCRAM nonce mismatch")
        if len(proof) != 32:
            raise ScramMessageError("malformed SCRAM message (proof length)")
        _check_extensions(attributes[2:-1])
        return ",".join(attributes[:-1]), proof


__all__ = [
    "DEFAULT_ITERATIONS",
    "MECHANISM",
    "ROLES",
    "AuthenticationFailed",
    "Role",
    "ScramExchange",
    "ScramMessageError",
    "User",
    "add_user",
    "check_name",
    "load_users",
    "make_verifier",
    "remove_user",
    "saslprep",
    "save_users",
    "set_password",
]
