"""A table made of blocks against the number of blocks: a fresh answer's time beside one file.

    python benchmarks/blocks_scan.py [--blocks 1 6 24 96] [--scale 1 4] [--runs 7]

Data: the example's visits (examples/data/visits.parquet, 378,910 rows), repeated ``--scale``
times with new user ids, shuffled (seed 7) and cut into N equal blocks, each block's ``day``
moved into its own month (benchmarks/growing.py's months; past 24 blocks, more months), one
Parquet file per block. The same rows are also written as one file.

Per (scale, N), medians of ``--runs`` fresh answers (``fresh=True``) of three statements, each at
epsilon 0.1: COUNT(*) by region, SUM(spend) by region, AVG(spend), all over every block:

* **blocks**: dpsql over a policy whose ``visits`` is made of the N blocks (``data.blocks``);
* **one file**: dpsql over the same rows as one ``data.tables`` file;
* **raw**: DuckDB's own ``SELECT region, COUNT(*), SUM(spend) ... GROUP BY region`` over the N
  files (``read_parquet`` of the list), no bounding: the floor a scan of N files costs.

And each policy's session open time (binding N blocks: a link and a stat per file, one view),
and the peak resident memory of the process after the size's runs (``ru_maxrss``, a high-water
mark: it only grows over the sizes). Nothing is charged to any real ledger (in-memory ledgers).
"""

from __future__ import annotations

import argparse
import datetime as dt
import resource
import statistics
import tempfile
import time
import tomllib
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dpsql.policy import Policy, load_policy
from dpsql.session.blocks import register
from dpsql.session.session import Session

ROOT = Path(__file__).resolve().parent.parent
VISITS = ROOT / "examples" / "data" / "visits.parquet"
STATEMENTS = (
    "SELECT region, COUNT(*) AS n FROM visits GROUP BY region",
    "SELECT region, SUM(spend) AS s FROM visits GROUP BY region",
    "SELECT AVG(spend) AS a FROM visits",
)


def month(k: int) -> dt.date:
    """The first day of block k's month (block 0 is 2020-01)."""
    return dt.date(2020 + k // 12, k % 12 + 1, 1)


def write(folder: Path, scale: int, blocks: int) -> tuple[list[Path], Path]:
    """The N block files and the one file of the same rows."""
    base = pq.read_table(VISITS)
    parts = []
    for i in range(scale):
        ids = pc.add(base["user_id"], pa.scalar(i * 10**9, pa.int64()))
        parts.append(base.set_column(base.schema.get_field_index("user_id"), "user_id", ids))
    table = pa.concat_tables(parts)
    order = np.random.default_rng(7).permutation(table.num_rows)
    paths, moved = [], []
    for k, rows in enumerate(np.array_split(order, blocks)):
        part = table.take(pa.array(np.sort(rows)))
        start = month(k)
        offset = np.minimum(pc.day(part["day"]).to_numpy() - 1, 27)
        days = np.datetime64(start, "D") + offset.astype("timedelta64[D]")
        part = part.set_column(
            part.schema.get_field_index("day"), "day", pa.array(days, pa.date32())
        )
        path = folder / f"b{blocks}-{k:03d}.parquet"
        pq.write_table(part, path)
        paths.append(path)
        moved.append(part)
    one = folder / f"one-{blocks}.parquet"
    pq.write_table(pa.concat_tables(moved), one)
    return paths, one


def policy(folder: Path, table: Path | None) -> Policy:
    raw: dict[str, Any] = tomllib.loads(
        (ROOT / "examples" / "policy.toml").read_text(), parse_float=Decimal
    )
    raw["data"] = (
        {"blocks": {"visits": {"period": "day"}}}
        if table is None
        else {"tables": {"visits": str(table)}}
    )
    raw["budget"] = {"epsilon": "10000", "delta": "1e-6", "query_epsilon": "0.1",
                     "query_delta": "1e-8", "diagnose": False}  # fmt: skip
    raw["tables"]["visits"]["columns"].pop("day", None)
    return load_policy(raw, base_dir=folder)


def timed(session: Session, runs: int) -> float:
    """The median over ``runs`` of the three statements' fresh answers, in ms."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        for sql in STATEMENTS:
            session.execute(sql, fresh=True)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def raw_scan(paths: list[Path], runs: int) -> float:
    con = duckdb.connect(":memory:")
    listed = ", ".join("'" + str(p) + "'" for p in paths)
    sql = f"SELECT region, COUNT(*), SUM(spend) FROM read_parquet([{listed}]) GROUP BY region"
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        con.execute(sql).fetchall()
        times.append((time.perf_counter() - start) * 1000)
    con.close()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, nargs="+", default=[1, 6, 24, 96])
    parser.add_argument("--scale", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    print("| rows | blocks | open: blocks ms | open: one file ms | blocks ms | one file ms | "
          "blocks / one file | raw scan of the N files ms | peak RSS MiB |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for scale in args.scale:
            for n in args.blocks:
                paths, one = write(folder, scale, n)
                start = time.perf_counter()
                blocks = Session(policy(folder, None))
                for k, path in enumerate(paths):
                    register(blocks.policy, blocks.filter.store, "visits", f"b{k:03d}",
                             period=(month(k).isoformat(), month(k + 1).isoformat()),
                             paths=[path])  # fmt: skip
                blocks.plan(STATEMENTS[0])  # binds the blocks registered
                opened = (time.perf_counter() - start) * 1000
                start = time.perf_counter()
                single = Session(policy(folder, one))
                opened_one = (time.perf_counter() - start) * 1000
                try:
                    with_blocks, with_one = timed(blocks, args.runs), timed(single, args.runs)
                finally:
                    blocks.close()
                    single.close()
                raw = raw_scan(paths, args.runs)
                rows = pq.ParquetFile(one).metadata.num_rows
                peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
                print(f"| {rows:,} | {n} | {opened:.0f} | {opened_one:.0f} | {with_blocks:.1f} | "
                      f"{with_one:.1f} | {with_blocks / with_one:.2f}x | {raw:.1f} | "
                      f"{peak:.0f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
