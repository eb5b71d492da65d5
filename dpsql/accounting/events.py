"""Privacy events: what was sampled, with the parameters its guarantee follows from.

An event names the mechanism actually sampled (DESIGN.md section 1), so that any accountant can
recompute its loss later. Each event knows its own pure-DP / approximate-DP cost under basic
composition; the accountants of later modules read the same fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction


@dataclass(frozen=True)
class DiscreteLaplace:
    """Discrete Laplace noise with ``scale`` on an integer query of L1 ``sensitivity``.

    epsilon = sensitivity / scale (Ghosh, Roughgarden, Sundararajan 2009; Canonne, Kamath,
    Steinke 2020, section 2): the pmf ratio of shifted discrete Laplace distributions is at most
    exp(|shift| / scale).
    """

    scale: Fraction
    sensitivity: Fraction
    label: str = ""

    @property
    def epsilon(self) -> Fraction:
        return self.sensitivity / self.scale

    @property
    def delta(self) -> Fraction:
        return Fraction(0)


@dataclass(frozen=True)
class LaplacePartitionSelection:
    """Release of the groups whose discrete-Laplace count of distinct units reaches a threshold.

    (epsilon, delta)-DP with epsilon = sensitivity / scale (sensitivity = L0, the groups one unit
    may touch) and delta the tail mass of the groups that only one unit creates
    (DESIGN.md section 4; Korolova et al. 2009, Wilson et al. 2020 with the discrete tail).
    """

    scale: Fraction
    sensitivity: Fraction
    threshold: int
    delta_bound: Fraction
    label: str = "partition selection"

    @property
    def epsilon(self) -> Fraction:
        return self.sensitivity / self.scale

    @property
    def delta(self) -> Fraction:
        return self.delta_bound


Event = DiscreteLaplace | LaplacePartitionSelection


@dataclass(frozen=True)
class Composite:
    """The events of one query, released together: they compose sequentially."""

    events: tuple[Event, ...]

    @property
    def epsilon(self) -> Fraction:
        return sum((e.epsilon for e in self.events), Fraction(0))

    @property
    def delta(self) -> Fraction:
        return sum((e.delta for e in self.events), Fraction(0))

    def describe(self) -> list[str]:
        lines = []
        for e in self.events:
            if isinstance(e, DiscreteLaplace):
                lines.append(
                    f"DiscreteLaplace(scale={e.scale}, L1={e.sensitivity}) {e.label}: "
                    f"epsilon={e.epsilon}"
                )
            else:
                lines.append(
                    f"LaplacePartitionSelection(scale={e.scale}, L1={e.sensitivity}, "
                    f"threshold={e.threshold}): epsilon={e.epsilon}, delta={e.delta}"
                )
        return lines
