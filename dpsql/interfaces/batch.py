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
"""

from __future__ import annotations

import csv
import functools
import io
import json
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import click
import duckdb
from rich.console import Console
from rich.progress import Progress

from dpsql import cache
from dpsql.accounting.filter import Budget, MemoryLedger, budget_for, ledger_exists
from dpsql.errors import BudgetExceededError, DpsqlError, OutputError, ParseError
from dpsql.interfaces import frames
from dpsql.interfaces.context import Config, exit_code, fail, pass_config
from dpsql.interfaces.report import exact
from dpsql.plan.planner import Plan
from dpsql.policy import read_limited
from dpsql.session import Planned, Result, Session
from dpsql.sql.parse import Explain, SetOption, ShowOption, parse_statement
from dpsql.sql.split import Piece, split_statements

FORMATS = ("csv", "json", "parquet")
# A SQL file is read whole (to plan it as a whole), so its size is bounded: 16 MiB is far more
# than any hand-written file, and stops a FIFO or /dev/zero from exhausting memory.
DEFAULT_MAX_BYTES = 16 << 20
MAX_BYTES_CAP = 1 << 30


@dataclass(frozen=True)
class Step:
    """A planned statement: its kind, its plan (queries), where its answer comes from."""

    piece: Piece
    kind: str  # "set", "show", "explain" or "query"
    plan: Plan | None = None
    source: str = "free"  # "free", "charge", "cache" or "refused"
    note: str = ""

    @property
    def charged(self) -> bool:
        return self.source == "charge"


def _kind(piece: Piece) -> str:
    statement = parse_statement(piece.text)
    if isinstance(statement, SetOption):
        return "set"
    if isinstance(statement, ShowOption):
        return "show"
    return "explain" if isinstance(statement, Explain) else "query"


def plan_file(session: Session, pieces: Sequence[Piece]) -> list[Step]:
    """Plan every statement in order, admitting the charges on a copy of the budget; nothing
    is charged and the session's settings are left as they were (a fresh session's)."""
    copy = MemoryLedger()  # decides on its records in place: O(1) per trial charge
    for record in session.filter.store.records():
        copy.append(record.kind, record.payload, record.analyst)
    trial = budget_for(session.policy.dataset.id, session.policy.budget, copy)
    planned: dict[str, int] = {}  # exact cache key -> the statement that will release it
    steps: list[Step] = []
    applied: set[str] = set()
    # Pipelined: while the engine checks statement i's bounded SQL (in its worker, without the
    # interpreter), statement i + 1 is parsed and planned here. Steps still complete in order
    # (statement i's trial charge before statement i + 1's), and the first statement in the
    # file's order that fails is the one reported.
    pending: tuple[Piece, Callable[[], Step]] | None = None
    try:
        for piece in pieces:
            try:
                finish = _plan_soon(session, piece, trial, planned, applied)
            except DpsqlError as exc:
                if pending is not None:
                    steps.append(_complete(*pending))
                raise _located(exc, piece) from None
            if pending is not None:
                steps.append(_complete(*pending))
            pending = (piece, finish)
        if pending is not None:
            steps.append(_complete(*pending))
    finally:
        for name in applied:
            session.set_option(name, None)
    return steps


def _located(exc: DpsqlError, piece: Piece) -> DpsqlError:
    where = f"statement {piece.number} (line {piece.line})"
    if isinstance(exc, ParseError) and exc.line is not None:
        # The position in the file, not in the statement.
        line = piece.line + exc.line - 1
        message = str(exc).rsplit(" (line ", 1)[0]
        return ParseError(f"{where}: {message}", line, exc.column)
    return type(exc)(f"{where}: {exc}")


def _complete(piece: Piece, finish: Callable[[], Step]) -> Step:
    try:
        return finish()
    except DpsqlError as exc:
        raise _located(exc, piece) from None


def _plan_soon(
    session: Session, piece: Piece, trial: Budget, planned: dict[str, int], applied: set[str]
) -> Callable[[], Step]:
    """Plan ``piece`` now (a SET is applied now, for the statements after it) and start the
    engine's check; the function returned waits for the check and decides the step."""
    # A SELECT or EXPLAIN seen before (same text, same settings) reuses its plan: no parse.
    # The ledger's bounds estimates were read when the file's planning began (current=False):
    # the file is planned on one reading of the ledger, and every statement is planned again,
    # on a fresh reading, when it runs.
    checked = session.planned_soon(piece.text, None, {}, current=piece.number == 1)
    if checked is None:
        kind = _kind(piece)
        if kind == "set":
            statement = parse_statement(piece.text)
            assert isinstance(statement, SetOption)
            session.set_option(statement.name, statement.value)
            applied.add(statement.name)
        return lambda: Step(piece, kind)
    fresh = bool(session.settings()["fresh"])  # as SET before this statement left it
    return lambda: _decide(session, piece, checked(), trial, planned, fresh=fresh)


def _decide(
    session: Session, piece: Piece, known: Planned, trial: Budget, planned: dict[str, int],
    *, fresh: bool,
) -> Step:  # fmt: skip
    if known.explain:  # planned, so a bad EXPLAIN refuses the file like a bad query
        return Step(piece, "explain")
    plan, keys = known.plan, known.keys
    if not fresh:
        hit = session.cache.lookup(plan, keys)
        if hit is not None:
            return Step(piece, "query", plan, "cache", f"release {hit.release_seq}")
        if keys.exact in planned:
            return Step(piece, "query", plan, "cache", f"statement {planned[keys.exact]}")
    try:
        trial.charge(plan.event, plan.query, session.analyst)
    except BudgetExceededError:
        return Step(piece, "query", plan, "refused", "does not fit")
    planned[keys.exact] = piece.number
    return Step(piece, "query", plan, "charge")


def _one_line(text: str, width: int = 60) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


def _totals(steps: Sequence[Step], source: str) -> tuple[Fraction, Fraction]:
    chosen = [s.plan for s in steps if s.source == source and s.plan is not None]
    return sum((p.epsilon for p in chosen), Fraction(0)), sum(
        (p.delta for p in chosen), Fraction(0)
    )


def plan_lines(session: Session, name: str, steps: Sequence[Step]) -> list[str]:
    """The cost plan of a file, as printed by ``dpsql run`` before anything runs."""
    lines = [f"plan of {name}: {len(steps)} statement(s)"]
    lines.append(f"{'#':>3}  {'line':>4}  {'kind':<7}  {'epsilon':<10}  {'delta':<12}  source")
    for s in steps:
        cost = (exact(s.plan.epsilon), exact(s.plan.delta)) if s.plan else ("-", "-")
        source = s.source + (f" ({s.note})" if s.note else "")
        lines.append(
            f"{s.piece.number:>3}  {s.piece.line:>4}  {s.kind:<7}  {cost[0]!s:<10}  "
            f"{cost[1]!s:<12}  "
            f"{source:<26}  {_one_line(s.piece.text)}"
        )
    eps, delta = _totals(steps, "charge")
    report = session.budget()
    refused = [s.piece.number for s in steps if s.source == "refused"]
    lines.append(
        f"to charge (basic composition, the sum): epsilon {exact(eps)}, delta {exact(delta)}"
    )
    lines.append(
        f"remaining under the {report.accountant} filter: epsilon "
        f"{exact(report.epsilon_remaining)}, delta {exact(report.delta_remaining)}"
    )
    if refused:
        listed = ", ".join(map(str, refused))
        lines.append(f"fits: no: the {report.accountant} filter refuses statement(s) {listed}")
    else:
        lines.append(f"fits: yes (every charge admitted by the {report.accountant} filter)")
    return lines


# -- results ----------------------------------------------------------------------------------
def _plain(value: Any) -> Any:
    return value if value is None or isinstance(value, bool | int | float | str) else str(value)


def _document(step: Step, result: Result) -> dict[str, Any]:
    return {
        "statement": step.piece.number,
        "line": step.piece.line,
        "sql": step.piece.text,
        "columns": list(result.columns),
        "types": list(result.types),
        "rows": [[_plain(v) for v in row] for row in result.rows],
        "accuracy": [list(row) for row in result.accuracy],
        "confidence": result.confidence,
        "epsilon": exact(result.charge.epsilon) if result.charge else "0",
        "delta": exact(result.charge.delta) if result.charge else "0",
        "cached_from": result.cached_from,
    }


def _long_rows(done: Sequence[tuple[Step, Result]]) -> Iterator[tuple[Any, ...]]:
    """One row per released cell: the combined CSV and Parquet layout."""
    for step, result in done:
        for i, row in enumerate(result.rows):
            accuracy = result.accuracy[i] if i < len(result.accuracy) else ()
            for j, value in enumerate(row):
                half = accuracy[j] if j < len(accuracy) else None
                text = None if value is None else str(_plain(value))
                yield step.piece.number, i + 1, result.columns[j], text, half


LONG = (("statement", "INTEGER"), ("row", "INTEGER"), ("column", "VARCHAR"),
        ("value", "VARCHAR"), ("accuracy", "DOUBLE"))  # fmt: skip


def _csv(columns: Sequence[str], rows: Iterator[Sequence[Any]] | Sequence[Sequence[Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows([_plain(v) for v in row] for row in rows)
    return out.getvalue()


def _csv_with_accuracy(result: Result) -> str:
    columns = frames.columns(result, result.rows, accuracy=True)
    rows = zip(*(values for _, _, values in columns), strict=True) if columns else iter(())
    return _csv([name for name, _, _ in columns], list(rows))


def _parquet(path: Path, schema: Sequence[tuple[str, str]], rows: Sequence[Sequence[Any]]) -> None:
    """Write with DuckDB (pyarrow is a development dependency only)."""
    names: list[str] = []
    for name, _ in schema:  # duplicate output names (two COUNT(*)) need distinct columns
        unique, n = name, 1
        while unique in names:
            n, unique = n + 1, f"{name}_{n + 1}"
        names.append(unique)
    columns = ", ".join(
        '"' + n.replace('"', '""') + '" ' + t for n, (_, t) in zip(names, schema, strict=True)
    )
    with duckdb.connect() as con:
        con.execute(f"CREATE TABLE result ({columns})")
        if rows:
            marks = ", ".join("?" * len(schema))
            con.executemany(f"INSERT INTO result VALUES ({marks})", [list(r) for r in rows])
        target = str(path).replace("'", "''")
        con.execute(f"COPY result TO '{target}' (FORMAT PARQUET)")


def _reason(exc: BaseException) -> str:
    """Why a write failed, in the OS's words (never a value: only the file is named)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return "the engine could not write the file" if isinstance(exc, duckdb.Error) else "failed"


def prepare_output(folder: Path) -> None:
    """Create ``folder`` and check that a file can be written in it, before anything runs (so
    that a folder that cannot hold the results costs nothing)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".dpsql-", suffix=".probe"):
            pass
    except OSError as exc:
        raise OutputError(
            f"cannot write results to the folder {folder}: {_reason(exc)}; nothing was run"
        ) from None


def _write_one(path: Path, what: str, write: Callable[[], object]) -> Path:
    try:
        write()
    except (OSError, duckdb.Error) as exc:
        raise OutputError(
            f"cannot write {path} ({what}): {_reason(exc)}; the statements ran and their charges "
            "stand (run the file again to write the results: the cache serves them free)"
        ) from None
    return path


def write_results(
    done: Sequence[tuple[Step, Result]], folder: Path, fmt: str, combined: bool, width: int
) -> list[Path]:
    """Write each result (``01.csv``, ...) or all of them (``results.csv``); return the files.
    A file that cannot be written is an ``OutputError`` naming it and its statement."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create the folder {folder}: {_reason(exc)}") from None
    if combined:
        path = folder / f"results.{fmt}"
        what = "the results of every statement"
        if fmt == "json":
            docs = [_document(s, r) for s, r in done]
            text = json.dumps(docs, indent=2) + "\n"
            return [_write_one(path, what, lambda: path.write_text(text, encoding="utf-8"))]
        if fmt == "csv":
            text = _csv([n for n, _ in LONG], _long_rows(done))
            return [_write_one(path, what, lambda: path.write_text(text, encoding="utf-8"))]
        rows = list(_long_rows(done))
        return [_write_one(path, what, lambda: _parquet(path, LONG, rows))]
    paths = []
    for step, result in done:
        path = folder / f"{step.piece.number:0{width}d}.{fmt}"
        what = f"the result of statement {step.piece.number}, line {step.piece.line}"
        if fmt == "json":
            text = json.dumps(_document(step, result), indent=2) + "\n"
            write: Callable[[], object] = functools.partial(path.write_text, text, encoding="utf-8")
        elif fmt == "csv":  # with a <name> ± column after each column that has half-widths
            write = functools.partial(path.write_text, _csv_with_accuracy(result), encoding="utf-8")
        else:
            schema = list(zip(result.columns, result.types, strict=True))
            write = functools.partial(_parquet, path, schema, result.rows)
        paths.append(_write_one(path, what, write))
    return paths


def echo(text: str = "", nl: bool = True) -> None:
    """``click.echo``, but a standard output that cannot be written (a full disk, a closed pipe)
    is an ``OutputError`` rather than an internal error."""
    try:
        click.echo(text, nl=nl)
    except OSError as exc:
        raise OutputError(f"cannot write to standard output: {_reason(exc)}") from None


def _text_table(result: Result) -> list[str]:
    """An aligned table; a noisy value shows its accuracy half-width (``± a``, rounded up)."""
    cells = []
    for i, row in enumerate(result.rows):
        accuracy = result.accuracy[i] if i < len(result.accuracy) else ()
        halves = [accuracy[j] if j < len(accuracy) else None for j in range(len(row))]
        cells.append([
            str(v) + ("" if h is None else f" ± {frames.half_width(h)}")
            for v, h in zip(row, halves, strict=True)
        ])  # fmt: skip
    widths = [max([len(c), *(len(r[j]) for r in cells)]) for j, c in enumerate(result.columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(result.columns, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return [line.rstrip() for line in lines]


# -- the commands -----------------------------------------------------------------------------
def _execute(
    session: Session, steps: Sequence[Step], partial: bool, progress: Progress
) -> tuple[list[tuple[Step, Result]], list[Step]]:
    """Run the steps in order; returns the results that are tables and the skipped steps."""
    done: list[tuple[Step, Result]] = []
    skipped: list[Step] = []
    task = progress.add_task("running", total=len(steps))
    for step in steps:
        if step.source == "refused":  # only reached with --partial
            skipped.append(step)
        else:
            try:
                result = session.execute(step.piece.text)
            except BudgetExceededError:
                # Another session spent the budget since the plan: the same rule applies.
                if not partial:
                    raise
                skipped.append(step)
            else:
                if step.kind != "set":
                    done.append((step, result))
        progress.advance(task)
    return done, skipped


def _summary(session: Session, done: Sequence[tuple[Step, Result]], skipped: list[Step]) -> str:
    charged = [r.charge for _, r in done if r.charge is not None]
    cached = sum(1 for _, r in done if r.cached_from is not None)
    eps = sum((c.epsilon for c in charged), Fraction(0))
    delta = sum((c.delta for c in charged), Fraction(0))
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
        _run(ctx, session, name, text, plan_only=plan_only, partial=partial,
             output=output, fmt=fmt, combined=combined, quiet=quiet)  # fmt: skip
    except DpsqlError as exc:
        fail(ctx, f"{type(exc).__name__}: {exc}", exit_code(exc))
    finally:
        session.close()


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
    if output is not None and not plan_only:
        prepare_output(output)
    steps = plan_file(session, split_statements(text))
    if not quiet or plan_only:
        echo("\n".join(plan_lines(session, name, steps)))
    if plan_only:
        return
    refused = [s for s in steps if s.source == "refused"]
    if refused and not partial:
        eps, delta = _totals(steps, "charge")
        more_eps, more_delta = _totals(steps, "refused")
        raise BudgetExceededError(
            f"{name} needs epsilon {exact(eps + more_eps)}, delta {exact(delta + more_delta)} "
            f"and {len(refused)} statement(s) do not fit the remaining budget; nothing was run "
            "or charged (--partial runs what fits)"
        )
    show = sys.stderr.isatty() and not quiet
    with Progress(console=Console(stderr=True), transient=True, disable=not show) as progress:
        done, skipped = _execute(session, steps, partial, progress)
    if output is not None:
        width = max(2, len(str(len(steps))))
        for path in write_results(done, output, fmt, combined, width):
            echo(f"wrote {path}")
    else:
        for step, result in done:
            echo(f"\n-- statement {step.piece.number} (line {step.piece.line})")
            echo("\n".join(_text_table(result)))
    echo(_summary(session, done, skipped))


@click.command("explain")
@click.argument("sql")
@pass_config
@click.pass_context
def explain_command(ctx: click.Context, config: Config, sql: str) -> None:
    """Print the plan of the query SQL (its mechanisms, cost and bounded SQL); nothing is
    charged and nothing runs."""
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
        click.echo("\n".join(plan.explain()))
        hit = session.cache.lookup(plan, cache.keys(plan, session.policy))
        if hit is not None:
            click.echo(f"cache: served from release {hit.release_seq}; it would cost nothing")
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
        result = session.execute(sql)
        if fmt == "json":
            document = _document(Step(Piece(1, 1, sql), "query"), result)
            echo(json.dumps({k: v for k, v in document.items() if k not in ("statement", "line")}))
        elif fmt == "csv":
            echo(_csv_with_accuracy(result), nl=False)
        else:
            if result.columns:
                echo("\n".join(_text_table(result)))
            echo(frames.summary(result) if result.columns else result.message)
    except DpsqlError as exc:
        fail(ctx, f"{type(exc).__name__}: {exc}", exit_code(exc))
    finally:
        session.close()


__all__ = [
    "explain_command",
    "plan_file",
    "plan_lines",
    "query_command",
    "run_command",
    "split_statements",
]
