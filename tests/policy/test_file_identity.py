"""``FileSet``: the identities a session binds, and their check before each charge.

A property test over sequences of an owner's acts on a file: the check refuses exactly when one
of them replaced the file or changed its size or modification time (reads, a chmod and a
rename of another file refuse nothing), naming the table and no value. The bound file is held
by a link, as the engine's snapshot holds it: without one, a file copied twice over the
path (same bytes, mtime kept) can be given the freed inode of the first and pass for it. And
the query's set: a file table's own file, the database file only for a table it holds.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpsql.errors import DataChangedError
from dpsql.policy.files import DATABASE, FileSet, identify


def _read(path: Path) -> bool:
    path.read_bytes()
    return False


def _chmod(path: Path) -> bool:
    path.chmod(0o640)
    return False


def _other(path: Path) -> bool:
    other = path.with_name("other.bin")
    other.write_bytes(b"o")
    os.replace(other, path.with_name("other2.bin"))
    return False


def _copy_renamed(path: Path) -> bool:
    fresh = path.with_name("fresh.bin")
    shutil.copy2(path, fresh)  # same bytes, same mtime: another inode
    os.replace(fresh, path)
    return True


def _append(path: Path) -> bool:
    with open(path, "ab") as handle:
        handle.write(b"+")
    return True


def _truncate(path: Path) -> bool:
    os.truncate(path, path.stat().st_size - 1)  # 10 bytes at first, at most 4 acts: never 0
    return True


def _touch(path: Path) -> bool:
    info = path.stat()
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns + 7))
    return True


ACTS: dict[str, Callable[[Path], bool]] = {
    "read": _read, "chmod": _chmod, "other file": _other, "copy renamed over": _copy_renamed,
    "append": _append, "truncate": _truncate, "touch": _touch,
}  # fmt: skip


@settings(max_examples=examples(40), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(acts=st.lists(st.sampled_from(sorted(ACTS)), max_size=4))
def test_the_check_refuses_exactly_a_changed_file(tmp_path: Path, acts: list[str]) -> None:
    folder = tmp_path / f"case-{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    path = folder / "visits.parquet"
    path.write_bytes(b"0123456789")
    bound = FileSet.of([identify("visits", path)])
    # The engine reads the bound file through a link made at bind, which also keeps its inode
    # from being freed and given to a new file (which would then pass for the bound one).
    os.link(path, folder / "snapshot")
    changed = False
    for act in acts:
        changed |= ACTS[act](path)
    if changed:
        with pytest.raises(DataChangedError) as refused:
            bound.verify()
        assert "table visits" in str(refused.value) and "0123" not in str(refused.value)
    else:
        bound.verify()


def test_a_removed_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "visits.csv"
    path.write_text("a\n1\n")
    bound = FileSet.of([identify("visits", path)])
    path.unlink()
    with pytest.raises(DataChangedError, match="table visits"):
        bound.verify()


def test_the_query_set_holds_its_own_files(tmp_path: Path) -> None:
    (tmp_path / "a.parquet").write_bytes(b"a")
    (tmp_path / "w.duckdb").write_bytes(b"w")
    files = FileSet.of(
        [identify("a", tmp_path / "a.parquet"), identify(DATABASE, tmp_path / "w.duckdb")]
    )
    assert files.only(["a"]).tables == ("a",)
    assert files.only(["b"]).tables == (DATABASE,)
    assert files.only(["A", "b"]).tables == ("a", DATABASE)
    typed = files.with_schemas({"a": {"x": "INTEGER"}, "b": {"y": "VARCHAR"}})
    assert [f.schema for f in typed.files] == [(("x", "INTEGER"),), (("b.y", "VARCHAR"),)]
    (tmp_path / "w.duckdb").write_bytes(b"ww")  # the database file changed
    files.only(["a"]).verify()  # a query of a file table does not read it
    with pytest.raises(DataChangedError, match="the database file"):
        files.only(["b"]).verify()
