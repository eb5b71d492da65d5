"""``dpsql serve``: run the PostgreSQL-wire proxy (``dpsql.interfaces.pgwire.server``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from dpsql.interfaces.cli.context import Config, pass_config
from dpsql.interfaces.pgwire.config import Limits, ServerConfig
from dpsql.interfaces.pgwire.logs import configure_logging
from dpsql.interfaces.pgwire.server import DpsqlServer, serve

F = TypeVar("F", bound=Callable[..., Any])


def login_throttle(refusal: str) -> Callable[[F], F]:
    """The failed-login options of ``dpsql serve`` and ``dpsql web``
    (``dpsql.interfaces.pgwire.throttle``); ``refusal`` says what an address out of tokens
    meets."""
    options = [
        click.option(
            "--login-burst", type=click.IntRange(1, 1_000_000), default=10, show_default=True,
            help=f"Failed logins one client address may make at once before it {refusal}.",
        ),
        click.option(
            "--login-refill", type=click.FloatRange(0.001, 1_000_000), default=1.0,
            show_default=True, help="Failed logins per second an address regains.",
        ),
        click.option(
            "--login-delay-cap", type=click.FloatRange(0, 5), default=2.0, show_default=True,
            help="Longest wait, in seconds, before the proof of a login on a user name that "
            "keeps failing is checked (0: none).",
        ),
    ]  # fmt: skip

    def decorate(command: F) -> F:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def listen_address(value: str, example: str = "127.0.0.1:5433") -> tuple[str, int]:
    """``--listen HOST:PORT`` of ``dpsql serve`` and ``dpsql web`` as (host, port)."""
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise click.BadParameter(f"give HOST:PORT, e.g. {example}", param_hint="'--listen'")
    return host.strip("[]"), int(port)


@click.command("serve")
@click.option(
    "--listen",
    default="127.0.0.1:5433",
    show_default=True,
    help="HOST:PORT to listen on (port 0 picks a free one and logs it).",
)
@click.option(
    "--users-file",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="The users file (SCRAM-SHA-256 verifiers and roles) managed with dpsql users.",
)
@click.option(
    "--tls-cert",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="A PEM certificate (chain) to offer TLS with.",
)
@click.option(
    "--tls-key",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="The certificate's PEM private key (default: in the --tls-cert file).",
)
@click.option("--require-tls", is_flag=True, help="Refuse clients that do not negotiate TLS.")
@click.option(
    "--max-connections", type=click.IntRange(1, 10_000), default=64, show_default=True,
    help="Concurrent authenticated connections; more are refused with SQLSTATE 53300.",
)  # fmt: skip
@click.option(
    "--max-unauthenticated", type=click.IntRange(1, 100_000), default=256, show_default=True,
    help="Connections still logging in, a pool apart from --max-connections; when it is full "
    "a new connection drops the oldest of the address holding the most.",
)  # fmt: skip
@login_throttle("is refused (SQLSTATE 28000) until it regains a token")
@click.option(
    "--statement-timeout", type=click.FloatRange(0.1, 86_400), default=300.0, show_default=True,
    help="Seconds a statement may run; one cut off fails as an engine failure does, and "
    "keeps its charge.",
)  # fmt: skip
@click.option(
    "--memory-limit", default="1GB", show_default=True,
    help="DuckDB memory cap of each connection's worker process (a DuckDB size, e.g. 512MB).",
)  # fmt: skip
@click.option(
    "--max-statement-bytes", type=click.IntRange(1, 1 << 20), default=100_000,
    show_default=True,
    help="Longest statement text (a whole query message); longer ones are refused before "
    "parsing, free of charge (SQLSTATE 54000).",
)  # fmt: skip
@click.option(
    "--max-prepared", type=click.IntRange(1, 1_000_000), default=1000, show_default=True,
    help="Named prepared statements one connection may hold; more are refused (SQLSTATE 53400) "
    "until it closes or DEALLOCATEs some.",
)  # fmt: skip
@click.option(
    "--max-portals", type=click.IntRange(1, 1_000_000), default=100, show_default=True,
    help="Named portals one connection may hold; more are refused (SQLSTATE 53400).",
)  # fmt: skip
@click.option(
    "--max-state-bytes", type=click.IntRange(1 << 20, 1 << 40), default=32 << 20,
    show_default=True,
    help="Bytes of statement text and parameters one connection's prepared statements and "
    "portals may hold together (SQLSTATE 53400 past it).",
)  # fmt: skip
@click.option(
    "--max-settings", type=click.IntRange(1, 100_000), default=64, show_default=True,
    help="Distinct settings one connection may SET; a new one past it is refused (53400).",
)  # fmt: skip
@click.option(
    "--max-setting-value", type=click.IntRange(1, 1 << 20), default=4096, show_default=True,
    help="Characters of one SET value; a longer one is refused (SQLSTATE 53400).",
)  # fmt: skip
@click.option(
    "--max-answer-bytes", type=click.IntRange(1024, 1 << 31), default=16 << 20,
    show_default=True,
    help="Largest answer (its rows as sent), counted while the rows are fetched; a larger one "
    "is refused with SQLSTATE 54000 (a DP answer's charge stands, and the error says so).",
)  # fmt: skip
@click.option(
    "--write-timeout", type=click.FloatRange(0.1, 86_400), default=30.0, show_default=True,
    help="Seconds a client may leave the server's writes unread; then it is disconnected and "
    "its worker stopped.",
)  # fmt: skip
@pass_config
def serve_command(  # noqa: PLR0917 - click passes every option
    config: Config,
    listen: str,
    users_file: Path,
    tls_cert: Path | None,
    tls_key: Path | None,
    require_tls: bool,
    max_connections: int,
    max_unauthenticated: int,
    login_burst: int,
    login_refill: float,
    login_delay_cap: float,
    statement_timeout: float,
    memory_limit: str,
    max_statement_bytes: int,
    max_prepared: int,
    max_portals: int,
    max_state_bytes: int,
    max_settings: int,
    max_setting_value: int,
    max_answer_bytes: int,
    write_timeout: float,
) -> None:
    """Serve the policy's data over the PostgreSQL wire protocol until SIGTERM.

    Analysts connect with psql, psycopg, JDBC or a BI tool, authenticated by SCRAM-SHA-256
    against --users-file; every query is charged to the data set's budget and the analyst's
    share in the policy's durable ledger (the policy needs a [ledger]).
    """
    host, port = listen_address(listen)
    if require_tls and tls_cert is None:
        raise click.BadParameter("--require-tls needs --tls-cert", param_hint="'--require-tls'")
    configure_logging(logging.INFO)  # each worker logs the same way
    server_config = ServerConfig(
        policy=config.policy(),
        users_file=users_file,
        host=host,
        port=port,
        tls_cert=tls_cert,
        tls_key=tls_key,
        require_tls=require_tls,
        limits=Limits(
            max_connections=max_connections,
            max_unauthenticated=max_unauthenticated,
            login_burst=login_burst,
            login_refill=login_refill,
            login_delay_cap=login_delay_cap,
            statement_timeout=statement_timeout,
            memory_limit=memory_limit,
            max_statement=max_statement_bytes,
            max_prepared=max_prepared,
            max_portals=max_portals,
            max_state_bytes=max_state_bytes,
            max_settings=max_settings,
            max_setting_value=max_setting_value,
            max_answer=max_answer_bytes,
            write_timeout=write_timeout,
        ),
    )
    DpsqlServer(server_config)  # fail fast (policy, ledger, users file, TLS) before listening
    serve(server_config)
