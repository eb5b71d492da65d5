"""VARIANCE and STDDEV through dpsql itself: the joint Bernstein vector beside Q, S and N apart.

    python benchmarks/variance_dpsql.py          # 4 laws, 3 sizes, 4 epsilons, 100 answers
    python benchmarks/variance_dpsql.py --quick  # 2 laws, n 4,000, epsilon 1, 40 answers

Each cell: one data set of n units, one row each (C = 1, L0 = 1: no contribution bound binds),
a value ``x`` declared in [lo, hi] and drawn from a law not tuned on (the laws of
``variance_mechanisms.py``: ``uniform`` U[0, 100]; ``normal`` N(50, 15²) clamped to [0, 100];
``lognormal`` exp(N(3, 1)) clamped to [0, 200]; ``bimodal`` 0.3·N(20, 5²) + 0.7·N(80, 8²) clamped
to [0, 100]), grouped by a public key of 4 groups. A ``Session`` answers
``SELECT g, VAR_POP(x), STDDEV_SAMP(x) FROM t GROUP BY g`` ``--answers`` times, fresh each time
(``fresh=True``: a new charge and new noise), at the cell's epsilon, under
``dpsql.moments = 'joint'`` (the default) and ``'separate'``. Reported per mechanism: the median
absolute error of VAR_POP against the data's exact VAR_POP per group (DuckDB), its ratio joint /
separate, the median released ± of VAR_POP, and the share of answers whose ± covered the exact
value (at 0.95 confidence). The same charge for both (the epsilon asked): printed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dpsql.policy import load_policy
from dpsql.session.session import Session

GROUPS = ("a", "b", "c", "d")
LAWS = ("uniform", "normal", "lognormal", "bimodal")
SIZES = (400, 4_000, 40_000)
EPSILONS = ("0.1", "0.5", "1", "2")


def draw(law: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """n values of ``law`` and its declared upper bound (the lower is 0)."""
    if law == "uniform":
        return rng.uniform(0, 100, n), 100.0
    if law == "normal":
        return np.clip(rng.normal(50, 15, n), 0, 100), 100.0
    if law == "lognormal":
        return np.clip(np.exp(rng.normal(3, 1, n)), 0, 200), 200.0
    heavy = rng.random(n) < 0.3
    return np.clip(np.where(heavy, rng.normal(20, 5, n), rng.normal(80, 8, n)), 0, 100), 100.0


def data_set(folder: Path, law: str, n: int, seed: int) -> tuple[Any, dict[str, float]]:
    rng = np.random.default_rng([seed, LAWS.index(law), n])
    x, upper = draw(law, n, rng)
    x = np.round(x, 3)
    groups = [GROUPS[i % len(GROUPS)] for i in range(n)]
    path = folder / f"{law}_{n}.parquet"
    table = pa.table({"u": pa.array(range(n), pa.int64()), "g": groups, "x": x})
    pq.write_table(table, path)
    policy = load_policy({
        "dataset": {"id": f"var-{law}-{n}", "data_version": "1"},
        "data": {"tables": {"t": str(path)}},
        "budget": {"epsilon": 10_000, "query_epsilon": 1, "diagnose": False},
        "tables": {"t": {"privacy_unit": "u", "max_groups_per_unit": 1,
                         "max_rows_per_unit_per_group": 1,
                         "columns": {"x": {"lower": 0, "upper": upper},
                                     "g": {"public_values": list(GROUPS)}}}},
    })  # fmt: skip
    con = duckdb.connect(":memory:")
    try:
        truth = dict(con.execute(
            f"SELECT g, var_pop(x) FROM read_parquet('{path}') GROUP BY g").fetchall())  # fmt: skip
    finally:
        con.close()
    return policy, truth


def cell(
    policy: Any, truth: dict[str, float], epsilon: str, moments: str, answers: int
) -> dict[str, float]:
    session = Session(policy)
    sql = "SELECT g, VAR_POP(x), STDDEV_SAMP(x) FROM t GROUP BY g"
    errors, widths, covered = [], [], 0
    charged = Fraction(0)
    try:
        for _ in range(answers):
            result = session.execute(sql, fresh=True, epsilon=Fraction(epsilon), moments=moments)
            assert result.charge is not None
            charged = result.charge.epsilon
            for (g, var, _), (_, width, _) in zip(result.rows, result.accuracy, strict=True):
                error = abs(var - truth[g])
                errors.append(error)
                widths.append(width)
                covered += error <= width
    finally:
        session.close()
    return {"error": float(np.median(errors)), "width": float(np.median(widths)),
            "covered": covered / len(errors), "charged": float(charged)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--answers", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    laws, sizes, epsilons = LAWS, SIZES, EPSILONS
    if args.quick:
        laws, sizes, epsilons, args.answers = LAWS[:2], (4_000,), ("1",), 40
    start = time.perf_counter()
    print("| law | n | epsilon | VAR_POP error: joint | separate | joint / separate | "
          "± joint | ± separate | covered joint | covered separate |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    ratios = []
    with tempfile.TemporaryDirectory() as folder:
        for law in laws:
            for n in sizes:
                policy, truth = data_set(Path(folder), law, n, args.seed)
                for epsilon in epsilons:
                    joint = cell(policy, truth, epsilon, "joint", args.answers)
                    apart = cell(policy, truth, epsilon, "separate", args.answers)
                    assert joint["charged"] == apart["charged"] == float(epsilon)
                    ratio = joint["error"] / apart["error"]
                    ratios.append(ratio)
                    print(f"| {law} | {n:,} | {epsilon} | {joint['error']:.4g} | "
                          f"{apart['error']:.4g} | {ratio:.2f} | {joint['width']:.4g} | "
                          f"{apart['width']:.4g} | {joint['covered']:.3f} | "
                          f"{apart['covered']:.3f} |", flush=True)  # fmt: skip
    print(
        f"\nmedian ratio {float(np.median(ratios)):.2f} (from {min(ratios):.2f} to "
        f"{max(ratios):.2f}) over {len(ratios)} cells; {time.perf_counter() - start:.0f} s"
    )


if __name__ == "__main__":
    main()
