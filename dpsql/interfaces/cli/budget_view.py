"""``dpsql budget show`` and ``dpsql demo``, and what every budget screen shares.

``show`` reads the verified ledger and leads with one line (``str(BudgetReport)``: the deciding
filter's spent and left, the analyst's share), then what decides; ``--compare`` unfolds the
same history under every accountant side by side (``Budget.report().figures``): what each proves
spent, and what that leaves of the cap. Only the deciding filter's reading is the guarantee;
figures that hold only for parameters fixed before the first query are labelled so. ``--chart``
draws the composition curves of the actual history (``charts.history_curves``); ``--overrides``
lists the charges that ran on bounds other than the policy's (``dpsql.interfaces.report.audit``).
``what-if`` is ``dpsql.interfaces.cli.whatif``.

These are click commands for the ``dpsql`` group (``cli.py`` registers them); they read the
group's ``Config`` (``context.py``) from the context object and never import ``cli`` (no import
cycle). The arithmetic of what-if (the hypothetical ``Query``, ``whatif_fits``, ``fit_count``,
``after_n`` and the labels) is in ``dpsql.interfaces.report.whatif``, and every list of
accountants in ``dpsql.accounting.registry``.
"""

from __future__ import annotations

import importlib.util
import io
import math
import shutil
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.table import Table

from dpsql.accounting import registry
from dpsql.accounting.budget.budget import Budget
from dpsql.accounting.budget.build import budget_for
from dpsql.accounting.budget.report import (
    EXCEEDS,
    UNBOUNDED,
    BudgetReport,
    cap_text,
    figure_left,
    figure_value,
    spent_text,
)
from dpsql.accounting.ledger.blocks import block_list
from dpsql.accounting.ledger.store import open_store
from dpsql.errors import LedgerError, ParameterError
from dpsql.interfaces.cli.blocks import block_lines
from dpsql.interfaces.report.audit import audit, audit_lines
from dpsql.interfaces.report.charts import (
    chart_format,
    history_curves,
    write_chart,
)
from dpsql.interfaces.report.markdown import EXCEEDS_MEANING
from dpsql.interfaces.report.periods import period_lines, periods_data
from dpsql.interfaces.report.report import NOTES, iso_time

if TYPE_CHECKING:
    from dpsql.interfaces.cli.context import Config

__all__ = ["COMPARE", "OVERRIDES", "compare_line", "demo_command", "show_command"]

# A discrete Laplace of scale above 2**56 cannot be sampled exactly, so a query cannot ask for it
# (the session refuses it before the charge); the accountants' curves of such an epsilon lose
# every digit of their working precision (1 - e^(-epsilon) rounds to 0).
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
DEMO_USERS = 50_000  # make_data.py's default: the data `make demo` builds


# -- shared -----------------------------------------------------------------------------------
def open_budget(config: Config) -> Budget:
    """The policy's budget over its verified ledger (the data set's own, else LedgerError)."""
    policy = config.policy()
    store = open_store(policy)
    if store.identity.get("dataset") != policy.dataset.id:
        raise LedgerError("the ledger belongs to another data set than the policy names")
    return budget_for(policy.dataset.id, policy.budget, store, policy.periods)


def render(*items: Any) -> str:
    """Rich renderables as plain text, as wide as the terminal (at least 100 columns)."""
    width = max(100, shutil.get_terminal_size((100, 24)).columns)
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, color_system=None, highlight=False)
    for item in items:
        console.print(item)
    return buffer.getvalue()


def number(value: float) -> str:
    return f"{value:.6g}" if math.isfinite(value) else UNBOUNDED


def spent_number(value: float) -> str:
    """A figure's epsilon spent: rounded up (never understated), as the heading's."""
    return spent_text(figure_value(value)) if math.isfinite(value) else UNBOUNDED


def _chart_path(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    if value is not None:
        try:
            chart_format(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc), ctx, param) from None
    return value


def _exact(check: Callable[[str], Fraction]) -> Callable[..., Fraction | None]:
    """A click callback reading an exact rational through a dpsql check."""

    def callback(ctx: click.Context, param: click.Parameter, value: str | None) -> Fraction | None:
        if value is None:
            return None
        try:
            return check(value)
        except ParameterError as exc:
            raise click.BadParameter(str(exc), ctx, param) from None

    return callback


CHART = click.option(
    "--chart",
    type=click.Path(dir_okay=False, path_type=Path),
    callback=_chart_path,
    help="Also draw the curves to this file: FILE.png or FILE.svg.",
)


# -- show -------------------------------------------------------------------------------------
def show_table(report: BudgetReport) -> Table:
    """Every accountant's reading of the history beside what it leaves of the cap."""
    table = Table(
        title=f"Budget of data set {report.dataset}: "
        f"epsilon at delta = {cap_text(report.delta_total)}",
        title_justify="left",
    )
    table.add_column("accountant")
    table.add_column("epsilon spent", justify="right")
    table.add_column(f"epsilon remaining of {cap_text(report.epsilon_total)}", justify="right")
    table.add_column("label")
    for figure in report.figures:
        table.add_row(
            figure.accountant,
            spent_number(figure.epsilon),
            figure_left(figure, report.epsilon_total),
            figure.note,
        )
    return table


def compare_line(report: BudgetReport, how: str) -> str:
    """The one line the other accountants fold under (``how``: the flag or command that
    unfolds them)."""
    others = [r.name for r in registry.entries() if r.name != report.accountant]
    return (
        f"compare theorems: {how} reads the same history under {', '.join(others)} "
        "(none of them decides)"
    )


def show_text(report: BudgetReport, compare: bool = False) -> str:
    """The budget screen: the lead line (``str(report)``: the deciding filter's spent and left,
    the analyst's share), what decides, then every accountant's reading with ``compare``, else
    the one line they fold under."""
    lines = [
        str(report),
        f"The {report.accountant} filter decides admission; its cap is the guarantee.",
    ]
    if report.adaptive_cap is not None and report.valid_adaptively is not None:
        eps, delta = report.valid_adaptively
        lines[1] = f"The {report.accountant} filter decides admission."
        lines.append(
            f"Adaptive cap: raised after answers were seen (ledger record {report.adaptive_cap}), "
            "so the cap is not a guarantee; valid adaptively, by basic composition of the "
            f"charges: epsilon {spent_text(eps)}, delta {spent_text(delta)}."
        )
    tail = []
    if not report.durable:
        tail.append("This budget lives in memory: it resets when the process ends.")
    if not compare:
        lines.append(compare_line(report, "--compare"))
        return "\n".join(lines + tail) + "\n"
    labels = [f"  {note}: {meaning}" for note, meaning in NOTES.items()]
    labels.append(f"  {EXCEEDS}: {EXCEEDS_MEANING}")
    body = "\n".join([*lines, ""]) + "\n" + render(show_table(report))
    return body + "\n".join(["", "Labels:", *labels, *tail]) + "\n"


COMPARE = click.option(
    "--compare",
    is_flag=True,
    help="Also read the same history under every other accountant (compare theorems).",
)
OVERRIDES = click.option(
    "--overrides",
    is_flag=True,
    help="Also list each charge whose query ran on bounds other than the policy's, with who.",
)


@click.command("show")
@CHART
@COMPARE
@OVERRIDES
@click.pass_obj
def show_command(
    config: Config, chart: Path | None, compare: bool = False, overrides: bool = False
) -> None:
    """Spent and remaining budget (with --analyst, their share too); nothing is charged."""
    budget = open_budget(config)
    lifetime = periods_data(config.policy(), budget)
    if lifetime is not None:
        # A person-within-period unit: the lifetime cap per person leads, then each period.
        click.echo("\n".join(period_lines(lifetime)) + "\n")
    click.echo(show_text(budget.report(config.analyst), compare), nl=False)
    if overrides:
        records = budget.store.records()
        found = audit(records, {r.seq: iso_time(r.time) for r in records})
        click.echo("\nOverrides of the policy's bounds:")
        click.echo("\n".join(audit_lines(found)))
    listed = block_list(records := budget.store.records())
    if listed.registered:
        # The tables made of blocks: each block, and the releases a replacement retired.
        click.echo("\nBlocks:")
        click.echo("\n".join(block_lines(records, listed)))
    if chart is not None:
        write_chart(history_curves(budget), chart)
        click.echo(f"chart: {chart}")


# -- demo -------------------------------------------------------------------------------------
def load(path: Path) -> ModuleType:
    """A Python file as a module (the examples are not part of the installed package)."""
    spec = importlib.util.spec_from_file_location(f"dpsql_examples_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise click.BadParameter(f"cannot load {path.name}", param_hint="'--examples'")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@click.command("demo")
@click.option(
    "--examples",
    type=click.Path(file_okay=False, path_type=Path),
    default=EXAMPLES,
    show_default="the checkout's examples/",
    help="The folder holding demo.py, make_data.py and policy.toml.",
)
def demo_command(examples: Path) -> None:
    """Run the demo on the example data (as `make demo`), generating the data if missing."""
    demo = examples / "demo.py"
    if not demo.is_file():
        raise click.BadParameter(
            f"no demo.py in {examples} (dpsql demo runs from a source checkout)",
            param_hint="'--examples'",
        )
    data = examples / "data" / "visits.parquet"
    if not data.exists():
        click.echo(f"generating the example data in {data} ...")
        load(examples / "make_data.py").write_visits(data, DEMO_USERS)
    load(demo).main()
