"""``dpsql run FILE.sql`` and ``dpsql explain SQL``: a file of statements, planned as a whole.

``run`` splits the file on the semicolons of sqlglot's token stream (so a ``;`` inside a string
or a comment splits nothing), then plans every statement before anything runs: each query's
privacy event, applying the file's ``SET``s in order, and whether the release cache would serve
it for free. The whole file is admitted by the budget's own filter on a copy of the ledger's
records, statement by statement, in order: what that copy refuses does not fit. A file that does
not fit is refused as a whole (exit 4, nothing charged) unless ``--partial`` runs what fits.

Both commands are click command objects (``run_command``, ``explain_command``) that take the
``dpsql`` group's ``Config``; every failure is one line on stderr with its code from
``cli.EXIT_CODES``.

This module holds the commands (``run``, ``explain``, ``query``) and running a planned file.
Planning the file is in ``batch_plan.py``, writing and printing results in ``batch_output.py``;
their names are re-exported here.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import click
from rich.console import Console
from rich.progress import Progress

from dpsql.accounting.ledger.store import ledger_exists
from dpsql.errors import BudgetExceededError, DpsqlError
from dpsql.interfaces.cli.batch_output import (
    FORMATS,
    _csv_with_accuracy,
    _document,
    _text_table,
    check_stdout,
    echo,
    output_files,
    prepare_output,
    write_results,
)
from dpsql.interfaces.cli.context import Config, exit_code, fail, pass_config
from dpsql.interfaces.cli.plan_lines import plan_lines
from dpsql.plan.explain import explain
from dpsql.policy import read_limited
from dpsql.policy.numbers import exact
from dpsql.release.cells import accuracy_forms
from dpsql.release.result import INTERVALS_COVER, Result, covers, summary
from dpsql.session.plans import with_periods
from dpsql.session.session import Session
from dpsql.session.workload_plan import Step, Workload, statement_totals
from dpsql.sql.split import Piece, split_statements

# A SQL file is read whole (to plan it as a whole), so its size is bounded: 16 MiB is far more
# than any hand-written file, and stops a FIFO or /dev/zero from exhausting memory.
DEFAULT_MAX_BYTES = 16 << 20
MAX_BYTES_CAP = 1 << 30


# -- the commands -----------------------------------------------------------------------------
def _execute(
    session: Session, workload: Workload, progress: Progress
) -> tuple[list[tuple[Step, Result]], list[Step]]:
    """Charge the workload's one event, then run the steps in order; returns the results that
    are tables and the skipped steps (``--partial``: those after the prefix that fits)."""
    done: list[tuple[Step, Result]] = []
    skipped: list[Step] = []
    task = progress.add_task("running", total=len(workload.steps))
    for step, result in session.run_workload(workload):
        if result is None:
            skipped.append(step)
        elif step.kind != "set":
            done.append((step, result))
        progress.advance(task)
    return done, skipped


def _summary(session: Session, done: Sequence[tuple[Step, Result]], skipped: list[Step]) -> str:
    charged = [r.charge for _, r in done if r.charge is not None]
    cached = sum(1 for _, r in done if r.cached_from is not None)
    # The statements of a file share its one charge: each charge counted once.
    once = {c.seq: c for c in charged}.values()
    eps = sum((c.epsilon for c in once), Fraction(0))
    delta = sum((c.delta for c in once), Fraction(0))
    text = (
        f"ran {len(done)} statement(s) with results: {len(charged)} charged (epsilon "
        f"{exact(eps)}, delta {exact(delta)}), {cached} from the cache"
    )
    if skipped:
        text += f"; skipped {', '.join(str(s.piece.number) for s in skipped)} (over the budget)"
    return text + f"\nbudget: {session.budget()}"


@click.command("run")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True, path_type=Path))
@click.option("--plan", "plan_only", is_flag=True, help="Print the cost plan and stop.")
@click.option(
    "--max-bytes",
    type=click.IntRange(1, MAX_BYTES_CAP),
    default=DEFAULT_MAX_BYTES,
    show_default=True,
    help="Refuse a FILE larger than this many bytes (it is never read further).",
)
@click.option("--partial", is_flag=True, help="If the file does not fit, run what fits.")
@click.option(
    "--output",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write results to files in this folder instead of printing them.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default="csv",
    show_default=True,
    help="File format of the results written to --output.",
)
@click.option("--combined", is_flag=True, help="One results file instead of one per statement.")
@click.option("--quiet", is_flag=True, help="No progress bar and no printed plan.")
@click.option(
    "--diagnose/--no-diagnose",
    default=None,
    help="Each query also releases the share of units its bounds cut (SET dpsql.diagnose = "
    "on), or not; default: the policy's budget.diagnose. The plan shows the cost.",
)
@pass_config
@click.pass_context
def run_command(
    ctx: click.Context,
    config: Config,
    *,
    file: Path,
    plan_only: bool,
    max_bytes: int,
    partial: bool,
    output: Path | None,
    fmt: str,
    combined: bool,
    quiet: bool,
    diagnose: bool | None,
) -> None:
    """Run the statements of FILE in order, after planning the cost of the whole file."""
    if output is None and (fmt != "csv" or combined):
        raise click.UsageError("--format and --combined need --output")
    try:
        if str(file) == "-":
            text = read_limited(sys.stdin.buffer, max_bytes, "standard input")
        else:
            text = read_limited(file, max_bytes, f"the SQL file {file}")
    except DpsqlError as exc:
        fail(ctx, f"{type(exc).__name__}: {exc}", exit_code(exc))
    try:
        session = Session(config.policy(), config.analyst)
    except DpsqlError as exc:
        fail(ctx, f"{type(exc).__name__}: {exc}", exit_code(exc))
    try:
        name = "standard input" if str(file) == "-" else file.name
        if diagnose is not None:
            # Before the plan: the cost plan of the file counts every diagnosis.
            session.set_option("diagnose", diagnose)
        _run(ctx, session, name, text, plan_only=plan_only, partial=partial,
             output=output, fmt=fmt, combined=combined, quiet=quiet)  # fmt: skip
    except DpsqlError as exc:
        fail(ctx, f"{type(exc).__name__}: {exc}", exit_code(exc))
    finally:
        session.close()


def _covers(result: Result) -> list[str]:
    """What the ± of a printed table covers, and the diagnosis when there is one."""
    lines = []
    widths, intervals = accuracy_forms(result.accuracy)
    if widths:
        lines.append(f"±: {covers(result)}")
    if intervals:
        lines.append(f"[lo, hi]: {INTERVALS_COVER}")
    if result.diagnosis is not None:
        lines.append(f"diagnosis: {result.diagnosis.describe()}")
    return lines


def _run(
    ctx: click.Context,
    session: Session,
    name: str,
    text: str,
    *,
    plan_only: bool,
    partial: bool,
    output: Path | None,
    fmt: str,
    combined: bool,
    quiet: bool,
) -> None:
    workload = session.plan_workload(split_statements(text))
    steps = workload.steps
    width = max(2, len(str(len(steps))))
    if output is not None and not plan_only:  # before the charge: a result never lost
        numbers = [s.piece.number for s in steps if s.kind != "set"]
        prepare_output(output, output_files(output, numbers, fmt, combined, width))
    elif not plan_only:
        check_stdout()
    if not quiet or plan_only:
        echo("\n".join(plan_lines(session, name, workload)))
    if plan_only:
        return
    refused = [s for s in steps if s.source == "refused"]
    admitted = [s for s in steps if s.kind != "set" and s.source != "refused"]
    if refused and partial and not admitted:  # a run that did nothing must not look like success
        raise BudgetExceededError(
            f"none of the {len(refused)} statement(s) of {name} fits the remaining budget; "
            "nothing was run or charged"
        )
    if refused and not partial:
        eps, delta = statement_totals(steps, "charge")
        more_eps, more_delta = statement_totals(steps, "refused")
        raise BudgetExceededError(
            f"{name} needs epsilon {exact(eps + more_eps)}, delta {exact(delta + more_delta)} "
            f"and {len(refused)} statement(s) do not fit the remaining budget; nothing was run "
            "or charged (--partial runs what fits)"
        )
    show = sys.stderr.isatty() and not quiet
    with Progress(console=Console(stderr=True), transient=True, disable=not show) as progress:
        done, skipped = _execute(session, workload, progress)
    if output is not None:
        for path in write_results(done, output, fmt, combined, width):
            echo(f"wrote {path}")
        for step, result in done:
            if result.diagnosis is not None:
                echo(f"statement {step.piece.number}: diagnosis: {result.diagnosis.describe()}")
    else:
        for step, result in done:
            echo(f"\n-- statement {step.piece.number} (line {step.piece.line})")
            echo("\n".join(_text_table(result)))
            if result.note:
                echo(result.note)
            if result.bounds_note:
                echo(result.bounds_note)
            for line in _covers(result):
                echo(line)
    echo(_summary(session, done, skipped))


@click.command("explain")
@click.argument("sql")
@click.option(
    "--verbose", is_flag=True, help="Every exact figure and the bounded SQL, as EXPLAIN VERBOSE."
)
@pass_config
@click.pass_context
def explain_command(ctx: click.Context, config: Config, sql: str, verbose: bool) -> None:
    """Print the plan of the query SQL (its bounds, mechanisms, noise and cost; with --verbose
    its exact scales and bounded SQL); nothing is charged and nothing runs."""
    note = None
    try:
        policy = config.policy(ledger=False)
        if policy.ledger is not None and not ledger_exists(policy):
            # Nothing to charge or serve: the plan needs no ledger, and none is created.
            policy = policy.model_copy(update={"ledger": None})
            note = "no ledger yet (dpsql init creates it): nothing is released or cached"
        elif policy.ledger is None:
            note = "the policy has no [ledger]: nothing is released or cached"
        session = Session(policy, config.analyst)
    except DpsqlError as exc:
        fail(ctx, f"{type(exc).__name__}: {exc}", exit_code(exc))
    try:
        plan = session.plan(sql)
        lines = with_periods(explain(plan, verbose), plan, session.pipeline.persons)
        click.echo("\n".join(lines))
        hit = session.served_from(plan)
        if hit is not None:
            click.echo(f"cache: served from {hit.origin}; it would cost nothing")
        elif note is None:
            # A dry run of the filter on the ledger as it stands: nothing recorded.
            why = session.pipeline.refusal(plan.event, session.details(plan))
            if why is not None:
                click.echo(f"budget: it would be refused now: {why}")
        if note is not None:
            click.echo(note)
    except DpsqlError as exc:
        fail(ctx, f"{type(exc).__name__}: {exc}", exit_code(exc))
    finally:
        session.close()


@click.command("query")
@click.argument("sql")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(("table", "csv", "json")),
    default="table",
    show_default=True,
    help="How the answer is printed: an aligned table, CSV (a <name> ± column after each "
    "value with a half-width), or one JSON document.",
)
@pass_config
@click.pass_context
def query_command(ctx: click.Context, config: Config, sql: str, fmt: str) -> None:
    """Answer one statement SQL and print it to standard output (charged like any query; a
    released answer is served from the cache, free), for scripts and pipes (jq, csvkit)."""
    try:
        session = Session(config.policy(), config.analyst)
    except DpsqlError as exc:
        fail(ctx, f"{type(exc).__name__}: {exc}", exit_code(exc))
    try:
        check_stdout()  # before the charge: an answer is never charged and then lost
        result = session.execute(sql)
        if fmt == "json":
            document = _document(Step(Piece(1, 1, sql), "query"), result)
            echo(json.dumps({k: v for k, v in document.items() if k not in ("statement", "line")}))
        elif fmt == "csv":
            echo(_csv_with_accuracy(result), nl=False)
        else:
            if result.columns:
                echo("\n".join(_text_table(result)))
            echo(summary(result) if result.columns else result.message)
            if result.diagnosis is not None:
                echo(f"diagnosis: {result.diagnosis.describe()}")
    except DpsqlError as exc:
        fail(ctx, f"{type(exc).__name__}: {exc}", exit_code(exc))
    finally:
        session.close()


__all__ = ["explain_command", "query_command", "run_command"]
