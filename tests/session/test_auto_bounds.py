"""Bounds chosen per query (``SET dpsql.bounds = auto``, a table's policy ``bounds``).

What must hold: the opt-in (without it a missing bound is refused, as before); the charge is
the query's epsilon, fixed before anything runs (a PureDP of the walks' share beside the
answer's); EXPLAIN is a function of public facts (the same text over two data sets of the same
schema) and runs nothing; a repeat is served free with the values first chosen; the refusals;
and the privacy of each walk's counts: on neighbouring data sets D and D' (one unit more), every
count a walk reads moves by at most the walk's sensitivity, all in one direction (the premise of
the monotone sparse vector, Lyu, Su and Li 2017, Theorem 4; the walk itself is tested in
``tests/noise/test_sparse_vector_privacy.py``).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from conftest import TINY_REGIONS, TINY_SCHEMA, write_parquet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.stats import beta

import dpsql
from dpsql.errors import BoundsError, InternalError, PolicyError, UnsupportedQueryError
from dpsql.interfaces.pgwire.statements import to_answer
from dpsql.mechanisms.stated_events import PureDP
from dpsql.noise.sparse_vector import Walks
from dpsql.plan.auto import (
    CLAMPS,
    GROUPS,
    LADDER,
    ROWS,
    ROWS_PER_GROUP,
    TRADEOFF_THRESHOLD,
    WEIGHT_CAP,
    WEIGHT_FLOOR,
    WEIGHT_TOTAL,
    Choice,
    GroupWeights,
    overshoot,
)
from dpsql.policy import Policy, load_policy
from dpsql.release import auto_bounds
from dpsql.release.auto_bounds import beyond, choose
from dpsql.release.clamp_bounds import beyond as clamp_beyond
from dpsql.release.result import summary
from dpsql.session.session import Session

Rows = Sequence[tuple[Any, ...]]
MakePolicy = Callable[..., Policy]


@pytest.fixture
def make_policy(tmp_path: Path) -> MakePolicy:
    count = [0]

    def make(rows: Rows, table: dict[str, Any] | None = None, name: str = "") -> Policy:
        count[0] += 1
        path = tmp_path / f"v{name or count[0]}.parquet"
        write_parquet(path, rows, TINY_SCHEMA)
        columns: dict[str, Any] = {"region": {"public_values": list(TINY_REGIONS)},
                                   "age": {"lower": 18, "upper": 90}}  # fmt: skip
        return load_policy(
            {
                "dataset": {"id": "auto", "data_version": "1"},
                "data": {"tables": {"visits": str(path)}},
                "budget": {
                    "epsilon": "100",
                    "delta": "0.000001",
                    "query_epsilon": "1",
                    "query_delta": "0.00000001",
                    "diagnose": False,
                },
                "tables": {
                    "visits": {"privacy_unit": "user_id", "columns": columns, **(table or {})}
                },
            },
            base_dir=tmp_path,
        )

    return make


def _rows(heavy: int = 40, units: int = 60) -> list[tuple[Any, ...]]:
    """Units 0..units-1 with 1-3 rows; unit 0 with ``heavy`` rows spread over the regions."""
    out: list[tuple[Any, ...]] = []
    for u in range(units):
        for i in range(1 + u % 3):
            out.append((u, TINY_REGIONS[(u + i) % 5], 30, float(10 + u % 50)))
    out += [(0, TINY_REGIONS[i % 5], 40, 150.0) for i in range(heavy)]
    return out


def _session(policy: Policy) -> Session:
    return dpsql.connect(policy)._session  # type: ignore[return-value]


def test_without_the_opt_in_a_missing_bound_is_refused(make_policy: MakePolicy) -> None:
    s = _session(make_policy(_rows()))
    with pytest.raises(BoundsError, match="max_rows_per_unit_per_group"):
        s.execute("SELECT COUNT(*) FROM visits")
    with pytest.raises(BoundsError, match="spend"):
        s.execute("SELECT SUM(spend) FROM visits", max_rows_per_unit=3)
    assert s.budget().epsilon_spent == 0


@pytest.mark.parametrize(
    ("sql", "chosen"),
    [
        ("SELECT COUNT(*) FROM visits", (ROWS,)),
        ("SELECT region, COUNT(*) FROM visits GROUP BY region", (GROUPS, ROWS_PER_GROUP)),
        ("SELECT SUM(spend), AVG(spend) FROM visits", (ROWS, "visits.spend")),
        ("SELECT region, SUM(spend) FROM visits GROUP BY region",
         (GROUPS, ROWS_PER_GROUP, "visits.spend")),
    ],
)  # fmt: skip
def test_a_query_chooses_its_bounds_at_its_epsilon(
    make_policy: MakePolicy, sql: str, chosen: tuple[str, ...]
) -> None:
    s = _session(make_policy(_rows()))
    s.execute("SET dpsql.bounds = auto")
    result = s.execute(sql)
    assert result.charge is not None and result.charge.epsilon == 1
    walks, answer = result.charge.event.events
    assert isinstance(walks, PureDP) and walks.epsilon == Fraction(1, 4)
    assert isinstance(answer, PureDP) and answer.epsilon == Fraction(3, 4)
    assert result.bounds_note.startswith("bounds chosen privately for this answer")
    for name in chosen:
        assert name in result.bounds_note
    assert result.plan is not None and result.plan.auto is None  # the answer's own plan
    assert result.plan.epsilon == Fraction(3, 4)
    # The ledger keeps what ran: the walks' query with the charge, the answer's with its release.
    records = s.filter.store.records()
    release = next(r for r in reversed(records) if r.kind == "release").payload
    assert release["bounded_sql"] == result.plan.engine_sql and release["chosen"]
    charged = next(r for r in records if r.seq == result.charge.seq).payload
    assert "_pu" in json.dumps(charged)  # the walks' histograms (dpsql.bound.selection)
    # Served again free, with the same values; fresh pays again.
    again = s.execute(sql)
    assert again.charge is None and again.cached_from is not None
    assert again.bounds_note == result.bounds_note and again.rows == result.rows
    assert s.budget().epsilon_spent == 1
    fresh = s.execute(sql, fresh=True)
    assert fresh.charge is not None and s.budget().epsilon_spent == 2


def test_the_policy_opts_a_table_in(make_policy: MakePolicy) -> None:
    s = _session(make_policy(_rows(), {"bounds": "auto"}))
    result = s.execute("SELECT SUM(spend) FROM visits")
    assert (
        "max_rows_per_unit = " in result.bounds_note and "visits.spend in [" in result.bounds_note
    )
    listed = _session(make_policy(_rows(), {"bounds": ["max_rows_per_unit"]}))
    assert "max_rows_per_unit" in listed.execute("SELECT COUNT(*) FROM visits").bounds_note
    with pytest.raises(BoundsError):  # clamps are not listed
        listed.execute("SELECT SUM(spend) FROM visits")
    declared = _session(make_policy(_rows(), {"bounds": "auto", "max_rows_per_unit": 2}))
    plain = declared.execute("SELECT COUNT(*) FROM visits")  # a declared bound wins: no walk
    assert plain.bounds_note == "" and plain.charge is not None
    assert len(plain.charge.event.events) == 1


def test_the_policy_field_is_checked(make_policy: MakePolicy) -> None:
    with pytest.raises(PolicyError, match="declared, so dpsql cannot choose it"):
        make_policy(_rows(), {"bounds": ["max_rows_per_unit"], "max_rows_per_unit": 2})
    with pytest.raises(PolicyError, match="bounds lists"):
        make_policy(_rows(), {"bounds": ["max_row_per_unit"]})
    # Unset, it is not part of the policy's version: earlier releases stay keyed the same.
    a, b = make_policy(_rows(), name="same"), make_policy(_rows(), {"bounds": None}, name="same")
    assert a.version == b.version != make_policy(_rows(), {"bounds": "auto"}, name="same").version


def test_a_public_domain_gives_l0_free_and_distinct_units_choose_nothing(
    make_policy: MakePolicy,
) -> None:
    s = _session(make_policy(_rows()))
    s.execute("SET dpsql.bounds = auto")
    result = s.execute("SELECT region, COUNT(DISTINCT user_id) FROM visits GROUP BY region")
    assert result.charge is not None and result.charge.epsilon == 1
    assert result.plan is not None and result.plan.max_groups == 5  # every region, no walk
    assert len(result.charge.event.events) == 1


def test_explain_is_public_and_runs_nothing(make_policy: MakePolicy) -> None:
    texts = []
    for heavy in (0, 500):
        s = _session(make_policy(_rows(heavy=heavy)))
        s.execute("SET dpsql.bounds = auto")
        lines = [r[0] for r in s.execute("EXPLAIN SELECT region, SUM(spend) FROM visits "
                                         "GROUP BY region").rows]  # fmt: skip
        verbose = [r[0] for r in s.execute("EXPLAIN VERBOSE SELECT COUNT(*) FROM visits").rows]
        assert s.budget().epsilon_spent == 0
        texts.append((lines, verbose))
    assert texts[0] == texts[1]  # the same whatever the data holds
    lines, verbose = texts[0]
    assert any("auto bound max_rows_per_unit_per_group" in line for line in lines)
    assert any("k = " in line and "epsilon" in line for line in lines)
    assert not any("noise ±" in line for line in lines)
    assert any(line.startswith("selection SQL") for line in verbose)
    # A total's row cap cannot resolve its k at the default share: EXPLAIN says it overshoots.
    assert any("max_rows_per_unit (R)" in line and "one rung higher" in line for line in verbose)


def test_the_walk_draws_what_its_exact_distribution_says() -> None:
    """``auto_bounds.walk`` (threshold share 3/5, one rung of overshoot where its noise exceeds
    k) against the exact distribution of ``_walk_distribution``, 4,000 draws: a wrong share, a
    missing or extra step, moves some rung's frequency by more than 0.05 (binomial sd <= 0.008)."""
    above = [900, 400, 60, 12, 5, 2, 1, 0, 0, 0]
    for epsilon in (Fraction(1, 4), Fraction(8)):
        choice = Choice(ROWS, epsilon)
        target = Fraction(3)
        assert overshoot(epsilon, 1, target) == (epsilon < 1)
        exact = _walk_distribution(above, target, epsilon)
        seen = Counter(auto_bounds.walk(choice, above, target) for _ in range(4000))
        for i, p in enumerate(exact):
            assert abs(seen.get(LADDER[i], 0) / 4000 - p) < 0.05, (epsilon, i)


def test_what_auto_does_not_cover_is_refused_before_the_charge(make_policy: MakePolicy) -> None:
    s = _session(make_policy(_rows()))
    s.execute("SET dpsql.bounds = auto")
    refused: list[tuple[str, dict[str, object], type[Exception]]] = [
        ("SELECT COUNT(*) FROM visits", {"mechanism": "gaussian"}, UnsupportedQueryError),
        ("SELECT COUNT(*) FROM visits", {"sample_rate": "0.5"}, UnsupportedQueryError),
        ("SELECT COUNT(*) FROM visits", {"halfwidth": "10"}, UnsupportedQueryError),
        ("SELECT COUNT(*) FROM visits", {"diagnose": True}, UnsupportedQueryError),
        ("SELECT MEDIAN(spend) FROM visits", {}, BoundsError),
    ]
    for sql, options, error in refused:
        with pytest.raises(error):
            s.execute(sql, **options)
    assert s.budget().epsilon_spent == 0


# -- neighbours: every count a walk reads moves by at most its sensitivity, one way ---------------

_UNIT_ROWS = st.lists(
    st.tuples(st.integers(0, 4), st.integers(0, 300)), min_size=1, max_size=12
)  # (region index, spend) of one unit's rows


def _walk_counts(s: Session, sql: str) -> dict[str, list[int]]:
    """Per walk of ``sql``'s plan, the counts beyond each rung it reads."""
    plan = s.plan(sql)
    auto = plan.auto
    assert auto is not None
    rows = s.engine.run(auto.sql)[1] if auto.sql is not None else []
    hist: dict[int, dict[int, int]] = {}
    for b, v, n in rows:
        hist.setdefault(int(b), {})[int(v)] = int(n)
    out: dict[str, list[int]] = {}
    statistic = {ROWS: 0, GROUPS: 1, ROWS_PER_GROUP: 2}
    for choice in auto.choices:
        if choice.bound == CLAMPS:
            (clamp_sql,) = auto.clamp_sql
            upper, lower = clamp_beyond(s.engine.run(clamp_sql)[1])
            out["clamp upper"], out["clamp lower"] = upper, lower
            continue
        index = 3 if choice.statistic == "cells" else statistic[choice.bound]
        out[choice.bound] = beyond(hist.get(index, {}))
    return out


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(units=st.lists(_UNIT_ROWS, min_size=1, max_size=8), extra=_UNIT_ROWS)
def test_each_walks_counts_move_by_its_sensitivity_on_neighbours(
    tmp_path_factory: pytest.TempPathFactory,
    units: list[list[tuple[int, int]]],
    extra: list[tuple[int, int]],
) -> None:
    base = tmp_path_factory.mktemp("nb")
    rows = [(u, TINY_REGIONS[g], 20 + g, float(v)) for u, unit in enumerate(units) for g, v in unit]
    more = rows + [(len(units), TINY_REGIONS[g], 20 + g, float(v)) for g, v in extra]
    queries = {
        "SELECT COUNT(*) FROM visits WHERE spend > 50": 1,
        "SELECT region, SUM(spend) FROM visits GROUP BY region": 5,
        # A private key: L0's walk on the units' groups, then C's on their largest group.
        "SELECT age, COUNT(*) FROM visits GROUP BY age": 1,
    }
    counts = []
    for i, data in enumerate((rows, more)):
        path = base / f"d{i}.parquet"
        write_parquet(path, data, TINY_SCHEMA)
        table = {
            "privacy_unit": "user_id",
            "bounds": "auto",
            "columns": {"region": {"public_values": list(TINY_REGIONS)}},
        }
        policy = load_policy(
            {
                "dataset": {"id": "nb", "data_version": "1"},
                "data": {"tables": {"visits": str(path)}},
                "budget": {
                    "epsilon": "10",
                    "delta": "0.5",
                    "query_epsilon": "1",
                    "query_delta": "0.000001",
                    "diagnose": False,
                },
                "tables": {"visits": table},
            },
            base_dir=base,
        )
        s = _session(policy)
        counts.append({sql: _walk_counts(s, sql) for sql in queries})
    assert {GROUPS, ROWS_PER_GROUP} <= counts[0][
        "SELECT age, COUNT(*) FROM visits GROUP BY age"
    ].keys()
    for sql, cells in queries.items():
        d, d2 = counts[0][sql], counts[1][sql]
        assert d.keys() == d2.keys()
        for walk in d:
            sensitivity = cells if walk == ROWS_PER_GROUP else 1
            moves = [b - a for a, b in zip(d[walk], d2[walk], strict=True)]
            assert all(0 <= m <= sensitivity for m in moves), (sql, walk, moves)


# -- the whole choice on neighbours, exactly: the engine's counts, then the walk's distribution ---


def _tail(p: float, m: int) -> float:
    """P(Z >= m) for Z discrete Laplace with p = exp(-1/scale)."""
    return p**m / (1 + p) if m >= 1 else 1 - p ** (1 - m) / (1 + p)


def _walk_distribution(
    above: list[int],
    target: Fraction,
    epsilon: Fraction,
    sensitivity: int = 1,
    step: int | None = None,
) -> list[float]:
    """The exact distribution of a walk's chosen rung (``dpsql.release.auto_bounds.walk``: the
    stop, one rung higher where the walk overshoots, or ``step`` rungs), summed over the
    threshold noise rho within 60 of its scale (the rest: below 1e-25)."""

    walks = Walks(epsilon, 1, sensitivity, TRADEOFF_THRESHOLD)
    pt = math.exp(-1 / float(walks.threshold_scale))
    pq = math.exp(-1 / float(walks.query_scale))
    span = int(60 * walks.threshold_scale)
    out = [0.0] * len(above)
    for rho in range(-span, span + 1):
        weight = (1 - pt) / (1 + pt) * pt ** abs(rho)
        go = 1.0
        for i, count in enumerate(above):
            # Stops at i when nu_i >= count - target + rho (module sparse_vector).
            stop = _tail(pq, math.ceil(count - target + rho))
            if i == len(above) - 1:
                out[i] += weight * go
                break
            out[i] += weight * go * stop
            go *= 1 - stop
    if step is None:
        step = overshoot(epsilon, 1, target)
    if step:  # the top rung keeps what steps past it
        out = [0.0] * step + out[: -step - 1] + [sum(out[-step - 1 :])]
    return out


@pytest.mark.parametrize("extra_rows", [2, 5, 300])
def test_the_row_cap_choice_is_epsilon_dp_on_neighbours_exactly(
    make_policy: MakePolicy, extra_rows: int
) -> None:
    """D: 60 units of 1-3 rows and one of 40 more; D': one more unit of ``extra_rows``. The
    chosen R's distribution, from the engine's counts on each, differs by at most e^epsilon of
    the walk (a quarter of the query's epsilon 1) at every rung."""
    rows = _rows()
    more = [*rows, *((999, "east", 30, 1.0) for _ in range(extra_rows))]
    dists = []
    for data in (rows, more):
        s = _session(make_policy(data))
        s.execute("SET dpsql.bounds = auto")
        plan = s.plan("SELECT COUNT(*) FROM visits")
        assert plan.auto is not None
        (choice,) = plan.auto.choices
        target = choice.target(plan.auto.noise, 1, None)
        dists.append(_walk_distribution(_walk_counts(s, "SELECT COUNT(*) FROM visits")[ROWS],
                                         target, choice.epsilon))  # fmt: skip
    worst = max(abs(math.log(a / b)) for a, b in zip(*dists, strict=True) if a > 1e-300)
    assert worst <= float(choice.epsilon) + 1e-9
    assert worst > 0.3 * float(choice.epsilon)  # the pair moves the output: the test can fail


def _measured_loss(counts: Sequence[Mapping[Any, int]], runs: int, alpha: float) -> float:
    """The largest ln of one side's Clopper-Pearson lower bound over the other's upper bound,
    over every chosen value (each at ``alpha``, Bonferroni over the values and both sides)."""
    values = set(counts[0]) | set(counts[1])
    a = alpha / (2 * len(values))
    measured = 0.0
    for v in values:
        for p, q in ((counts[0], counts[1]), (counts[1], counts[0])):
            k, m = p.get(v, 0), q.get(v, 0)
            low = beta.ppf(a, k, runs - k + 1) if k > 0 else 0.0
            high = beta.ppf(1 - a, m + 1, runs - m) if m < runs else 1.0
            if low > 0:
                measured = max(measured, math.log(low / high))
    return measured


@pytest.mark.statistical
@pytest.mark.parametrize("epsilon", [4, 8])
def test_audit_the_chosen_row_cap_never_shows_more_loss_than_charged(
    make_policy: MakePolicy, epsilon: int
) -> None:
    """The real walks (``dpsql.release.auto_bounds.choose``, the real sampler) on the engine's
    counts of D and D' (one more unit of 300 rows), 3,000 draws each: for every chosen value,
    ln of the Clopper-Pearson lower bound of one side's frequency over the upper bound of the
    other's (each at 1e-4, Bonferroni over the values) stays below the walk's epsilon (a quarter
    of the query's). Measured: 0.08-0.12 of 1 (query epsilon 4), 0.69-0.84 of 2 (8); at the
    query epsilon 1 of the test above the audit measures 0 at this size, so the exact test there
    carries the weight."""
    runs, alpha = 3000, 1e-4
    counts = []
    for data in (_rows(), [*_rows(), *((999, "east", 30, 1.0) for _ in range(300))]):
        s = _session(make_policy(data))
        s.execute("SET dpsql.bounds = auto")
        plan = s.plan("SELECT COUNT(*) FROM visits", epsilon=epsilon)
        assert plan.auto is not None and plan.auto.sql is not None
        rows = s.engine.run(plan.auto.sql)[1]
        seen: dict[object, int] = {}
        for _ in range(runs):
            value = choose(plan.auto, rows, [])[ROWS]
            seen[value] = seen.get(value, 0) + 1
        counts.append(seen)
    assert _measured_loss(counts, runs, alpha) <= epsilon / 4


def test_a_file_planned_as_one_refuses_a_choice(make_policy: MakePolicy) -> None:
    s = _session(make_policy(_rows()))
    with pytest.raises(UnsupportedQueryError, match="chooses its bounds per query"):
        s.run_script("SET dpsql.bounds = auto;\nSELECT COUNT(*) FROM visits;")
    assert s.budget().epsilon_spent == 0


def test_every_interface_shows_the_chosen_values(make_policy: MakePolicy) -> None:
    s = _session(make_policy(_rows()))
    s.execute("SET dpsql.bounds = auto")
    result = s.execute("SELECT COUNT(*) FROM visits")
    assert result.bounds_note in summary(result)  # notebooks, dpsql query, repr
    answer = to_answer(result, 1000)
    assert answer.notice is not None and result.bounds_note in answer.notice  # the server


def test_a_column_read_through_a_subquery_keeps_needing_declared_bounds(
    make_policy: MakePolicy,
) -> None:
    """Its clamps are not chosen (only a top-level SUM's are): refused, as without auto,
    rather than planned at the widest candidates (the analysis carries no bounds out of a
    per-unit subquery; ``dpsql.session.auto.stray`` refuses it before the analysis could)."""
    s = _session(make_policy(_rows()))
    s.execute("SET dpsql.bounds = auto")
    sql = "SELECT AVG(m) FROM (SELECT user_id, AVG(spend) AS m FROM visits GROUP BY user_id)"
    with pytest.raises(BoundsError, match="spend"):
        s.execute(sql)
    assert s.budget().epsilon_spent == 0
    # A top-level SUM's column is chosen as usual.
    assert s.execute("SELECT SUM(spend) FROM visits").bounds_note


def test_a_chosen_clamp_gives_up_a_cells_parallel_composition(make_policy: MakePolicy) -> None:
    """A clamp's walk reads its whole column, not one cell's units: the query's event claims no
    cell; R's walk reads the cell's rows only, and the cell stays (docs/privacy.md)."""
    s = _session(make_policy(_rows(), {"constant_per_unit": ["region"]}))
    s.execute("SET dpsql.bounds = auto")
    counted = s.execute("SELECT COUNT(*) FROM visits WHERE region = 'east'")
    summed = s.execute("SELECT SUM(spend) FROM visits WHERE region = 'east'")
    assert counted.charge is not None and counted.charge.event.cell is not None
    assert summed.charge is not None and summed.charge.event.cell is None


# -- C's walk over cells: group weights from noisy sizes (dpsql.plan.auto.GroupWeights) ---------

_GROUPED = "SELECT region, COUNT(*) FROM visits GROUP BY region"


def _true_cells(rows: Rows) -> dict[str, dict[int, int]]:
    """Per region (the true label), the histogram of rows per (unit, region) cell."""
    cells = Counter((r[0], r[1]) for r in rows)
    out: dict[str, dict[int, int]] = {g: {} for g in TINY_REGIONS}
    for (_, region), n in cells.items():
        out[region][n] = out[region].get(n, 0) + 1
    return out


def _engine_cells(s: Session, sql: str) -> list[dict[int, int]]:
    plan = s.plan(sql)
    assert plan.auto is not None and plan.auto.sql is not None
    hist: dict[int, dict[int, int]] = {}
    for b, v, n in s.engine.run(plan.auto.sql)[1]:
        hist.setdefault(int(b), {})[int(v)] = int(n)
    return auto_bounds.group_cells(hist, len(TINY_REGIONS))


def _canonical(cells: Sequence[dict[int, int]]) -> list[list[tuple[int, int]]]:
    return sorted(sorted(h.items()) for h in cells)


def _size(h: dict[int, int]) -> int:
    return sum(min(v, WEIGHT_CAP) * n for v, n in h.items())


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(units=st.lists(_UNIT_ROWS, min_size=1, max_size=8), extra=_UNIT_ROWS)
def test_each_groups_cells_and_size_move_by_their_sensitivity_on_neighbours(
    tmp_path_factory: pytest.TempPathFactory,
    units: list[list[tuple[int, int]]],
    extra: list[tuple[int, int]],
) -> None:
    """The engine's per-group histograms are the true per-region ones (as a multiset: the
    engine numbers the groups present, which the walk never reads as labels), padded to the
    domain's 5 with empty ones; under the true labels, on D and D' (one unit more), each
    group's size (rows per cell counted up to WEIGHT_CAP) moves by 0..WEIGHT_CAP, so the sizes
    by at most WEIGHT_CAP·G in L1 (the Laplace mechanism's premise), and each group's cells
    beyond every rung by 0..1, so a weighted count by 0..W (the monotone walk's premise)."""
    base = tmp_path_factory.mktemp("gw")
    rows = [(u, TINY_REGIONS[g], 20 + g, float(v)) for u, unit in enumerate(units) for g, v in unit]
    more = rows + [(len(units), TINY_REGIONS[g], 20 + g, float(v)) for g, v in extra]
    truths = []
    for i, data in enumerate((rows, more)):
        path = base / f"d{i}.parquet"
        write_parquet(path, data, TINY_SCHEMA)
        columns = {"region": {"public_values": list(TINY_REGIONS)}}
        table = {"privacy_unit": "user_id", "bounds": "auto", "columns": columns}
        policy = load_policy(
            {
                "dataset": {"id": "gw", "data_version": "1"},
                "data": {"tables": {"visits": str(path)}},
                "budget": {"epsilon": "10", "query_epsilon": "1", "diagnose": False},
                "tables": {"visits": table},
            },
            base_dir=base,
        )
        truth = _true_cells(data)
        assert _canonical(_engine_cells(_session(policy), _GROUPED)) == _canonical(
            list(truth.values())
        )
        truths.append(truth)
    d, d2 = truths
    moves = [_size(d2[g]) - _size(d[g]) for g in TINY_REGIONS]
    assert all(0 <= m <= WEIGHT_CAP for m in moves)
    assert sum(moves) <= WEIGHT_CAP * len(TINY_REGIONS)
    weights = [300, 1, 200, 0, 523]  # any weights the sizes' release gives
    weighted = [
        [sum(w * beyond(t[g])[i] for w, g in zip(weights, TINY_REGIONS, strict=True))
         for i in range(len(LADDER))]
        for t in (d, d2)
    ]  # fmt: skip
    for g in TINY_REGIONS:
        cell_moves = [b - a for a, b in zip(beyond(d[g]), beyond(d2[g]), strict=True)]
        assert all(0 <= m <= 1 for m in cell_moves)
    assert all(0 <= b - a <= sum(weights) for a, b in zip(*weighted, strict=True))


def test_group_weights_weigh_a_small_group_more_and_stay_within_their_total() -> None:
    w = GroupWeights(Fraction(1), 8)
    assert w.scale == WEIGHT_CAP * 8
    equal = w.weights([5000] * 8)
    assert len(set(equal)) == 1 and WEIGHT_TOTAL - 8 <= sum(equal) <= WEIGHT_TOTAL
    skewed = w.weights([40000, 9000, 4000, 2000, 1000, 800, 600, 500])
    assert skewed == sorted(skewed) and WEIGHT_TOTAL - 8 <= sum(skewed) <= WEIGHT_TOTAL
    # A size within the noise (or below zero, as noise can make it) weighs as the floor does,
    # so an empty group never takes the whole weight.
    floor = int(WEIGHT_FLOOR * w.scale)
    low = w.weights([1000, -50, 0, floor // 2, floor, 1000, 1000, 1000])
    assert low[1] == low[2] == low[3] == low[4] < WEIGHT_TOTAL // 2
    # Absent groups of the domain are empty histograms, never dropped: the walk sees G groups.
    assert auto_bounds.group_cells({4: {1: 3}, 0: {1: 3}}, 3) == [{1: 3}, {}, {}]
    with pytest.raises(InternalError):
        auto_bounds.group_cells({4: {1: 1}, 5: {1: 1}}, 1)


def test_the_cell_walk_is_epsilon_dp_on_neighbours_exactly_given_its_weights(
    make_policy: MakePolicy,
) -> None:
    """Given the weights (released before it, at the rest of the choice's epsilon), the cell
    walk's exact distribution on D and D' (one more unit of 300 rows over every region)
    differs by at most e^(walk epsilon) at every rung, at sensitivity W = the weights' sum."""
    rows = _rows()
    more = [*rows, *((999, TINY_REGIONS[i % 5], 30, 1.0) for i in range(300))]
    weights = [40, 10, 25, 15, 12]
    dists = []
    for data in (rows, more):
        s = _session(make_policy(data))
        s.execute("SET dpsql.bounds = auto")
        plan = s.plan(_GROUPED, epsilon=8)
        assert plan.auto is not None
        (choice,) = plan.auto.choices
        assert choice.weights is not None and choice.weights.groups == 5
        target = choice.target(plan.auto.noise, 5, 5)
        above = [0] * len(LADDER)
        for w, h in zip(weights, _engine_cells(s, _GROUPED), strict=True):
            above = [a + w * b for a, b in zip(above, beyond(h), strict=True)]
        total = sum(weights)
        dists.append(
            _walk_distribution(above, total * target, choice.walk_epsilon, total,
                               choice.steps(target))
        )  # fmt: skip
    worst = max(abs(math.log(a / b)) for a, b in zip(*dists, strict=True) if a > 1e-300)
    assert worst <= float(choice.walk_epsilon) + 1e-9
    assert worst > 0.3 * float(choice.walk_epsilon)  # the pair moves the output


@pytest.mark.statistical
@pytest.mark.parametrize("epsilon", [4, 8, 20])
def test_audit_the_chosen_cell_cap_never_shows_more_loss_than_charged(
    make_policy: MakePolicy, epsilon: int
) -> None:
    """The whole choice of C over cells (noisy sizes, weights, walk; the real samplers) on the
    engine's counts of D and D' (one more unit of 300 rows over every region), 3,000 draws
    each: the Clopper-Pearson bound of the loss stays below the choice's epsilon (a quarter of
    the query's). Measured: 0-0.01 of 1 (query epsilon 4), 0.09-0.20 of 2 (8), 1.51-1.57 of 5
    (20); the exact test above carries the walk's weight, the neighbour test the sizes'
    sensitivity."""
    runs, alpha = 3000, 1e-4
    counts = []
    more = [*_rows(), *((999, TINY_REGIONS[i % 5], 30, 1.0) for i in range(300))]
    for data in (_rows(), more):
        s = _session(make_policy(data))
        s.execute("SET dpsql.bounds = auto")
        plan = s.plan(_GROUPED, epsilon=epsilon)
        assert plan.auto is not None and plan.auto.sql is not None
        rows = s.engine.run(plan.auto.sql)[1]
        counts.append(Counter(choose(plan.auto, rows, [])[ROWS_PER_GROUP] for _ in range(runs)))
        (choice,) = plan.auto.choices
    assert _measured_loss(counts, runs, alpha) <= float(choice.epsilon)
    assert len(set(counts[0]) | set(counts[1])) > 1  # the choice varies: the audit could see a loss
