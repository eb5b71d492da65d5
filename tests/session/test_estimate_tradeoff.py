"""``ESTIMATE BOUNDS ... FOR EPSILON e`` (the bias-noise trade-off, the default for contribution
bounds), ``AT QUANTILE q`` (the rule before it), and ``dpsql init --estimate-bounds``.

The trade-off's row cap aims at about ``k = √2/e`` units with more rows: on data where 30 units
have 50 rows and the rest 1-3, the 95% quantile cuts all 30 heavy units (R = 3 or 4), while the
trade-off keeps them whole at e = 1 (k = 1.4 < 30: R reaches 64) and still cuts them at a tiny
e (k = 141 > 30: the noise of a cap at 64 would cost more than the rows it keeps).
"""

from __future__ import annotations

import shutil
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import TINY_REGIONS, TinyPolicy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpsql import errors
from dpsql.interfaces.cli import main as cli
from dpsql.plan import auto
from dpsql.policy import Policy
from dpsql.release import auto_bounds, contribution_bounds
from dpsql.session.session import Session
from dpsql.sql.parse import EstimateBounds, parse_statement

ROOT = Path(__file__).resolve().parents[2]
HEAVY = [(u, "east", 30, 1.0) for u in range(30) for _ in range(50)]
LIGHT = [(u, "west", 30, 1.0) for u in range(30, 1030) for _ in range(1 + u % 3)]
REGIONS = ("east", "west", "north")


def _undeclared(tiny_policy: TinyPolicy, rows: list[tuple[Any, ...]]) -> Policy:
    base = tiny_policy(rows, budget={"epsilon": "1000"})
    visits = base.tables["visits"].model_copy(
        update={"max_groups_per_unit": None, "max_rows_per_unit_per_group": None}
    )
    return base.model_copy(update={"tables": {**base.tables, "visits": visits}})


def test_the_tails_parse() -> None:
    assert parse_statement("ESTIMATE BOUNDS FOR visits FOR EPSILON 0.5") == EstimateBounds(
        "visits", target=Fraction(1, 2)
    )
    assert parse_statement(
        "ESTIMATE BOUNDS FOR visits GROUP BY region, at AT QUANTILE 0.9"
    ) == EstimateBounds("visits", keys=("region", "at"), quantile=Fraction(9, 10))
    for bad in (
        "ESTIMATE BOUNDS FOR visits FOR EPSILON",
        "ESTIMATE BOUNDS FOR visits FOR EPSILON -1",
        "ESTIMATE BOUNDS FOR visits FOR EPSILON 21",
        "ESTIMATE BOUNDS FOR visits AT QUANTILE 1",
        "ESTIMATE BOUNDS FOR visits AT QUANTILE 0.4",
        "ESTIMATE BOUNDS FOR visits.spend AT QUANTILE 0.9",
        "ESTIMATE BOUNDS FOR visits FOR QUANTILE 0.9",
    ):
        with pytest.raises(errors.ParseError):
            parse_statement(bad)


def test_the_trade_off_keeps_heavy_units_a_quantile_cuts(tiny_policy: TinyPolicy) -> None:
    session = Session(_undeclared(tiny_policy, HEAVY + LIGHT))
    quantile = [
        session.execute("ESTIMATE BOUNDS FOR visits AT QUANTILE 0.95", fresh=True).rows[0][2]
        for _ in range(5)
    ]
    assert all(v <= 4 for v in quantile), quantile
    wide = [
        session.execute("ESTIMATE BOUNDS FOR visits FOR EPSILON 1", fresh=True).rows[0][2]
        for _ in range(5)
    ]
    assert all(v >= 48 for v in wide), wide
    result = session.execute("ESTIMATE BOUNDS FOR visits FOR EPSILON 0.01", epsilon=5)
    assert result.rows[0][2] <= 6
    assert "aimed at about 141 units with more rows" in result.bounds_note


def test_the_default_is_the_trade_off_at_the_session_epsilon(tiny_policy: TinyPolicy) -> None:
    session = Session(_undeclared(tiny_policy, HEAVY + LIGHT))
    result = session.execute("ESTIMATE BOUNDS FOR visits")
    assert result.charge is not None and result.charge.epsilon == 1
    assert "aimed at about 1.41 units" in result.bounds_note
    # The same statement and rule again: served free; another rule is another release.
    assert session.execute("ESTIMATE BOUNDS FOR visits FOR EPSILON 1").charge is None
    assert session.execute("ESTIMATE BOUNDS FOR visits FOR EPSILON 0.5").charge is not None
    assert session.execute("ESTIMATE BOUNDS FOR visits AT QUANTILE 0.95").charge is not None
    # Clamps: the default keeps its rule; FOR EPSILON is another release.
    clamps = session.execute("ESTIMATE BOUNDS FOR visits.spend")
    assert "about 6 units" in clamps.bounds_note
    target = session.execute("ESTIMATE BOUNDS FOR visits.spend FOR EPSILON 1")
    assert target.charge is not None and "about 1.41 units" in target.bounds_note


def test_the_walks_cost_what_the_statement_says() -> None:
    rule = contribution_bounds.Rule(target=Fraction(1, 2))
    # Two sequential walks at half the epsilon each, no count of units; 3/5 of each walk's
    # epsilon on its threshold.
    assert contribution_bounds.scales(Fraction(1), ("region",), rule) == (
        Fraction(10, 3),
        Fraction(5),
    )
    assert len(contribution_bounds.scales(Fraction(1), ("region",))) == 3


def test_init_estimates_what_the_policy_leaves_unset(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(ROOT / "examples" / "data" / "visits.parquet", data / "visits.parquet")
    text = (ROOT / "examples" / "durable.toml").read_text(encoding="utf-8")
    for line in (
        "max_groups_per_unit = 2        # L0: GROUP BY groups one user may touch\n",
        "max_rows_per_unit_per_group = 10   # C: rows one user may contribute to a group\n",
        "[tables.visits.columns.spend]\nlower = 0\nupper = 200\n",
    ):
        assert line in text
        text = text.replace(line, "")
    policy = tmp_path / "policy.toml"
    policy.write_text(text, encoding="utf-8")
    runner = CliRunner()
    args = ["--policy", str(policy), "--analyst", "owner", "init"]
    out = runner.invoke(cli.cli, [*args, "--estimate-bounds", "1", "--for-epsilon", "0.5"])
    assert out.exit_code == 0, out.output
    assert "estimated visits max_rows_per_unit " in out.output
    assert "estimated visits max_groups_per_unit " in out.output
    assert "estimated visits spend " in out.output
    assert "bounds: 3 estimate(s), epsilon 1 charged in all" in out.output
    session = Session(policy)
    try:
        assert session.budget().epsilon_spent == 1
        # The estimates fill the policy: a query needs no bound of its own now.
        result = session.execute("SELECT region, SUM(spend) FROM visits GROUP BY region")
        assert result.charge is not None and result.bounds_note == ""
    finally:
        session.close()


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    units=st.lists(
        st.lists(st.sampled_from(REGIONS), min_size=1, max_size=9), min_size=1, max_size=8
    ),
    extra=st.lists(st.sampled_from(REGIONS), min_size=1, max_size=9),
)
def test_each_trade_off_walk_reads_counts_one_unit_moves_by_one(
    tiny_policy: TinyPolicy, units: list[list[str]], extra: list[str]
) -> None:
    """The trade-off's walks (R; then L0 and C, one after the other) read the engine's counts of
    units beyond each rung: on D and D' (one unit more) each moves by 0 or 1, up (Lyu, Su and
    Li 2017, Theorem 4's premise; the walk is tested in tests/noise)."""
    rows = [(u, r, 30, 1.0) for u, regions in enumerate(units) for r in regions]
    more = [*rows, *((len(units), r, 30, 1.0) for r in extra)]
    for keys in ((), ("region",)):
        counts = []
        for data in (rows, more):
            policy = _undeclared(tiny_policy, data)
            session = Session(policy)
            sql = contribution_bounds.bounds_query(policy, session.engine.catalog, "visits", keys)
            counts.append(contribution_bounds._above(session.engine.run(sql)[1], len(keys) + 1))
        for walk, walk2 in zip(*counts, strict=True):
            assert all(0 <= b - a <= 1 for a, b in zip(walk, walk2, strict=True))


def _by_region(session: Session, statement: str) -> dict[str, int]:
    result = session.execute(statement, fresh=True)
    assert result.charge is not None and result.charge.epsilon == 1
    return {bound: value for _, bound, value in result.rows}


def test_a_small_public_domain_takes_every_combination_and_the_weighted_cell_walk(
    tiny_policy: TinyPolicy,
) -> None:
    """Grouped by keys of a public domain of at most 64 combinations, the trade-off is auto's:
    L0 every combination (a public fact), C by the walk over the cells weighed by the groups'
    noisy sizes, with the whole epsilon; other keys keep the walks of L0 and C."""
    policy = _undeclared(tiny_policy, HEAVY + LIGHT)
    session = Session(policy)
    chosen = _by_region(session, "ESTIMATE BOUNDS FOR visits GROUP BY region FOR EPSILON 1")
    assert chosen["max_groups_per_unit"] == len(TINY_REGIONS)
    assert chosen["max_rows_per_unit_per_group"] in auto.LADDER
    note = session.execute("ESTIMATE BOUNDS FOR visits GROUP BY region FOR EPSILON 1")
    assert note.charge is None  # the same statement again: served from its record, free
    assert "max_groups_per_unit = 5: every public key combination" in note.bounds_note
    assert "weighed by the inverse of its noisy size" in note.bounds_note
    # A key without a public domain, or a domain of more than 64 combinations: L0's walk.
    assert (
        "units in more groups"
        in session.execute(
            "ESTIMATE BOUNDS FOR visits GROUP BY age FOR EPSILON 1", fresh=True
        ).bounds_note
    )
    wide = (
        policy.tables["visits"]
        .columns["age"]
        .model_copy(update={"public_values": tuple(range(18, 91))})
    )
    visits = policy.tables["visits"]
    visits = visits.model_copy(update={"columns": {**visits.columns, "age": wide}})
    many = Session(policy.model_copy(update={"tables": {**policy.tables, "visits": visits}}))
    result = many.execute("ESTIMATE BOUNDS FOR visits GROUP BY age FOR EPSILON 1")
    assert "units in more groups" in result.bounds_note
    # At a quantile the rule is the quantile's, whatever the domain.
    at = session.execute("ESTIMATE BOUNDS FOR visits GROUP BY region AT QUANTILE 0.95")
    assert "of the units lie beyond it" in at.bounds_note


def test_the_cell_walk_costs_what_auto_s_costs() -> None:
    rule = contribution_bounds.Rule(target=Fraction(1, 2), groups=5)
    # 7/20 of the epsilon on the five groups' sizes (L1 4·5), the rest on one walk at the
    # weights' largest total W = 1024, 3/5 of it on its threshold.
    assert contribution_bounds.scales(Fraction(1), ("region",), rule) == (
        Fraction(4 * 5 * 20, 7),
        Fraction(1024 * 20 * 5, 13 * 3),
        Fraction(1024 * 20 * 5, 13 * 2),
    )
    assert contribution_bounds.uncertainty(Fraction(1), ("region",), rule, 0.95) > 0


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    units=st.lists(
        st.lists(st.sampled_from((*REGIONS, "elsewhere")), min_size=1, max_size=9),
        min_size=1,
        max_size=8,
    ),
    extra=st.lists(st.sampled_from((*REGIONS, "elsewhere")), min_size=1, max_size=9),
)
def test_the_cell_walk_reads_what_one_unit_moves_by_one_cell_a_group(
    tiny_policy: TinyPolicy, units: list[list[str]], extra: list[str]
) -> None:
    """On D and D' (one unit more), in the histograms the cell walk reads: each group's cells
    beyond each rung move by 0 or 1, up, and its size (rows up to 4 a cell) by 0 to 4, up (the
    premises of the weights' Laplace and the walk's monotone sparse vector; the walk itself is
    tested in tests/session/test_auto_bounds.py). A row outside the domain counts nowhere: the
    groups are the domain's."""
    rows = [(u, r, 30, 1.0) for u, regions in enumerate(units) for r in regions]
    more = [*rows, *((len(units), r, 30, 1.0) for r in extra)]
    seen = []
    for data in (rows, more):
        policy = _undeclared(tiny_policy, data)
        session = Session(policy)
        cells = contribution_bounds.cells_query(
            policy, session.engine.catalog, session.engine.describe, "visits", ("region",)
        )
        assert cells is not None and cells[0] == len(TINY_REGIONS)
        histograms = auto_bounds.read_histograms(session.engine.run(cells[1])[1])
        session.close()
        # Groups are numbered by their keys among those present: index them by key instead.
        present = sorted({r for _, r, *_ in data if r in TINY_REGIONS})
        groups = auto_bounds.group_cells(histograms, len(TINY_REGIONS))
        seen.append(dict(zip(present, groups, strict=False)))
    for region in TINY_REGIONS:
        before, after = seen[0].get(region, {}), seen[1].get(region, {})
        beyond = auto_bounds.beyond(before), auto_bounds.beyond(after)
        assert all(0 <= b - a <= 1 for a, b in zip(*beyond, strict=True))
        size = [sum(min(v, auto.WEIGHT_CAP) * n for v, n in h.items()) for h in (before, after)]
        assert 0 <= size[1] - size[0] <= auto.WEIGHT_CAP
        # Each group's histogram is its true cells' rows, outside rows dropped.
        for data, got in ((rows, before), (more, after)):
            truth: dict[int, int] = {}
            for unit in {u for u, r, *_ in data if r == region}:
                n = sum(1 for u, r, *_ in data if u == unit and r == region)
                truth[n] = truth.get(n, 0) + 1
            assert got == truth
