"""The settings of ``dpsql web`` (:class:`WebConfig`) and its transport rule.

The console carries passwords and session cookies, so it never speaks plain HTTP beyond the
machine: a non-loopback address needs a TLS certificate and key, or a declared TLS proxy in
front (then every request must say it came over https: ``X-Forwarded-Proto``). Cookies are
``Secure`` except on loopback, where a browser reaches the console over plain HTTP.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from dpsql.errors import ParameterError
from dpsql.policy import Policy

__all__ = ["WebConfig", "check_transport", "is_loopback"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only: ``localhost`` or a loopback address (the
    unspecified addresses ``0.0.0.0`` and ``::`` listen on every interface: not loopback)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve anywhere


def check_transport(host: str, tls: bool, proxy: bool) -> None:
    """Refuse to serve ``host`` in the clear: ParameterError unless it is loopback, or the
    console speaks TLS itself (``tls``), or a TLS proxy is declared in front of it."""
    if tls and proxy:
        raise ParameterError("give a TLS certificate or declare a TLS proxy, not both")
    if not (is_loopback(host) or tls or proxy):
        raise ParameterError(
            "dpsql web serves a non-loopback address only over TLS: give --tls-cert and "
            "--tls-key, or declare the TLS proxy in front of it with --tls-proxy"
        )


@dataclass(frozen=True)
class WebConfig:
    """What the console serves, to whom, where, and the bounds it holds every client to."""

    policy: Policy
    users_file: Path
    policy_file: Path | None = None  # for the owner's data check, run as its own process
    host: str = "127.0.0.1"
    port: int = 8080
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_proxy: bool = False  # a TLS proxy in front: requests must say X-Forwarded-Proto: https
    # Failed logins, as dpsql serve counts them (dpsql.interfaces.pgwire.throttle).
    login_burst: int = 10
    login_refill: float = 1.0
    login_delay_cap: float = 2.0
    idle_timeout: float = 1800.0  # seconds without a request before a login ends
    max_age: float = 12 * 3600.0  # seconds a login lasts at most
    max_logins: int = 1000  # logins held at once; past it the oldest ends
    max_statement_bytes: int = 100_000  # a statement's text; longer ones are refused, free
    max_body_bytes: int = 1 << 20  # a request's body (a pasted batch file at most this)
    max_running: int = 4  # statements running at once; more are refused "busy" (503), free
    statement_timeout: float = 300.0  # seconds a statement may run; its charge stands
    max_kept_results: int = 8  # answers a login keeps for download
    memory_limit: str = "1GB"  # the DuckDB memory cap of each statement's engine

    def __post_init__(self) -> None:
        check_transport(self.host, self.tls_cert is not None, self.tls_proxy)
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ParameterError("give the TLS certificate and its key together")

    @property
    def secure_cookies(self) -> bool:
        """Cookies carry ``Secure`` unless the console listens on loopback in the clear."""
        return self.tls_cert is not None or self.tls_proxy or not is_loopback(self.host)
