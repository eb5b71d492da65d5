"""Who is logged in to the console: the password check and the logins it keeps.

**The password** is checked against the users file's SCRAM-SHA-256 verifier (``dpsql users``),
so there is no second password store: SaltedPassword = PBKDF2(SASLprep(password), salt, i),
ClientKey = HMAC(SaltedPassword, "Client Key"), and the password is right when H(ClientKey)
equals the StoredKey (RFC 5802, section 3), compared in constant time. An unknown name is
checked against the same mock verifier ``dpsql serve`` shows for it, so both cost one PBKDF2.
Failed logins are throttled as the server throttles them (``dpsql.interfaces.pgwire.throttle``):
a token bucket per client address, taken before the check, and a growing wait per user name
before every check on a name that keeps failing.

**A login** is a random 256-bit token in a cookie (HttpOnly, SameSite=Strict, Secure except on
loopback) naming a record kept here, in the server process: the user, the role, the login's own
CSRF token (every change must carry it), and the answers it may download. It ends after
``idle_timeout`` seconds without a request, after ``max_age`` in all, at logout, when its
user starts a ninth login (``PER_USER``: their oldest ends), or when ``max_logins`` are held
and it is the oldest. The users file is read again at each password
check, so a user removed or given a new password cannot log in again; the logins they hold end
when they expire or log out.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dpsql.errors import DpsqlError
from dpsql.interfaces.pgwire.auth import _mock_verifier, _usual_iterations
from dpsql.interfaces.pgwire.throttle import AddressBuckets, UserBackoff
from dpsql.interfaces.pgwire.users import Role, User, load_users
from dpsql.interfaces.pgwire.verifiers import _parse_verifier, saslprep

__all__ = ["Login", "Logins", "password_matches"]

MAX_PASSWORD_CHARS = 1024  # longer passwords are refused before any PBKDF2 is computed
# Logins one user holds at once: their oldest ends past it, so that one user logging in again
# and again ends their own logins, never another user's (the global cap is ``most``).
PER_USER = 8


def password_matches(verifier: str, password: str) -> bool:
    """Whether ``password`` is the one ``verifier`` was made from (constant-time comparison)."""
    parsed = _parse_verifier(verifier)
    try:
        secret = saslprep(password).encode("utf-8")
    except (DpsqlError, UnicodeEncodeError):
        secret = b"\0"  # still one PBKDF2, then no match
    salted = hashlib.pbkdf2_hmac("sha256", secret, parsed.salt, parsed.iterations)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    return hmac.compare_digest(hashlib.sha256(client_key).digest(), parsed.stored_key)


@dataclass
class Login:
    """One logged-in browser: who, in which role, its CSRF token, its kept answers."""

    token: str
    name: str
    role: Role
    csrf: str
    started: float
    seen: float
    # The settings its SET statements gave (applied to each of its statements).
    settings: dict[str, object] = field(default_factory=dict)
    # Its answers, by id, for download: the newest ``max_kept_results``.
    results: OrderedDict[str, Any] = field(default_factory=OrderedDict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def csrf_ok(self, offered: str | None) -> bool:
        return offered is not None and hmac.compare_digest(offered.encode(), self.csrf.encode())


class Logins:
    """The password check, its throttles, and the logins held (thread-safe)."""

    def __init__(
        self,
        users_file: Any,
        mock_secret: bytes,
        *,
        burst: int,
        refill: float,
        delay_cap: float,
        idle: float,
        max_age: float,
        most: int,
        now: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.users_file = users_file
        self._secret = mock_secret
        self.buckets = AddressBuckets(burst, refill, now)
        self.backoff = UserBackoff(delay_cap, now)
        self.idle, self.max_age, self.most = idle, max_age, most
        self._now, self._sleep = now, sleep
        self._held: OrderedDict[str, Login] = OrderedDict()
        self._lock = threading.Lock()

    # -- logging in ------------------------------------------------------------------------
    def wait(self, address: str) -> float | None:
        """None if ``address`` may try a password now (a token taken), else seconds to wait."""
        with self._lock:
            if self.buckets.take(address):
                return None
            return max(1.0, self.buckets.wait(address))

    def check(self, address: str, name: str, password: str) -> User | None:
        """The user ``name`` if ``password`` is theirs, else None (the address's token is given
        back on success only). Blocks for the name's back-off first, whatever the verdict."""
        with self._lock:
            delay = self.backoff.delay(name)
        if delay:
            self._sleep(delay)
        users = load_users(self.users_file)
        known = users.get(name)
        verifier = (
            known.verifier
            if known is not None
            else _mock_verifier(name, _usual_iterations(users), self._secret)
        )
        ok = len(password) <= MAX_PASSWORD_CHARS and password_matches(verifier, password)
        ok = ok and known is not None  # the mock verifier is nobody's
        with self._lock:
            if ok:
                self.buckets.give_back(address)
            else:
                self.backoff.failed(name)
        return known if ok else None

    def start(self, user: User) -> Login:
        """A new login for ``user`` (the oldest dropped past ``most``)."""
        now = self._now()
        login = Login(secrets.token_urlsafe(32), user.name, user.role, secrets.token_urlsafe(32),
                      now, now)  # fmt: skip
        with self._lock:
            self._expire(now)
            mine = [t for t, held in self._held.items() if held.name == user.name]
            for token in mine[: max(0, len(mine) - PER_USER + 1)]:
                del self._held[token]
            self._held[login.token] = login
            while len(self._held) > self.most:
                self._held.popitem(last=False)
        return login

    # -- requests --------------------------------------------------------------------------
    def get(self, token: str | None) -> Login | None:
        """The live login of a cookie's token, its idle clock restarted; None if none."""
        if not token:
            return None
        now = self._now()
        with self._lock:
            self._expire(now)
            login = self._held.get(token)
            if login is not None:
                login.seen = now
            return login

    def end(self, token: str | None) -> None:
        with self._lock:
            if token:
                self._held.pop(token, None)

    def _expire(self, now: float) -> None:
        for token, login in list(self._held.items()):
            if now - login.seen > self.idle or now - login.started > self.max_age:
                del self._held[token]
