"""``dpsql shell``: an interactive prompt over one ``Session`` (prompt_toolkit and rich).

The shell is a thin face over the session, like every interface: ``Shell.handle`` takes one
complete input (a statement ended by ``;`` or a backslash meta-command) and returns the text to
show, so the whole behaviour is testable without a terminal; ``run_shell`` drives it from any
pair of text streams, and ``interactive`` from a prompt_toolkit terminal with persistent history,
completion, multi-line input and a bottom toolbar that always shows the remaining budget.

A meta-command never charges anything: ``\\explain`` plans only, and ``\\budget``, ``\\ledger``
and ``\\cache`` read the verified ledger. Errors are one line, ``Error: <class>: <message>``;
a dpsql message names the construct and never a data value. An unexpected exception is a bug
whose message might quote data, so only its class is shown.
"""

from __future__ import annotations

import io
import math
import re
import shutil
import sys
from collections.abc import Iterable, Iterator, Sequence
from fractions import Fraction
from pathlib import Path
from typing import IO, Any, NoReturn

import click
import sqlglot
from prompt_toolkit import PromptSession
from prompt_toolkit.completion import CompleteEvent, Completer, Completion
from prompt_toolkit.document import Document
from prompt_toolkit.history import FileHistory, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from prompt_toolkit.utils import is_dumb_terminal
from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text
from sqlglot.errors import TokenError
from sqlglot.tokenizer_core import TokenType

from dpsql import cache
from dpsql.errors import DpsqlError, InputError
from dpsql.interfaces.context import (
    ANALYST_OPTION,
    EXIT_INTERNAL,
    POLICY_OPTION,
    Config,
    exit_code,
    fail,
    pass_config,
)
from dpsql.interfaces.report import exact, iso_time
from dpsql.session import SETTINGS, Result, Session
from dpsql.sql.parse import DIALECT, MAX_QUERY_LENGTH

DEFAULT_HISTORY = "~/.dpsql_history"
MAX_INPUT = MAX_QUERY_LENGTH  # characters of one input read from a stream: one query's worth
MAX_HISTORY_BYTES = 16 << 20
DEFAULT_LEDGER_ROWS = 10
KEYWORDS = (
    "SELECT", "FROM", "WHERE", "GROUP BY", "HAVING", "ORDER BY", "LIMIT", "OFFSET", "AS", "AND",
    "OR", "NOT", "IN", "IS", "NULL", "BETWEEN", "LIKE", "CASE", "WHEN", "THEN", "ELSE", "END",
    "COUNT", "SUM", "AVG", "MIN", "MAX", "DISTINCT", "ASC", "DESC", "CAST", "COALESCE",
    "EXPLAIN", "SET", "SHOW", "RESET", "DEFAULT", "TRUE", "FALSE",
)  # fmt: skip
META = {
    "\\budget": ("", "spent and remaining budget under every accountant"),
    "\\ledger": ("[N]", f"the last N ledger records (default {DEFAULT_LEDGER_ROWS})"),
    "\\explain": ("QUERY", "the plan and cost of QUERY; nothing is charged"),
    "\\tables": ("", "the tables of the policy"),
    "\\describe": ("TABLE", "columns, types, bounds and public domains of TABLE"),
    "\\cache": ("", "the released answers the cache can serve again at no charge"),
    "\\help": ("", "this help"),
    "\\quit": ("", "leave the shell (also Ctrl-D)"),
}
_SET_NAME = re.compile(r"(?is)\b(set|show|reset)\s+dpsql\.(\w*)$")
_DESCRIBE = re.compile(r"(?s)^\s*\\describe\s+(\w*)$")
_WORD = re.compile(r"[\w\\]*$")


def _num(value: Fraction | float) -> str:
    """An epsilon or delta for people: exact when short, else six significant digits."""
    if isinstance(value, Fraction):
        text = exact(value) or ""
        return text if len(text) <= 10 else f"{float(value):.6g}"
    return f"{value:.6g}"


def is_complete(text: str) -> bool:
    """Whether ``text`` is ready to run: blank, a meta-command, or SQL whose last token is a
    semicolon (a ``;`` inside a string or a comment does not end the input)."""
    stripped = text.strip()
    if not stripped or stripped.startswith("\\") or stripped.lower() in ("quit", "exit"):
        return True
    try:
        tokens = sqlglot.tokenize(stripped, read=DIALECT)
    except TokenError:
        return False  # an unclosed quote or comment: keep reading
    return bool(tokens) and tokens[-1].token_type == TokenType.SEMICOLON


def split_statements(text: str) -> list[str]:
    """The statements of ``text`` cut at its semicolon tokens (not at ``;`` in strings)."""
    try:
        tokens = sqlglot.tokenize(text, read=DIALECT)
    except TokenError:
        return [text.strip()]  # let the session report the error
    parts, start = [], 0
    for token in tokens:
        if token.token_type == TokenType.SEMICOLON:
            parts.append(text[start : token.start].strip())
            start = token.end + 1
    parts.append(text[start:].strip())
    return [part for part in parts if part]


class SqlCompleter(Completer):
    """Keywords, tables and columns of the policy's catalog; dpsql settings after ``SET dpsql.``;
    meta-commands after a backslash, and table names after ``\\describe``."""

    def __init__(self, tables: Sequence[str], columns: dict[str, Sequence[str]]):
        self.tables = sorted(tables)
        self.columns = columns

    def get_completions(
        self, document: Document, complete_event: CompleteEvent
    ) -> Iterable[Completion]:
        before = document.text_before_cursor
        setting = _SET_NAME.search(before)
        if setting:
            names = [*SETTINGS, "budget", "all"] if setting.group(1).lower() == "show" else SETTINGS
            yield from _matches(setting.group(2), names, "setting")
            return
        described = _DESCRIBE.search(before)
        if described:
            yield from _matches(described.group(1), self.tables, "table")
            return
        word = _WORD.search(before)
        prefix = word.group(0) if word else ""
        if prefix.startswith("\\"):
            if before.strip() == prefix:
                yield from _matches(prefix, list(META), "meta-command")
            return
        if not prefix:
            return
        yield from _matches(prefix, self.tables, "table")
        for table in self.tables:
            yield from _matches(prefix, self.columns.get(table, ()), f"column of {table}")
        words = [k.lower() if prefix.islower() else k for k in KEYWORDS]
        yield from _matches(prefix, words, "keyword")


def _matches(prefix: str, names: Iterable[str], meta: str) -> Iterator[Completion]:
    for name in names:
        if name.lower().startswith(prefix.lower()) and name.lower() != prefix.lower():
            yield Completion(name, start_position=-len(prefix), display_meta=meta)


def _error(message: str) -> str:
    return "Error: " + " ".join(message.split()) + "\n"


def _cell(value: Any, width: float | None) -> str:
    """``value ± half-width``, the value rounded to the precision its accuracy supports."""
    if value is None:
        return "NULL"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if width is None or not math.isfinite(width):
        return f"{value:.6g}" if isinstance(value, float) else str(value)
    digits = 0 if width >= 10 or width <= 0 else min(6, 1 - math.floor(math.log10(width)))
    return f"{value:.{digits}f} ± {width:.{digits}f}"


class Shell:
    """One shell over a session: ``handle`` an input, read the ``prompt`` and ``toolbar``."""

    def __init__(self, session: Session, *, width: int = 100, color: bool = False):
        self.session = session
        self.width, self.color = width, color
        self.finished = False
        catalog = session.engine.catalog
        tables = sorted(set(session.policy.tables) | set(catalog))
        self.completer = SqlCompleter(tables, {t: sorted(catalog.get(t, {})) for t in tables})
        self.report = session.budget()

    # -- what is always visible ---------------------------------------------------------------
    def refresh(self) -> None:
        """Re-read the budget from the ledger (after every input, not on every keystroke)."""
        self.report = self.session.budget()

    def prompt(self) -> str:
        r = self.report
        return f"dpsql (eps {_num(r.epsilon_spent)}/{_num(r.epsilon_total)})> "

    def toolbar(self) -> str:
        r = self.report
        return (
            f"epsilon {_num(r.epsilon_spent)} spent of {_num(r.epsilon_total)} "
            f"({_num(r.epsilon_remaining)} left) | delta {_num(r.delta_spent)} of "
            f"{_num(r.delta_total)} | {r.accountant} decides | {r.queries} charged queries"
        )

    # -- one input ------------------------------------------------------------------------------
    def handle(self, text: str) -> str:
        """The text to show for one complete input; never raises a dpsql or internal error."""
        shown = self._handle(text.strip())
        try:
            self.refresh()
        except DpsqlError as exc:  # the ledger became unreadable: say so, keep the old figures
            shown += _error(f"{type(exc).__name__}: {exc}")
        return shown

    def _handle(self, text: str) -> str:
        try:
            if not text:
                return ""
            if text.startswith("\\"):
                return self._meta(text)
            if text.rstrip(";").strip().lower() in ("quit", "exit"):
                self.finished = True
                return ""
            return "".join(self._render(self.session.execute(s)) for s in split_statements(text))
        except DpsqlError as exc:
            return _error(f"{type(exc).__name__}: {exc}")
        except click.ClickException as exc:  # a misused meta-command
            return _error(exc.format_message())
        except Exception as exc:
            # Only the class: the message of an unexpected error might quote data.
            return f"Error: internal error ({type(exc).__name__}); please report this dpsql bug\n"

    def _meta(self, text: str) -> str:
        command, argument = [*text.split(None, 1), ""][:2]
        command, argument = command.lower(), argument.strip().rstrip(";").strip()
        if command in ("\\quit", "\\q"):
            self.finished = True
            return ""
        handlers = {
            "\\budget": self._budget, "\\ledger": self._ledger, "\\explain": self._explain,
            "\\tables": self._tables, "\\describe": self._describe, "\\cache": self._cache,
            "\\help": self._help, "\\?": self._help,
        }  # fmt: skip
        handler = handlers.get(command)
        if handler is None:
            raise click.UsageError(f"unknown meta-command {command}; try \\help")
        return handler(argument)

    def _show(self, *items: RenderableType) -> str:
        buffer = io.StringIO()
        console = Console(
            file=buffer, width=self.width, force_terminal=self.color, no_color=not self.color,
            color_system="standard" if self.color else None, highlight=False, soft_wrap=False,
        )  # fmt: skip
        for item in items:
            console.print(item)
        return buffer.getvalue()

    def _render(self, result: Result) -> str:
        if not result.columns:
            return self._show(result.message or "ok")
        if result.columns == ("plan",) and result.charge is None and result.cached_from is None:
            return "\n".join([*(str(row[0]) for row in result.rows), "nothing was charged", ""])
        table = Table()
        numeric = [
            t.upper() not in ("VARCHAR", "DATE", "BOOLEAN", "TIMESTAMP") for t in result.types
        ]
        for name, right in zip(result.columns, numeric, strict=True):
            table.add_column(name, justify="right" if right else "left")
        for i, row in enumerate(result.rows):
            widths = result.accuracy[i] if i < len(result.accuracy) else ()
            cells = [_cell(v, widths[j] if j < len(widths) else None) for j, v in enumerate(row)]
            table.add_row(*(Text(c) for c in cells))
        if result.plan is None:  # SHOW: a setting, nothing released
            return self._show(table)
        return self._show(table, Text(self._caption(result)))

    @staticmethod
    def _caption(result: Result) -> str:
        rows = f"{len(result.rows)} row(s)"
        if result.cached_from is not None:
            return f"{rows}; served from the cache (release #{result.cached_from}), no charge"
        if result.charge is None:
            return f"{rows}; nothing was charged"
        charge = result.charge
        cost = f"charged epsilon {_num(charge.epsilon)}, delta {_num(charge.delta)}"
        confidence = f"; ± at {result.confidence:.4g} confidence" if result.confidence else ""
        return f"{rows}{confidence}; {cost} (ledger record #{charge.seq})"

    # -- meta-commands --------------------------------------------------------------------------
    def _budget(self, _: str) -> str:
        report = self.report = self.session.budget()
        table = Table("accountant", f"epsilon at delta {_num(report.delta_total)}", "note")
        for figure in report.figures:
            table.add_row(figure.accountant, f"{figure.epsilon:.6g}", figure.note)
        return self._show(Text(str(report)), table)

    def _ledger(self, argument: str) -> str:
        # ASCII digits, a few of them: int() of other scripts' digits works, of 4,300 fails.
        if argument and not (argument.isascii() and argument.isdigit() and len(argument) <= 9):
            raise click.UsageError("\\ledger takes a number of records, e.g. \\ledger 5")
        count = int(argument) if argument else DEFAULT_LEDGER_ROWS
        records = self.session.filter.store.records()
        table = Table("seq", "time", "kind", "analyst", "query / epsilon")
        note = f"last {min(count, len(records))} of {len(records)} ledger record(s)"
        for record in records[-count:] if count else []:
            p = dict(record.payload)
            if record.kind == "charge":
                what = f"epsilon {p.get('epsilon')}, delta {p.get('delta')}: {p.get('query')}"
            elif record.kind == "release":
                what = f"release of charge #{p.get('charge')}"
            elif record.kind == "reserve":
                what = f"served from release #{p.get('release')}: {p.get('query')}"
            elif record.kind == "failure":  # the cause is the owner's to read (dpsql report)
                what = f"charge #{p.get('charge')} failed in the engine; its charge stands"
            elif record.kind in ("budget_add", "allocate"):
                who = f"{p['analyst']}: " if "analyst" in p else "+"
                what = f"{who}epsilon {p.get('epsilon')}, delta {p.get('delta')} ({p.get('why')})"
            else:
                what = ""
            analyst = record.analyst or p.get("by") or ""
            when = iso_time(record.time)[:19] + "Z"  # to the second
            table.add_row(str(record.seq), when, record.kind, analyst, what)
        return self._show(table, Text(note))

    def _explain(self, argument: str) -> str:
        if not argument:
            raise click.UsageError("\\explain needs a query, e.g. \\explain SELECT COUNT(*) FROM t")
        plan = self.session.plan(argument)
        hit = self.session.cache.lookup(plan, cache.keys(plan, self.session.policy))
        cost = f"epsilon {_num(plan.event.epsilon)}, delta {_num(plan.event.delta)}"
        if hit is not None:
            verdict = f"would be served from the cache (release #{hit.release_seq}), no charge"
        else:
            verdict = f"would charge {cost}"
        lines = [*plan.explain(), f"{verdict}; nothing was charged"]
        return "\n".join(lines) + "\n"

    def _tables(self, _: str) -> str:
        table = Table("table", "privacy unit", "L0 groups/unit", "C rows/unit/group", "columns")
        catalog = self.session.engine.catalog
        for name, spec in sorted(self.session.policy.tables.items()):
            unit = "(public table)" if spec.public else str(spec.privacy_unit)
            l0, c = spec.max_groups_per_unit, spec.max_rows_per_unit_per_group
            table.add_row(name, unit, str(l0 or ""), str(c or ""), str(len(catalog.get(name, {}))))
        return self._show(table)

    def _describe(self, argument: str) -> str:
        name = argument.lower()
        spec = self.session.policy.tables.get(name)
        if not name or spec is None:
            known = ", ".join(sorted(self.session.policy.tables))
            raise click.UsageError(f"\\describe needs a table of the policy: {known}")
        table = Table("column", "type", "bounds", "public domain")
        note = "public table" if spec.public else f"{name}: privacy unit {spec.privacy_unit}"
        for column, dtype in self.session.engine.catalog.get(name, {}).items():
            col = spec.columns.get(column)
            bounds, domain = "", ""
            if col is not None and (col.lower is not None or col.upper is not None):
                bounds = f"[{exact(col.lower) or '-inf'}, {exact(col.upper) or 'inf'}]"
            if col is not None and col.public_values is not None:
                domain = ", ".join(str(v) for v in col.public_values)
            elif col is not None and col.public_values_from is not None:
                domain = f"from {col.public_values_from}"
            if column == spec.privacy_unit:
                domain = "(privacy unit)"
            table.add_row(column, dtype, bounds, domain)
        return self._show(table, Text(note))

    def _cache(self, _: str) -> str:
        releases = [r for r in self.session.filter.store.records() if r.kind == "release"]
        table = Table("release", "charge", "key", "query")
        note = f"{len(releases)} cached release(s); served again at no charge"
        for record in releases[-5:]:
            p = dict(record.payload)
            table.add_row(str(record.seq), str(p.get("charge")), str(p.get("key"))[:12],
                          str(p.get("query")))  # fmt: skip
        return self._show(table, Text(note))

    def _help(self, _: str) -> str:
        lines = ["End a statement with ';' (it may span lines). Ctrl-C cancels the input, "
                 "Ctrl-D leaves.", "SET dpsql.<setting> = value; SHOW dpsql.budget;"]  # fmt: skip
        lines += [f"  {name} {args}".ljust(22) + text for name, (args, text) in META.items()]
        return "\n".join(lines) + "\n"


# -- the loops ------------------------------------------------------------------------------------
def _lines(input: IO[str]) -> Iterator[str]:
    """The lines of ``input``, none read past ``MAX_INPUT`` characters: a stream without line
    ends (``/dev/zero``) must not fill memory."""
    while line := input.readline(MAX_INPUT + 1):
        if len(line) > MAX_INPUT:
            raise InputError(f"a line of standard input is longer than {MAX_INPUT} characters")
        yield line


def run_shell(session: Session | Shell, input: IO[str], output: IO[str]) -> None:
    """Read inputs from a text stream (no terminal): statements end at ``;``, a meta-command
    at the end of its line; the prompt is written before each input, as a terminal shows it.
    An input longer than ``MAX_INPUT`` characters ends the shell with an ``InputError``."""
    shell = session if isinstance(session, Shell) else Shell(session)
    pending: list[str] = []
    size = 0
    output.write(shell.prompt())
    for line in _lines(input):
        pending.append(line)
        size += len(line)
        if size > MAX_INPUT:
            raise InputError(f"an input of the shell is longer than {MAX_INPUT} characters")
        # An incomplete input (whole lines) becomes complete only through a line holding a
        # semicolon, or closing a block comment after the last one: other lines need no new
        # tokenization of everything pending, which would be quadratic in the input's size.
        if len(pending) > 1 and ";" not in line and "*/" not in line:
            output.write("   ...> ")
            continue
        text = "".join(pending)
        if not is_complete(text):
            output.write("   ...> ")
            continue
        pending.clear()
        size = 0
        output.write(shell.handle(text))
        if shell.finished:
            return
        output.write(shell.prompt())
    if "".join(pending).strip():
        output.write(shell.handle("".join(pending)))


def _bindings() -> KeyBindings:
    bindings = KeyBindings()

    @bindings.add("enter")
    def _enter(event: KeyPressEvent) -> None:
        buffer = event.current_buffer
        state = buffer.complete_state
        if state is not None and state.current_completion is not None:
            buffer.apply_completion(state.current_completion)
        elif is_complete(buffer.text):
            buffer.validate_and_handle()
        else:
            buffer.insert_text("\n")

    return bindings


def interactive(shell: Shell, history: Path | None) -> None:
    """The terminal loop: Ctrl-C drops the current input, Ctrl-D (on an empty line) leaves."""
    prompt: PromptSession[str] = PromptSession(
        history=FileHistory(str(history)) if history is not None else InMemoryHistory(),
        completer=shell.completer,
        multiline=True,
        key_bindings=_bindings(),
        prompt_continuation=lambda width, line, wrap: "...> ".rjust(width),
        bottom_toolbar=shell.toolbar,
        complete_while_typing=False,
    )
    while not shell.finished:
        try:
            text = prompt.prompt(shell.prompt())
        except KeyboardInterrupt:
            continue
        except EOFError:
            break
        try:
            sys.stdout.write(shell.handle(text))
        except KeyboardInterrupt:  # while a query ran: its charge, if committed, stays
            sys.stdout.write("cancelled\n")
            shell.refresh()
        sys.stdout.flush()


def _small_file(path: Path) -> bool:
    return path.is_file() and path.stat().st_size <= MAX_HISTORY_BYTES


@click.command("shell")
@click.option(
    "--history",
    type=click.Path(dir_okay=False, path_type=Path),
    default=DEFAULT_HISTORY,
    show_default=True,
    help="The file that keeps the shell's input history between sessions.",
)
@click.option("--no-history", is_flag=True, help="Keep no history file (memory only).")
@pass_config
def shell_command(config: Config, history: Path, no_history: bool) -> None:
    """An interactive SQL prompt over the policy's data, as --analyst; the budget stays in view."""
    kept = None if no_history else history.expanduser()
    if kept is not None and not kept.parent.is_dir():
        raise click.BadParameter(f"no directory {kept.parent}", param_hint="'--history'")
    # prompt_toolkit reads the whole history file when the shell starts: only a regular file
    # of bounded size (not a FIFO, not /dev/zero) may be one.
    if kept is not None and kept.exists() and not _small_file(kept):
        raise click.BadParameter(
            f"{kept} is not a regular file of at most {MAX_HISTORY_BYTES} bytes",
            param_hint="'--history'",
        )
    session = Session(config.policy(), config.analyst)
    try:
        if sys.stdin.isatty() and sys.stdout.isatty():
            width = shutil.get_terminal_size().columns
            shell = Shell(session, width=width, color=not is_dumb_terminal())
            click.echo("dpsql shell: end statements with ';', \\help for help, Ctrl-D to leave")
            interactive(shell, kept)
        else:
            run_shell(Shell(session), sys.stdin, sys.stdout)
    finally:
        session.close()


def _standalone(policy_path: Path | None, analyst: str | None, **options: Any) -> None:
    ctx = click.get_current_context()
    ctx.obj = Config(policy_path, analyst)
    try:
        ctx.invoke(shell_command, **options)
    except DpsqlError as exc:
        fail(ctx, f"{type(exc).__name__}: {exc}", exit_code(exc))
    except (click.ClickException, click.exceptions.Exit, click.Abort):
        raise
    except Exception as exc:  # only the class: the message might quote data
        fail(ctx, f"internal error ({type(exc).__name__})", EXIT_INTERNAL)


# The shell on its own, with the group's --policy and --analyst (and their variables), for
# ``python -m dpsql.interfaces.shell``; errors map to the same exit codes as under ``dpsql``.
standalone = click.Command(
    "shell",
    params=[POLICY_OPTION, ANALYST_OPTION, *shell_command.params],
    callback=_standalone,
    help=shell_command.help,
)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """``python -m dpsql.interfaces.shell [--policy FILE] [--analyst NAME] [shell options]``."""
    standalone.main(args=list(argv) if argv is not None else None, prog_name="dpsql shell")
    sys.exit(0)  # pragma: no cover - main exits in standalone mode


__all__ = [
    "Shell",
    "SqlCompleter",
    "interactive",
    "is_complete",
    "run_shell",
    "shell_command",
    "standalone",
]

if __name__ == "__main__":  # pragma: no cover
    main()
