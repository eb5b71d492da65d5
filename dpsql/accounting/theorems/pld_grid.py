"""Events as pessimistic privacy loss distributions on the grid of Google's ``dp_accounting``.

Numerics by ``dp_accounting`` (0.6): pessimistic PLDs (Meiser, Mohammadi 2018; Koskela, Jalko,
Honkela 2020; "connect the dots", Doroshenko, Ghazi, Kamath, Kumar, Manurangsi 2022) on a grid
of ``value_discretization_interval`` (every privacy loss rounded UP to a multiple of it, so
hockey-stick divergences are over-estimated, never under), composed by convolution with tails
of at most 1e-15 moved to an infinite loss.

Each event gives the form of its PLD (its map ``Event.pld``, ``dpsql.mechanisms.pld_forms``),
built here (``form_pld``):

* ``LatticeLoss`` (a discrete Laplace or Gaussian on one coordinate): its own PLD on the lattice
  of its losses (``pld_lattice``: exact pmfs, the shift proven to dominate every smaller one in
  both directions), put on the grid by "connect the dots" (``_on_grid``).
* ``LaplaceLoss`` (reference only): the one-dimensional Laplace PLD, as dp_accounting's
  LaplaceDpEvent.
* ``RangedLoss`` (the exponential mechanism): the least pair dominating every epsilon-BR
  mechanism (``ranged.py``; Dong, Durfee, Rogers 2020), put on the grid by connect-the-dots:
  valid for adaptively chosen exponential mechanisms, tighter than the pure-epsilon pair.
* ``PairLoss`` (pure, approximate and partition-selection events, a discrete Laplace or a
  calibrated discrete Gaussian on several coordinates): the dominating randomized-response PLD
  of the pair, put on the grid by connect-the-dots (``randomized_response_pld``).
* ``GaussianLoss`` (a continuous Gaussian) is never discretized: ``pld.py`` composes it in
  closed form (``gaussian_delta``). An event without a PLD makes the history unbounded.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.special import log_ndtr

from dpsql.accounting.theorems.base import as_pair
from dpsql.accounting.theorems.ranged import bounded_range_masses
from dpsql.mechanisms.events import Composite, Event
from dpsql.mechanisms.pld_forms import (
    GaussianLoss,
    LaplaceLoss,
    LatticeLoss,
    PairLoss,
    PldForm,
    RangedLoss,
)
from dpsql.mechanisms.pld_lattice import LatticePld

__all__ = [
    "PLD",
    "ROUND_UP",
    "event_pld",
    "exact_pld",
    "form_pld",
    "gaussian_delta",
    "gaussian_mu_squared",
    "lattice_pld",
    "nudged_up",
    "pld_steps",
    "pmf_arrays",
    "randomized_response_pld",
    "trimmed",
]

ROUND_UP = 1e-12
"""Relative upward nudge on float parameters and results (Fractions become floats here)."""

Floats = npt.NDArray[np.float64]
PLD = Any  # dp_accounting's PrivacyLossDistribution (untyped)


@functools.cache
def _dp_accounting() -> tuple[Any, Any]:
    """dp_accounting's PLD modules, imported on first use: with SciPy's signal package they take
    ~0.8 s, which every ``dpsql`` command would otherwise pay at start."""
    from dp_accounting.pld import pld_pmf, privacy_loss_distribution  # noqa: PLC0415

    return privacy_loss_distribution, pld_pmf


def nudged_up(x: Fraction | float) -> float:
    """``x`` as a float moved up by ``ROUND_UP`` (relative)."""
    return float(x) * (1 + ROUND_UP)


def gaussian_delta(epsilon: float | Floats, mu: float) -> Any:
    """delta(epsilon) of mu-GDP, exact (Balle, Wang 2018; Dong, Roth, Su 2019), rounded up."""
    x = np.asarray(epsilon, dtype=np.float64)
    first = np.exp(log_ndtr(-x / mu + mu / 2))
    second = np.exp(x + log_ndtr(-x / mu - mu / 2))
    return np.clip((first - second) * (1 + 1e-9), 0.0, 1.0)


def lattice_pld(event: Event) -> LatticePld | None:
    """The PLD of a discrete Laplace or Gaussian on one coordinate on the lattice of its losses
    (its map ``Event.pld`` gives a ``LatticeLoss``; up to 2.2e6 points: its users keep what they
    make of it), or None for any other event."""
    form = event.pld()
    return form.lattice() if isinstance(form, LatticeLoss) else None


def exact_pld(event: Event) -> bool:
    """Whether ``event`` enters the PLD as its own mechanism (not through an (epsilon, delta)
    pair): a continuous Gaussian, or a discrete mechanism with a lattice PLD."""
    form = event.pld()
    return form is not None and form.exact


def pld_steps(composite: Composite) -> list[Event]:
    """A query as the PLD composes it: its events when each has its own PLD (``exact_pld``:
    sequential composition holds of them as well as of the certified pair, and is tighter),
    else one step at its certified pair, as the other pair-composing theorems read it."""
    if all(exact_pld(e) for e in composite.events):
        return list(composite.events)
    return as_pair(composite)


def gaussian_mu_squared(event: Event) -> Fraction | None:
    """mu^2 of an event the PLD composes in closed form (a ``GaussianLoss``), else None."""
    form = event.pld()
    return form.mu_squared if isinstance(form, GaussianLoss) else None


def _on_grid(pld: LatticePld, interval: float) -> PLD:
    """``pld`` on dp_accounting's grid (multiples of ``interval``) by connect-the-dots, each
    mass split between the grid points around its exact loss towards the upper one
    (``pld_lattice`` docstring: pessimistic, composed too)."""
    grid = Fraction(interval)  # the float's exact value
    start, step = pld.offset / grid, pld.unit / grid
    den = start.denominator * step.denominator
    first, stride = start.numerator * step.denominator, step.numerator * start.denominator
    n = len(pld.masses)
    if max(abs(first), abs(first + stride * (n - 1)), den) < 2**62:
        nums = first + stride * np.arange(n, dtype=np.int64)
        cells, rests = np.divmod(nums, den)  # exact integer floor and remainder
        parts = rests.astype(np.float64) / float(den)
    else:
        pairs = [divmod(first + stride * i, den) for i in range(n)]
        cells = np.array([c for c, _ in pairs], dtype=np.int64)
        parts = np.array([r / den for _, r in pairs], dtype=np.float64)
    share = np.expm1(-parts * interval) / math.expm1(-interval)
    high = pld.masses * np.minimum(1.0, share * (1 + 1e-12))
    low = pld.masses * np.maximum(0.0, 1 - share * (1 - 1e-12))
    base = int(cells.min())
    size = int(cells.max()) - base + 2
    probs = np.asarray(np.bincount(cells - base, low, size), dtype=np.float64)
    probs += np.bincount(cells - base + 1, high, size)
    probs *= 1 + ROUND_UP  # the split's and the sums' few roundings
    masses = {base + i: float(p) for i, p in enumerate(probs) if p > 0}
    return _dp_accounting()[0].PrivacyLossDistribution.create_from_rounded_probability(
        masses, min(1.0, pld.infinity * (1 + ROUND_UP)), interval, pessimistic_estimate=True
    )


def event_pld(event: Event, interval: float) -> PLD | None:
    """A pessimistic PLD dominating ``event`` (not for Gaussian, composed in closed form), built
    from its map ``Event.pld``; None when it has none (the history is then unbounded)."""
    form = event.pld()
    return None if form is None else form_pld(form, interval)


def form_pld(form: PldForm, interval: float) -> PLD | None:
    """A pessimistic PLD of ``form`` on the grid of ``interval``; None for a Gaussian."""
    match form:
        case LatticeLoss():
            return _on_grid(form.lattice().fitted(1 << 16), interval)
        case LaplaceLoss():
            scale = float(form.scale) * (1 - ROUND_UP)
            return _dp_accounting()[0].from_laplace_mechanism(
                scale, nudged_up(form.sensitivity), value_discretization_interval=interval
            )
        case RangedLoss():
            masses, infinity = bounded_range_masses(nudged_up(form.epsilon), interval)
            return _dp_accounting()[0].PrivacyLossDistribution.create_from_rounded_probability(
                masses, infinity, interval, pessimistic_estimate=True
            )
        case PairLoss():
            delta = min(1.0, nudged_up(form.delta))
            return randomized_response_pld(nudged_up(form.epsilon), delta, interval)
    return None


def randomized_response_pld(epsilon: float, delta: float, interval: float) -> PLD:
    """The PLD of the pair that dominates every (epsilon, delta)-DP mechanism (KOV 2015, Theorem
    2.4): loss +-epsilon, and delta at infinity, put on the grid by "connect the dots".

    Each loss l between grid points g <= l <= g' is split into masses at g and g' with the same
    total under both distributions (P mass p, Q mass p e^-l): merging the two grid outcomes back
    gives the original pair, so the grid pair dominates it (post-processing) at every epsilon
    (Doroshenko et al. 2022). Rounding l up to g' instead (``from_privacy_parameters``) adds up
    to one interval to the mean loss per event, which k events accumulate.
    """
    upper = (1 - delta) / (1 + math.exp(-epsilon))
    masses: dict[int, float] = {}
    for loss, prob in ((epsilon, upper), (-epsilon, (1 - delta) - upper)):
        lo = math.floor(loss / interval)
        g_lo, g_hi = lo * interval, (lo + 1) * interval
        if g_lo > loss:  # float division may land one step high
            lo, g_lo, g_hi = lo - 1, g_lo - interval, g_lo
        # p_hi e^-g_hi + p_lo e^-g_lo = p e^-l  and  p_hi + p_lo = p
        share = (math.exp(-loss) - math.exp(-g_lo)) / (math.exp(-g_hi) - math.exp(-g_lo))
        share = min(1.0, max(0.0, share))
        masses[lo + 1] = masses.get(lo + 1, 0.0) + prob * share
        masses[lo] = masses.get(lo, 0.0) + prob * (1 - share)
    return _dp_accounting()[0].PrivacyLossDistribution.create_from_rounded_probability(
        masses, delta, interval, pessimistic_estimate=True
    )


def pmf_arrays(pmf: Any) -> tuple[Floats, Floats, float]:
    """Losses, probabilities and infinite mass of a dp_accounting PMF (dense or sparse)."""
    step = pmf._discretization  # private: dp_accounting 0.6 has no array accessor
    if isinstance(pmf, _dp_accounting()[1].DensePLDPmf):
        losses = (pmf._lower_loss + np.arange(len(pmf._probs))) * step
        return losses, np.asarray(pmf._probs, dtype=np.float64), float(pmf._infinity_mass)
    keys = sorted(pmf._loss_probs)
    probs = np.array([pmf._loss_probs[k] for k in keys], dtype=np.float64)
    return np.array(keys, dtype=np.float64) * step, probs, float(pmf._infinity_mass)


TRIM = 1e-15
"""Mass of the least likely losses moved to the infinite loss before a Gaussian is mixed in."""


def trimmed(losses: Floats, probs: Floats, inf_mass: float) -> tuple[Floats, Floats, float]:
    """The least likely losses, of total mass at most TRIM, moved to the infinite loss: each
    adds its whole mass to delta there, at least what it added before (every hockey stick is at
    most 1), so every delta is over-estimated, never under (pessimistic, as the composition's own
    tails). Most of a long composition's grid carries almost no mass: 19,241 points become 2,601
    for the 10,000-event mixed history of benchmarks/accountants.py."""
    order = np.argsort(probs, kind="stable")
    light = int(np.searchsorted(np.cumsum(probs[order]), TRIM, side="right"))
    if light == 0:
        return losses, probs, inf_mass
    keep = np.sort(order[light:])
    return losses[keep], probs[keep], inf_mass + float(probs[order[:light]].sum())
