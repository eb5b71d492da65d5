"""A ratio's ± where its noise box misses the bounds: the whole range, never a ± of 0.

AVG, VARIANCE, STDDEV, COVAR and CORR release the range of their estimator over a box that
holds the noise with probability at least the confidence, clamped to the range the truth always
lies in (``dpsql.plan.estimators.within``). Where the noisy values are so far out that the
box's range misses that range entirely, the box did not hold the noise, and the truth may be
anywhere in it: clamping both ends to one bound used to release ± 0 beside a value at that
bound (an AVG over a noisy count of 0 and a large noisy sum). Each case here puts the noisy
values far beyond anything data can give and checks that value ± half-width spans the range.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

import numpy as np
import pytest

from dpsql.plan.aggregates.registry import rule_of
from dpsql.plan.plans import Plan
from dpsql.policy import Policy
from dpsql.session.session import Session

FAR = 10.0**30  # beyond any half-width, in units as fine as a 1/8192 grid step squared
COUNTS = np.arange(-5, 51, dtype=np.float64)  # noisy counts, from hopeless to plausible
EPSILON = Fraction(20)  # half-widths of a few units: the box is small beside FAR


def _plan(tiny_policy: Callable[..., Policy], sql: str) -> Plan:
    rows = [(u, "east", 18 + u % 70, float(u % 200)) for u in range(40)]
    session = Session(tiny_policy(rows))
    session.set_option("moments", "separate")  # Q, S and N apart: each set on its own here
    try:
        return session.plan(sql, epsilon=EPSILON)
    finally:
        session.close()


# Each case's noisy totals by measurement kind (in their own units); counts run over COUNTS,
# unnamed kinds are 0. Every one is far beyond what data in the bounds can give.
CASES: dict[str, dict[str, float]] = {
    # A centred sum of 10^30 over a count of at most 50 (plus its half-width): past a bound.
    "AVG(spend) above": {"centred": FAR},
    "AVG(spend) below": {"centred": -FAR},
    # A sum of squares far below 0: the variance's whole box is negative.
    "VAR_POP(spend) below": {"centred_squares": -FAR},
    # A sum of squares far above anything 50 values in the bounds can give.
    "STDDEV_SAMP(age) above": {"centred_squares": FAR},
    "COVAR_POP(age, spend) above": {"centred_products": FAR},
    "COVAR_SAMP(age, spend) below": {"centred_products": -FAR},
    # cov/sqrt(var_x·var_y) ~ P/Q = 100 over the whole box: far past 1.
    "CORR(age, spend) above": {"centred_products": FAR, "centred_squares": FAR / 100},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_box_past_the_bounds_releases_the_whole_range(
    case: str, tiny_policy: Callable[..., Policy]
) -> None:
    aggregate = case.rsplit(" ", 1)[0]
    plan = _plan(tiny_policy, f"SELECT {aggregate} FROM visits")
    (estimate,) = plan.estimates
    rule = rule_of(estimate.kind)
    bounds = rule.bounds(estimate)
    assert bounds is not None
    lo, hi = bounds
    noisy = [
        COUNTS
        if m.spec.kind == "count"
        else np.full_like(COUNTS, CASES[case].get(m.spec.kind, 0.0))
        for m in plan.measurements
    ]
    assert {m.spec.kind for m in plan.measurements} >= set(CASES[case])
    value, width = rule.estimator(estimate, plan.measurements, noisy, 0.95)
    slack = 1e-9 * (hi - lo)
    assert np.all((value >= lo - slack) & (value <= hi + slack))
    assert np.all(value - width <= lo + slack), (case, value, width)
    assert np.all(value + width >= hi - slack), (case, value, width)
