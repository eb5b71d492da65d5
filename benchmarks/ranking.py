"""R's ranking of the heavy units' rows: a window against a top-R aggregate, on DuckDB.

The rows of the units with more than R rows (``scale.py``'s data: 1% of the units, about 44% of
the rows) are cut to R per unit in the order of a keyed hash, three ways, each followed by the
same aggregate (COUNT and SUM of ``spend`` by region, the units within R passing through):

* ``window``: ``QUALIFY ROW_NUMBER() OVER (PARTITION BY u ORDER BY hash, region, spend) <= R``
  (dpsql's form before 2026-12-07, and the hand SQL's over every unit);
* ``top_key``: ``UNNEST(ARG_MIN(row, {hash, region, spend}, R))`` per unit (dpsql's form since:
  ``dpsql.bound.caps._top_where_needed``);
* ``top_hash``: the same on the hash alone (ties on the hash broken arbitrarily: not used).

Beside them, in the same rounds, the raw aggregate. The connection runs without the optimizers
dpsql's engine disables (``DISABLED_OPTIMIZERS``: DuckDB's own top-k rewrite of the window among
them), as dpsql's queries run. Every form must return the same counts (the
sums differ by float rounding of the order). Printed: the median and range over ``--repeats``
rounds (each form once a round, the order rotating), per size.

    python benchmarks/ranking.py                     # 5M and 20M rows, 5 rounds: ~2 minutes
    python benchmarks/ranking.py --sizes 5000000 --repeats 9
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import HERE, MEMORY_LIMIT, R, data_file, heavy_share

from dpsql.engine.duckdb.connections import DISABLED_OPTIMIZERS

SALT = "CAST(42 AS BIGINT)"
SPLIT = f"""WITH _all AS (SELECT user_id AS _u, region AS _k0, spend AS _x0 FROM visits),
_heavy AS (SELECT _u FROM _all GROUP BY _u HAVING COUNT(*) > {R}),
_light AS (SELECT * FROM _all ANTI JOIN _heavy ON _all._u IS NOT DISTINCT FROM _heavy._u),
_over AS (SELECT _all.* FROM _all SEMI JOIN _heavy ON _all._u IS NOT DISTINCT FROM _heavy._u)"""
AGGREGATE = "SELECT _k0, COUNT(*), SUM(_x0) FROM _rows GROUP BY _k0 ORDER BY _k0"
HASH = f"HASH(_u, _k0, _x0, {SALT})"


def _top(key: str) -> str:
    return (
        f"{SPLIT}, _rows AS (SELECT * FROM _light UNION ALL SELECT _u, _t['_k0'], _t['_x0'] "
        f"FROM (SELECT _u, UNNEST(ARG_MIN({{'_k0': _k0, '_x0': _x0}}, {key}, {R})) AS _t "
        f"FROM _over GROUP BY _u)) {AGGREGATE}"
    )


FORMS = {
    "raw": "SELECT region, COUNT(*), SUM(spend) FROM visits GROUP BY region ORDER BY region",
    "window": f"{SPLIT}, _rows AS (SELECT * FROM _light UNION ALL SELECT * FROM _over QUALIFY "
    f"ROW_NUMBER() OVER (PARTITION BY _u ORDER BY {HASH}, _k0, _x0) <= {R}) {AGGREGATE}",
    "top_key": _top(f"{{'_o0': {HASH}, '_o1': _k0, '_o2': _x0}}"),
    "top_hash": _top(HASH),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[5_000_000, 20_000_000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--data-dir", type=Path, default=HERE / "data")
    args = parser.parse_args()
    print(f"DuckDB {duckdb.__version__}, memory limit {MEMORY_LIMIT}, median [range] of "
          f"{args.repeats} rounds after a warm-up")  # fmt: skip
    print("| rows | units over R | rows of units over R | " + " | ".join(FORMS)
          + " | window / top_key |")  # fmt: skip
    print("|---|---|---|" + "---|" * len(FORMS) + "---|")
    for n in args.sizes:
        path = data_file(args.data_dir, n)
        share = heavy_share(path)
        config = {"memory_limit": MEMORY_LIMIT, "disabled_optimizers": DISABLED_OPTIMIZERS}
        con = duckdb.connect(":memory:", config=config)
        con.execute(f"CREATE VIEW visits AS SELECT * FROM read_parquet('{path}')")
        counts = {name: [r[:2] for r in con.execute(sql).fetchall()] for name, sql in FORMS.items()}
        bounded = [counts[f] for f in FORMS if f != "raw"]
        assert all(b == bounded[0] for b in bounded), "the forms keep different rows"
        times: dict[str, list[float]] = {name: [] for name in FORMS}
        names = list(FORMS)
        for i in range(args.repeats):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                t0 = time.perf_counter()
                con.execute(FORMS[name]).fetchall()
                times[name].append(time.perf_counter() - t0)
        con.close()
        cells = [f"{statistics.median(t) * 1000:.0f} ms [{min(t) * 1000:.0f}-{max(t) * 1000:.0f}]"
                 for t in times.values()]  # fmt: skip
        ratio = statistics.median(times["window"]) / statistics.median(times["top_key"])
        print(f"| {n:,} | {share['units_over_R']:.2%} | {share['rows_of_units_over_R']:.1%} | "
              + " | ".join(cells) + f" | {ratio:.2f}x |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
