"""``dpsql web``: serve the console (``dpsql.interfaces.web``) with uvicorn.

Starlette, uvicorn and Jinja2 are the optional extra ``dpsql[web]``; without them the command
says what to install. The transport rule (``dpsql.interfaces.web.config``) is checked before
anything opens: a non-loopback address needs --tls-cert and --tls-key, or --tls-proxy.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import click

from dpsql.errors import ParameterError
from dpsql.interfaces.cli.context import Config, pass_config
from dpsql.interfaces.cli.serve import listen_address, login_throttle

__all__ = ["web_command"]

NEEDED = ("starlette", "uvicorn", "jinja2")


@click.command("web")
@click.option(
    "--listen", default="127.0.0.1:8080", show_default=True, help="HOST:PORT to listen on."
)
@click.option(
    "--users-file", type=click.Path(dir_okay=False, path_type=Path), required=True,
    envvar="DPSQL_USERS_FILE",
    help="The users file of dpsql users (the same logins and roles as dpsql serve).",
)  # fmt: skip
@click.option(
    "--tls-cert", type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="A PEM certificate (chain): the console speaks HTTPS itself.",
)  # fmt: skip
@click.option(
    "--tls-key", type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="The certificate's PEM private key.",
)  # fmt: skip
@click.option(
    "--tls-proxy", is_flag=True,
    help="A TLS proxy in front serves HTTPS: every request must carry X-Forwarded-Proto: https.",
)  # fmt: skip
@login_throttle("must wait (HTTP 429)")
@click.option(
    "--idle-timeout", type=click.FloatRange(10, 86_400), default=1800.0, show_default=True,
    help="Seconds without a request after which a login ends.",
)  # fmt: skip
@click.option(
    "--max-running", type=click.IntRange(1, 256), default=4, show_default=True,
    help="Statements running at once; one more is refused as busy (HTTP 503), free of charge.",
)  # fmt: skip
@click.option(
    "--statement-timeout", type=click.FloatRange(0.1, 86_400), default=300.0,
    show_default=True,
    help="Seconds a statement may run; one cut off fails as an engine failure does, and "
    "keeps its charge.",
)  # fmt: skip
@click.option(
    "--memory-limit", default="1GB", show_default=True,
    help="DuckDB memory cap of each statement's engine (a DuckDB size, e.g. 512MB).",
)  # fmt: skip
@pass_config
def web_command(  # noqa: PLR0917 - click passes every option
    config: Config,
    listen: str,
    users_file: Path,
    tls_cert: Path | None,
    tls_key: Path | None,
    tls_proxy: bool,
    login_burst: int,
    login_refill: float,
    login_delay_cap: float,
    idle_timeout: float,
    max_running: int,
    statement_timeout: float,
    memory_limit: str,
) -> None:
    """The console in a browser: a page for analysts (preview, run, download, their share and
    history) and one for the data owner (budget curves, what-if, shares, ledger, report).

    Logins are the users of dpsql users; every query is charged to the data set's budget and
    the analyst's share in the policy's durable ledger, as dpsql serve charges it.
    """
    missing = [m for m in NEEDED if importlib.util.find_spec(m) is None]
    if missing:
        raise click.UsageError(
            "dpsql web needs the web extra (missing: " + ", ".join(missing) + "): "
            "pip install 'dpsql[web]'"
        )
    host, port = listen_address(listen, "127.0.0.1:8080")
    if (tls_cert is None) != (tls_key is None):
        raise click.BadParameter("give --tls-cert and --tls-key together", param_hint="'--tls-key'")
    # The web extra's modules, imported once they are known to be installed.
    import uvicorn  # noqa: PLC0415

    from dpsql.interfaces.web.app import create_app  # noqa: PLC0415
    from dpsql.interfaces.web.config import WebConfig  # noqa: PLC0415

    try:
        web = WebConfig(
            policy=config.policy(), users_file=users_file, policy_file=config.policy_path,
            host=host, port=port, tls_cert=tls_cert, tls_key=tls_key, tls_proxy=tls_proxy,
            login_burst=login_burst, login_refill=login_refill, login_delay_cap=login_delay_cap,
            idle_timeout=idle_timeout, max_running=max_running,
            statement_timeout=statement_timeout, memory_limit=memory_limit,
        )  # fmt: skip
    except ParameterError as exc:
        raise click.UsageError(str(exc)) from None
    app = create_app(web)
    logging.basicConfig(level=logging.INFO)
    uvicorn.run(
        app, host=host, port=port, ssl_certfile=tls_cert, ssl_keyfile=tls_key,
        proxy_headers=False, server_header=False, access_log=False, log_level="info",
    )  # fmt: skip
