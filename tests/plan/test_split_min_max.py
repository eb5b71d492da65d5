"""The default split, ``min_max_ratio`` (dpsql.plan.split): every estimate stays useful.

What must hold:

- it is the default, and the old default keeps working as ``min_total_variance`` (and its old
  name ``optimal``);
- its shares are the closed form s_j ∝ max_e φ_ej, φ_e the shares estimate e would take asked
  alone, computed here from the plan's public numbers; exact rationals summing to 1, so the
  charged total is exactly the query's;
- no other shares lower its objective, the largest ratio φ_ej/s_j;
- over generated bounds, budgets and aggregate lists, each estimate's variance is at most k²
  times (k under zCDP, at the same rho) its variance asked alone at the same budget, k the
  query's measurements: a count's ± at most k times (√k times) its ± alone. The old rule
  breaks that bound where a count sits beside an AVG of a cost up to 100,000;
- the shares depend on no data; EXPLAIN shows them; the cache serves a repeat free.
"""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY_SCHEMA, examples, policy_over, write_parquet
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsql.plan.plans import Estimate, Measurement, Plan
from dpsql.plan.split import estimate_weights, planned_variance
from dpsql.session.session import Session

ROWS = [(u, ("north", "south")[u % 2], 20 + u % 60, float(u % 150)) for u in range(60)]
HOSPITAL = "SELECT region, COUNT(*), AVG(spend) FROM visits GROUP BY region"
AGGREGATES = (
    "COUNT(*)",
    "SUM(spend)",
    "AVG(spend)",
    "COUNT(age)",
    "AVG(age)",
    "VARIANCE(spend)",
    "STDDEV(age)",
    "COUNT(DISTINCT age)",
)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("split_min_max") / "visits.parquet"
    write_parquet(path, ROWS, TINY_SCHEMA)
    return path


def _session(
    path: Path, spend: tuple[str, str] = ("0", "100000"), l0: int = 3, c: int = 5
) -> Session:
    columns = {
        "spend": {"lower": spend[0], "upper": spend[1]},
        "age": {"lower": 18, "upper": 90},
        "region": {"public_values": ["north", "south"]},
    }
    policy = policy_over(
        path, max_groups=l0, max_rows=c, columns=columns, budget={"query_epsilon": "0.25"}
    )
    return Session(policy)


def _variance(plan: Plan, est: Estimate) -> float:
    """The estimate's weighed noise variance (its kind's weights: the same in any query)."""
    ms = plan.measurements
    return math.fsum(
        float(w) * planned_variance(ms[j])
        for j, w in zip(est.measurements, estimate_weights(est), strict=True)
        if w > 0
    )


def _size(m: Measurement, gaussian: bool) -> float:
    # c_j up to the budget: (u·Δ)² (Laplace), u²·L2² (zCDP), as the module docstring derives.
    if gaussian:
        return m.groups * (float(m.unit) * m.per_group) ** 2
    return (float(m.unit) * m.sensitivity) ** 2


def _phi(plan: Plan, gaussian: bool) -> list[dict[int, float]]:
    """φ_e for each estimate, by Lagrange on e alone: s_j ∝ (W_ej·c_j)^(1/(p+1))."""
    p = 1 if gaussian else 2
    out = []
    for est in plan.estimates:
        raw = {
            j: (float(w) * _size(plan.measurements[j], gaussian)) ** (1 / (p + 1))
            for j, w in zip(est.measurements, estimate_weights(est), strict=True)
            if w > 0
        }
        total = sum(raw.values())
        out.append({j: r / total for j, r in raw.items()})
    return out


def test_min_max_ratio_is_the_default_and_optimal_is_the_old_rule(data: Path) -> None:
    s = _session(data)
    assert s.settings()["split"] == "min_max_ratio"
    default = s.plan(HOSPITAL)
    assert default.measurements == s.plan(HOSPITAL, split="min_max_ratio").measurements
    old = s.plan(HOSPITAL, split="min_total_variance")
    assert old.measurements == s.plan(HOSPITAL, split="optimal").measurements
    assert old.measurements != default.measurements


@pytest.mark.parametrize("mechanism", ["laplace", "gaussian"])
def test_the_shares_are_the_closed_form(data: Path, mechanism: str) -> None:
    s = _session(data)
    sql = "SELECT region, COUNT(*), SUM(spend), AVG(spend), STDDEV(age) FROM visits GROUP BY 1"
    plan = s.plan(sql, mechanism=mechanism, moments="separate")
    gaussian = mechanism == "gaussian"
    most: dict[int, float] = {}
    for phi in _phi(plan, gaussian):
        for j, x in phi.items():
            most[j] = max(most.get(j, 0.0), x)
    total = sum(most.values())
    shares = [m.share for m in plan.measurements]
    assert all(isinstance(x, Fraction) for x in shares)
    assert sum(x for x in shares if x is not None) == 1
    for j, m in enumerate(plan.measurements):
        assert m.share is not None
        assert float(m.share) == pytest.approx(most[j] / total, rel=1e-3)
    if not gaussian:
        # The charged epsilon is exactly the query's: Σ L1_j/scale_j.
        assert sum(Fraction(m.sensitivity) / m.scale for m in plan.measurements if m.scale) == (
            Fraction(1, 4)
        )


def test_no_other_shares_lower_the_largest_ratio(data: Path) -> None:
    s = _session(data)
    sql = "SELECT COUNT(*), SUM(spend), AVG(spend), VARIANCE(age), COUNT(age) FROM visits"
    plan = s.plan(sql)
    phi = _phi(plan, False)
    shares = np.array([float(m.share or 0) for m in plan.measurements])

    def worst(x: np.ndarray) -> float:
        return max(f / x[j] for one in phi for j, f in one.items())

    best = worst(shares)
    rng = np.random.default_rng(7)
    for _ in range(300):
        trial = shares * np.exp(rng.normal(0, 0.2, len(shares)))
        assert worst(trial / trial.sum()) >= best * (1 - 1e-3)


def test_the_issue_s_count_keeps_its_accuracy(data: Path) -> None:
    """COUNT(*) beside AVG(cost in [0, 100000]): the old rule gave the count a sliver of epsilon,
    so a ± hundreds of times its ± alone; the default keeps it within k = 3 times."""
    s = _session(data)
    alone = s.plan("SELECT region, COUNT(*) FROM visits GROUP BY region")
    (count_alone,) = alone.measurements
    assert count_alone.scale is not None
    old = s.plan(HOSPITAL, split="min_total_variance").measurements[0]
    new = s.plan(HOSPITAL).measurements[0]
    assert old.scale is not None and new.scale is not None
    assert old.scale / count_alone.scale > 100
    assert new.scale / count_alone.scale <= 3
    assert new.share == Fraction(1, 2)  # the count and the AVG each get half


@settings(max_examples=examples(40))
@given(
    lower=st.integers(-(10**6), 10**6),
    width=st.integers(1, 10**7),
    l0=st.integers(1, 4),
    c=st.integers(1, 10),
    picked=st.lists(st.sampled_from(AGGREGATES), min_size=1, max_size=5, unique=True),
    mechanism=st.sampled_from(["laplace", "gaussian"]),
    grouped=st.booleans(),
)
def test_each_estimate_is_within_k_of_itself_alone(
    data: Path,
    *,
    lower: int,
    width: int,
    l0: int,
    c: int,
    picked: list[str],
    mechanism: str,
    grouped: bool,
) -> None:
    s = _session(data, (str(lower), str(lower + width)), l0, c)
    keys = "region, " if grouped else ""
    tail = " GROUP BY region" if grouped else ""
    # Under zCDP the bound is at the same rho (a lone Gaussian asked at (epsilon, delta) is
    # calibrated on its exact curve instead, a little tighter than any rho route).
    budget: dict[str, object] = {"mechanism": mechanism}
    if mechanism == "gaussian":
        budget["rho"] = "0.01"
    plan = s.plan(f"SELECT {keys}{', '.join(picked)} FROM visits{tail}", **budget)
    k = len(plan.measurements)
    power = 1 if mechanism == "gaussian" and any(m.sigma2 for m in plan.measurements) else 2
    for aggregate, est in zip(picked, plan.estimates, strict=True):
        alone = s.plan(f"SELECT {keys}{aggregate} FROM visits{tail}", **budget)
        (single,) = alone.estimates
        # Gaussian variances are rounded up to a rational: a hair of slack.
        assert _variance(plan, est) <= k**power * _variance(alone, single) * (1 + 1e-6)


def test_the_split_depends_on_no_data(data: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.parquet"
    write_parquet(other, [(u, "north", 40, 7.0) for u in range(3)], TINY_SCHEMA)
    a = _session(data).plan(HOSPITAL)
    b = _session(other).plan(HOSPITAL)
    assert a.measurements == b.measurements
    assert a.explain() == b.explain()


def test_explain_shows_the_shares_and_a_repeat_is_free(data: Path) -> None:
    s = _session(data)
    lines = "\n".join(r[0] for r in s.execute(f"EXPLAIN {HOSPITAL}").rows)
    assert "share 0.5 of the query's epsilon" in lines
    first = s.execute(HOSPITAL)
    spent = s.budget().epsilon_spent
    again = s.execute(HOSPITAL)
    assert again.cached_from is not None
    assert again.rows == first.rows
    assert s.budget().epsilon_spent == spent
