"""What an aggregate kind declares to planning and release: its :class:`AggregateRule`.

An aggregate kind is declared in two halves that meet on its name. The SQL it answers is its
entry in ``dpsql.sql.aggregates`` (the earlier stages read it there); the rest is its rule here:

* ``measure``: the measurements it needs, in the measurement kinds of ``dpsql.bound.specs``
  (``rows``, ``count``, ``sum``, ``centred``, ``centred_squares``, ``units``, ``distinct``,
  ``quantile``), added through a :class:`Builder` that shares them between the query's
  aggregates;
* ``estimator``: its released values and half-widths from the noisy measurements, vectorised
  over the released groups; post-processing of noisy values only (DESIGN.md section 2);
* ``weights``: each measurement's weight in the optimal split (``dpsql.plan.split``);
* ``binding``: what an accuracy target binds (``dpsql.plan.targets``): :class:`Linear`,
  :class:`Ratio` or :class:`Rank`, each giving the :class:`Check` figures a target bounds;
* ``total``: a total, released on a sample as an estimate of the whole table (times 1/q) when
  the analyst asks; ``exact``: released as a BIGINT when its one measurement counts in units
  of 1 and it is not so scaled;
* ``nonnegative``: whether its true value is at or above 0 on any data (a count; a sum of a
  value whose bounds are both at or above 0): its published value is then shown at 0 or above
  (``dpsql.release.post``), while the ledger, the cache and every derived answer keep the noisy
  measurement;
* ``bounds``: the range its estimate is clamped to (an AVG to its value's bounds), if any: a
  value whose interval spans it is flagged as mostly noise (``dpsql.release.post``);
* ``label``: how EXPLAIN's target lines name it, from ``{arg}`` and ``{p}``.

Every function here reads public numbers and noisy values only: the noise's parameters, the
grid, the confidence; never a count, sum or metadata of the data.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal, Protocol

import numpy.typing as npt
from sqlglot import exp

from dpsql.analyze.analysis import Aggregate
from dpsql.bound.grid import Grid
from dpsql.bound.specs import MeasurementSpec, ValueRole
from dpsql.plan.estimators import half_width
from dpsql.plan.plans import Estimate, Measurement
from dpsql.policy.numbers import decimal_text
from dpsql.sql.aggregates import AggregateKind


class Builder(Protocol):
    """The query's values and measurements, shared between its aggregates
    (``dpsql.plan.estimates``): each call returns the index of an equal one, or adds it."""

    def value(self, expr: exp.Expression, grid: Grid | None, role: ValueRole = "value") -> int:
        """The index of the row-level value ``expr`` (summed on ``grid`` if given)."""

    def measure(self, spec: MeasurementSpec) -> int:
        """The index of the measurement ``spec``."""

    @property
    def confidence(self) -> float:
        """The query's confidence (a quantile interval's coverage)."""


# (the aggregate, the query's builder) -> its estimate, its measurements added to the builder
Measure = Callable[[Aggregate, Builder], Estimate]
# (values, half-widths) over the released groups; a NaN half-width: none is released
Released = tuple[npt.NDArray[Any], npt.NDArray[Any]]
# (estimate, the plan's measurements, their noisy totals, confidence) -> what it releases
Estimator = Callable[[Estimate, Sequence[Measurement], Sequence[npt.ArrayLike], float], Released]
# estimate -> the optimal split's weight of each of its measurements, in its order
Weights = Callable[[Estimate], tuple[Fraction, ...]]
# estimate -> whether its true value is at or above 0 on any data (public: kind and bounds)
NonNegative = Callable[[Estimate], bool]
# estimate -> the range (lower, upper) its released value is clamped to, if any (public)
Bounds = Callable[[Estimate], "tuple[float, float] | None"]
# the measurements, with budgets under trial -> the figure a target bounds
Figure = Callable[[Sequence[Measurement]], "Fraction | float"]
# (estimate, the plan's measurements, their noisy totals) -> the interval (lows, highs) each
# released value's truth lies in with probability >= the confidence its measurements were drawn
# at, in value units (a quantile's: ``dpsql.plan.aggregates.quantiles``)
Intervals = Callable[[Estimate, Sequence[Measurement], Sequence[npt.ArrayLike]], Released]


@dataclass(frozen=True)
class Check:
    """One figure an accuracy target bounds: ``figure(measurements) <= goal``, the measurements
    being the plan's with each one's budget under trial. ``figure`` and ``goal`` are exact
    rationals where the figure is (a half-width in value units), floats where it is not."""

    label: str  # the aggregate, as EXPLAIN names it
    part: str | None  # the measurement, when the figure is one of the aggregate's several
    what: str
    measurements: tuple[int, ...]  # those the figure reads: scaled together when several
    figure: Figure
    goal: Fraction | float
    # What the figure reads besides its measurements (the rule, the grid, the confidence...):
    # two checks of one key on measurements alike need the same budget, solved once.
    key: tuple[object, ...] = ()


Setting = Literal["halfwidth", "rank_error"]


@dataclass(frozen=True)
class Goal:
    """What the setting that binds an aggregate asks of it: ``value`` (a half-width in value
    units, or a rank error in rows) at ``confidence``, in groups of at least ``min_group``
    units when the analyst states it."""

    value: Fraction
    min_group: int | None
    confidence: float


def _each_measurement(
    est: Estimate, label: str, ms: Sequence[Measurement], goal: Goal, factor: Fraction
) -> list[Check]:
    """A check on each measurement's exact noise half-width in value units, times ``factor``."""

    def figure(j: int) -> Figure:
        return lambda trial: half_width(trial[j], goal.confidence) * trial[j].unit * factor

    part = len(est.measurements) > 1
    return [
        Check(
            label,
            ms[j].label if part else None,
            "±",
            (j,),
            figure(j),
            goal.value,
            ("each", factor, goal.confidence),
        )
        for j in est.measurements
    ]


@dataclass(frozen=True)
class Linear:
    """``dpsql.halfwidth`` binds the released ± of an estimate that is ``factor`` times its one
    measurement: the measurement's exact half-width in value units, times ``factor``."""

    factor: Fraction = Fraction(1)
    setting: Setting = "halfwidth"

    def checks(
        self, est: Estimate, label: str, ms: Sequence[Measurement], goal: Goal
    ) -> list[Check]:
        return _each_measurement(est, label, ms, goal, abs(self.factor))


# (estimate, measurements, confidence, n) -> the largest ± the release computes in a group of
# at least n units (``dpsql.plan.aggregates.ratios``)
RatioWidth = Callable[[Estimate, Sequence[Measurement], float, int], float]


@dataclass(frozen=True)
class Ratio:
    """``dpsql.halfwidth`` binds each measurement of a ratio (a centred sum, a count...) in its
    own units as if released; with ``dpsql.min_group`` = n, the ± the release computes in any
    group of at least n units (``width``), its measurements scaled together."""

    width: RatioWidth
    setting: Setting = "halfwidth"
    # What ``width`` reads of the estimate's grid (all of it, unless a rule says less: a
    # variance's is the same on bounds shifted by a constant, so one solve serves them all).
    grid_key: Callable[[Grid], object] = repr

    def checks(
        self, est: Estimate, label: str, ms: Sequence[Measurement], goal: Goal
    ) -> list[Check]:
        n = goal.min_group
        if n is None:
            return _each_measurement(est, label, ms, goal, Fraction(1))

        def figure(trial: Sequence[Measurement]) -> float:
            return self.width(est, trial, goal.confidence, n)

        # Compared as floats: the width is one.
        assert est.grid is not None
        key = ("ratio", est.kind, self.grid_key(est.grid), n, goal.confidence)
        return [Check(label, None, f"± at >= {n} units", est.measurements, figure,
                      float(goal.value), key)]  # fmt: skip


@dataclass(frozen=True)
class Rank:
    """``dpsql.rank_error`` binds the rank error (rows) that the estimate's one measurement keeps
    with probability at least the confidence (``rank``)."""

    rank: Callable[[Measurement, float], float]
    setting: Setting = "rank_error"

    def checks(
        self, est: Estimate, label: str, ms: Sequence[Measurement], goal: Goal
    ) -> list[Check]:
        j = est.measurements[0]  # the quantile (its interval's endpoints follow it)

        def figure(trial: Sequence[Measurement]) -> float:
            return self.rank(trial[j], goal.confidence)

        key = ("rank", est.kind, goal.confidence)
        return [Check(label, None, "rank error (rows)", (j,), figure, goal.value, key)]


Binding = Linear | Ratio | Rank


@dataclass(frozen=True)
class AggregateRule:
    """The planning and release half of one aggregate kind (module docstring)."""

    kind: AggregateKind
    measure: Measure
    estimator: Estimator
    weights: Weights
    binding: Binding
    # "SUM({arg})": the aggregate's argument (or *), a quantile's order {p}, F(y, x)'s y {arg2}
    label: str
    total: bool = False
    exact: bool = False
    nonnegative: NonNegative = lambda est: False
    bounds: Bounds = lambda est: None
    interval: Intervals | None = None  # released instead of a half-width, when set

    def name(self, agg: Aggregate) -> str:
        """How EXPLAIN's target lines name ``agg``."""
        arg = agg.arg.sql("duckdb") if agg.arg is not None else "*"
        arg2 = agg.arg2.sql("duckdb") if agg.arg2 is not None else ""
        return self.label.format(arg=arg, arg2=arg2, p=decimal_text(agg.p or Fraction(0)))


__all__ = [
    "AggregateRule",
    "Binding",
    "Bounds",
    "Builder",
    "Check",
    "Estimator",
    "Goal",
    "Linear",
    "Measure",
    "NonNegative",
    "Rank",
    "Ratio",
    "RatioWidth",
    "Released",
    "Weights",
]
