"""The noise: from the bounded totals to the released noisy measurements.

``measure`` adds exact discrete Laplace or discrete Gaussian noise to each bounded total, runs
the exponential mechanism per group on a quantile's histogram, and keeps the groups partition
selection releases; ``check_samplable`` refuses, before the charge, noise the exact samplers
cannot draw. Everything after the noise is post-processing (DESIGN.md section 2): the estimates
and their half-widths by each aggregate kind's estimator (``dpsql.plan.aggregates``), the
released table in ``dpsql.release.post``.

The samplers are looked up as globals of this module at each draw, so a test that patches
``discrete_laplace`` or ``discrete_gaussian`` here reaches every noise ``measure`` adds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpsql.errors import BoundsError
from dpsql.mechanisms.gaussian import MAX_SIGMA2
from dpsql.mechanisms.laplace import MAX_SCALE
from dpsql.mechanisms.quantile_score import quantile_scores
from dpsql.noise.exponential import exponential_mechanism
from dpsql.noise.gaussian import discrete_gaussian
from dpsql.noise.laplace import discrete_laplace
from dpsql.plan.aggregates.quantiles import endpoint_shift
from dpsql.plan.plans import Diagnosis, Measurement, Plan

__all__ = ["Noisy", "check_samplable", "measure", "measure_diagnosis"]


def _noisy(totals: list[int], m: Measurement) -> list[int]:
    if m.scale is not None:
        noise = discrete_laplace(m.scale, len(totals))
    else:
        assert m.sigma2 is not None
        noise = discrete_gaussian(m.sigma2, len(totals))
    return [int(t) + int(z) for t, z in zip(totals, noise, strict=True)]


def _quantiles(histograms: list[Any], m: Measurement) -> list[int]:
    """Per group, the exponential mechanism over the grid candidates (Smith 2011), sampled
    exactly (Ilvento 2020): the chosen candidate, in grid units."""
    assert m.scale is not None and m.spec.p is not None
    grid = m.grid
    assert grid is not None
    gamma = 1 / (2 * m.scale)  # weights exp(-score/(2·scale)): epsilon = sensitivity/scale
    # An interval's end aims a public number of rows beyond the target (quantiles module).
    shift = m.spec.side * endpoint_shift(m) if m.spec.side else 0
    chosen = []
    for histogram in histograms:
        counts = {int(k): int(v) for k, v in (histogram or {}).items()}
        scores = quantile_scores(counts, grid.lower, grid.upper, m.spec.p, shift)
        chosen.append(grid.lower + exponential_mechanism(scores, gamma))
    return chosen


def check_samplable(plan: Plan) -> None:
    """Refuse, before any charge, noise the exact samplers cannot draw (sensitivities that huge
    come from extreme bounds or contribution limits, and would make useless answers)."""
    for m in plan.measurements:
        if _too_large(m):
            raise BoundsError(
                f"the noise of {m.label} would be too large to sample exactly; lower the bounds "
                "or the contribution limits"
            )
    # The diagnosis's histogram is charged in the same event: its noise too, before the charge.
    if plan.diagnosis is not None and _too_large(plan.diagnosis.measurement):
        raise BoundsError(
            "the noise of the diagnosis of the bounds would be too large to sample exactly; "
            "raise dpsql.diagnose_epsilon (or the query's epsilon), or SET dpsql.diagnose = off"
        )


def _too_large(m: Measurement) -> bool:
    return (m.scale is not None and m.scale > MAX_SCALE) or (
        m.sigma2 is not None and m.sigma2 > MAX_SIGMA2
    )


def measure(plan: Plan, rows: list[tuple[Any, ...]]) -> Noisy:
    """Add noise to the bounded totals, then keep the groups partition selection releases."""
    n_keys = len(plan.analysis.keys)
    keys = [[row[i] for row in rows] for i in range(n_keys)]
    noisy = [
        _quantiles([row[n_keys + j] for row in rows], m)
        if m.exponential
        else _noisy([int(row[n_keys + j] or 0) for row in rows], m)
        for j, m in enumerate(plan.measurements)
    ]
    if plan.selection is not None:
        units = noisy[plan.selection.measurement]
        keep = [j for j, u in enumerate(units) if u >= plan.selection.threshold]
        keys = [[col[j] for j in keep] for col in keys]
        noisy = [[col[j] for j in keep] for col in noisy]
    return Noisy(tuple(tuple(c) for c in keys), tuple(tuple(c) for c in noisy))


def measure_diagnosis(diagnosis: Diagnosis, rows: list[tuple[Any, ...]]) -> tuple[int, ...]:
    """The noisy histogram of the diagnosis: every one of its public 2^k cells, an empty one
    as 0, plus its noise (a histogram of L1 = L2 = 1: Dwork, McSherry, Nissim, Smith 2006)."""
    counts = [0] * diagnosis.cells
    for pattern, units in rows:
        counts[int(pattern)] = int(units)
    return tuple(_noisy(counts, diagnosis.measurement))


@dataclass(frozen=True)
class Noisy:
    """The released noisy measurements: group keys (one tuple per column) and, per measurement,
    the noisy integer total of each released group. This is what a cache keeps: everything
    after it is post-processing. ``derived`` lists the estimates computed from other
    measurements than their own (their half-width is not known)."""

    keys: tuple[tuple[Any, ...], ...]
    totals: tuple[tuple[int, ...], ...]
    derived: frozenset[int] = frozenset()
    # The noisy histogram of the diagnosis, one count per flag pattern (None: not diagnosed).
    diagnosis: tuple[int, ...] | None = None
