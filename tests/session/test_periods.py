"""A person-within-period unit (``dpsql.policy.periods``): the lifetime cap per person charged
at the periods a query reads, each period's budget an admission rule, and what the table of
periods refuses.

The lifetime figure is the data set's budget spent: each charge on the table of periods is the
person's loss over the |P| periods it read (``dpsql.mechanisms.group``), never the sum of the
period spends nor one period's.
"""

from __future__ import annotations

import datetime as dt
import random
from contextlib import closing
from fractions import Fraction
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import TINY_BUDGET, TINY_COLUMNS, examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpsql.errors import BudgetExceededError, PolicyError, UnsupportedQueryError
from dpsql.mechanisms.laplace_events import DiscreteLaplace
from dpsql.policy import Policy, load_policy
from dpsql.session.blocks import register
from dpsql.session.session import Session

MONTHS = [(dt.date(2026, m, 1), dt.date(2026, m + 1, 1)) for m in range(1, 7)]
Q1 = "SELECT COUNT(*) AS n FROM visits WHERE day < DATE '2026-04-01'"
MARCH = "SELECT region, COUNT(*) AS n FROM visits WHERE day >= '2026-03-01' AND day < '2026-04-01' GROUP BY region"  # noqa: E501
EVERY = "SELECT COUNT(*) AS n FROM visits"


def raw_policy(lifetime: str = "12", **periods: Any) -> dict[str, Any]:
    return {
        "dataset": {"id": "periods", "data_version": "1"},
        "data": {"blocks": {"visits": {"period": "day"}}},
        "budget": {"diagnose": False, **TINY_BUDGET, "epsilon": lifetime},
        "tables": {
            "visits": {
                "privacy_unit": "user_id",
                "max_groups_per_unit": 2,
                "max_rows_per_unit_per_group": 5,
                "columns": {k: dict(v) for k, v in TINY_COLUMNS.items()},
            }
        },
        "periods": {"table": "visits", "epsilon": "2", **periods},
    }


def policy(folder: Path, lifetime: str = "12", **periods: Any) -> Policy:
    return load_policy(raw_policy(lifetime, **periods), base_dir=folder)


def month_file(folder: Path, name: str, month: int, seed: int, n: int = 60) -> Path:
    rng = random.Random(seed)
    start = MONTHS[month - 1][0]
    rows = [(rng.randrange(40), rng.choice(["central", "east", "north", "south", "west"]),
             rng.uniform(0, 250), rng.randrange(28)) for _ in range(n)]  # fmt: skip
    path = folder / f"{name}.parquet"
    pq.write_table(pa.table({
        "user_id": pa.array([r[0] for r in rows], pa.int64()),
        "region": pa.array([r[1] for r in rows], pa.string()),
        "age": pa.array([30] * n, pa.int32()),
        "spend": pa.array([r[2] for r in rows], pa.float64()),
        "day": pa.array([start + dt.timedelta(days=r[3]) for r in rows], pa.date32()),
    }), path)  # fmt: skip
    return path


def add(session: Session, folder: Path, block: str, month: int, **kw: Any) -> None:
    start, end = MONTHS[month - 1]
    register(session.policy, session.filter.store, "visits", block,
             period=(start.isoformat(), end.isoformat()),
             paths=[month_file(folder, block, month, month * 7 + len(block))], **kw)  # fmt: skip


def months(session: Session, folder: Path, count: int) -> None:
    for m in range(1, count + 1):
        add(session, folder, f"m{m}", m)


def last_charge(session: Session) -> dict[str, Any]:
    return next(r.payload for r in reversed(session.filter.store.records()) if r.kind == "charge")


def spends(session: Session) -> dict[str, Fraction]:
    session.refresh_blocks()
    blocks = [(b.id, b.start, b.end) for b in session.registered.blocks.active("visits")]
    return {r["block"]: r["epsilon"] for r in session.filter.period_rows(blocks)}


def test_a_query_is_charged_to_the_lifetime_cap_for_each_period_it_reads(tmp_path: Path) -> None:
    with closing(Session(policy(tmp_path))) as session:
        months(session, tmp_path, 4)
        q1 = session.execute(Q1, epsilon=0.5)
        assert q1.charge is not None and q1.charge.epsilon == Fraction(3, 2)  # 3 periods
        (event,) = q1.charge.event.events
        assert isinstance(event, DiscreteLaplace) and event.sensitivity == 3 * 5  # 3 x C
        march = session.execute(MARCH, epsilon=0.25)
        assert march.charge is not None and march.charge.epsilon == Fraction(1, 4)
        assert session.budget().epsilon_spent == Fraction(7, 4)  # the lifetime figure
        assert spends(session) == {"m1": Fraction(1, 2), "m2": Fraction(1, 2),
                                   "m3": Fraction(3, 4), "m4": 0}  # fmt: skip
        record = last_charge(session)
        assert record["periods"]["persons"] == 1 and record["periods"]["read"][0][0] == "m3"
        # The unit is (person, period): each period's rows of a person are bounded apart.
        assert 'ROW("user_id", "_dpsql_period")' in session.plan(EVERY).engine_sql


def test_a_period_over_its_budget_refuses_the_query_and_records_nothing(tmp_path: Path) -> None:
    with closing(Session(policy(tmp_path))) as session:
        months(session, tmp_path, 3)
        session.execute(MARCH, epsilon=1.5)
        records = len(session.filter.store.records())
        with pytest.raises(BudgetExceededError, match="period m3 of visits over its budget"):
            session.execute(EVERY, epsilon=1)
        assert len(session.filter.store.records()) == records
        # Periods it does not read are still open to it.
        assert session.execute(Q1.replace("04-01", "03-01"), epsilon=1).charge is not None


def test_the_lifetime_cap_refuses_what_every_period_would_admit(tmp_path: Path) -> None:
    with closing(Session(policy(tmp_path, lifetime="10"))) as session:
        months(session, tmp_path, 6)
        session.execute(EVERY, epsilon=1)  # 6 for a person in all six periods
        session.execute("SELECT SUM(spend) AS s FROM visits", epsilon="0.5")  # 3 more
        assert session.budget().epsilon_spent == 9
        assert max(spends(session).values()) == Fraction(3, 2)  # 0.5 under each period's 2
        with pytest.raises(BudgetExceededError, match="over its budget under the basic filter"):
            session.execute("SELECT SUM(age) AS a FROM visits", epsilon="0.2")  # 1.2 > 1 left


def test_a_replacement_inherits_what_was_spent_on_its_period(tmp_path: Path) -> None:
    with closing(Session(policy(tmp_path))) as session:
        months(session, tmp_path, 3)
        session.execute(MARCH, epsilon=1.5)
        add(session, tmp_path, "m3b", 3, replaces="m3")
        assert spends(session)["m3b"] == Fraction(3, 2)
        with pytest.raises(BudgetExceededError, match="period m3b"):
            session.execute(MARCH, epsilon=1, fresh=True)


def test_explain_states_the_person_and_the_period_costs(tmp_path: Path) -> None:
    with closing(Session(policy(tmp_path))) as session:
        months(session, tmp_path, 4)
        lines = [r[0] for r in session.execute("EXPLAIN " + Q1, epsilon=0.5).rows]
        assert any("3 period(s) read; each pays epsilon 0.5" in line for line in lines)
        assert any("lifetime cost for one person in all 3: epsilon 1.5" in line for line in lines)
        assert not session.filter.charges


def test_what_the_table_of_periods_refuses(tmp_path: Path) -> None:
    with closing(Session(policy(tmp_path))) as session:
        months(session, tmp_path, 2)
        with pytest.raises(UnsupportedQueryError, match="person-periods"):
            session.execute("SELECT COUNT(DISTINCT user_id) AS u FROM visits")
        one = "SELECT COUNT(DISTINCT user_id) AS u FROM visits WHERE day < '2026-02-01'"
        assert session.execute(one).charge is not None  # one period: persons
        with pytest.raises(UnsupportedQueryError, match="sample"):
            session.execute(EVERY, sample_rate=0.5)
        with pytest.raises(UnsupportedQueryError, match="reads it alone"):
            session.execute("SELECT COUNT(*) FROM (SELECT user_id FROM visits) AS t")
        # The period column of the engine is not the analyst's to read.
        with pytest.raises(Exception, match="_dpsql_period"):
            session.execute("SELECT COUNT(*) FROM visits GROUP BY _dpsql_period")
        assert len(session.filter.charges) == 1


def test_estimates_and_workloads_are_charged_for_the_person(tmp_path: Path) -> None:
    with closing(Session(policy(tmp_path))) as session:
        months(session, tmp_path, 3)
        estimate = session.execute("ESTIMATE BOUNDS FOR visits", epsilon="0.2")
        assert estimate.charge is not None and estimate.charge.epsilon == Fraction(3, 5)
        session.run_script(f"SET dpsql.epsilon = 0.25;\n{Q1};\n{MARCH};\n")
        last = last_charge(session)["periods"]
        assert last["persons"] == 3  # the workload read the three periods
        unit = Fraction(last["unit_epsilon"])
        assert session.budget().epsilon_spent == Fraction(3, 5) + 3 * unit


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"periods": {"table": "nope", "epsilon": "1"}}, "data.blocks"),
        ({"periods": {"table": "visits", "epsilon": "13"}}, "lifetime cap"),
        (
            {
                "budget": {
                    **TINY_BUDGET,
                    "epsilon": "12",
                    "accountant": "pld",
                    "declared_mechanism": {
                        "kind": "discrete_laplace",
                        "sensitivity": 1,
                        "scale": "10",
                    },
                }
            },
            "pld",
        ),
        ({"periods": {"table": "visits", "epsilon": "1", "extra": 1}}, "extra"),
    ],
)
def test_the_policy_checks_its_periods(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    with pytest.raises(PolicyError, match=message):
        load_policy({**raw_policy(), **change}, base_dir=tmp_path)


def test_every_charge_path_on_the_table_pays_for_the_person(tmp_path: Path) -> None:
    """A file of only an ESTIMATE BOUNDS, a file whose statements one family answers, and a
    query on bounds chosen per query: each charged at the periods it read."""
    raw = raw_policy()
    raw["tables"]["visits"]["bounds"] = ["max_rows_per_unit"]
    with closing(Session(load_policy(raw, base_dir=tmp_path))) as session:
        months(session, tmp_path, 3)
        session.run_script("SET dpsql.epsilon = 0.2;\nESTIMATE BOUNDS FOR visits;\n")
        assert last_charge(session)["periods"]["persons"] == 3
        assert session.budget().epsilon_spent == Fraction(3, 5)
        family = ("SET dpsql.epsilon = 0.1;\nSELECT region, COUNT(*) AS n FROM visits WHERE day "
                  "< '2026-03-01' GROUP BY region;\nSELECT COUNT(*) AS t FROM visits WHERE day < "
                  "'2026-03-01';\n")  # fmt: skip
        session.run_script(family)
        charge = last_charge(session)
        assert charge["periods"]["persons"] == 2 and charge["query"].startswith("WORKLOAD")
        before = session.budget().epsilon_spent
        auto = session.execute("SELECT COUNT(*) AS a FROM visits", epsilon="0.1",
                               bounds="auto", max_rows_per_unit=None)  # fmt: skip
        assert auto.charge is not None
        assert session.budget().epsilon_spent - before == Fraction(3, 10)


EDGES = [a + dt.timedelta(days=d) for a, _ in MONTHS[:5] for d in (-1, 0, 1)]
DAYS = st.one_of(st.sampled_from(EDGES), st.dates(dt.date(2025, 12, 20), dt.date(2026, 5, 10)))
TERM = st.one_of(
    st.tuples(st.sampled_from([">=", ">", "<", "<=", "="]), DAYS, st.booleans()).map(
        lambda t: f"day {t[0]} {'DATE ' if t[2] else ''}'{t[1]}'"
    ),
    st.tuples(DAYS, DAYS).map(lambda t: f"day BETWEEN '{min(t)}' AND '{max(t)}'"),
    st.sampled_from(
        [
            "region = 'east'",
            "spend > 100",
            "NOT day < '2026-02-01'",
            "(day < '2026-02-01' OR day >= '2026-04-01')",
        ]
    ),
)


@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(terms=st.lists(TERM, min_size=1, max_size=3))
def test_the_periods_a_query_is_charged_for_hold_every_row_it_reads(
    tmp_path_factory: pytest.TempPathFactory, terms: list[str]
) -> None:
    """k, the periods a query is charged for, is the blocks its WHERE does not exclude: every
    row the WHERE keeps lies in one of them (else a person's loss would be undercounted)."""
    folder = tmp_path_factory.mktemp("k")
    with closing(Session(policy(folder))) as session:
        months(session, folder, 4)
        where = " AND ".join(terms)
        plan = session.plan(f"SELECT COUNT(*) AS n FROM visits WHERE {where}")
        ((_, read),) = plan.blocks
        starts = {b.start for b in session.registered.blocks.active("visits") if b.id in read}
        rows = session.engine._con.execute(
            f"SELECT DISTINCT _dpsql_period FROM visits WHERE {where}"
        ).fetchall()
        assert {r[0] for r in rows} <= starts, (where, read)
