"""Privacy curves of single events: Renyi DP, (approximate) zCDP and Gaussian DP.

Each function dispatches on the event types of ``dpsql.mechanisms.events`` and returns a bound
that the cited theorem proves for that one mechanism; accountants compose them. Figures are
exact where the mechanism's curve is known in closed form, and otherwise a proven upper bound.

Approximate events (``ApproxDP``, ``LaplacePartitionSelection``, ``ZCDP`` with delta_zcdp > 0)
have no finite RDP; they are *delta-approximately* RDP/zCDP (Bun, Steinke 2016, Definition 8.1):
each output distribution is (1 - delta) P + delta E with P, Q (the good parts on the two
neighbours) satisfying the RDP bound. Their deltas add under composition (Bun, Steinke 2016,
Lemma 8.3) and a final conversion at delta' gives (epsilon, delta' + sum delta): since
M(x)(S) <= (1-d) P(S) + d <= (1-d)(e^eps Q(S) + delta') + d <= e^eps M(x')(S) + delta' + d.

L1 sensitivity over several groups (a GROUP BY with L0 > 1): the Laplace curves below are for a
one-dimensional shift of ``sensitivity``; they also bound any vector of shifts with that L1 norm
because each curve is superadditive in the shift (convex with value 0 at 0), checked in
tests/accounting/test_accounting_properties.py.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Sequence
from decimal import Decimal, localcontext
from fractions import Fraction
from functools import lru_cache

import numpy as np
from scipy.special import gammaln, logsumexp

from dpsql.mechanisms.conversions import frac_up, round_up
from dpsql.mechanisms.events import (
    ZCDP,
    ApproxDP,
    DiscreteGaussian,
    DiscreteLaplace,
    Event,
    Exponential,
    Gaussian,
    Laplace,
    LaplacePartitionSelection,
    PureDP,
    SubsampledGaussian,
)

__all__ = [
    "GroupCache",
    "approx_rdp",
    "gdp_mu",
    "gdp_mu_squared",
    "pure_dp_rdp",
    "rdp",
    "subsampled_rdp",
    "zcdp",
]


def pure_dp_rdp(epsilon: float, alpha: float) -> float:
    """RDP of any epsilon-DP mechanism: min(eps, alpha eps^2/2). epsilon-DP implies
    (eps^2/2)-zCDP (Bun, Steinke 2016, Proposition 3.3) and D_alpha <= D_inf = eps."""
    return min(epsilon, round_up(alpha * epsilon * epsilon / 2))


def _expm1_minus_identity(y: float) -> float:
    """e^y - 1 - y without cancellation (Taylor series for |y| < 1/2); always >= 0."""
    if abs(y) >= 0.5:
        return math.expm1(y) - y
    term, total = y * y / 2, 0.0
    for k in range(3, 40):
        total += term
        term *= y / k
    return total


def laplace_rdp(epsilon: float, alpha: float) -> float:
    """Exact RDP of the continuous Laplace mechanism with epsilon = sensitivity/scale (Mironov
    2017, Proposition 6 / Table II):
    ln(alpha/(2a-1) e^((a-1)eps) + (a-1)/(2a-1) e^(-a eps))/(a-1), a = alpha. Writing
    e^y = 1 + y + f(y), the first-order terms cancel exactly and the argument of the log is
    1 + (a f((a-1)eps) + (a-1) f(-a eps))/(2a-1) with f >= 0: no cancellation left."""
    if (alpha - 1) * epsilon > 1:
        # The first term dominates: factor it out (no overflow, no cancellation).
        rest = math.log1p((alpha - 1) / alpha * math.exp(-(2 * alpha - 1) * epsilon))
        correction = (math.log(alpha / (2 * alpha - 1)) + rest) / (alpha - 1)
        return min(epsilon, round_up(epsilon + correction))
    f_plus = _expm1_minus_identity((alpha - 1) * epsilon)
    f_minus = _expm1_minus_identity(-alpha * epsilon)
    inner = (alpha * f_plus + (alpha - 1) * f_minus) / (2 * alpha - 1)
    return min(epsilon, round_up(math.log1p(inner) / (alpha - 1)))


@lru_cache(maxsize=65536)
def discrete_laplace_rdp(scale: Fraction, shift: int, alpha: float) -> float:
    """Exact D_alpha(P || P shifted by ``shift``) for the discrete Laplace P(z) ~ q^|z|,
    q = exp(-1/scale), in closed form. Summing q^(alpha|z| + (1-alpha)|z-k|) over z <= 0,
    0 < z < k and z >= k gives, with c = (1-q)/(1+q) and r = q^(2 alpha - 1),
    S = c [q^((1-alpha)k)/(1-q) + q^(alpha k)/(1-q) + q^((1-alpha)k) r (1 - r^(k-1))/(1 - r)],
    D_alpha = ln S/(alpha - 1). Evaluated with 50-digit decimals (ln S is a small difference of
    large terms). The divergence is symmetric (reflect z -> k - z), so one direction suffices."""
    with localcontext() as ctx:
        ctx.prec, ctx.Emax, ctx.Emin = 50, 999_999_999, -999_999_999
        t = Decimal(scale.numerator) / Decimal(scale.denominator)
        a, k = Decimal(alpha), shift
        q = (-1 / t).exp()
        log_r = -(2 * a - 1) / t
        low = ((a - 1) * k / t).exp()  # q^((1 - alpha) k)
        r = log_r.exp()
        middle = low * r * (1 - (log_r * (k - 1)).exp()) / (1 - r) if k > 1 else Decimal(0)
        total = (1 - q) / (1 + q) * ((low + (-a * k / t).exp()) / (1 - q) + middle)
        value = float(total.ln() / (a - 1))
    return round_up(value)


def subsampled_rdp(rate: Fraction, rho: Fraction, alpha: float) -> float:
    """An upper bound on the RDP at ``alpha`` of a rho-zCDP mechanism (RDP alpha·rho at every
    order) on a Poisson sample at ``rate``: the general bound of Zhu and Wang 2019 (Poisson
    Subsampled RDP, Theorem 6) at the integer order a = max(2, ceil(alpha)),

        (1/(a-1)) log[(1-q)^(a-1)(a q - q + 1) + C(a,2) q^2 (1-q)^(a-2) e^eps(2)
                      + 3 sum_{l=3}^{a} C(a,l) (1-q)^(a-l) q^l e^((l-1) eps(l))],

    which bounds the order alpha too (RDP does not decrease with the order, van Erven and
    Harremoes 2014), and never above the unsampled alpha·rho. q and rho rounded up (the bound
    grows with both), the sum in logs, the result nudged up."""
    q, r = frac_up(rate), frac_up(rho)
    unsampled = round_up(alpha * r)
    if q >= 1:
        return unsampled
    a = max(2, math.ceil(alpha))
    log_q, log_1q = math.log(q), math.log1p(-q)
    ls = np.arange(3, a + 1, dtype=np.float64)
    log_binom = gammaln(a + 1) - gammaln(ls + 1) - gammaln(a - ls + 1)
    terms = [
        (a - 1) * log_1q + math.log1p(q * (a - 1)),
        float(gammaln(a + 1) - gammaln(3) - gammaln(a - 1)) + 2 * log_q + (a - 2) * log_1q + 2 * r,
    ]
    rest = math.log(3) + log_binom + (a - ls) * log_1q + ls * log_q + (ls - 1) * ls * r
    total = float(logsumexp(np.concatenate((np.array(terms), rest))))
    return min(round_up(total / (a - 1)), unsampled)


def rdp(event: Event, alpha: float) -> float:
    """RDP of ``event`` at order ``alpha`` > 1; ``math.inf`` for approximate events (their
    curve is ``approx_rdp``)."""
    value, delta = approx_rdp(event, alpha)
    return value if delta == 0 else math.inf


def approx_rdp(event: Event, alpha: float) -> tuple[float, float]:
    """(RDP at ``alpha``, delta) of ``event`` as delta-approximate RDP (module docstring)."""
    if isinstance(event, Gaussian):
        # alpha mu^2/2 exactly (Mironov 2017, Proposition 7).
        return round_up(alpha * frac_up(gdp_mu_squared(event)) / 2), 0.0
    if isinstance(event, DiscreteGaussian | ZCDP):
        # rho-zCDP means RDP alpha rho at every order (Bun, Steinke 2016, Definition 1.1); the
        # discrete Gaussian is exactly rho = Delta^2/(2 sigma^2)-zCDP (CKS 2020, Theorem 14).
        rho, delta = zcdp(event)
        return round_up(alpha * frac_up(rho)), frac_up(delta)
    if isinstance(event, Laplace):
        return laplace_rdp(frac_up(event.epsilon), alpha), 0.0
    if isinstance(event, DiscreteLaplace | LaplacePartitionSelection):
        eps = frac_up(event.epsilon)
        # Integer-valued noise moves by integer shifts only: ceil(sensitivity) is the largest.
        exact = discrete_laplace_rdp(event.scale, math.ceil(event.sensitivity), alpha)
        return min(exact, pure_dp_rdp(eps, alpha)), frac_up(event.delta)
    if isinstance(event, Exponential):
        # Bounded range: epsilon-DP exponential mechanism is eps^2/8-zCDP (Cesar, Rogers 2021).
        eps = frac_up(event.epsilon)
        return min(eps, round_up(alpha * eps * eps / 8)), 0.0
    if isinstance(event, SubsampledGaussian):
        # Its rho on a Poisson sample: Zhu and Wang's bound, exact (no delta).
        return subsampled_rdp(event.rate, event.rho, alpha), 0.0
    if isinstance(event, PureDP | ApproxDP):
        # (eps, delta)-DP is delta-approximately (eps^2/2)-zCDP (Bun, Steinke 2016, Prop. 3.3
        # and Section 8); with delta = 0 this is pure DP.
        return pure_dp_rdp(frac_up(event.epsilon), alpha), frac_up(event.delta)
    raise TypeError(f"no Renyi curve for {type(event).__name__}")


def gdp_mu_squared(event: Gaussian) -> Fraction:
    """mu^2 = (sensitivity/sigma)^2 as an exact rational of the floats given."""
    return Fraction(event.sensitivity) ** 2 / Fraction(event.sigma) ** 2


def zcdp(event: Event) -> tuple[Fraction, Fraction]:
    """(rho, delta): ``event`` is delta-approximately rho-zCDP; exact rationals, so that a rho
    budget fills exactly (two charges of rho 1/4 fit a budget of 1/2)."""
    if isinstance(event, Gaussian):
        # N(0, sigma^2) with L2 sensitivity Delta is (Delta^2/2 sigma^2)-zCDP (Bun, Steinke 2016,
        # Proposition 1.6).
        return gdp_mu_squared(event) / 2, Fraction(0)
    if isinstance(event, DiscreteGaussian):
        return event.rho, Fraction(0)  # exact (Canonne, Kamath, Steinke 2020, Theorem 14)
    if isinstance(event, ZCDP):
        return event.rho, event.delta_zcdp
    if isinstance(event, SubsampledGaussian):
        # Subsampling never raises a Renyi divergence (joint convexity: both directions of a
        # mixture with the neighbour's distribution), so the query's rho holds, delta 0.
        return event.rho, Fraction(0)
    if isinstance(event, Exponential):
        return event.epsilon**2 / 8, Fraction(0)  # Cesar, Rogers 2021
    if isinstance(event, DiscreteLaplace | Laplace | PureDP | ApproxDP | LaplacePartitionSelection):
        # (eps, delta)-DP => delta-approximately (eps^2/2)-zCDP (Bun, Steinke 2016, Prop. 3.3).
        return event.epsilon**2 / 2, event.delta
    raise TypeError(f"no zCDP bound for {type(event).__name__}")


def gdp_mu(event: Event) -> float | None:
    """mu (rounded up) if ``event`` is exactly mu-GDP (the continuous Gaussian, Dong, Roth, Su
    2019, Theorem 2.7); None otherwise. The discrete Gaussian is NOT dominated by the continuous
    Gaussian of the same sigma (at sigma 1 and delta 1e-9 it needs epsilon 6.32, not 6.17)."""
    if isinstance(event, Gaussian):
        return round_up(math.sqrt(frac_up(gdp_mu_squared(event))))
    return None


class GroupCache:
    """``grouped(history)`` for a history that grows by appending, as in the proxy: the counts
    of the last history seen are kept, and a call whose history starts with it (compared
    element by element, so any change is noticed) only counts the new events. Thread-safe.

    ``extra`` events are counted on top without being remembered (a filter's candidate query,
    which may be refused)."""

    def __init__(self) -> None:
        self._prefix: list[Event] = []
        self._counts: Counter[Event] = Counter()
        self._lock = threading.Lock()

    def __call__(
        self, history: Sequence[Event], extra: Sequence[Event] = ()
    ) -> list[tuple[Event, int]]:
        with self._lock:
            n = len(self._prefix)
            if len(history) >= n and list(history[:n]) == self._prefix:
                rest = history[n:]
            else:
                self._prefix, self._counts, rest = [], Counter(), history
            self._counts.update(rest)
            self._prefix.extend(rest)
            counts = self._counts.copy() if extra else self._counts
            counts.update(extra)
            return list(counts.items())
