"""``dpsql views``: continual-release views of a table of periods (``dpsql.session.views``).

``plan`` shows, charging nothing, how a view would be released: the mechanism each horizon
gives, the mean ± of a range under each mechanism, and what a period and a person would pay.
``add`` declares a view and reserves its cost in every period of its calendar (refused, with
nothing recorded, when the reservation does not fit). ``list`` prints the views declared.
Reading a view is a statement: ``dpsql query "VIEW name"`` or ``VIEW name FROM ... TO ...``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from fractions import Fraction

import click

from dpsql.accounting.ledger.views import view_values, views
from dpsql.errors import DpsqlError
from dpsql.interfaces.cli.context import Config, exit_code, fail, pass_config
from dpsql.interfaces.cli.params import TEXT
from dpsql.policy.numbers import decimal_text, to_fraction
from dpsql.session import views as session_views
from dpsql.session.session import Session

__all__ = ["views_group"]

_SQL = click.argument("sql", type=TEXT)
_HORIZON = click.option("--horizon", type=click.IntRange(1, 256), required=True,
                        help="How many periods the view is released over.")  # fmt: skip
_EPSILON = click.option("--epsilon", type=TEXT, required=True,
                        help="What each period pays per person-period.")  # fmt: skip
_DELTA = click.option("--delta", type=TEXT, default=None, help="Its delta (Gaussian noise).")
_MECHANISM = click.option(
    "--mechanism", type=click.Choice(["auto", "plain", "tree", "factorization"]),
    default="auto", show_default=True,
    help="auto: the smallest mean ± over the ranges of the horizon.",
)  # fmt: skip


@click.group("views")
def views_group() -> None:
    """Continual-release views: plan one, declare one, list them."""


def _fraction(text: str | None, name: str) -> Fraction | None:
    return None if text is None else to_fraction(text, name)


@contextmanager
def _session(ctx: click.Context, config: Config) -> Iterator[Session]:
    """A session of the policy, closed after; a ``DpsqlError`` opening or using it is one line
    on stderr and its exit code."""
    try:
        session = Session(config.policy(), config.analyst)
    except DpsqlError as exc:
        fail(ctx, f"{type(exc).__name__}: {exc}", exit_code(exc))
    try:
        yield session
    except DpsqlError as exc:
        fail(ctx, f"{type(exc).__name__}: {exc}", exit_code(exc))
    finally:
        session.close()


@views_group.command("plan")
@_SQL
@_HORIZON
@_EPSILON
@_DELTA
@_MECHANISM
@pass_config
@click.pass_context
def plan_command(  # noqa: PLR0917 - click passes every option
    ctx: click.Context, config: Config, sql: str, horizon: int, epsilon: str,
    delta: str | None, mechanism: str,
) -> None:  # fmt: skip
    """How a view of SQL would be released over --horizon periods; nothing is charged."""
    with _session(ctx, config) as session:
        eps = _fraction(epsilon, "--epsilon")
        assert eps is not None
        lines = session_views.plan_lines(session, sql, horizon=horizon, epsilon=eps,
                                         delta=_fraction(delta, "--delta"),
                                         mechanism=mechanism)  # fmt: skip
        click.echo("\n".join(lines))


@views_group.command("add")
@click.argument("name", type=TEXT)
@_SQL
@click.option("--start", type=TEXT, required=True, help="The first period's first day.")
@click.option("--every", type=click.Choice(["day", "week", "month"]), required=True,
              help="How long each period is.")  # fmt: skip
@_HORIZON
@_EPSILON
@_DELTA
@_MECHANISM
@click.option("--by", type=TEXT, help="Who declares it (default: --analyst).")
@pass_config
@click.pass_context
def add_command(  # noqa: PLR0917 - click passes every option
    ctx: click.Context, config: Config, name: str, sql: str, start: str, every: str,
    horizon: int, epsilon: str, delta: str | None, mechanism: str, by: str | None,
) -> None:  # fmt: skip
    """Declare view NAME of SQL over a calendar and reserve its cost in every period."""
    actor = config.actor(by)
    with _session(ctx, config) as session:
        eps = _fraction(epsilon, "--epsilon")
        assert eps is not None
        view = session_views.declare(
            session, name, sql, start=start, every=every, horizon=horizon, epsilon=eps,
            delta=_fraction(delta, "--delta"), mechanism=mechanism, by=actor,
        )  # fmt: skip
        click.echo(f"record {view.seq}: view {view.name}, {view.mechanism} over {horizon} "
                   f"{every}(s) from {start}; reserved by charge {view.charge}")  # fmt: skip


@views_group.command("list")
@pass_config
@click.pass_context
def list_command(ctx: click.Context, config: Config) -> None:
    """Every view declared, its calendar and how many values it has released."""
    with _session(ctx, config) as session:
        records = session.filter.store.records()
        found = views(records)
        if not found:
            click.echo("no view is declared")
        for view in found.values():
            c = view.calendar
            click.echo(f"{view.name}: {view.mechanism}, {c.horizon} {c.every}(s) from "
                       f"{c.start}, epsilon {decimal_text(view.epsilon)} per period; "
                       f"{len(view_values(records, view.name))} value(s) released; "
                       f"by {view.by}: {view.sql}")  # fmt: skip
