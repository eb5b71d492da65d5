"""What the default diagnosis costs in time: one query with and without it, at several sizes.

The diagnosis reads the same relation as the query (``dpsql.bound.diagnosis``: per unit and
group its rows and flags, then a histogram of the flag patterns), in the same charge; on DuckDB
both run as one statement over one materialised scan of the relation
(``dpsql.bound.together``). This times ``Session.execute(sql, fresh=True)`` end to end
under the L0/C contract of ``scale.py`` (L0 = 2, C = 10), with ``diagnose`` off and on, in
interleaved rounds (the order alternating), on ``scale.write_data``'s skewed data, and prints
the median of each and their ratio per size, with the range of the per-round ratios.

    python benchmarks/diagnosis.py                       # 200k, 1M and 5M rows, 7 rounds
    python benchmarks/diagnosis.py --sizes 200000 --rounds 3

Peak memory is not separated here: both variants run in one process (the diagnosis's query
is no larger than the query's own; ``scale.py`` measures a query's peak by itself).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale import data_file, policy_dict

from dpsql.policy import load_policy
from dpsql.session.session import Session

QUERIES = {
    "count": "SELECT COUNT(*) AS n FROM visits",
    "by region": "SELECT region, COUNT(*) AS n, AVG(spend) AS a FROM visits GROUP BY region",
}


def _time(session: Session, sql: str, diagnose: bool) -> float:
    start = time.perf_counter()
    result = session.execute(sql, fresh=True, diagnose=diagnose)
    elapsed = time.perf_counter() - start
    assert (result.diagnosis is not None) == diagnose
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[200_000, 1_000_000, 5_000_000])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "dpsql-scale")
    args = parser.parse_args()
    print(
        f"{'rows':>10}  {'query':<10}  {'off (ms)':>9}  {'on (ms)':>9}  {'on/off':>7}  "
        "per-round range"
    )
    for n in args.sizes:
        raw = policy_dict(data_file(args.data, n), "L0C")
        raw["budget"] = {**raw["budget"], "epsilon": "10000", "query_epsilon": "1"}
        session = Session(load_policy(raw))
        for name, sql in QUERIES.items():
            _time(session, sql, False)  # warm: the file's metadata, the engine's plan
            _time(session, sql, True)
            off, on = [], []
            for r in range(args.rounds):
                for diagnose in (r % 2 == 0, r % 2 == 1):
                    (on if diagnose else off).append(_time(session, sql, diagnose))
            ratios = [a / b for a, b in zip(on, off, strict=True)]
            print(
                f"{n:>10,}  {name:<10}  {1000 * statistics.median(off):>9.1f}  "
                f"{1000 * statistics.median(on):>9.1f}  "
                f"{statistics.median(on) / statistics.median(off):>7.2f}  "
                f"{min(ratios):.2f}-{max(ratios):.2f}",
                flush=True,
            )
        session.close()


if __name__ == "__main__":
    main()
