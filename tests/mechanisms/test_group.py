"""A query's loss for one person who is k units (``dpsql.mechanisms.group``): each mechanism's
own guarantee at k times its sensitivity, checked against the group-privacy theorems computed
independently here, and against a brute-force sum for partition selection."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpsql.errors import QueryError
from dpsql.mechanisms.event_kinds import composite_from_json, composite_to_json
from dpsql.mechanisms.events import Composite, basic_pair
from dpsql.mechanisms.gaussian_events import ZCDP, DiscreteGaussian
from dpsql.mechanisms.group import for_group, group_event, selection_delta
from dpsql.mechanisms.laplace_events import DiscreteLaplace
from dpsql.mechanisms.partition import partition_threshold
from dpsql.mechanisms.selection_events import Exponential, LaplacePartitionSelection
from dpsql.mechanisms.stated_events import ApproxDP, PureDP, SubsampledGaussian

K = st.integers(1, 30)
SCALE = st.fractions(Fraction(1, 4), Fraction(200)).filter(lambda f: f > 0)


@given(k=K, scale=SCALE, shift=st.integers(1, 50))
def test_laplace_pays_k_times_its_epsilon(k: int, scale: Fraction, shift: int) -> None:
    event = DiscreteLaplace(scale, Fraction(shift), dimensions=1)
    person = group_event(event, k)
    assert person.epsilon == k * event.epsilon  # Dwork, Roth 2014, Theorem 2.2 for pure DP
    assert person.delta == 0


@given(k=K, sigma2=st.fractions(Fraction(1), Fraction(10**4)), shift=st.integers(1, 20))
def test_the_discrete_gaussian_pays_k_squared_rho(k: int, sigma2: Fraction, shift: int) -> None:
    event = DiscreteGaussian(sigma2, Fraction(shift), Fraction(1), Fraction(1, 10**6))
    person = group_event(event, k)
    rho, person_rho = event.zcdp(), person.zcdp()
    assert rho is not None and person_rho is not None
    assert person_rho[0] == k * k * rho[0]  # Bun, Steinke 2016, Proposition 1.9
    # Its charged pair reads its own curve at k times the target epsilon.
    eps, delta = basic_pair(person)
    assert eps == k * event.epsilon and delta >= event.delta


@given(k=K, eps=st.fractions(Fraction(1, 100), Fraction(2)), delta=st.integers(1, 10**4))
def test_a_stated_pair_takes_the_group_privacy_theorem(k: int, eps: Fraction, delta: int) -> None:
    event = ApproxDP(eps, Fraction(delta, 10**9))
    person = group_event(event, k)
    assert person.epsilon == k * eps
    # (k eps, k e^((k-1) eps) delta) (Vadhan 2017, Lemma 2.2), never rounded down.
    exact = k * math.exp((k - 1) * float(eps)) * delta / 10**9
    assert float(person.delta) >= min(1.0, exact) * (1 - 1e-12)
    assert float(person.delta) <= min(1.0, exact * (1 + 1e-6))
    assert group_event(PureDP(eps), k).epsilon == k * eps
    assert group_event(Exponential(eps), k).epsilon == k * eps


@given(k=st.integers(1, 8), scale=st.fractions(Fraction(1, 2), Fraction(20)),
       groups=st.integers(1, 6))  # fmt: skip
def test_partition_selection_for_k_units_matches_a_brute_force_tail(
    k: int, scale: Fraction, groups: int
) -> None:
    threshold = partition_threshold(scale, groups, Fraction(1, 10**6))
    event = LaplacePartitionSelection(scale, Fraction(groups), threshold, Fraction(1, 10**6))
    person = group_event(event, k)
    assert isinstance(person, LaplacePartitionSelection)
    assert person.sensitivity == k * groups and person.threshold == threshold
    # Brute force: groups only the person creates (at most k·L0), each of count <= k, released
    # iff count + Z >= threshold; P(Z >= j) = q^j / (1 + q) summed from the pmf.
    t = float(scale)
    q = math.exp(-1 / t)
    pmf = [(1 - q) / (1 + q) * q ** abs(z) for z in range(-4000, 4000)]
    tail = sum(p for z, p in zip(range(-4000, 4000), pmf, strict=True) if k + z >= threshold)
    expected = min(1.0, k * groups * tail)
    assert float(person.delta) >= expected * (1 - 1e-9)
    if k == 1:
        assert person == event  # its stated delta, which the threshold was chosen to meet
    else:
        assert float(person.delta) <= expected * (1 + 1e-6) + 1e-300


def test_selection_delta_is_one_when_the_person_alone_reaches_the_threshold() -> None:
    assert selection_delta(Fraction(2), 3, 5, 5) == 1
    assert selection_delta(Fraction(2), 3, 5, 9) == 1


def test_one_unit_is_the_query_itself_and_a_group_keeps_its_cell() -> None:
    query = Composite((DiscreteLaplace(Fraction(10), Fraction(3)),), None, ("f", "k"))
    assert for_group(query, 1) is query
    person = for_group(query, 4)
    assert person.cell == ("f", "k") and person.epsilon == Fraction(6, 5)
    assert composite_from_json(composite_to_json(person)) == person
    with pytest.raises(ValueError):
        for_group(query, 0)


def test_what_has_no_group_loss_here_is_refused() -> None:
    sampled = SubsampledGaussian(Fraction(1), Fraction(1, 10**6), rate=Fraction(1, 2),
                                 rho=Fraction(1, 10))  # fmt: skip
    with pytest.raises(QueryError, match="SubsampledGaussian"):
        group_event(sampled, 2)
    with pytest.raises(QueryError, match="ZCDP"):
        group_event(ZCDP(Fraction(1, 10), Fraction(1, 10**9)), 2)
    assert group_event(ZCDP(Fraction(1, 10)), 3).zcdp() == (Fraction(9, 10), 0)
