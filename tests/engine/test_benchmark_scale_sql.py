"""The hand-written bounded SQL of benchmarks/scale.py returns dpsql's pre-noise totals, under
both contracts (R alone; L0 and C), for every query of the scale benchmark.

The scale benchmark's ratios are only fair if both sides compute the same numbers; the benchmark
checks it on every run, and this test checks it on a small version of its data (same generator,
with units holding up to hundreds of rows, so R, L0 and C all bind).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from dpsql.policy import load_policy
from dpsql.session.session import Session

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    sys.path.insert(0, str(BENCH))  # scale.py imports queries.py beside it
    spec = importlib.util.spec_from_file_location(f"dpsql_benchmark_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being created
    spec.loader.exec_module(module)
    return module


S = _load("scale")


@pytest.fixture(scope="module")
def scale_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("scale") / "visits.parquet"
    S.write_data(path, 30_000)
    return path


@pytest.mark.parametrize("contract", ["R", "L0C"])
@pytest.mark.parametrize("name", [q.name for q in S.QUERIES])
def test_hand_sql_returns_dpsql_totals(scale_data: Path, contract: str, name: str) -> None:
    query = next(q for q in S.QUERIES if q.name == name)
    session = Session(load_policy(S.policy_dict(scale_data, contract)))
    try:
        session.engine.salt = S.SALT
        plan = session.plan(query.sql)
        assert tuple(m.spec.kind for m in plan.measurements) == query.kinds
        _, ours = session.engine.run(plan.engine_sql)
        hand = (S.hand_r if contract == "R" else S.hand_l0c)(query, S.Bounds(salt=S.SALT))
        _, theirs = session.engine.run(hand)
        assert S.totals(theirs, len(query.keys)) == S.totals(ours, len(query.keys))
    finally:
        session.close()


def test_the_data_makes_every_bound_bind(scale_data: Path) -> None:
    session = Session(load_policy(S.policy_dict(scale_data, "R")))
    try:
        _, rows = session.engine.run(
            "SELECT COUNT(*), MAX(n), COUNT(*) FILTER (WHERE n > 10), MAX(g) FROM (SELECT "
            "user_id, COUNT(*) AS n, COUNT(DISTINCT region) AS g FROM visits GROUP BY user_id)"
        )
    finally:
        session.close()
    units, biggest, over_r, most_groups = rows[0]
    assert units == 6_000 and biggest > 100 and over_r > 0 and most_groups == 5
