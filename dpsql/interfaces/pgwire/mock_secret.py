"""The secret that keys unknown users' mock SCRAM verifiers, kept in a file beside the users file.

An unknown user name gets a mock salt derived from the name and this secret
(``dpsql.interfaces.pgwire.auth``), so that it looks like a real user's. A real user's salt stays
the same across restarts of the server; a per-process secret would change the mock salts at each
restart, and anyone who asked for a name's salt before and after one would learn whether the name
exists. So the secret is persisted: ``<users file>.mock-secret``, 32 random bytes, mode 0600,
created at the server's first start. It is written to a temporary file, flushed, and linked to its
name, which fails if the name exists: two servers starting at once agree on one secret, and a
crash never leaves a short file under the name. A file the group or others may access, or of the
wrong size, is refused with a PolicyError.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from dpsql.errors import PolicyError
from dpsql.interfaces.pgwire.users import write_private

SECRET_BYTES = 32
SUFFIX = ".mock-secret"


def mock_secret_path(users_file: str | os.PathLike[str]) -> Path:
    """Where the mock secret of the users file ``users_file`` lives."""
    path = Path(users_file)
    return path.with_name(path.name + SUFFIX)


def _read(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        raise PolicyError(f"the mock secret file {path} cannot be read") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise PolicyError(f"the mock secret file {path} is not a regular file")
        if info.st_mode & 0o077:
            raise PolicyError(f"the mock secret file {path} may be read by others; chmod 600 it")
        if info.st_size != SECRET_BYTES:
            raise PolicyError(
                f"the mock secret file {path} is not {SECRET_BYTES} bytes long; "
                "remove it to make a new one"
            )
        data = os.read(fd, SECRET_BYTES + 1)
    except OSError:
        raise PolicyError(f"the mock secret file {path} cannot be read") from None
    finally:
        os.close(fd)
    if len(data) != SECRET_BYTES:
        raise PolicyError(f"the mock secret file {path} is not {SECRET_BYTES} bytes long")
    return data


def _create(path: Path) -> None:
    """Write a new secret under ``path`` unless a file is there already (then keep that one)."""
    write_private(path, secrets.token_bytes(SECRET_BYTES), "mock secret file", replace=False)


def load_mock_secret(users_file: str | os.PathLike[str]) -> bytes:
    """The mock secret beside ``users_file``, created (mode 0600) if there is none yet."""
    path = mock_secret_path(users_file)
    if not os.path.lexists(path):
        _create(path)
    return _read(path)


__all__ = ["SECRET_BYTES", "load_mock_secret", "mock_secret_path"]
