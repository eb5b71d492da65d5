"""Failed logins cost time: a token bucket per client address, a growing delay per user name.

Without them one client tried 3,532 passwords in 10 s over loopback (a SCRAM proof costs the
server two HMACs, and a guesser need not even compute PBKDF2 to send a wrong one).

- **Per address** (:class:`AddressBuckets`): each address has a bucket of ``burst`` tokens,
  refilled at ``refill`` tokens a second. An attempt takes a token when its startup message
  arrives, before SCRAM runs, and gives it back unless the attempt fails (a success, or a client
  that hangs up or times out before its proof, costs nothing). An address with no token left is
  refused before SCRAM, so at most ``burst`` attempts of one address are ever in flight, and
  ``refill`` a second on average. IPv6 addresses count by their /64, which one host usually
  holds whole.
- **Per user name** (:class:`UserBackoff`): after a few failures on one name (from anywhere),
  every later attempt on that name waits before its proof is checked, twice as long after each
  failure up to ``cap`` seconds, and the count is forgotten after a quiet minute. The wait comes
  *before* the verdict and for every attempt, a right password too: a delay on failures only
  would tell a guesser "wrong" as soon as the answer is late, and cost it nothing. A correct
  password is never refused, only delayed by at most ``cap``. Unknown names are counted like
  known ones, so the delay says nothing about which names exist.

The clock is injected (``now``), so the arithmetic is tested without sleeping. Both tables are
bounded: entries back to their resting state are pruned, and past ``MAX_ENTRIES`` the oldest go.
"""

from __future__ import annotations

import ipaddress
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

MAX_ENTRIES = 16_384  # addresses or names tracked at once; the oldest are forgotten past it
FREE_FAILURES = 2  # failures on one name before any delay (typos happen)
FIRST_DELAY = 0.25  # seconds, doubled after each further failure, up to the cap
USER_MEMORY = 60.0  # seconds without a failure after which a name's failures are forgotten


def address_key(peer: object) -> str:
    """What one client counts as: its IPv4 address, or the /64 of its IPv6 address (an
    IPv4-mapped one as IPv4). ``peer`` is asyncio's ``peername`` extra info.

    >>> address_key(("127.0.0.2", 5432)), address_key(("2001:db8::1:2", 5432, 0, 0))
    ('127.0.0.2', '2001:db8::/64')
    """
    host = peer[0] if isinstance(peer, tuple) and peer else peer
    try:
        address = ipaddress.ip_address(str(host).split("%", 1)[0])
    except ValueError:
        return str(host)[:64]  # not an IP (a Unix socket): one key for all its clients
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


@dataclass
class _Bucket:
    tokens: float
    stamp: float


class AddressBuckets:
    """A token bucket of failed logins per client address."""

    def __init__(
        self, burst: int, refill: float, now: Callable[[], float] = time.monotonic
    ) -> None:
        self.burst = burst
        self.refill = refill
        self._now = now
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    def _refilled(self, key: str) -> _Bucket:
        now = self._now()
        bucket = self._buckets.pop(key, None) or _Bucket(float(self.burst), now)
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.stamp) * self.refill)
        bucket.stamp = now
        self._buckets[key] = bucket  # the most recently touched last
        return bucket

    def take(self, key: str) -> bool:
        """Take a token for an attempt from ``key``; False (nothing taken) if there is none."""
        bucket = self._refilled(key)
        if bucket.tokens < 1:
            return False
        bucket.tokens -= 1
        self._prune()
        return True

    def give_back(self, key: str) -> None:
        """The attempt did not fail: its token returns."""
        bucket = self._refilled(key)
        bucket.tokens = min(float(self.burst), bucket.tokens + 1)

    def wait(self, key: str) -> float:
        """Seconds until ``key`` has a token again (0 if it has one)."""
        tokens = self._refilled(key).tokens
        return 0.0 if tokens >= 1 else (1 - tokens) / self.refill

    def _prune(self) -> None:
        if len(self._buckets) <= MAX_ENTRIES:
            return
        now = self._now()
        for key, bucket in list(self._buckets.items()):
            if bucket.tokens + (now - bucket.stamp) * self.refill >= self.burst:
                del self._buckets[key]  # full again: the same as never seen
        while len(self._buckets) > MAX_ENTRIES:
            self._buckets.popitem(last=False)


class UserBackoff:
    """Failures per user name, and the delay they impose on the next attempt on that name."""

    def __init__(self, cap: float, now: Callable[[], float] = time.monotonic) -> None:
        self.cap = cap
        self._now = now
        self._failures: OrderedDict[str, tuple[int, float]] = OrderedDict()

    def _count(self, name: str) -> int:
        count, stamp = self._failures.get(name, (0, 0.0))
        return count if self._now() - stamp < USER_MEMORY else 0

    def delay(self, name: str) -> float:
        """Seconds the next attempt on ``name`` waits before its proof is checked."""
        extra = self._count(name) - FREE_FAILURES
        if extra < 0 or self.cap <= 0:
            return 0.0
        return min(self.cap, FIRST_DELAY * 2.0 ** min(extra, 32))

    def failed(self, name: str) -> None:
        count = self._count(name) + 1
        self._failures.pop(name, None)
        self._failures[name] = (count, self._now())
        if len(self._failures) > MAX_ENTRIES:
            now = self._now()
            for key, (_, stamp) in list(self._failures.items()):
                if now - stamp >= USER_MEMORY:
                    del self._failures[key]
            while len(self._failures) > MAX_ENTRIES:
                self._failures.popitem(last=False)


__all__ = ["AddressBuckets", "UserBackoff", "address_key"]
