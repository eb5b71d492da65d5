"""The workload planner's gain on the batch of ``benchmarks/workload.sql`` (docs/workload.md).

    python benchmarks/workload.py              # the plan under both contracts, then 30 runs
    python benchmarks/workload.py --runs 0     # the plan only (a few seconds)

For each contract (the example policy's L0 = 2, C = 10; and R = 10 rows per unit with L0 = 10
on top of it), it plans the file as one workload and prints, per statement, the predicted
variance under the joint plan over the independent plan's and the predicted half-widths, then
the sum of the
ratios over the charged statements (independent planning: one per statement) and the cost of
both plans, which is the same. With ``--runs N`` it then releases the file N times jointly
(a new session each time, with one salt) and N times statement by statement in one session
(``SET dpsql.fresh = on``; a large budget),
and reports per statement the measured ratio of the released values' variances (their spread
across runs, joint over independent, cell by cell, the median over the cells; for AVG and
STDDEV the spread of the estimate; cells of no spread in either plan are left out, and a
statement of no spread at all, such as a quantile the exponential mechanism always puts at one
grid point, counts 1), beside the planned ratio, and how far the joint answers' mean is from
the independent answers' (zero but for the noise: each member is bounded as its own query
is), and the released half-widths (the ``±`` an analyst reads) of the joint answers over the
independent ones' (the median over the cells), with the time of one joint and one independent
run.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dpsql.interfaces.cli.plan_lines import plan_lines  # noqa: E402
from dpsql.policy.load import load_policy  # noqa: E402
from dpsql.session.session import Session  # noqa: E402
from dpsql.session.workload_plan import plan_workload  # noqa: E402
from dpsql.session.workloads import run_workload  # noqa: E402
from dpsql.sql.split import split_statements  # noqa: E402

FILE = ROOT / "benchmarks" / "workload.sql"
CONTRACTS = {
    "L0C (L0 = 2, C = 10)": "",
    # L0 >= R: every unit keeps R rows and each of them, so the total can share a family's.
    "R (R = 10, L0 = 10)": (
        "SET dpsql.max_rows_per_unit = 10;\nSET dpsql.max_groups_per_unit = 10;\n"
    ),
}


def _session() -> Session:
    policy = load_policy(ROOT / "examples" / "policy.toml")
    budget = policy.budget.model_copy(update={"epsilon": 10**4})
    return Session(policy.model_copy(update={"budget": budget}), "bench")


def _values(result: Any) -> list[float]:
    """The released numbers of a result, cell by cell (keys left out)."""
    n_keys = len(result.plan.analysis.keys) if result.plan is not None else 0
    return [float(v) for row in result.rows for v in row[n_keys:]]


def _widths(result: Any) -> list[float]:
    """The released half-widths of a result, cell by cell (NaN where none is known)."""
    n_keys = len(result.plan.analysis.keys) if result.plan is not None else 0
    out = []
    for row in result.accuracy or ():
        out += [math.nan if w is None else float(w) for w in row[n_keys:]]
    return out


def _width_factor(joint: list[float], alone: list[float]) -> float:
    """The released half-widths, joint over independent: the median over the cells."""
    pairs = [j / a for j, a in zip(joint, alone, strict=False) if a > 0 and not math.isnan(j + a)]
    return statistics.median(pairs) if pairs else math.nan


def _ratio(joint: list[list[float]], alone: list[list[float]]) -> float:
    """The variance across runs of the joint answers over the independent ones', cell by cell,
    the median over the cells (an empty cell's AVG or STDDEV swings between its clamps in both
    plans, and would dominate a mean); a cell of no spread in either plan is left out."""
    ratios = []
    for j, a in zip(zip(*joint, strict=True), zip(*alone, strict=True), strict=True):
        vj, va = statistics.pvariance(j), statistics.pvariance(a)
        if va > 0:
            ratios.append(vj / va)
        elif vj > 0:
            ratios.append(math.inf)
    return statistics.median(ratios) if ratios else 1.0


def _ratio_array(joint: Any, alone: Any) -> float:
    """``_ratio`` on arrays of runs x cells (numpy; for the bootstrap)."""
    vj, va = joint.var(axis=0), alone.var(axis=0)
    kept = (va > 0) | (vj > 0)
    if not kept.any():
        return 1.0
    with np.errstate(divide="ignore"):
        ratios = np.where(va > 0, vj / np.where(va > 0, va, 1.0), np.inf)[kept]
    return float(np.median(ratios))


def _interval(
    joint: dict[int, list[list[float]]], alone: dict[int, list[list[float]]], draws: int = 300
) -> tuple[float, float]:
    """A 90% bootstrap interval of the measured sum: the runs resampled with replacement,
    joint and independent apart, the sum of the statements' ratios recomputed each time."""
    rng = np.random.default_rng(20261205)
    arrays = {k: (np.array(joint[k]), np.array(alone[k])) for k in joint}
    sums = []
    for _ in range(draws):
        total = 0.0
        for j, a in arrays.values():
            pick_j = rng.integers(0, len(j), len(j))
            pick_a = rng.integers(0, len(a), len(a))
            total += _ratio_array(j[pick_j], a[pick_a])
        sums.append(total)
    # Order statistics, not interpolation: a resample may leave a cell with no spread (inf).
    low = np.percentile(sums, 5, method="lower")
    high = np.percentile(sums, 95, method="higher")
    return float(low), float(high)


def _shift(joint: list[list[float]], alone: list[list[float]]) -> float:
    """How far the joint answers' mean is from the independent ones', relative to it, the
    median over the cells: the bias a finer bounding adds (L0 counts the finer cells)."""
    shifts = []
    for j, a in zip(zip(*joint, strict=True), zip(*alone, strict=True), strict=True):
        mean = statistics.fmean(a)
        if mean != 0:
            shifts.append((statistics.fmean(j) - mean) / abs(mean))
    return statistics.median(shifts) if shifts else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    text = FILE.read_text(encoding="utf-8")
    for contract, prefix in CONTRACTS.items():
        source = prefix + text
        with closing(_session()) as session:
            started = time.perf_counter()
            workload = plan_workload(session, split_statements(source))
            planning = time.perf_counter() - started
            print(f"== {contract}: planned in {planning:.2f} s")
            print("\n".join(plan_lines(session, FILE.name, workload)))
            queries = [s for s in workload.steps if s.charged and s.kind == "query"]
            ratios = [s.ratio if s.ratio is not None else 1.0 for s in queries]
            worst = max(ratios) ** 0.5
            print(
                f"sum of (joint / independent variance) over {len(ratios)} statements: "
                f"{sum(ratios):.3f} ({100 * (1 - sum(ratios) / len(ratios)):.1f}% lower); "
                f"largest half-width factor {worst:.3f}"
            )
            if args.runs <= 0:
                continue
            fresh = "SET dpsql.fresh = on;\n" + source
            joint: dict[int, list[list[float]]] = {}
            alone: dict[int, list[list[float]]] = {}
            widths: dict[int, list[list[float]]] = {}  # the first run's: joint, then alone
            t_joint = t_alone = 0.0
            salt = session.engine.salt
            for _ in range(args.runs):
                # A new session per joint run (a fresh statement shares no measurement, and a
                # family released before would be served again), with one salt: the same
                # bounded rows every run, only the noise differs.
                with closing(_session()) as run:
                    run.engine.salt = salt
                    started = time.perf_counter()
                    w = plan_workload(run, split_statements(source))
                    for step, result in run_workload(run, w):
                        if result is not None and step.kind == "query" and step.plan is not None:
                            joint.setdefault(step.piece.number, []).append(_values(result))
                            widths.setdefault(step.piece.number, [_widths(result)])
                    t_joint += time.perf_counter() - started
                started = time.perf_counter()
                for piece in split_statements(fresh):
                    result = session.execute(piece.text)
                    if result.plan is not None and result.columns:
                        # Numbered as in the file: the SET dpsql.fresh line comes first here.
                        alone.setdefault(piece.number - 1, []).append(_values(result))
                        if len(widths.get(piece.number - 1, ())) == 1:
                            widths[piece.number - 1].append(_widths(result))
                t_alone += time.perf_counter() - started
            print(f"measured over {args.runs} runs (one joint run {t_joint / args.runs:.2f} s, "
                  f"one independent run {t_alone / args.runs:.2f} s):")  # fmt: skip
            total = 0.0
            for step in workload.steps:
                number = step.piece.number
                if number not in joint:
                    continue
                ratio = _ratio(joint[number], alone[number])
                total += ratio
                planned = step.ratio if step.ratio is not None else 1.0
                shift = _shift(joint[number], alone[number])
                factor = _width_factor(*widths[number])
                print(
                    f"  statement {step.piece.number}: measured {ratio:.3f}, planned "
                    f"{planned:.3f}; mean {100 * shift:+.1f}% from the independent answers'; "
                    f"released half-width x{factor:.3f}"
                )
            low, high = _interval(joint, alone)
            lower = 100 * (1 - total / len(joint))
            print(
                f"  measured sum {total:.3f} of {len(joint)} ({lower:.1f}% lower); "
                f"90% bootstrap interval {low:.3f}-{high:.3f}"
            )


if __name__ == "__main__":
    main()
