"""The half-widths a joint answer is released with (the ``±`` an analyst reads): on the batch of
``benchmarks/workload.sql`` over the example data, under both contracts the benchmark reports,
no count's or sum's released half-width is more than 10% wider than the same statement
answered on its own, and each is within 1% of what the plan predicted (the predicted factor is
the square root of the variance ratio; the released one is the bound on the noise combination
of ``dpsql.mechanisms.tails``, which was 1.4-1.9 times the exact quantile before it was computed on
a grid)."""

from __future__ import annotations

import math
from contextlib import closing
from pathlib import Path

import pytest

from dpsql.policy.load import load_policy
from dpsql.session.session import Session
from dpsql.session.workload_plan import plan_workload
from dpsql.session.workloads import run_workload
from dpsql.sql.split import split_statements

ROOT = Path(__file__).resolve().parents[2]
BATCH = (ROOT / "benchmarks" / "workload.sql").read_text(encoding="utf-8")
# Under R, with L0 >= R (R <= C already): every unit keeps R rows and each of them, so the
# total of rows shares the rows bounded by region.
CONTRACTS = {
    "L0, C": "",
    "R": "SET dpsql.max_rows_per_unit = 10;\nSET dpsql.max_groups_per_unit = 10;\n",
}


def _session() -> Session:
    policy = load_policy(ROOT / "examples" / "policy.toml")
    budget = policy.budget.model_copy(update={"epsilon": 100})
    return Session(policy.model_copy(update={"budget": budget}), "widths")


def _count_and_sum_widths(result: object) -> list[float]:
    plan = getattr(result, "plan", None)
    assert plan is not None
    kinds = [agg.kind for agg in plan.analysis.aggregates]
    if any(kind not in ("count_rows", "count", "sum") for kind in kinds):
        return []  # AVG, STDDEV: their box depends on the noisy values; quantiles: none
    n_keys = len(plan.analysis.keys)
    return [float(w) for row in getattr(result, "accuracy", ()) for w in row[n_keys:]]


@pytest.mark.parametrize("contract", list(CONTRACTS))
def test_joint_answers_are_released_no_wider_than_planned(contract: str) -> None:
    source = CONTRACTS[contract] + BATCH
    with closing(_session()) as session:
        workload = plan_workload(session, split_statements(source))
        ratios = {s.piece.number: s.ratio for s in workload.steps if s.ratio is not None}
        joint = {
            step.piece.number: _count_and_sum_widths(result)
            for step, result in run_workload(session, workload)
            if result is not None and step.kind == "query"
        }
    with closing(_session()) as alone:
        alone.execute("SET dpsql.fresh = on")
        checked = 0
        for piece in split_statements(source):
            result = alone.execute(piece.text)
            if piece.number not in ratios or not joint.get(piece.number):
                continue
            own = _count_and_sum_widths(result)
            predicted = math.sqrt(ratios[piece.number])
            for j, a in zip(joint[piece.number], own, strict=True):
                assert j <= 1.1 * a, (contract, piece.text)
                assert j <= predicted * a * 1.01 + 1, (contract, piece.text, j / a, predicted)
                checked += 1
        assert checked >= 5
