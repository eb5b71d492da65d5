"""Unit-level Poisson samples and their amplified charge (dpsql.analyze.sample, dpsql.plan.sample).

What must hold:

- ``TABLESAMPLE BERNOULLI (p PERCENT)`` and ``dpsql.sample_rate`` ask for it; every other form
  (SYSTEM, RESERVOIR, a row count, a join, a CTE, a subquery, a percent out of (0, 100]) is
  refused before any charge, and TABLESAMPLE never reaches the engine;
- each unit is kept with probability q, all its rows or none, by a keyed PRF whose secret is
  fresh per run (two runs' samples are independent) and never in EXPLAIN, the engine text or
  the ledger;
- the charge is the whole query's (epsilon, delta) amplified once, ln(1 + q(e^epsilon - 1)) and
  q·delta at the implemented rate k/2^64: checked against an exact lattice computation of the
  subsampled discrete Laplace in both directions, and against dp_accounting's PLD of the
  subsampled continuous Laplace;
- a cached release of a sample answers only the same query on a sample at the same rate;
- refused with the declared-mechanism PLD filter, with the diagnosis, and for units whose text
  is not one per unit.
"""

from __future__ import annotations

import math
import re
import secrets
from fractions import Fraction
from typing import Any

import dp_accounting
import duckdb
import numpy as np
import pytest
from conftest import TinyPolicy
from dp_accounting import rdp as rdp_lib
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from scipy import stats
from server_fixtures import write_dataset
from server_fixtures import write_policy as write_server_policy

from dpsql.analyze.sample import implemented, sample_filter, threshold
from dpsql.engine.duckdb import engine as duckdb_engine
from dpsql.errors import (
    BudgetExceededError,
    ParameterError,
    UndeclaredMechanismError,
    UnsupportedQueryError,
)
from dpsql.mechanisms.curves import subsampled_rdp
from dpsql.mechanisms.event_kinds import composite_from_json, composite_to_json
from dpsql.mechanisms.stated_events import PureDP, SubsampledGaussian
from dpsql.plan.sample import amplified_epsilon
from dpsql.release import result as frames
from dpsql.session.session import Session

UNITS = 400
ROWS = [(u, ("north", "south", "east")[u % 3], 20 + u % 50, float(u % 200)) for u in range(UNITS)]
ROWS += [(u, "north", 30, 1.0) for u in range(UNITS) for _ in range(3)]  # four rows per unit
COUNT = "SELECT COUNT(*) FROM visits TABLESAMPLE BERNOULLI (10 PERCENT)"


def _session(tiny_policy: TinyPolicy, **budget: Any) -> Session:
    return Session(tiny_policy(ROWS, max_groups=1, max_rows=4, budget={"epsilon": "100", **budget}))


def test_the_charge_is_the_amplified_query(tiny_policy: TinyPolicy) -> None:
    s = _session(tiny_policy)
    plain = s.plan("SELECT COUNT(*) FROM visits")
    plan = s.plan(COUNT)
    q = implemented(Fraction(1, 10))
    assert q == Fraction(threshold(Fraction(1, 10)), 2**64) and q >= Fraction(1, 10)
    assert plan.epsilon >= Fraction(math.log1p(float(q) * math.expm1(float(plain.epsilon))))
    assert plan.epsilon == amplified_epsilon(plain.epsilon, q) < plain.epsilon
    assert plan.event.events == (PureDP(plan.epsilon),)
    before = s.budget().epsilon_spent
    s.execute(COUNT)
    assert s.budget().epsilon_spent == before + plan.epsilon
    lines = "\n".join(plan.explain())
    assert "sample: each unit kept with probability" in lines
    assert "$sample" in lines and "TABLESAMPLE" not in plan.engine_sql.upper()


def test_the_whole_query_is_amplified_once(tiny_policy: TinyPolicy) -> None:
    """Two measurements of epsilon 1 each at q = 0.01: the joint event ln(1 + q(e² - 1)) =
    0.062, not twice ln(1 + q(e - 1)) = 0.034 (amplifying the parts would undercharge)."""
    s = _session(tiny_policy)
    sql = "SELECT SUM(spend), COUNT(*) FROM visits TABLESAMPLE BERNOULLI (1 PERCENT)"
    plan = s.plan(sql, epsilon=2, split="even")
    assert float(plan.epsilon) == pytest.approx(0.0619325, abs=2e-6)
    assert float(plan.epsilon) > 2 * math.log1p(0.01 * math.expm1(1.0))


def test_gaussian_and_selection_deltas_are_amplified_with_the_rest(
    tiny_policy: TinyPolicy,
) -> None:
    s = _session(tiny_policy)
    sql = "SELECT SUM(spend), COUNT(*) FROM visits TABLESAMPLE BERNOULLI (5 PERCENT)"
    plain = s.plan(sql.replace(" TABLESAMPLE BERNOULLI (5 PERCENT)", ""), mechanism="gaussian")
    plan = s.plan(sql, mechanism="gaussian")
    q = implemented(Fraction(5, 100))
    (event,) = plan.event.events
    assert isinstance(event, SubsampledGaussian)  # an ApproxDP pair with its rho beside it
    assert (event.epsilon, event.delta) == (plan.epsilon, q * plain.delta)
    assert plan.epsilon == amplified_epsilon(plain.epsilon, q)
    columns = {"spend": {"lower": 0, "upper": 200}}
    private = Session(tiny_policy(ROWS, max_groups=1, max_rows=4, columns=columns))
    grouped = (
        "SELECT region, COUNT(*) FROM visits TABLESAMPLE BERNOULLI (5 PERCENT) GROUP BY region"
    )
    inner = private.plan(grouped.replace(" TABLESAMPLE BERNOULLI (5 PERCENT)", ""))
    sampled = private.plan(grouped)
    assert inner.delta > 0 and sampled.delta == q * inner.delta


@pytest.mark.parametrize(
    ("sql", "error", "match"),
    [
        ("SELECT COUNT(*) FROM visits TABLESAMPLE SYSTEM (1 PERCENT)", UnsupportedQueryError,
         "SYSTEM samples blocks"),
        ("SELECT COUNT(*) FROM visits TABLESAMPLE (10)", UnsupportedQueryError, "row count"),
        ("SELECT COUNT(*) FROM visits TABLESAMPLE BERNOULLI (0 PERCENT)", ParameterError,
         "BERNOULLI"),
        ("SELECT COUNT(*) FROM visits TABLESAMPLE BERNOULLI (101 PERCENT)", ParameterError,
         "BERNOULLI"),
        ("SELECT COUNT(*) FROM (SELECT * FROM visits TABLESAMPLE BERNOULLI (5 PERCENT)) AS t",
         UnsupportedQueryError, "not in a CTE or a subquery"),
        ("SELECT COUNT(*) FROM visits AS a TABLESAMPLE BERNOULLI (5 PERCENT) JOIN visits AS b "
         "TABLESAMPLE BERNOULLI (6 PERCENT) ON a.user_id = b.user_id",
         UnsupportedQueryError, "at one rate"),
        ("WITH v AS (SELECT * FROM visits) SELECT COUNT(*) FROM v TABLESAMPLE BERNOULLI "
         "(5 PERCENT)", UnsupportedQueryError, "not in a CTE or a subquery"),
    ],
)  # fmt: skip
def test_other_forms_are_refused_before_any_charge(
    tiny_policy: TinyPolicy, sql: str, error: type[Exception], match: str
) -> None:
    s = _session(tiny_policy)
    with pytest.raises(error, match=match):
        s.execute(sql)
    assert s.budget().epsilon_spent == 0


def test_the_setting_and_the_option_ask_for_it_too(tiny_policy: TinyPolicy) -> None:
    s = _session(tiny_policy)
    clause = s.plan(COUNT).epsilon
    inline = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(sample_rate = 0.1) COUNT(*) FROM visits"
    assert s.plan(inline).epsilon == clause
    s.execute("SET dpsql.sample_rate = 0.1")
    assert s.plan("SELECT COUNT(*) FROM visits").epsilon == clause
    for bad in ("0", "1.5", "-0.1", "x"):
        with pytest.raises(ParameterError, match="sample_rate"):
            s.execute(f"SET dpsql.sample_rate = {bad}")
    s.execute("SET dpsql.sample_rate = 1")  # every unit: no sample, no amplification
    assert s.plan("SELECT COUNT(*) FROM visits").sample is None


def test_refused_with_the_declared_mechanism_and_the_diagnosis(tiny_policy: TinyPolicy) -> None:
    declared = {"kind": "discrete_laplace", "scale": "1000", "sensitivity": 10}
    budget = {"epsilon": "1", "accountant": "pld", "declared_mechanism": declared}
    s = Session(tiny_policy(ROWS, max_groups=1, max_rows=4, budget=budget))
    with pytest.raises(UndeclaredMechanismError, match="sample"):
        s.execute(COUNT)
    with pytest.raises(UnsupportedQueryError, match="diagnose"):
        _session(tiny_policy).execute(COUNT, diagnose=True)


def test_a_unit_is_in_or_out_with_all_its_rows(tiny_policy: TinyPolicy) -> None:
    s = _session(tiny_policy)
    plan = s.plan("SELECT COUNT(*) FROM visits TABLESAMPLE BERNOULLI (30 PERCENT)")
    for _ in range(5):
        ((total,),) = s.engine.run(plan.engine_sql)[1]
        assert int(total) % 4 == 0  # every unit has four rows, C = 4


def test_the_cache_keys_the_rate(tiny_policy: TinyPolicy) -> None:
    s = _session(tiny_policy)
    first = s.execute(COUNT)
    assert s.execute(COUNT).rows == first.rows  # the same release, free
    assert s.execute(COUNT).charge is None
    other = s.execute(COUNT.replace("10 PERCENT", "20 PERCENT"))
    plain = s.execute("SELECT COUNT(*) FROM visits")
    assert other.charge is not None and plain.charge is not None


def test_the_secret_is_nowhere_an_analyst_reads(tiny_policy: TinyPolicy) -> None:
    s = _session(tiny_policy)
    s.execute(COUNT)
    shown = "\n".join(r[0] for r in s.execute(f"EXPLAIN VERBOSE {COUNT}").rows)
    ledger = repr(s.cache.store.records_since(0))
    assert "Poisson sample" in ledger  # the charge is there, the secret is not
    assert "$sample" in shown
    for text in (shown, ledger, s.plan(COUNT).engine_sql):
        assert not re.search(r"\b[0-9a-f]{32}\b", text)


# --- the PRF: each unit with probability q, independently across runs ---------------------


def _kept(secret: str, rate: Fraction, n: int) -> np.ndarray:
    con = duckdb.connect()
    where = sample_filter("u", rate)
    rows = con.execute(f"SELECT u FROM range({n}) t(u) WHERE {where}", {"sample": secret})
    return np.array([u for (u,) in rows.fetchall()], dtype=np.int64)


@pytest.mark.statistical
@pytest.mark.parametrize("rate", [Fraction(1, 100), Fraction(1, 10), Fraction(1, 2)])
def test_each_unit_is_kept_with_probability_q_and_runs_are_independent(rate: Fraction) -> None:
    n = 200_000
    a = _kept(secrets.token_hex(16), rate, n)
    b = _kept(secrets.token_hex(16), rate, n)
    q = float(implemented(rate))
    for kept in (a, b):
        assert stats.binomtest(len(kept), n, q).pvalue > 1e-6
    both = len(np.intersect1d(a, b))
    assert stats.binomtest(both, n, q * q).pvalue > 1e-6  # independent samples
    # The same secret gives the same sample: the decision is a function of the unit.
    secret = secrets.token_hex(16)
    assert np.array_equal(_kept(secret, rate, 5000), _kept(secret, rate, 5000))


# --- the theorem, checked --------------------------------------------------------------------


def _discrete_laplace(scale: float, z: np.ndarray) -> np.ndarray:
    p = math.exp(-1 / scale)
    return (1 - p) / (1 + p) * p ** np.abs(z)


@pytest.mark.parametrize("q", [0.01, 0.1, 0.5])
@pytest.mark.parametrize(("scale", "shift"), [(2.0, 1), (10.0, 10), (0.5, 1)])
def test_the_amplified_epsilon_bounds_the_exact_subsampled_discrete_laplace(
    q: float, scale: float, shift: int
) -> None:
    """The subsampled discrete Laplace on neighbours, exactly on the integer lattice: with the
    added unit, the output is (1 - q)·DL(0) + q·DL(shift); without it, DL(0). Its largest
    privacy loss in either direction is at most ln(1 + q(e^epsilon - 1)), epsilon =
    shift/scale, and attains it (the theorem is tight for the Laplace)."""
    # The loss is constant for z <= 0 and for z >= shift: a window around them holds its range.
    z = np.arange(-3 * shift - 5, 4 * shift + 6)
    without = _discrete_laplace(scale, z)
    with_unit = (1 - q) * without + q * _discrete_laplace(scale, z - shift)
    loss = np.log(with_unit) - np.log(without)
    worst = float(max(loss.max(), (-loss).max()))
    epsilon = Fraction(shift) / Fraction(scale)
    bound = float(amplified_epsilon(epsilon, Fraction(q)))
    assert worst <= bound
    assert worst == pytest.approx(math.log1p(q * math.expm1(float(epsilon))), rel=1e-6)


@pytest.mark.parametrize("q", [0.01, 0.1])
@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.0])
def test_the_amplified_epsilon_matches_dp_accounting_for_the_continuous_laplace(
    q: float, epsilon: float
) -> None:
    pld = pld_lib.from_laplace_mechanism(
        1 / epsilon, sensitivity=1, sampling_prob=q, value_discretization_interval=1e-5
    )
    theirs = pld.get_epsilon_for_delta(1e-12)
    ours = float(amplified_epsilon(Fraction(epsilon), Fraction(q)))
    assert ours == pytest.approx(theirs, abs=2e-5)
    assert ours >= math.log1p(q * math.expm1(epsilon))


def test_totals_scaled_by_one_over_q_are_post_processing_of_the_same_release(
    tiny_policy: TinyPolicy,
) -> None:
    s = _session(tiny_policy)
    sql = "SELECT COUNT(*) AS n, SUM(spend) AS s, AVG(age) AS a FROM visits TABLESAMPLE " \
        "BERNOULLI (10 PERCENT)"  # fmt: skip
    plain = s.execute(sql)
    scaled = s.execute(sql, sample_scale=True)
    assert scaled.charge is None and scaled.cached_from is not None  # free: the same release
    q = float(implemented(Fraction(1, 10)))
    (n, total, mean), (n2, total2, mean2) = plain.rows[0], scaled.rows[0]
    assert n2 == pytest.approx(n / q) and total2 == pytest.approx(total / q) and mean2 == mean
    (wn, ws, wa), (wn2, ws2, wa2) = plain.accuracy[0], scaled.accuracy[0]
    assert wn is not None and ws is not None and wn2 is not None and ws2 is not None
    assert wn2 == pytest.approx(wn / q) and ws2 == pytest.approx(ws / q) and wa2 == wa
    assert scaled.types[0] == "DOUBLE"
    covered = frames.covers(scaled)
    assert "COUNT and SUM scaled by 1/q" in covered and "sampling error not covered" in covered
    assert "not scaled" in frames.covers(plain)


@pytest.mark.statistical
def test_an_audit_on_neighbouring_databases_stays_within_the_amplified_epsilon(
    tiny_policy: TinyPolicy,
) -> None:
    """D holds one unit, D' one more; COUNT(*) at C = 1, epsilon 2 (discrete Laplace scale
    1/2) on a sample at q = 1/2. The engine draws 3,000 real samples on each (a fresh secret
    each run); with the sampled totals' empirical distribution and the exact noise pmf, the
    largest privacy loss over the outputs, both directions, is within the amplified epsilon
    ln(1 + q(e^2 - 1)) = 1.43 (up to the estimate's sampling error), well below the unsampled
    2, and the added unit is in the sample about half the time."""
    runs, q, scale = 3000, Fraction(1, 2), 0.5
    sql = "SELECT COUNT(*) FROM visits TABLESAMPLE BERNOULLI (50 PERCENT)"
    totals: list[np.ndarray] = []
    for rows in ([(1, "north", 30, 1.0)], [(1, "north", 30, 1.0), (2, "north", 40, 2.0)]):
        s = Session(tiny_policy(rows, max_groups=1, max_rows=1, budget={"epsilon": "100"}))
        plan = s.plan(sql, epsilon=2)
        assert plan.measurements[0].scale == Fraction(1, 2)
        got = [int(s.engine.run(plan.engine_sql)[1][0][0] or 0) for _ in range(runs)]
        totals.append(np.array(got))
    d, d2 = totals
    assert set(np.unique(d)) <= {0, 1} and set(np.unique(d2)) <= {0, 1, 2}
    assert stats.binomtest(int((d == 1).sum()), runs, 0.5).pvalue > 1e-6
    z = np.arange(-30, 33)

    def output(sampled: np.ndarray) -> np.ndarray:
        freq = np.bincount(sampled, minlength=3)[:3] / len(sampled)
        return sum(freq[t] * _discrete_laplace(scale, z - t) for t in range(3))

    loss = np.log(output(d2)) - np.log(output(d))
    worst = float(np.abs(loss).max())
    bound = float(amplified_epsilon(Fraction(2), implemented(q)))
    assert bound == pytest.approx(math.log1p(0.5 * math.expm1(2.0)), rel=1e-5)
    assert worst <= bound + 0.16  # 3,000 runs: the estimate has sd 0.026; 6 sd
    assert worst < 1.8  # far from the unsampled 2: the sample amplifies


def test_a_join_samples_the_units_of_every_private_table_at_once(tmp_path: Any) -> None:
    """A self-join on the unit with a public table beside it: sampled when every private
    table's occurrence carries the clause (or by the setting), one sample of the units for all
    of them; a clause on one occurrence alone is refused before any charge."""
    data = write_dataset(tmp_path / "data")
    policy, _ = write_server_policy(tmp_path / "server", data)
    s = Session(policy)
    clause = " TABLESAMPLE BERNOULLI (10 PERCENT)"
    both = (
        f"SELECT COUNT(*) FROM visits AS v{clause} JOIN visits AS w{clause} "
        "ON v.user_id = w.user_id JOIN regions AS r ON v.region = r.name"
    )
    bare = both.replace(clause, "")
    plain, plan = s.plan(bare), s.plan(both)
    assert plan.sample is not None and "$sample" in plan.engine_sql
    assert plan.epsilon == amplified_epsilon(plain.epsilon, implemented(Fraction(1, 10)))
    assert s.plan(bare, sample_rate="0.1").epsilon == plan.epsilon
    ((exact,),) = s.engine.run(plain.engine_sql)[1]
    ((sampled,),) = s.engine.run(plan.engine_sql)[1]
    assert 0 <= int(sampled) < int(exact)
    one = both.replace(f"AS w{clause}", "AS w", 1)
    with pytest.raises(UnsupportedQueryError, match="every private table"):
        s.execute(one)
    sub = "SELECT COUNT(*) FROM (SELECT user_id FROM visits WHERE age > 30) AS t"
    assert s.plan(sub, sample_rate="0.1").sample is not None  # one unit a row: sampled alike
    assert s.budget().epsilon_spent == 0


# --- the subsampled Gaussian's RDP curve --------------------------------------------------


@pytest.mark.parametrize("q", [0.001, 0.01, 0.1, 0.5])
@pytest.mark.parametrize("sigma", [0.7, 1.0, 2.0, 5.0])
def test_the_subsampled_rdp_bound_is_above_the_exact_sampled_gaussian(
    q: float, sigma: float
) -> None:
    """Zhu and Wang's general bound, from the curve alpha·rho, against dp_accounting's exact
    RDP of the Poisson-sampled continuous Gaussian (Mironov, Talwar, Zhang 2019), whose curve
    alpha/(2 sigma²) has the same form: never below it at any order (a bound), and close."""
    # Integer orders: there dp_accounting's figure is exact (its fractional orders are a
    # series bound of its own, looser than ours at the next integer).
    orders = [2.0, 3.0, 4.0, 8.0, 10.0, 16.0, 32.0, 64.0, 256.0]
    rho = Fraction(1) / (2 * Fraction(sigma) ** 2)
    accountant = rdp_lib.RdpAccountant(orders)
    accountant.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)))
    exact = list(accountant._rdp)
    ours = [subsampled_rdp(Fraction(q), rho, a) for a in orders]
    for alpha, mine, theirs in zip(orders, ours, exact, strict=True):
        assert mine >= theirs * (1 - 1e-9), (alpha, mine, theirs)
        assert mine <= alpha * float(rho) * (1 + 1e-9)  # never above the unsampled curve
    # A fractional order takes the next integer's bound (RDP does not fall as alpha grows).
    assert subsampled_rdp(Fraction(q), rho, 1.5) == subsampled_rdp(Fraction(q), rho, 2.0)


def test_ten_thousand_sampled_gaussians_compose_to_a_small_epsilon_under_rdp() -> None:
    """The issue's scale: 10^4 queries of sigma 1 (Δ = 1) at q = 0.01, delta 1e-6: about 8
    by this bound (dp_accounting's exact figure for the continuous Gaussian: 7.49), against
    thousands unsampled."""
    orders = [2.0, 3.0, 4.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 24.0, 32.0, 48.0, 64.0]
    n, delta = 10**4, 1e-6
    rho = Fraction(1, 2)
    ours = min(
        n * subsampled_rdp(Fraction(1, 100), rho, a) + math.log1p(-1 / a)
        - (math.log(delta) + math.log(a)) / (a - 1)
        for a in orders
    )  # fmt: skip
    accountant = rdp_lib.RdpAccountant(orders)
    event = dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.0))
    accountant.compose(event, n)
    assert accountant.get_epsilon(delta) <= ours < 8.5
    unsampled = min(n * a * 0.5 + math.log1p(-1 / a) - (math.log(delta) + math.log(a)) / (a - 1)
                    for a in orders)  # fmt: skip
    assert unsampled > 1000


def test_a_sampled_gaussian_query_is_charged_through_the_subsampled_curve(
    tiny_policy: TinyPolicy,
) -> None:
    s = Session(
        tiny_policy(ROWS, max_groups=1, max_rows=4, budget={"epsilon": "10", "accountant": "rdp"})
    )
    sql = "SELECT SUM(spend), COUNT(*) FROM visits TABLESAMPLE BERNOULLI (1 PERCENT)"
    plan = s.plan(sql, mechanism="gaussian")
    (event,) = plan.event.events
    assert isinstance(event, SubsampledGaussian)
    inner = s.plan(sql.replace(" TABLESAMPLE BERNOULLI (1 PERCENT)", ""), mechanism="gaussian")
    assert event.rho == sum(e.rho for e in inner.event.events)  # type: ignore[union-attr]
    assert event.rate == implemented(Fraction(1, 100))
    assert (plan.epsilon, plan.delta) == (
        amplified_epsilon(inner.epsilon, event.rate),
        event.rate * inner.delta,
    )
    # The ledger keeps it exactly.
    assert composite_from_json(composite_to_json(plan.event)) == plan.event
    n = 0
    while n < 1100:
        try:
            s.execute(sql, mechanism="gaussian", fresh=True)
        except BudgetExceededError:
            break
        n += 1
    # The pair would stop at the delta reserve (1e-7 / (q 1e-8) = 1,000 queries); the curve
    # needs no delta of its own, so the run goes past it.
    assert n == 1100


def test_every_run_binds_a_fresh_secret_and_the_text_holds_none(
    tiny_policy: TinyPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two executions of one sampled query (the plan kept, the release afresh): the engine
    draws a secret for each run from the CSPRNG and binds it; the SQL text never changes."""
    drawn: list[str] = []
    real = duckdb_engine.secrets.token_hex

    def record(n: int) -> str:
        drawn.append(real(n))
        return drawn[-1]

    monkeypatch.setattr(duckdb_engine.secrets, "token_hex", record)
    s = _session(tiny_policy)
    plan = s.plan(COUNT)
    s.execute(COUNT, fresh=True)
    runs = len(drawn)
    s.execute(COUNT, fresh=True)
    assert runs >= 1 and len(drawn) > runs  # the second run draws its own (its plan is kept)
    assert len(set(drawn)) == len(drawn) and all(len(x) == 32 for x in drawn)
    assert s.plan(COUNT).engine_sql == plan.engine_sql
    assert not any(x in plan.engine_sql for x in drawn)
