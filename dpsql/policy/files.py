"""The policy's data files as a session binds them: each one's identity, fixed once.

A session binds each table to its file when it connects. ``FileIdentity`` is what it bound: the
file's device, inode, size and modification time (ns), as ``stat`` gives them, and the column
names and types the engine read from it (a Parquet file's schema, a CSV file's header and
declared types, a DuckDB file's tables). Nothing else of a file is used: no row count, no
statistic of a Parquet footer, no digest of the rows (whether a query is refused must not depend
on the data, only on the owner's act of replacing a file).

``FileSet`` is the identities of the files one query reads, fixed when it is planned and
checked by the pipeline before the charge (``FileSet.verify``): a file replaced (by rename, or
written in place) since the session bound it is refused with ``DataChangedError``, nothing
charged, naming the table. The owner declares a new ``dataset.data_version`` with new files,
and a new connection binds them. The check is one ``stat`` per file (the tuple that make,
git's index and Python's import cache also take for "unchanged"); a rewrite in place that keeps
the size and puts the modification time back is not seen by it, nor, where the engine could not
link the bound file (``dpsql.engine.duckdb.snapshots``, whose link keeps its inode from being
freed), a new file of the same size and modification time given the freed inode; either is
then what it always was: an engine failure after the charge if the query cannot run on it.

``regular_file`` refuses what is not a regular file (a FIFO would make the engine wait forever
for a writer; a directory, a device such as ``/dev/zero``) before anything opens it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from dpsql.errors import DataChangedError, PolicyError

__all__ = ["DATABASE", "FileIdentity", "FileSet", "identify", "regular_file"]

# The name a DuckDB database file goes by in a FileSet (no table is named so: not an identifier).
DATABASE = "data.database"


def regular_file(path: Path, field: str) -> os.stat_result:
    """``path``'s status, following links, if it is a regular file; else a ``PolicyError``
    naming ``field`` (``data.tables.<name>``, ``data.database``). ``stat`` never opens the
    file, so a FIFO is refused here without waiting for a writer."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise PolicyError(f"{field} does not exist: {path}") from None
    except OSError:
        raise PolicyError(f"{field} cannot be read: {path}") from None
    if not stat.S_ISREG(info.st_mode):
        # A FIFO blocks a reader until a writer comes (forever); a device (/dev/zero) never
        # ends; a directory is no table: each would hang or fail the engine, so it is refused.
        raise PolicyError(f"{field} is not a regular file: {path}")
    return info


@dataclass(frozen=True)
class FileIdentity:
    """One data file as a session bound it: which file (device, inode), its size and mtime,
    and the columns (name, DuckDB type) the engine read from it."""

    table: str  # the table it holds, or DATABASE
    path: Path
    device: int
    inode: int
    size: int
    mtime_ns: int
    schema: tuple[tuple[str, str], ...] = ()

    def same_file(self, info: os.stat_result) -> bool:
        """Whether ``info`` (a ``stat`` of the path now) is still the file bound, unchanged."""
        return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns) == (
            self.device,
            self.inode,
            self.size,
            self.mtime_ns,
        )


def identify(table: str, path: Path, info: os.stat_result | None = None) -> FileIdentity:
    """The identity of ``path`` now (``info``: a ``stat`` of it already taken)."""
    if info is None:
        info = regular_file(path, DATABASE if table == DATABASE else f"data.tables.{table}")
    return FileIdentity(table, path, info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def _changed(table: str) -> DataChangedError:
    where = "the database file" if table == DATABASE else f"the data file of table {table}"
    return DataChangedError(
        f"{where} changed since this session bound it, and the policy declares no new "
        "data_version; nothing was charged. The data owner replaces data files together with "
        "a new dataset.data_version; a new connection then reads them"
    )


@dataclass(frozen=True)
class FileSet:
    """The identities of the files a query reads (or a session bound), by table."""

    files: tuple[FileIdentity, ...] = ()
    # The registered blocks the engine bound, by table (their ledger records): a query planned
    # on one list runs only on an engine that bound the same (``dpsql.session.pipeline``).
    blocks: tuple[tuple[str, tuple[int, ...]], ...] = ()

    @classmethod
    def of(cls, files: Iterable[FileIdentity]) -> FileSet:
        return cls(tuple(sorted(files, key=lambda f: f.table)))

    @property
    def tables(self) -> tuple[str, ...]:
        return tuple(f.table for f in self.files)

    def only(self, tables: Iterable[str]) -> FileSet:
        """The files of ``tables``, and the database file if one of them is none of the files'
        (the database file holds every other table)."""
        wanted = {t.lower() for t in tables}
        if wanted - set(self.tables):
            wanted.add(DATABASE)
        return replace(self, files=tuple(f for f in self.files if f.table in wanted))

    def with_schemas(self, catalog: Mapping[str, Mapping[str, str]]) -> FileSet:
        """The same files with the columns the engine read from each (``catalog``: table ->
        column -> type): a table's file its table's; the database file those of every table
        no file holds, as ``table.column``."""
        own = {f.table for f in self.files}

        def columns(f: FileIdentity) -> tuple[tuple[str, str], ...]:
            if f.table != DATABASE:
                return tuple(catalog.get(f.table, {}).items())
            held = sorted(t for t in catalog if t not in own)
            return tuple((f"{t}.{c}", ty) for t in held for c, ty in catalog[t].items())

        return replace(self, files=tuple(replace(f, schema=columns(f)) for f in self.files))

    def verify(self) -> None:
        """Each file is still the one bound, unchanged; else ``DataChangedError`` naming the
        first table whose file changed (or is gone). Before the charge: a refusal costs
        nothing. Only the files' identities are read, never a row."""
        for f in self.files:
            try:
                info = os.stat(f.path)
            except OSError:
                raise _changed(f.table) from None
            if not f.same_file(info):
                raise _changed(f.table)
