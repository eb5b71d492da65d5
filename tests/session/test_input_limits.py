"""Every input dpsql reads from a path or a stream is read with a limit.

The SQL file of ``dpsql run`` (a file, ``-`` for standard input, a FIFO, ``/dev/zero``, a
special file), the policy file, the users file of ``dpsql serve``, a password on standard
input, the lines the shell reads from a pipe: each is read no further than its limit plus one
byte, past which a typed error names the file (never its content); so is text that is not
UTF-8. A statement longer than 100,000 characters is refused before it is parsed, and the split
of a file into statements tokenizes a window at a time (its results equal a tokenization of
the whole text, which a generated comparison checks).
"""

from __future__ import annotations

import io
import os
import re
import resource
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
import sqlglot
from click.testing import CliRunner
from conftest import examples
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlglot.errors import TokenError
from sqlglot.tokenizer_core import TokenType

from dpsql import errors
from dpsql.accounting.ledger.ledger import Ledger
from dpsql.accounting.ledger.store import create_ledger
from dpsql.interfaces.cli import main as cli
from dpsql.interfaces.cli.batch import DEFAULT_MAX_BYTES
from dpsql.interfaces.cli.users import MAX_PASSWORD_BYTES, users
from dpsql.interfaces.pgwire.users import MAX_USERS_BYTES, add_user, load_users
from dpsql.interfaces.shell.core import Shell
from dpsql.interfaces.shell.shell import MAX_INPUT, run_shell
from dpsql.policy import MAX_POLICY_BYTES, load_policy
from dpsql.session.session import Session
from dpsql.sql import split
from dpsql.sql.split import MAX_STATEMENT_LENGTH, Piece, split_statements

SECRET = "CONTENT_NEVER_SHOWN_7781"


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("input-limits")
    data = folder / "visits.parquet"
    con = duckdb.connect()
    con.execute(
        f"COPY (SELECT (i % 30)::BIGINT AS user_id, (i % 90)::DOUBLE AS spend FROM range(300) "
        f"r(i)) TO '{data}' (FORMAT parquet)"
    )
    con.close()
    path = folder / "policy.toml"
    path.write_text(
        f"""
[dataset]
id = "input-limits"
[data]
tables = {{ visits = "{data}" }}
[ledger]
path = "ledger.sqlite"
[budget]
diagnose = false
epsilon = 100
query_epsilon = 0.1
[tables.visits]
privacy_unit = "user_id"
max_rows_per_unit_per_group = 5
[tables.visits.columns.spend]
lower = 0
upper = 100
""",
        encoding="utf-8",
    )
    create_ledger(load_policy(path))
    return path


def run(policy: Path, *args: str, stdin: bytes | None = None) -> object:
    return CliRunner().invoke(cli.cli, ["--policy", str(policy), *args], input=stdin)


def charges(policy: Path) -> int:
    return sum(1 for r in Ledger(policy.parent / "ledger.sqlite").records() if r.kind == "charge")


def refused(result: object, code: int, *words: str) -> str:
    output: str = result.output  # type: ignore[attr-defined]
    assert result.exit_code == code, output  # type: ignore[attr-defined]
    assert "Traceback" not in output and SECRET not in output
    for word in words:
        assert word in output, (word, output)
    return output


# -- the SQL file of dpsql run ---------------------------------------------------------------


def test_dev_zero_is_refused_within_bounded_memory(policy: Path) -> None:
    """The attack as found: ``dpsql run /dev/zero`` grew to 10 GB. Under a 1 GiB address-space
    limit it now exits 2 at once, naming the file."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "dpsql.interfaces.cli.main", "--policy", str(policy), "run",
         "/dev/zero"],
        capture_output=True, text=True, preexec_fn=limit, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"the SQL file /dev/zero is larger than {DEFAULT_MAX_BYTES} bytes" in done.stderr
    assert "Traceback" not in done.stderr
    assert time.monotonic() - started < 60


def test_a_file_over_max_bytes_is_refused_and_costs_nothing(policy: Path, tmp_path: Path) -> None:
    sql = tmp_path / "big.sql"
    sql.write_text(f"SELECT COUNT(*) FROM visits; -- {SECRET}\n" * 10, encoding="utf-8")
    size, before = sql.stat().st_size, charges(policy)
    refused(run(policy, "run", "--max-bytes", str(size - 1), str(sql)), 2,
            f"InputError: the SQL file {sql} is larger than {size - 1} bytes")  # fmt: skip
    assert charges(policy) == before
    ran = run(policy, "run", "--max-bytes", str(size), str(sql))
    assert ran.exit_code == 0, ran.output  # type: ignore[attr-defined]


@pytest.mark.parametrize("value", ["0", "-1", "abc", "1e3", "", str(2**31)])
def test_max_bytes_takes_a_positive_integer_up_to_a_gib(policy: Path, value: str) -> None:
    refused(run(policy, "run", "--max-bytes", value, "/dev/null"), 2, "--max-bytes")


def test_standard_input_is_read_with_the_limit(policy: Path) -> None:
    ok = run(policy, "run", "--quiet", "-", stdin=b"SELECT COUNT(*) AS n FROM visits;\n")
    assert ok.exit_code == 0, ok.output  # type: ignore[attr-defined]
    assert "standard input" not in ok.output  # type: ignore[attr-defined]
    refused(run(policy, "run", "--max-bytes", "100", "-", stdin=b"SELECT 1;" * 100), 2,
            "standard input is larger than 100 bytes")  # fmt: skip


def test_invalid_utf8_is_refused_naming_the_file(policy: Path, tmp_path: Path) -> None:
    sql = tmp_path / "latin1.sql"
    sql.write_bytes(f"SELECT COUNT(*) FROM visits; -- {SECRET} caf\xe9\n".encode("latin-1"))
    refused(run(policy, "run", str(sql)), 2, f"the SQL file {sql} is not UTF-8 text")
    refused(run(policy, "run", "-", stdin=b"SELECT 1; \xff\xfe"), 2, "standard input is not UTF-8")


def _fifo(tmp_path: Path, payload: bytes) -> Iterator[Path]:
    fifo = tmp_path / "queries.fifo"
    os.mkfifo(fifo)

    def write() -> None:
        try:
            with open(fifo, "wb") as handle:
                handle.write(payload)
        except BrokenPipeError:  # the reader stopped at its limit, as it should
            pass

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    yield fifo
    writer.join(timeout=10)


def test_a_fifo_is_read_with_the_limit(policy: Path, tmp_path: Path) -> None:
    for fifo in _fifo(tmp_path, b"SELECT 1;\n" * 100_000):
        refused(run(policy, "run", "--max-bytes", "4096", str(fifo)), 2,
                f"the SQL file {fifo} is larger than 4096 bytes")  # fmt: skip


def test_a_fifo_within_the_limit_runs(policy: Path, tmp_path: Path) -> None:
    for fifo in _fifo(tmp_path, b"SELECT COUNT(*) AS n FROM visits;\n"):
        result = run(policy, "run", "--quiet", str(fifo))
        assert result.exit_code == 0, result.output  # type: ignore[attr-defined]


@pytest.mark.parametrize("special", ["/proc/self/mem", "/dev/full", "/proc/1/environ"])
def test_special_files_are_typed_errors(policy: Path, special: str) -> None:
    result = run(policy, "run", "--max-bytes", "65536", special)
    # Unreadable (EIO), endless zeros, or a few bytes that are not SQL: never a crash.
    assert result.exit_code in (2, 3), result.output  # type: ignore[attr-defined]
    assert "Traceback" not in result.output and "internal" not in result.output  # type: ignore[attr-defined]


def test_a_directory_is_a_usage_error(policy: Path, tmp_path: Path) -> None:
    refused(run(policy, "run", str(tmp_path)), 2)


def test_a_statement_over_the_limit_is_refused_before_parsing(policy: Path, tmp_path: Path) -> None:
    sql = tmp_path / "long.sql"
    long = "SELECT COUNT(*) FROM visits WHERE " + " OR ".join(["spend > 1"] * 20_000)
    sql.write_text(f"SELECT COUNT(*) FROM visits;\n\n{long};\n", encoding="utf-8")
    before, started = charges(policy), time.monotonic()
    refused(run(policy, "run", str(sql)), 3,
            f"statement 2 (line 3) is longer than {MAX_STATEMENT_LENGTH} characters")  # fmt: skip
    assert time.monotonic() - started < 30
    assert charges(policy) == before


# -- the split, a window at a time ------------------------------------------------------------


def whole_text_split(text: str) -> list[Piece]:
    """The split as it was: the whole text tokenized at once (the oracle)."""
    tokens = sqlglot.tokenize(text, read="duckdb")
    pieces: list[Piece] = []
    start: int | None = None
    for token in [*tokens, None]:
        if token is None or token.token_type == TokenType.SEMICOLON:
            if start is not None:
                stop = token.start if token is not None else len(text)
                line = len(re.split(r"\r\n|\r|\n", text[:start]))
                pieces.append(Piece(len(pieces) + 1, line, text[start:stop].strip()))
            start = None
        elif start is None:
            start = token.start
    return pieces


FRAGMENTS = st.sampled_from([
    "SELECT 1", "SELECT COUNT(*) FROM visits", "'a;b'", "'it''s;'", '"x;y"', "/* c;\n */",
    "/* a /* b */ ;", "-- d;\n", ";", "\n", "\r\n", "\r", " ", "\t", "$$q;$$", "$t$ ; $t$",
    "E'\\';'", "SHOW dpsql.x", "EXPLAIN SELECT 2", "SET dpsql.epsilon = '0.1'", "x", "1e5",
    "é", "'", '"', "/*", "*/", "$$", "--", "$", "$q", "q;$$", "$1", "t$",
])  # fmt: skip


@settings(max_examples=examples(400), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(parts=st.lists(FRAGMENTS, max_size=14), window=st.sampled_from([1, 2, 3, 7, 64, 1 << 16]))
# A "$" the tokenizer read as a parameter because the window ended before its tag's closing
# "$": with more text it opens a dollar-quoted string over the window's later semicolons.
@example(
    parts=["SELECT COUNT(*) FROM visits", "$$q;$$", "$t$ ; $t$", "$$q;$$", "$$q;$$", "SELECT 1"],
    window=1,
)
@example(parts=["SELECT 1", "$$q;$$", ";", "$t$ ; $t$", "$$", "SELECT 2"], window=2)
def test_the_windowed_split_equals_the_whole_text_split(
    parts: list[str], window: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = "".join(parts)
    try:
        expected: list[Piece] | str = whole_text_split(text)
    except TokenError:
        expected = "error"
    with monkeypatch.context() as patch:
        patch.setattr(split, "_WINDOW", window)
        try:
            found: list[Piece] | str = split_statements(text)
        except errors.ParseError:
            found = "error"
    assert found == expected


def test_the_split_holds_one_window_of_tokens_not_the_file() -> None:
    """Statements of 20,000 tokens each: the peak memory of the split does not grow with their
    number (tokenized at once, 32 of them take 200 MB; 16 take 100 MB)."""

    def peak(statements: int) -> int:
        text = ("SELECT " + "1+" * 10_000 + "1;\n") * statements
        tracemalloc.start()
        try:
            pieces = split_statements(text)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
            assert len(pieces) == statements and pieces[-1].line == statements

    few, many = peak(4), peak(16)  # four times the statements (under tracemalloc, slow)
    assert many < 1.25 * few, (few, many)


def test_a_statement_longer_than_the_limit_is_refused_by_the_split() -> None:
    text = "SELECT 1;\n" + "SELECT '" + "x" * MAX_STATEMENT_LENGTH + "';"
    with pytest.raises(errors.ParseError, match=r"statement 2 \(line 2\) is longer"):
        split_statements(text)
    # An unterminated string that runs past the limit is refused the same way, at once.
    with pytest.raises(errors.ParseError, match=r"statement 1 .* is longer"):
        split_statements("SELECT '" + ";" * (3 * MAX_STATEMENT_LENGTH))


# -- the policy file ---------------------------------------------------------------------------


def test_policy_file_limits(tmp_path: Path) -> None:
    big = tmp_path / "big.toml"
    big.write_text("# " + SECRET + "x" * MAX_POLICY_BYTES + "\n", encoding="utf-8")
    cases = {
        big: f"is larger than {MAX_POLICY_BYTES} bytes",
        Path("/dev/zero"): f"is larger than {MAX_POLICY_BYTES} bytes",
        tmp_path: "cannot read the policy file",
        Path("/proc/self/mem"): "cannot read the policy file",
    }
    latin = tmp_path / "latin.toml"
    latin.write_bytes(f"# {SECRET} caf\xe9\n".encode("latin-1"))
    cases[latin] = "is not UTF-8 text"
    for path, message in cases.items():
        with pytest.raises(errors.PolicyError, match=message) as info:
            load_policy(path)
        assert SECRET not in str(info.value)
        result = CliRunner().invoke(cli.cli, ["--policy", str(path), "report"])
        # A folder is refused by the option itself (a usage error), the rest by the policy.
        assert result.exit_code == (2 if path.is_dir() else 7), result.output
        assert "Traceback" not in result.output and SECRET not in result.output


@pytest.mark.parametrize(
    "value",
    ["1e999999999", "1e-999999999", "1" + "0" * 5000, '"1e999999999"', '"1/0"', "nan", "inf"],
)
def test_policy_numbers_are_bounded_before_arithmetic(policy: Path, value: str) -> None:
    text = policy.read_text(encoding="utf-8").replace("epsilon = 100", f"epsilon = {value}")
    started = time.monotonic()
    with pytest.raises(errors.PolicyError):
        load_policy(_toml(text, policy.parent))
    assert time.monotonic() - started < 5


def _toml(text: str, folder: Path) -> Path:
    path = folder / "variant.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_policy_that_is_no_path_nor_mapping_is_a_policy_error() -> None:
    for weird in (123, None, b"policy.toml", ["policy.toml"]):
        with pytest.raises(errors.PolicyError):
            Session(weird)  # type: ignore[arg-type]


# -- the users file and the password -----------------------------------------------------------


def test_users_file_limits(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    add_user(path, "ann", "secret-password")
    assert set(load_users(path)) == {"ann"}
    path.write_text(" " * MAX_USERS_BYTES + path.read_text(encoding="utf-8"), encoding="utf-8")
    with pytest.raises(errors.PolicyError, match=f"larger than {MAX_USERS_BYTES} bytes"):
        load_users(path)
    for special in ("/dev/zero", "/proc/self/mem"):
        with pytest.raises(errors.PolicyError):
            load_users(special)


def test_a_password_on_standard_input_is_read_with_the_limit(tmp_path: Path) -> None:
    file_args = ["--users-file", str(tmp_path / "users.json")]
    runner = CliRunner()
    big = runner.invoke(users, ["add", "ann", *file_args, "--password-stdin"],
                        input=b"p" * (MAX_PASSWORD_BYTES + 1))  # fmt: skip
    refused(big, 2, "InputError: the password on standard input is larger than 4096 bytes")
    latin = runner.invoke(users, ["add", "ann", *file_args, "--password-stdin"], input=b"caf\xe9")
    refused(latin, 2, "not UTF-8")
    ok = runner.invoke(users, ["add", "ann", *file_args, "--password-stdin"],
                       input=b"p" * MAX_PASSWORD_BYTES)  # fmt: skip
    assert ok.exit_code == 0, ok.output


# -- the shell reading a pipe -----------------------------------------------------------------


class Endless(io.TextIOBase):
    """A text stream of one character without end, like ``/dev/zero`` decoded."""

    def readable(self) -> bool:
        return True

    def readline(self, size: int | None = -1) -> str:
        assert size is not None and 0 < size <= 10 * MAX_INPUT, "an unbounded read"
        return "0" * size


def test_a_stream_without_line_ends_stops_the_shell(policy: Path) -> None:
    session = Session(policy)
    try:
        with pytest.raises(errors.InputError, match=f"longer than {MAX_INPUT} characters"):
            run_shell(Shell(session), Endless(), io.StringIO())
        lines = io.StringIO("SELECT COUNT(*)\n" + "  + 1\n" * (MAX_INPUT // 6 + 10) + ";\n")
        with pytest.raises(errors.InputError, match="an input of the shell is longer"):
            run_shell(Shell(session), lines, io.StringIO())
    finally:
        session.close()
    result = CliRunner().invoke(cli.cli, ["--policy", str(policy), "shell", "--no-history"],
                                input="x" * (MAX_INPUT + 10))  # fmt: skip
    refused(result, 2, "InputError")


def test_the_shell_still_runs_inputs_of_many_lines(policy: Path) -> None:
    session = Session(policy)
    try:
        out = io.StringIO()
        text = (
            "SELECT COUNT(*)\n"
            + "  AS n\n"
            + "FROM visits /* a\n comment */\n;\n\\budget compare\n"
        )
        run_shell(Shell(session), io.StringIO(text), out)
        shown = out.getvalue()
        assert "   ...> " in shown and "accountant" in shown
        assert "charged epsilon" in shown or "served from the cache" in shown
    finally:
        session.close()


# -- the ledger's anchor and the shell's history ------------------------------------------------


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "huge"])
def test_the_anchor_is_read_with_a_limit(tmp_path: Path, kind: str) -> None:
    ledger = tmp_path / "visits.ledger"
    Ledger.create(ledger, "anchor-limits", budget={})
    anchor = tmp_path / "visits.ledger.anchor"
    anchor.unlink()
    if kind == "dev-zero":
        anchor.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(anchor)  # no writer: a blocking open would hang
    else:
        anchor.write_text(" " * (1 << 20) + "{}", encoding="utf-8")
    started = time.monotonic()
    with pytest.raises(errors.LedgerError, match=r"anchor .* cannot be read"):
        Ledger(ledger)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("history", ["/dev/zero", "fifo", "huge"])
def test_the_history_file_must_be_a_small_regular_file(
    policy: Path, tmp_path: Path, history: str
) -> None:
    path = Path(history)
    if history == "fifo":
        path = tmp_path / "history.fifo"
        os.mkfifo(path)
    elif history == "huge":
        path = tmp_path / "history"
        with open(path, "wb") as handle:
            handle.truncate((16 << 20) + 1)  # sparse: no disk needed
    result = run(policy, "shell", "--history", str(path), stdin=b"")
    refused(result, 2, "--history", "not a regular file of at most")


def test_a_dollar_not_closed_within_a_statement_s_length_is_refused_by_name() -> None:
    """Past the first window, the split cannot know where a statement with a bare ``$`` ends
    until the ``$``'s tag is closed: it refuses, naming the ``$`` and its line, rather than
    cut where the whole text might not."""
    text = "SELECT 1;\nSELECT $x;" + "SELECT 2;\n" * 20_000 + "SELECT $y$ a $y$"
    with pytest.raises(errors.ParseError, match=r"statement 2 \(line 2\): a \$ outside a string"):
        split_statements(text, max_length=1_000)
    # Closed within the statement's length, it splits as the whole text does.
    near = "SELECT 1;\nSELECT $x;" + "SELECT 2;\n" * 20 + "SELECT $y$ a $y$" + ";\n" * 40_000
    assert split_statements(near, max_length=1_000) == whole_text_split(near)
