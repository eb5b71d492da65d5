"""``ESTIMATE BOUNDS FOR table.column``: DP clamping bounds from the data, charged once,
cached, recorded in the ledger, and used by later queries over a column with no declared
bounds (for the same policy and data version); declared bounds always win."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest
from conftest import TinyPolicy

from dpsql import bounds, errors
from dpsql.accounting.ledger import Ledger
from dpsql.policy import LedgerSpec, Policy
from dpsql.session import Session

# 3000 units; spend mostly in [10, 60], one unit far out (the 1% tails are not read from it).
ROWS = [(u, "east", 30, float(10 + (u * 7 + r) % 50)) for u in range(3000) for r in range(3)]
ROWS += [(10_000, "east", 30, 1e9)]
NO_SPEND_BOUNDS = {"age": {"lower": 18, "upper": 90}}
GENEROUS = {"epsilon": "100", "query_epsilon": "4"}


def _spent(session: Session) -> Fraction:
    return session.budget().epsilon_spent


@pytest.fixture
def policy(tiny_policy: TinyPolicy) -> Policy:
    return tiny_policy(ROWS, columns=NO_SPEND_BOUNDS, budget=GENEROUS)


def test_ladder_is_ordered_and_symmetric() -> None:
    ladder = [bounds.candidate(i) for i in range(bounds.TOP_INDEX + 1)]
    assert ladder == sorted(ladder) and len(set(ladder)) == len(ladder)
    assert ladder[bounds.ZERO_INDEX] == 0
    assert ladder[-1] == 2**52 and ladder[0] == -(2**52)
    assert ladder[bounds.ZERO_INDEX + 1] == Fraction(1, 256)
    assert all(ladder[bounds.TOP_INDEX - i] == -ladder[i] for i in range(bounds.TOP_INDEX + 1))


def test_bucket_rounds_away_from_zero_on_the_engine(policy: Policy) -> None:
    """The row-level ladder index, computed by DuckDB, is the rung at or beyond |x|."""
    session = Session(policy)
    column = "x"
    values = [0.0, 1.0, 1.5, 3.0, 200.0, -0.3, 1e-9, 1e300, float("inf"), float("-inf")]
    sql = " UNION ALL ".join(f"SELECT CAST('{v}' AS DOUBLE) AS x" for v in values)
    bucket = bounds._bucket(column)
    engine = session.engine
    got = [r[0] for r in engine.run(f"SELECT {bucket} FROM ({sql})")[1]]
    for value, index in zip(values, got, strict=True):
        rung = bounds.candidate(int(index))
        if value == 0:
            assert rung == 0
        elif abs(value) <= 2**-8:
            assert rung == (2**-8 if value > 0 else -(2**-8))
        elif abs(value) >= 2**52:
            assert abs(rung) == 2**52
        else:
            assert abs(rung) >= abs(value) > abs(rung) / 2 and (rung > 0) == (value > 0)
    nan = engine.run(f"SELECT {bucket} FROM (SELECT CAST('nan' AS DOUBLE) AS x)")[1]
    assert nan == [(None,)]


def test_estimate_is_charged_once_then_cached_and_used(policy: Policy) -> None:
    session = Session(policy)
    with pytest.raises(errors.BoundsError):
        session.plan("SELECT SUM(spend) FROM visits")
    result = session.execute("ESTIMATE BOUNDS FOR visits.spend")
    assert result.charge is not None and _spent(session) == 4
    table, column, lower, upper = result.rows[0]
    assert (table, column) == ("visits", "spend")
    # The 1% and 99% quantiles of spend lie in [10, 59]: rounded out to the ladder's rungs.
    assert 4 <= lower <= 16 and 32 <= upper <= 128, (lower, upper)
    again = session.execute("ESTIMATE BOUNDS FOR visits.spend")
    assert again.charge is None and again.rows == result.rows and _spent(session) == 4
    plan = session.plan("SELECT SUM(spend) FROM visits")  # no BoundsError now
    grid = plan.estimates[0].grid
    assert grid is not None
    assert grid.lower_value <= Fraction(lower) and Fraction(upper) <= grid.upper_value
    answer = session.execute("SELECT SUM(spend), AVG(spend) FROM visits")
    assert answer.charge is not None
    # The far-out unit is clamped to the estimated upper bound, so the answers are sane.
    assert 10 <= answer.rows[0][1] <= 60


def test_estimate_survives_a_new_session_on_the_ledger(
    tiny_policy: TinyPolicy, tmp_path: Path
) -> None:
    durable = tiny_policy(ROWS, columns=NO_SPEND_BOUNDS, budget=GENEROUS)
    Ledger.create(tmp_path / "ledger.db", durable.dataset.id)
    durable = durable.model_copy(update={"ledger": LedgerSpec(path=tmp_path / "ledger.db")})
    first = Session(durable)
    first.execute("ESTIMATE BOUNDS FOR visits.spend")
    first.close()
    later = Session(durable)
    assert later.plan("SELECT SUM(spend) FROM visits").estimates[0].grid is not None
    # A new data version does not reuse it.
    stale = durable.model_copy(
        update={"dataset": durable.dataset.model_copy(update={"data_version": "2"})}
    )
    with pytest.raises(errors.BoundsError):
        Session(stale).plan("SELECT SUM(spend) FROM visits")


def test_declared_bounds_win(tiny_policy: TinyPolicy) -> None:
    session = Session(tiny_policy(ROWS, budget=GENEROUS))  # spend declared in [0, 200]
    session.execute("ESTIMATE BOUNDS FOR visits.spend")
    grid = session.plan("SELECT SUM(spend) FROM visits").estimates[0].grid
    assert grid is not None and grid.upper_value == 200


@pytest.mark.parametrize(
    ("sql", "error"),
    [
        ("ESTIMATE BOUNDS FOR visits.nope", errors.SchemaError),
        ("ESTIMATE BOUNDS FOR nope.spend", errors.SchemaError),
        ("ESTIMATE BOUNDS FOR visits.region", errors.UnsupportedQueryError),
        ("ESTIMATE BOUNDS FOR visits.user_id", errors.UnsupportedQueryError),
        ("ESTIMATE BOUNDS visits", errors.ParseError),
        ("ESTIMATE spend", errors.ParseError),
    ],
)
def test_bad_estimates_are_refused_for_free(policy: Policy, sql: str, error: type) -> None:
    session = Session(policy)
    with pytest.raises(error):
        session.execute(sql)
    assert _spent(session) == 0
