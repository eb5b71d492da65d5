"""Events known by the guarantee they state rather than by their noise: any epsilon-DP or
(epsilon, delta)-DP mechanism, and a query on a Poisson sample of the units. Their privacy maps
are the defaults of ``dpsql.mechanisms.events.Event`` (derived from the stated pair), except where
a sharper theorem is cited."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from dpsql.mechanisms.curves import subsampled_rdp
from dpsql.mechanisms.events import Event, parameter_text

__all__ = ["ApproxDP", "PureDP", "SubsampledGaussian"]


@dataclass(frozen=True)
class PureDP(Event):
    """Any epsilon-DP mechanism."""

    epsilon: Fraction
    label: str = field(default="", compare=False)

    @property
    def delta(self) -> Fraction:
        return Fraction(0)


@dataclass(frozen=True)
class ApproxDP(Event):
    """Any (epsilon, delta)-DP mechanism."""

    epsilon: Fraction
    delta: Fraction
    label: str = field(default="", compare=False)

    def parameters(self) -> str:
        n = parameter_text
        return f"ApproxDP(epsilon={n(self.epsilon)}, delta={n(self.delta)})"


@dataclass(frozen=True)
class SubsampledGaussian(ApproxDP):
    """A query whose measurements are all discrete Gaussians, rho-zCDP in total, run on a
    Poisson sample of the units at ``rate`` (``dpsql.plan.sample``). ``epsilon`` and ``delta``
    are the amplified pair of the query's certified pair (Balle, Barthe, Gaboardi 2018), which
    the accountants that compose pairs read, as for any ApproxDP; the RDP filter reads the
    subsampled curve of its rho (``curves.subsampled_rdp``, Zhu and Wang 2019), the zCDP filter
    its rho (subsampling never raises a Renyi divergence: joint convexity)."""

    rate: Fraction = Fraction(0)
    rho: Fraction = Fraction(0)

    def parameters(self) -> str:
        n = parameter_text
        return (
            f"SubsampledGaussian(rate={n(self.rate)}, rho={n(self.rho)}, "
            f"epsilon={n(self.epsilon)}, delta={n(self.delta)})"
        )

    def zcdp(self) -> tuple[Fraction, Fraction]:
        # Subsampling never raises a Renyi divergence (joint convexity: both directions of a
        # mixture with the neighbour's distribution), so the query's rho holds, delta 0.
        return self.rho, Fraction(0)

    def renyi(self, alpha: float) -> tuple[float, Fraction]:
        # Its rho on a Poisson sample: Zhu and Wang's bound, exact (no delta).
        return subsampled_rdp(self.rate, self.rho, alpha), Fraction(0)
