"""What every ``dpsql`` command shares: the group's ``Config``, its options, the exit codes.

The commands of the ``dpsql`` group live in several modules (``cli.py`` and the ones it
registers: ``batch.py``, ``shell.py``, ``serve_cli.py``, ``users_cli.py``, ``budget_view.py``).
They take the group's ``Config`` (``pass_config``), map errors to exit codes (``exit_code``,
``fail``), and the standalone shell reuses the group's ``--policy`` and ``--analyst`` options.
All of that is here, in a module that imports none of them, so that ``cli.py`` can import the
commands it registers without an import cycle; ``cli.py`` re-exports these names.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import click

from dpsql.errors import (
    BudgetExceededError,
    DpsqlError,
    EngineError,
    EntropyError,
    InputError,
    InternalError,
    LedgerError,
    OutputError,
    PolicyError,
    QueryError,
)
from dpsql.policy import Policy, load_policy

__all__ = [
    "ANALYST_OPTION",
    "EXIT_CODES",
    "EXIT_INTERNAL",
    "EXIT_OK",
    "EXIT_USAGE",
    "POLICY_OPTION",
    "Config",
    "exit_code",
    "fail",
    "pass_config",
]

EXIT_OK = 0
EXIT_USAGE = 2  # click's own code for usage errors; also bad option values
EXIT_INTERNAL = 70  # EX_SOFTWARE (sysexits.h): a dpsql bug
# The one table: the first class in an error's MRO found here gives its code.
EXIT_CODES: dict[type[DpsqlError], int] = {
    # A file that cannot be read or written is the caller's to fix, like a bad option value.
    InputError: EXIT_USAGE,
    OutputError: EXIT_USAGE,
    QueryError: 3,
    BudgetExceededError: 4,
    EngineError: 5,
    LedgerError: 6,
    PolicyError: 7,
    EntropyError: 8,
    InternalError: EXIT_INTERNAL,
}


def exit_code(error: BaseException) -> int:
    """The exit code of an error under ``EXIT_CODES`` (70 for anything unexpected)."""
    for cls in type(error).__mro__:
        if cls in EXIT_CODES:
            return EXIT_CODES[cls]
    return EXIT_INTERNAL


def fail(ctx: click.Context, message: str, code: int) -> NoReturn:
    """One line on stderr, then exit with ``code``."""
    click.echo("Error: " + " ".join(message.split()), err=True)
    ctx.exit(code)


# -- the group's options and context ----------------------------------------------------------
# One object each, shared by the ``dpsql`` group and the standalone shell.
POLICY_OPTION = click.Option(
    ["--policy", "policy_path"],
    envvar="DPSQL_POLICY",
    type=click.Path(dir_okay=False, path_type=Path),
    show_envvar=True,
    help="The policy TOML file (its [ledger] section names the ledger).",
)
ANALYST_OPTION = click.Option(
    ["--analyst"],
    envvar="DPSQL_ANALYST",
    show_envvar=True,
    help="Who is acting (self-declared): the default of the owner commands' --by.",
)


@dataclass
class Config:
    """The group's options; the policy is loaded only by the command that needs it."""

    policy_path: Path | None
    analyst: str | None

    def policy(self, ledger: bool = True) -> Policy:
        """The policy; ``ledger``: it must name a ledger (every command that spends, reports or
        administers the budget; not ``explain``, which charges nothing)."""
        if self.policy_path is None:
            raise click.UsageError("give --policy or set DPSQL_POLICY")
        policy = load_policy(self.policy_path)
        if ledger and policy.ledger is None:
            raise PolicyError("the policy has no [ledger] section; the dpsql command needs one")
        return policy

    def actor(self, by: str | None) -> str:
        """Who does an owner action: ``--by``, else the group's ``--analyst``."""
        name = by if by is not None else self.analyst
        if name is None or not name.strip():
            raise click.UsageError("give --by (or --analyst / DPSQL_ANALYST)")
        return " ".join(name.split())


pass_config = click.make_pass_decorator(Config)
