"""Workload members keep their own bounds: a statement of a ``dpsql run`` file that sets its own
L0, C or R (or other settings that change the bounded rows) never joins a family bounded at
another statement's settings, nor at another grouping's. Statement sets with random SETs between
the statements; for every family, each member's settings equal the fine plan's, and each member
measures, cell by cell, exactly the bounded totals of its own bounded query run alone."""

from __future__ import annotations

import random
from contextlib import closing
from typing import Any

from conftest import TINY_REGIONS, TinyPolicy, examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpsql.plan.workload.family import Family, Member
from dpsql.session.session import Session
from dpsql.session.workload_plan import plan_workload
from dpsql.sql.split import split_statements

BAND = "CASE WHEN age < 40 THEN 'young' ELSE 'old' END"
STATEMENTS = (
    "SELECT COUNT(*) AS n FROM visits",
    "SELECT region, COUNT(*) AS n FROM visits GROUP BY region",
    f"SELECT region, {BAND} AS band, COUNT(*) AS n FROM visits GROUP BY region, band",
    "SELECT region, SUM(spend) AS s FROM visits GROUP BY region",
    f"SELECT {BAND} AS band, COUNT(*) AS n FROM visits GROUP BY band",
    f"SELECT region, {BAND} AS band, SUM(spend) AS s FROM visits GROUP BY region, band",
    f"SELECT {BAND} AS band, region, COUNT(*) AS n FROM visits GROUP BY band, region",
    "SELECT region, AVG(spend) AS a, COUNT(spend) AS m FROM visits GROUP BY region",
    "SELECT region, STDDEV(spend) AS sd FROM visits GROUP BY region",
    "SELECT SUM(spend) AS s FROM visits",
)
# Each setting that changes the bounded rows, with values of which some bind on the data.
SETS = (
    "SET dpsql.max_rows_per_unit_per_group = 1",
    "SET dpsql.max_rows_per_unit_per_group = 3",
    "SET dpsql.max_rows_per_unit_per_group = 50",
    "SET dpsql.max_groups_per_unit = 1",
    "SET dpsql.max_groups_per_unit = 3",
    "SET dpsql.max_groups_per_unit = 6",
    "SET dpsql.max_rows_per_unit = 6",
    "SET dpsql.max_rows_per_unit = 40",
    "SET dpsql.other_group = off",
    "SET dpsql.other_group = on",
    "SET dpsql.other_label = 'rest'",
)


def _rows(seed: int, units: int = 40) -> list[tuple[Any, ...]]:
    rng = random.Random(seed)
    rows = []
    for u in range(units):
        for _ in range(rng.randint(1, 30)):
            region = rng.choice([*TINY_REGIONS, "elsewhere", None])
            rows.append((u, region, rng.randint(18, 95), rng.uniform(-20, 260)))
    return rows


def _own(session: Session, member: Member) -> dict[tuple[Any, ...], list[int]]:
    """The member's bounded totals run alone: its keys (in the fine order) -> its totals."""
    n = len(member.positions)
    order = sorted(range(n), key=lambda k: member.positions[k])
    out = {}
    for row in session.engine.run(member.plan.engine_sql)[1]:
        key = tuple(row[k] for k in order)
        out[key] = [int(v or 0) for v in row[n : n + len(member.specs)]]
    return out


def _in_family(
    session: Session, family: Family, member: Member
) -> dict[tuple[Any, ...], list[int]]:
    """The member's totals as the family measures them: its fine cells summed to its level."""
    n = len(family.sizes)
    summed: dict[tuple[Any, ...], list[int]] = {}
    for row in session.engine.run(family.fine.engine_sql)[1]:
        key = tuple(row[p] for p in member.level)
        cell = summed.setdefault(key, [0] * len(member.specs))
        for j, spec in enumerate(member.specs):
            cell[j] += int(row[n + spec] or 0)
    return summed


def _bounds(options: Any) -> tuple[object, ...]:
    return (
        options.max_groups_per_unit,
        options.max_rows_per_unit_per_group,
        options.max_rows_per_unit,
        options.sample,
    )


@settings(
    max_examples=examples(25),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    seed=st.integers(0, 10**6),
    lines=st.lists(
        # Mostly no SET between two statements, so that families form at all.
        st.tuples(
            st.one_of(*[st.just([])] * 3, st.lists(st.sampled_from(SETS), min_size=1, max_size=2)),
            st.sampled_from(STATEMENTS),
        ),
        min_size=3,
        max_size=7,
    ),
)
def test_each_member_is_bounded_as_it_asked(
    tiny_policy: TinyPolicy, seed: int, lines: list[tuple[list[str], str]]
) -> None:
    text = "SET dpsql.other_group = on;\n" + "".join(
        "".join(f"{s};\n" for s in sets) + f"{statement};\n" for sets, statement in lines
    )
    with closing(Session(tiny_policy(_rows(seed)))) as session:
        workload = plan_workload(session, split_statements(text))
        for family in workload.joint.families:
            fine = family.fine
            keys = [k for k in fine.analysis.keys]
            for member in family.members:
                plan = member.plan
                # The settings that change the bounded rows are the fine plan's: the same
                # contribution bounds, sample, other group and label on every key.
                assert _bounds(plan.options) == _bounds(fine.options), text
                for k, p in zip(plan.analysis.keys, member.positions, strict=True):
                    assert (k.other, k.other_text) == (keys[p].other, keys[p].other_text)
            for member in family.members:
                assert _in_family(session, family, member) == _own(session, member), text


SAME_GROUPING = """SET dpsql.other_group = on;
SELECT region, COUNT(*) AS n FROM visits GROUP BY region;
SELECT region, SUM(spend) AS s, AVG(spend) AS a FROM visits GROUP BY region;
SELECT region, STDDEV(spend) AS sd FROM visits GROUP BY region;
SELECT region, {band} AS band, COUNT(*) AS n FROM visits GROUP BY region, band;
SELECT COUNT(*) AS n FROM visits;
""".replace("{band}", BAND)
# R <= C and L0 >= R: every unit keeps R rows and each of them (the bounding is direct), so the
# total of rows is the sum of the grouping's cells.
R_DIRECT = """SET dpsql.other_group = on;
SET dpsql.max_rows_per_unit = 6;
SET dpsql.max_groups_per_unit = 6;
SELECT COUNT(*) AS n FROM visits;
SELECT region, COUNT(*) AS n FROM visits GROUP BY region;
SELECT region, {band} AS band, COUNT(*) AS n FROM visits GROUP BY region, band;
""".replace("{band}", BAND)


def _shapes(tiny_policy: TinyPolicy, text: str) -> list[list[int]]:
    with closing(Session(tiny_policy(_rows(7)))) as session:
        workload = plan_workload(session, split_statements(text))
        for family in workload.joint.families:
            for member in family.members:
                assert _in_family(session, family, member) == _own(session, member)
        return [sorted(m.index for m in f.members) for f in workload.joint.families]


def test_statements_of_one_grouping_share_and_others_do_not(tiny_policy: TinyPolicy) -> None:
    # Bounded at (region, band), the counts by region and the total would be other rows than
    # their own: L0 and C bound a unit per group of the grouping asked.
    assert _shapes(tiny_policy, SAME_GROUPING) == [[1, 2, 3]]  # (0 is the SET)


def test_the_total_of_rows_joins_a_grouping_whose_rows_are_all_kept(
    tiny_policy: TinyPolicy,
) -> None:
    # R's window hashes the keys a query reads: (region, band) keeps other rows than region.
    assert _shapes(tiny_policy, R_DIRECT) == [[3, 4]]


def test_a_member_asking_other_bounds_is_answered_at_its_own(tiny_policy: TinyPolicy) -> None:
    text = """SELECT region, COUNT(*) AS n FROM visits GROUP BY region;
SELECT region, SUM(spend) AS s, AVG(spend) AS a FROM visits GROUP BY region;
SELECT region, STDDEV(spend) AS sd FROM visits GROUP BY region;
SET dpsql.max_rows_per_unit_per_group = 50;
SELECT region, STDDEV(spend) AS sd FROM visits GROUP BY region;
"""
    assert _shapes(tiny_policy, text) == [[0, 1, 2]]
