"""The Laplace family's events: the discrete Laplace dpsql samples, the continuous one for
reference. Each carries its privacy maps (``dpsql.mechanisms.events``) beside its proof."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

from dpsql.mechanisms import pld_lattice
from dpsql.mechanisms.conversions import frac_up
from dpsql.mechanisms.curves import discrete_laplace_rdp, laplace_rdp, pure_dp_rdp
from dpsql.mechanisms.events import Event, parameter_text
from dpsql.mechanisms.pld_forms import LaplaceLoss, LatticeLoss, PairLoss, PldForm

__all__ = ["DiscreteLaplace", "Laplace", "discrete_laplace_renyi"]


@dataclass(frozen=True)
class DiscreteLaplace(Event):
    """Discrete Laplace noise with ``scale`` on an integer query of L1 ``sensitivity``.

    Pure DP with epsilon = sensitivity / scale (Ghosh, Roughgarden, Sundararajan 2009; Canonne,
    Kamath, Steinke 2020, section 2): shifted pmfs differ by at most exp(|shift| / scale).
    ``dimensions``: how many coordinates one unit may move (L0); None where it was not recorded
    (ledgers written before it was), when only a sensitivity of at most 1 proves one coordinate.
    """

    scale: Fraction
    sensitivity: Fraction
    label: str = field(default="", compare=False)
    dimensions: int | None = None

    @property
    def epsilon(self) -> Fraction:
        return self.sensitivity / self.scale

    @property
    def delta(self) -> Fraction:
        return Fraction(0)

    def parameters(self) -> str:
        n = parameter_text
        return f"DiscreteLaplace(scale={n(self.scale)}, L1={n(self.sensitivity)})"

    def renyi(self, alpha: float) -> tuple[float, Fraction]:
        return discrete_laplace_renyi(self.scale, self.sensitivity, self.epsilon, alpha), self.delta

    def pld(self) -> PldForm:
        """Its own PLD on the lattice of its losses when one unit moves one coordinate (a
        sensitivity of at most 1, or ``dimensions == 1``; ``pld_lattice``). With several
        coordinates the shift may be spread over them, for which the 1-D PLD is not proven to
        dominate: pure epsilon-DP (randomized response dominates it, KOV 2015)."""
        one = self.sensitivity <= 1 or self.dimensions == 1
        shift = math.ceil(self.sensitivity)  # integer measurements: |shift| <= floor, ceil safe
        if one and 1 <= shift <= pld_lattice.MAX_SENSITIVITY:
            return LatticeLoss("laplace", self.scale, shift)
        return PairLoss(self.epsilon, Fraction(0))


def discrete_laplace_renyi(
    scale: Fraction, sensitivity: Fraction, epsilon: Fraction, alpha: float
) -> float:
    """RDP at ``alpha`` of discrete Laplace noise of ``scale`` on a shift of ``sensitivity``:
    its exact divergence (integer-valued noise moves by integer shifts only, ceil(sensitivity)
    the largest), never above the pure-epsilon bound."""
    exact = discrete_laplace_rdp(scale, math.ceil(sensitivity), alpha)
    return min(exact, pure_dp_rdp(frac_up(epsilon), alpha))


@dataclass(frozen=True)
class Laplace(Event):
    """Continuous Laplace noise (reference and tests only: dpsql never samples it)."""

    scale: Fraction
    sensitivity: Fraction
    label: str = field(default="", compare=False)

    @property
    def epsilon(self) -> Fraction:
        return self.sensitivity / self.scale

    @property
    def delta(self) -> Fraction:
        return Fraction(0)

    def parameters(self) -> str:
        return f"Laplace(scale={parameter_text(self.scale)}, L1={parameter_text(self.sensitivity)})"

    def renyi(self, alpha: float) -> tuple[float, Fraction]:
        # Exact (Mironov 2017, Proposition 6).
        return laplace_rdp(frac_up(self.epsilon), alpha), self.delta

    def pld(self) -> PldForm:
        return LaplaceLoss(self.scale, self.sensitivity)
