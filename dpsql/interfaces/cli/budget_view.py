"""``dpsql budget show``, ``dpsql budget what-if`` and ``dpsql demo``.

``show`` reads the verified ledger and prints the same history under every accountant side by
side (``Budget.report().figures``): what each proves spent, and what that leaves of the cap.
Only the deciding filter's reading is the guarantee; figures that hold only for parameters fixed
before the first query are labelled so. ``--chart`` draws the composition curves of the actual
history (``charts.history_curves``).

``what-if`` asks the same accountants about N identical hypothetical queries before anything is
spent: their epsilon after N queries, and how many of them the remaining (epsilon, delta) holds
under each theorem. It charges nothing and writes nothing to the ledger. A Gaussian query has no
single (epsilon, delta) of its own, so basic and advanced composition read each one at the
(epsilon_0, delta_0) its exact curve gives for an equal share delta_0 of the delta they may use.

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

from dpsql.accounting.budget.budget import Budget
from dpsql.accounting.budget.build import budget_for
from dpsql.accounting.budget.report import (
    EXCEEDS,
    BudgetReport,
    cap_text,
    figure_left,
    figure_value,
    left_text,
    spent_text,
)
from dpsql.accounting.ledger.store import open_store
from dpsql.errors import LedgerError, ParameterError
from dpsql.interfaces.report.audit import audit, audit_lines
from dpsql.interfaces.report.charts import (
    chart_format,
    composite_curves,
    history_curves,
    write_chart,
)
from dpsql.interfaces.report.markdown import EXCEEDS_MEANING
from dpsql.interfaces.report.report import NOTES, iso_time
from dpsql.interfaces.report.whatif import (
    MAX_FIT,
    Query,
    after_n,
    fit_count,
    whatif_fits,
    whatif_label,
)
from dpsql.mechanisms.events import Composite
from dpsql.policy import MAX_QUERY_EPSILON, check_delta, check_epsilon
from dpsql.session.settings import check_setting

if TYPE_CHECKING:
    from dpsql.interfaces.cli.context import Config

__all__ = ["demo_command", "show_command", "whatif_command"]

MAX_WHATIF_QUERIES = 100_000
# A discrete Laplace of scale above 2**56 cannot be sampled exactly, so a query cannot ask for it
# (the session refuses it before the charge); the accountants' curves of such an epsilon lose
# every digit of their working precision (1 - e^(-epsilon) rounds to 0).
SMALLEST_WHATIF_EPSILON = Fraction(1, 2**56)
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
DEMO_USERS = 50_000  # make_data.py's default: the data `make demo` builds


# -- shared -----------------------------------------------------------------------------------
def open_budget(config: Config) -> Budget:
    """The policy's budget over its verified ledger (the data set's own, else LedgerError)."""
    policy = config.policy()
    store = open_store(policy)
    if store.identity.get("dataset") != policy.dataset.id:
        raise LedgerError("the ledger belongs to another data set than the policy names")
    return budget_for(policy.dataset.id, policy.budget, store)


def render(*items: Any) -> str:
    """Rich renderables as plain text, as wide as the terminal (at least 100 columns)."""
    width = max(100, shutil.get_terminal_size((100, 24)).columns)
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, color_system=None, highlight=False)
    for item in items:
        console.print(item)
    return buffer.getvalue()


def number(value: float) -> str:
    return f"{value:.6g}" if math.isfinite(value) else "∞ (unbounded)"


def spent_number(value: float) -> str:
    """A figure's epsilon spent: rounded up (never understated), as the heading's."""
    return spent_text(figure_value(value)) if math.isfinite(value) else "∞ (unbounded)"


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


def show_text(report: BudgetReport) -> str:
    labels = [f"  {note}: {meaning}" for note, meaning in NOTES.items()]
    labels.append(f"  {EXCEEDS}: {EXCEEDS_MEANING}")
    lines = [
        f"The {report.accountant} filter decides admission; its cap is the guarantee.",
        f"Deciding filter: epsilon {spent_text(report.epsilon_spent)} spent of "
        f"{cap_text(report.epsilon_total)} ({left_text(report.epsilon_remaining)} remaining); "
        f"delta {spent_text(report.delta_spent)} spent of {cap_text(report.delta_total)} "
        f"({left_text(report.delta_remaining)} remaining); {report.queries} charged queries.",
        "",
    ]
    if report.adaptive_cap is not None and report.valid_adaptively is not None:
        eps, delta = report.valid_adaptively
        lines[0] = f"The {report.accountant} filter decides admission."
        lines[-1:-1] = [
            f"Adaptive cap: raised after answers were seen (ledger record {report.adaptive_cap}), "
            "so the cap is not a guarantee; valid adaptively, by basic composition of the "
            f"charges: epsilon {spent_text(eps)}, delta {spent_text(delta)}."
        ]
    tail = ["", "Labels:", *labels]
    if not report.durable:
        tail.append("This budget lives in memory: it resets when the process ends.")
    return "\n".join(lines) + "\n" + render(show_table(report)) + "\n".join(tail) + "\n"


OVERRIDES = click.option(
    "--overrides",
    is_flag=True,
    help="Also list each charge whose query ran on bounds other than the policy's, with who.",
)


@click.command("show")
@CHART
@OVERRIDES
@click.pass_obj
def show_command(config: Config, chart: Path | None, overrides: bool = False) -> None:
    """Spent and remaining budget under every accountant, side by side (nothing is charged)."""
    budget = open_budget(config)
    click.echo(show_text(budget.report()), nl=False)
    if overrides:
        records = budget.store.records()
        found = audit(records, {r.seq: iso_time(r.time) for r in records})
        click.echo("\nOverrides of the policy's bounds:")
        click.echo("\n".join(audit_lines(found)))
    if chart is not None:
        write_chart(history_curves(budget), chart)
        click.echo(f"chart: {chart}")


# -- what-if ----------------------------------------------------------------------------------
def whatif_text(
    query: Query, n: int, delta: Fraction, report: BudgetReport, counts: dict[str, int]
) -> str:
    eps_n = after_n(query, n, float(delta))
    table = Table(
        title=f"{n} queries, each a {query.describe()}; epsilon at delta {cap_text(delta)}",
        title_justify="left",
    )
    table.add_column("theorem")
    table.add_column(f"epsilon after {n}", justify="right")
    table.add_column("how many fit the remaining", justify="right")
    table.add_column("label")
    for name, count in counts.items():
        shown = f"at least {count}" if count >= MAX_FIT else str(count)
        table.add_row(name, number(eps_n[name]), shown, whatif_label(name))
    head = [
        f"Remaining budget of data set {report.dataset}: epsilon "
        f"{left_text(report.epsilon_remaining)}, delta {left_text(report.delta_remaining)} "
        f"(the {report.accountant} filter decides).",
        "Counts read the remaining (epsilon, delta) as the budget of these queries alone; the "
        f"{report.accountant} filter decides what is actually admitted.",
    ]
    if not query.pure():
        head.append(
            "A Gaussian has no single (epsilon, delta): basic and advanced composition read each "
            "query at the (epsilon_0, delta_0) of its exact curve, delta_0 an equal share of "
            "their delta (delta/(2N) for the curves)."
        )
    tail = (
        "Advanced composition keeps delta' = half the remaining delta for its own term; the "
        "queries' deltas share the other half.\nNothing was charged.\n"
    )
    return "\n".join(head) + "\n\n" + render(table) + tail


def _views(query: Query, n: int, delta: float) -> Callable[[int], list[list[Composite]]]:
    event = query.event(delta / (2 * n) if not query.pure() else 0.0)
    one = Composite((event,))
    return lambda k: [[one] * k]


def _whatif_epsilon(value: str) -> Fraction:
    epsilon = check_epsilon(value, "epsilon", MAX_QUERY_EPSILON)
    if epsilon < SMALLEST_WHATIF_EPSILON:
        raise ParameterError("epsilon must be at least 2**-56 (noise beyond cannot be sampled)")
    return epsilon


def _whatif_sigma(value: str) -> Fraction:
    sigma = check_setting("sigma", value)  # the bounds of SET dpsql.sigma
    assert isinstance(sigma, Fraction)
    return sigma


@click.command("what-if")
@click.option(
    "--epsilon",
    callback=_exact(_whatif_epsilon),
    help="Each query's epsilon: a discrete Laplace of sensitivity 1.",
)
@click.option(
    "--sigma",
    callback=_exact(_whatif_sigma),
    help="Each query's noise multiplier: a Gaussian of sensitivity 1.",
)
@click.option(
    "--queries",
    type=click.IntRange(1, MAX_WHATIF_QUERIES),
    required=True,
    help="How many identical queries the curves and the 'epsilon after' column cover.",
)
@click.option(
    "--delta",
    callback=_exact(lambda v: check_delta(v, "delta")),
    help="The delta of the curves and of 'epsilon after' (default: the budget's total delta).",
)
@CHART
@click.pass_obj
def whatif_command(
    config: Config,
    *,
    epsilon: Fraction | None,
    sigma: Fraction | None,
    queries: int,
    delta: Fraction | None,
    chart: Path | None,
) -> None:
    """How N identical queries would compose, and how many still fit (nothing is charged)."""
    if (epsilon is None) == (sigma is None):
        raise click.UsageError("give exactly one of --epsilon and --sigma")
    query = Query(epsilon, sigma)
    report = open_budget(config).report()
    delta = report.delta_total if delta is None else delta
    if not query.pure() and delta == 0:
        raise click.BadParameter("a Gaussian needs delta > 0", param_hint="'--delta'")
    fits = whatif_fits(query, report.epsilon_remaining, report.delta_remaining)
    counts = {name: fit_count(test) for name, test in fits.items()}
    click.echo(whatif_text(query, queries, delta, report, counts), nl=False)
    if chart is not None:
        remaining = float(report.epsilon_remaining)
        curves = composite_curves(
            _views(query, queries, float(delta)),
            queries,
            float(delta),
            (remaining, f"remaining budget ε = {left_text(report.epsilon_remaining)}"),
            f"What if: {queries} queries, each a {query.describe()}",
        )
        write_chart(curves, chart)
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
