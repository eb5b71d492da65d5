"""``dpsql budget what-if``: what queries would cost before anything is spent, and how many fit.

With ``--epsilon`` or ``--sigma``, N identical hypothetical queries: their epsilon after N under
every accountant, and how many the remaining (epsilon, delta) holds under each theorem
(``dpsql.interfaces.report.whatif``). With ``--file F`` and ``--query SQL``, real ones, below.

Each batch file is planned as ``dpsql run`` plans it (one workload, its one charge; statements a
release already answers are free), each query as ``dpsql explain`` plans it (a ``?`` of a
template is planned as NULL: the cost of a query never depends on its parameters' values, only
on its text and settings). Nothing is charged. The count is the deciding filter's own decision,
made on a copy of the ledger in memory (``Budget.rounds``): one round charges every file's and
query's fresh cost once, as the analyst (``--analyst``, whose share counts), until the filter
refuses; a round that
fits now is one ``dpsql run`` or query that would be admitted now. ``rounds_after`` reads ``n``
rounds under every accountant, for ``--compare``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import click
from rich.table import Table
from sqlglot import exp

from dpsql.accounting import registry
from dpsql.accounting.budget.report import BudgetReport, cap_text, left_text, spent_text
from dpsql.accounting.budget.state import events_for
from dpsql.errors import ParameterError
from dpsql.interfaces.cli.batch import DEFAULT_MAX_BYTES
from dpsql.interfaces.cli.budget_view import (
    CHART,
    COMPARE,
    _exact,
    compare_line,
    number,
    open_budget,
    render,
    spent_number,
)
from dpsql.interfaces.cli.context import Config
from dpsql.interfaces.report.charts import composite_curves, write_chart
from dpsql.interfaces.report.whatif import (
    MAX_FIT,
    Query,
    after_n,
    fit_count,
    whatif_fits,
    whatif_label,
)
from dpsql.mechanisms.events import Composite
from dpsql.policy import MAX_QUERY_EPSILON, check_delta, check_epsilon, read_limited
from dpsql.session.session import Session
from dpsql.session.settings import check_setting
from dpsql.sql import parse as sql_parse
from dpsql.sql.split import split_statements

__all__ = [
    "MAX_ROUNDS",
    "Planned",
    "plan_real",
    "rounds_after",
    "whatif_command",
    "whatif_text",
]

MAX_ROUNDS = 10_000  # the count stops here ("at least")
MAX_TRIAL_CHARGES = 20_000  # and at this many trial charges in all: a round of many queries
# stops sooner (each trial charge is one filter decision, up to a millisecond or so)
MAX_WHATIF_QUERIES = 100_000
SMALLEST_WHATIF_EPSILON = Fraction(1, 2**56)


@dataclass(frozen=True)
class Planned:
    """One file or query: its name, its fresh cost now (None: nothing to charge) and a note."""

    name: str
    event: Composite | None
    note: str


def plan_real(session: Session, files: Sequence[Path], queries: Sequence[str]) -> list[Planned]:
    """Each file and query planned on the session, nothing charged."""
    planned = []
    for path in files:
        text = read_limited(path, DEFAULT_MAX_BYTES, f"the SQL file {path}")
        workload = session.plan_workload(split_statements(text))
        charged = sum(1 for s in workload.steps if s.charged)
        free = sum(1 for s in workload.steps if s.source == "cache")
        note = f"{len(workload.steps)} statement(s): {charged} charged, {free} served free"
        planned.append(Planned(path.name, workload.event, note))
    for sql in queries:
        statement = sql_parse.parse_statement(sql)
        markers = 0
        if isinstance(statement, sql_parse.Query):
            markers = sum(1 for p in statement.select.find_all(exp.Placeholder) if not p.this)
        plan = session.plan(sql, [None] * markers if markers else None)
        note = "a fresh answer" + (f"; a template of {markers} parameter(s)" if markers else "")
        if session.served_from(plan) is not None:
            note += "; a released answer serves this text now, free"
        planned.append(Planned(" ".join(sql.split()), plan.event, note))
    return planned


def rounds_after(events: Sequence[Composite], n: int, delta: float) -> dict[str, float]:
    """Each accountant's epsilon at ``delta`` after ``n`` rounds of ``events`` (as if they were
    the whole history), for comparing theorems."""
    history = list(events) * n
    return {
        r.name: r.odometer().epsilon(events_for(r.name, history), delta)
        for r in registry.entries()
        if r.whatif
    }


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
    "--file",
    "files",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="A batch file, planned as dpsql run plans it (repeatable).",
)
@click.option(
    "--query",
    "sqls",
    multiple=True,
    help="A query, or a template whose ? are planned as NULL (repeatable).",
)
@click.option(
    "--queries",
    type=click.IntRange(1, MAX_WHATIF_QUERIES),
    help="How many identical queries (with --epsilon/--sigma: required), or rounds of the "
    "files and queries (default 1), the curves and 'epsilon after' cover.",
)
@click.option(
    "--delta",
    callback=_exact(lambda v: check_delta(v, "delta")),
    help="The delta of the curves and of 'epsilon after' (default: the budget's total delta).",
)
@CHART
@COMPARE
@click.pass_obj
def whatif_command(
    config: Config,
    *,
    epsilon: Fraction | None,
    sigma: Fraction | None,
    files: tuple[Path, ...],
    sqls: tuple[str, ...],
    queries: int | None,
    delta: Fraction | None,
    chart: Path | None,
    compare: bool = False,
) -> None:
    """What queries would cost and how many still fit: N hypothetical ones (--epsilon or
    --sigma), or real ones (--file, --query); nothing is charged."""
    real = bool(files or sqls)
    if real and (epsilon is not None or sigma is not None):
        raise click.UsageError("give --epsilon/--sigma, or --file/--query, not both")
    if real:
        if chart is not None:
            raise click.UsageError("--chart draws a hypothetical mechanism (--epsilon, --sigma)")
        _whatif_real(
            config, files=files, sqls=sqls, rounds=queries or 1, delta=delta, compare=compare
        )
        return
    if (epsilon is None) == (sigma is None):
        raise click.UsageError("give exactly one of --epsilon and --sigma (or --file, --query)")
    if queries is None:
        raise click.UsageError("--queries is required with --epsilon or --sigma")
    query = Query(epsilon, sigma)
    budget = open_budget(config)
    report = budget.report(config.analyst)
    delta = report.delta_total if delta is None else delta
    if not query.pure() and delta == 0:
        raise click.BadParameter("a Gaussian needs delta > 0", param_hint="'--delta'")
    fits = whatif_fits(query, report.epsilon_remaining, report.delta_remaining)
    counts = {name: fit_count(test) for name, test in fits.items()}
    click.echo(str(report))  # the lead line of every budget screen
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


def _whatif_real(
    config: Config,
    *,
    files: tuple[Path, ...],
    sqls: tuple[str, ...],
    rounds: int,
    delta: Fraction | None,
    compare: bool,
) -> None:
    """What-if on real queries: each one's fresh cost now, and the rounds the deciding filter
    admits (``dpsql.interfaces.cli.whatif_real``)."""
    session = Session(config.policy(), config.analyst)
    try:
        planned = plan_real(session, files, sqls)
        budget = session.pipeline.budget
        report = budget.report(config.analyst)
        events = [p.event for p in planned if p.event is not None]
        most = min(MAX_ROUNDS, max(1, MAX_TRIAL_CHARGES // max(1, len(events))))
        fit, why = budget.rounds(events, config.analyst, most)
    finally:
        session.close()
    lines = [str(report), "What if (planned now; nothing is charged):"]
    for p in planned:
        cost = (
            "nothing to charge"
            if p.event is None
            else (f"epsilon {spent_text(p.event.epsilon)}, delta {spent_text(p.event.delta)}")
        )
        lines.append(f"  {p.name}: {cost} ({p.note})")
    eps = sum((e.epsilon for e in events), Fraction(0))
    lines.append(
        f"One round of them all: epsilon {spent_text(eps)}, delta "
        f"{spent_text(sum((e.delta for e in events), Fraction(0)))} (basic sums)."
    )
    if not events:
        lines.append("Nothing in them would be charged now: every answer is released already.")
        click.echo("\n".join(lines))
        return
    counted = f"at least {fit}" if fit >= most else str(fit)
    lines.append(
        f"The {report.accountant} filter (which decides) admits {counted} round(s) from now, "
        "each fresh (a dry run on a copy of the ledger)" + ("." if fit else f": {why}")
    )
    if compare and events:
        at = report.delta_total if delta is None else delta
        table = Table(
            title=f"{rounds} round(s); epsilon at delta {cap_text(at)}", title_justify="left"
        )
        for column in ("theorem", f"epsilon after {rounds}", "label"):
            table.add_column(column)
        for name, value in rounds_after(events, rounds, float(at)).items():
            table.add_row(name, spent_number(value), registry.get(name).validity)
        click.echo("\n".join(lines) + "\n\n" + render(table), nl=False)
        return
    lines.append(compare_line(report, "--compare"))
    click.echo("\n".join(lines))
