"""Answers derived from every release of the same bounded rows (``dpsql.cache.derive.assemble``):
a query whose measurements were all released over the identical bounded-row definition (same
table, WHERE, keys and domains, bounds, policy, data version and engine), at any epsilon and
across releases, is answered free from them; anything else is charged. What is derived must
be post-processing of released values alone: on another data set it is the same answer."""

from __future__ import annotations

import shutil
from contextlib import closing
from fractions import Fraction
from pathlib import Path
from typing import Any

from conftest import TINY_SCHEMA, examples, policy_over, write_parquet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpsql.accounting.ledger.ledger import Ledger
from dpsql.accounting.ledger.store import budget_caps
from dpsql.cache import keys as cache
from dpsql.cache.derive import assemble
from dpsql.plan.estimators import combined_half_width
from dpsql.policy import LedgerSpec, Policy
from dpsql.session.session import Session

REGIONS = ("central", "east", "north", "south", "west")
BY_REGION = "SELECT region, {} FROM visits GROUP BY region"


def _rows(seed: int, units: int = 120) -> list[tuple[Any, ...]]:
    out = []
    for u in range(1, units + 1):
        for j in range(1 + (u * seed) % 4):
            out.append(
                (u, REGIONS[(u + j * seed) % 5], 20 + u % 50, float((u * 7 + j * seed) % 200))
            )
    return out


def _policy(folder: Path, rows: list[tuple[Any, ...]]) -> Policy:
    """A durable tiny policy whose data file and ledger live in ``folder`` (rewritten in place,
    so that the policy, and its version, stay the same when the data changes)."""
    data = folder / "visits.parquet"
    write_parquet(data, rows, TINY_SCHEMA)
    policy = policy_over(data, max_groups=2, max_rows=3, budget={"epsilon": "1000"})
    ledger = folder / "ledger" / "ledger.sqlite"
    if not ledger.exists():
        ledger.parent.mkdir(parents=True)
        Ledger.create(ledger, policy.dataset.id, budget=budget_caps(policy.budget))
    return policy.model_copy(update={"ledger": LedgerSpec(path=ledger)})


def _releases(session: Session) -> dict[int, dict[str, Any]]:
    return {r.seq: dict(r.payload) for r in session.filter.store.records() if r.kind == "release"}


def test_another_epsilon_is_answered_from_the_release_free(tmp_path: Path) -> None:
    with closing(Session(_policy(tmp_path, _rows(3)))) as session:
        first = session.execute(BY_REGION.format("COUNT(*) AS n, AVG(spend) AS a"))
        assert first.charge is not None
        spent = session.budget().epsilon_spent
        for epsilon in ("0.1", "3"):
            again = session.execute(
                BY_REGION.format("AVG(spend) AS a, COUNT(*) AS n"), epsilon=epsilon
            )
            assert again.charge is None and session.budget().epsilon_spent == spent
            assert again.note is not None and "derived from release(s)" in again.note
            assert again.cached_from == first.charge.seq + 1  # the release record
            # The same released values; the count's half-width is the release's own (one noise,
            # its exact quantile), whatever epsilon this query names.
            assert {(r, n, a) for r, a, n in again.rows} == set(first.rows)
            assert [acc[2] for acc in again.accuracy] == [acc[1] for acc in first.accuracy]
        reserve = [r for r in session.filter.store.records() if r.kind == "reserve"][-1]
        assert reserve.payload["releases"] == [first.charge.seq + 1]
        # A fresh one is charged, and then combines with the first where that is narrower.
        fresh = session.execute(BY_REGION.format("COUNT(*) AS n"), epsilon="0.5", fresh=True)
        assert fresh.charge is not None


def test_releases_of_one_measurement_combine_by_inverse_variance(tmp_path: Path) -> None:
    """Three releases of a count at one epsilon: the answer is their mean (weights b^-2, equal
    here), exactly, with the half-width of that combination, narrower than one release's."""
    with closing(Session(_policy(tmp_path, _rows(5)))) as session:
        query = BY_REGION.format("COUNT(*) AS n")
        seqs = [session.execute(query, epsilon="0.5", fresh=True).charge for _ in range(3)]
        assert all(s is not None for s in seqs)
        derived = session.execute(query, epsilon="0.2")
        assert derived.charge is None and derived.note is not None
        released = _releases(session)
        assert len(released) == 3
        assert "derived from release(s) " + ", ".join(map(str, released)) in derived.note
        expected: dict[str, Fraction] = {}
        for payload in released.values():
            for region, total in zip(payload["keys"][0], payload["totals"][0], strict=True):
                expected[region] = expected.get(region, Fraction(0)) + Fraction(total, 3)
        assert {r: v for r, v in derived.rows} == {r: float(v) for r, v in expected.items()}
        scale = Fraction(released[min(released)]["measurements"][0]["scale"])
        three = combined_half_width(tuple((Fraction(1, 3), scale) for _ in range(3)), 0.95)
        one = combined_half_width(((Fraction(1), scale),), 0.95)
        assert three < one
        assert all(acc[1] == three for acc in derived.accuracy)


def test_measurements_of_two_releases_answer_an_avg(tmp_path: Path) -> None:
    """A SUM released alone and a COUNT(spend) released alone (the same bounded rows) answer
    AVG(spend) as 2·SUM - M·COUNT over the count, free; another WHERE or bound is charged."""
    with closing(Session(_policy(tmp_path, _rows(7)))) as session:
        sums = session.execute(BY_REGION.format("SUM(spend) AS s"))
        counts = session.execute(BY_REGION.format("COUNT(spend) AS c"), epsilon="0.3")
        avg = session.execute(BY_REGION.format("AVG(spend) AS a"), epsilon="2")
        assert sums.charge is not None and counts.charge is not None and avg.charge is None
        s, c = dict(sums.rows), dict(counts.rows)
        for region, a in avg.rows:
            if c[region] >= 1:
                assert a == min(max(s[region] / c[region], 0.0), 200.0) or abs(
                    a - min(max(s[region] / c[region], 0.0), 200.0)
                ) < 1e-9 * max(1.0, abs(a))
        assert all(acc[1] is not None and acc[1] > 0 for acc in avg.accuracy)
        other_where = session.execute(
            "SELECT region, AVG(spend) FROM visits WHERE age > 30 GROUP BY region"
        )
        other_bound = session.execute(
            BY_REGION.format("AVG(spend) AS a"), max_rows_per_unit_per_group=2
        )
        gaussian = session.execute(
            BY_REGION.format("COUNT(spend) AS c"), mechanism="gaussian", delta="1e-9"
        )
        assert all(r.charge is not None for r in (other_where, other_bound, gaussian))


def test_the_engine_is_part_of_the_bounded_row_definition(tmp_path: Path) -> None:
    """Each engine ranks a unit's rows by its own keyed hash (docs/engines.md): its releases
    measured other rows, so they are keyed apart (the policy's version leaves the engine out)."""
    policy = _policy(tmp_path, _rows(3))
    with closing(Session(policy)) as session:
        plan = session.plan(BY_REGION.format("COUNT(*) AS n"))
    spark = policy.model_copy(update={"engine": policy.engine.model_copy(update={"name": "spark"})})
    here, there = cache.keys(plan, policy), cache.keys(plan, spark)
    assert here.core == there.core and here.rows != there.rows


AGGREGATES = ("COUNT(*) AS n", "SUM(spend) AS s", "AVG(spend) AS a", "COUNT(spend) AS c")
EPSILONS = ("0.25", "0.5", "1", "2")


@settings(
    max_examples=examples(12),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    released=st.lists(
        st.tuples(st.sets(st.sampled_from(AGGREGATES), min_size=1), st.sampled_from(EPSILONS)),
        min_size=1,
        max_size=3,
    ),
    asked=st.lists(
        st.tuples(st.sets(st.sampled_from(AGGREGATES), min_size=1), st.sampled_from(EPSILONS)),
        min_size=1,
        max_size=4,
    ),
)
def test_whether_and_what_is_derived_does_not_depend_on_the_data(
    tmp_path_factory: Any,
    released: list[tuple[set[str], str]],
    asked: list[tuple[set[str], str]],
) -> None:
    """Releases on D; then the same questions on D and, with the ledger put back as it was, on
    D' (another data set under the same policy and declared data version): each question is
    charged in both worlds or in neither, and each one answered free from releases made before
    the questions is the same answer in both, half-widths included (post-processing only)."""
    folder = tmp_path_factory.mktemp("world")
    policy = _policy(folder, _rows(3))
    with closing(Session(policy)) as session:
        for aggregates, epsilon in released:
            session.execute(
                BY_REGION.format(", ".join(sorted(aggregates))), epsilon=epsilon, fresh=True
            )
        before = max(_releases(session))
    ledger = folder / "ledger"
    shutil.copytree(ledger, folder / "snapshot")
    worlds = []
    for rows in (_rows(3), _rows(11, units=90)):
        shutil.rmtree(ledger)
        shutil.copytree(folder / "snapshot", ledger)
        write_parquet(folder / "visits.parquet", rows, TINY_SCHEMA)
        outcomes = []
        with closing(Session(policy)) as session:
            for aggregates, epsilon in asked:
                result = session.execute(
                    BY_REGION.format(", ".join(sorted(aggregates))), epsilon=epsilon
                )
                reserve = session.filter.store.records()[-1]
                early = (
                    result.charge is None
                    and reserve.kind == "reserve"
                    and max(reserve.payload.get("releases", [reserve.payload["release"]])) <= before
                )
                outcomes.append(
                    (result.charge is None, (result.rows, result.accuracy) if early else None)
                )
        worlds.append(outcomes)
    assert worlds[0] == worlds[1]
    # Every question whose aggregates were all released together or apart is answered free.
    measured = set().union(*(a for a, _ in released))
    first_free = worlds[0][0][0]
    first = asked[0][0]
    if first <= measured or (
        first <= measured | {"AVG(spend) AS a"}
        and {"SUM(spend) AS s"} <= measured
        and measured & {"COUNT(spend) AS c", "AVG(spend) AS a"}
    ):
        assert first_free


def test_a_group_released_twice_derives_nothing() -> None:
    """Defence in depth (public domains have no duplicates, the policy refuses them): a release
    whose groups repeat a key is never read by position into another's order."""
    measured = {"kind": "rows", "p": None, "value": None, "grid": None, "groups": 1,
                "per_group": 1, "sigma2": None}  # fmt: skip
    keys = cache.Keys("exact", "core", ({**measured, "scale": "2"},), "rows")
    twice = {"keys": [["a", "a"]], "totals": [[1, 2]], "measurements": [{**measured, "scale": "2"}]}
    once = {"keys": [["a", "b"]], "totals": [[1, 2]], "measurements": [{**measured, "scale": "2"}]}
    assert assemble(keys, [(1, twice)], 0.95) is None
    assert assemble(keys, [(1, twice), (2, once)], 0.95) is not None  # only "once" read
    got = assemble(keys, [(1, once), (2, twice)], 0.95)
    assert got is None
