"""An aggregate kind declared and registered in this one file, run end to end through a real
``Session``: what the registry promises (``dpsql.sql.aggregates``, ``dpsql.plan.aggregates``).

The toy is ``COUNT_IF(c)`` released clamped at 0 (kind ``count_if``): the rows where c holds,
measured as the existing ``count`` measurement of the value ``CASE WHEN c THEN 1 END``, and
released as max(noisy count, 0), an estimator of its own. Clamping keeps the interval's
coverage: for a true count t >= 0, |max(x, 0) - t| <= |x - t|, so max(x, 0) ± k holds t
whenever x ± k does, and the half-width is the count's (an accuracy target binds it so:
``Linear``). Its SQL function (sqlglot's ``exp.CountIf``) and its rule are added to the two
registries by the ``toy`` fixture; nothing under ``dpsql/`` names it.

The same query written with a plain count, ``COUNT(CASE WHEN c THEN 1 END)``, measures the same
total with the same noise: under one fixed bit source the toy's release is the plain one clamped,
with the same half-width, plan and charge.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Sequence
from fractions import Fraction

import numpy as np
import numpy.typing as npt
import pytest
from conftest import TinyPolicy
from sqlglot import exp

from dpsql.analyze.analysis import Aggregate
from dpsql.bound.specs import MeasurementSpec
from dpsql.errors import UnsupportedQueryError
from dpsql.plan.aggregates import registry
from dpsql.plan.aggregates.rule import AggregateRule, Builder, Linear, Released
from dpsql.plan.aggregates.totals import linear, one_each
from dpsql.plan.estimators import half_width
from dpsql.plan.plans import Estimate, Measurement
from dpsql.release.result import Result
from dpsql.session.session import Session
from dpsql.sql import aggregates as sql_aggregates
from dpsql.sql.aggregates import AggregateFunction


def _measure(agg: Aggregate, builder: Builder) -> Estimate:
    """The rows where the condition holds: the count of CASE WHEN c THEN 1 END."""
    assert agg.arg is not None
    case = exp.Case(ifs=[exp.If(this=agg.arg.copy(), true=exp.Literal.number(1))])
    value = builder.value(case, None)
    return Estimate(agg.kind, (builder.measure(MeasurementSpec("count", value)),), None)


def _clamped(
    est: Estimate,
    measurements: Sequence[Measurement],
    noisy: Sequence[npt.ArrayLike],
    confidence: float,
) -> Released:
    """The noisy count clamped at 0, with the count's own half-width (module docstring)."""
    value, width = linear()(est, measurements, noisy, confidence)
    return np.maximum(value, 0), width


COUNT_IF = AggregateRule(
    "count_if",  # type: ignore[arg-type]  # a kind the built-in list does not name
    _measure,
    _clamped,
    one_each,
    Linear(),
    "COUNT_IF({arg})",
    total=True,
    exact=True,
)


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> None:
    """COUNT_IF(c) registered: its SQL function, and its rule."""
    function = AggregateFunction(exp.CountIf, "count_if")  # type: ignore[arg-type]
    monkeypatch.setattr(sql_aggregates, "FUNCTIONS", (*sql_aggregates.FUNCTIONS, function))
    monkeypatch.setattr(registry, "AGGREGATES", (*registry.AGGREGATES, COUNT_IF))


@pytest.fixture
def salts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fixed salts: the bounded rows are then the same from one session to the next."""
    monkeypatch.setattr(secrets, "randbits", lambda k: 0x1234_5678_9ABC_DEF0 % (1 << k))
    monkeypatch.setattr(secrets, "token_hex", lambda n=16: "ab" * n)


# Few rows of age 70 or more: their noisy counts fall below 0 now and then.
ROWS = [(u, ("north", "south", "east")[u % 3], 18 + (u * 7) % 60, 10.0) for u in range(300)]
TOY = "SELECT region, COUNT_IF(age >= 70) AS n FROM visits GROUP BY region"
PLAIN = "SELECT region, COUNT(CASE WHEN age >= 70 THEN 1 END) AS n FROM visits GROUP BY region"


def _session(tiny_policy: TinyPolicy) -> Session:
    policy = tiny_policy(ROWS, max_groups=1, max_rows=1, budget={"epsilon": "100"})
    # One engine thread: the engine's order of groups, in which noise is drawn, is then fixed
    # (with more, two runs may return the groups in other orders and pair other noise).
    engine = policy.engine.model_copy(update={"threads": 1})
    return Session(policy.model_copy(update={"engine": engine}))


def _fresh(tiny_policy: TinyPolicy, sql: str, monkeypatch: pytest.MonkeyPatch) -> Result:
    """``sql`` released by a new session, its noise from the start of one SHAKE-256 stream
    (the operating system's randomness replaced)."""
    counter = {"n": 0}

    def urandom(n: int) -> bytes:
        counter["n"] += 1
        return hashlib.shake_256(f"dpsql-toy-{counter['n']}".encode()).digest(n)

    monkeypatch.setattr(os, "urandom", urandom)
    return _session(tiny_policy).execute(sql, epsilon="0.2")


def test_every_function_s_kind_has_one_rule() -> None:
    """The two halves of the built-in kinds meet: each kind the SQL table names has exactly
    one rule, and each rule answers some SQL function."""
    named = {
        kind
        for f in sql_aggregates.FUNCTIONS
        for kind in (f.kind, f.star, f.distinct, f.units)
        if kind is not None
    }
    kinds = [rule.kind for rule in registry.AGGREGATES]
    assert len(kinds) == len(set(kinds))
    assert named == set(kinds)


def test_unregistered_the_function_is_refused(tiny_policy: TinyPolicy) -> None:
    with pytest.raises(UnsupportedQueryError, match="COUNT_IF"):
        _session(tiny_policy).plan(TOY)


def test_explain_plans_the_toy_as_its_measurement(tiny_policy: TinyPolicy, toy: None) -> None:
    s = _session(tiny_policy)
    toy_lines = s.execute("EXPLAIN " + TOY).rows
    plain_lines = s.execute("EXPLAIN " + PLAIN).rows
    measured = [r for r in toy_lines if str(r[0]).startswith("measurement ")]
    assert len(measured) == 1 and "COUNT(CASE WHEN" in str(measured[0][0])
    assert measured == [r for r in plain_lines if str(r[0]).startswith("measurement ")]
    assert ("cost: epsilon 1, delta 0",) in toy_lines
    assert s.plan(TOY).estimates[0].kind == "count_if"


def test_the_release_is_the_plain_count_clamped_at_zero(
    tiny_policy: TinyPolicy, toy: None, salts: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    toy_result = _fresh(tiny_policy, TOY, monkeypatch)
    plain = _fresh(tiny_policy, PLAIN, monkeypatch)
    assert toy_result.types == plain.types == ("VARCHAR", "BIGINT")
    assert [r[0] for r in toy_result.rows] == [r[0] for r in plain.rows]
    # A published count is shown at 0 or above too (docs/reading.md): the toy's own clamp and
    # the publication's agree, and some noisy count fell below 0 (so both are exercised).
    counts = [r[1] for r in plain.rows]
    assert any(c == 0 for c in counts)
    assert [r[1] for r in toy_result.rows] == counts
    # The count's own half-width, in every group.
    plan = toy_result.plan
    assert plan is not None
    m = plan.measurements[plan.estimates[0].measurements[0]]
    k = float(half_width(m, plan.options.confidence) * m.unit)
    assert toy_result.accuracy == plain.accuracy == tuple((None, k) for _ in toy_result.rows)
    # Charged as the query's epsilon, like the plain count.
    assert toy_result.charge is not None and plain.charge is not None
    assert toy_result.charge.epsilon == plain.charge.epsilon == Fraction(1, 5)
    assert toy_result.charge.delta == 0


def test_an_accuracy_target_binds_the_toy_as_a_count(tiny_policy: TinyPolicy, toy: None) -> None:
    s = _session(tiny_policy)
    toy_plan = s.plan(TOY, halfwidth=8)
    plain_plan = s.plan(PLAIN, halfwidth=8)
    assert toy_plan.epsilon == plain_plan.epsilon
    assert any(line.startswith("target: COUNT_IF(") for line in toy_plan.targets)
    m = toy_plan.measurements[0]
    assert half_width(m, toy_plan.options.confidence) * m.unit <= 8


def test_only_sqlglot_aggregates_may_be_registered() -> None:
    """A function sqlglot does not parse as an aggregate (an unknown name is ``Anonymous``)
    would pass for a row-level function in a subquery: it cannot be declared."""
    with pytest.raises(TypeError, match="not an aggregate"):
        AggregateFunction(exp.Anonymous, "count_if")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not an aggregate"):
        AggregateFunction(exp.Abs, "sum")
