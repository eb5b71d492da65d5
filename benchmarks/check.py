"""``dpsql check``'s CSV scan beside DuckDB reading the same file through dpsql's view.

For each size (lines) and each file (``clean``: every field parses; ``dirty``: one line in a
hundred dropped or with a NULLed field), one subprocess runs the owner's check
(``check_data``: the line walk with its fast path, every finding counted) and another runs
DuckDB on the same file through dpsql's CSV view (``DuckDBEngine``; ``COUNT(*)`` and a
``COUNT`` of every typed column: every line read, every field cast), each timed and its peak
memory read (``ru_maxrss`` of the child), interleaved over the repeats. The file has a
privacy-unit column, three typed columns (INTEGER, DATE, DOUBLE) and a text column.

    python benchmarks/check.py [--lines 100000 1000000 4000000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

POLICY = {
    "dataset": {"id": "check-bench"},
    "budget": {"diagnose": False, "epsilon": "1"},
    "tables": {
        "t": {
            "privacy_unit": "k",
            "columns": {"age": {"type": "INTEGER"}, "day": {"type": "DATE"},
                        "spend": {"type": "DOUBLE"}, "note": {}},
        }
    },
}  # fmt: skip
DIRTY = [
    "{k},abc,2024-01-05,1.5,x",
    "{k},30,2024-02-30,1.5,x",
    "{k},30",
    "{k},30,2024-01-05,1e999,x",
]


def write(path: Path, lines: int, dirty: bool) -> None:
    rng = random.Random(lines)
    with open(path, "w", encoding="utf-8") as out:
        out.write("k,age,day,spend,note\n")
        for i in range(lines):
            k = i % max(1, lines // 10)
            if dirty and i % 100 == 0:
                out.write(DIRTY[(i // 100) % len(DIRTY)].format(k=k) + "\n")
            else:
                out.write(
                    f"{k},{rng.randint(0, 99)},2024-{rng.randint(1, 12):02d}-"
                    f"{rng.randint(1, 28):02d},{rng.random() * 100:.2f},visit\n"
                )


CHILD = """
import json, resource, sys, time
from dpsql.policy import load_policy
spec = json.loads(sys.argv[2])
spec["data"] = {"tables": {"t": sys.argv[3]}}
policy = load_policy(spec)
began = time.perf_counter()
if sys.argv[1] == "check":
    from dpsql.engine.check.data import check_data
    scan = check_data(policy).tables[0].scan
    rows = scan.rows
else:
    from dpsql.engine.duckdb.engine import DuckDBEngine
    engine = DuckDBEngine(policy, salt=1)
    rows = engine.run("SELECT COUNT(*), COUNT(age), COUNT(day), COUNT(spend) FROM t")[1][0][0]
    engine.close()
seconds = time.perf_counter() - began
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"seconds": seconds, "rows": rows, "peak": peak}))
"""


def run(which: str, path: Path) -> tuple[float, float, int]:
    """Seconds, peak resident MiB of the child (its own ru_maxrss), rows read."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD, which, json.dumps(POLICY), str(path)],
        capture_output=True, text=True, check=True, timeout=3600,
    )  # fmt: skip
    result = json.loads(done.stdout)
    return result["seconds"], result["peak"], result["rows"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, nargs="+", default=[100_000, 1_000_000, 4_000_000])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"{dt.date.today()}; median of {args.repeats}, interleaved; peak RSS of the child")
    print(f"{'lines':>10} {'file':>6} {'MiB':>6} | {'check s':>8} {'MiB':>6} | "
          f"{'duckdb s':>8} {'MiB':>6} | {'ratio':>5}")  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        for lines in sorted(args.lines):
            for dirty in (False, True):
                path = Path(folder) / f"t_{lines}_{int(dirty)}.csv"
                write(path, lines, dirty)
                size = path.stat().st_size / 2**20
                times: dict[str, list[float]] = {"check": [], "duckdb": []}
                peaks: dict[str, float] = {}
                rows: dict[str, int] = {}
                for _ in range(args.repeats):
                    for which, taken in times.items():
                        seconds, peaks[which], rows[which] = run(which, path)
                        taken.append(seconds)
                if rows["check"] != rows["duckdb"]:
                    raise SystemExit(f"rows differ: {rows}")
                check, duck = (statistics.median(times[w]) for w in ("check", "duckdb"))
                print(
                    f"{lines:>10,} {'dirty' if dirty else 'clean':>6} {size:>6.0f} | "
                    f"{check:>8.2f} {peaks['check']:>6.0f} | {duck:>8.2f} "
                    f"{peaks['duckdb']:>6.0f} | {check / duck:>5.1f}"
                )
                path.unlink()


if __name__ == "__main__":
    main()
