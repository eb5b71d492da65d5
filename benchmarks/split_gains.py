"""The gain of the ``min_total_variance`` split of a query's budget (``SET dpsql.split =
'min_total_variance'``, once called ``optimal``) over the even split, planned and measured.
``accuracy.py`` sets the default, ``min_max_ratio``, beside it, output by output.

    python benchmarks/split_gains.py               # 2,000 draws per plan: about 25 s
    python benchmarks/split_gains.py --draws 500

On a small synthetic table written in a temporary folder (1,000 units of one row each: user_id
BIGINT, region VARCHAR with five public values, age INTEGER in [18, 90], spend DOUBLE in
[0, 200]; L0 = 1 group and C = 1 row per unit, so SUM(spend) has sensitivity 200), query epsilon
1 (delta 1e-8 under the Gaussian), for each query and mechanism (``laplace``, ``gaussian``):

* planned: even/optimal of ``dpsql.plan.split.objective``, the weighed noise variance Σ W_j·Var_j
  the split minimises (Var_j as the split models it: 2b² for a discrete Laplace of scale b, σ²
  for a discrete Gaussian), from ``Session.plan(sql, split=..., mechanism=...)``;
* measured: the same objective with each Var_j the empirical variance, in value units, of the
  noise of ``--draws`` calls of ``dpsql.noise.measure.measure`` on one run of the bounded query
  (the noisy totals minus the exact ones, averaged over the groups), even/optimal, ± one
  standard error (from the spread of the squared errors); beside it, measured/planned under
  each split;
* the charged epsilon and delta under each split (one fresh ``Session.execute`` each): equal,
  asserted;
* per estimate, even/optimal of the mean squared error of the released value against the same
  estimate on the exact totals (the noise's error only, not the bounding's). The split
  minimises the weighed sum, so an estimate of small weight (a COUNT beside a SUM of values up
  to 200) can lose what the others gain.

The noise is drawn afresh by the exact samplers (no seed), so the measured figures move from
run to run by about their standard error (some 5% per split for 2,000 Laplace draws).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import duckdb
import numpy as np

from dpsql.noise.measure import measure
from dpsql.plan.estimators import FloatArray
from dpsql.plan.plans import Plan
from dpsql.plan.split import Split, objective, weights
from dpsql.policy import load_policy
from dpsql.release.post import _estimates
from dpsql.session.session import Session

UNITS = 1000
REGIONS = ("central", "east", "north", "south", "west")
QUERIES = {
    "sum_count": "SELECT SUM(spend), COUNT(*) FROM visits",
    "avg": "SELECT AVG(spend) FROM visits",
    "stddev": "SELECT STDDEV(spend) FROM visits",
    "by_region": "SELECT region, SUM(spend), COUNT(*), AVG(age) FROM visits GROUP BY region",
}
MECHANISMS = ("laplace", "gaussian")
COMPARED: tuple[Split, ...] = ("even", "min_total_variance")
# The planned gains of SUM(spend) + COUNT(*): 4(200² + 1)/(200^(2/3) + 1)³ under Laplace and
# 2(200² + 1)/201² under zCDP (tests/plan/test_split.py).
SUM_COUNT_PLANNED = {"laplace": 3.669, "gaussian": 1.980}


def write_table(path: Path) -> None:
    """One row per unit; ages and spends spread over their bounds, deterministically."""
    regions = ", ".join(f"'{r}'" for r in REGIONS)
    con = duckdb.connect(":memory:")
    try:
        con.execute(
            f"""COPY (
                SELECT i::BIGINT AS user_id,
                       ([{regions}])[i % 5 + 1]::VARCHAR AS region,
                       (18 + (i * 37) % 73)::INTEGER AS age,
                       ((i * 7919) % 20001 / 100.0)::DOUBLE AS spend
                FROM range({UNITS}) t(i)
            ) TO '{path}' (FORMAT PARQUET)"""
        )
    finally:
        con.close()


def session(folder: Path) -> Session:
    path = folder / "visits.parquet"
    write_table(path)
    policy = load_policy(
        {
            "dataset": {"id": "split_gains", "data_version": "1"},
            "data": {"tables": {"visits": str(path)}},
            "budget": {
                "epsilon": "10000",
                "delta": "0.000001",
                "query_epsilon": "1",
                "query_delta": "0.00000001",
            },
            "tables": {
                "visits": {
                    "privacy_unit": "user_id",
                    "max_groups_per_unit": 1,
                    "max_rows_per_unit_per_group": 1,
                    "columns": {
                        "age": {"lower": 18, "upper": 90},
                        "spend": {"lower": 0, "upper": 200},
                        "region": {"public_values": list(REGIONS)},
                    },
                }
            },
        },
        base_dir=folder,
    )
    return Session(policy)


@dataclass(frozen=True)
class Figures:
    planned: float  # Σ W_j·Var_j as planned
    measured: float  # the same with the empirical variances
    error: float  # the standard error of ``measured``
    mse: tuple[float, ...]  # per estimate
    epsilon: Fraction
    delta: Fraction


def floats(values: Any) -> FloatArray:
    return np.asarray(values, dtype=np.float64)


def draw(s: Session, plan: Plan, draws: int) -> tuple[float, float, tuple[float, ...]]:
    """The measured objective, its standard error, and each estimate's mean squared error over
    ``draws`` releases."""
    _, rows = s.engine.run(plan.engine_sql)
    keys = len(plan.analysis.keys)
    exact = [[int(row[keys + j] or 0) for row in rows] for j in range(len(plan.measurements))]
    noisy: list[list[int]] = [[] for _ in plan.measurements]
    for _ in range(draws):
        released = measure(plan, rows)
        assert all(len(totals) == len(rows) for totals in released.totals)
        for j, totals in enumerate(released.totals):
            noisy[j].extend(totals)
    w = weights(plan.estimates, len(plan.measurements))
    measured = spread = 0.0
    for j, m in enumerate(plan.measurements):
        # Exact integer differences first (the totals reach 10^15 units), then value units.
        errors = [n - t for n, t in zip(noisy[j], exact[j] * draws, strict=True)]
        per_group = floats(errors).reshape(draws, len(rows)) * float(m.unit)
        measured += float(w[j]) * float(per_group.var(axis=0, ddof=1).mean())
        # The variance is a mean of squares: its standard error is theirs over √(their number).
        squares = (per_group - per_group.mean(axis=0)) ** 2
        spread += (float(w[j]) * float(squares.std()) / np.sqrt(squares.size)) ** 2
    confidence = plan.options.confidence
    got, _ = _estimates(plan, noisy, confidence)
    truth, _ = _estimates(plan, [t * draws for t in exact], confidence)
    pairs = zip(got, truth, strict=True)
    mse = tuple(float(((floats(g) - floats(t)) ** 2).mean()) for g, t in pairs)
    return measured, float(np.sqrt(spread)), mse


def figures(s: Session, sql: str, mechanism: str, split: Split, draws: int) -> Figures:
    plan = s.plan(sql, split=split, mechanism=mechanism)
    measured, error, mse = draw(s, plan, draws)
    charge = s.execute(sql, split=split, mechanism=mechanism, fresh=True).charge
    assert charge is not None
    assert (charge.epsilon, charge.delta) == (plan.epsilon, plan.delta)
    return Figures(
        objective(plan.measurements, plan.estimates),
        measured,
        error,
        mse,
        charge.epsilon,
        charge.delta,
    )


def row(s: Session, name: str, mechanism: str, draws: int) -> str:
    """One line of the table: the query under both splits."""
    got = {split: figures(s, QUERIES[name], mechanism, split, draws) for split in COMPARED}
    even, best = got["even"], got["min_total_variance"]
    assert (even.epsilon, even.delta) == (best.epsilon, best.delta)
    planned = even.planned / best.planned
    if name == "sum_count":
        assert round(planned, 3) == SUM_COUNT_PLANNED[mechanism], planned
    mse = ", ".join(f"{e / b:#.3g}x" for e, b in zip(even.mse, best.mse, strict=True))
    fit = f"{even.measured / even.planned:.3f}, {best.measured / best.planned:.3f}"
    # The ratio's relative standard error, from the two independent ones.
    error = float(np.hypot(even.error / even.measured, best.error / best.measured))
    return (
        f"| {name} | {mechanism} | {planned:.3f}x | {even.measured / best.measured:.3f}x "
        f"±{error:.0%} | {fit} | {best.epsilon}, {float(best.delta):g} | {mse} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=2000, help="releases per plan")
    args = parser.parse_args()
    start = time.perf_counter()
    print(
        f"{UNITS:,} units, L0 = C = 1, query epsilon 1 (Gaussian: delta 1e-8), "
        f"{args.draws:,} draws per plan; even/optimal ratios (> 1: the optimal split is better)\n"
    )
    print(
        "| query | mechanism | planned | measured | measured/planned even, optimal "
        "| epsilon, delta (both splits) | MSE per estimate |"
    )
    print("|---|---|---:|---:|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        s = session(Path(folder))
        try:
            for name in QUERIES:
                for mechanism in MECHANISMS:
                    print(row(s, name, mechanism, args.draws), flush=True)
        finally:
            s.close()
    print(f"\n{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
