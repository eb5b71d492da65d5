"""The events of selection: the exponential mechanism (quantiles over a grid) and partition
selection (private group keys). Each carries its privacy maps (``dpsql.mechanisms.events``)
beside its proof."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from dpsql.mechanisms.conversions import frac_up
from dpsql.mechanisms.curves import bounded_range_rdp
from dpsql.mechanisms.events import Event, parameter_text
from dpsql.mechanisms.laplace_events import discrete_laplace_renyi
from dpsql.mechanisms.pld_forms import PldForm, RangedLoss

__all__ = ["Exponential", "LaplacePartitionSelection"]


@dataclass(frozen=True)
class Exponential(Event):
    """The exponential mechanism with a utility of sensitivity 1: epsilon-DP and, having
    bounded range, epsilon^2/8-zCDP (Cesar, Rogers 2021).

    Its epsilon is its bounded-range parameter too (Dong, Durfee, Rogers 2020), the class the
    optimal composition and the PLD read it in (``dpsql.accounting.theorems.ranged``)."""

    epsilon: Fraction
    label: str = field(default="", compare=False)

    @property
    def delta(self) -> Fraction:
        return Fraction(0)

    def zcdp(self) -> tuple[Fraction, Fraction]:
        return self.epsilon**2 / 8, Fraction(0)  # Cesar, Rogers 2021

    def renyi(self, alpha: float) -> tuple[float, Fraction]:
        return bounded_range_rdp(frac_up(self.epsilon), alpha), Fraction(0)

    def pld(self) -> PldForm:
        # The least pair dominating every epsilon-BR mechanism: valid for adaptively chosen
        # exponential mechanisms, tighter than the pure-epsilon randomized response.
        return RangedLoss(self.epsilon)

    def bounded_range(self) -> Fraction:
        return self.epsilon


@dataclass(frozen=True)
class LaplacePartitionSelection(Event):
    """Release of the groups whose discrete-Laplace count of distinct units reaches a threshold.

    (epsilon, delta)-DP with epsilon = sensitivity / scale (sensitivity = L0, the groups one unit
    may touch) and delta the tail mass of the groups that only one unit creates
    (DESIGN.md section 4; Korolova et al. 2009, Wilson et al. 2020 with the discrete tail).
    The released counts of the groups that exist on both sides are a discrete Laplace with this
    scale and sensitivity, so apart from ``delta`` it is that mechanism: delta-approximately
    the discrete Laplace's RDP.
    """

    scale: Fraction
    sensitivity: Fraction
    threshold: int
    delta_bound: Fraction
    label: str = field(default="partition selection", compare=False)

    @property
    def epsilon(self) -> Fraction:
        return self.sensitivity / self.scale

    @property
    def delta(self) -> Fraction:
        return self.delta_bound

    def parameters(self) -> str:
        n = parameter_text
        return (
            f"LaplacePartitionSelection(scale={n(self.scale)}, L1={n(self.sensitivity)}, "
            f"threshold={n(self.threshold)}, delta={n(self.delta_bound)})"
        )

    def renyi(self, alpha: float) -> tuple[float, Fraction]:
        return discrete_laplace_renyi(self.scale, self.sensitivity, self.epsilon, alpha), self.delta
