"""Files that cannot be written or read: typed errors that name the file, and the budget safe.

The tests run as root in CI, where a read-only directory stops nothing, so the failures are
made real in other ways: a path under a regular file (ENOTDIR), ``/proc`` and ``/sys`` (no
files may be created there), a directory where a file must go (EISDIR), a symbolic link to
``/dev/full`` (every write fails with ENOSPC), and, where the test may mount, a tmpfs that is
full or read-only. No OS call is patched.

The ledger: every failure (at ``dpsql init``, at open, at a charge, at the anchor's write) is a
``LedgerError`` (exit code 6) naming the path, nothing is released without a durable charge,
and once the obstacle is gone the ledger verifies. ``dpsql run --output``: a folder that cannot
hold files is refused before anything runs; a file that cannot be written after the charges is
exit code 2 naming the file and its statement. Reports, exports and charts likewise.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import duckdb
import pytest
from click.testing import CliRunner
from conftest import examples
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import dpsql as dbapi
from dpsql import errors
from dpsql.accounting.ledger.anchor import anchor_path
from dpsql.accounting.ledger.ledger import Ledger
from dpsql.interfaces.cli import main as cli
from dpsql.session.session import Session

HYPOTHESIS = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
Q = "SELECT COUNT(*) AS n FROM visits"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("io-data") / "visits.parquet"
    con = duckdb.connect()
    con.execute(
        f"COPY (SELECT (i % 40)::BIGINT AS user_id, (i % 90)::DOUBLE AS spend FROM range(400) "
        f"r(i)) TO '{path}' (FORMAT parquet)"
    )
    con.close()
    return path


def write_policy(folder: Path, data: Path, ledger: str | Path = "visits.ledger") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "policy.toml"
    path.write_text(
        f"""
[dataset]
id = "io-failures"
[data]
tables = {{ visits = "{data}" }}
[ledger]
path = "{ledger}"
[budget]
diagnose = false
epsilon = 100
query_epsilon = 0.25
[tables.visits]
privacy_unit = "user_id"
max_rows_per_unit_per_group = 5
[tables.visits.columns.spend]
lower = 0
upper = 100
""",
        encoding="utf-8",
    )
    return path


def invoke(policy: Path, *args: str) -> Any:
    return CliRunner().invoke(cli.cli, ["--policy", str(policy), "--analyst", "ann", *args])


def failed(result: Any, code: int, *words: str) -> str:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output and "internal error" not in result.output
    for word in words:
        assert word in result.output, (word, result.output)
    return str(result.output)


@contextlib.contextmanager
def tmpfs(where: Path, size: str = "256k") -> Iterator[Path]:
    """A fresh tmpfs at ``where``, unmounted afterwards; skips where mounting is not allowed."""
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True, check=False,
    )  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN)")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def remount(where: Path, option: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{option}", str(where)], check=True)


def fill(folder: Path) -> None:
    """Write until the file system is full."""
    with contextlib.suppress(OSError), open(folder / "filler", "wb") as handle:
        while True:
            handle.write(b"\0" * 4096)
            handle.flush()


# -- the ledger -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "where",
    ["under-a-file", "/proc/dpsql-test.ledger", "/sys/dpsql-test.ledger", "/dev/full-dir/x"],
)
def test_init_where_no_file_can_be_made(data: Path, tmp_path: Path, where: str) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder", encoding="utf-8")
    ledger = blocker / "visits.ledger" if where == "under-a-file" else Path(where)
    policy = write_policy(tmp_path / "p", data, ledger)
    failed(invoke(policy, "init"), 6, "LedgerError: cannot create the ledger", str(ledger))
    assert not any(tmp_path.glob("p/*.ledger*"))


def test_init_on_a_read_only_file_system(data: Path, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro") as ro:
        remount(ro, "ro")
        policy = write_policy(tmp_path / "p", data, ro / "visits.ledger")
        failed(invoke(policy, "init"), 6, "cannot create the ledger", "read-only file system")


def test_init_on_a_full_file_system_leaves_nothing_behind(data: Path, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "full", "1m") as full:
        fill(full)
        policy = write_policy(tmp_path / "p", data, full / "visits.ledger")
        failed(invoke(policy, "init"), 6, "cannot create the ledger")
        assert sorted(p.name for p in full.iterdir()) == ["filler"]  # no half-made ledger
        (full / "filler").unlink()
        assert invoke(policy, "init").exit_code == 0  # and init works once there is room


def test_the_anchor_cannot_be_written_at_init(data: Path, tmp_path: Path) -> None:
    policy = write_policy(tmp_path / "p", data)
    ledger = tmp_path / "p" / "visits.ledger"
    anchor_path(ledger).with_name(anchor_path(ledger).name + f".{os.getpid()}.tmp").mkdir()
    failed(invoke(policy, "init"), 6, "anchor", "could not be written", "is a directory")
    assert not ledger.exists() and not anchor_path(ledger).exists()


def _ledger_dir(data: Path, folder: Path) -> tuple[Path, Path]:
    policy = write_policy(folder, data)
    assert invoke(policy, "init").exit_code == 0
    return policy, folder / "visits.ledger"


# Each place where the ledger's files live; a directory put there makes the OS refuse it.
OBSTACLES = {
    "lock": lambda ledger: ledger.with_name(ledger.name + ".lock"),
    "anchor-tmp": lambda ledger: anchor_path(ledger).with_name(
        anchor_path(ledger).name + f".{os.getpid()}.tmp"
    ),
    "wal": lambda ledger: ledger.with_name(ledger.name + "-wal"),
    "shm": lambda ledger: ledger.with_name(ledger.name + "-shm"),
}


def _block(path: Path) -> None:
    """Put a directory where the ledger needs a file (the file moved aside, if any)."""
    if path.exists():
        path.rename(path.with_name(path.name + ".aside"))
    path.mkdir()


def _unblock(path: Path) -> None:
    path.rmdir()
    aside = path.with_name(path.name + ".aside")
    if aside.exists():
        aside.rename(path)


@settings(HYPOTHESIS, max_examples=examples(30))
@given(
    obstacle=st.sampled_from(sorted(OBSTACLES)),
    before=st.integers(0, 3),
    after=st.integers(1, 3),
    through=st.sampled_from(["session", "dbapi"]),
)
def test_a_ledger_file_that_fails_at_any_point(
    data: Path, tmp_path_factory: pytest.TempPathFactory, *, obstacle: str, before: int,
    after: int, through: str,
) -> None:  # fmt: skip
    """``before`` queries answered, then a file of the ledger is made impossible, ``after``
    more asked: each answer has a durable charge, each failure is a LedgerError, and once the
    obstacle is gone the chain verifies and holds every answer's charge."""
    policy, ledger = _ledger_dir(data, tmp_path_factory.mktemp("ledger-fails"))
    answered = 0
    session = Session(policy, "ann")
    conn = dbapi.Connection(session)
    ask = session.execute if through == "session" else conn.cursor().execute
    try:
        for i in range(before):
            ask(Q, epsilon=f"0.0{i + 1}", fresh=True)
            answered += 1
        blocked = OBSTACLES[obstacle](ledger)
        _block(blocked)
        outcomes = []
        for i in range(after):
            try:
                ask(Q, epsilon=f"0.1{i + 1}", fresh=True)
                answered += 1
                outcomes.append("answered")
            except errors.LedgerError as exc:
                assert through == "session" or isinstance(exc, dbapi.LedgerFailure)
                assert "fail" in str(exc) or "cannot" in str(exc) or "could not" in str(exc)
                outcomes.append("refused")
        event(f"{obstacle}: {', '.join(sorted(set(outcomes)))}")
        _unblock(blocked)
    finally:
        conn.close()
    records = Ledger(ledger).records()  # opens and verifies against the anchor
    charged = [r for r in records if r.kind == "charge"]
    released = [r for r in records if r.kind == "release"]
    assert len(released) == answered  # an answer was given only with its charge and release
    assert len(charged) >= answered  # a charge whose release failed stays charged
    assert invoke(policy, "ledger", "verify").exit_code == 0


def test_open_and_verify_when_sqlite_cannot_make_its_files(data: Path, tmp_path: Path) -> None:
    policy, ledger = _ledger_dir(data, tmp_path / "p")
    # Without its write-ahead log SQLite cannot even read the ledger: open fails closed.
    wal = ledger.with_name(ledger.name + "-wal")
    _block(wal)
    failed(invoke(policy, "ledger", "verify"), 6, "LedgerError", f"the ledger file {ledger}")
    with pytest.raises(dbapi.LedgerFailure):
        dbapi.connect(policy)
    _unblock(wal)
    # Without its shared-memory index it reads, but no charge can be written: none released.
    shm = ledger.with_name(ledger.name + "-shm")
    _block(shm)
    assert invoke(policy, "ledger", "verify").exit_code == 0
    with dbapi.connect(policy) as conn, pytest.raises(dbapi.LedgerFailure, match=str(ledger)):
        conn.cursor().execute(Q)
    _unblock(shm)
    assert invoke(policy, "ledger", "verify").exit_code == 0
    assert charge_count(policy) == 0


def test_a_charge_on_a_file_system_turned_read_only(data: Path, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "fs", "4m") as fs:
        policy = write_policy(tmp_path / "p", data, fs / "visits.ledger")
        assert invoke(policy, "init").exit_code == 0
        session = Session(policy, "ann")
        try:
            session.execute(Q)
            # The ledger keeps its SQLite connection open for writing, and Linux refuses to
            # remount read-only a file system with a file open for writing (EBUSY): closed here,
            # it reopens on the read-only file system at the next charge.
            session.filter.store.close()
            remount(fs, "ro")
            with pytest.raises(errors.LedgerError) as info:
                session.execute(Q, epsilon="0.5")
            assert "nothing was released" in str(info.value) or "cannot" in str(info.value)
        finally:
            session.close()
        remount(fs, "rw")
        charges = [r for r in Ledger(fs / "visits.ledger").records() if r.kind == "charge"]
        assert [Fraction(str(r.payload["epsilon"])) for r in charges] == [Fraction(1, 4)]


def test_a_charge_on_a_full_file_system(data: Path, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "fs", "1m") as fs:
        policy = write_policy(tmp_path / "p", data, fs / "visits.ledger")
        assert invoke(policy, "init").exit_code == 0
        session = Session(policy, "ann")
        try:
            session.execute(Q)
            fill(fs)
            answers = 0
            for i in range(40):  # SQLite may find room in its pages for a few records
                try:
                    session.execute(Q, epsilon=f"0.{i + 10}")
                    answers += 1
                except errors.LedgerError:
                    break
            else:
                pytest.fail("a full file system never stopped the ledger")
        finally:
            session.close()
        (fs / "filler").unlink()
        records = Ledger(fs / "visits.ledger").records()
        assert sum(1 for r in records if r.kind == "release") == answers + 1


# -- dpsql run --output ---------------------------------------------------------------------


@pytest.fixture
def policy(data: Path, tmp_path: Path) -> Path:
    policy, _ = _ledger_dir(data, tmp_path / "policy")
    return policy


def charge_count(policy: Path) -> int:
    ledger = Ledger(policy.parent / "visits.ledger")
    return sum(1 for r in ledger.records() if r.kind == "charge")


def sql_file(folder: Path, statements: int) -> Path:
    path = folder / "queries.sql"
    path.write_text(
        "".join(
            f"SELECT COUNT(*) AS n{i} FROM visits WHERE spend >= {i};\n" for i in range(statements)
        ),
        encoding="utf-8",
    )
    return path


@pytest.mark.parametrize("how", ["under-a-file", "proc", "sys"])
def test_an_output_folder_that_cannot_exist_costs_nothing(
    policy: Path, tmp_path: Path, how: str
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x", encoding="utf-8")
    out = {"under-a-file": blocker / "out", "proc": Path("/proc/dpsql-out"),
           "sys": Path("/sys/dpsql-out")}[how]  # fmt: skip
    sql = sql_file(tmp_path, 2)
    failed(invoke(policy, "run", "--output", str(out), str(sql)), 2, "OutputError", str(out),
           "nothing was run")  # fmt: skip
    assert charge_count(policy) == 0


def test_an_output_folder_on_a_read_only_file_system_costs_nothing(
    policy: Path, tmp_path: Path
) -> None:
    with tmpfs(tmp_path / "ro") as ro:
        remount(ro, "ro")
        sql = sql_file(tmp_path, 2)
        failed(invoke(policy, "run", "--output", str(ro), str(sql)), 2, "read-only file system")
        assert charge_count(policy) == 0


@settings(HYPOTHESIS, max_examples=examples(30))
@given(
    statements=st.integers(1, 4),
    data_=st.data(),
    fmt=st.sampled_from(["csv", "json", "parquet"]),
    combined=st.booleans(),
    obstacle=st.sampled_from(["full", "directory"]),
)
def test_a_result_file_that_cannot_be_written(
    data: Path, tmp_path_factory: pytest.TempPathFactory, *, statements: int,
    data_: st.DataObject, fmt: str, combined: bool, obstacle: str,
) -> None:  # fmt: skip
    folder = tmp_path_factory.mktemp("run-output")
    policy, _ = _ledger_dir(data, folder / "policy")
    sql = sql_file(folder, statements)
    broken = data_.draw(st.integers(1, statements), label="broken statement")
    name = f"results.{fmt}" if combined else f"{broken:02d}.{fmt}"
    out = folder / "out"
    out.mkdir()
    target = out / name
    if obstacle == "full":
        target.symlink_to("/dev/full")
    else:
        target.mkdir()
    args = ["run", "--quiet", "--output", str(out), "--format", fmt, str(sql)]
    result = invoke(policy, *([*args[:-1], "--combined", args[-1]] if combined else args))
    # Every result file is checked before the charge: nothing runs, nothing is charged.
    reason = "not a regular file" if obstacle == "full" else "is a directory"
    failed(result, 2, f"OutputError: cannot write {target}: {reason}", "nothing was run")
    assert charge_count(policy) == 0
    assert sorted(p.name for p in out.iterdir()) == [name]  # no probe or result left behind
    again = invoke(policy, "run", "--quiet", "--output", str(folder / "good"), "--format", fmt,
                   *(["--combined"] if combined else []), str(sql))  # fmt: skip
    assert again.exit_code == 0, again.output
    assert charge_count(policy) == 1


def test_a_full_output_file_system(policy: Path, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "full", "64k") as full:
        fill(full)
        sql = sql_file(tmp_path, 3)
        result = invoke(policy, "run", "--quiet", "--output", str(full), str(sql))
        failed(result, 2, f"cannot write results to the folder {full}",
               "no space left on device", "nothing was run")  # fmt: skip
        assert charge_count(policy) == 0


def test_standard_output_that_cannot_be_written(policy: Path, tmp_path: Path) -> None:
    sql = sql_file(tmp_path, 1)
    dpsql = [sys.executable, "-m", "dpsql.interfaces.cli.main", "--policy", str(policy)]
    # The plan is printed before anything runs; with --quiet, standard output is checked then.
    runs = (
        ["run", str(sql)],
        ["run", "--quiet", str(sql)],
        ["query", "SELECT COUNT(*) FROM visits"],
    )
    for args in (*runs, ["report"], ["ledger", "export"]):
        before = charge_count(policy)
        with open("/dev/full", "w", encoding="utf-8") as full:
            done = subprocess.run(
                [*dpsql, *args], stdout=full, stderr=subprocess.PIPE,
                text=True, timeout=120, check=False,
            )  # fmt: skip
        assert done.returncode == 2, (args, done.stderr)
        assert "cannot write" in done.stderr and "standard output" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
        assert charge_count(policy) == before


def test_a_pipe_whose_reader_is_gone_costs_nothing(policy: Path, tmp_path: Path) -> None:
    """``dpsql run --quiet q.sql | head -0``-like: the pipe is checked before the charge."""
    sql = sql_file(tmp_path, 1)
    dpsql = [sys.executable, "-m", "dpsql.interfaces.cli.main", "--policy", str(policy)]
    for args in (["run", "--quiet", str(sql)], ["query", "SELECT COUNT(*) FROM visits"]):
        read, write = os.pipe()
        os.close(read)
        try:
            done = subprocess.run(
                [*dpsql, *args], stdout=write, stderr=subprocess.PIPE,
                text=True, timeout=120, check=False,
            )  # fmt: skip
        finally:
            os.close(write)
        assert done.returncode == 2, (args, done.stderr)
        assert "standard output: its reader has closed it; nothing was run" in done.stderr
        assert charge_count(policy) == 0


# -- reports, exports, charts -----------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["report", "--output"],
        ["report", "--format", "html", "--output"],
        ["ledger", "export", "--output"],
        ["budget", "show", "--chart"],
        ["budget", "what-if", "--epsilon", "0.5", "--queries", "3", "--chart"],
    ],
    ids=["report", "html", "export", "show-chart", "what-if-chart"],
)
def test_an_unwritable_report_or_chart(policy: Path, tmp_path: Path, args: list[str]) -> None:
    invoke(policy, "run", "--quiet", str(sql_file(tmp_path, 1)))  # an export to write
    blocker = tmp_path / "a-file"
    blocker.write_text("x", encoding="utf-8")
    full = tmp_path / "full.png"
    full.symlink_to("/dev/full")
    for target in (blocker / "out.png", full):
        failed(invoke(policy, *args, str(target)), 2, "OutputError: cannot write", str(target))
    folder = tmp_path / "dir.png"
    folder.mkdir()  # refused by the option itself, a usage error naming it
    failed(invoke(policy, *args, str(folder)), 2, str(folder), "is a directory")
