"""Snapshot links: the engine reads each data file through a hard link made when it binds it.

A view over a file's path reads whatever file the path names when a query runs: an owner's
refresh renamed over it between the check before the charge (``dpsql.policy.files``) and the
engine's read would be read instead, or fail the query after its charge (a column dropped).
A hard link to the bound file, made at bind in a private folder, names that very file whatever
happens to the path, so every query reads the file that was verified (and both passes of one
query read the same one). Measured (``benchmarks/file_identity.py``): a link costs 9 µs to
make, and reading through it costs what reading through the path does.

The other way, the process's open descriptor (``/proc/self/fd/N``), does not survive a rename
under the engine's lock-down: DuckDB resolves the descriptor's link to the file's current name
before it checks ``allowed_paths``, and refuses the renamed-away file (the benchmark shows it).

Where no link can be made (the private folder on another file system than the data; Linux's
``fs.protected_hardlinks``, which refuses to link a file the process neither owns nor may
write, as when a service account reads the owner's files), the view reads the path, and a
change between the check and the read is what it always was: an engine failure after the
charge. A link also names the file after the owner deleted it: the folder is the process's own
(mode 0700, inside the spill folder's private parent), removed with the engine and at exit (a
process killed leaves it to the system's cleaning of temporary files, as its spill files).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from dpsql.engine.duckdb.connections import _spill_directory
from dpsql.policy.files import FileIdentity

_FOLDER: list[Path] = []
_COUNTER = itertools.count()


def _folder() -> Path | None:
    """This process's folder of links, beside its spill folder in the same private parent."""
    name = f"{os.getpid()}-files"
    if _FOLDER and _FOLDER[0].name == name:
        return _FOLDER[0]
    folder = Path(_spill_directory()).with_name(name)
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
    except OSError:
        return None
    atexit.register(_remove_folder, folder, os.getpid())
    _FOLDER[:] = [folder]
    return folder


def _remove_folder(folder: Path, owner: int) -> None:
    # At exit, by the process that made it only: a child forked from it (which inherits its
    # exit handlers) must not remove the links its parent's views still read.
    if os.getpid() == owner:
        shutil.rmtree(folder, ignore_errors=True)


def snapshot(identity: FileIdentity) -> Path | None:
    """A hard link to the file ``identity`` names, or None where none can be made (then the
    engine reads the path). A file replaced between the bind and the link is not linked: the
    check before the charge refuses it anyway."""
    folder = _folder()
    if folder is None:
        return None
    link = folder / f"{next(_COUNTER)}-{identity.path.name}"
    try:
        os.link(identity.path, link)  # follows a symbolic link: the file it names
        info = os.stat(link)
    except OSError:
        return None
    if (info.st_dev, info.st_ino) != (identity.device, identity.inode):
        with contextlib.suppress(OSError):
            link.unlink()
        return None
    return link


def remove(links: Iterable[Path]) -> None:
    for link in links:
        with contextlib.suppress(OSError):
            link.unlink()
