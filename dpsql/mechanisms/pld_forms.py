"""What an event's privacy loss distribution is built from: its PLD map's value.

An event's ``pld()`` (``dpsql.mechanisms.events``) names one of a few forms, each the data from
which the PLD accountant (``dpsql.accounting.theorems.pld_grid``) builds a pessimistic PLD, so
that a new kind of event chooses a form and the PLD code needs no change:

* ``GaussianLoss``: a continuous Gaussian, exactly mu-GDP (Dong, Roth, Su 2019). Never
  discretized: Gaussians compose in closed form (sum of mu^2) and mix with the rest exactly.
* ``LatticeLoss``: a discrete Laplace or Gaussian on one coordinate, on the lattice of its own
  losses (``pld_lattice``: exact pmfs, the shift proven to dominate every smaller one).
* ``LaplaceLoss``: the continuous Laplace's PLD (reference only: dpsql never samples it).
* ``RangedLoss``: the least pair dominating every epsilon-bounded-range mechanism (Dong, Durfee,
  Rogers 2020; ``dpsql.accounting.theorems.ranged``).
* ``PairLoss``: the randomized-response pair that dominates every (epsilon, delta)-DP mechanism
  (Kairouz, Oh, Viswanath 2015, Theorem 2.4): the form of last resort.

``exact``: the form is the mechanism's own privacy loss, not a pair that dominates it (a query
calibrated jointly reads as its events under the PLD only when each has an exact form).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import ClassVar, Literal

from dpsql.mechanisms import pld_lattice
from dpsql.mechanisms.pld_lattice import LatticePld

__all__ = ["GaussianLoss", "LaplaceLoss", "LatticeLoss", "PairLoss", "PldForm", "RangedLoss"]


@dataclass(frozen=True)
class GaussianLoss:
    """N(0, sigma^2) with L2 sensitivity Delta: mu^2 = (Delta/sigma)^2, composed by summing."""

    mu_squared: Fraction
    exact: ClassVar[bool] = True


@dataclass(frozen=True)
class LatticeLoss:
    """One coordinate shifted by at most ``shift`` under discrete noise: ``noise`` is the
    discrete Laplace's scale or the discrete Gaussian's variance."""

    kind: Literal["laplace", "gaussian"]
    noise: Fraction
    shift: int
    exact: ClassVar[bool] = True

    def lattice(self) -> LatticePld:
        """The PLD on the lattice of its losses (up to 2.2e6 points: its users keep it)."""
        if self.kind == "laplace":
            return pld_lattice.discrete_laplace_pld(self.noise, self.shift)
        return pld_lattice.discrete_gaussian_pld(self.noise, self.shift)


@dataclass(frozen=True)
class LaplaceLoss:
    """The continuous Laplace of ``scale`` on a shift of ``sensitivity``."""

    scale: Fraction
    sensitivity: Fraction
    exact: ClassVar[bool] = False


@dataclass(frozen=True)
class RangedLoss:
    """An ``epsilon``-bounded-range mechanism (the exponential mechanism's class)."""

    epsilon: Fraction
    exact: ClassVar[bool] = False


@dataclass(frozen=True)
class PairLoss:
    """Any (``epsilon``, ``delta``)-DP mechanism, through its dominating pair."""

    epsilon: Fraction
    delta: Fraction
    exact: ClassVar[bool] = False


PldForm = GaussianLoss | LatticeLoss | LaplaceLoss | RangedLoss | PairLoss
