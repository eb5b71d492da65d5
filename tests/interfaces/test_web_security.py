"""The console's security: cookies, CSRF, XSS through data values, column names and query
text, analysts kept apart, the owner's actions kept to the owner, login throttling, and the
refusal to serve a non-loopback address in the clear. Against the real application served by
uvicorn (``web_fixtures``), over a real ledger."""

from __future__ import annotations

import http.client
import json
from dataclasses import replace
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner
from server_fixtures import make_certificate
from web_fixtures import HOSTILE, Client, make_folder, served

from dpsql.accounting.ledger.ledger import Ledger
from dpsql.errors import ParameterError
from dpsql.interfaces.cli import main as cli
from dpsql.interfaces.web.config import WebConfig, check_transport, is_loopback
from dpsql.interfaces.web.guard import CSP
from dpsql.policy import load_policy

pytestmark = pytest.mark.xdist_group("web")
QUERY = "SELECT region, COUNT(*) AS n FROM visits GROUP BY region"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_folder(tmp_path_factory.mktemp("web"))


@pytest.fixture(scope="module")
def base(folder: Path):  # type: ignore[no-untyped-def]
    with served(folder) as url:
        yield url


def _kinds(folder: Path) -> list[str]:
    ledger = Ledger(folder / "visits.ledger", folder / "visits.ledger.anchor")
    try:
        return [r.kind for r in ledger.records()]
    finally:
        ledger.close()


def test_login_cookie_flags_and_headers(base: str) -> None:
    client = Client(base)
    assert client.login("alice") == 303
    cookies = client.login_cookies
    login = next(c for c in cookies if c.startswith("dpsql_login="))
    assert "HttpOnly" in login and "SameSite=strict" in login and "Path=/" in login
    assert "Secure" not in login  # loopback in the clear: a browser would not send it back
    status, _ = client.request("GET", "/analyst")
    headers = dict((k.lower(), v) for k, v in client.last_headers)
    assert status == 200
    assert headers["content-security-policy"] == CSP
    assert "'unsafe-inline'" not in CSP and "script-src 'self'" in CSP
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["cache-control"] == "no-store"
    assert headers["referrer-policy"] == "no-referrer"


def test_cookies_are_secure_beyond_loopback(folder: Path) -> None:
    policy = load_policy(folder / "policy.toml")
    assert not WebConfig(policy, folder / "users.json").secure_cookies
    assert WebConfig(policy, folder / "users.json", tls_proxy=True).secure_cookies
    assert WebConfig(policy, folder / "users.json", host="10.0.0.5", tls_proxy=True).secure_cookies


def test_a_change_without_the_csrf_token_is_refused_and_charges_nothing(
    base: str, folder: Path
) -> None:
    client = Client(base)
    client.login("alice")
    before = _kinds(folder)
    status, answer = client.post("/api/run", {"sql": QUERY}, csrf=False)
    assert status == 403 and "CSRF" in answer["message"]
    client.csrf = "forged-" + client.csrf[7:]
    status, _ = client.post("/api/run", {"sql": QUERY})
    assert status == 403
    other = Client(base)
    other.login("bob")
    client.csrf = other.csrf  # another login's token is not this login's
    status, _ = client.post("/api/run", {"sql": QUERY})
    assert status == 403
    assert _kinds(folder) == before


def test_the_login_form_needs_its_own_token(base: str) -> None:
    client = Client(base)
    status, _ = client.request(
        "POST", "/login", b"csrf=x&name=alice&password=alice-pw-1",
        {"Content-Type": "application/x-www-form-urlencoded"},
    )  # fmt: skip
    assert status == 403 and "dpsql_login" not in client.cookies


def test_hostile_values_and_names_travel_as_text(base: str) -> None:
    """A data value, a column name and the query text holding markup come back as JSON
    strings (the page writes them with textContent: ``test_web_browser``), and no HTML the
    server renders carries them."""
    client = Client(base)
    client.login("alice")
    alias = '"<img src=x onerror=alert(1)>"'
    status, answer = client.post(
        "/api/run", {"sql": f"SELECT region, COUNT(*) AS {alias} FROM visits GROUP BY region"}
    )
    assert status == 200, answer
    assert answer["columns"][1] == "<img src=x onerror=alert(1)>"
    keys = {row[0]["value"] for row in answer["rows"]}
    assert set(HOSTILE) <= keys
    status, page = client.request("GET", "/analyst")
    assert b"<img src=x" not in page and b"<script>window" not in page
    status, mine = client.get("/api/me")
    assert any("<img src=x onerror=alert(1)>" in h["query"] for h in mine["history"])
    status, csv = client.request("GET", f"/api/answers/{answer['id']}.csv")
    assert status == 200 and "<script>window.__xss = 1</script>" in csv.decode()
    # The Parquet file holds the CSV's columns, and says what it cost without a release number.
    import io

    import pyarrow.parquet as pq

    status, parquet = client.request("GET", f"/api/answers/{answer['id']}.parquet")
    table = pq.read_table(io.BytesIO(parquet))
    assert table.column_names == csv.decode().splitlines()[0].split(",")
    meta = table.schema.metadata
    assert b"cost" in meta and b"cached_from" not in meta and b"ledger_record" not in meta


def test_an_analyst_sees_only_their_own_history_and_answers(base: str) -> None:
    alice, bob = Client(base), Client(base)
    alice.login("alice")
    bob.login("bob")
    marker = "SELECT COUNT(*) AS private_marker_1 FROM visits"
    status, answer = alice.post("/api/run", {"sql": marker})
    assert status == 200
    _, mine = bob.get("/api/me")
    assert all("private_marker_1" not in h["query"] for h in mine["history"])
    assert mine["name"] == "bob" and "alice" not in json.dumps(mine)
    status, _ = bob.request("GET", f"/api/answers/{answer['id']}.csv")
    assert status == 404
    # Bob asking the same query is served alice's release free, and told only that.
    status, again = bob.post("/api/run", {"sql": marker})
    assert status == 200 and again["served_free"]
    assert again["cost"].startswith("served free from an earlier release")
    assert "alice" not in json.dumps(again) and "#" not in again["cost"]


def test_an_analyst_cannot_reach_an_owner_action(base: str, folder: Path) -> None:
    client = Client(base)
    client.login("alice")
    before = _kinds(folder)
    status, _ = client.request("GET", "/owner")
    assert status == 403
    for path, body in (
        ("/api/owner/allocate", {"analyst": "alice", "epsilon": "9", "why": "x",
                                 "password": "alice-pw-1", "confirm": True}),
        ("/api/owner/verify", {}),
        ("/api/owner/check", {}),
        ("/api/owner/batch", {"text": QUERY}),
    ):  # fmt: skip
        status, answer = client.post(path, body)
        assert status == 403, (path, answer)
    for path in ("/api/owner/overview", "/api/owner/whatif?epsilon=1&queries=3"):
        status, _ = client.get(path)
        assert status == 403
    status, _ = client.request("GET", "/owner/report.html")
    assert status == 403
    assert _kinds(folder) == before


def test_an_owner_change_needs_the_password_again_and_a_confirmation(
    base: str, folder: Path
) -> None:
    owner = Client(base)
    owner.login("olga")
    before = _kinds(folder)
    change = {"analyst": "bob", "epsilon": "2.5", "delta": "1e-7", "why": "more work"}
    status, answer = owner.post("/api/owner/allocate", {**change, "password": "olga-pw-1"})
    assert status == 400 and "confirm" in answer["message"]
    status, answer = owner.post(
        "/api/owner/allocate", {**change, "password": "wrong", "confirm": True}
    )
    assert status == 403
    status, answer = owner.post(
        "/api/owner/allocate", {**change, "epsilon": "11", "password": "olga-pw-1", "confirm": True}
    )
    assert status == 400 and "total" in answer["message"]
    assert _kinds(folder) == before
    status, answer = owner.post(
        "/api/owner/allocate", {**change, "password": "olga-pw-1", "confirm": True}
    )
    assert status == 200, answer
    assert _kinds(folder) == [*before, "allocate"]
    _, overview = owner.get("/api/owner/overview")
    assert overview["analysts"]["bob"]["share"]["set_by"] == f"ledger record {answer['record']}"
    bob = Client(base)
    bob.login("bob")
    _, mine = bob.get("/api/me")
    assert mine["share"]["epsilon"] == 2.5
    assert mine["share"]["set_by"] == f"the data owner olga (ledger record {answer['record']})"
    # A top-up raises the share by what is given, within the total, confirmed as a change.
    status, topped = owner.post(
        "/api/owner/allocate",
        {**change, "epsilon": "0.5", "delta": "0", "mode": "top up", "password": "olga-pw-1",
         "confirm": True},
    )  # fmt: skip
    assert status == 200, topped
    _, mine = bob.get("/api/me")
    assert mine["share"]["epsilon"] == 3.0
    status, over = owner.post(
        "/api/owner/allocate",
        {**change, "epsilon": "7.5", "mode": "top up", "password": "olga-pw-1", "confirm": True},
    )  # fmt: skip
    assert status == 400 and "total" in over["message"]


def test_failed_logins_are_throttled(folder: Path) -> None:
    with served(folder, login_burst=2, login_refill=0.01, login_delay_cap=0.0) as url:
        client = Client(url)
        assert client.login("bob", "nope") == 401
        assert client.login("bob", "nope") == 401
        assert client.login("bob", "nope") == 429
        assert client.login("bob") == 429  # the right password waits too: no oracle
        assert Client(url, {}).login("bob") == 429  # the same address


def test_a_non_loopback_address_needs_tls(folder: Path) -> None:
    policy = load_policy(folder / "policy.toml")
    users = folder / "users.json"
    for host in ("0.0.0.0", "::", "10.1.2.3", "example.internal"):
        assert not is_loopback(host)
        with pytest.raises(ParameterError, match="TLS"):
            WebConfig(policy, users, host=host)
    for host in ("127.0.0.1", "::1", "localhost", "127.8.9.1"):
        check_transport(host, tls=False, proxy=False)
    WebConfig(policy, users, host="0.0.0.0", tls_proxy=True)
    with pytest.raises(ParameterError, match="not both"):
        check_transport("0.0.0.0", tls=True, proxy=True)
    done = CliRunner().invoke(
        cli.cli,
        ["--policy", str(folder / "policy.toml"), "web", "--users-file", str(users),
         "--listen", "0.0.0.0:0"],
    )  # fmt: skip
    assert done.exit_code == 2 and "TLS" in done.output


def test_behind_a_tls_proxy_plain_http_is_refused(folder: Path) -> None:
    with served(folder, tls_proxy=True) as url:
        plain = Client(url)
        status, _ = plain.request("GET", "/login")
        assert status == 400
        proxied = Client(url, {"X-Forwarded-Proto": "https", "X-Forwarded-For": "198.51.100.7"})
        assert proxied.login("alice") == 303
        assert all("Secure" in c for c in proxied.login_cookies if c.startswith("dpsql_"))
        headers = dict((k.lower(), v) for k, v in proxied.last_headers)
        assert "strict-transport-security" in headers


def test_large_bodies_and_bad_json_are_refused_free(base: str, folder: Path) -> None:
    client = Client(base)
    client.login("alice")
    before = _kinds(folder)
    status, _ = client.request(
        "POST", "/api/run", b"x" * (2 << 20),
        {"Content-Type": "application/json", "X-CSRF-Token": client.csrf},
    )  # fmt: skip
    assert status == 413
    status, _ = client.request("POST", "/api/run", b"[1, 2]", {"X-CSRF-Token": client.csrf})
    assert status == 400
    status, answer = client.post("/api/run", {"sql": "SELECT COUNT(*) FROM visits; SELECT 1"})
    assert status == 400 and "one statement" in answer["message"]
    status, answer = client.post("/api/run", {"sql": "SELECT * FROM visits"})
    assert status == 400 and answer["error"] == "UnsupportedQueryError"
    assert _kinds(folder) == before


def test_every_statement_slot_busy_is_refused_free(folder: Path) -> None:
    from dpsql.interfaces.web.analyst import Analyst, Busy
    from dpsql.interfaces.web.logins import Login

    config = replace(
        WebConfig(load_policy(folder / "policy.toml"), folder / "users.json"), max_running=1
    )
    analyst = Analyst(config)
    login = Login("t", "alice", "analyst", "c", 0.0, 0.0)
    with analyst.session(login), pytest.raises(Busy):
        analyst.preview(login, QUERY)


def test_a_statement_past_its_deadline_is_interrupted() -> None:
    """The console's statement timeout on a real DuckDB query that would run for minutes."""
    import time

    import duckdb

    from dpsql.interfaces.web.analyst import deadline

    con = duckdb.connect()
    start = time.monotonic()
    with pytest.raises(duckdb.InterruptException), deadline(con.interrupt, 0.2):
        con.execute("SELECT sum(a.range * b.range) FROM range(100000) a, range(100000) b")
    assert time.monotonic() - start < 30
    with deadline(con.interrupt, 5):  # one that ends in time is left alone
        assert con.execute("SELECT 42").fetchone() == (42,)


def test_one_user_logging_in_again_and_again_ends_only_their_own_logins(base: str) -> None:
    bob = Client(base)
    bob.login("bob")
    for _ in range(12):
        Client(base).login("alice")
    status, mine = bob.get("/api/me")
    assert status == 200 and mine["name"] == "bob"


def test_the_owner_verifies_the_ledger_and_checks_the_data(base: str) -> None:
    owner = Client(base)
    owner.login("olga")
    status, verified = owner.post("/api/owner/verify", {})
    assert status == 200 and verified["ok"] and verified["records"] > 0
    status, checked = owner.post("/api/owner/check", {})
    assert status == 200, checked
    assert checked["status"] == 0 and checked["report"]["tables"]
    status, bad = owner.post(
        "/api/owner/allocate",
        {"analyst": "<b>x</b>", "epsilon": "1", "why": "w", "password": "olga-pw-1",
         "confirm": True},
    )  # fmt: skip
    assert status == 400 and "user name" in bad["message"]


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_certificate(tmp_path_factory.mktemp("webtls"))


def test_over_its_own_tls_the_console_sets_secure_cookies_and_hsts(
    folder: Path, certificate: tuple[Path, Path]
) -> None:
    cert, key = certificate
    with served(folder, tls_cert=cert, tls_key=key) as url:
        assert url.startswith("https://")
        client = Client(url, cafile=cert)  # the certificate verified, host name included
        assert client.login("alice") == 303
        login = next(c for c in client.login_cookies if c.startswith("dpsql_login="))
        assert "Secure" in login and "HttpOnly" in login
        headers = {k.lower(): v for k, v in client.last_headers}
        assert headers["strict-transport-security"].startswith("max-age=")
        status, answer = client.post(
            "/api/run", {"sql": "SELECT COUNT(*) FROM visits WHERE spend < 77"}
        )
        assert status == 200 and answer["charged"] is not None
        plain = Client(url.replace("https://", "http://"))
        with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
            plain.request("GET", "/login")


def test_kept_sessions_carry_no_other_login_s_settings(base: str) -> None:
    """Two logins of one analyst share the analyst's kept session: each statement runs under
    its own login's SET values only."""
    first, second = Client(base), Client(base)
    first.login("alice")
    second.login("alice")
    status, _ = first.post("/api/run", {"sql": "SET dpsql.epsilon = 0.01"})
    assert status == 200
    _, small = first.post("/api/preview", {"sql": QUERY})
    _, default = second.post("/api/preview", {"sql": QUERY})
    assert small["epsilon"] == "0.011" and default["epsilon"] == "0.55"
    _, again = first.post("/api/preview", {"sql": QUERY})
    assert again["epsilon"] == "0.011"


def test_a_data_file_replaced_under_the_console_is_refused_free_then_read_anew(
    tmp_path: Path,
) -> None:
    folder = make_folder(tmp_path)
    with served(folder) as url:
        client = Client(url)
        client.login("alice")
        status, first = client.post("/api/run", {"sql": "SELECT COUNT(*) FROM visits"})
        assert status == 200 and first["charged"] is not None
        data = folder / "visits.parquet"
        con = duckdb.connect()
        con.execute(
            f"COPY (SELECT * FROM '{data}' WHERE spend > 10) TO '{folder / 'new.parquet'}' "
            "(FORMAT parquet)"
        )
        con.close()
        (folder / "new.parquet").replace(data)
        before = _kinds(folder)
        sql = "SELECT COUNT(*) FROM visits WHERE spend > 20"
        status, refused = client.post("/api/run", {"sql": sql})
        assert status == 400 and refused["error"] == "DataChangedError"
        assert _kinds(folder) == before  # nothing charged
        status, answer = client.post("/api/run", {"sql": sql})
        assert status == 200 and answer["charged"] is not None
