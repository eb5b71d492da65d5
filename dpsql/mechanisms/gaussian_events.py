"""The Gaussian family's events: the discrete Gaussian dpsql samples, the continuous one for
reference, and approximate zCDP. Each carries its privacy maps (``dpsql.mechanisms.events``)
beside its proof.

All three are ``targeted``: the (epsilon, delta) they state is the point the planner calibrated
them to, and their cost is their own curve (``profile``), which ``events.basic_pair`` never lets
the stated pair undercut; several of them are certified jointly through their summed rho.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

from dpsql.mechanisms import pld_lattice
from dpsql.mechanisms.conversions import (
    discrete_gaussian_delta,
    frac_down,
    frac_up,
    gdp_delta,
    round_up,
    zcdp_to_delta,
)
from dpsql.mechanisms.events import EXACT_CURVE_MAX_SIGMA2, Event, parameter_text
from dpsql.mechanisms.pld_forms import GaussianLoss, LatticeLoss, PairLoss, PldForm

__all__ = ["ZCDP", "DiscreteGaussian", "Gaussian"]


def _target(epsilon: Fraction, delta: Fraction) -> tuple[Fraction, Fraction] | None:
    """A Gaussian is never pure DP: only a calibrated pair with delta > 0 is a guarantee."""
    return (Fraction(epsilon), Fraction(delta)) if epsilon > 0 and delta > 0 else None


@dataclass(frozen=True)
class DiscreteGaussian(Event):
    """Discrete Gaussian noise N_Z(0, sigma2) on each of ``dimensions`` integer coordinates,
    where one unit shifts each coordinate by at most ``sensitivity`` (so L2 <= sqrt(dimensions)
    times it; ``dimensions`` is L0, the groups one unit may touch).

    rho-zCDP with rho = dimensions * sensitivity^2 / (2 sigma2), exactly, for any integer shift
    (Canonne, Kamath, Steinke 2020, Theorem 14 and zCDP composition over coordinates). With one
    coordinate its (epsilon, delta) curve is its own (Theorem 7), not the continuous Gaussian's.
    ``target_epsilon``/``target_delta``: the (epsilon, delta) it was calibrated to, if alone.
    """

    sigma2: Fraction
    sensitivity: Fraction
    target_epsilon: Fraction = Fraction(0)
    target_delta: Fraction = Fraction(0)
    label: str = field(default="", compare=False)
    dimensions: int = 1
    targeted = True

    @property
    def rho(self) -> Fraction:
        return self.dimensions * self.sensitivity**2 / (2 * self.sigma2)

    @property
    def epsilon(self) -> Fraction:
        return self.target_epsilon

    @property
    def delta(self) -> Fraction:
        return self.target_delta

    def parameters(self) -> str:
        n = parameter_text
        return (
            f"DiscreteGaussian(sigma^2={n(self.sigma2)}, shift<={n(self.sensitivity)} on "
            f"{self.dimensions} coordinate(s), rho={n(self.rho)})"
        )

    def approx_dp(self) -> tuple[Fraction, Fraction] | None:
        return _target(self.target_epsilon, self.target_delta)

    def _one_coordinate(self, epsilon: float) -> float:
        # Its own curve (CKS 2020, Theorem 7), at the lowest variance float; a non-integer
        # sensitivity goes up to the next integer shift.
        return discrete_gaussian_delta(frac_down(self.sigma2), math.ceil(self.sensitivity), epsilon)

    def profile(self, epsilon: float) -> float:
        if self.dimensions == 1:
            return self._one_coordinate(epsilon)
        # Several coordinates: no one-dimensional curve applies; its exact rho and the CKS
        # conversion (Corollary 13) do (DESIGN.md section 3).
        return zcdp_to_delta(frac_up(self.rho), epsilon)

    def exact_curve(self, epsilon: float) -> float | None:
        if self.dimensions != 1 or self.sigma2 > EXACT_CURVE_MAX_SIGMA2:
            return None  # the calibration takes the zCDP route there too
        return self._one_coordinate(epsilon)

    def zcdp(self) -> tuple[Fraction, Fraction]:
        return self.rho, Fraction(0)  # exact (Canonne, Kamath, Steinke 2020, Theorem 14)

    def renyi(self, alpha: float) -> tuple[float, Fraction]:
        # rho-zCDP is RDP alpha rho at every order (Bun, Steinke 2016, Definition 1.1).
        return round_up(alpha * frac_up(self.rho)), Fraction(0)

    def pld(self) -> PldForm | None:
        """Its own PLD on the lattice of its losses on one coordinate (``pld_lattice``, up to
        its largest variance); else its calibrated pair, if it has one."""
        one = self.sensitivity <= 1 or self.dimensions == 1
        shift = math.ceil(self.sensitivity)  # integer measurements: |shift| <= floor, ceil safe
        small = self.sigma2 <= pld_lattice.MAX_SIGMA2
        if one and small and 1 <= shift <= pld_lattice.MAX_SENSITIVITY:
            return LatticeLoss("gaussian", self.sigma2, shift)
        pair = self.approx_dp()
        return None if pair is None else PairLoss(*pair)


@dataclass(frozen=True)
class Gaussian(Event):
    """Continuous Gaussian noise N(0, sigma^2) with L2 ``sensitivity`` (reference and tests).

    Exactly mu-GDP with mu = sensitivity / sigma (Dong, Roth, Su 2019).
    """

    sigma: float
    sensitivity: float
    target_epsilon: Fraction = Fraction(0)
    target_delta: Fraction = Fraction(0)
    label: str = field(default="", compare=False)
    targeted = True

    @property
    def mu(self) -> float:
        return self.sensitivity / self.sigma

    @property
    def epsilon(self) -> Fraction:
        return self.target_epsilon

    @property
    def delta(self) -> Fraction:
        return self.target_delta

    def parameters(self) -> str:
        n = parameter_text
        return f"Gaussian(sigma={n(self.sigma)}, L2={n(self.sensitivity)})"

    def approx_dp(self) -> tuple[Fraction, Fraction] | None:
        return _target(self.target_epsilon, self.target_delta)

    def gdp_mu_squared(self) -> Fraction:
        """mu^2 = (sensitivity/sigma)^2 as an exact rational of the floats given."""
        return Fraction(self.sensitivity) ** 2 / Fraction(self.sigma) ** 2

    def _mu_up(self) -> float:
        """mu rounded up: N(0, sigma^2) is exactly mu-GDP (Dong, Roth, Su 2019, Theorem 2.7)."""
        return round_up(math.sqrt(frac_up(self.gdp_mu_squared())))

    def profile(self, epsilon: float) -> float:
        return gdp_delta(self._mu_up(), epsilon)  # the exact mu-GDP profile (DRS 2019, Cor 2.13)

    def exact_curve(self, epsilon: float) -> float:
        return self.profile(epsilon)

    def zcdp(self) -> tuple[Fraction, Fraction]:
        # L2 sensitivity Delta: (Delta^2/2 sigma^2)-zCDP (Bun, Steinke 2016, Proposition 1.6).
        return self.gdp_mu_squared() / 2, Fraction(0)

    def renyi(self, alpha: float) -> tuple[float, Fraction]:
        # alpha mu^2/2 exactly (Mironov 2017, Proposition 7).
        return round_up(alpha * frac_up(self.gdp_mu_squared()) / 2), Fraction(0)

    def pld(self) -> PldForm:
        # Composed in closed form, never discretized (Dong, Roth, Su 2019, Corollary 3.3).
        return GaussianLoss(Fraction(self.mu) ** 2)


@dataclass(frozen=True)
class ZCDP(Event):
    """Approximate zCDP: rho-zCDP except with probability ``delta_zcdp`` (Bun, Steinke 2016).
    It gives a curve, not one (epsilon, delta) pair: no ``approx_dp``, no PLD."""

    rho: Fraction
    delta_zcdp: Fraction = Fraction(0)
    target_epsilon: Fraction = Fraction(0)
    label: str = field(default="", compare=False)
    targeted = True

    @property
    def epsilon(self) -> Fraction:
        return self.target_epsilon

    @property
    def delta(self) -> Fraction:
        return self.delta_zcdp

    def parameters(self) -> str:
        return f"zCDP(rho={parameter_text(self.rho)}, delta={parameter_text(self.delta_zcdp)})"

    def approx_dp(self) -> None:
        return None

    def profile(self, epsilon: float) -> float:
        # The conversion's delta plus the additive delta (Bun, Steinke 2016, section 8).
        return zcdp_to_delta(frac_up(self.rho), epsilon) + frac_up(self.delta_zcdp)

    def zcdp(self) -> tuple[Fraction, Fraction]:
        return self.rho, self.delta_zcdp

    def renyi(self, alpha: float) -> tuple[float, Fraction]:
        return round_up(alpha * frac_up(self.rho)), self.delta_zcdp
