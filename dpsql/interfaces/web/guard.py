"""What every request of the console passes through: its transport, its headers, its login and
its CSRF token.

- **Transport.** Behind a declared TLS proxy a request that does not say ``X-Forwarded-Proto:
  https`` is refused (400) before anything else runs: a proxy that forwards plain HTTP would
  carry passwords and cookies in the clear.
- **Headers** on every answer: a strict Content-Security-Policy (scripts, styles, images and
  connections from the console itself only; no inline script or style, no plugin, no frame, no
  ``<base>``, forms posted to the console only), ``X-Content-Type-Options: nosniff``,
  ``Referrer-Policy: no-referrer``, ``Cache-Control: no-store`` (answers and budgets stay out of
  shared caches), and HSTS over TLS.
- **Login and CSRF.** :func:`login_of` reads the login cookie; a change (any method but GET and
  HEAD) must carry the login's CSRF token in the ``X-CSRF-Token`` header or the ``csrf`` form
  field, compared in constant time, or it is refused (403) before it is read further. With
  SameSite=Strict cookies a cross-site request carries no cookie at all; the token holds even
  against a sibling site on the same registrable domain.
- **Bodies** are read up to ``max_body_bytes`` (413 beyond), JSON bodies must be objects.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dpsql.interfaces.pgwire.throttle import address_key
from dpsql.interfaces.web.config import WebConfig
from dpsql.interfaces.web.logins import Login, Logins

__all__ = [
    "COOKIE",
    "CSP",
    "Refused",
    "SecurityHeaders",
    "client_address",
    "json_body",
    "login_of",
    "set_login_cookie",
]

COOKIE = "dpsql_login"
PRE_COOKIE = "dpsql_prelogin"  # the login form's own CSRF token, before any login exists
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
]
SAFE_METHODS = ("GET", "HEAD")


class Refused(Exception):  # noqa: N818 - an HTTP refusal, carried to the error handler
    """A request refused with an HTTP status and a message that names no data value."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class SecurityHeaders:
    """ASGI middleware: the transport rule and the security headers of every answer."""

    def __init__(self, app: ASGIApp, config: WebConfig) -> None:
        self.app = app
        self.config = config
        self.headers = list(HEADERS)
        if config.tls_cert is not None or config.tls_proxy:
            self.headers.append((b"strict-transport-security", b"max-age=31536000"))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.config.tls_proxy:
            forwarded = dict(scope.get("headers") or []).get(b"x-forwarded-proto", b"")
            if forwarded.split(b",")[-1].strip().lower() != b"https":
                refusal = JSONResponse(
                    {"error": "this console is served over https only (through its TLS proxy)"},
                    status_code=400,
                )
                await refusal(scope, receive, self._with_headers(send))
                return
        await self.app(scope, receive, self._with_headers(send))

    def _with_headers(self, send: Send) -> Send:
        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in message.get("headers", [])}
                extra = [(k, v) for k, v in self.headers if k not in names]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        return sending


def client_address(request: Request, config: WebConfig) -> str:
    """What one client counts as for the login throttle: its address (its IPv6 /64), or behind
    a declared proxy the address the proxy appended last to ``X-Forwarded-For``."""
    if config.tls_proxy:
        forwarded = request.headers.get("x-forwarded-for", "")
        last = forwarded.split(",")[-1].strip()
        if last:
            return address_key((last, 0))
    host = request.client.host if request.client is not None else "unknown"
    return address_key((host, 0))


def login_of(request: Request, logins: Logins, role: str | None = None) -> Login:
    """The request's login (401 without one), checked for its role (403: the owner's pages and
    actions are the owner's only) and, for a change, its CSRF token (403)."""
    login = logins.get(request.cookies.get(COOKIE))
    if login is None:
        raise Refused(401, "log in first")
    if role is not None and login.role != role:
        raise Refused(403, f"this is for the {role} only")
    if request.method not in SAFE_METHODS and not login.csrf_ok(
        request.headers.get("x-csrf-token")
    ):
        raise Refused(403, "the request lacks this login's CSRF token: reload the page")
    return login


async def read_body(request: Request, most: int) -> bytes:
    """The body, refused (413) past ``most`` bytes whatever Content-Length says."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > most):
        raise Refused(413, f"the request is larger than {most} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > most:
            raise Refused(413, f"the request is larger than {most} bytes")
    return bytes(body)


async def json_body(request: Request, most: int) -> dict[str, Any]:
    """A JSON object body (400 for anything else)."""
    try:
        data = json.loads(await read_body(request, most))
    except (ValueError, RecursionError):
        raise Refused(400, "the request body is not JSON") from None
    if not isinstance(data, dict):
        raise Refused(400, "the request body must be a JSON object")
    return data


def text_field(data: dict[str, Any], name: str, most: int, required: bool = True) -> str:
    """A string field of a JSON body (400 when missing, not text, or longer than ``most``)."""
    value = data.get(name, "" if not required else None)
    if not isinstance(value, str):
        raise Refused(400, f"'{name}' must be text")
    if len(value.encode("utf-8", "surrogatepass")) > most:
        raise Refused(413, f"'{name}' is longer than {most} bytes")
    return value


def set_login_cookie(
    response: Response, name: str, value: str, config: WebConfig, max_age: int | None = None
) -> None:
    """A cookie as the console sets every cookie: HttpOnly, SameSite=Strict, path /, Secure
    except on loopback in the clear."""
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path="/",
        secure=config.secure_cookies,
        httponly=True,
        samesite="strict",
    )
