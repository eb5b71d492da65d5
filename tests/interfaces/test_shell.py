"""``dpsql shell``: the core loop without a terminal, then as a person uses it in a real pty.

Every test writes a policy whose ``[ledger]`` lives in its tmp_path (created with
``Ledger.create``) over the example data (examples/data/visits.parquet, by absolute path), so
budget figures are exact: a total epsilon of 1 and a default query epsilon of 1/4.
"""

from __future__ import annotations

import io
import os
import re
import sys
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from prompt_toolkit.completion import CompleteEvent
from prompt_toolkit.document import Document

from dpsql.accounting.budget.report import figure_left, figure_value, spent_text
from dpsql.accounting.ledger.store import create_ledger
from dpsql.interfaces.cli.context import Config
from dpsql.interfaces.shell.core import Shell, _cell
from dpsql.interfaces.shell.input import META, is_complete, split_statements
from dpsql.interfaces.shell.shell import run_shell, shell_command, standalone
from dpsql.policy import load_policy
from dpsql.session.session import Session
from dpsql.session.settings import NAMES as SETTINGS

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "examples" / "data" / "visits.parquet"
DOC = ROOT / "docs" / "cli.md"
COUNT = "SELECT COUNT(*) AS n FROM visits"
BY_REGION = "SELECT region, COUNT(*) AS n, AVG(spend) AS mean FROM visits GROUP BY region"

POLICY = """
[dataset]
id = "visits-shell"
data_version = "v1"

[data]
tables = {{ visits = "{data}" }}

[budget]
diagnose = false
epsilon = 1.0
delta = 1e-6
query_epsilon = 0.25
query_delta = 1e-8

[tables.visits]
privacy_unit = "user_id"
max_groups_per_unit = 2
max_rows_per_unit_per_group = 10

[tables.visits.columns.age]
lower = 18
upper = 90

[tables.visits.columns.spend]
lower = 0
upper = 200

[tables.visits.columns.region]
public_values = ["central", "east", "north", "south", "west"]
{ledger}
"""


@pytest.fixture(autouse=True)
def _example_data() -> None:
    if not DATA.exists():
        pytest.skip("run `make demo` (or examples/make_data.py) to create the example data")


def write_policy(folder: Path, ledger: bool = True) -> Path:
    path = folder / "policy.toml"
    section = '[ledger]\npath = "visits.ledger"\n' if ledger else ""
    path.write_text(POLICY.format(data=DATA, ledger=section), encoding="utf-8")
    if ledger:
        policy = load_policy(path)
        assert policy.ledger is not None
        create_ledger(policy)
    return path


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    return write_policy(tmp_path)


@pytest.fixture
def shell(policy: Path) -> Iterator[Shell]:
    session = Session(policy, "ann")
    yield Shell(session)
    session.close()


def one_error(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), text
    assert "Traceback" not in text
    return lines[0]


# -- queries ------------------------------------------------------------------------------------
def test_a_query_shows_values_with_accuracy_and_its_charge(shell: Shell) -> None:
    assert shell.prompt() == "dpsql (eps 0/1)> "
    shown = shell.handle(BY_REGION + ";")
    for region in ("central", "east", "north", "south", "west"):
        assert region in shown
    # every noisy cell is "value ± half-width"; the keys (public regions) are not noisy
    assert len(re.findall(r"-?\d+(\.\d+)? ± \d+(\.\d+)?", shown)) == 10
    assert "5 row(s); ± at 0.95 confidence; charged epsilon 0.25, delta 0" in shown
    assert "(ledger record #2)" in shown  # record #1 pins the budget
    assert shell.prompt() == "dpsql (eps 0.25/1)> "
    assert shell.toolbar() == (
        "epsilon 0.25 spent of 1 (0.75 left) | delta 0 of 0.000001 | basic decides | "
        "1 charged queries"
    )


def test_a_repeated_query_is_served_from_the_cache_at_no_charge(shell: Shell) -> None:
    first = shell.handle(COUNT + ";")
    second = shell.handle(COUNT + ";")
    assert "served from the cache (release #3), no charge" in second
    assert "charged" not in second.replace("no charge", "")
    # the same released value is shown again
    assert re.findall(r"\d+ ± \d+", first) == re.findall(r"\d+ ± \d+", second)
    assert shell.report.queries == 1 and shell.prompt() == "dpsql (eps 0.25/1)> "


def test_several_statements_and_settings_in_one_input(shell: Shell) -> None:
    shown = shell.handle("SET dpsql.epsilon = 0.5; SHOW dpsql.epsilon; SELECT 'a;b' = region AS x, "
                         "COUNT(*) AS n FROM visits GROUP BY region;")  # fmt: skip
    assert "SET dpsql.epsilon" in shown and "0.5" in shown
    assert "charged epsilon 0.5" in shown
    assert shell.prompt() == "dpsql (eps 0.5/1)> "


def test_sql_explain_charges_nothing(shell: Shell) -> None:
    shown = shell.handle("EXPLAIN " + COUNT + ";")
    assert "cost: epsilon 0.25, delta 0" in shown and shown.endswith("nothing was charged\n")
    assert shell.report.queries == 0


# -- errors ---------------------------------------------------------------------------------------
def test_errors_are_one_readable_line(shell: Shell) -> None:
    assert one_error(shell.handle("SELEC nonsense;")).startswith("Error: ParseError: ")
    line = one_error(shell.handle("SELECT nope FROM visits;"))
    assert line.startswith("Error: SchemaError: ") and "nope" in line
    assert one_error(shell.handle("SET dpsql.nonsense = 1;")).startswith("Error: ParameterError")
    assert one_error(shell.handle("\\bogus")) == "Error: unknown meta-command \\bogus; try \\help"
    assert shell.report.queries == 0 and not shell.finished


def test_budget_exceeded_is_one_line_and_charges_nothing(shell: Shell) -> None:
    shell.handle("SET dpsql.epsilon = 0.9;")
    assert "charged epsilon 0.9" in shell.handle(COUNT + ";")
    line = one_error(shell.handle("SELECT SUM(age) AS s FROM visits;"))
    assert line.startswith("Error: BudgetExceededError: ")
    assert shell.prompt() == "dpsql (eps 0.9/1)> "


def test_an_internal_error_shows_only_its_class(
    shell: Shell, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise KeyError("a secret data value")

    monkeypatch.setattr(shell.session, "execute", broken)
    line = one_error(shell.handle(COUNT + ";"))
    assert line == "Error: internal error (KeyError); please report this dpsql bug"


# -- meta-commands --------------------------------------------------------------------------------
def test_budget_shows_every_accountant_and_its_note(shell: Shell) -> None:
    shell.handle(COUNT + ";")
    shown = shell.handle("\\budget compare")
    assert "epsilon 0.25 spent of 1 (0.75 left)" in shown and "basic composition decides" in shown
    figures = shell.session.budget().figures
    assert len(figures) >= 5
    for figure in figures:
        spent = spent_text(figure_value(figure.epsilon))
        left = re.escape(figure_left(figure, Fraction(1)))
        assert re.search(rf"{figure.accountant}\s+│\s+{spent}\s+│\s+{left}\s+│\s+{figure.note}",
                         shown), figure  # fmt: skip


def test_ledger_shows_the_last_records(shell: Shell) -> None:
    shell.handle(COUNT + ";")
    shell.handle(COUNT + ";")
    shown = shell.handle("\\ledger")
    for seq, kind in ((1, "budget"), (2, "charge"), (3, "release"), (4, "reserve")):
        assert re.search(rf"│ {seq}\s+│ [\dT:.Z-]+ │ {kind}\s+│", shown), (seq, kind)
    assert "epsilon 0.25" in shown and "ann" in shown and "last 4 of 4 ledger record(s)" in shown
    last = shell.handle("\\ledger 1")
    assert "reserve" in last and "charge " not in last and "last 1 of 4" in last
    assert one_error(shell.handle("\\ledger many")).startswith("Error: \\ledger takes a number")


def test_explain_plans_without_charging_and_knows_the_cache(shell: Shell) -> None:
    shown = shell.handle("\\explain " + COUNT)
    assert "cost: epsilon 0.25, delta 0" in shown
    assert "would charge epsilon 0.25, delta 0; nothing was charged" in shown
    assert shell.report.queries == 0
    assert [r.kind for r in shell.session.filter.store.records()] == ["budget"]
    shell.handle(COUNT + ";")
    again = shell.handle("\\explain " + COUNT + ";")
    assert "would be served from the cache (release #3), no charge" in again
    assert one_error(shell.handle("\\explain")).startswith("Error: \\explain needs a query")
    assert one_error(shell.handle("\\explain SELECT x FROM nowhere")).startswith("Error: Schema")


def test_tables_and_describe_come_from_the_policy(shell: Shell) -> None:
    tables = shell.handle("\\tables")
    assert re.search(r"visits\s+│ user_id\s+│ 2\s+│ 10\s+│ 5", tables), tables
    shown = shell.handle("\\describe visits")
    assert re.search(r"user_id\s+│ BIGINT\s+│\s+│ \(privacy unit\)", shown)
    assert re.search(r"age\s+│ INTEGER\s+│ \[18, 90\]", shown)
    assert re.search(r"spend\s+│ DOUBLE\s+│ \[0, 200\]", shown)
    assert re.search(r"region\s+│ VARCHAR\s+│\s+│ central, east, north, south, west", shown)
    assert "day" in shown and "visits: privacy unit user_id" in shown
    line = one_error(shell.handle("\\describe nowhere"))
    assert line == "Error: \\describe needs a table of the policy: visits"


def test_cache_lists_the_releases(shell: Shell) -> None:
    assert "0 cached release(s)" in shell.handle("\\cache")
    shell.handle(COUNT + ";")
    shell.handle(BY_REGION + ";")
    shown = shell.handle("\\cache")
    assert "2 cached release(s); served again at no charge" in shown
    assert "SELECT COUNT(*) AS n FROM visits" in shown and "GROUP BY region" in shown


def test_help_lists_every_meta_command_and_quit_ends(shell: Shell) -> None:
    shown = shell.handle("\\help")
    for name in META:
        assert name in shown
    assert not shell.finished
    assert shell.handle("\\quit") == "" and shell.finished


# -- input, formatting, completion ---------------------------------------------------------------
def test_input_is_complete_at_a_semicolon_token() -> None:
    assert is_complete("SELECT 1;") and is_complete("SELECT 1 ;  \n") and is_complete("")
    assert is_complete("\\tables") and is_complete("quit")
    assert not is_complete("SELECT 1") and not is_complete("SELECT 'a;")
    assert not is_complete("SELECT 1 -- done;")
    assert split_statements("SELECT 'a;b'; SET dpsql.epsilon = 1;") == [
        "SELECT 'a;b'",
        "SET dpsql.epsilon = 1",
    ]


def test_cells_show_value_plus_minus_half_width() -> None:
    assert _cell(18120, 719.0) == "18120 ± 719"
    assert _cell(31.4452, 8.26) == "31.4 ± 8.3"
    assert _cell(0.123456, 0.0123) == "0.123 ± 0.013"  # a half-width is rounded up
    assert _cell(31.4452, None) == "31.4452" and _cell(None, 3.0) == "NULL"
    assert _cell("east", None) == "east"


def completions(shell: Shell, text: str) -> list[str]:
    found = shell.completer.get_completions(
        Document(text), CompleteEvent(completion_requested=True)
    )
    return [text[: len(text) + c.start_position] + c.text for c in found]


def test_completion_of_tables_columns_keywords_settings_and_meta(shell: Shell) -> None:
    assert completions(shell, "SELECT COUNT(*) FROM vis") == ["SELECT COUNT(*) FROM visits"]
    assert "SELECT reg" + "ion" in completions(shell, "SELECT reg")
    assert "SELECT spend" in completions(shell, "SELECT sp")
    assert completions(shell, "SEL") == ["SELECT"] and completions(shell, "sel") == ["select"]
    assert "SELECT region FROM visits GROUP BY" in completions(
        shell, "SELECT region FROM visits GR"
    )
    names = completions(shell, "SET dpsql.")
    assert names == [f"SET dpsql.{name}" for name in SETTINGS]
    assert completions(shell, "set dpsql.eps") == ["set dpsql.epsilon"]
    assert "SHOW dpsql.budget" in completions(shell, "SHOW dpsql.b")
    assert completions(shell, "\\de") == ["\\describe"]
    assert completions(shell, "\\describe vi") == ["\\describe visits"]
    assert completions(shell, "SELECT ") == []


# -- the loops and the command --------------------------------------------------------------------
def test_run_shell_reads_multi_line_input_until_quit(shell: Shell) -> None:
    lines = ["SELECT COUNT(*)\n", "  AS n\n", "FROM visits;\n", "\\tables\n", "\\quit\n", COUNT]
    output = io.StringIO()
    run_shell(shell, io.StringIO("".join(lines)), output)
    text = output.getvalue()
    assert text.startswith("dpsql (eps 0/1)>    ...>    ...> ")
    assert "charged epsilon 0.25" in text and "dpsql (eps 0.25/1)> " in text
    assert text.count("row(s)") == 1  # the line after \quit never ran


def invoke(policy: Path, args: list[str], stdin: str) -> click.testing.Result:
    group = click.Group()
    group.add_command(shell_command)
    return CliRunner().invoke(group, ["shell", *args], input=stdin, obj=Config(policy, "ann"))


def test_the_command_on_piped_input(policy: Path) -> None:
    result = invoke(policy, ["--no-history"], BY_REGION + ";\n\\budget\n")
    assert result.exit_code == 0, result.output
    assert "charged epsilon 0.25" in result.output and "basic composition decides" in result.output


def test_a_history_file_in_a_missing_directory_is_a_usage_error(
    policy: Path, tmp_path: Path
) -> None:
    result = invoke(policy, ["--history", str(tmp_path / "nowhere" / "history")], "")
    assert result.exit_code == 2 and "--history" in result.output


def test_the_standalone_entry_maps_errors_to_exit_codes(tmp_path: Path) -> None:
    unledgered = write_policy(tmp_path, ledger=False)
    runner = CliRunner()
    result = runner.invoke(standalone, ["--policy", str(unledgered)])
    assert result.exit_code == 7
    assert one_error(result.stderr).startswith("Error: PolicyError: the policy has no [ledger]")
    result = runner.invoke(standalone, [])
    assert result.exit_code == 2 and "--policy" in result.stderr


# -- the documentation ----------------------------------------------------------------------------
def test_every_option_and_meta_command_is_documented() -> None:
    text = DOC.read_text(encoding="utf-8")
    match = re.search(r"^## `dpsql shell`\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, "docs/cli.md has no section '## `dpsql shell`'"
    section = match.group(1)
    for param in shell_command.params:
        for opt in param.opts:
            assert f"`{opt}" in section, opt
    for name in META:
        assert f"`{name}" in section, name
    for key in ("Ctrl-C", "Ctrl-D", "Tab", "Enter"):
        assert key in section, key


# -- as a person uses it: a real pseudo-terminal --------------------------------------------------
def _terminal_env() -> dict[str, str]:
    """The environment without COLUMNS and LINES: a parallel test runner sets them (80x24), and
    they would override the pseudo-terminal's own size, as they do in a real terminal."""
    return {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}


def test_the_shell_in_a_real_terminal(policy: Path, tmp_path: Path) -> None:
    pexpect = pytest.importorskip("pexpect")
    history = tmp_path / "history"
    env = {**_terminal_env(), "TERM": "xterm", "DPSQL_ANALYST": "ann"}
    child = pexpect.spawn(
        sys.executable,
        ["-m", "dpsql.interfaces.shell.shell", "--policy", str(policy), "--history", str(history)],
        env=env, encoding="utf-8", timeout=30, dimensions=(40, 120),
    )  # fmt: skip

    def prompt() -> tuple[str, str]:
        """Answer the terminal's cursor-position request (as a terminal does), then read the
        budget in the prompt and in the bottom toolbar."""
        child.expect(re.escape("\x1b[6n"))
        child.send("\x1b[5;1R")
        child.expect(r"dpsql \(eps ([\d.]+)/1\)>")
        in_prompt = child.match.group(1)
        child.expect(r"epsilon ([\d.]+) spent of 1 \(([\d.]+) left\) \| delta 0 of 0.000001 \| "
                     r"basic decides")  # fmt: skip
        return in_prompt, child.match.group(1)

    try:
        assert prompt() == ("0", "0")
        # a query typed over two lines, its table name completed with Tab
        child.send("SELECT COUNT(*) AS n FROM vis")
        child.send("\t")
        child.expect("its")  # the rest of "visits", written by the completion
        child.send("\r")
        child.expect(re.escape("...>"))  # no ';' yet: the continuation prompt
        child.send(";\r")
        child.expect(r"\d+ ± \d+")
        child.expect(re.escape("charged epsilon 0.25, delta 0"))
        assert prompt() == ("0.25", "0.25")
        child.send("\\describe visits\r")
        child.expect(re.escape("[18, 90]"))
        assert prompt() == ("0.25", "0.25")
        child.send("SELECT nope FROM visits;\r")
        child.expect("Error: SchemaError: [^\r\n]*nope")
        assert prompt() == ("0.25", "0.25")
        # Ctrl-C drops the input typed so far; the next input is read on its own
        child.send("SELECT bogus")
        child.sendcontrol("c")
        assert prompt() == ("0.25", "0.25")
        child.send("\\budget compare\r")
        child.expect(r"rdp\s+│ 0\.2\d+\s+│ 0\.7\d+\s+│ as if fixed in advance")
        assert prompt() == ("0.25", "0.25")
        child.sendcontrol("d")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, child.before
    assert "Traceback" not in (child.before or "")
    kept = history.read_text(encoding="utf-8")
    assert "SELECT COUNT(*) AS n FROM visits" in kept and "bogus" not in kept


def test_the_shell_on_a_dumb_terminal(policy: Path) -> None:
    # No cursor movement, no colours, no toolbar: the budget is in the prompt.
    pexpect = pytest.importorskip("pexpect")
    env = {**_terminal_env(), "TERM": "dumb"}
    child = pexpect.spawn(
        sys.executable, ["-m", "dpsql.interfaces.shell.shell", "--policy", str(policy),
        "--no-history"], env=env, encoding="utf-8", timeout=30, dimensions=(40, 120),
    )  # fmt: skip
    try:
        child.expect(re.escape("dpsql (eps 0/1)> "))
        child.send("SELECT COUNT(*) AS n FROM visits;\r")
        child.expect(re.escape("dpsql (eps 0.25/1)> "))
        shown = child.before
        # \quit, not Ctrl-D: on a dumb terminal prompt_toolkit writes the prompt before it puts
        # the tty in raw mode, so a Ctrl-D sent at once would be the tty's own end-of-file.
        child.send("\\quit\r")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    assert "charged epsilon 0.25, delta 0" in shown
    assert "\x1b[" not in shown and re.search(r"│\s+-?\d+ ± \d+ │", shown), shown


def test_the_other_group_is_set_and_explained_in_the_shell(shell: Shell) -> None:
    shown = shell.handle("SET dpsql.other_group = on; SET dpsql.other_label = 'elsewhere';")
    assert "SET dpsql.other_group" in shown and "SET dpsql.other_label" in shown
    explained = shell.handle("EXPLAIN " + BY_REGION + ";")
    assert "other group keyed 'elsewhere'" in explained
    shown = shell.handle(BY_REGION + ";")
    assert "elsewhere" in shown and "6 row(s)" in shown  # five regions and the other group
    # Several statements at once are planned as one workload: the error names the statement,
    # and nothing of the input ran (its SET neither).
    line = one_error(shell.handle("SET dpsql.other_label = 'east'; " + BY_REGION + ";"))
    assert line.startswith(
        "Error: ParameterError: statement 2 (line 1): dpsql.other_label equals a value"
    )
    assert "elsewhere" in shell.handle("SHOW dpsql.other_label;")
