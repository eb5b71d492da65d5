"""Continual-release views (``dpsql.session.views``): the reservation at creation, values
released as blocks arrive, read free and consistent, recorded once, refused when the policy
moved; and a neighbour test on the values a person-period moves.
"""

from __future__ import annotations

import datetime as dt
from contextlib import closing
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from conftest import TINY_BUDGET
from test_periods import add, last_charge, load_policy, month_file, raw_policy, spends

from dpsql.accounting.ledger.store import create_ledger
from dpsql.accounting.ledger.views import VIEW_VALUE
from dpsql.errors import BudgetExceededError, ParameterError, PolicyError, UnsupportedQueryError
from dpsql.plan.views import nodes
from dpsql.policy import Policy
from dpsql.session import views
from dpsql.session.blocks import register
from dpsql.session.session import Session

MONTHLY = "SELECT region, COUNT(*) AS n, SUM(spend) AS total FROM visits GROUP BY region"


def _session(folder: Path, gaussian: bool = False, **periods: Any) -> Session:
    raw = raw_policy("40", **{"epsilon": "4", **periods})
    if gaussian:
        raw["budget"] = {**raw["budget"], **TINY_BUDGET, "epsilon": "40", "mechanism": "gaussian",
                         "accountant": "zcdp", "delta": "0.001"}  # fmt: skip
        raw["periods"]["delta"] = "0.0001"
    return Session(load_policy(raw, base_dir=folder))


def _durable(folder: Path) -> tuple[dict[str, Any], Policy]:
    """The policy's text and the policy, with a ledger created (shared by sessions)."""
    raw = raw_policy("40", epsilon="4")
    raw["ledger"] = {"path": "views.ledger"}
    policy = load_policy(raw, base_dir=folder)
    create_ledger(policy).close()
    return raw, policy


def _declare(session: Session, mechanism: str = "auto", horizon: int = 6, **kw: Any) -> Any:
    return views.declare(session, "monthly", MONTHLY, start="2026-01-01", every="month",
                         horizon=horizon, epsilon=Fraction(1, 2), mechanism=mechanism,
                         by="owner", **kw)  # fmt: skip


def test_declaring_reserves_every_period_and_the_persons_lifetime(tmp_path: Path) -> None:
    with closing(_session(tmp_path)) as session:
        add(session, tmp_path, "m1", 1)
        view = _declare(session)
        assert view.mechanism == "plain"  # pure epsilon, 6 periods: plain answers win
        assert session.budget().epsilon_spent == 3  # a person in all 6: 6 x 0.5
        charge = last_charge(session)
        assert charge["periods"]["persons"] == 6 and len(charge["periods"]["read"]) == 6
        assert spends(session) == {"m1": Fraction(1, 2)}
        # A block registered later for a reserved period inherits the reservation.
        add(session, tmp_path, "m2", 2)
        assert spends(session)["m2"] == Fraction(1, 2)
        with pytest.raises(ParameterError, match="exists already"):
            _declare(session)


def test_a_reservation_that_does_not_fit_is_refused_and_records_nothing(tmp_path: Path) -> None:
    with closing(_session(tmp_path, epsilon="0.4")) as session:
        add(session, tmp_path, "m1", 1)  # a view's table needs one block (its columns)
        records = len(session.filter.store.records())
        with pytest.raises(BudgetExceededError, match="period 2026-01-01"):
            _declare(session)
        assert len(session.filter.store.records()) == records
    second = tmp_path / "second"
    second.mkdir()
    with closing(_session(second)) as s, pytest.raises(BudgetExceededError, match="basic"):
        add(s, second, "m1", 1)
        views.declare(s, "long", MONTHLY, start="2026-01-01", every="month", horizon=100,
                      epsilon=Fraction(1, 2), by="owner")  # fmt: skip  # 50 > 40


@pytest.mark.parametrize(
    ("mechanism", "gaussian"),
    [("plain", False), ("tree", False), ("tree", True), ("factorization", True)],
)
def test_values_come_as_blocks_arrive_and_ranges_are_consistent_and_free(
    tmp_path: Path, mechanism: str, gaussian: bool
) -> None:
    with closing(_session(tmp_path, gaussian)) as session:
        add(session, tmp_path, "m1", 1)
        _declare(session, mechanism, horizon=4)
        for m in (2, 3):
            add(session, tmp_path, f"m{m}", m)
        spent = session.budget().epsilon_spent
        first = session.execute("VIEW monthly")
        assert first.columns == ("period_start", "period_end", "region", "n", "n_pm", "total",
                                 "total_pm")  # fmt: skip
        assert len(first.rows) == 3 * 5  # three months of five regions
        released = [r for r in session.filter.store.records() if r.kind == VIEW_VALUE]
        expected = [n for n in nodes(4, mechanism) if n[1] <= 3]  # type: ignore[arg-type]
        assert sorted((r.payload["start"], r.payload["end"]) for r in released) == sorted(expected)
        whole = session.execute("VIEW monthly FROM '2026-01-01' TO '2026-04-01'")
        by_region = {r[2]: r for r in whole.rows}
        for region, row in by_region.items():
            parts = [r for r in first.rows if r[2] == region]
            assert sum(r[3] for r in parts) == pytest.approx(row[3], abs=1e-6)
            assert row[4] > 0
        again = session.execute("VIEW monthly")
        assert again.rows == first.rows  # served from the recorded values
        assert session.budget().epsilon_spent == spent  # reading is free
        assert len([r for r in session.filter.store.records() if r.kind == VIEW_VALUE]) == len(
            released
        )
        with pytest.raises(UnsupportedQueryError, match="not released"):
            session.execute("VIEW monthly FROM '2026-01-01' TO '2026-05-01'")


def test_two_sessions_record_each_value_once(tmp_path: Path) -> None:
    _, policy = _durable(tmp_path)
    with closing(Session(policy)) as one, closing(Session(policy)) as two:
        add(one, tmp_path, "m1", 1)
        _declare(one, "tree", horizon=2)
        add(one, tmp_path, "m2", 2)
        two.refresh_blocks()
        view = views.views_of(two)["monthly"]
        # Both release the same nodes: the second finds them recorded and records nothing.
        assert views.release(one, views.views_of(one)["monthly"]) == 3
        assert views.release(two, view) == 0
        kept = [r for r in two.filter.store.records() if r.kind == VIEW_VALUE]
        assert len(kept) == 3


def test_a_block_off_the_calendar_is_not_read_and_a_moved_policy_is_refused(
    tmp_path: Path,
) -> None:
    raw, policy = _durable(tmp_path)
    with closing(Session(policy)) as session:
        add(session, tmp_path, "m1", 1)
        _declare(session)
        # A block of February 2nd to March 2nd: no period of the calendar, never read by it.
        register(session.policy, session.filter.store, "visits", "off",
                 period=("2026-02-02", "2026-03-02"),
                 paths=[month_file(tmp_path, "off", 2, 3)])  # fmt: skip
        assert {r[0] for r in session.execute("VIEW monthly").rows} == {dt.date(2026, 1, 1)}
    raw["tables"]["visits"]["max_rows_per_unit_per_group"] = 6
    moved = Session(load_policy(raw, base_dir=tmp_path))
    with closing(moved), pytest.raises(PolicyError, match="reserved under another policy"):
        moved.execute("VIEW monthly")


def test_what_a_view_refuses(tmp_path: Path) -> None:
    with closing(_session(tmp_path)) as session:
        add(session, tmp_path, "m1", 1)
        for sql, message in [
            ("SELECT region, AVG(spend) FROM visits GROUP BY region", "COUNT and SUM"),
            ("SELECT region, COUNT(*) + 1 AS n FROM visits GROUP BY region", "outputs"),
        ]:
            with pytest.raises(UnsupportedQueryError, match=message):
                views.declare(session, "bad", sql, start="2026-01-01", every="month",
                              horizon=3, epsilon=Fraction(1), by="owner")  # fmt: skip
        with pytest.raises(UnsupportedQueryError, match="Gaussian"):
            _declare(session, "factorization")
        for start, every in (("2026-01-31", "month"), ("January", "month"), ("2026-01-01", "year")):
            with pytest.raises(ParameterError):
                views.declare(session, "v", MONTHLY, start=start, every=every, horizon=3,
                              epsilon=Fraction(1), by="owner")  # fmt: skip
        assert not session.filter.charges
        with pytest.raises(ParameterError, match="no view"):
            session.execute("VIEW nothing")


def test_a_person_period_moves_only_the_values_that_hold_its_period(tmp_path: Path) -> None:
    """D and D' differ by one person-period in March (a correction of March's block): the tree's
    exact node totals differ only at the nodes holding March, each by at most the plan's
    sensitivity per group and in all."""
    totals = {}
    salt = None
    for name, extra in (("d", False), ("dp", True)):
        folder = tmp_path / name
        folder.mkdir()
        with closing(_session(folder)) as session:
            for m in (1, 2, 3, 4):
                add(session, folder, f"m{m}", m)
            if extra:
                import pyarrow as pa
                import pyarrow.parquet as pq
                from test_periods import MONTHS

                path = folder / "extra.parquet"
                start = MONTHS[2][0]
                pq.write_table(pa.table({
                    "user_id": pa.array([777] * 9, pa.int64()),
                    "region": pa.array(["east", "west", "east"] * 3, pa.string()),
                    "age": pa.array([30] * 9, pa.int32()),
                    "spend": pa.array([150.0] * 9, pa.float64()),
                    "day": pa.array([start + dt.timedelta(days=i) for i in range(9)], pa.date32()),
                }), path)  # fmt: skip
                session.refresh_blocks()
                old = session.registered.blocks.active("visits")[2]
                register(session.policy, session.filter.store, "visits", "m3x",
                         period=(old.start.isoformat(), old.end.isoformat()),
                         paths=[*(f.path for f in old.files), path], replaces="m3")  # fmt: skip
                session.refresh_blocks()
            view = _declare(session, "tree", horizon=4)
            # The same keyed hash picks every other unit's groups and rows in D and D'.
            salt = session.engine.salt if salt is None else salt
            session.engine.salt = salt
            base, _ = views.plan_view(session, MONTHLY, horizon=4, epsilon=Fraction(1, 2),
                                      mechanism="tree")  # fmt: skip
            totals[name] = {n: views._totals(session, view, base, *n) for n in nodes(4, "tree")}
            plan = base
    for node in nodes(4, "tree"):
        (_, before), (_, after) = totals["d"][node], totals["dp"][node]
        if not node[0] <= 2 < node[1]:
            assert before == after, node
            continue
        for j, m in enumerate(plan.measurements):
            moved = [abs(a - b) for a, b in zip(after[j], before[j], strict=True)]
            assert max(moved) <= m.per_group and sum(moved) <= m.sensitivity, (node, m.label)
            assert sum(1 for x in moved if x) <= m.groups


def test_a_view_is_read_on_the_policys_settings_only(tmp_path: Path) -> None:
    with closing(_session(tmp_path)) as session:
        add(session, tmp_path, "m1", 1)
        _declare(session)
        session.execute("SET dpsql.confidence = 0.9")  # the ± only: read as usual
        assert session.execute("VIEW monthly").rows
        session.execute("SET dpsql.max_groups_per_unit = 5")
        with pytest.raises(ParameterError, match=r"RESET dpsql\.max_groups_per_unit"):
            session.execute("VIEW monthly")


def test_a_view_whose_groups_moved_is_refused(tmp_path: Path) -> None:
    raw, policy = _durable(tmp_path)
    with closing(Session(policy)) as session:
        add(session, tmp_path, "m1", 1)
        _declare(session)
        assert len(session.execute("VIEW monthly").rows) == 5
    regions = raw["tables"]["visits"]["columns"]["region"]
    regions["public_values"] = [*regions["public_values"], "elsewhere"]
    with closing(Session(load_policy(raw, base_dir=tmp_path))) as moved:
        add(moved, tmp_path, "m2", 2)
        with pytest.raises(PolicyError, match="groups changed"):
            moved.execute("VIEW monthly")
        assert len([r for r in moved.filter.store.records() if r.kind == VIEW_VALUE]) == 1


def test_a_value_recorded_meanwhile_by_another_session_is_not_noised_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sessions that both saw a node unreleased: the second append finds the first's
    record under the ledger's lock, and records nothing (no two noisy copies of one node)."""
    _, policy = _durable(tmp_path)
    with closing(Session(policy)) as one, closing(Session(policy)) as two:
        add(one, tmp_path, "m1", 1)
        _declare(one, "plain", horizon=2)
        two.refresh_blocks()
        view = views.views_of(two)["monthly"]
        assert views.release(one, views.views_of(one)["monthly"]) == 1
        real = views.view_values
        calls: list[str] = []

        def seen(records: Any, name: str) -> Any:
            # The first read is ``two``'s from before ``one`` recorded; the lock's is real.
            calls.append(name)
            return {} if len(calls) == 1 else real(records, name)

        monkeypatch.setattr(views, "view_values", seen)
        assert views.release(two, view) == 0 and len(calls) == 2
        kept = [r for r in two.filter.store.records() if r.kind == VIEW_VALUE]
        assert len(kept) == 1
