"""The ``dpsql`` command: one click group over the policy, its ledger and its budget.

Options that name the deployment are backed by environment variables (``--policy`` /
``DPSQL_POLICY``, ``--analyst`` / ``DPSQL_ANALYST``), so a shell profile can set them once.
Privacy parameters are read by custom parameter types as exact rationals from their decimal
text (``0.1`` is exactly 1/10), so a bad epsilon is a usage error before anything is opened.

Errors map to exit codes in one table, ``EXIT_CODES`` (documented in ``docs/cli.md`` and in
``dpsql --help``). An error prints one line to stderr: the dpsql message, which names the
construct and never a data value, and never a traceback. An unexpected exception is a dpsql
bug: only its class name is printed (its message might quote data), with exit code 70.

The table, the group's ``Config`` and its ``--policy`` / ``--analyst`` options are defined in
``context.py``, which the command modules registered here import instead of this one; they are
re-exported here, as are the parameter types (``cli_params.py``) and ``dpsql init`` and
``dpsql ledger`` (``ledger_cli.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any, NoReturn

import click

from dpsql.accounting.budget.budget import Budget
from dpsql.accounting.budget.build import budget_for
from dpsql.accounting.budget.report import cap_text
from dpsql.errors import DpsqlError
from dpsql.interfaces.cli.batch import explain_command, query_command, run_command
from dpsql.interfaces.cli.blocks import blocks
from dpsql.interfaces.cli.budget_view import (
    CHART,
    COMPARE,
    OVERRIDES,
    demo_command,
    show_command,
)
from dpsql.interfaces.cli.check import EXIT_FINDINGS, check_command
from dpsql.interfaces.cli.context import (
    ANALYST_OPTION,
    EXIT_INTERNAL,
    EXIT_OK,
    EXIT_USAGE,
    POLICY_OPTION,
    Config,
    exit_code,
    fail,
    pass_config,
)
from dpsql.interfaces.cli.ledger import _write, init, ledger, open_ledger
from dpsql.interfaces.cli.params import (
    DELTA,
    EPSILON,
    TEXT,
    _decimal,
)
from dpsql.interfaces.cli.serve import serve_command
from dpsql.interfaces.cli.users import users
from dpsql.interfaces.cli.views import views_group
from dpsql.interfaces.cli.web import web_command
from dpsql.interfaces.cli.whatif import whatif_command
from dpsql.interfaces.report.charts import history_curves
from dpsql.interfaces.report.html import render_html
from dpsql.interfaces.report.markdown import render_markdown
from dpsql.interfaces.report.report import build_report, render_json
from dpsql.interfaces.shell.shell import shell_command
from dpsql.policy import MAX_TOTAL_EPSILON, Policy

_MEANINGS = {
    EXIT_OK: "success",
    EXIT_FINDINGS: "dpsql check only: findings that do not stop the data from serving",
    EXIT_USAGE: "usage error: unknown command or option, bad option value, an input file that "
    "cannot be read or is too large (InputError), an output file that cannot be written "
    "(OutputError)",
    3: "query rejected (QueryError); nothing was charged",
    4: "budget exceeded (BudgetExceededError); nothing was charged",
    5: "engine error (EngineError); the charge stays",
    6: "ledger failure or tampering (LedgerError); nothing was released",
    7: "policy invalid or unreadable (PolicyError)",
    8: "secure randomness unavailable (EntropyError)",
    EXIT_INTERNAL: "internal error: a dpsql bug (InternalError or any unexpected exception)",
}


def _epilog() -> str:
    lines = ["\b", "Exit codes:"]
    lines += [f"  {code:>2}  {meaning}" for code, meaning in sorted(_MEANINGS.items())]
    return "\n".join(lines)


# -- the group and its context ----------------------------------------------------------------
class DpsqlGroup(click.Group):
    """Maps every error raised by a command to its exit code and one line on stderr."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except DpsqlError as exc:
            fail(ctx, f"{type(exc).__name__}: {exc}", exit_code(exc))
        except Exception as exc:
            # Only the class name: the message of an unexpected error may quote data.
            message = f"internal error ({type(exc).__name__}); please report this dpsql bug"
            fail(ctx, message, EXIT_INTERNAL)


@click.group(
    cls=DpsqlGroup,
    params=[POLICY_OPTION, ANALYST_OPTION],
    epilog=_epilog(),
    context_settings={"max_content_width": 100},
)
@click.version_option(package_name="dpsql")
@click.pass_context
def cli(ctx: click.Context, policy_path: Path | None, analyst: str | None) -> None:
    """dpsql: differentially private SQL over a policy, its ledger and its budget."""
    ctx.obj = Config(policy_path, analyst)


def _budget(policy: Policy) -> Budget:
    return budget_for(policy.dataset.id, policy.budget, open_ledger(policy), policy.periods)


# -- commands ---------------------------------------------------------------------------------
@cli.group(invoke_without_command=True)
@CHART
@COMPARE
@OVERRIDES
@click.pass_context
def budget(ctx: click.Context, chart: Path | None, compare: bool, overrides: bool) -> None:
    """The budget: show it, ask what-if, and (owners) top it up or set analysts' shares.

    Without a subcommand, the same as `dpsql budget show` (with its options).
    """
    if ctx.invoked_subcommand is None:
        ctx.invoke(show_command, chart=chart, compare=compare, overrides=overrides)
    else:
        given_options = ((chart is not None, "--chart"), (compare, "--compare"),
                         (overrides, "--overrides"))  # fmt: skip
        for given, name in given_options:
            if given:
                raise click.UsageError(f"{name} goes with `dpsql budget` or `dpsql budget show`")


@budget.command()
@click.option("--epsilon", type=EPSILON, required=True, help="Epsilon to add to the total.")
@click.option("--delta", type=DELTA, required=True, help="Delta to add to the total (may be 0).")
@click.option("--by", type=TEXT, help="Who grants the top-up (default: --analyst).")
@click.option("--why", type=TEXT, required=True, help="Why (kept in the ledger).")
@pass_config
def add(config: Config, epsilon: Fraction, delta: Fraction, by: str | None, why: str) -> None:
    """Top up the data set's budget (Budget.add)."""
    by = config.actor(by)
    policy = config.policy()
    owned = _budget(policy)
    before = owned.report()
    if before.epsilon_total + epsilon > MAX_TOTAL_EPSILON:
        raise click.BadParameter(
            f"the total epsilon would exceed {MAX_TOTAL_EPSILON}", param_hint="'--epsilon'"
        )
    if before.delta_total + delta >= 1:
        raise click.BadParameter("the total delta would reach 1", param_hint="'--delta'")
    record = owned.add(epsilon, delta, by, why)
    after = owned.report()
    click.echo(
        f"record {record.seq}: budget of {policy.dataset.id} is now epsilon "
        f"{cap_text(after.epsilon_total)}, delta {cap_text(after.delta_total)}"
    )
    if after.adaptive_cap is not None:
        # A cap chosen after answers is no filter's guarantee (BudgetReport.adaptive_cap).
        click.echo(
            "the cap was raised after answers were seen: it is not a guarantee; "
            "`dpsql budget show` states what holds"
        )


@budget.command()
@click.argument("analyst", type=TEXT)
@click.option("--epsilon", type=EPSILON, required=True, help="The analyst's epsilon share.")
@click.option("--delta", type=DELTA, default="0", show_default=True, help="Their delta share.")
@click.option("--by", type=TEXT, help="Who sets the share (default: --analyst).")
@click.option("--why", type=TEXT, required=True, help="Why (kept in the ledger).")
@pass_config
def allocate(
    config: Config, *, analyst: str, epsilon: Fraction, delta: Fraction, by: str | None, why: str
) -> None:
    """Set ANALYST's share of the budget (Budget.allocate), replacing any earlier one."""
    by = config.actor(by)
    policy = config.policy()
    owned = _budget(policy)
    total = owned.report()
    if epsilon > total.epsilon_total or delta > total.delta_total:
        raise click.BadParameter(
            "a share must lie within the total budget", param_hint="'--epsilon' / '--delta'"
        )
    if policy.budget.needs_delta and delta == 0:
        raise click.BadParameter(
            f"the {policy.budget.accountant} filter needs a delta share > 0",
            param_hint="'--delta'",
        )
    record = owned.allocate(analyst, epsilon, delta, by, why)
    shown = f"epsilon {_decimal(epsilon)}, delta {_decimal(delta)}"
    click.echo(f"record {record.seq}: {analyst} may spend {shown}")


@cli.command()
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["markdown", "json", "html"]),
    default="markdown",
    show_default=True,
    help="Markdown for people, JSON for programs (exact numbers as strings), or a "
    "self-contained HTML page with the budget chart.",
)
@click.option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write to this file instead of standard output.",
)
@pass_config
def report(config: Config, fmt: str, output: Path | None) -> None:
    """The privacy contract of the data set: budget, adjacency, bounds, accountants, schedule."""
    policy = config.policy()
    owned = _budget(policy)
    data = build_report(policy, owned)
    if fmt == "html":
        text = render_html(data, history_curves(owned))
    else:
        text = render_json(data) if fmt == "json" else render_markdown(data)
    _write(text, output)


cli.add_command(init)  # dpsql init
cli.add_command(ledger)  # dpsql ledger verify|export|pin-budget
budget.add_command(show_command)  # dpsql budget show
budget.add_command(whatif_command)  # dpsql budget what-if
cli.add_command(demo_command)  # dpsql demo
cli.add_command(check_command)  # dpsql check


cli.add_command(shell_command)  # dpsql shell
cli.add_command(run_command, "run")  # dpsql run FILE.sql
cli.add_command(explain_command, "explain")  # dpsql explain "SQL"
cli.add_command(query_command, "query")  # dpsql query "SQL"
cli.add_command(serve_command, "serve")  # dpsql serve --users-file F
cli.add_command(users, "users")  # dpsql users add|remove|passwd|list
cli.add_command(blocks, "blocks")  # dpsql blocks add|replace|list
cli.add_command(views_group, "views")  # dpsql views plan|add|list
cli.add_command(web_command, "web")  # dpsql web --users-file F


def walk(group: click.Group, prefix: str = "dpsql") -> Iterator[tuple[str, click.Command]]:
    """Every command under ``group`` with its full name, the group first (for the docs test)."""
    yield prefix, group
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from walk(command, f"{prefix} {name}")
        else:
            yield f"{prefix} {name}", command


def main(argv: list[str] | None = None) -> NoReturn:
    """The console script: ``dpsql``."""
    # Exceptions in click itself (before a command runs) still must not print a traceback.
    try:
        cli.main(args=argv, prog_name="dpsql", standalone_mode=True)
    except SystemExit:
        raise
    except Exception as exc:  # pragma: no cover - click's own failures
        click.echo(f"Error: internal error ({type(exc).__name__})", err=True)
        sys.exit(EXIT_INTERNAL)
    sys.exit(EXIT_OK)  # pragma: no cover - cli.main exits in standalone mode


__all__ = ["cli", "main"]


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
