"""Privacy curves of single mechanisms, as functions of their parameters.

Each function is a bound that the cited theorem proves for one mechanism; the events of
``dpsql.mechanisms.events`` call them from their privacy maps (``Event.renyi``) and accountants
compose what the events answer. Figures are exact where the mechanism's curve is known in closed
form, and otherwise a proven upper bound.

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
from decimal import Decimal, localcontext
from fractions import Fraction
from functools import lru_cache

import numpy as np
from scipy.special import gammaln, logsumexp

from dpsql.mechanisms.conversions import frac_up, round_up

__all__ = [
    "bounded_range_rdp",
    "discrete_laplace_rdp",
    "laplace_rdp",
    "pure_dp_rdp",
    "subsampled_rdp",
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


def bounded_range_rdp(epsilon: float, alpha: float) -> float:
    """RDP at ``alpha`` of an epsilon-bounded-range mechanism (the exponential mechanism):
    min(eps, alpha eps^2/8), since it is eps^2/8-zCDP (Cesar, Rogers 2021) and D_alpha <= eps."""
    return min(epsilon, round_up(alpha * epsilon * epsilon / 8))
