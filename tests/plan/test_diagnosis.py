"""The diagnosis of the bounds (``SET dpsql.diagnose = on``): its accounting, its sensitivity
on neighbouring data sets, and the fractions it reports on data where the cut is known.

- Accounting: EXPLAIN's cost is what the budget is charged; a diagnosed query costs the query
  plus ``dpsql.diagnose_epsilon`` in one charge; a cached repeat costs nothing and serves the
  same diagnosis; a rejected diagnosis costs nothing. The Gaussian and the PLD filter's
  declared mechanism carry it too.
- Sensitivity: for generated D and D' = D plus one unit, the exact histogram of flag patterns
  moves by at most the planned L1 = 1 (and so L2 = 1), and the plan reads no data.
- Truth: on data whose cut share is known, the released fractions lie within their ±.
"""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import duckdb
import pytest
from conftest import TINY_REGIONS, TinyPolicy, examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dpsql
from dpsql.errors import ParameterError, UndeclaredMechanismError
from dpsql.mechanisms.gaussian_events import DiscreteGaussian
from dpsql.mechanisms.laplace_events import DiscreteLaplace
from dpsql.noise.measure import measure_diagnosis
from dpsql.plan.diagnosis import LABEL
from dpsql.policy import Policy
from dpsql.release.diagnosis import diagnose
from dpsql.session.session import Session

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "policy.toml"
DATA = ROOT / "examples" / "data" / "visits.parquet"
BY_REGION = "SELECT region, COUNT(*) AS n, SUM(spend) AS s FROM visits GROUP BY region"
COUNT = "SELECT COUNT(*) AS n FROM visits"


def _rows(units: int, heavy: int, clamped: int) -> list[tuple[Any, ...]]:
    """``units`` units of 3 rows in one region; the first ``heavy`` have 8 rows (more than
    C = 5), the first ``clamped`` a spend of 500 (above its bound 200) on one row."""
    rows = []
    for u in range(units):
        for r in range(8 if u < heavy else 3):
            spend = 500.0 if u < clamped and r == 0 else float(u % 150)
            rows.append((u, TINY_REGIONS[u % 5], 20 + u % 50, spend))
    return rows


def _session(tiny_policy: TinyPolicy, **budget: Any) -> Session:
    return Session(tiny_policy(_rows(60, 12, 6), max_rows=5, budget=budget or None))


# -- accounting ---------------------------------------------------------------------------------


def test_a_diagnosed_query_costs_the_query_plus_the_diagnosis_in_one_charge(
    tiny_policy: TinyPolicy,
) -> None:
    s = _session(tiny_policy)
    plain = s.plan(BY_REGION)
    s.execute("SET dpsql.diagnose = on")
    plan = s.plan(BY_REGION)
    assert plan.diagnosis is not None and plain.diagnosis is None
    assert plan.epsilon == plain.epsilon + Fraction(1, 10) and plan.delta == plain.delta
    # One more event, the diagnosis's: a discrete Laplace of scale 10 on an L1 = 1 histogram.
    assert plan.event.events[:-1] == plain.event.events
    assert plan.event.events[-1] == DiscreteLaplace(Fraction(10), Fraction(1), dimensions=1)
    assert plan.event.events[-1].label == LABEL
    assert plan.diagnosis.flags == ("L0", "C", "clamped")
    lines = s.execute(f"EXPLAIN VERBOSE {BY_REGION}").rows
    cost = [line for (line,) in lines if line.startswith("cost:")]
    assert cost == [
        f"cost: epsilon {float(plan.epsilon):g}, delta 0 (the diagnosis's epsilon 0.1 included)"
    ]
    assert any(
        line.startswith("diagnosis: a histogram of the 8 flag patterns") for (line,) in lines
    )
    before = s.budget().epsilon_spent
    result = s.execute(BY_REGION)
    assert result.charge is not None and result.charge.epsilon == plan.epsilon
    assert s.budget().epsilon_spent == before + plan.epsilon
    assert result.diagnosis is not None and len(result.diagnosis.cells) == 8
    charges = [r for r in s.filter.store.records() if r.kind == "charge"]
    assert len(charges) == 1  # the query and its diagnosis: one charge
    # A cached repeat: no charge, the same diagnosis served again.
    again = s.execute(BY_REGION)
    assert again.charge is None and again.cached_from is not None
    assert again.diagnosis == result.diagnosis
    assert s.budget().epsilon_spent == before + plan.epsilon


def test_the_undiagnosed_release_does_not_serve_a_diagnosed_query(tiny_policy: TinyPolicy) -> None:
    s = _session(tiny_policy)
    first = s.execute(COUNT)
    assert first.charge is not None and first.diagnosis is None
    diagnosed = s.execute(COUNT, diagnose=True)
    assert diagnosed.charge is not None and diagnosed.diagnosis is not None
    assert diagnosed.charge.epsilon == first.charge.epsilon + Fraction(1, 10)


def test_inline_options_and_the_epsilon_setting(tiny_policy: TinyPolicy) -> None:
    s = _session(tiny_policy)
    inline = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(diagnose = true, diagnose_epsilon = 0.05) "
    plan = s.plan(inline + "COUNT(*) FROM visits")
    assert plan.diagnosis is not None and plan.epsilon == Fraction(1) + Fraction(1, 20)
    assert s.plan(COUNT).diagnosis is None  # the option was the query's only
    s.execute("SET dpsql.diagnose_epsilon = 2")
    assert s.plan(COUNT, diagnose=True).epsilon == 3
    assert s.execute("SHOW dpsql.diagnose").rows == (("False",),)


@pytest.mark.parametrize("value", ["0", "-1", "21", "'x'"])
def test_a_bad_diagnose_epsilon_is_refused_and_costs_nothing(
    tiny_policy: TinyPolicy, value: str
) -> None:
    s = _session(tiny_policy)
    with pytest.raises(ParameterError, match="diagnose_epsilon"):
        s.execute(f"SET dpsql.diagnose_epsilon = {value}")
    with pytest.raises(ParameterError, match="diagnose"):
        s.execute("SET dpsql.diagnose = maybe")
    assert s.budget().epsilon_spent == 0


def test_the_gaussian_query_adds_the_diagnosis_to_its_certified_pair(
    tiny_policy: TinyPolicy,
) -> None:
    s = _session(tiny_policy)
    s.execute("SET dpsql.mechanism = 'gaussian'")
    s.execute("SET dpsql.delta = 1e-9")
    plain = s.plan(BY_REGION)
    plan = s.plan(BY_REGION, diagnose=True)
    assert plan.event.certified is not None and plain.event.certified is not None
    assert plan.epsilon == plain.epsilon + Fraction(1, 10) and plan.delta == plain.delta
    assert any(isinstance(e, DiscreteGaussian) for e in plan.event.events)
    result = s.execute(BY_REGION, diagnose=True)
    assert result.charge is not None and result.charge.epsilon == plan.epsilon
    assert result.diagnosis is not None


LAPLACE = {"kind": "discrete_laplace", "scale": "1000", "sensitivity": 10}
GAUSSIAN = {"kind": "discrete_gaussian", "sigma": "500", "sensitivity": 10}


def test_under_the_pld_filter_the_diagnosis_is_the_declared_laplace(
    tiny_policy: TinyPolicy,
) -> None:
    s = Session(
        tiny_policy(
            _rows(60, 12, 6),
            max_rows=10,
            budget={"epsilon": "1", "accountant": "pld", "declared_mechanism": LAPLACE},
        )
    )
    plain = s.plan(COUNT)
    plan = s.plan(COUNT, diagnose=True)
    assert plan.diagnosis is not None
    assert plan.event.events[-1] == DiscreteLaplace(Fraction(1000), Fraction(10), dimensions=1)
    assert plan.epsilon == plain.epsilon + Fraction(10, 1000)
    result = s.execute(COUNT, diagnose=True)
    assert result.charge is not None and result.charge.epsilon == plan.epsilon
    # The diagnosis's own epsilon may be asked only as the declared noise gives it.
    with pytest.raises(UndeclaredMechanismError, match=r"diagnose_epsilon = 0\.01"):
        s.plan(COUNT, diagnose=True, diagnose_epsilon="0.5")
    assert s.plan(COUNT, diagnose=True, diagnose_epsilon="0.01").epsilon == plan.epsilon


def test_under_the_pld_filter_the_diagnosis_is_the_declared_gaussian(
    tiny_policy: TinyPolicy,
) -> None:
    budget = {"epsilon": "1", "delta": "1e-6", "query_delta": "1e-8", "accountant": "pld",
              "declared_mechanism": GAUSSIAN}  # fmt: skip
    s = Session(tiny_policy(_rows(60, 12, 6), max_rows=10, budget=budget))
    plan = s.plan(COUNT, diagnose=True)
    assert plan.event.events[-1] == DiscreteGaussian(Fraction(250000), Fraction(10))
    assert plan.epsilon > s.plan(COUNT).epsilon
    with pytest.raises(UndeclaredMechanismError, match=r"RESET dpsql\.diagnose_epsilon"):
        s.plan(COUNT, diagnose=True, diagnose_epsilon="0.1")
    before = s.budget().epsilon_spent
    with pytest.raises(UndeclaredMechanismError):
        s.execute(COUNT, diagnose=True, diagnose_epsilon="0.1")
    assert s.budget().epsilon_spent == before
    result = s.execute(COUNT, diagnose=True)
    assert result.diagnosis is not None


# -- sensitivity on neighbouring data sets ------------------------------------------------------

QUERIES = (
    "SELECT COUNT(*) FROM visits",
    "SELECT region, COUNT(*), SUM(spend) FROM visits GROUP BY region",
    "SELECT AVG(spend * 2 - age) FROM visits WHERE age > 30",
    "SELECT region, MEDIAN(age) FROM visits GROUP BY region",
    "SELECT COUNT(*), SUM(LEAST(spend, 50)) FROM (SELECT user_id, spend FROM visits) t",
)
VALUE = st.one_of(
    st.floats(-1000, 1000),
    st.sampled_from([None, math.nan, math.inf, -math.inf, 0.0, 200.0, 200.5, -0.5]),
)
ROW = st.tuples(st.sampled_from([*TINY_REGIONS, "elsewhere", None]), st.integers(0, 120), VALUE)


def _exact(s: Session, query: str, options: dict[str, Any]) -> tuple[Any, list[int]]:
    """The plan and the exact (pre-noise) histogram of its diagnosis."""
    plan = s.plan(query, diagnose=True, **options)
    assert plan.diagnosis is not None
    counts = [0] * plan.diagnosis.cells
    for pattern, units in s.engine.run(plan.diagnosis.engine_sql)[1]:
        counts[int(pattern)] = int(units)
    return plan, counts


def _histogram(policy: Policy, query: str, options: dict[str, Any]) -> tuple[Any, list[int]]:
    s = Session(policy)
    try:
        return _exact(s, query, options)
    finally:
        s.close()


@settings(max_examples=examples(15), suppress_health_check=list(HealthCheck))
@given(
    base=st.lists(st.tuples(st.integers(1, 6), ROW), max_size=30),
    unit=st.lists(ROW, min_size=0, max_size=12),
    query=st.sampled_from(QUERIES),
    bounds=st.sampled_from(
        [
            {},
            {"max_rows_per_unit": 3},
            {"max_groups_per_unit": 1},
            {"other_group": True},
            {"other_group": True, "max_groups_per_unit": 1},
        ]
    ),
)
def test_one_unit_moves_one_cell_by_at_most_one(
    tiny_policy: TinyPolicy,
    base: list[tuple[int, tuple[Any, ...]]],
    unit: list[tuple[Any, ...]],
    query: str,
    bounds: dict[str, Any],
) -> None:
    rows = [(u, region, age, spend) for u, (region, age, spend) in base]
    added = rows + [(99, region, age, spend) for region, age, spend in unit]
    # Row-filled tables: an empty one has no rows to type a Parquet file from.
    filler = [(0, "north", 18, 1.0)]
    plan, d = _histogram(tiny_policy(filler + rows, max_rows=2), query, bounds)
    plan2, d2 = _histogram(tiny_policy(filler + added, max_rows=2), query, bounds)
    assert plan.diagnosis == plan2.diagnosis  # the plan reads no data
    assert plan.diagnosis is not None
    m = plan.diagnosis.measurement
    assert (m.sensitivity, m.groups, m.per_group) == (1, 1, 1)  # the L1 (and L2) planned
    moved = [abs(a - b) for a, b in zip(d, d2, strict=True)]
    assert sum(moved) <= m.sensitivity  # L1
    assert math.sqrt(sum(x * x for x in moved)) <= 1  # L2
    assert sum(d2) - sum(d) in (0, 1)  # the added unit is one unit, if it is in the relation


def test_with_the_other_group_the_diagnosis_counts_the_groups_the_query_bounds(
    tiny_policy: TinyPolicy,
) -> None:
    """Rows outside the domain are dropped, or with ``other_group`` kept in one more group: the
    diagnosis counts a unit's groups as the bounded query does, after that mapping."""
    # Unit 1: north, and two values outside the domain (one other group); unit 2: north only.
    rows = [(1, "north", 30, 1.0), (1, "elsewhere", 30, 1.0), (1, None, 30, 1.0)]
    rows += [(2, "north", 30, 1.0)]
    policy = tiny_policy(rows, max_groups=1)
    query = "SELECT region, COUNT(*) AS n FROM visits GROUP BY region"
    plan, dropped = _histogram(policy, query, {})
    assert plan.diagnosis is not None and plan.diagnosis.flags[0] == "L0"
    assert dropped[1] == 0 and sum(dropped) == 2  # one group each: no unit over L0 = 1
    plan, kept = _histogram(policy, query, {"other_group": True})
    assert plan.diagnosis is not None and plan.diagnosis.flags[0] == "L0"
    assert kept[1] == 1 and sum(kept) == 2  # unit 1 touches north and the other group


# -- the fractions, on data whose cut is known --------------------------------------------------


def test_the_fractions_are_near_the_known_cut(tiny_policy: TinyPolicy) -> None:
    # 2,000 units; 500 have 8 rows in their one group (more than C = 5), 250 a spend of 500.
    s = Session(tiny_policy(_rows(2000, 500, 250), max_rows=5, max_groups=1))
    s.execute("SET dpsql.confidence = 0.9999")  # the truth misses the ± once in 10,000 runs
    result = s.execute(BY_REGION, diagnose=True, diagnose_epsilon=2)
    d = result.diagnosis
    assert d is not None
    truth = {"L0": 0.0, "C": 0.25, "clamped": 0.125, "any": 0.25}
    for flag, fraction, width in d.fractions:
        assert abs(fraction - truth[flag]) <= width < 0.02, flag
    assert abs(d.cut[0] - truth["any"]) <= d.cut[1] < 0.02
    assert abs(d.units - 2000) < 100
    assert d.summary().startswith(f"bounds cut ~{100 * d.cut[0]:.0f}% of units")


@pytest.mark.skipif(not DATA.exists(), reason="run examples/make_data.py for the example data")
def test_on_the_example_data_with_a_small_c(tmp_path: Path) -> None:
    truth = (
        duckdb.connect()
        .execute(
            "SELECT AVG(CASE WHEN n > 5 THEN 1 ELSE 0 END) FROM "
            f"(SELECT user_id, COUNT(*) AS n FROM '{DATA}' GROUP BY user_id)"
        )
        .fetchone()
    )
    assert truth is not None
    with dpsql.connect(EXAMPLE) as conn:
        cur = conn.cursor()
        cur.execute("SET dpsql.max_rows_per_unit_per_group = 5")
        cur.execute("SET dpsql.confidence = 0.9999")
        cur.execute("SET dpsql.diagnose = on")
        cur.execute(COUNT)
        d = cur.diagnostics
        assert d is not None and d.flags == ("C",)
        assert abs(d.fraction("C") - truth[0]) <= d.fractions[0][2] < 0.005
        assert cur.covers == f"noise only; {d.summary()}"
        assert "bounds cut" in repr(cur.result)
        cur.execute("SET dpsql.diagnose = off")
        cur.execute(COUNT)
        assert cur.diagnostics is None and cur.covers == "noise only"


@pytest.mark.parametrize(
    ("aggregate", "flagged"),
    [
        ("SUM(spend)", {1, 2, 4}),  # 250, +inf and 200.5 lie beyond [0, 200]
        ("AVG(spend * 2)", {1, 2, 4}),  # spend is clamped inside the expression
        ("SUM(LEAST(spend, 50))", set()),  # the clamp to 200 changes no value of LEAST(., 50)
        ("SUM(age - 18)", {5}),  # age 95 lies beyond [18, 90]
        ("COUNT(spend)", set()),  # a count clamps nothing
    ],
)
def test_the_clamp_flag_marks_the_units_whose_values_a_clamp_changes(
    tiny_policy: TinyPolicy, aggregate: str, flagged: set[int]
) -> None:
    rows = [
        (1, "east", 30, 250.0),
        (2, "east", 30, math.inf),
        (3, "east", 30, math.nan),  # NaN is skipped, never clamped
        (4, "east", 30, 200.5),
        (5, "east", 95, 10.0),
        (6, "east", 30, None),
        (7, "east", 30, 0.0),
    ]
    s = Session(tiny_policy(rows, max_rows=5))
    plan, cells = _exact(s, f"SELECT {aggregate} FROM visits", {})
    assert plan.diagnosis is not None
    clamp = plan.diagnosis.flags.index("clamped") if "clamped" in plan.diagnosis.flags else None
    counted = sum(n for p, n in enumerate(cells) if clamp is not None and p >> clamp & 1)
    assert counted == len(flagged) and sum(cells) == len(rows)
    # Which units: the same query restricted to each unit in turn.
    for uid, *_ in rows:
        _, one = _exact(s, f"SELECT {aggregate} FROM visits WHERE user_id = {uid}", {})
        marked = sum(n for p, n in enumerate(one) if clamp is not None and p >> clamp & 1)
        assert marked == (uid in flagged), uid
    s.close()


def test_estimate_bounds_is_never_diagnosed_and_the_ledger_keeps_the_diagnosis_sql(
    tiny_policy: TinyPolicy,
) -> None:
    s = _session(tiny_policy)
    s.execute("SET dpsql.diagnose = on")
    estimate = s.execute("ESTIMATE BOUNDS FOR visits.spend")
    assert estimate.charge is not None and estimate.charge.epsilon == 1
    assert estimate.diagnosis is None
    result = s.execute(COUNT)
    assert result.charge is not None and result.plan is not None
    assert result.plan.diagnosis is not None
    (last,) = [r for r in s.filter.store.records() if r.kind == "charge"][-1:]
    assert last.payload["diagnosis_sql"] == result.plan.diagnosis.engine_sql


@pytest.mark.statistical
def test_the_fractions_plus_minus_covers_the_true_fraction(tiny_policy: TinyPolicy) -> None:
    """The ± of a diagnosis is a confidence interval of the true fraction (its cells are exact
    counts): over many draws of the noise it holds at least as often as its confidence."""
    s = _session(tiny_policy)
    plan = s.plan(BY_REGION, diagnose=True, diagnose_epsilon="0.5", confidence="0.8")
    d = plan.diagnosis
    assert d is not None
    true = [300, 25, 0, 7, 60, 0, 3, 5]  # units per flag pattern (L0, C, clamped bits)
    rows = [(p, n) for p, n in enumerate(true) if n]
    total = sum(true)
    truth = {
        flag: sum(n for p, n in enumerate(true) if p >> j & 1) / total
        for j, flag in enumerate(d.flags)
    }
    truth["any"] = 1 - true[0] / total
    held = {flag: 0 for flag in truth}
    trials = 2000
    for _ in range(trials):
        released = diagnose(d, measure_diagnosis(d, rows), 0.8)
        for flag, fraction, width in released.fractions:
            held[flag] += abs(fraction - truth[flag]) <= width
        held["any"] += abs(released.cut[0] - truth["any"]) <= released.cut[1]
    for flag, count in held.items():
        assert count / trials >= 0.8, flag  # in fact near 1: the box is conservative
