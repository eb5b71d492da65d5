"""Writing the results of ``dpsql run`` and ``dpsql query``: files, tables and standard output.

``write_results`` writes each statement's result (``01.csv``, ...) or all of them in one file,
as CSV (a ``<name> ±`` column after each column with half-widths), JSON or Parquet (through
DuckDB); ``prepare_output`` and ``check_stdout`` check before anything is charged that the
folder and its files, or standard output, can take them. A file or
a standard output that cannot be written is an ``OutputError`` naming it, never a value.
``_text_table`` is the aligned table printed to a terminal.
"""

from __future__ import annotations

import csv
import errno
import fcntl
import functools
import io
import json
import os
import select
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import click
import duckdb

from dpsql.errors import OutputError
from dpsql.policy.numbers import exact
from dpsql.release.cells import accuracy_forms
from dpsql.release.result import INTERVALS_COVER, Result, cell, covers, shown_rows
from dpsql.release.result import columns as result_columns
from dpsql.session.workload_plan import Step

__all__ = [
    "FORMATS", "LONG", "check_stdout", "echo", "output_files", "prepare_output", "write_results"
]  # fmt: skip

FORMATS = ("csv", "json", "parquet")


def _plain(value: Any) -> Any:
    return value if value is None or isinstance(value, bool | int | float | str) else str(value)


def _cost(result: Result) -> tuple[Any, Any]:
    if result.charge is None:
        return 0, 0
    if result.plan is not None:
        return result.plan.epsilon, result.plan.delta
    return result.charge.epsilon, result.charge.delta


def _document(step: Step, result: Result) -> dict[str, Any]:
    return {
        "statement": step.piece.number,
        "line": step.piece.line,
        "sql": step.piece.text,
        "columns": list(result.columns),
        "types": list(result.types),
        "rows": [[_plain(v) for v in row] for row in shown_rows(result)],
        "accuracy": [list(row) for row in result.accuracy],
        # Per cell: the value is mostly noise (its ± at least its size, or spanning its bounds).
        "noise": [list(row) for row in result.noise],
        "confidence": result.confidence,
        # The statement's own cost: within a file's one charge, its independent plan's.
        "epsilon": exact(_cost(result)[0]),
        "delta": exact(_cost(result)[1]),
        "cached_from": result.cached_from,
        # What the ± covers: the noise only, never the bias of the bounds; a quantile's
        # accuracy is an interval [lo, hi] (below), with what it covers.
        "accuracy_covers": covers(result),
        "intervals_cover": INTERVALS_COVER if accuracy_forms(result.accuracy)[1] else None,
        "diagnosis": result.diagnosis.as_dict() if result.diagnosis is not None else None,
    }


def _long_rows(done: Sequence[tuple[Step, Result]]) -> Iterator[tuple[Any, ...]]:
    """One row per released cell: the combined CSV and Parquet layout."""
    for step, result in done:
        for i, row in enumerate(shown_rows(result)):
            accuracy = result.accuracy[i] if i < len(result.accuracy) else ()
            flags = result.noise[i] if i < len(result.noise) else ()
            for j, value in enumerate(row):
                half = accuracy[j] if j < len(accuracy) else None
                text = None if value is None else str(_plain(value))
                noisy = bool(flags[j]) if j < len(flags) else False
                # A quantile's interval fills low and high; a ± fills accuracy.
                low, high = half if isinstance(half, tuple) else (None, None)
                half = None if isinstance(half, tuple) else half
                yield step.piece.number, i + 1, result.columns[j], text, half, noisy, low, high


LONG = (("statement", "INTEGER"), ("row", "INTEGER"), ("column", "VARCHAR"),
        ("value", "VARCHAR"), ("accuracy", "DOUBLE"), ("noise", "BOOLEAN"),
        ("low", "DOUBLE"), ("high", "DOUBLE"))  # fmt: skip


def _csv(columns: Sequence[str], rows: Iterator[Sequence[Any]] | Sequence[Sequence[Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows([_plain(v) for v in row] for row in rows)
    return out.getvalue()


def _csv_with_accuracy(result: Result) -> str:
    columns = result_columns(result, shown_rows(result), accuracy=True, noise=True)
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


def output_files(
    folder: Path, numbers: Sequence[int], fmt: str, combined: bool, width: int
) -> list[Path]:
    """The files ``write_results`` writes for the statements ``numbers``."""
    if combined:
        return [folder / f"results.{fmt}"]
    return [folder / f"{number:0{width}d}.{fmt}" for number in numbers]


def prepare_output(folder: Path, files: Sequence[Path] = ()) -> None:
    """Create ``folder`` and check that a file can be written in it, and that each of ``files``
    can be (a directory or a special file in its place cannot), before anything is charged."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".dpsql-", suffix=".probe"):
            pass
        if os.statvfs(folder).f_bavail == 0:  # an empty file fits where no result does
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    except OSError as exc:
        raise OutputError(
            f"cannot write results to the folder {folder}: {_reason(exc)}; nothing was run"
        ) from None
    for path in files:
        try:
            if path.exists() or path.is_symlink():
                if not path.is_file():
                    code = errno.EISDIR if path.is_dir() else errno.EINVAL
                    raise OSError(code, "is a directory" if path.is_dir() else "not a regular file")
                with path.open("ab"):  # opened for writing, left unchanged
                    pass
            else:
                with path.open("xb"):
                    pass
                path.unlink()
        except OSError as exc:
            raise OutputError(f"cannot write {path}: {_reason(exc)}; nothing was run") from None


def check_stdout() -> None:
    """Refuse, before anything is charged, a standard output that cannot take the results: not
    open for writing, a pipe whose reader is gone, a full file system, or ``/dev/full``."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return  # not a file descriptor (a test's captured output): nothing to check
    try:
        mode = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
        info = os.fstat(fd)
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        broken = any(event & (select.POLLERR | select.POLLHUP) for _, event in poller.poll(0))
        full = (stat.S_ISREG(info.st_mode) and os.fstatvfs(fd).f_bavail == 0) or (
            stat.S_ISCHR(info.st_mode) and _is_dev_full(info.st_rdev)
        )
    except OSError as exc:
        raise OutputError(f"cannot write to standard output: {_reason(exc)}") from None
    reason = (
        "it is not open for writing" if mode == os.O_RDONLY
        else "its reader has closed it" if broken
        else "no space left on device" if full
        else None
    )  # fmt: skip
    if reason is not None:
        raise OutputError(f"cannot write to standard output: {reason}; nothing was run")


def _is_dev_full(device: int) -> bool:
    try:
        return os.stat("/dev/full").st_rdev == device
    except OSError:
        return False


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
        path = output_files(folder, (), fmt, combined, width)[0]
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
    paths_of = output_files(folder, [step.piece.number for step, _ in done], fmt, False, width)
    for (step, result), path in zip(done, paths_of, strict=True):
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
    for i, row in enumerate(shown_rows(result)):
        accuracy = result.accuracy[i] if i < len(result.accuracy) else ()
        flags = result.noise[i] if i < len(result.noise) else ()
        halves = [accuracy[j] if j < len(accuracy) else None for j in range(len(row))]
        marks = [bool(flags[j]) if j < len(flags) else False for j in range(len(row))]
        cells.append([
            cell(v, h, n)
            for v, h, n in zip(row, halves, marks, strict=True)
        ])  # fmt: skip
    widths = [max([len(c), *(len(r[j]) for r in cells)]) for j, c in enumerate(result.columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(result.columns, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return [line.rstrip() for line in lines]
