"""``ESTIMATE BOUNDS FOR table.column``: DP clamping bounds from the data, charged once,
cached, recorded in the ledger, and used by later queries over a column with no declared
bounds (for the same policy and data version); declared bounds always win. How good the
bounds are is ``tests/session/test_bounds_advice.py``."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest
from conftest import TinyPolicy

from dpsql import errors
from dpsql.accounting.ledger.store import create_ledger
from dpsql.bound import estimates as bounds
from dpsql.policy import LedgerSpec, Policy
from dpsql.release import clamp_bounds
from dpsql.session.session import Session

# 3000 units; spend in [10, 59], one unit far out (each bound leaves a few units beyond it).
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
    assert ladder[bounds.ZERO_INDEX + 1] == Fraction(1, 2**20)
    assert ladder[bounds.ZERO_INDEX + 1 + 4 * 20 : bounds.ZERO_INDEX + 1 + 4 * 21] == [
        1,
        Fraction(5, 4),
        Fraction(3, 2),
        Fraction(7, 4),
    ]
    assert all(ladder[bounds.TOP_INDEX - i] == -ladder[i] for i in range(bounds.TOP_INDEX + 1))


@pytest.mark.parametrize("up", [True, False])
def test_bucket_rounds_outwards_on_the_engine(policy: Policy, up: bool) -> None:
    """The row-level ladder index, computed by DuckDB: the smallest rung >= x (up) or the
    largest rung <= x (down), clamped to the ends of the ladder; NULL and NaN stay NULL."""
    session = Session(policy)
    values = [0.0, 1.0, 1.5, 3.0, 200.0, -0.3, -5.0, 1e-9, -1e-9, 1e300, -1e300]
    values += [float("inf"), float("-inf"), 2.0**-8, -(2.0**-8), 2.0**52, 3 * 2.0**52]
    values += [-0.0, 2.0**-20, -(2.0**-20), 1.25, 1.2499999999999998, 7.999999999999999, 5e-324]
    rungs = [bounds.candidate(i) for i in range(bounds.TOP_INDEX + 1)]
    sql = " UNION ALL ".join(f"SELECT {i} AS i, CAST('{v}' AS DOUBLE) AS x" for i, v in
                             enumerate(values))  # fmt: skip
    bucket = bounds.ladder_index("x", up=up).sql(dialect="duckdb")
    got = dict(session.engine.run(f"SELECT i, {bucket} FROM ({sql})")[1])
    for i, value in enumerate(values):
        rung = bounds.candidate(int(got[i]))
        x = Fraction(value) if abs(value) != float("inf") else None
        if up:
            expected = min((r for r in rungs if x is not None and r >= x), default=rungs[-1])
        else:
            expected = max((r for r in rungs if x is not None and r <= x), default=rungs[0])
        if x is None:
            expected = rungs[-1] if value > 0 else rungs[0]
        assert rung == expected, (value, rung, expected)
    for special in ("nan", "NULL"):
        cast = f"CAST('{special}' AS DOUBLE)" if special == "nan" else "CAST(NULL AS DOUBLE)"
        assert session.engine.run(f"SELECT {bucket} FROM (SELECT {cast} AS x)")[1] == [(None,)]


def test_estimate_is_charged_once_then_cached_and_used(policy: Policy, fixed_noise: None) -> None:
    session = Session(policy)
    with pytest.raises(errors.BoundsError):
        session.plan("SELECT SUM(spend) FROM visits")
    # At epsilon 16 the noise misses the rungs below with negligible probability (and the
    # fixed stream stops the walk at the first rungs past the data: ``fixed_noise``).
    result = session.execute("ESTIMATE BOUNDS FOR visits.spend", epsilon="16")
    assert result.charge is not None and _spent(session) == 16
    table, column, lower, upper = result.rows[0]
    assert (table, column) == ("visits", "spend")
    # Units' smallest and largest values lie in [10, 59], rounded out to the ladder's rungs; the
    # unit far out is one unit beyond, within the k = 1 the bound may leave out.
    assert 8 <= lower <= 10 and 64 <= upper <= 128, (lower, upper)
    again = session.execute("ESTIMATE BOUNDS FOR visits.spend", epsilon="16")
    assert again.charge is None and again.rows == result.rows and _spent(session) == 16
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
    durable = durable.model_copy(update={"ledger": LedgerSpec(path=tmp_path / "ledger.db")})
    create_ledger(durable)
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


def test_a_new_estimate_reads_the_raw_values(policy: Policy) -> None:
    """An earlier estimate must not clamp the values a later one reads: the engine query is
    built on the declared policy, and reads every row of every unit."""
    session = Session(policy)
    sql = clamp_bounds.bounds_query(policy, session.engine.catalog, "visits", "spend")
    assert "WHERE" not in sql.split("GROUP BY")[0]
    session.execute("ESTIMATE BOUNDS FOR visits.spend")
    fresh = session.execute("ESTIMATE BOUNDS FOR visits.spend", fresh=True)
    assert fresh.charge is not None
    charges = [r for r in session.filter.store.records() if r.kind == "charge"]
    assert [c.payload["bounded_sql"] for c in charges] == [sql, sql]
