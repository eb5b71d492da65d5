"""Bounded range: the exponential mechanism under optimal composition and as a PLD.

**Bounded range** (Durfee, Rogers 2019; Dong, Durfee, Rogers 2020, "Optimal Differential Privacy
Composition for Exponential Mechanisms", ICML; DDR below). M is eps-BR when for all neighbours
x, x' and outcomes y, y'
    P[M(x) = y] / P[M(x') = y] <= e^eps P[M(x) = y'] / P[M(x') = y'],
that is, the privacy loss L(y) = ln(P[M(x) = y] / P[M(x') = y]) ranges over an interval of
width eps. eps-BR implies eps-DP, and eps-DP implies 2 eps-BR (DDR section 2.1).

**What dpsql samples.** A quantile draws candidate y with probability proportional to
exp(-s(y)/(2 scale)) (``dpsql.noise.measure``): with d(y) = s_x(y) - s_x'(y) in [-D, D] (D the
score's sensitivity per group, C rows times ``score_sensitivity``), ln of the ratio at y is
-d(y)/(2 scale) plus a constant (the normalisers), so it ranges over an interval of width at most
2D/(2 scale) = D/scale: the mechanism is (D/scale)-BR, and (D/scale)-DP (McSherry, Talwar 2007).
The quantile score is not monotone (adding one row raises the scores of candidates far above the
quantile and lowers the one on the row), so the width 2D is reached and nothing smaller holds.
The groups one unit touches are run independently on the same data: the ratio of ratios of their
joint outcome is the product of theirs, so their BR parameters add, like their epsilons. The
``Exponential`` event's epsilon (L1 sensitivity / scale) is therefore its BR parameter too.

**The worst case** (DDR section 4). The loss of an eps-BR pair ranges over [(t - 1) eps, t eps]
for some t in [0, 1] (E_Q[e^L] = 1 puts 0 inside), and such a pair is a post-processing of the
generalized randomized response RR_t: two outcomes with loss t eps and (t - 1) eps, of
probabilities p_t = (e^eps - e^{t eps})/(e^eps - 1) and 1 - p_t under P (Q is fixed by the loss).

**Optimal composition, homogeneous and fixed in advance** (DDR Theorem 3, ICML numbering; the
non-adaptive setting). k eps-BR mechanisms fixed in advance compose to
    delta(eps_g) = max_t delta_t(eps_g),  delta_t the hockey stick of the k-fold RR_t,
and the maximum is over t*_l = (eps_g/eps + l + 1)/(k + 1), l = 0, ..., k - 1, with t*_l < 1.
Why (re-derived here, which is what the code relies on): for i outcomes of loss t eps, the total
loss is (i - k(1 - t)) eps, so on the interval of t where the contributing i are i >= m = k - l,
d delta_t/dt has the sign of (k + 1) t eps - eps_g - (k - m + 1) eps: delta_t peaks at t*_l,
which lies inside that interval. At t*_l the first contributing loss exceeds eps_g by exactly
(1 - t*_l) eps, so
    delta_l = sum_{j=0}^{l} C(k, m + j) p^{m+j} (1 - p)^{l-j} (1 - e^{-(j + 1 - t*_l) eps}).
Adaptively chosen exponential mechanisms can lose more (DDR section 6): this is a figure for
queries fixed before the first answer, which is what "as if fixed in advance" says.

**The PLD: the least pair that dominates every eps-BR mechanism.** A single mechanism's profile
is sup_t delta_t(e) = (e^{eps/2} - e^{e/2})^2 / (e^eps - 1) for 0 <= e <= eps (the sup is at
t = (e/eps + 1)/2), and 0 above. The pair with that profile (the convex hull of the RR_t
trade-off curves, so it dominates each of them, Dong, Roth, Su 2019, Prop. 2.12) has the
density p(l) = e^{(eps + l)/2} / (2 (e^eps - 1)) on (-eps, eps) under P, and is symmetric
(swapping x and x' maps t to 1 - t). Every eps-BR mechanism is dominated by it whatever the
neighbours, so composing it is valid for adaptively chosen mechanisms of fixed parameters (Dong,
Roth, Su 2019, Theorem 3.2): it is the pessimistic PLD of the exponential mechanism.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
from scipy.special import gammaln, logsumexp

from dpsql.errors import ParameterError

__all__ = [
    "bounded_range_masses",
    "br_delta",
    "br_epsilon",
    "envelope_delta",
    "rr_t_probability",
]

_Floats = npt.NDArray[np.float64]
_ULP = 2.0**-52

WINDOW_SIGMAS = 10.0
"""Binomial terms summed beyond the mode, in standard deviations; the rest is bounded by a
geometric series (rigorous), so this sets only the work, never the soundness."""

CELLS = 2_000_000
"""Largest (rows x terms) block evaluated at once."""


def rr_t_probability(epsilon: float, t: float) -> tuple[float, float]:
    """P-probabilities (p_t, 1 - p_t) of RR_t's outcomes with loss t eps and (t - 1) eps (DDR
    section 4), in the forms free of cancellation: e^{t eps} expm1((1-t) eps) / expm1(eps) and
    expm1(t eps) / expm1(eps)."""
    scale = math.expm1(epsilon)
    return math.exp(t * epsilon) * math.expm1((1 - t) * epsilon) / scale, (
        math.expm1(t * epsilon) / scale
    )


def _log_expm1(y: _Floats | float) -> _Floats:
    """log(e^y - 1) for y > 0, without overflow for large y."""
    y = np.asarray(y, dtype=np.float64)
    big = y > 30
    large, small = np.where(big, y, 31.0), np.where(big, 1.0, y)
    return np.asarray(np.where(big, large + np.log1p(-np.exp(-large)), np.log(np.expm1(small))))


def _slack(k: int, log_p: _Floats, log_q: _Floats) -> float:
    """A relative upward nudge above the float error of the log-space sums: every term is a sum
    of three gammaln values (each <= gammaln(k + 1)), i log p and (k - i) log(1 - p) (i <= k) and
    one log1p-type term, each accurate to a few ulps of its magnitude; 64 ulps of the total
    magnitude, plus the logsumexp and ROUND_UP, bound the relative error of each delta_l."""
    size = 3 * float(gammaln(k + 1)) + k * float(np.max(np.abs(log_p) + np.abs(log_q))) + 64
    return math.exp(64 * _ULP * size) * (1 + 1e-12)


class _Rows:
    """The candidates l of DDR Theorem 3 at one eps_g (module docstring): t*_l, log p, log(1 - p),
    the first contributing count m = k - l, the window of terms summed, and an upper bound of each
    delta_l that costs O(1), so that only the rows that may hold the maximum are summed."""

    def __init__(self, epsilon: float, k: int, epsilon_total: float):
        self.epsilon, self.k = epsilon, k
        x = epsilon_total / epsilon
        ells = np.arange(k, dtype=np.float64)
        self.ells = ells = ells[ells + x < k]  # t*_l < 1
        # t*_l in floats, kept below 1: delta_t is flat at its peak, so the rounding of t costs
        # a second-order amount, far inside the slack
        self.t = t = np.minimum((x + ells + 1) / (k + 1), 1 - _ULP)
        scale = float(_log_expm1(epsilon))
        self.log_p = t * epsilon + _log_expm1((1 - t) * epsilon) - scale  # P(loss t eps)
        self.log_q = _log_expm1(t * epsilon) - scale  # P(loss (t - 1) eps)
        self.m = m = k - ells
        p = np.exp(self.log_p)
        mode = np.floor((k + 1) * p)
        sigma = np.sqrt(k * p * np.exp(self.log_q))
        # Terms j = 0..last: up to past the mode by WINDOW_SIGMAS deviations, at most l.
        room = np.maximum(0.0, mode - m) + np.ceil(WINDOW_SIGMAS * sigma + 32)
        self.last = np.minimum(ells, room)
        whole = np.arange(k + 1, dtype=np.float64)
        self.log_binom = gammaln(k + 1) - gammaln(whole + 1) - gammaln(k - whole + 1)
        self.slack = _slack(k, self.log_p, self.log_q) if len(ells) else 1.0
        self.bound = self._bound()

    def _log_pmf(self, i: npt.NDArray[np.int64], rows: npt.NDArray[np.intp]) -> _Floats:
        """log of C(k, i) p^i (1 - p)^{k - i}: P-mass of i outcomes of loss t eps (RR_t^k)."""
        log_p, log_q = self.log_p[rows], self.log_q[rows]
        if i.ndim == 2:
            log_p, log_q = log_p[:, None], log_q[:, None]
        return np.asarray(self.log_binom[i] + i * log_p + (self.k - i) * log_q, np.float64)

    def _ratio(self, i: npt.NDArray[np.int64], rows: npt.NDArray[np.intp]) -> _Floats:
        """pmf(i + 1)/pmf(i) = (k - i) p / ((i + 1)(1 - p)), decreasing in i."""
        return np.asarray(
            (self.k - i) / (i + 1) * np.exp(self.log_p[rows] - self.log_q[rows]), np.float64
        )

    def _bound(self) -> _Floats:
        """delta_l <= pmf(m) sum_j r^j min(1, (j + 1 - t) eps), r = r(m) when r < 1 (the pmf
        falls at least geometrically past the mode, and 1 - e^-y <= min(1, y)): the smaller of
        pmf(m)/(1 - r) and pmf(m) eps ((1 - t)/(1 - r) + r/(1 - r)^2). Else 1."""
        rows = np.arange(len(self.ells))
        m = self.m.astype(np.int64)
        r = self._ratio(m, rows)
        falling = r < 1
        r = np.where(falling, r, 0.0)
        geometric = 1 / (1 - r)
        weighted = self.epsilon * ((1 - self.t) * geometric + r * geometric**2)
        pmf = np.exp(self._log_pmf(m, rows))
        # (1 + 1e-9): room for the float error of 1/(1 - r) near r = 1, so that pruning by the
        # bound never drops the row that holds the maximum
        bound = pmf * np.minimum(geometric, weighted) * (1 + 1e-9)
        return np.asarray(np.where(falling, bound, 1.0) * self.slack, np.float64)

    def exact(self, rows: npt.NDArray[np.intp]) -> _Floats:
        """delta_l of ``rows``, rounded up: the window summed in log space, and the terms past
        it bounded by pmf(i0)/(1 - r(i0)) (i0 > mode: a geometric series)."""
        last = self.last[rows]
        j = np.arange(int(last.max()) + 1)
        inside = j[None, :] <= last[:, None]
        i = np.minimum(self.m[rows].astype(np.int64)[:, None] + j[None, :], self.k)
        # C(k, i) p^i (1 - p)^{k - i} (1 - e^{-(j + 1 - t) eps}): P-mass of the outcome times
        # its hockey-stick factor at eps_g, whose loss exceeds eps_g by (j + 1 - t) eps
        log_terms = self._log_pmf(i, rows) + np.log(
            -np.expm1(-(j[None, :] + 1 - self.t[rows, None]) * self.epsilon)
        )
        log_terms[~inside] = -np.inf
        out = np.exp(logsumexp(log_terms, axis=1))
        cut = last < self.ells[rows]
        if cut.any():
            i0 = (self.m[rows][cut] + last[cut] + 1).astype(np.int64)
            tail = np.exp(self._log_pmf(i0, rows[cut]))
            out[cut] += tail / (1 - np.minimum(self._ratio(i0, rows[cut]), 1 - 1e-12))
        return np.asarray(out * self.slack, np.float64)

    def largest(self) -> float:
        """max_l delta_l (rounded up), summing only the rows whose bound exceeds the best sum
        found so far, in decreasing order of their bounds."""
        order = np.argsort(-self.bound, kind="stable")
        width = int(self.last.max()) + 1 if len(order) else 1
        best, start, size = 0.0, 0, 8
        while start < len(order):
            batch = order[start : start + size]
            batch = batch[self.bound[batch] > best]
            if len(batch) == 0:
                break
            best = max(best, float(self.exact(batch).max()))
            start, size = start + size, max(1, CELLS // width)
        return min(1.0, best)


def br_delta(epsilon: float, k: int, epsilon_total: float) -> float:
    """DDR 2020 Theorem 3: the optimal delta at ``epsilon_total`` of k epsilon-BR mechanisms
    fixed in advance (rounded up; 1 for a negative ``epsilon_total``, a trivial bound)."""
    if k < 0 or epsilon < 0:
        raise ParameterError("br_delta needs k >= 0 and epsilon >= 0")
    if epsilon_total < 0:
        return 1.0
    if k == 0 or epsilon == 0:
        return 0.0
    return _Rows(epsilon, k, epsilon_total).largest()


def _root(delta_at: Callable[[float], float], delta: float, lo: float, hi: float) -> float:
    """Smallest epsilon in (lo, hi] (to 1e-12 relative) with delta_at(epsilon) <= delta, given
    delta_at(lo) > delta >= delta_at(hi) and delta_at non-increasing: the Illinois method on
    log delta, with a bisection whenever three steps have not halved the bracket. Every
    comparison is made on the rounded-up delta_at itself, so the answer meets it exactly."""
    target = math.log(delta)

    def gap(eps: float) -> tuple[float, bool]:
        d = delta_at(eps)
        return (math.log(d) - target if d > 0 else -math.inf), d > delta

    g_lo, g_hi = gap(lo)[0], gap(hi)[0]
    side, widths = 0, [math.inf] * 3
    while hi - lo > 1e-12 * max(1.0, hi):
        width = hi - lo
        c = (lo + hi) / 2
        if math.isfinite(g_hi) and g_lo > g_hi and width <= widths[-3] / 2:
            c = hi - g_hi * width / (g_hi - g_lo)  # false position on log delta
            c = min(max(c, lo + 1e-3 * width), hi - 1e-3 * width)
        widths.append(width)
        g_c, above = gap(c)
        if above:
            lo, g_lo = c, g_c
            g_hi = g_hi / 2 if side < 0 else g_hi  # Illinois: the end kept twice moves in
            side = -1
        else:
            hi, g_hi = c, g_c
            g_lo = g_lo / 2 if side > 0 else g_lo
            side = 1
    return hi


def br_epsilon(
    epsilon: float,
    k: int,
    delta: float,
    bracket: tuple[float, float] | None = None,
) -> float:
    """The smallest epsilon_total with br_delta(epsilon, k, epsilon_total) <= delta (DDR 2020
    Theorem 3, fixed in advance). ``bracket``: optional (lo, hi) known to hold the answer (KOV
    at epsilon/2 and at epsilon: RR_{1/2} is one eps-BR pair, and eps-BR implies eps-DP)."""
    if k < 0 or epsilon < 0:
        raise ParameterError("br_epsilon needs k >= 0 and epsilon >= 0")
    if k == 0 or epsilon == 0 or br_delta(epsilon, k, 0.0) <= delta:
        return 0.0
    top = k * epsilon * (1 + 1e-9)  # no loss exceeds k eps: delta is 0 there
    if delta <= 0:
        return top
    known: dict[float, float] = {}

    def delta_at(eps: float) -> float:
        if eps not in known:
            known[eps] = br_delta(epsilon, k, eps)
        return known[eps]

    if bracket is None:
        # eps-BR is eps^2/8-zCDP (Cesar, Rogers 2021), and rho-zCDP gives (rho + 2 sqrt(rho
        # ln(1/delta)), delta) (Bun, Steinke 2016, Proposition 1.3): a first upper end, checked
        rho = k * epsilon * epsilon / 8
        hi = min(top, rho + 2 * math.sqrt(rho * math.log(1 / delta)))
        bracket = (hi / 2, hi)
    lo, hi = bracket
    if not lo < hi <= top or delta_at(hi) > delta:
        hi = top
    if not 0 < lo < hi or delta_at(lo) <= delta:
        lo = 0.0
    return _root(delta_at, delta, lo, hi)


def envelope_delta(epsilon: float, epsilon_total: float) -> float:
    """One eps-BR mechanism's worst delta at ``epsilon_total`` >= 0: sup_t of RR_t's, attained at
    t = (epsilon_total/epsilon + 1)/2 (module docstring), (e^{eps/2} - e^{e/2})^2/(e^eps - 1)."""
    if epsilon_total >= epsilon:
        return 0.0
    log_half = float(_log_expm1((epsilon - epsilon_total) / 2)) + epsilon_total / 2
    return math.exp(2 * log_half - float(_log_expm1(epsilon)))


def bounded_range_masses(epsilon: float, interval: float) -> tuple[dict[int, float], float]:
    """The least pair dominating every ``epsilon``-BR mechanism (module docstring: P-density
    e^{(eps + l)/2} / (2 (e^eps - 1)) on (-eps, eps)), on the grid of ``interval`` by connect
    the dots: the mass of each loss l in a cell [g, g'] is split between g and g' keeping its P-
    and Q-mass (share e^{-l} - e^{-g} over e^{-g'} - e^{-g} at g'), so merging the grid points
    back gives the pair (post-processing) and every hockey stick is over-estimated, never under
    (Doroshenko, Ghazi, Kamath, Kumar, Manurangsi 2022). Returns the masses by grid index and
    the infinite mass (the float deficit, if any; each mass is nudged up by 1e-12)."""
    if not epsilon > 0 or not interval > 0:
        raise ParameterError("bounded_range_masses needs epsilon > 0 and interval > 0")
    first = math.floor(-epsilon / interval)
    last = math.ceil(epsilon / interval)
    c = 1 / (4 * math.sinh(epsilon / 2))  # density c e^{l/2}: e^{eps/2} / (2 (e^eps - 1))
    down = -math.expm1(-interval)  # e^{-g} - e^{-g'} over e^{-g}
    masses: dict[int, float] = {}
    for j in range(first, last):
        g = j * interval
        u0, u1 = max(-epsilon, g) - g, min(epsilon, g + interval) - g
        if u1 <= u0:
            continue
        # integral of c e^{(g + u)/2} over the cell's part [u0, u1]
        total = 2 * c * math.exp((g + u0) / 2) * math.expm1((u1 - u0) / 2)
        # the part moved up: integral of c e^{(g + u)/2} (1 - e^{-u}) / (1 - e^{-h}) du
        cosh_gap = 2 * math.sinh((u1 + u0) / 4) * math.sinh((u1 - u0) / 4)
        up = min(total, 4 * c * math.exp(g / 2) * cosh_gap / down)
        # Rounding errors may only add mass (a larger mass raises every hockey stick).
        masses[j] = masses.get(j, 0.0) + max(0.0, total - up) * (1 + 1e-12)
        masses[j + 1] = masses.get(j + 1, 0.0) + up * (1 + 1e-12)
    infinity = max(0.0, 1.0 - math.fsum(masses.values()))
    return masses, infinity
