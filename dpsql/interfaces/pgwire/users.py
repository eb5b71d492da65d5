"""The users of ``dpsql serve``, and the users file the data owner manages (``dpsql users``).

A user is a name, a role (``owner`` or ``analyst``) and a SCRAM verifier
(``dpsql.interfaces.pgwire.verifiers``).

The users file is JSON, because the standard library both reads and writes it (``tomllib`` only
reads, and a hand-written TOML writer is one more parser to get wrong)::

    {"version": 1, "users": {"alice": {"role": "analyst", "verifier": "SCRAM-SHA-256$4096:..."}}}

It is replaced atomically (a 0600 temporary file in the same folder, fsync, ``os.replace``, fsync
of the folder), writers are serialised by an ``flock`` on ``<file>.lock``, and a file that the
group or others may access is refused: with StoredKey and one recorded exchange an eavesdropper
recovers ClientKey and can log in, and StoredKey alone allows an offline dictionary attack.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast, get_args

from dpsql.errors import ParameterError, PolicyError
from dpsql.interfaces.pgwire.verifiers import _parse_verifier, make_verifier

Role = Literal["owner", "analyst"]
ROLES: tuple[str, ...] = get_args(Role)
FILE_VERSION = 1
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,62}")


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
    except (ValueError, RecursionError):  # RecursionError: arrays nested past json's limit
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
    write_private(path, text.encode("utf-8"), "users file")


def write_private(path: Path, data: bytes, what: str, *, replace: bool = True) -> None:
    """Write ``data`` to ``path``, mode 0600 whatever the umask, through a temporary file that
    is flushed before it takes the name (a crash never leaves a short file under it), then the
    folder flushed. ``replace``: over the file there, atomically; otherwise only if there is
    none (a link, which fails on an existing name: the file there is kept). A failure is a
    PolicyError naming ``what`` and the path."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.fchmod(fd, 0o600)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        if replace:
            os.replace(tmp, path)
        else:
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    except OSError:
        raise PolicyError(f"the {what} {path} could not be written") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


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
