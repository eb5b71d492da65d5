"""The discrete Gaussian through the whole query path: calibration, events, release."""

from __future__ import annotations

from fractions import Fraction

import pytest
from conftest import TinyPolicy

from dpsql.errors import ParameterError
from dpsql.mechanisms.conversions import discrete_gaussian_delta, zcdp_to_dp
from dpsql.mechanisms.gaussian_events import DiscreteGaussian
from dpsql.mechanisms.laplace_events import DiscreteLaplace
from dpsql.mechanisms.partition import partition_threshold
from dpsql.mechanisms.selection_events import LaplacePartitionSelection
from dpsql.session.session import Session

ROWS = [(u, ["east", "west", "north"][u % 3], 20 + u % 60, float(u % 150)) for u in range(1, 600)]
GAUSS = {"mechanism": "gaussian", "epsilon": "0.5", "delta": "1e-7"}


@pytest.fixture
def session(tiny_policy: TinyPolicy) -> Session:
    return Session(tiny_policy(ROWS, max_groups=2, max_rows=4))


def test_one_measurement_is_calibrated_on_its_own_exact_curve(session: Session) -> None:
    plan = session.plan("SELECT COUNT(*) FROM visits", **GAUSS)
    (m,) = plan.measurements
    assert m.sigma2 is not None and m.scale is None and m.groups == 1 and m.per_group == 4
    # (0.5, 1e-7)-DP by the discrete Gaussian's own curve (CKS 2020, Thm 7), and nearly tight:
    # a variance 1% smaller would not be.
    assert discrete_gaussian_delta(float(m.sigma2), 4, 0.5) <= 1e-7
    assert discrete_gaussian_delta(float(m.sigma2) * 0.99, 4, 0.5) > 1e-7
    assert plan.event.certified == (Fraction(1, 2), Fraction(1, 10**7))
    (event,) = plan.event.events
    assert isinstance(event, DiscreteGaussian) and event.dimensions == 1


def test_several_measurements_share_one_rho(session: Session) -> None:
    plan = session.plan(
        "SELECT region, COUNT(*), AVG(spend) FROM visits GROUP BY region", **GAUSS, split="even"
    )
    events = plan.event.events
    assert all(isinstance(e, DiscreteGaussian) for e in events) and len(events) == 3
    rhos = [e.rho for e in events if isinstance(e, DiscreteGaussian)]
    # The even split (the optimal one: tests/plan/test_split.py), each variance then rounded up
    # to an integer (a little less rho, never more).
    assert max(rhos) / min(rhos) < 1 + Fraction(1, 1000)
    assert all(m.sigma2 is not None and m.sigma2.denominator == 1 for m in plan.measurements)
    total = sum(rhos, Fraction(0))
    # The summed rho converts to at most the query's epsilon (CKS Cor. 13), and not much less.
    assert zcdp_to_dp(float(total), 1e-7) <= 0.5
    assert zcdp_to_dp(float(total) * 1.002, 1e-7) > 0.5
    # L0 = 2 coordinates per unit (region has 3 public keys, L0 = 2 in the policy).
    assert {e.dimensions for e in events if isinstance(e, DiscreteGaussian)} == {2}
    for e, m in zip(events, plan.measurements, strict=True):
        assert isinstance(e, DiscreteGaussian)
        assert e.rho == m.groups * m.per_group**2 / (2 * m.sigma2)  # type: ignore[operator]


def test_a_query_rho_is_charged_the_epsilon_it_certifies(session: Session) -> None:
    plan = session.plan("SELECT SUM(spend) FROM visits", mechanism="gaussian", delta=1e-7, rho=0.01)
    (event,) = plan.event.events
    assert isinstance(event, DiscreteGaussian) and event.rho == Fraction(1, 100)
    assert plan.event.certified is not None
    certified = plan.event.certified[0]
    assert float(certified) >= zcdp_to_dp(0.01, 1e-7)
    assert float(certified) <= zcdp_to_dp(0.01, 1e-7) * (1 + 1e-9)


def test_private_keys_keep_laplace_selection_with_half_the_delta(session: Session) -> None:
    plan = session.plan("SELECT age, COUNT(*) FROM visits GROUP BY age", **GAUSS)
    kinds = [type(e) for e in plan.event.events]
    assert kinds == [DiscreteGaussian, LaplacePartitionSelection]
    selection = plan.event.events[1]
    assert isinstance(selection, LaplacePartitionSelection)
    # epsilon/k for selection (k = 2 measurements) and half of delta.
    assert selection.epsilon == Fraction(1, 4) and selection.delta == Fraction(1, 2 * 10**7)
    assert plan.selection is not None
    assert plan.selection.threshold == partition_threshold(
        selection.scale, 2, Fraction(1, 2 * 10**7)
    )
    assert plan.event.certified == (Fraction(1, 2), Fraction(1, 10**7))


def test_gaussian_answers_come_with_their_own_half_widths(session: Session) -> None:
    result = session.execute("SELECT region, COUNT(*) FROM visits GROUP BY region", **GAUSS)
    assert [r[0] for r in result.rows] == ["central", "east", "north", "south", "west"]
    widths = {acc[1] for acc in result.accuracy}
    assert len(widths) == 1 and widths.pop() > 0
    assert session.budget().epsilon_spent == Fraction(1, 2)


def test_the_laplace_stays_the_default_and_gaussian_needs_delta(session: Session) -> None:
    plan = session.plan("SELECT COUNT(*) FROM visits")
    assert isinstance(plan.event.events[0], DiscreteLaplace)
    with pytest.raises(ParameterError):
        session.plan("SELECT COUNT(*) FROM visits", mechanism="gaussian", delta=0)
    with pytest.raises(ParameterError):
        session.plan("SELECT COUNT(*) FROM visits", rho=0.01)  # rho without the Gaussian
    with pytest.raises(ParameterError):
        session.plan("SELECT COUNT(*) FROM visits", mechanism="cauchy")


def test_gaussian_mode_with_only_the_selection_count_falls_back_to_the_laplace(
    session: Session,
) -> None:
    plan = session.plan("SELECT age, COUNT(DISTINCT user_id) FROM visits GROUP BY age", **GAUSS)
    (event,) = plan.event.events
    assert isinstance(event, LaplacePartitionSelection)
    # The whole query is the selection: all of epsilon and all of delta.
    assert (event.epsilon, event.delta) == (Fraction(1, 2), Fraction(1, 10**7))


def test_a_noise_multiplier_sets_each_measurement_to_one_over_two_sigma_squared(
    session: Session,
) -> None:
    plan = session.plan(
        "SELECT region, COUNT(*), SUM(spend) FROM visits GROUP BY region",
        mechanism="gaussian",
        delta="1e-7",
        sigma=4,
    )
    rhos = [e.rho for e in plan.event.events if isinstance(e, DiscreteGaussian)]
    assert rhos == [Fraction(1, 32), Fraction(1, 32)]
    for m in plan.measurements:
        # sigma_j = 4 x L2_j, L2_j^2 = L0 x per-group^2.
        assert m.sigma2 == 16 * m.groups * m.per_group**2
    assert plan.event.certified is not None
    assert float(plan.event.certified[0]) >= zcdp_to_dp(1 / 16, 1e-7)
    with pytest.raises(ParameterError):
        session.plan(
            "SELECT COUNT(*) FROM visits", mechanism="gaussian", delta=1e-7, sigma=4, rho=1
        )
