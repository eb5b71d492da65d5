"""Answers derived from a workload family's release (``dpsql.cache.families.derive``): a later
statement whose plan is a linear function of the family's measurements (an aggregate no member
asked for, over the same rows, settings and bounds, whose own bounded rows are the family's) is
answered free, from the least-squares values, with the half-widths of its noise combination;
anything else is charged, a coarser level of rows bounded per finer cell included."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from conftest import TinyPolicy, adds_up
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_workload import BAND, FILE, FUZZ_EXAMPLES, _rows, _workload

from dpsql.accounting.ledger.ledger import Ledger
from dpsql.accounting.ledger.store import budget_caps
from dpsql.cache.families import RECORD_KIND
from dpsql.plan.workload.family import key_descriptor
from dpsql.policy import LedgerSpec, Policy
from dpsql.session.session import Session
from dpsql.session.workloads import run_workload

BY_BAND = f"SELECT {BAND} AS band, COUNT(*) AS n FROM visits GROUP BY band"
# FILE's family measures, by region, the rows, and spend's non-NULL count, sum and centred sums.
NOT_ASKED = "SELECT region, COUNT(spend) AS m, SUM(spend) AS s FROM visits GROUP BY region"


def _released(session: Session, text: str) -> list[Any]:
    return [r for _, r in run_workload(session, _workload(session, text))]


def test_an_aggregate_no_statement_asked_for_is_derived_free(tiny_policy: TinyPolicy) -> None:
    """The file asks for counts, SUM and AVG, and STDDEV of spend by region: a count of spend's
    non-NULL values and its sum by region are measurements of the release. Derived, they cost
    nothing, each cell has a half-width (its noise combination), and asked again they are the
    same answer (the same release, the same least squares)."""
    with closing(Session(tiny_policy(_rows(21)))) as session:
        results = _released(session, FILE)
        spent = session.budget().epsilon_spent
        charges = len(session.filter.charges)
        derived = session.execute(NOT_ASKED)
        assert derived.charge is None and derived.cached_from is not None
        assert "derived from release" in derived.note
        family = next(r.seq for r in session.filter.store.records() if r.kind == RECORD_KIND)
        assert derived.cached_from == family
        assert session.budget().epsilon_spent == spent and len(session.filter.charges) == charges
        assert all(a is not None and a > 0 for acc in derived.accuracy for a in acc[1:])
        # The same sums the member SUM(spend), AVG(spend) was given.
        assert {r[0]: r[2] for r in derived.rows} == {r[0]: r[1] for r in results[4].rows}
        assert session.execute(NOT_ASKED).rows == derived.rows


def test_a_coarser_level_is_charged_its_own_rows_are_not_the_family_s(
    tiny_policy: TinyPolicy,
) -> None:
    """The family bounded its rows per region (L0 regions of a unit, C rows in each): the
    total, or a count by band, bounds a unit per group of its own grouping, so it is not a sum
    of the family's cells and is charged."""
    with closing(Session(tiny_policy(_rows(22), budget={"epsilon": "20"}))) as session:
        _released(session, FILE)
        for query in ("SELECT COUNT(spend) AS m FROM visits", BY_BAND):
            result = session.execute(query)
            assert result.charge is not None and "derived" not in result.note


@pytest.mark.parametrize(
    ("setting", "query"),
    [
        ("", NOT_ASKED.replace("FROM visits", "FROM visits WHERE age > 30")),  # other rows
        ("SET dpsql.max_groups_per_unit = 1", NOT_ASKED),  # other bounds
        ("SET dpsql.max_rows_per_unit = 5", NOT_ASKED),  # other bounds (R)
        ("SET dpsql.share = off", NOT_ASKED),
        ("SET dpsql.fresh = on", NOT_ASKED),
        ("SET dpsql.mechanism = 'gaussian'", NOT_ASKED),
        ("", "SELECT age, COUNT(*) FROM visits GROUP BY age"),  # not a fine key
        ("", BY_BAND),  # a key the family lacks
        # No other group: another key's domain and other group than the family's.
        ("SET dpsql.other_group = off", NOT_ASKED),
        ("", "SELECT region, COUNT(DISTINCT user_id) FROM visits GROUP BY region"),
    ],
)
def test_a_statement_that_is_not_a_function_of_the_release_is_charged(
    tiny_policy: TinyPolicy, setting: str, query: str
) -> None:
    with closing(Session(tiny_policy(_rows(23), budget={"epsilon": "20"}))) as session:
        _released(session, FILE)
        if setting:
            session.execute(setting)
        result = session.execute(query)
        assert result.charge is not None and "derived" not in result.note


def test_a_derived_answer_survives_a_restart(tiny_policy: TinyPolicy, tmp_path: Path) -> None:
    """The family's release is read back from a durable ledger (its JSON) by a new session: the
    same derived answer, free."""
    policy = tiny_policy(_rows(24))
    ledger = tmp_path / "derived.sqlite"
    Ledger.create(ledger, policy.dataset.id, budget=budget_caps(policy.budget))
    durable: Policy = policy.model_copy(update={"ledger": LedgerSpec(path=ledger)})
    with closing(Session(durable)) as session:
        _released(session, FILE)
        first = session.execute(NOT_ASKED)
        assert first.charge is None
    with closing(Session(durable)) as later:
        later.execute("SET dpsql.other_group = on")
        again = later.execute(NOT_ASKED)
        assert again.charge is None and again.rows == first.rows
        assert again.accuracy == first.accuracy


TIER = "CASE WHEN spend < 100 THEN 'low' ELSE 'high' END"
KEYS = {"region": "region", "band": BAND, "tier": TIER}
GROUPINGS = [g for n in range(1, 4) for g in itertools.combinations(KEYS, n)]


def _grouped(keys: Sequence[str]) -> str:
    if not keys:
        return "SELECT COUNT(*) AS n FROM visits"
    names = ", ".join(keys)
    chosen = ", ".join(f"{KEYS[k]} AS {k}" for k in keys)
    return f"SELECT {chosen}, COUNT(*) AS n FROM visits GROUP BY {names}"


@settings(max_examples=FUZZ_EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(
    seed=st.integers(0, 10**6),
    asked=st.lists(st.sampled_from([(), *GROUPINGS]), min_size=2, max_size=4, unique=True),
    later=st.sampled_from([(), *GROUPINGS]),
    # R <= C with L0 >= R: every unit keeps R rows and each of them, and the total of rows
    # shares its family's rows.
    r=st.sampled_from(
        [
            "",
            "SET dpsql.max_rows_per_unit = 6;\n",
            "SET dpsql.max_rows_per_unit = 6;\nSET dpsql.max_groups_per_unit = 6;\n",
        ]
    ),
)
def test_a_derived_answer_is_the_sum_of_the_family_fine_cells(
    tiny_policy: TinyPolicy,
    seed: int,
    asked: list[tuple[str, ...]],
    later: tuple[str, ...],
    r: str,
) -> None:
    """Generated files of counts at several groupings and a later count at any grouping: when
    it is served from a family's release, it costs nothing, each of its cells is the sum of
    the family's fine cells (as the fine grouping's own answer gives them) that it holds, and
    its own exact bounded counts are the sums of the family's exact bounded cells."""
    text = r + "SET dpsql.other_group = on;\n" + "".join(f"{_grouped(g)};\n" for g in asked)
    with closing(Session(tiny_policy(_rows(seed), budget={"epsilon": "40"}))) as session:
        workload = _workload(session, text)
        run_list = [res for _, res in run_workload(session, workload)]
        assert run_list
        spent = session.budget().epsilon_spent
        derived = session.execute(_grouped(later))
        if derived.charge is not None:
            assert "derived" not in derived.note
            return
        assert session.budget().epsilon_spent == spent
        records = {rec.seq: rec for rec in session.filter.store.records()}
        served = records[derived.cached_from]
        if served.kind == "release":  # a member's answer, or a statement's own release
            if "family_release" not in served.payload:
                return
            served = records[served.payload["family_release"]]
        assert served.kind == RECORD_KIND
        texts = {key_descriptor(session.plan(_grouped([k])).analysis.keys[0])[0]: k for k in KEYS}
        fine_names = [texts[str(d[0])] for d in served.payload["derive"]["keys"]]
        fine = session.execute(_grouped(fine_names))
        assert fine.charge is None
        own = session.engine.run(session.plan(_grouped(later)).engine_sql)[1]
        exact: dict[tuple[Any, ...], int] = defaultdict(int)
        for row in session.engine.run(session.plan(_grouped(fine_names)).engine_sql)[1]:
            exact[tuple(row[fine_names.index(k)] for k in later)] += int(row[-1] or 0)
        assert {tuple(r[:-1]): int(r[-1] or 0) for r in own} == dict(exact)
        position = [fine_names.index(k) for k in later]
        parts: dict[tuple[Any, ...], list[float]] = defaultdict(list)
        for row in fine.rows:
            parts[tuple(row[p] for p in position)].append(row[-1])
        assert len(derived.rows) == len(parts)
        for row in derived.rows:
            adds_up(row[-1], parts[tuple(row[:-1])])
