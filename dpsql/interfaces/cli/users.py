"""``dpsql users``: the users file of ``dpsql serve`` (names, roles and SCRAM verifiers).

Each command takes ``--users-file`` (or ``DPSQL_USERS_FILE``). A password is read twice from a
hidden prompt, or once from standard input with ``--password-stdin`` (for scripts: the whole
input, at most 4 KiB, less one trailing newline; more is an ``InputError``, exit code 2). It is
turned into a SCRAM-SHA-256 verifier at once and never stored, printed or logged; ``list``
prints names and roles only.

``users`` maps errors as the ``dpsql`` group does, also when it is invoked on its own: a dpsql
error is one line on stderr with its code from ``cli.EXIT_CODES`` (a name taken or missing:
``ParameterError``, 3; a users file that cannot be read or written: ``PolicyError``, 7), and a bad
NAME is a usage error (2).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click

from dpsql.errors import DpsqlError, ParameterError
from dpsql.interfaces.cli.context import exit_code, fail
from dpsql.interfaces.pgwire.users import (
    ROLES,
    Role,
    add_user,
    check_name,
    load_users,
    remove_user,
    set_password,
)
from dpsql.policy import read_limited

if TYPE_CHECKING:  # ParamType is generic from click 8.2 on; the project allows click 8.1
    _TextParam = click.ParamType[str]
else:
    _TextParam = click.ParamType


class UserName(_TextParam):
    """A user name: 1-63 characters, a letter or ``_`` then letters, digits, ``_``, ``.``, ``-``."""

    name = "name"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            return check_name(str(value))
        except ParameterError as exc:
            self.fail(str(exc), param, ctx)


USER_NAME = UserName()
# A password is a line of text: standard input is read no further than this (a pipe from
# /dev/zero must not fill memory).
MAX_PASSWORD_BYTES = 4096

users_file_option = click.option(
    "--users-file",
    "users_file",
    envvar="DPSQL_USERS_FILE",
    show_envvar=True,
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The users file of dpsql serve (JSON, mode 0600).",
)
password_stdin_option = click.option(
    "--password-stdin",
    is_flag=True,
    help="Read the password from standard input (less one trailing newline) instead of "
    "prompting for it twice.",
)


def _password(from_stdin: bool) -> str:
    """The new password: from standard input, or typed twice at a hidden prompt."""
    if from_stdin:
        text = read_limited(sys.stdin.buffer, MAX_PASSWORD_BYTES, "the password on standard input")
        password = text.removesuffix("\n").removesuffix("\r")
    else:
        password = click.prompt(
            "Password", hide_input=True, confirmation_prompt="Repeat the password"
        )
    if not password:
        raise click.BadParameter("the password must not be empty", param_hint="password")
    return password


class UsersGroup(click.Group):
    """Maps a dpsql error to one line on stderr and its code in ``cli.EXIT_CODES``, as the
    ``dpsql`` group does, so that ``users`` behaves the same when it is invoked on its own."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except DpsqlError as exc:
            fail(ctx, f"{type(exc).__name__}: {exc}", exit_code(exc))


@click.group("users", cls=UsersGroup)
def users() -> None:
    """The users of dpsql serve: add, remove, change passwords, list.

    The file holds each user's role and SCRAM-SHA-256 verifier, never a password.
    """


@users.command()
@click.argument("name", type=USER_NAME)
@click.option(
    "--role",
    type=click.Choice(ROLES),
    default="analyst",
    show_default=True,
    help="owner: the data owner, who may also read the owner-only settings (SHOW dpsql.ledger); "
    "analyst: queries only.",
)
@password_stdin_option
@users_file_option
def add(name: str, role: str, password_stdin: bool, users_file: Path) -> None:
    """Add user NAME with a new password.

    Creates the users file (mode 0600) if it does not exist yet.
    """
    password = _password(password_stdin)
    user = add_user(users_file, name, password, cast(Role, role))
    click.echo(f"added user {user.name} ({user.role}) to {users_file}")


@users.command()
@click.argument("name", type=USER_NAME)
@users_file_option
def remove(name: str, users_file: Path) -> None:
    """Remove user NAME.

    A running dpsql serve read the file when it started: restart it for the change to apply.
    """
    remove_user(users_file, name)
    click.echo(f"removed user {name} from {users_file}")


@users.command()
@click.argument("name", type=USER_NAME)
@password_stdin_option
@users_file_option
def passwd(name: str, password_stdin: bool, users_file: Path) -> None:
    """Give user NAME a new password (and a new salt).

    A running dpsql serve read the file when it started: restart it for the change to apply.
    """
    if name not in load_users(users_file):  # before asking for a password that would be lost
        raise ParameterError(f"there is no user {name!r}")
    set_password(users_file, name, _password(password_stdin))
    click.echo(f"changed the password of {name} in {users_file}")


@users.command("list")
@users_file_option
def list_users(users_file: Path) -> None:
    """List the users: name and role, tab-separated.

    One line per user, sorted by name; verifiers are never printed.
    """
    for user in sorted(load_users(users_file).values(), key=lambda u: u.name):
        click.echo(f"{user.name}\t{user.role}")


__all__ = ["users"]
