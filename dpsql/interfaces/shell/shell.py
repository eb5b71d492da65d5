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

This module holds the loops (``run_shell``, ``interactive``) and the commands (``dpsql shell``,
``python -m dpsql.interfaces.shell.shell``). ``Shell`` and its meta-commands are in
``shell_core.py``; what decides that an input is complete, splits it and completes it, in
``shell_input.py``. Their names are re-exported here.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any, NoReturn

import click
from prompt_toolkit import PromptSession
from prompt_toolkit.history import FileHistory, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from prompt_toolkit.utils import is_dumb_terminal

from dpsql.errors import DpsqlError, InputError
from dpsql.interfaces.cli.context import (
    ANALYST_OPTION,
    EXIT_INTERNAL,
    POLICY_OPTION,
    Config,
    exit_code,
    fail,
    pass_config,
)
from dpsql.interfaces.shell.core import Shell
from dpsql.interfaces.shell.input import is_complete
from dpsql.session.session import Session
from dpsql.sql.parse import MAX_QUERY_LENGTH

DEFAULT_HISTORY = "~/.dpsql_history"
MAX_INPUT = MAX_QUERY_LENGTH  # characters of one input read from a stream: one query's worth
MAX_HISTORY_BYTES = 16 << 20


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
            piped = Shell(session)
            run_shell(piped, sys.stdin, sys.stdout)
            if piped.error is not None:
                # Like a script: a refused or failed statement makes the run fail, with the
                # exit code of the first one (its message is in the output already).
                click.get_current_context().exit(exit_code(piped.error))
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
# ``python -m dpsql.interfaces.shell.shell``; errors map to the same exit codes as under ``dpsql``.
standalone = click.Command(
    "shell",
    params=[POLICY_OPTION, ANALYST_OPTION, *shell_command.params],
    callback=_standalone,
    help=shell_command.help,
)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """``python -m dpsql.interfaces.shell.shell [--policy FILE] [--analyst NAME] [shell
    options]``."""
    standalone.main(args=list(argv) if argv is not None else None, prog_name="dpsql shell")
    sys.exit(0)  # pragma: no cover - main exits in standalone mode


__all__ = ["interactive", "run_shell", "shell_command", "standalone"]

if __name__ == "__main__":  # pragma: no cover
    main()
