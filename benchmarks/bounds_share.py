"""Does another ``dpsql.bounds_share`` bring a total's auto row cap R nearer the oracle?

A numpy simulation beside ``bounds.py`` (same generators, other seeds: 300-329 by default, so
that nothing is set on the seeds ``bounds.py`` reports). For each data set, epsilon and share s,
R is dpsql's own walk (``dpsql.release.auto_bounds.tradeoff_walk``: the ladder, the target
k = √2/((1 − s)·ε), the threshold share and the overshoot, with dpsql's exact discrete Laplace
sampler) on the units' row counts at s·ε; the answer is the exact R-bounded total (COUNT: Σ
min(n_u, R); SUM: each unit's sum scaled by min(1, R/n_u), the expected value of keeping a
random R of its rows) plus noise at (1 − s)·ε (discrete Laplace of scale R/ε' on COUNT, a
Laplace of scale 100·R/ε' on SUM, 100 the amount's upper bound). The oracle spends the whole ε
on the answer at the power of two R with the least median error over the data sets (20 noise
draws each). Printed: the median relative error over data sets (3 walks and draws each) over the
oracle's, per share.

    python benchmarks/bounds_share.py                 # 30 data sets, 5 shares: about 10 minutes
    python benchmarks/bounds_share.py --seeds 5 --generators heavy geometric
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bounds import GENERATORS

from dpsql.plan.auto import LADDER
from dpsql.release.auto_bounds import beyond, tradeoff_walk

FloatArray = npt.NDArray[np.float64]
SHARES = ("0.1", "0.15", "0.2", "0.25", "0.33")
EPSILONS = ("0.1", "0.5", "1")
UPPER = 100.0  # the amount's declared upper bound (bounds.UPPER)


def discrete_laplace(rng: np.random.Generator, scale: float, size: int) -> FloatArray:
    """The difference of two geometrics: a discrete Laplace of ``scale`` (numpy, not dpsql's)."""
    p = 1.0 - math.exp(-1.0 / scale)
    return (rng.geometric(p, size) - rng.geometric(p, size)).astype(np.float64)


@dataclass(frozen=True)
class DataSet:
    rows: FloatArray  # per unit
    sums: FloatArray  # per unit: its amounts' sum
    above: list[int]  # units beyond each rung of LADDER


def errors(
    rng: np.random.Generator, query: str, data: DataSet, cap: float, epsilon: float, *, draws: int
) -> FloatArray:
    """|noisy R-bounded total − truth| / max(truth, 1), ``draws`` noises."""
    rows, sums = data.rows, data.sums
    if query == "COUNT":
        truth, bounded = rows.sum(), np.minimum(rows, cap).sum()
        noise = discrete_laplace(rng, cap / epsilon, draws)
    else:
        truth, bounded = sums.sum(), (sums * np.minimum(1.0, cap / rows)).sum()
        noise = rng.laplace(0.0, UPPER * cap / epsilon, draws)
    return np.asarray(np.abs(bounded + noise - truth) / max(truth, 1.0), dtype=np.float64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--seed", type=int, default=300, help="the first data set's seed")
    parser.add_argument("--shares", nargs="+", default=list(SHARES))
    parser.add_argument("--epsilons", nargs="+", default=list(EPSILONS))
    parser.add_argument("--generators", nargs="+", choices=list(GENERATORS),
                        default=list(GENERATORS))  # fmt: skip
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    shares = [Fraction(s) for s in args.shares]
    print("| generator | epsilon | query | oracle | " + " | ".join(f"s = {s}" for s in args.shares)
          + " |")  # fmt: skip
    print("|---|---|---|---|" + "---|" * len(shares))
    for name in args.generators:
        data = []
        for seed in range(args.seed, args.seed + args.seeds):
            unit, _, amount = GENERATORS[name].draw(seed)
            rows = np.bincount(unit).astype(np.float64)
            values, counts = np.unique(rows.astype(np.int64), return_counts=True)
            above = beyond({int(v): int(c) for v, c in zip(values, counts, strict=True)})
            data.append(DataSet(rows, np.bincount(unit, weights=amount), above))
        for text in args.epsilons:
            epsilon = Fraction(text)
            for query in ("COUNT", "SUM"):
                at = float(epsilon)
                medians = [
                    float(np.median([np.median(errors(rng, query, d, 2.0**j, at, draws=20))
                                     for d in data]))
                    for j in range(17)
                ]  # fmt: skip
                oracle = min(medians)
                cells = []
                for share in shares:
                    answer = float(epsilon * (1 - share))
                    k = Fraction(math.sqrt(2) / answer).limit_denominator(10**6)
                    found = [
                        errors(rng, query, d, LADDER[tradeoff_walk(epsilon * share, 1, d.above, k)],
                               answer, draws=1)[0]
                        for d in data
                        for _ in range(3)
                    ]  # fmt: skip
                    cells.append(f"{float(np.median(found)) / oracle:.2f}x")
                print(f"| {name} | {text} | {query} | {oracle:.3g} | " + " | ".join(cells) + " |",
                      flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
