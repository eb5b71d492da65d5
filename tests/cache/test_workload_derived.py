"""Answers derived from a workload family's release (``dpsql.cache.families.derive``): a later
statement whose plan is a linear function of the family's measurements (a level or an aggregate
no member asked for, over the same rows, settings and bounds) is answered free, from the
least-squares values, with the half-widths of its noise combination; anything else is charged."""

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
from test_workload import BAND, FILE, FUZZ_EXAMPLES, UNION_FILE, _rows, _workload

from dpsql.accounting.ledger.ledger import Ledger
from dpsql.accounting.ledger.store import budget_caps
from dpsql.cache.families import RECORD_KIND
from dpsql.plan.workload.family import key_descriptor
from dpsql.policy import LedgerSpec, Policy
from dpsql.session.session import Session
from dpsql.session.workloads import run_workload

FINE = f"SELECT region, {BAND} AS band, COUNT(*) AS n FROM visits GROUP BY region, band"
BY_BAND = f"SELECT {BAND} AS band, COUNT(*) AS n FROM visits GROUP BY band"


def _parts(rows: Any, key: int) -> dict[Any, list[float]]:
    out: dict[Any, list[float]] = defaultdict(list)
    for row in rows:
        out[row[key]].append(row[-1])
    return dict(out)


def _released(session: Session, text: str) -> list[Any]:
    return [r for _, r in run_workload(session, _workload(session, text))]


def test_the_fine_level_of_a_union_no_statement_asked_for_is_derived_free(
    tiny_policy: TinyPolicy,
) -> None:
    """By region and by band, bounded at (region, band): that grouping asked later is a linear
    function of the release. Its cells sum to both members' answers exactly (least squares),
    each cell has a half-width (its noise combination), and it costs nothing."""
    with closing(Session(tiny_policy(_rows(21)))) as session:
        results = _released(session, UNION_FILE)
        spent = session.budget().epsilon_spent
        charges = len(session.filter.charges)
        fine = session.execute(FINE)
        assert fine.charge is None and fine.cached_from is not None
        assert "derived from release" in fine.note
        family = next(r.seq for r in session.filter.store.records() if r.kind == RECORD_KIND)
        assert fine.cached_from == family
        assert session.budget().epsilon_spent == spent and len(session.filter.charges) == charges
        assert all(acc[-1] is not None and acc[-1] > 0 for acc in fine.accuracy)
        by_region, by_band = dict(results[3].rows), dict(results[4].rows)
        for region, parts in _parts(fine.rows, 0).items():
            adds_up(by_region[region], parts)
        for band, parts in _parts(fine.rows, 1).items():
            adds_up(by_band[band], parts)
        # Asked again, the same answer (the same release, the same least squares).
        assert session.execute(FINE).rows == fine.rows


def test_a_coarser_level_no_statement_asked_for_is_derived_free(tiny_policy: TinyPolicy) -> None:
    """The file asks by region and by (region, band): by band alone is the sum over regions of
    the (region, band) answers. A SUM by band is not: the family measured sums by region only
    (its base), so it is charged afresh."""
    with closing(Session(tiny_policy(_rows(22), budget={"epsilon": "20"}))) as session:
        results = _released(session, FILE)
        spent = session.budget().epsilon_spent
        derived = session.execute(BY_BAND)
        assert derived.charge is None and "derived from release" in derived.note
        fine = _parts(results[3].rows, 1)
        assert set(dict(derived.rows)) == set(fine)
        for band, n in derived.rows:
            adds_up(n, fine[band])
        # By band and by region are two partitions of one total, each shown at 0 or above.
        by_region = [n for _, n in results[2].rows]
        by_band = [n for _, n in derived.rows]
        if all(n > 0 for n in by_region + by_band):
            assert sum(by_band) == pytest.approx(sum(by_region), rel=1e-9, abs=1e-6)
        assert session.budget().epsilon_spent == spent
        summed = session.execute(f"SELECT {BAND} AS band, SUM(spend) FROM visits GROUP BY band")
        assert summed.charge is not None


@pytest.mark.parametrize(
    ("setting", "query"),
    [
        ("", BY_BAND.replace("FROM visits", "FROM visits WHERE age > 30")),  # other rows
        ("SET dpsql.max_groups_per_unit = 1", BY_BAND),  # other bounds
        ("SET dpsql.max_rows_per_unit = 5", BY_BAND),  # other bounds (R)
        ("SET dpsql.share = off", BY_BAND),
        ("SET dpsql.fresh = on", BY_BAND),
        ("SET dpsql.mechanism = 'gaussian'", BY_BAND),
        ("", "SELECT age, COUNT(*) FROM visits GROUP BY age"),  # not a fine key
        # No other group: rows outside the domain would have been dropped at the fine grouping.
        ("SET dpsql.other_group = off", "SELECT region, COUNT(*) FROM visits GROUP BY region"),
        ("", f"SELECT {BAND} AS band, COUNT(DISTINCT user_id) FROM visits GROUP BY band"),
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
        _released(session, UNION_FILE)
        first = session.execute(FINE)
    with closing(Session(durable)) as later:
        for setting in ("SET dpsql.max_rows_per_unit = 6", "SET dpsql.other_group = on"):
            later.execute(setting)
        again = later.execute(FINE)
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
    asked=st.lists(st.sampled_from(GROUPINGS), min_size=2, max_size=4, unique=True),
    later=st.sampled_from([(), *GROUPINGS]),
    r=st.sampled_from(["", "SET dpsql.max_rows_per_unit = 6;\n"]),
)
def test_a_derived_answer_is_the_sum_of_the_family_fine_cells(
    tiny_policy: TinyPolicy,
    seed: int,
    asked: list[tuple[str, ...]],
    later: tuple[str, ...],
    r: str,
) -> None:
    """Generated files of counts at several groupings and a later count at any grouping: when
    it is served from a family's release, it costs nothing and each of its cells is the sum of
    the family's fine cells (as the fine grouping's own answer gives them) that it holds."""
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
        position = [fine_names.index(k) for k in later]
        parts: dict[tuple[Any, ...], list[float]] = defaultdict(list)
        for row in fine.rows:
            parts[tuple(row[p] for p in position)].append(row[-1])
        assert len(derived.rows) == len(parts)
        for row in derived.rows:
            adds_up(row[-1], parts[tuple(row[:-1])])
