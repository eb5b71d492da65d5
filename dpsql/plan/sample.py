"""Amplification by subsampling: the loss of a query run on a unit-level Poisson sample.

A mechanism that is (epsilon, delta)-DP under add/remove of one unit, run on a Poisson sample
that keeps each unit independently with probability q, is (ln(1 + q(e^epsilon - 1)),
q·delta)-DP under add/remove (Balle, Barthe, Gaboardi 2018, Theorem 8; Li, Qardaji, Su 2012).
The query's whole composed event is amplified at once, never its measurements one by one: all
of them and any partition selection read the same sample (at q = 0.01, two epsilon = 1
measurements amplified separately would give 2·0.0170 = 0.034, the joint event
ln(1 + 0.01(e² - 1)) = 0.062: amplifying the parts would undercharge).

(epsilon, delta) is the query's own pair as charged unsampled: its certified pair (the
Gaussians' summed rho through CKS Corollary 13, or the discrete Gaussian's exact curve) or the
sum of its parts (basic composition). The amplified query is one ``ApproxDP`` event (``PureDP``
when delta is 0; ``SubsampledGaussian`` when its measurements are all discrete Gaussians, whose
rho the RDP filter reads through Zhu and Wang's subsampled curve, ``curves.subsampled_rdp``),
which every filter composes as any (epsilon, delta)-DP mechanism: basic
composition adds it, the advanced, optimal and PLD accountants read its pair, and the RDP and
zCDP filters its delta-approximate (epsilon²/2)-zCDP curve (Bun, Steinke 2016, Prop. 3.3); the
GDP filter refuses it, as every event but a continuous Gaussian. The declared-mechanism PLD
filter admits only its declared mechanism, so it refuses a sample.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from dpsql.analyze.sample import implemented
from dpsql.errors import InternalError
from dpsql.mechanisms.conversions import frac_up, round_up
from dpsql.mechanisms.events import Composite, Event, joint_zcdp
from dpsql.mechanisms.stated_events import ApproxDP, PureDP, SubsampledGaussian
from dpsql.policy.numbers import decimal_text, decimal_up

__all__ = ["Sample", "amplified", "amplified_epsilon"]


def amplified_epsilon(epsilon: Fraction, rate: Fraction) -> Fraction:
    """ln(1 + q(e^epsilon - 1)), rounded up (to six digits, after a float margin)."""
    if epsilon == 0:
        return Fraction(0)
    exact = math.log1p(frac_up(rate) * math.expm1(frac_up(epsilon)))
    return decimal_up(round_up(exact), 6)


@dataclass(frozen=True)
class Sample:
    """A query's sample: the rate asked, the rate implemented (k/2^64) and charged, and the
    query's own loss before amplification (what EXPLAIN shows beside the amplified one)."""

    asked: Fraction
    rate: Fraction
    epsilon: Fraction
    delta: Fraction

    def explain(self) -> list[str]:
        return [
            f"sample: each unit kept with probability {float(self.rate):.10g} (asked "
            f"{decimal_text(self.asked)}; the threshold k/2^64 rounded up), all its rows or "
            "none, by SHA-256 keyed with a fresh secret per run, before any bound",
            f"sample: the query's own loss epsilon {decimal_text(self.epsilon)}, delta "
            f"{decimal_text(self.delta)}, amplified as one event to ln(1 + q(e^epsilon - 1)), "
            "q·delta (Balle, Barthe, Gaboardi 2018, Theorem 8)",
        ]


def amplified(event: Composite, asked: Fraction) -> tuple[Composite, Sample]:
    """The query's event on a Poisson sample at ``asked`` (charged at the implemented rate)."""
    rate = implemented(asked)
    epsilon, delta = event.epsilon, event.delta
    label = f"Poisson sample at q = {float(rate):.6g} of a query of epsilon {float(epsilon):.6g}"
    # Never above the query's own loss (the rounding up could pass it as q nears 1).
    eps = min(amplified_epsilon(epsilon, rate), epsilon)
    if not 0 < rate < 1:
        raise InternalError("a sample's rate is in (0, 1)")
    inner: Event
    joint = joint_zcdp(event.events)
    gaussian = bool(event.events) and all(e.targeted for e in event.events)
    if gaussian and joint is not None and joint[1] == 0 and delta > 0:
        # Only Gaussians calibrated on their curves, rho-zCDP in total (CKS 2020, Theorem 14;
        # zCDP composes): the RDP filter reads the subsampled curve of that rho, the others
        # the pair.
        inner = SubsampledGaussian(eps, rate * delta, label, rate=rate, rho=joint[0])
    elif delta == 0:
        inner = PureDP(eps, label)
    else:
        inner = ApproxDP(eps, rate * delta, label)
    return Composite((inner,), None, event.cell), Sample(asked, rate, epsilon, delta)
