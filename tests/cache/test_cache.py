"""The release cache: textual variants hit, other parameters miss, hits cost nothing and are
recorded, derived answers only from the same bounded rows, and it survives restarts."""

from __future__ import annotations

import doctest
import math
from dataclasses import replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from conftest import TinyPolicy

from dpsql.accounting.ledger.ledger import Ledger
from dpsql.accounting.ledger.store import budget_caps
from dpsql.plan.estimators import _each
from dpsql.policy import LedgerSpec, Policy
from dpsql.session.session import Session
from dpsql.sql import canonical

ROWS = [(u, ["east", "west", "north"][u % 3], 20 + u % 50, float(u % 90)) for u in range(1, 400)]
BASE = (
    "SELECT region, COUNT(*) AS n, AVG(spend) AS a FROM visits "
    "WHERE age >= 30 AND spend > 1 GROUP BY region"
)
TAIL = " FROM visits WHERE age >= 30 AND spend > 1 GROUP BY region"


def _durable(tiny_policy: TinyPolicy, tmp_path: Path, **changes: Any) -> Policy:
    policy = tiny_policy(ROWS)
    ledger = tmp_path / "ledger.sqlite"
    if not ledger.exists():
        Ledger.create(ledger, policy.dataset.id, budget=budget_caps(policy.budget))
    update: dict[str, Any] = {"ledger": LedgerSpec(path=ledger)}
    if "data_version" in changes:
        update["dataset"] = policy.dataset.model_copy(
            update={"data_version": changes["data_version"]}
        )
    return policy.model_copy(update=update)


@pytest.fixture
def session(tiny_policy: TinyPolicy, tmp_path: Path) -> Session:
    return Session(_durable(tiny_policy, tmp_path))


def _charges(session: Session) -> int:
    return len(session.filter.charges)


@pytest.mark.parametrize(
    "variant",
    [
        "select REGION, count(*) as n, avg(SPEND) as a from VISITS "
        "where age >= 30 and spend > 1 group by region",
        "SELECT  region ,COUNT(*)   AS visits, AVG(spend) AS mean\nFROM visits\n"
        "WHERE age >= 30 AND spend > 1 GROUP BY region",
        "SELECT region, COUNT(*) AS n, AVG(spend) AS a FROM visits "
        "WHERE spend > 1 AND age >= 30 GROUP BY region",
        "SELECT region, COUNT(*) AS n, AVG(spend) AS a" + TAIL + " ORDER BY n DESC LIMIT 2",
        "SELECT region, AVG(spend) * 2" + TAIL + " HAVING COUNT(*) > 5",
    ],
)
def test_textual_and_post_processing_variants_hit(session: Session, variant: str) -> None:
    first = session.execute(BASE)
    again = session.execute(variant)
    assert first.charge is not None and again.charge is None
    assert again.cached_from is not None
    assert _charges(session) == 1
    reserves = [r for r in session.filter.store.records() if r.kind == "reserve"]
    assert len(reserves) == 1 and reserves[0].payload["release"] == again.cached_from


def test_a_hit_returns_the_stored_release_exactly(session: Session) -> None:
    first = session.execute(BASE)
    assert session.execute(BASE).rows == first.rows
    assert session.execute(BASE).accuracy == first.accuracy


def test_a_parameter_bound_or_inlined_hits(session: Session) -> None:
    session.execute(BASE.replace(">= 30", ">= ?"), (30,))
    assert session.execute(BASE).charge is None


@pytest.mark.parametrize(
    "options",
    [
        {"delta": "1e-9", "mechanism": "gaussian"},
        {"max_rows_per_unit_per_group": 3},
        {"max_groups_per_unit": 1},
    ],
)
def test_other_parameters_miss(session: Session, options: dict[str, Any]) -> None:
    session.execute(BASE)
    assert session.execute(BASE, **options).charge is not None
    assert _charges(session) == 2


def test_another_filter_misses(session: Session) -> None:
    session.execute(BASE)
    assert session.execute(BASE.replace(">= 30", ">= 31")).charge is not None


def test_a_new_declared_data_version_misses(tiny_policy: TinyPolicy, tmp_path: Path) -> None:
    policy = _durable(tiny_policy, tmp_path)
    Session(policy).execute(BASE)
    assert Session(policy).execute(BASE).charge is None  # control: the same version hits
    dataset = policy.dataset.model_copy(update={"data_version": "2"})
    refreshed = Session(policy.model_copy(update={"dataset": dataset}))
    assert refreshed.execute(BASE).charge is not None
    # The budget belongs to the data set, not its version: both charges are on it.
    assert len(refreshed.filter.charges) == 2


def test_a_fresh_answer_is_charged_and_then_served(session: Session) -> None:
    session.execute(BASE)
    fresh = session.execute(BASE, fresh=True)
    assert fresh.charge is not None and _charges(session) == 2
    # The newest release answers from now on.
    served = session.execute(BASE)
    assert served.charge is None and served.rows == fresh.rows


def test_the_cache_survives_restarts(tiny_policy: TinyPolicy, tmp_path: Path) -> None:
    policy = _durable(tiny_policy, tmp_path)
    first = Session(policy).execute(BASE)
    later = Session(policy).execute(BASE)  # a new session over the same ledger
    assert later.charge is None and later.rows == first.rows


def test_avg_is_derived_from_a_released_sum_and_count(session: Session) -> None:
    # Derivation needs the AVG's measurements at the noise they were released with: under the
    # optimal split an AVG weighs its count apart from a COUNT's, so its plan is charged afresh.
    session.execute("SET dpsql.split = 'even'")
    session.execute("SELECT region, SUM(spend), COUNT(spend) FROM visits GROUP BY region")
    derived = session.execute("SELECT region, AVG(spend) FROM visits GROUP BY region")
    assert derived.charge is None and derived.cached_from is not None
    assert "derived from the measurements of release" in derived.note
    # Its half-width: the box over the count and the centred sum 2·SUM - M·COUNT, whose noise
    # is that combination of the two discrete Laplace noises (its coverage: below).
    assert all(acc[1] is not None and acc[1] > 0 for acc in derived.accuracy)
    released = {r[0]: (r[1], r[2]) for r in session.execute(
        "SELECT region, SUM(spend), COUNT(spend) FROM visits GROUP BY region").rows}  # fmt: skip
    for region, avg in derived.rows:
        total, count = released[region]
        if count >= 1:  # below, AVG = centre + centred sum / max(count, 1) is not total / 1
            assert avg == pytest.approx(min(max(total / count, 0), 200))


def test_an_estimate_over_combined_noises_bounds_each_by_the_union_bound(
    session: Session,
) -> None:
    """A derived centred sum shares the COUNT's noise: the AVG's box then bounds each of its two
    measurements at (1 + c)/2 (Bonferroni), not at sqrt(c), which assumes independence."""
    plan = session.plan("SELECT region, AVG(spend) FROM visits GROUP BY region")
    centred, count = plan.measurements
    assert centred.scale is not None and count.scale is not None
    combined = replace(centred, combined=(((Fraction(2), centred.scale),),))
    independent = math.sqrt(0.95)
    assert _each(0.95, (centred, count), (0, 1), independent) == independent
    union = _each(0.95, (combined, count), (0, 1), independent)
    assert union == math.nextafter(0.975, 1.0) and union > independent


@pytest.mark.statistical
def test_a_derived_avg_half_width_covers_its_exact_value(tiny_policy: TinyPolicy) -> None:
    """Over fresh releases of SUM and COUNT (the same bounded rows), the derived AVG's interval
    covers the AVG of their exact bounded totals in at least the 95% asked for (the box of two
    bounds, each at sqrt(0.95), is conservative)."""
    session = Session(tiny_policy(ROWS, budget={"epsilon": "1000"}))
    session.execute("SET dpsql.split = 'even'")
    source = "SELECT region, SUM(spend), COUNT(spend) FROM visits GROUP BY region"
    exact_plan = session.plan(source)
    _, rows = session.engine.run(exact_plan.engine_sql)
    grid = session.plan("SELECT region, AVG(spend) FROM visits GROUP BY region").estimates[0].grid
    assert grid is not None
    step = float(exact_plan.measurements[0].unit)
    exact = {}
    for region, s, n in rows:  # the SUM in grid units, the COUNT
        exact[region] = min(max(float(s) * step / max(int(n), 1), 0.0), 200.0) if n else None
    covered = checked = 0
    for _ in range(120):
        session.execute(source, fresh=True)
        derived = session.execute("SELECT region, AVG(spend) FROM visits GROUP BY region")
        assert derived.charge is None
        for (region, value), (_, width) in zip(derived.rows, derived.accuracy, strict=True):
            if exact[region] is None:
                continue
            checked += 1
            covered += abs(value - exact[region]) <= width + 1e-9
    assert checked >= 300 and covered / checked >= 0.95


def test_derived_answers_are_refused_when_rows_or_bounds_differ(session: Session) -> None:
    session.execute("SELECT region, SUM(spend), COUNT(spend) FROM visits GROUP BY region")
    other_rows = session.execute(
        "SELECT region, AVG(spend) FROM visits WHERE age > 40 GROUP BY region"
    )
    other_bounds = session.execute(
        "SELECT region, AVG(spend) FROM visits GROUP BY region", max_rows_per_unit_per_group=2
    )
    assert other_rows.charge is not None and other_bounds.charge is not None


def test_canonical_doctests() -> None:
    assert doctest.testmod(canonical).failed == 0


def test_queries_over_different_relations_never_share_a_release(session: Session) -> None:
    """The relation (a join or subquery) is part of what was measured: the same aggregate over
    another FROM is a different measurement, charged and answered on its own."""
    base = session.execute("SELECT COUNT(*) FROM visits")
    joined = session.execute("SELECT COUNT(*) FROM visits a JOIN visits b USING (user_id)")
    derived = session.execute("SELECT COUNT(*) FROM (SELECT user_id FROM visits WHERE age > 40)")
    capped = session.execute("SELECT COUNT(*) FROM visits", max_rows_per_unit=1)
    assert all(r.charge is not None for r in (base, joined, derived, capped))
    assert (
        session.execute("SELECT COUNT(*) FROM visits a JOIN visits b USING (user_id)").charge
        is None
    )


def test_quantiles_of_different_orders_never_share_a_release(session: Session) -> None:
    """MIN, MAX and MEDIAN of one column have the same score sensitivity: the order p is part
    of the measurement's identity, so each is charged and answered on its own."""
    low = session.execute("SELECT MIN(spend) FROM visits")
    high = session.execute("SELECT MAX(spend) FROM visits")
    tail = session.execute("SELECT QUANTILE_CONT(spend, 0.99) FROM visits")
    assert all(r.charge is not None for r in (low, high, tail))
    assert session.execute("SELECT MAX(spend) FROM visits").rows == high.rows
