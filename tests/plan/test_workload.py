"""A file planned as one workload (``dpsql.plan.workload.family``): shared measurements bounded once
at a grouping whose members each keep their own bounded rows, their sensitivities on neighbouring
databases, least squares that keeps children summing to parents, a plan made from public
quantities only, one charge for the whole file before any engine work, and the longest prefix
that fits with ``--partial``."""

from __future__ import annotations

import math
import random
import statistics
from contextlib import closing
from fractions import Fraction
from typing import Any

import pytest
from conftest import LONG, TINY_REGIONS, TinyPolicy, adds_up
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpsql.cache.families import RECORD_KIND
from dpsql.errors import BudgetExceededError
from dpsql.interfaces.cli.plan_lines import plan_lines
from dpsql.plan.estimators import half_width
from dpsql.plan.workload import model as workload
from dpsql.plan.workload.family import Family
from dpsql.release import families as run
from dpsql.release.families import answer_family, exact_levels
from dpsql.session.session import Session
from dpsql.session.workload_plan import Workload, plan_workload
from dpsql.session.workloads import run_workload
from dpsql.sql.split import split_statements

FUZZ_EXAMPLES = 200 if LONG else 6
BAND = "CASE WHEN age < 40 THEN 'young' ELSE 'old' END"
FILE = f"""SET dpsql.other_group = on;
SELECT COUNT(*) AS n FROM visits;
SELECT region, COUNT(*) AS n FROM visits GROUP BY region;
SELECT region, {BAND} AS band, COUNT(*) AS n FROM visits GROUP BY region, band;
SELECT region, SUM(spend) AS s, AVG(spend) AS a FROM visits GROUP BY region;
SELECT region, STDDEV(spend) AS sd FROM visits GROUP BY region;
SELECT QUANTILE_CONT(spend, 0.5) AS median FROM visits;
"""
# Under R <= C with L0 >= R every unit keeps R rows and each of them: the total of rows is
# the sum of the counts by region (``keeps_own_rows``), and joins their family.
R_FILE = "SET dpsql.max_rows_per_unit = 6;\nSET dpsql.max_groups_per_unit = 6;\n" + FILE
# Groupings that do not nest (region; band): no statement's grouping holds both.
APART_FILE = f"""SET dpsql.max_rows_per_unit = 6;
SET dpsql.max_groups_per_unit = 6;
SET dpsql.other_group = on;
SELECT COUNT(*) AS n FROM visits;
SELECT region, COUNT(*) AS n FROM visits GROUP BY region;
SELECT {BAND} AS band, COUNT(*) AS n FROM visits GROUP BY band;
"""


def _rows(seed: int, units: int = 60) -> list[tuple[Any, ...]]:
    rng = random.Random(seed)
    rows = []
    for u in range(units):
        for _ in range(rng.randint(1, 14)):
            region = rng.choice([*TINY_REGIONS, "elsewhere", None])
            rows.append((u, region, rng.randint(18, 95), rng.uniform(-20, 260)))
    return rows


def _workload(session: Session, text: str) -> Workload:
    return plan_workload(session, split_statements(text))


def _family(workload: Workload, member: int | None = None) -> Family:
    """The workload's one family, or the family of statement ``member`` (1-based)."""
    if member is None:
        assert len(workload.joint.families) == 1
        return workload.joint.families[0]
    found = workload.joint.family_of(member - 1)
    assert found is not None
    return found[0]


def _fine_rows(session: Session, family: Family) -> list[tuple[Any, ...]]:
    return session.engine.run(family.fine.engine_sql)[1]


def test_statements_of_one_grouping_share_and_the_total_only_under_r(
    tiny_policy: TinyPolicy,
) -> None:
    policy = tiny_policy(_rows(1))
    with closing(Session(policy)) as session:
        workload = _workload(session, FILE)
    family = _family(workload)
    # Statements 3 (region), 5 (SUM, AVG by region) and 6 (STDDEV by region, which shares 5's
    # centred sum and count), bounded at 3's grouping; the count by (region, band) and the
    # total would keep other rows than their own there (L0 and C bound a unit per group of
    # the grouping asked), and the quantile is the exponential mechanism's: on their own.
    assert sorted(m.index + 1 for m in family.members) == [3, 5, 6]
    assert family.fine_index + 1 == 3
    assert all(r < 1 for r in family.ratios)
    assert workload.event is not None
    # The workload costs what the statements would cost one by one, to the last digit.
    assert workload.event.epsilon == sum(
        (s.plan.epsilon for s in workload.steps if s.plan is not None), Fraction(0)
    )
    # Every measurement states the cells one unit may move: its L0 groups.
    l0 = family.fine.max_groups
    for t, e in zip(family.taken, family.event, strict=True):
        assert e.dimensions == min(l0, family.cells(t.level))
    with closing(Session(policy)) as session:
        under_r = _workload(session, R_FILE)
    # Statement 4 (the total) joins 5 (by region); 7 and 8 read a value, which R's window
    # hashes: a family of their own.
    assert [sorted(m.index + 1 for m in f.members) for f in under_r.joint.families] == [
        [4, 5],
        [7, 8],
    ]
    total = _family(under_r, 4)
    assert {t.level for t in total.taken} <= {(0,), ()}
    assert {m.level for m in total.members} == {(0,), ()}


@pytest.mark.parametrize("text", [FILE, R_FILE])
def test_the_plan_reads_no_data(tiny_policy: TinyPolicy, text: str) -> None:
    """Two databases of one schema and policy: the same families, splits and events."""
    events = []
    for seed in (2, 3):
        with closing(Session(tiny_policy(_rows(seed, units=20 + 40 * seed)))) as session:
            workload = _workload(session, text)
        assert workload.event is not None
        events.append(workload.event)
    assert events[0] == events[1]


@settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    seed=st.integers(0, 10**6),
    extra=st.integers(1, 40),
    text=st.sampled_from([FILE, R_FILE, APART_FILE]),
)
def test_one_unit_moves_each_measurement_by_at_most_its_sensitivity(
    tiny_policy: TinyPolicy, seed: int, extra: int, text: str
) -> None:
    """Neighbouring databases D and D' (D' adds one unit with up to 40 rows anywhere): every
    measurement the family takes, at every level, moves by at most its L1 sensitivity."""
    rows = _rows(seed, units=12)
    rng = random.Random(seed + 1)
    added = [(10**6, rng.choice([*TINY_REGIONS, None]), rng.randint(18, 95),
              rng.uniform(-50, 400)) for _ in range(extra)]  # fmt: skip
    levels, salt = [], None
    for data in (rows, rows + added):
        with closing(Session(tiny_policy(data))) as session:
            # One secret salt for both: the rows a unit keeps depend on it and its rows only.
            salt = session.engine.salt if salt is None else salt
            session.engine.salt = salt
            families = _workload(session, text).joint.families
            levels.append([exact_levels(f, _fine_rows(session, f)) for f in families])
    for n, family in enumerate(families):
        for t in family.taken:
            a, b = levels[0][n][(t.spec, t.level)], levels[1][n][(t.spec, t.level)]
            moved = sum(abs(x - y) for x, y in zip(a, b, strict=True))
            assert moved <= t.measurement.sensitivity, t.measurement.label


def _released(session: Session, text: str) -> list[Any]:
    workload = _workload(session, text)
    return [result for _, result in run_workload(session, workload)]


def test_children_sum_to_their_parents_in_the_released_answers(tiny_policy: TinyPolicy) -> None:
    policy = tiny_policy(_rows(4))
    unrounded = False
    # Up to 5 releases: all of one release's values come out whole by chance about 2% of the
    # time (the combination's weights can have small denominators); rounded ones always would.
    for _ in range(5):
        with closing(Session(policy)) as session:
            results = _released(session, R_FILE)
        by_statement = {i + 1: r for i, r in enumerate(results)}
        total = by_statement[4].rows[0][0]
        regions = {row[0]: row[1] for row in by_statement[5].rows}
        assert set(regions) == {*TINY_REGIONS, None}
        adds_up(total, list(regions.values()))
        assert "least squares" in by_statement[5].note and by_statement[4].note
        # Counts stay unrounded: rounding each would break the sums.
        released = [total, *regions.values()]
        if any(isinstance(n, float) and n != round(n) for n in released):
            unrounded = True
            break
    assert unrounded


def test_groupings_that_do_not_nest_are_never_bounded_at_their_union(
    tiny_policy: TinyPolicy,
) -> None:
    """By region and by band: bounded at (region, band), which no statement asks for, neither
    would keep its own rows (R's window hashes the keys a query reads). The total joins one of
    them; the other is planned on its own, and the total still adds up to the one it joined."""
    with closing(Session(tiny_policy(_rows(15)))) as session:
        workload = _workload(session, APART_FILE)
        family = _family(workload)
        assert sorted(m.index + 1 for m in family.members) in ([4, 5], [4, 6])
        assert family.fine_index + 1 in (5, 6)
        text = "\n".join(plan_lines(session, "f.sql", workload))
        assert f"bounded once at the grouping of statement {family.fine_index + 1}" in text
        results = [r for _, r in run_workload(session, workload)]
        total = results[3].rows[0][0]
        adds_up(total, [row[1] for row in results[family.fine_index].rows])


def test_combined_answers_cover_their_exact_totals_and_gain_in_variance(
    tiny_policy: TinyPolicy,
) -> None:
    """Repeated noise on one database: the region counts' half-widths cover the exact bounded
    totals at least 95% of the time, and their variance is what the plan predicts."""
    with closing(Session(tiny_policy(_rows(5)))) as session:
        workload = _workload(session, R_FILE)
        family = _family(workload, 5)
        rows = _fine_rows(session, family)
    exact = exact_levels(family, rows)
    region = next(m for m in family.members if m.index + 1 == 5)
    level = region.level
    truth = exact.get((region.specs[0], level))
    if truth is None:  # the level is answered from its children
        base = next(t for t in family.taken if t.spec == region.specs[0])
        truth = [0] * family.cells(level)
        cells = exact[(base.spec, base.level)]
        for i, v in enumerate(cells):
            truth[i // (len(cells) // len(truth))] += v
    runs, covered, errors = 300, 0, []
    width = None
    for _ in range(runs):
        plan, noisy = answer_family(family, rows)[region.index]
        m = plan.measurements[0]
        width = half_width(m, 0.95)
        for got, want in zip(noisy.totals[0], truth, strict=True):
            covered += abs(got - want) <= width
            errors.append(got - want)
    # At least 95% of them, less three standard deviations of a binomial count: the
    # half-width is within about 1% of the exact quantile, so the coverage is 95% on average.
    draws = runs * len(truth)
    assert covered >= 0.95 * draws - 3 * math.sqrt(draws * 0.95 * 0.05)
    alone = region.plan.measurements[0]
    assert alone.scale is not None
    independent = 2 * float(alone.scale) ** 2
    predicted = family.ratios[family.members.index(region)] * independent
    assert statistics.pvariance(errors) == pytest.approx(predicted, rel=0.2)
    assert width is not None and width > 0


def test_the_file_is_one_charge_before_any_engine_work(tiny_policy: TinyPolicy) -> None:
    with closing(Session(tiny_policy(_rows(6)))) as session:
        workload = _workload(session, FILE)
        before = len(session.filter.charges)
        results = [r for _, r in run_workload(session, workload)]
        charges = session.filter.charges[before:]
    assert len(charges) == 1 and charges[0].event == workload.event
    assert {r.charge.seq for r in results if r is not None and r.charge is not None} == {
        charges[0].seq
    }


def test_a_budget_spent_since_the_plan_refuses_the_whole_file(tiny_policy: TinyPolicy) -> None:
    policy = tiny_policy(_rows(7), budget={"epsilon": "6"})
    with closing(Session(policy)) as session:
        workload = _workload(session, FILE)  # 6 queries at 1: fits, with nothing left
        assert workload.fits
        session.execute(
            "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon = 0.5) COUNT(*) FROM visits"
        )
        before = len(session.filter.store.records())
        with pytest.raises(BudgetExceededError):
            list(run_workload(session, workload))
        assert len(session.filter.store.records()) == before  # nothing charged, nothing run


def test_partial_runs_the_longest_prefix_whose_joint_plan_fits(tiny_policy: TinyPolicy) -> None:
    policy = tiny_policy(_rows(8), budget={"epsilon": "3.5"})
    with closing(Session(policy)) as session:
        whole = _workload(session, FILE)
        assert not whole.fits
        sources = [s.source for s in whole.steps]
        # SET, then queries at 1 each: three fit in 3.5, the rest are refused.
        assert sources == ["free", "charge", "charge", "charge", "refused", "refused", "refused"]
        assert whole.event is not None and whole.event.epsilon == 3
        results = list(run_workload(session, whole))
        assert [r is None for _, r in results] == [False] * 4 + [True] * 3
        assert session.budget().epsilon_spent == 3


def test_estimate_bounds_in_a_file_is_charged_with_it(tiny_policy: TinyPolicy) -> None:
    with closing(Session(tiny_policy(_rows(9)))) as session:
        workload = _workload(
            session, "ESTIMATE BOUNDS FOR visits.spend;\nSELECT COUNT(*) FROM visits;\n"
        )
        assert [s.source for s in workload.steps] == ["charge", "charge"]
        assert workload.event is not None and workload.event.epsilon == 2
        results = [r for _, r in run_workload(session, workload)]
        assert results[0] is not None and results[0].columns == (
            "table",
            "column",
            "lower",
            "upper",
        )
        again = _workload(session, "ESTIMATE BOUNDS FOR visits.spend;\n")
        assert [s.source for s in again.steps] == ["cache"]


def test_a_family_released_before_is_served_again_free(tiny_policy: TinyPolicy) -> None:
    """Running the same file again: the family's measurements come from its earlier release
    (post-processing, no charge), with the same answers; a fresh one is charged again."""
    with closing(Session(tiny_policy(_rows(10), budget={"epsilon": "20"}))) as session:
        first = _released(session, FILE)
        spent = session.budget().epsilon_spent
        again_plan = _workload(session, FILE)
        assert [s.source for s in again_plan.steps][2:6] == ["cache"] * 4
        again = [r for _, r in run_workload(session, again_plan)]
        assert session.budget().epsilon_spent == spent  # nothing charged
        for i in (2, 3, 4, 5):
            assert again[i].rows == first[i].rows and again[i].cached_from is not None
        fresh = _workload(session, "SET dpsql.fresh = on;\n" + FILE)
        assert [s.source for s in fresh.steps][3:7] == ["charge"] * 4


def test_nothing_after_the_prefix_runs_even_what_a_refused_statement_would_serve(
    tiny_policy: TinyPolicy,
) -> None:
    """Statement 3 repeats statement 2, which does not fit: had it run, statement 3 would
    have been charged on its own, outside the file's one charge."""
    one = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon = 0.6) COUNT(*) AS n FROM visits"
    two = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon = 0.6) SUM(spend) AS s FROM visits"
    with closing(Session(tiny_policy(_rows(11), budget={"epsilon": "1"}))) as session:
        workload = _workload(session, f"{one};\n{two};\n{two};\n")
        assert [s.source for s in workload.steps] == ["charge", "refused", "refused"]
        results = list(run_workload(session, workload))
        assert [r is None for _, r in results] == [False, True, True]
        assert len(session.filter.charges) == 1 and session.budget().epsilon_spent == Fraction(3, 5)


def test_a_family_too_large_for_exact_least_squares_is_not_formed(
    tiny_policy: TinyPolicy,
) -> None:
    """2,001 regions (with the other group): more cells than the exact least squares takes,
    refused by the plan, never after the charge; 1,001 are planned as one family."""
    text = (
        "SET dpsql.other_group = on;\n"
        "SELECT region, COUNT(*) AS n FROM visits GROUP BY region;\n"
        "SELECT region, SUM(spend) AS s, AVG(spend) AS a FROM visits GROUP BY region;\n"
        "SELECT region, STDDEV(spend) AS sd FROM visits GROUP BY region;\n"
    )
    for size, formed in ((2000, False), (1000, True)):
        regions = [f"r{i}" for i in range(size)]
        columns = {"age": {"lower": 18, "upper": 90}, "spend": {"lower": 0, "upper": 200},
                   "region": {"public_values": regions}}  # fmt: skip
        rows = [(u, regions[u % size], 20 + u % 60, 10.0) for u in range(50)]
        with closing(Session(tiny_policy(rows, columns=columns))) as session:
            workload = _workload(session, text)
        assert bool(workload.joint.families) == formed
        assert [s.source for s in workload.steps] == ["free"] + ["charge"] * 3


def test_distinct_counts_are_never_summed_up_a_hierarchy(tiny_policy: TinyPolicy) -> None:
    """A unit in two fine cells of one region counts once in the region's COUNT(DISTINCT):
    not a sum of fine cells, so such statements are planned on their own."""
    text = (
        "SET dpsql.other_group = on;\n"
        "SELECT region, COUNT(DISTINCT user_id) AS u FROM visits GROUP BY region;\n"
        f"SELECT region, {BAND} AS band, COUNT(DISTINCT user_id) AS u FROM visits "
        "GROUP BY region, band;\n"
    )
    with closing(Session(tiny_policy(_rows(12)))) as session:
        workload = _workload(session, text)
    assert workload.joint.families == ()


def test_every_cell_of_a_level_has_the_noise_combination_of_its_first(
    tiny_policy: TinyPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The half-width of a level is computed from its first cell's combination of noises; by
    the symmetry of the product domains every cell's is the same up to a permutation: checked
    here on every cell, with the least squares the answers ran."""
    seen: list[Any] = []
    real = run.adjust

    def spy(variances: Any, constraints: Any) -> Any:
        out = real(variances, constraints)
        seen.append((list(variances), out))
        return out

    monkeypatch.setattr(run, "adjust", spy)
    with closing(Session(tiny_policy(_rows(13)))) as session:
        family = _family(_workload(session, R_FILE), 4)
        answer_family(family, _fine_rows(session, family))
    fine_level = tuple(range(len(family.sizes)))
    uses: dict[int, set[tuple[int, ...]]] = {}
    for m in family.members:
        for spec in m.specs:
            uses.setdefault(spec, set()).add(m.level)
    slots = {(t.spec, t.level) for t in family.taken}
    kinds = workload.kinds_of(family.sizes, fine_level, uses)
    assert len(kinds) == len(seen)
    scale = {(t.spec, t.level): t.measurement.scale for t in family.taken}
    for kind, (variances, adjustment) in zip(kinds, seen, strict=True):
        start = 0
        taken = [(kind.spec, level) in slots for level in kind.levels]
        planned = [2 * float(scale.get((kind.spec, lv), 1)) ** 2 for lv in kind.levels]
        # The planner's float model of the same least squares: the exact variances.
        predicted = workload._answer_variances(kind, planned, taken)
        for i, level in enumerate(kind.levels):
            if not taken[i]:
                continue
            cells = family.cells(level)
            signatures = {
                tuple(sorted((a, variances[k]) for k, a in adjustment.row(q).items()))
                for q in range(start, start + cells)
            }
            assert len(signatures) == 1, (kind.spec, level)
            assert float(adjustment.variance(start)) == pytest.approx(predicted[i], rel=1e-9)
            start += cells


def test_a_statement_under_share_off_is_planned_on_its_own(tiny_policy: TinyPolicy) -> None:
    """SET dpsql.share = off keeps the statements after it out of any family (bounded at their
    own grouping), until SET dpsql.share = on; the file costs the same, and a statement that was
    released before is still served from the cache."""
    text = FILE.replace(
        "SELECT region, COUNT(*) AS n FROM visits GROUP BY region;\n",
        "SET dpsql.share = off;\nSELECT region, COUNT(*) AS n FROM visits GROUP BY region;\n"
        "SET dpsql.share = on;\n",
    )
    with closing(Session(tiny_policy(_rows(16)))) as session:
        workload = _workload(session, text)
        members = sorted(m.index + 1 for m in _family(workload).members)
        # FILE's statements 5 and 6 moved two down; statement 4 (by region) is on its own.
        assert members == [7, 8] and workload.joint.family_of(3) is None
        assert workload.event is not None
        assert workload.event.epsilon == sum(
            (s.plan.epsilon for s in workload.steps if s.plan is not None), Fraction(0)
        )
        results = [r for _, r in run_workload(session, workload)]
        assert results[3] is not None and "least squares" not in results[3].note
        # Its own release serves it again, under either setting.
        again = _workload(session, "SET dpsql.other_group = on;\n" + text.splitlines()[3])
        assert [s.source for s in again.steps] == ["free", "cache"]


def test_a_member_asked_again_alone_is_served_its_answer_free(tiny_policy: TinyPolicy) -> None:
    """After the file, each statement its family answered, asked alone (another alias, an
    ORDER BY), is served the answer the file gave, with its half-widths: free, marked as served
    from a release. Under share = off or fresh = on it is charged afresh."""
    with closing(Session(tiny_policy(_rows(17), budget={"epsilon": "20"}))) as session:
        workload = _workload(session, FILE)
        results = [r for _, r in run_workload(session, workload)]
        family = _family(workload)
        spent = session.budget().epsilon_spent
        # One release per member, naming the workload's charge and the family's release.
        records = session.filter.store.records()
        members = [r for r in records if r.kind == "release" and "combined" in r.payload]
        charge = next(r.seq for r in records if r.kind == "charge")
        family_release = next(r.seq for r in records if r.kind == RECORD_KIND)
        assert len(members) == len(family.members)
        assert {(r.payload["charge"], r.payload["family_release"]) for r in members} == {
            (charge, family_release)
        }
        for member in family.members:
            step = workload.steps[member.index]
            alone = session.execute(step.piece.text)
            first = results[member.index]
            assert alone.charge is None and alone.cached_from is not None, step.piece.text
            assert alone.rows == first.rows and alone.accuracy == first.accuracy
            assert "a workload family's answer" in alone.note
        assert session.budget().epsilon_spent == spent
        varied = session.execute(
            "SELECT region AS r, COUNT(*) AS c FROM visits GROUP BY region ORDER BY c DESC"
        )
        by_region = dict(results[2].rows)
        assert varied.charge is None and dict(varied.rows) == by_region
        session.execute("SET dpsql.share = off")
        own = session.execute("SELECT region, COUNT(*) AS n FROM visits GROUP BY region")
        assert own.charge is not None and "least squares" not in own.note
        session.execute("SET dpsql.share = on")
        session.execute("SET dpsql.fresh = on")
        fresh = session.execute(workload.steps[3].piece.text)
        assert fresh.charge is not None


def test_a_member_repeated_in_its_file_costs_nothing_more(tiny_policy: TinyPolicy) -> None:
    """The plan calls a repeat of a member `cache (statement N)`, free: it is served the
    member's answer, and the file costs its one charge. (It was charged again on its own.)"""
    again = "SELECT region, COUNT(*) AS n FROM visits GROUP BY region;\n"
    with closing(Session(tiny_policy(_rows(18)))) as session:
        workload = _workload(session, FILE + again)
        assert workload.steps[-1].source == "cache"
        assert workload.event is not None
        results = [r for _, r in run_workload(session, workload)]
        assert session.budget().epsilon_spent == workload.event.epsilon
        assert len(session.filter.charges) == 1
        assert results[-1].rows == results[2].rows and results[-1].charge is None


def test_fresh_statements_share_no_measurement(tiny_policy: TinyPolicy) -> None:
    """Two fresh statements alike are two draws of the noise, not one answer twice."""
    with closing(Session(tiny_policy(_rows(14)))) as session:
        workload = _workload(session, "SET dpsql.fresh = on;\n" + FILE)
        assert workload.joint.families == ()
        results = [r for _, r in run_workload(session, workload)]
        twice = _workload(session, "SET dpsql.fresh = on;\n" + 2 * FILE)
    assert twice.joint.families == ()
    assert results[3] is not None and not results[3].note
