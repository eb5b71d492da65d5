"""``dpsql web``'s ASGI application: the routes, the login, the pages.

Starlette routes requests (a small, well-kept ASGI toolkit: routing, requests, cookies and
responses, no more), Jinja2 renders the two pages with autoescaping on for every template, and
uvicorn serves it (``dpsql.interfaces.cli.web``). The pages are static HTML and two small
scripts of the console's own (no CDN: everything works offline); the scripts read JSON from
the routes below and write every value with ``textContent``.

Routes (``/api/*`` answer JSON; every change is a POST carrying the login's CSRF token):

- ``GET /login``, ``POST /login`` (a form with its own CSRF token, throttled), ``POST /logout``;
- the analyst's page ``GET /analyst`` and ``POST /api/preview``, ``POST /api/run``,
  ``GET /api/me`` (share and own history), ``GET /api/answers/{id}.csv|.parquet``;
- the owner's page ``GET /owner`` (the owner's role only) and ``GET /api/owner/overview``,
  ``GET /api/owner/whatif``, ``POST /api/owner/batch``, ``POST /api/owner/allocate`` (password
  again and a confirmation), ``POST /api/owner/verify``, ``POST /api/owner/check``,
  ``GET /owner/report.html``.
"""

from __future__ import annotations

import contextlib
import logging
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from dpsql.errors import BudgetExceededError, DpsqlError, InternalError, PolicyError
from dpsql.interfaces.pgwire.mock_secret import load_mock_secret
from dpsql.interfaces.pgwire.users import load_users
from dpsql.interfaces.web import guard
from dpsql.interfaces.web.analyst import Analyst, Busy, error_json
from dpsql.interfaces.web.answers import to_csv, to_parquet
from dpsql.interfaces.web.config import WebConfig
from dpsql.interfaces.web.guard import COOKIE, PRE_COOKIE, Refused, login_of
from dpsql.interfaces.web.logins import Login, Logins
from dpsql.interfaces.web.owner import Owner
from dpsql.session.session import Session

__all__ = ["Console", "create_app"]

log = logging.getLogger("dpsql.interfaces.web")
HERE = Path(__file__).parent
FIELD = 4096  # bytes of a form field (a name, a password, a reason)
_ANSWER = re.compile(r"[A-Za-z0-9_-]{1,32}")

Handler = Callable[[Request], Awaitable[Response]]


def _status(exc: DpsqlError) -> int:
    """The HTTP status of a refusal: 403 for the budget, 500 for a dpsql bug, else 400."""
    if isinstance(exc, BudgetExceededError):
        return 403
    return 500 if isinstance(exc, InternalError) else 400


def create_app(config: WebConfig) -> Starlette:
    """The console's application for ``config`` (the users file, the policy's ledger and the
    engine are opened now: a server that cannot serve fails before it listens)."""
    return Console(config).app()


class Console:
    """The application's parts: the logins, the analyst's and the owner's actions, the pages."""

    def __init__(self, config: WebConfig) -> None:
        if config.policy.ledger is None:
            raise PolicyError(
                "dpsql web needs a durable [ledger] in the policy: every analyst must charge "
                "the same budget (create it with dpsql init)"
            )
        self.config = config
        load_users(config.users_file)  # fail fast: a users file that cannot be read
        self.logins = Logins(
            config.users_file,
            load_mock_secret(config.users_file),
            burst=config.login_burst,
            refill=config.login_refill,
            delay_cap=config.login_delay_cap,
            idle=config.idle_timeout,
            max_age=config.max_age,
            most=config.max_logins,
        )
        Session(config.policy, None, config.memory_limit).close()  # fail fast: data, ledger
        self.analyst, self.owner = Analyst(config), Owner(config)
        self.pages = Environment(
            loader=FileSystemLoader(HERE / "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
        )

    def app(self) -> Starlette:
        api, page = self.api, self.page_route
        routes = [
            Route("/", self.home),
            Route("/login", self.login_get, methods=["GET"]),
            Route("/login", self.login_post, methods=["POST"]),
            Route("/logout", self.logout, methods=["POST"]),
            Route("/analyst", page("analyst.html", None)),
            Route("/owner", page("owner.html", "owner")),
            Route("/api/preview", api(None, self.preview), methods=["POST"]),
            Route("/api/run", api(None, self.run), methods=["POST"]),
            Route("/api/me", api(None, self.me)),
            Route("/api/answers/{answer}.{fmt}", self.download),
            Route("/api/owner/overview", api("owner", self.overview)),
            Route("/api/owner/whatif", api("owner", self.whatif)),
            Route("/api/owner/batch", api("owner", self.batch), methods=["POST"]),
            Route("/api/owner/allocate", api("owner", self.allocate), methods=["POST"]),
            Route("/api/owner/verify", api("owner", self.verify), methods=["POST"]),
            Route("/api/owner/check", api("owner", self.check), methods=["POST"]),
            Route("/owner/report.html", self.report),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ]
        middleware = [Middleware(guard.SecurityHeaders, config=self.config)]

        @contextlib.asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            yield
            self.analyst.pool.close()  # the kept sessions' engines, at shutdown

        return Starlette(routes=routes, middleware=middleware, lifespan=lifespan)

    def page(self, name: str, **context: Any) -> HTMLResponse:
        return HTMLResponse(self.pages.get_template(name).render(**context))

    def api(self, role: str | None, work: Callable[[Request, Login], Awaitable[Any]]) -> Handler:
        """A JSON route: the login (and role, and CSRF token on a change) checked first; a
        refusal answered with its class and message, never a data value or a stack."""

        async def handler(request: Request) -> Response:
            try:
                login = login_of(request, self.logins, role)
                return JSONResponse(await work(request, login))
            except Refused as exc:
                return JSONResponse({"error": "Refused", "message": str(exc)}, exc.status)
            except Busy as exc:
                return JSONResponse({"error": "Busy", "message": str(exc)}, 503)
            except DpsqlError as exc:
                return JSONResponse(error_json(exc), _status(exc))
            except Exception:
                log.exception("internal error in %s", request.url.path)
                return JSONResponse(
                    {"error": "InternalError", "message": "an internal error (see the log)"}, 500
                )

        return handler

    def page_route(self, name: str, role: str | None) -> Handler:
        async def handler(request: Request) -> Response:
            try:
                login = login_of(request, self.logins, role)
            except Refused as exc:
                if exc.status == 401:
                    return RedirectResponse("/login", 303)
                refused = self.pages.get_template("refused.html").render(message=str(exc))
                return HTMLResponse(refused, exc.status)
            return self.page(name, login=login, dataset=self.config.policy.dataset.id)

        return handler

    # -- logging in ------------------------------------------------------------------------
    async def login_page(self, error: str = "", status: int = 200) -> Response:
        token = secrets.token_urlsafe(32)
        response = self.page("login.html", csrf=token, error=error)
        response.status_code = status
        guard.set_login_cookie(response, PRE_COOKIE, token, self.config, max_age=3600)
        return response

    async def login_get(self, request: Request) -> Response:
        if self.logins.get(request.cookies.get(COOKIE)) is not None:
            return RedirectResponse("/", 303)
        return await self.login_page()

    async def login_post(self, request: Request) -> Response:
        try:
            body = await guard.read_body(request, 4 * FIELD)
        except Refused as exc:
            return await self.login_page(str(exc), exc.status)
        form = _form(body)
        pre = request.cookies.get(PRE_COOKIE, "")
        offered = form.get("csrf", "")
        if not pre or not secrets.compare_digest(pre.encode(), offered.encode()):
            return await self.login_page("the form has expired: log in again", 403)
        address = guard.client_address(request, self.config)
        wait = self.logins.wait(address)
        if wait is not None:
            return await self.login_page(f"too many failed logins: try again in {wait:.0f} s", 429)
        name, password = form.get("name", "")[:64], form.get("password", "")
        try:
            user = await run_in_threadpool(self.logins.check, address, name, password)
        except DpsqlError:
            log.exception("the users file cannot be read")
            return await self.login_page("passwords cannot be checked now (see the log)", 503)
        if user is None:
            return await self.login_page("wrong user name or password", 401)
        login = self.logins.start(user)
        response = RedirectResponse("/owner" if user.role == "owner" else "/analyst", 303)
        guard.set_login_cookie(response, COOKIE, login.token, self.config)
        guard.set_login_cookie(response, PRE_COOKIE, "", self.config, max_age=0)
        return response

    async def logout(self, request: Request) -> Response:
        login = self.logins.get(request.cookies.get(COOKIE))
        if login is not None:
            form = _form(await guard.read_body(request, FIELD))
            if not login.csrf_ok(form.get("csrf") or request.headers.get("x-csrf-token")):
                return JSONResponse({"error": "Refused", "message": "no CSRF token"}, 403)
            self.logins.end(login.token)
        response = RedirectResponse("/login", 303)
        guard.set_login_cookie(response, COOKIE, "", self.config, max_age=0)
        return response

    async def home(self, request: Request) -> Response:
        login = self.logins.get(request.cookies.get(COOKIE))
        if login is None:
            return RedirectResponse("/login", 303)
        return RedirectResponse("/owner" if login.role == "owner" else "/analyst", 303)

    # -- the analyst's routes --------------------------------------------------------------
    async def _sql(self, request: Request) -> str:
        body = await guard.json_body(request, self.config.max_body_bytes)
        return guard.text_field(body, "sql", self.config.max_statement_bytes)

    async def preview(self, request: Request, login: Login) -> Any:
        return await run_in_threadpool(self.analyst.preview, login, await self._sql(request))

    async def run(self, request: Request, login: Login) -> Any:
        return await run_in_threadpool(self.analyst.run, login, await self._sql(request))

    async def me(self, request: Request, login: Login) -> Any:
        return await run_in_threadpool(self.analyst.mine, login)

    async def download(self, request: Request) -> Response:
        try:
            login = login_of(request, self.logins)
            answer_id, fmt = request.path_params["answer"], request.path_params["fmt"]
            if not _ANSWER.fullmatch(answer_id) or fmt not in ("csv", "parquet"):
                raise Refused(404, "no such answer")
            result = self.analyst.kept(login, answer_id)
            data = to_csv(result) if fmt == "csv" else await run_in_threadpool(to_parquet, result)
        except Refused as exc:
            return JSONResponse({"error": "Refused", "message": str(exc)}, exc.status)
        except DpsqlError as exc:
            return JSONResponse(error_json(exc), 404)
        except ImportError as exc:
            return JSONResponse({"error": "ImportError", "message": str(exc)}, 501)
        media = "text/csv; charset=utf-8" if fmt == "csv" else "application/vnd.apache.parquet"
        disposition = f'attachment; filename="answer.{fmt}"'
        return Response(data, media_type=media, headers={"content-disposition": disposition})

    # -- the owner's routes ----------------------------------------------------------------
    async def overview(self, request: Request, login: Login) -> Any:
        return await run_in_threadpool(self.owner.overview, login)

    async def whatif(self, request: Request, login: Login) -> Any:
        epsilon = request.query_params.get("epsilon", "")[:64]
        queries = request.query_params.get("queries", "")
        if not queries.isdigit() or len(queries) > 6:
            raise Refused(400, "queries must be a whole number")
        return await run_in_threadpool(self.owner.whatif, login, epsilon, int(queries))

    async def batch(self, request: Request, login: Login) -> Any:
        body = await guard.json_body(request, self.config.max_body_bytes)
        text = guard.text_field(body, "text", self.config.max_body_bytes)
        analyst = guard.text_field(body, "analyst", FIELD, required=False)
        return await run_in_threadpool(self.owner.batch, login, text, analyst)

    async def allocate(self, request: Request, login: Login) -> Any:
        body = await guard.json_body(request, self.config.max_body_bytes)
        fields = {n: guard.text_field(body, n, FIELD) for n in ("analyst", "epsilon", "why")}
        delta = guard.text_field(body, "delta", FIELD, required=False)
        password = guard.text_field(body, "password", FIELD)
        if body.get("confirm") is not True:
            raise Refused(400, "confirm the change of share")
        top_up = body.get("mode", "set")
        if top_up not in ("set", "top up"):
            raise Refused(400, "mode is 'set' or 'top up'")
        address = guard.client_address(request, self.config)
        if self.logins.wait(address) is not None:
            raise Refused(429, "too many failed logins: try again later")
        if await run_in_threadpool(self.logins.check, address, login.name, password) is None:
            raise Refused(403, "the password is wrong: the share is unchanged")
        return await run_in_threadpool(
            self.owner.allocate, login, fields["analyst"], fields["epsilon"], delta,
            fields["why"], top_up=top_up == "top up",
        )  # fmt: skip

    async def verify(self, request: Request, login: Login) -> Any:
        return await run_in_threadpool(self.owner.verify)

    async def check(self, request: Request, login: Login) -> Any:
        return await run_in_threadpool(self.owner.check)

    async def report(self, request: Request) -> Response:
        try:
            login = login_of(request, self.logins, "owner")
        except Refused as exc:
            return JSONResponse({"error": "Refused", "message": str(exc)}, exc.status)
        text = await run_in_threadpool(self.owner.report_html, login)
        disposition = 'attachment; filename="report.html"'
        return HTMLResponse(text, headers={"content-disposition": disposition})


def _form(body: bytes) -> dict[str, str]:
    """An urlencoded form's fields (the first of each name), each at most FIELD characters."""
    try:
        pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, max_num_fields=16)
    except (UnicodeDecodeError, ValueError):
        return {}
    form: dict[str, str] = {}
    for name, value in pairs:
        form.setdefault(name, value[:FIELD])
    return form
