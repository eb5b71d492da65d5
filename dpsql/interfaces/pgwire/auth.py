"""SCRAM-SHA-256 for ``dpsql serve``: verifiers, the users file, the server side of the exchange.

The exchange is here. The verifiers (SASLprep, PostgreSQL's verifier format) are in
``dpsql.interfaces.pgwire.verifiers``, the users and their file in
``dpsql.interfaces.pgwire.users``; this module re-exports their public names, so that callers import
all of it from here.

:class:`ScramExchange` is one server-side exchange. Only ``SCRAM-SHA-256`` is offered, never
``SCRAM-SHA-256-PLUS``, so a client's ``y`` flag (it could bind, but thinks the server cannot) is
the truth and is accepted, and a ``p=`` request is refused. An unknown user goes through the
same steps with a mock verifier derived from the name and a secret (the server's persists
across restarts, so a name's mock salt is as stable as a real one), as PostgreSQL does, and
fails at the proof: messages and timing do not say whether the user exists. Every failure is
an :class:`AuthenticationFailed` (a malformed message the subclass :class:`ScramMessageError`),
which the server reports as SQLSTATE 28P01.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections import Counter
from collections.abc import Mapping
from typing import Literal

from dpsql.interfaces.pgwire.users import User
from dpsql.interfaces.pgwire.verifiers import (
    DEFAULT_ITERATIONS,
    MECHANISM,
    SALT_BYTES,
    _b64,
    _parse_verifier,
    _unb64,
    _Verifier,
)

MAX_MESSAGE = 4096  # bytes; real SCRAM messages are ~100 bytes
# Keys the unknown users' mock verifiers when no ``mock_secret`` is given: per process, so they
# change on restart. ``dpsql serve`` passes its persistent one (PostgreSQL keeps its mock nonce
# in the cluster too): ``dpsql.interfaces.pgwire.mock_secret``.
_MOCK_SECRET = secrets.token_bytes(32)


class AuthenticationFailed(Exception):  # noqa: N818 - the server's name for SQLSTATE 28P01
    """The SCRAM exchange failed: wrong password, unknown user, or a bad message."""


class ScramMessageError(AuthenticationFailed):
    """A SCRAM message is malformed or asks for something unsupported (channel binding)."""


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


__all__ = ["AuthenticationFailed", "ScramExchange", "ScramMessageError"]
