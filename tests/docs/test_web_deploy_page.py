"""docs/web-deploy.md's configuration blocks agree with the console: the nginx block forwards
what ``--tls-proxy`` requires to the address the systemd unit's ``dpsql web`` listens on, the
unit's command line is one ``dpsql web`` accepts, and the refusal the page quotes is the one the
command prints."""

from __future__ import annotations

import configparser
import re
import shlex
from pathlib import Path

from click.testing import CliRunner

from dpsql.interfaces.cli import main as cli

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "web-deploy.md").read_text("utf-8")


def _block(lang: str) -> str:
    match = re.search(rf"```{lang}\n(.*?)```", PAGE, re.S)
    assert match, f"docs/web-deploy.md has no {lang} block"
    return match.group(1)


def _unit() -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=True, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string(_block("ini"))
    return unit


def test_the_unit_runs_a_command_line_dpsql_web_accepts() -> None:
    service = _unit()["Service"]
    argv = shlex.split(service["ExecStart"])
    assert argv[0].endswith("/dpsql") and argv[1] == "web"
    context = cli.web_command.make_context("web", argv[2:])
    assert context.params["tls_proxy"] is True
    assert context.params["listen"].startswith("127.0.0.1:")
    assert service["User"] == "dpsql" and service["UMask"] == "0077"
    assert service["Environment"].startswith("DPSQL_POLICY=")


def test_the_proxy_forwards_what_the_console_requires_to_where_it_listens() -> None:
    nginx = _block("nginx")
    listen = shlex.split(_unit()["Service"]["ExecStart"])
    address = listen[listen.index("--listen") + 1]
    assert f"proxy_pass http://{address};" in nginx
    assert "proxy_set_header X-Forwarded-Proto https;" in nginx
    assert "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;" in nginx
    assert "listen 443 ssl;" in nginx and "return 301 https://" in nginx


def test_the_quoted_refusal_is_the_command_s(tmp_path: Path) -> None:
    quoted = re.search(r"\$ dpsql .*?--listen 0\.0\.0\.0:8080\n(.*?)\n\n", PAGE, re.S)
    assert quoted is not None
    expected = " ".join(quoted.group(1).split())
    policy = Path(__file__).resolve().parents[2] / "examples" / "durable.toml"
    done = CliRunner().invoke(
        cli.cli,
        ["--policy", str(policy), "web", "--users-file", str(tmp_path / "u.json"),
         "--listen", "0.0.0.0:8080"],
    )  # fmt: skip
    assert done.exit_code == 2
    assert expected in " ".join(done.output.split())
