"""A live ``dpsql web`` for the console's tests: the real application served by uvicorn on a
free loopback port in a thread, over its own ledger and users, and a small HTTP client that
keeps cookies (the standard library's, so that what is sent is what a browser would send)."""

from __future__ import annotations

import http.client
import http.cookies
import json
import re
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import duckdb
import uvicorn
from click.testing import CliRunner

from dpsql.interfaces.cli import main as cli
from dpsql.interfaces.pgwire.users import add_user
from dpsql.interfaces.web.app import create_app
from dpsql.interfaces.web.config import WebConfig
from dpsql.policy import load_policy

# Values and a column name an attacker may have written into the data: each must come out as
# text, never as markup or script.
HOSTILE = ["<script>window.__xss = 1</script>", '"><img src=x onerror="window.__xss=2">']
PASSWORDS = {"alice": "alice-pw-1", "bob": "bob-pw-1", "olga": "olga-pw-1"}

POLICY = """
[dataset]
id = "web-test"
data_version = "1"

[data]
tables = { visits = "visits.parquet" }

[ledger]
path = "visits.ledger"

[budget]
epsilon = 10.0
delta = 1e-6
query_epsilon = 0.5
query_delta = 1e-8

[budget.analysts.alice]
epsilon = 3
delta = 1e-7

[budget.analysts.bob]
epsilon = 2
delta = 1e-7

[tables.visits]
privacy_unit = "user_id"
max_groups_per_unit = 2
max_rows_per_unit_per_group = 10

[tables.visits.columns.spend]
lower = 0
upper = 200

[tables.visits.columns.region]
public_values = ["central", "east", "north", "south", "west", {regions}]
"""


def make_folder(folder: Path) -> Path:
    """``folder`` holding ``policy.toml`` over generated visits (hostile region names among
    the public values), its ledger created, and the users alice and bob (analysts) and olga
    (owner)."""
    con = duckdb.connect()
    regions = ["central", "east", "north", "south", "west", *HOSTILE]
    con.execute(
        "CREATE TABLE v AS SELECT (i % 2000) AS user_id, "
        "?[1 + (i % 2000) % 7] AS region, ((i * 37) % 150)::DOUBLE AS spend "
        "FROM range(6000) t(i)",
        [regions],
    )
    con.execute(f"COPY v TO '{folder / 'visits.parquet'}' (FORMAT parquet)")
    con.close()
    quoted = ", ".join(json.dumps(r) for r in HOSTILE)
    path = folder / "policy.toml"
    path.write_text(POLICY.replace("{regions}", quoted), encoding="utf-8")
    done = CliRunner().invoke(cli.cli, ["--policy", str(path), "init"])
    assert done.exit_code == 0, done.output
    users = folder / "users.json"
    for name, password in PASSWORDS.items():
        add_user(users, name, password, "owner" if name == "olga" else "analyst")
    return folder


@contextmanager
def served(folder: Path, **settings: Any) -> Iterator[str]:
    """The console of ``folder`` (``make_folder``) on a free loopback port: its base URL."""
    config = WebConfig(
        policy=load_policy(folder / "policy.toml"),
        users_file=folder / "users.json",
        policy_file=folder / "policy.toml",
        port=0,
    )
    config = replace(config, **settings)
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(config),
            host="127.0.0.1",
            port=0,
            log_level="warning",
            access_log=False,
            lifespan="off",
            ssl_certfile=config.tls_cert,
            ssl_keyfile=config.tls_key,
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the console did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        scheme = "https" if config.tls_cert is not None else "http"
        yield f"{scheme}://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


class Client:
    """A browser-like HTTP client: cookies kept, the page's CSRF token sent on changes."""

    def __init__(
        self, base: str, headers: dict[str, str] | None = None, cafile: Path | None = None
    ) -> None:
        self.tls = base.startswith("https://")
        self.host, self.port = base.split("://", 1)[1].split(":")
        self.context = ssl.create_default_context(cafile=cafile) if self.tls else None
        self.cookies: dict[str, str] = {}
        self.csrf = ""
        self.extra = headers or {}
        self.last_headers: list[tuple[str, str]] = []
        self.login_cookies: list[str] = []

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        conn: http.client.HTTPConnection
        if self.context is not None:
            conn = http.client.HTTPSConnection(
                self.host, int(self.port), timeout=120, context=self.context
            )
        else:
            conn = http.client.HTTPConnection(self.host, int(self.port), timeout=120)
        sent = dict(self.extra)
        if self.cookies:
            sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        sent.update(headers or {})
        conn.request(method, path, body=body, headers=sent)
        response = conn.getresponse()
        data = response.read()
        self.last_headers = response.getheaders()
        for name, value in self.last_headers:
            if name.lower() == "set-cookie":
                cookie = http.cookies.SimpleCookie(value)
                for key, morsel in cookie.items():
                    if morsel["max-age"] == "0" or not morsel.value:
                        self.cookies.pop(key, None)
                    else:
                        self.cookies[key] = morsel.value
        conn.close()
        return response.status, data

    def set_cookies(self) -> list[str]:
        return [v for k, v in self.last_headers if k.lower() == "set-cookie"]

    def login(self, name: str, password: str | None = None) -> int:
        status, page = self.request("GET", "/login")
        token = re.search(rb'name="csrf" value="([^"]+)"', page)
        assert token is not None
        form = f"csrf={token.group(1).decode()}&name={name}&password={password or PASSWORDS[name]}"
        status, _ = self.request(
            "POST", "/login", form.encode(), {"Content-Type": "application/x-www-form-urlencoded"}
        )
        self.login_cookies = self.set_cookies()
        if status == 303:
            _, page = self.request("GET", "/analyst")
            found = re.search(rb'name="csrf-token" content="([^"]+)"', page)
            assert found is not None
            self.csrf = found.group(1).decode()
        return status

    def post(self, path: str, body: dict[str, Any], csrf: bool = True) -> tuple[int, Any]:
        headers = {"Content-Type": "application/json"}
        if csrf:
            headers["X-CSRF-Token"] = self.csrf
        status, data = self.request("POST", path, json.dumps(body).encode(), headers)
        return status, json.loads(data)

    def get(self, path: str) -> tuple[int, Any]:
        status, data = self.request("GET", path)
        return status, json.loads(data)
