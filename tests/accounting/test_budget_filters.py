"""The policy's filter decides admission through the Session; shares cap analysts; the report
reads the history under every accountant, labelled."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from conftest import TinyPolicy
from dp_accounting import dp_event, rdp

from dpsql.errors import BudgetExceededError, PolicyError
from dpsql.mechanisms.events import flatten
from dpsql.mechanisms.gaussian_events import DiscreteGaussian
from dpsql.mechanisms.laplace_events import DiscreteLaplace
from dpsql.policy import load_policy
from dpsql.session.session import Session

ROWS = [(u, "east", 30, 10.0) for u in range(1, 200)]
QUERY = "SELECT COUNT(*) FROM visits"


def _session(tiny_policy: TinyPolicy, analyst: str | None = None, **budget: Any) -> Session:
    return Session(tiny_policy(ROWS, budget={"epsilon": "1", **budget}), analyst=analyst)


def _fill(session: Session, limit: int = 5000, **options: Any) -> int:
    """Repeat QUERY, each time afresh (a repeat would otherwise be served from the cache)."""
    for n in range(limit):
        try:
            session.execute(QUERY, fresh=True, **options)
        except BudgetExceededError:
            return n
    return limit


def test_zcdp_admits_far_more_small_gaussian_queries_than_basic(tiny_policy: TinyPolicy) -> None:
    small = {"mechanism": "gaussian", "epsilon": "0.05", "delta": "1e-10"}
    basic = _fill(_session(tiny_policy), **small)
    zcdp = _session(tiny_policy, accountant="zcdp")
    admitted = _fill(zcdp, **small)
    assert basic == 20
    assert admitted > 5 * basic
    # Independent check of what was admitted: dp_accounting's RDP accountant, fed the discrete
    # Gaussians as their rho (a zCDP mechanism has RDP alpha*rho at every order), never
    # certifies more than the cap at the conversion's delta.
    events = flatten([c.event for c in zcdp.filter.charges])
    rho = sum((e.rho for e in events if isinstance(e, DiscreteGaussian)), Fraction(0))
    orders = [1 + x / 10 for x in range(1, 1000)]
    accountant = rdp.RdpAccountant(orders)
    # A Gaussian of noise multiplier z has RDP alpha/(2 z^2): z = 1/sqrt(2 rho).
    accountant.compose(dp_event.GaussianDpEvent(float(1 / (2 * rho)) ** 0.5))
    # The conversion's delta: all of delta 1e-6 but the default selection reserve, a tenth.
    assert accountant.get_epsilon(9e-7) <= 1.0


def test_a_refused_query_is_not_charged_under_any_filter(tiny_policy: TinyPolicy) -> None:
    for accountant in ("zcdp", "rdp"):
        session = _session(tiny_policy, accountant=accountant)
        _fill(session, epsilon="0.3")
        before = session.filter.charges
        with pytest.raises(BudgetExceededError):
            session.execute(QUERY, epsilon="0.3", fresh=True)
        assert session.filter.charges == before


def test_advanced_filter_with_its_fixed_delta_prime(tiny_policy: TinyPolicy) -> None:
    session = _session(tiny_policy, accountant="advanced", advanced_delta_prime="5e-7")
    admitted = _fill(session, epsilon="0.01")
    # WRRW: sqrt(2 ln(1/δ') k ε²) + k ε²/2 <= 1 gives k = 333 at ε = 0.01, δ' = 5e-7.
    assert admitted == 333
    assert all(
        isinstance(e, DiscreteLaplace) for c in session.filter.charges for e in c.event.events
    )


def test_the_report_reads_the_history_under_every_accountant(tiny_policy: TinyPolicy) -> None:
    session = _session(tiny_policy, accountant="rdp")
    for _ in range(5):
        session.execute(QUERY, epsilon="0.1", fresh=True)
    report = session.budget()
    notes = {f.accountant: f.note for f in report.figures}
    assert notes["rdp"] == "decides"
    assert notes["basic"] == "valid adaptively"
    assert notes["optimal"].startswith("as if fixed in advance")
    assert notes["advanced"].startswith("as if fixed in advance")
    readings = {f.accountant: f.epsilon for f in report.figures}
    assert readings["basic"] == pytest.approx(0.5)
    # Optimal composition is the tightest pure-DP figure: never above basic or RDP's reading.
    assert readings["optimal"] <= readings["basic"] and readings["optimal"] <= readings["rdp"]
    assert report.accountant == "rdp" and float(report.epsilon_spent) == readings["rdp"]


def test_analyst_shares_cap_each_analyst_and_the_total_caps_all(tiny_policy: TinyPolicy) -> None:
    shares = {"analysts": {"ana": {"epsilon": "0.6"}, "bo": {"epsilon": "0.6"}}}
    policy = tiny_policy(ROWS, budget={"epsilon": "1", **shares})
    ana, bo, nobody = (Session(policy, analyst=a) for a in ("ana", "bo", None))
    # Sessions are separate budgets in this version (in memory), so share one by hand.
    bo.filter = nobody.filter = ana.filter
    ana.execute(QUERY, epsilon="0.5")
    # Fresh: at another epsilon the release above would answer the same rows, free.
    with pytest.raises(BudgetExceededError):
        ana.execute(QUERY, epsilon="0.2", fresh=True)  # 0.7 > ana's 0.6
    bo.execute(QUERY, epsilon="0.4", fresh=True)
    with pytest.raises(BudgetExceededError):
        bo.execute(QUERY, epsilon="0.2", fresh=True)  # bo fits (0.6), the data set not (1.1)
    with pytest.raises(BudgetExceededError):
        nobody.execute(QUERY, epsilon="0.01", fresh=True)  # no share, no spending
    assert [c.analyst for c in ana.filter.charges] == ["ana", "bo"]


def test_policy_rejects_filters_without_what_they_need(tiny_policy: TinyPolicy) -> None:
    base: dict[str, Any] = {
        "dataset": {"id": "x"},
        "data": {"tables": {"t": "t.parquet"}},
        "tables": {"t": {"privacy_unit": "u"}},
    }
    for budget in (
        {"epsilon": "1", "accountant": "advanced", "delta": "1e-6"},  # no delta'
        {"epsilon": "1", "accountant": "zcdp"},  # delta 0
        {"epsilon": "1", "rdp_order": 8},  # order without rdp
        {"epsilon": "1", "mechanism": "gaussian"},  # gaussian with delta 0
        {"epsilon": "1", "delta": "1e-6", "analysts": {"a": {"epsilon": "2"}}},  # share > total
    ):
        with pytest.raises(PolicyError):
            load_policy({**base, "budget": budget})


def test_a_rho_budget_caps_the_summed_rho(tiny_policy: TinyPolicy) -> None:
    policy = tiny_policy(
        ROWS, budget={"epsilon": None, "rho": "0.01", "accountant": "zcdp", "delta": "1e-6"}
    )
    session = Session(policy)
    admitted = _fill(session, mechanism="gaussian", rho="0.001", delta="1e-8")
    # Ten queries of rho 1/1000 fill a rho budget of 1/100 exactly (exact rationals).
    assert admitted == 10
    events = flatten([c.event for c in session.filter.charges])
    assert sum(e.rho for e in events if isinstance(e, DiscreteGaussian)) == Fraction(1, 100)
    report = session.budget()
    assert report.accountant == "zcdp" and report.epsilon_total > 0
