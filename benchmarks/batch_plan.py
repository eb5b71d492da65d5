"""Time of ``dpsql run --plan FILE`` against the number of statements in FILE.

Each file starts with ``SET dpsql.fresh = true`` (so every query is a trial charge, none a
cache hit) followed by N - 1 queries. ``repeated`` files cycle through 50 query texts (a report
generated over a few parameters: the session's plans are reused); ``distinct`` files give every
query its own text (each is parsed, analysed, planned and bound by the engine). The budget is
large enough that every charge is admitted, so the filter decides on an ever longer history.
The policy has a durable ``[ledger]`` (``dpsql init`` in a temporary folder); the data is the
100k-row file of ``run.py``. Each figure is the wall time of one ``dpsql`` process, start-up
included (about 1 s), and per statement.

    python benchmarks/batch_plan.py                     # repeated 1k, 5k, 20k, 100k; distinct 1k
    python benchmarks/batch_plan.py --sizes 1000 --distinct 1000 2000
"""

from __future__ import annotations

import argparse
import datetime as dt
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import HERE, data_file, write_results

DISTINCT_TEXTS = 50
POLICY = """
[dataset]
id = "bench-batch"
data_version = "1"

[data]
tables = {{ visits = "{data}" }}

[budget]
epsilon = 10000
delta = 1e-6
query_epsilon = 0.1
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

[ledger]
path = "bench.ledger"
"""


def statements(n: int, distinct: bool) -> str:
    lines = ["SET dpsql.fresh = true;"]
    for i in range(n - 1):
        k = i if distinct else i % DISTINCT_TEXTS
        # Two numbers per text: 72 ages times 200 spends give 14,400 distinct texts.
        age, spend = 18 + k % 72, k // 72
        lines.append(
            f"SELECT COUNT(*) AS n FROM visits WHERE age > {age} AND spend >= {spend};"
            if distinct or k % 2
            else f"SELECT region, SUM(spend) AS s FROM visits WHERE age > {age} GROUP BY region;"
        )
    return "\n".join(lines) + "\n"


def dpsql(policy: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "dpsql.interfaces.cli.main", "--policy", str(policy), *args]
    return subprocess.run(command, check=check, capture_output=True, text=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000, 20000, 100000])
    parser.add_argument("--distinct", type=int, nargs="*", default=[1000])
    parser.add_argument("--data-dir", type=Path, default=HERE / "data")
    parser.add_argument("--results-dir", type=Path, default=HERE / "results")
    args = parser.parse_args()
    data = data_file(args.data_dir, 100_000)
    started = dt.datetime.now(dt.UTC)
    results = []
    with tempfile.TemporaryDirectory() as folder:
        policy = Path(folder) / "policy.toml"
        policy.write_text(POLICY.format(data=data.resolve()), encoding="utf-8")
        dpsql(policy, "init")
        runs = [(n, False) for n in args.sizes] + [(n, True) for n in args.distinct]
        print(f"{'statements':>10} | {'texts':<8} | {'wall s':>7} | {'ms/statement':>12} | fits")
        for n, distinct in runs:
            path = Path(folder) / f"{n}.sql"
            path.write_text(statements(n, distinct), encoding="utf-8")
            start = time.perf_counter()
            done = dpsql(policy, "run", "--plan", str(path), check=False)
            wall = time.perf_counter() - start
            # Past MAX_STATEMENTS the file is refused before any statement is planned.
            fits = "refused" if done.returncode else str("fits: yes" in done.stdout)
            kind = "distinct" if distinct else "repeated"
            print(f"{n:>10,} | {kind:<8} | {wall:>7.2f} | {wall / n * 1e3:>12.3f} | {fits}")
            results.append({"statements": n, "texts": kind, "wall_s": wall, "fits": fits})
    write_results(args.results_dir, "batch_plan", started, 1, results)


if __name__ == "__main__":
    main()
