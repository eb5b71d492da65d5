"""Sampled queries per budget: how many fresh ``SELECT COUNT(*) FROM visits`` fit a budget of
epsilon 10 (delta 1e-6) at query epsilon 1, unsampled and on unit-level Poisson samples
(``TABLESAMPLE BERNOULLI (p PERCENT)``, charged ln(1 + q(e^epsilon - 1)), q·delta), under each
filter (basic, rdp, zcdp) and mechanism (laplace; gaussian at query delta 1e-8).

Each (accountant, mechanism, rate) is a fresh in-memory session over a small Parquet table
(200 units, one row each, max_groups_per_unit = max_rows_per_unit_per_group = 1) that runs the
query with ``Session.execute(sql, fresh=True)`` (parse, plan, charge, the engine, noise; never
the cache) until the budget refuses it (``BudgetExceededError``), or past ``--cap``. The rows
run in ``--jobs`` processes, each with a one-thread DuckDB.

``--charge-only`` counts instead by charging the planned event to the session's own budget
(``Session.filter.charge``, the call ``execute`` makes before it runs the engine) without
running anything: the same decisions, about ten times faster, for caps beyond the default.

    .venv/bin/python benchmarks/sampling.py                  # ~1 minute on 2 cores
    .venv/bin/python benchmarks/sampling.py --cap 100000 --charge-only
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import duckdb

from dpsql.errors import BudgetExceededError
from dpsql.plan.plans import Plan
from dpsql.policy import Policy, load_policy
from dpsql.session.session import Session

ACCOUNTANTS = ("basic", "rdp", "zcdp")
MECHANISMS = ("laplace", "gaussian")
RATES: tuple[int | None, ...] = (None, 10, 1)  # percent; None: no sample
UNITS = 200
TABLE = "visits.parquet"
BUDGET = {
    "epsilon": "10",
    "delta": "0.000001",
    "query_epsilon": "1",
    "query_delta": "0.00000001",
}


def write_table(directory: Path, units: int = UNITS) -> None:
    """user_id BIGINT, region VARCHAR, age INTEGER, spend DOUBLE: one row per unit."""
    con = duckdb.connect(":memory:")
    try:
        con.execute(
            f"""COPY (
                SELECT i::BIGINT AS user_id,
                       (['north', 'south', 'east'])[i % 3 + 1] AS region,
                       (20 + i % 50)::INTEGER AS age,
                       (i % 200)::DOUBLE AS spend
                FROM range({int(units)}) AS t(i)
            ) TO '{directory / TABLE}' (FORMAT PARQUET)"""
        )
    finally:
        con.close()


def policy(directory: Path, accountant: str, mechanism: str) -> Policy:
    return load_policy(
        {
            "dataset": {"id": "sampling-benchmark", "data_version": "1"},
            "data": {"tables": {"visits": TABLE}},
            "budget": {**BUDGET, "accountant": accountant, "mechanism": mechanism},
            "engine": {"threads": 1},
            "tables": {
                "visits": {
                    "privacy_unit": "user_id",
                    "max_groups_per_unit": 1,
                    "max_rows_per_unit_per_group": 1,
                    "columns": {
                        "spend": {"lower": 0, "upper": 200},
                        "region": {"public_values": ["central", "east", "north", "south", "west"]},
                    },
                }
            },
        },
        base_dir=directory,
    )


def query(rate: int | None) -> str:
    sample = "" if rate is None else f" TABLESAMPLE BERNOULLI ({rate} PERCENT)"
    return f"SELECT COUNT(*) FROM visits{sample}"


@dataclass(frozen=True)
class Row:
    accountant: str
    mechanism: str
    rate: int | None
    epsilon: Fraction  # per query, as charged
    delta: Fraction
    admitted: int  # cap + 1 when the cap was passed
    capped: bool
    refused_by: str
    seconds: float


def _refused_by(error: BudgetExceededError, plan: Plan, n: int, policy: Policy) -> str:
    """What stopped the loop: the epsilon cap, the delta cap (basic), or the part of delta the
    rdp and zcdp filters keep for additive deltas (``budget.selection_delta``)."""
    if "certify nothing" in str(error):
        return "delta reserve"
    if policy.budget.accountant == "basic":
        cap = policy.budget.epsilon
        return "epsilon" if cap is None or (n + 1) * plan.epsilon > cap else "delta"
    return "epsilon"


def count(
    directory: str,
    accountant: str,
    mechanism: str,
    rate: int | None,
    *,
    cap: int,
    charge_only: bool,
) -> Row:
    """Fresh queries admitted by a new session before the budget refuses one (at most cap+1)."""
    pol = policy(Path(directory), accountant, mechanism)
    session = Session(pol)
    sql = query(rate)
    try:
        plan = session.plan(sql)
        refused = "-"
        n = 0
        start = time.perf_counter()
        try:
            while n <= cap:
                if charge_only:
                    session.filter.charge(plan.event, plan.query, None)
                else:
                    result = session.execute(sql, fresh=True)
                    assert result.charge is not None and result.charge.event == plan.event
                n += 1
        except BudgetExceededError as error:
            refused = _refused_by(error, plan, n, pol)
        seconds = time.perf_counter() - start
    finally:
        session.engine.close()
    return Row(accountant, mechanism, rate, plan.epsilon, plan.delta, n, n > cap, refused, seconds)


def _rate(rate: int | None) -> str:
    return "none" if rate is None else f"{rate}%"


def _admitted(row: Row, cap: int) -> str:
    return f"> {cap:,}" if row.capped else f"{row.admitted:,}"


def _ratio(row: Row, base: Row) -> str:
    if base.capped:
        return "?"
    if row.capped:  # more than the cap were admitted: row.admitted is cap + 1
        return f"> {(row.admitted - 1) / base.admitted:.1f}x"
    return f"{row.admitted / base.admitted:.1f}x"


def table(rows: list[Row], cap: int) -> str:
    head = (
        "| accountant | mechanism | rate | per-query epsilon (as charged) | per-query delta "
        "| queries admitted | ratio to unsampled | refused by |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    unsampled = {(r.accountant, r.mechanism): r for r in rows if r.rate is None}
    for r in rows:
        base = unsampled[(r.accountant, r.mechanism)]
        lines.append(
            f"| {r.accountant} | {r.mechanism} | {_rate(r.rate)} | {float(r.epsilon):.6g} "
            f"| {float(r.delta):.3g} | {_admitted(r, cap)} | {_ratio(r, base)} "
            f"| {r.refused_by} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cap", type=int, default=20_000, help="stop counting past this many")
    parser.add_argument(
        "--charge-only",
        action="store_true",
        help="charge the planned event to the session's budget without running the query",
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    tasks = [(a, m, r) for a in ACCOUNTANTS for m in MECHANISMS for r in RATES]
    # The smallest rates admit the most queries: start them first so the long rows overlap.
    order = sorted(tasks, key=lambda t: t[2] if t[2] is not None else 101)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dpsql-sampling-") as tmp:
        write_table(Path(tmp))
        with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = {
                t: pool.submit(count, tmp, *t, cap=args.cap, charge_only=args.charge_only)
                for t in order
            }
            rows = []
            for t in tasks:
                row = futures[t].result()
                rows.append(row)
                per = row.seconds / max(row.admitted, 1) * 1e3
                print(
                    f"{row.accountant:5} {row.mechanism:8} {_rate(row.rate):4}: "
                    f"{_admitted(row, args.cap):>9} in {row.seconds:5.1f} s ({per:.2f} ms each)",
                    flush=True,
                )
    how = "charged only" if args.charge_only else "executed"
    print(f"\n{how}, cap {args.cap:,}, {time.perf_counter() - start:.0f} s in all\n")
    print(table(rows, args.cap))


if __name__ == "__main__":
    main()
