"""The data files' identity check before each charge, and the ways of reading the verified file.

A session keeps each data file's identity from when it bound it (device, inode, size, mtime)
and checks the query's files before each charge (``dpsql.policy.files``). In one run, on
``examples/data/visits.parquet`` (378,910 rows; ``make examples/data/visits.parquet``):

* **FileSet.verify** of 1 and of 10 files: one ``stat`` each;
* **a fresh charged query** (``Session.execute(..., fresh=True)``, memory ledger), with the check
  and with it switched off, interleaved: what the check adds to a query;
* **reading the verified file**: DuckDB's ``read_parquet`` over the path, over the process's
  descriptor of the file bound (``/proc/self/fd/N``) and over a hard link made at bind in a
  private folder (a snapshot); then whether each still reads the bound file after the owner
  renamed a new one over the path, under the engine's lock-down (``allowed_paths``).

    python benchmarks/file_identity.py [--repeats 30]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import duckdb

from dpsql.policy import load_policy
from dpsql.policy.files import FileSet, identify
from dpsql.session.session import Session

DATA = Path(__file__).resolve().parents[1] / "examples" / "data" / "visits.parquet"
QUERY = "SELECT COUNT(*), AVG(age) FROM visits WHERE region = 'east'"


def _median_ms(fn: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - began) * 1e3)
    return statistics.median(samples)


def verify_cost(folder: Path, repeats: int) -> dict[str, float]:
    files = []
    for i in range(10):
        path = folder / f"t{i}.parquet"
        path.write_bytes(b"x")
        files.append(identify(f"t{i}", path))
    one, ten = FileSet.of(files[:1]), FileSet.of(files)
    return {
        "FileSet.verify, 1 file": _median_ms(one.verify, repeats * 100),
        "FileSet.verify, 10 files": _median_ms(ten.verify, repeats * 100),
    }


def query_cost(folder: Path, repeats: int) -> dict[str, float]:
    data = folder / "visits.parquet"
    shutil.copyfile(DATA, data)
    policy = load_policy(
        {
            "dataset": {"id": "bench"},
            "data": {"tables": {"visits": str(data)}},
            "budget": {"diagnose": False, "epsilon": "10000", "query_epsilon": "0.01"},
            "tables": {"visits": {"privacy_unit": "user_id", "max_groups_per_unit": 1,
                                  "max_rows_per_unit_per_group": 5,
                                  "columns": {"age": {"lower": 0, "upper": 100}}}},
        },
        base_dir=folder,
    )  # fmt: skip
    session = Session(policy)
    session.execute(QUERY, fresh=True)  # the plan kept, DuckDB warm
    real = FileSet.verify
    checked, bare = [], []
    try:
        for _ in range(repeats):
            checked.append(_median_ms(lambda: session.execute(QUERY, fresh=True), 1))
            FileSet.verify = lambda self: None  # type: ignore[method-assign]
            bare.append(_median_ms(lambda: session.execute(QUERY, fresh=True), 1))
            FileSet.verify = real  # type: ignore[method-assign]
    finally:
        FileSet.verify = real  # type: ignore[method-assign]
        session.close()
    return {
        "fresh charged query, with the check": statistics.median(checked),
        "fresh charged query, no check": statistics.median(bare),
    }


def _locked(path: str) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(":memory:")
    con.execute(f"SET allowed_paths = ['{path}']")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


def reading(folder: Path, repeats: int) -> tuple[dict[str, float], dict[str, str]]:
    data = folder / "read.parquet"
    shutil.copyfile(DATA, data)
    fd = os.open(data, os.O_RDONLY)
    snapshots = Path(tempfile.mkdtemp(prefix="dpsql-snap-", dir=folder))
    link = snapshots / "read.parquet"
    made = _median_ms(lambda: (os.link(data, link), link.unlink()), repeats)
    os.link(data, link)
    ways = {"path": str(data), "descriptor": f"/proc/self/fd/{fd}", "snapshot link": str(link)}
    times, after = {}, {}
    sql = "SELECT COUNT(*), SUM(age) FROM read_parquet('{}')"
    cons = {way: _locked(p) for way, p in ways.items()}
    for way, p in ways.items():
        read = partial(lambda con, q: con.execute(q).fetchall(), cons[way], sql.format(p))
        times[f"read via {way}"] = _median_ms(read, repeats)
    times["hard link made and removed at bind"] = made
    first = cons["path"].execute(sql.format(ways["path"])).fetchall()
    fresh = folder / "fresh.parquet"
    con = duckdb.connect(":memory:")
    con.execute(f"COPY (SELECT * FROM '{DATA}' LIMIT 10) TO '{fresh}' (FORMAT PARQUET)")
    con.close()
    os.replace(fresh, data)  # the owner's refresh, by rename
    for way, p in ways.items():
        try:
            rows = cons[way].execute(sql.format(p)).fetchall()
            after[way] = "the bound file" if rows == first else "the new file"
        except duckdb.Error as exc:
            after[way] = f"refused ({type(exc).__name__})"
    os.close(fd)
    return times, after


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=Path(__file__).parent) as name:
        folder = Path(name)
        rows = {**verify_cost(folder, args.repeats), **query_cost(folder, args.repeats)}
        times, after = reading(folder, args.repeats)
    rows.update(times)
    print(f"{dt.date.today().isoformat()}, python benchmarks/file_identity.py "
          f"--repeats {args.repeats}")  # fmt: skip
    for label, ms in rows.items():
        print(f"{label:<40} | {ms:9.4f} ms")
    for way, outcome in after.items():
        print(f"after a rename, reading via {way:<14} | {outcome}")
    try:
        hardlinks = Path("/proc/sys/fs/protected_hardlinks").read_text().strip()
    except OSError:
        hardlinks = "unknown"
    print(f"fs.protected_hardlinks = {hardlinks}")


if __name__ == "__main__":
    main()
