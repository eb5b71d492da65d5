"""The interval released with every MEDIAN, QUANTILE, MIN and MAX (``dpsql.plan.aggregates.
quantiles``): its coverage on generated data, its privacy on neighbouring data sets, and how
every interface shows it.

* **Coverage**, on the real mechanism (``dpsql.noise.measure``'s exponential mechanism and the
  interval's post-processing, the same functions a release runs) over histograms of generated
  rows on a quantile grid: uniform, log-normal, bimodal, heavy ties (three values), all values
  equal, n from 20 to 10^6, p in {0, 0.1, 0.5, 0.9, 1}, epsilon 0.1 and 1. The interval must
  hold every p-quantile of the rows on the grid, and the p-quantile of the rows before rounding
  (``numpy``'s inverted CDF). Coverage is at least the confidence minus 3 binomial standard
  errors in every cell (the construction is a union bound: it measures near 1).
* **Neighbours**: the exact output distribution of each end (exponential mechanism over the
  shifted scores) on D and on D' (D with up to C more rows of one unit), for generated D,
  shifts and orders: within e^epsilon of the end's own epsilon at every candidate.
* **Audit**: the real sampler's lower end on a fixed neighbouring pair, Clopper-Pearson.
* **End to end**: through ``Session`` on generated tables, the released interval holds the
  true quantile of the kept rows at the confidence; and every interface prints ``[lo, hi]``.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import sys
from collections import Counter
from fractions import Fraction
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from conftest import LONG, TinyPolicy, examples
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dpsql.bound.grid import Grid
from dpsql.bound.specs import MeasurementSpec
from dpsql.interfaces.pgwire.statements import to_answer
from dpsql.mechanisms.quantile_score import quantile_scores, score_sensitivity
from dpsql.noise.exponential import exponential_probabilities
from dpsql.noise.measure import _quantiles
from dpsql.plan.aggregates.quantiles import endpoint_shift, sides
from dpsql.plan.aggregates.registry import rule_of
from dpsql.plan.plans import Estimate, Measurement
from dpsql.release import contribution_bounds
from dpsql.release.result import cell, summary
from dpsql.session.session import Session

GRID = Grid(Fraction(1, 4), 0, 1023)  # 1,024 candidates of step 1/4 over [0, 255.75]
CONFIDENCE = 0.95


def _measurements(
    p: Fraction, epsilon: Fraction, confidence: float = CONFIDENCE
) -> tuple[Estimate, list[Measurement]]:
    """A quantile's measurements as the planner makes them for one row per unit (C = 1): the
    value at half its epsilon-slot, each end at half of that (a lone quantile's split)."""
    ends = sides(p)
    whole = 1 + Fraction(len(ends), 2)
    sens = score_sensitivity(p)
    main = Measurement(
        MeasurementSpec("quantile", 0, p), "q", sens, 1, GRID.step, grid=GRID,
        scale=sens / (epsilon / whole),
    )  # fmt: skip
    out = [main]
    for side in ends:
        spec = MeasurementSpec("quantile", 0, p, side, confidence)
        scale = sens / (epsilon / 2 / whole)
        out.append(Measurement(spec, "end", sens, 1, GRID.step, grid=GRID, scale=scale))
    return Estimate("quantile", tuple(range(len(out))), GRID), out


def _draw(histogram: dict[int, int], p: Fraction, epsilon: Fraction, runs: int) -> np.ndarray:
    """``runs`` intervals (lo, hi) in value units from the real mechanism and post-processing."""
    estimate, ms = _measurements(p, epsilon)
    rule = rule_of("quantile")
    assert rule.interval is not None
    noisy = [_quantiles([histogram] * runs, m) for m in ms]
    lows, highs = rule.interval(estimate, ms, noisy)
    return np.stack([lows, highs], axis=1)


@functools.cache
def _benchmark() -> ModuleType:
    """``benchmarks/accuracy.py``, whose shapes the coverage test draws."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "accuracy.py"
    spec = importlib.util.spec_from_file_location("dpsql_benchmark_accuracy", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _generated(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """n values of one shape in [0, 255.75], the grid's range."""
    return np.asarray(_benchmark().shape_values(kind, n, rng, float(GRID.upper * GRID.step)))


def _histogram(values: np.ndarray) -> dict[int, int]:
    """The rows on the grid, as the engine counts them (rounded to the nearest step)."""
    index = np.clip(np.round(values / float(GRID.step)), GRID.lower, GRID.upper).astype(int)
    keys, counts = np.unique(index, return_counts=True)
    return {int(k): int(c) for k, c in zip(keys, counts, strict=True)}


def _grid_quantiles(histogram: dict[int, int], p: Fraction) -> tuple[float, float]:
    """The least and greatest p-quantile candidate of the rows on the grid (score 0)."""
    scores = quantile_scores(histogram, GRID.lower, GRID.upper, p)
    zero = [GRID.lower + i for i, s in enumerate(scores) if s == 0]
    return float(zero[0] * GRID.step), float(zero[-1] * GRID.step)


RUNS = 400 if LONG else 120
SIZES = (20, 1000, 1_000_000)
KINDS = ("uniform", "lognormal", "bimodal", "ties", "equal")
ORDERS = (Fraction(0), Fraction(1, 10), Fraction(1, 2), Fraction(9, 10), Fraction(1))


@pytest.mark.statistical
@pytest.mark.parametrize("epsilon", [Fraction(1, 10), Fraction(1)])
@pytest.mark.parametrize("kind", KINDS)
def test_the_interval_covers_the_quantile_of_the_kept_rows(kind: str, epsilon: Fraction) -> None:
    rng = np.random.default_rng(abs(hash((kind, epsilon))) % 2**32)
    margin = 3 * math.sqrt(CONFIDENCE * (1 - CONFIDENCE) / RUNS)
    for n in SIZES:
        values = _generated(kind, n, rng)
        histogram = _histogram(values)
        for p in ORDERS:
            intervals = _draw(histogram, p, epsilon, RUNS)
            least, greatest = _grid_quantiles(histogram, p)
            raw = float(np.quantile(values, float(p), method="inverted_cdf"))
            held = (intervals[:, 0] <= least) & (intervals[:, 1] >= greatest)
            held &= (intervals[:, 0] <= raw) & (intervals[:, 1] >= raw)
            assert held.mean() >= CONFIDENCE - margin, (kind, n, p, held.mean())


def test_min_and_max_reach_the_grids_edge_and_nothing_is_drawn_there() -> None:
    histogram = _histogram(np.linspace(50, 60, 200))
    low = _draw(histogram, Fraction(0), Fraction(1), 50)
    high = _draw(histogram, Fraction(1), Fraction(1), 50)
    assert (low[:, 0] == 0).all() and (high[:, 1] == float(GRID.upper * GRID.step)).all()
    assert sides(Fraction(0)) == (1,) and sides(Fraction(1)) == (-1,)
    assert sides(Fraction(1, 2)) == (-1, 1)


def test_the_shift_reads_public_numbers_only() -> None:
    """Δ grows with the end's noise and the confidence, not with anything of the data."""
    _, ms = _measurements(Fraction(1, 2), Fraction(1))
    _, wider = _measurements(Fraction(1, 2), Fraction(1), confidence=0.99)
    _, noisier = _measurements(Fraction(1, 2), Fraction(1, 10))
    shift = endpoint_shift(ms[1])
    assert endpoint_shift(wider[1]) > shift and endpoint_shift(noisier[1]) > 9 * shift
    # 2·scale·ln(|R|/β)/b: the end's epsilon 1/4 (a lone median's quarter), score sensitivity
    # 1, so scale 4; |R| = 1024, β = 0.025 (two ends), b = 2.
    assert shift == math.ceil(2 * 4 * math.log(1024 / 0.025) / 2) == 43


# -- neighbours: each end's exact distribution on D and D' --------------------------------------


@st.composite
def neighbours(draw: st.DrawFn) -> tuple[dict[int, int], dict[int, int], Fraction, int, int]:
    """A histogram on 12 candidates, the same with up to ``c`` rows of one unit added, an
    order p, a shift (an end's, in rows) and c."""
    c = draw(st.sampled_from((1, 3)))
    histogram = draw(st.dictionaries(st.integers(0, 11), st.integers(0, 5), max_size=8))
    added = dict(histogram)
    for key in draw(st.lists(st.integers(0, 11), min_size=1, max_size=c)):
        added[key] = added.get(key, 0) + 1
    p = draw(st.sampled_from((*ORDERS[1:-1], Fraction(1, 3))))
    shift = draw(st.integers(-25, 25))
    return histogram, added, p, shift, c


@settings(max_examples=examples(200), deadline=None)
@given(neighbours(), st.sampled_from([Fraction(1, 2), Fraction(2)]))
def test_each_end_is_epsilon_dp_on_neighbours_exactly(
    case: tuple[dict[int, int], dict[int, int], Fraction, int, int], epsilon: Fraction
) -> None:
    """The end's scale is C·max(a, b - a)/epsilon, as planned; its output distribution on D and
    D' differs by at most e^epsilon at every candidate (McSherry and Talwar 2007)."""
    d, d2, p, shift, c = case
    scale = Fraction(c * score_sensitivity(p)) / epsilon
    gamma = 1 / (2 * scale)
    first = exponential_probabilities(quantile_scores(d, 0, 11, p, shift), gamma)
    second = exponential_probabilities(quantile_scores(d2, 0, 11, p, shift), gamma)
    worst = max(abs(math.log(a / b)) for a, b in zip(first, second, strict=True))
    assert worst <= float(epsilon) + 1e-9


@pytest.mark.statistical
def test_audit_the_lower_end_shows_no_more_loss_than_charged() -> None:
    """The real sampler's lower end on D (rows 0..9 once each) and D' (one more row at 9),
    at epsilon 2 for the end, 20,000 draws each: for every candidate, ln of one side's
    Clopper-Pearson lower bound over the other's upper bound (1e-4 each, Bonferroni) stays
    below the end's epsilon."""
    d = {i: 1 for i in range(10)}
    d2 = {**d, 9: 2}
    grid = Grid(Fraction(1), 0, 11)
    spec = MeasurementSpec("quantile", 0, Fraction(1, 2), -1, 0.5)
    m = Measurement(spec, "end", 1, 1, Fraction(1), grid=grid, scale=Fraction(1, 2))
    runs = 20_000
    counts = [Counter(_quantiles([h] * runs, m)) for h in (d, d2)]
    a = 1e-4 / (2 * 12)
    measured = 0.0
    for v in range(12):
        for x, y in ((counts[0], counts[1]), (counts[1], counts[0])):
            k, j = x.get(v, 0), y.get(v, 0)
            low = stats.beta.ppf(a, k, runs - k + 1) if k > 0 else 0.0
            high = stats.beta.ppf(1 - a, j + 1, runs - j) if j < runs else 1.0
            if low > 0:
                measured = max(measured, math.log(low / high))
    assert 0 < measured <= 2  # the end's epsilon: scale 1/2 at score sensitivity 1


# -- end to end ----------------------------------------------------------------------------------

REGIONS = ("central", "east", "north", "south", "west")


def _rows(n: int, seed: int) -> list[tuple[Any, ...]]:
    """n units of one row each: a log-normal age clipped to [18, 90], regions in turn."""
    rng = np.random.default_rng(seed)
    ages = np.clip(np.round(rng.lognormal(3.6, 0.35, n)), 18, 90).astype(int)
    return [(u, REGIONS[u % 5], int(ages[u]), 10.0) for u in range(n)]


def test_the_released_interval_holds_the_true_median_end_to_end(
    tiny_policy: TinyPolicy,
) -> None:
    """Through a session: 60 fresh medians of 2,000 one-row units, each interval holds the
    true median of the rows and the released value; the result says what it covers, and no
    interface shows a ± for it."""
    rows = _rows(2000, 7)
    s = Session(tiny_policy(rows, max_groups=1, max_rows=1, budget={"epsilon": "200"}))
    truth = float(np.quantile([r[2] for r in rows], 0.5, method="inverted_cdf"))
    held, runs = 0, 60
    for _ in range(runs):
        result = s.execute("SELECT MEDIAN(age) FROM visits", fresh=True)
        ((interval,),) = result.accuracy
        assert isinstance(interval, tuple)
        lo, hi = interval
        (value,) = result.rows[0]
        assert lo <= value <= hi
        held += lo <= truth <= hi
    assert held >= runs - 5  # at coverage 0.95, 6 misses in 60 have probability < 0.04
    assert "[lo, hi] at 0.95 confidence" in summary(result)
    assert "±" not in cell(value, interval)
    notice = to_answer(result, 1000).notice
    assert notice is not None and "median in [" in notice.replace('"', "")


def test_every_order_statistic_releases_an_interval(tiny_policy: TinyPolicy) -> None:
    s = Session(tiny_policy(_rows(3000, 8)))
    sql = (
        "SELECT region, MEDIAN(age), QUANTILE_CONT(age, 0.9), MIN(age), MAX(age), COUNT(*) "
        "FROM visits GROUP BY region"
    )
    result = s.execute(sql)
    assert len(result.rows) == 5
    for row, accuracy in zip(result.rows, result.accuracy, strict=True):
        assert accuracy[0] is None  # the key
        for value, interval in zip(row[1:5], accuracy[1:5], strict=True):
            assert isinstance(interval, tuple) and interval[0] <= value <= interval[1]
        assert isinstance(accuracy[5], float)  # a count keeps its ±
    # MIN's interval starts at the grid's edge, MAX's ends there: the same in every group.
    assert len({a[3][0] for a in result.accuracy}) == 1
    assert len({a[4][1] for a in result.accuracy}) == 1
    # Served again from the cache, with the same intervals.
    again = s.execute(sql)
    assert again.charge is None and again.accuracy == result.accuracy
    # Another confidence is another interval: another release.
    assert s.execute(sql, confidence=0.8).charge is not None


# -- ESTIMATE BOUNDS: how many units each bound may cut ---------------------------------------


@pytest.mark.statistical
@pytest.mark.parametrize(
    "rule",
    [
        contribution_bounds.Rule(target=Fraction(1, 2)),
        contribution_bounds.Rule(quantile=Fraction(95, 100)),
    ],
    ids=["trade-off", "quantile"],
)
def test_an_estimates_at_most_holds_at_its_confidence(rule: contribution_bounds.Rule) -> None:
    """The real release on 5,000 units with Pareto(1.5) rows each, 300 times at epsilon 0.5:
    the units beyond the released row cap are at most the note's bound (the aim plus
    ``uncertainty``) in at least 95% of draws, less 3 standard errors."""
    rng = np.random.default_rng(11)
    n_rows = np.floor(1 + rng.pareto(1.5, 5000)).astype(int)
    values, counts = np.unique(n_rows, return_counts=True)
    rows = [(0, int(v), int(c)) for v, c in zip(values, counts, strict=True)]
    epsilon, runs = Fraction(1, 2), 300
    extra = contribution_bounds.uncertainty(epsilon, (), rule, CONFIDENCE)
    aim = 5000 * (1 - rule.quantile) if rule.quantile is not None else rule.units_beyond()
    held = 0
    for _ in range(runs):
        (cap,) = contribution_bounds.release(epsilon, (), rows, rule)
        held += int((n_rows > cap).sum()) <= aim + extra
    assert held / runs >= CONFIDENCE - 3 * math.sqrt(CONFIDENCE * (1 - CONFIDENCE) / runs)
    note = contribution_bounds.cuts((), [cap], rule, epsilon, CONFIDENCE)
    assert "at 0.95 confidence at most" in note
