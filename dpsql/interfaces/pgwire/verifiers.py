"""SCRAM-SHA-256 verifiers for ``dpsql serve``: SASLprep and PostgreSQL's verifier format.

A user's SCRAM verifier is kept in PostgreSQL's format
(``SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>``, RFC 5802 and RFC 7677). The
plain password is never stored: only StoredKey = H(HMAC(SaltedPassword, "Client Key")) and
ServerKey = HMAC(SaltedPassword, "Server Key"), with SaltedPassword = PBKDF2-HMAC-SHA-256.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import stringprep
import unicodedata
from dataclasses import dataclass

from dpsql.errors import ParameterError

MECHANISM = "SCRAM-SHA-256"
DEFAULT_ITERATIONS = 4096  # PostgreSQL's scram_iterations default; RFC 7677's minimum
MAX_ITERATIONS = 2**31 - 1
SALT_BYTES = 16  # as PostgreSQL


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
