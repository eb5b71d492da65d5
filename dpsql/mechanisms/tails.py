"""A sound confidence half-width for a linear combination of independent discrete noises.

S = Σ_k a_k Z_k, each Z_k an independent discrete Laplace of scale t (pmf ∝ exp(-|z|/t)) or
discrete Gaussian N_Z(0, σ²) (pmf ∝ exp(-z²/(2σ²))), as released by the consistency step of
:mod:`dpsql.plan.workload.least_squares`. The returned h guarantees P(|S| ≤ h) ≥ confidence.

Chernoff: for every λ > 0, P(S ≥ h) ≤ e^{-λh} E[e^{λS}] = exp(K(λ) - λh), K(λ) = Σ_k log M_k(λa_k)
(Markov's inequality on e^{λS}; independence factors the MGF), and S is symmetric, so
P(|S| ≥ h) ≤ 2 exp(K(λ) - λh). Coverage holds as soon as K(λ) - λh ≤ log(miss/2), miss =
1 - confidence, i.e. for h(λ) = (K(λ) + log(2/miss))/λ at ANY λ > 0 in the MGFs' domain: the
search over λ only tightens the bound, and an imprecise minimum stays sound. (This is the
bisection on h of the textbook form solved in closed form for each λ; h(λ) is quasi-convex,
because λK'(λ) - K(λ) is nondecreasing for convex K, so a bounded golden-section/Brent search
on log λ finds its minimum.)

* Discrete Laplace: M(u) = (1-p)² / ((1 - p e^u)(1 - p e^{-u})), p = e^{-1/t}, for |u| < 1/t
  (the geometric series Σ_z p^|z| e^{uz}, normalised by (1-p)/(1+p)).
* Discrete Gaussian: M(u) ≤ exp(u²σ²/2): N_Z(0, σ²) is σ-sub-Gaussian (Canonne, Kamath and
  Steinke, "The Discrete Gaussian for Differential Privacy", NeurIPS 2020, arXiv:2004.00010).

Near-exact, for discrete Laplace terms (``_convolved``): each term rounded to a fine grid δZ,
the rounded sum's distribution computed by FFT convolution, and h read from it plus K·δ/2 for
the rounding, a bound on the float error and a Chernoff bound on what wraps around the grid:
within about 1% of the exact quantile where Chernoff is 1.4-1.9 times it. The smallest of the
bounds that apply is returned.

Floating point: h(λ) is evaluated with expm1/log1p so that no term loses precision; its
relative error is below 1e-12 while λ stays at least 1e-6 (relatively) inside the Laplace
poles, far below the ``_MARGIN`` of 1e-9 by which the result is enlarged. Two exact
tightenings keep soundness: with one term the answer is also at most |a| times the exact
half-width of :mod:`dpsql.noise.samplers` (always the tighter one); and S lies on the lattice
gZ, g the gcd of the rational coefficients, so P(|S| ≤ h) = P(|S| ≤ g·floor(h/g)).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt
from scipy.fft import next_fast_len
from scipy.optimize import minimize_scalar

from dpsql.errors import ParameterError
from dpsql.mechanisms.gaussian import discrete_gaussian_half_width, discrete_gaussian_pmf
from dpsql.mechanisms.laplace import discrete_laplace_half_width

FloatArray = npt.NDArray[np.float64]

_MARGIN = 1e-9
"""Relative enlargement of the Chernoff half-width, far above its float evaluation error."""

_POLE_GAP = 1e-6
"""λ stays below (1 - _POLE_GAP) times the nearest Laplace pole 1/(t·|a|)."""

_CUT = 1e-7
"""The dominant term's values beyond the cut, of mass at most this fraction of the miss rate,
are counted as if they all missed."""

_LEAST_TAIL = 1e-15
"""The smallest cut tail: 1 - tail must stay below 1.0 in floats (a wider cut only loosens)."""

_BINS = 4000
"""Most bins of the dominant term's values (a bin's mass is bounded by its size times its
largest pmf, so wide bins only loosen the bound)."""

_SLACK = 1e-15
"""Absolute slack on a computed miss probability (summation error of ~4000 positive terms)."""

_BISECT = 1e-6
"""Relative precision of the bisection on h (the bracket's upper end is returned)."""

_SPAN = 1e6
"""The λ search spans this factor either side of the Gaussian-approximation optimum."""


@dataclass(frozen=True)
class Noise:
    """One noise of the combination: a discrete Laplace of ``scale`` t or a discrete Gaussian
    of variance parameter ``sigma2`` (exactly one is set, a positive Fraction)."""

    scale: Fraction | None = None
    sigma2: Fraction | None = None

    def __post_init__(self) -> None:
        if (self.scale is None) == (self.sigma2 is None):
            raise ParameterError("a noise needs exactly one of scale and sigma2")
        value = self.scale if self.scale is not None else self.sigma2
        if not isinstance(value, Fraction) or value <= 0:
            raise ParameterError("a noise parameter must be a positive fractions.Fraction")

    def variance(self) -> float:
        """Var(Z): 2p/(1-p)² for the discrete Laplace, at most σ² for the discrete Gaussian."""
        if self.scale is not None:
            rate = 1 / float(self.scale)
            return 2 * math.exp(-rate) / math.expm1(-rate) ** 2
        assert self.sigma2 is not None
        return float(self.sigma2)


def _log_mass_zero(rate: float) -> float:
    # log P(Z = 0) = log((1 - p)/(1 + p)), p = e^-rate, for the discrete Laplace (CKS 2020).
    return math.log(-math.expm1(-rate)) - math.log1p(math.exp(-rate))


def _log_mgf_laplace(u: float, rate: float) -> float:
    # log M(u) = 2 log(1-p) - log(1 - p e^u) - log(1 - p e^-u), p = e^-rate, |u| < rate (exact
    # discrete Laplace MGF; 1 - p e^x = -expm1(x - rate) keeps every factor's precision).
    u = abs(u)
    return (
        2 * math.log(-math.expm1(-rate))
        - math.log(-math.expm1(u - rate))
        - math.log(-math.expm1(-u - rate))
    )


def _log_mgf(lam: float, terms: Sequence[tuple[float, float | None, float | None]]) -> float:
    """K(λ) = Σ_k log M_k(λ a_k) (an upper bound for the Gaussian terms)."""
    total = 0.0
    for a, rate, sigma2 in terms:
        u = lam * a
        if rate is not None:
            total += _log_mgf_laplace(u, rate)  # exact discrete Laplace MGF
        else:
            assert sigma2 is not None
            total += u * u * sigma2 / 2  # E[e^{uZ}] ≤ e^{u²σ²/2}: CKS 2020 (arXiv:2004.00010)
    return total


def _prepare(
    terms: Sequence[tuple[Fraction, Noise]],
) -> tuple[list[tuple[float, float | None, float | None]], float, float]:
    """The terms as (|a|, 1/t or None, σ² or None) floats, the nearest Laplace pole in λ and
    Σ a² Var (for the starting scale of the λ search)."""
    floats: list[tuple[float, float | None, float | None]] = []
    pole = math.inf
    spread = 0.0
    for a, noise in terms:
        coefficient = abs(float(a))  # S is symmetric in each term's sign
        spread += coefficient**2 * noise.variance()
        if noise.scale is not None:
            rate = noise.scale.denominator / noise.scale.numerator  # correctly rounded 1/t
            floats.append((coefficient, rate, None))
            pole = min(pole, rate / coefficient)  # the Laplace MGF needs |λa| < 1/t
        else:
            assert noise.sigma2 is not None
            floats.append((coefficient, None, float(noise.sigma2)))
    return floats, pole, spread


def _lambda_range(pole: float, spread: float, log_term: float) -> tuple[float, float, float]:
    """(bottom, guess, top) for λ: around the optimum were S Gaussian, inside every pole."""
    guess = math.sqrt(2 * log_term / spread)
    top = min(guess * _SPAN, pole * (1 - _POLE_GAP))  # stay inside every Laplace MGF's domain
    return min(guess / _SPAN, top / _SPAN), min(guess, top), top


def _chernoff(terms: Sequence[tuple[Fraction, Noise]], miss: float) -> float:
    """inf over λ of (K(λ) + log(2/miss))/λ, enlarged by ``_MARGIN``: P(|S| > h) ≤ miss."""
    floats, pole, spread = _prepare(terms)
    log_term = math.log(2 / miss)  # two-sided: P(|S| ≥ h) ≤ 2 exp(K(λ) - λh), S symmetric
    bottom, guess, top = _lambda_range(pole, spread, log_term)

    def width(log_lam: float) -> float:
        lam = math.exp(log_lam)
        return (_log_mgf(lam, floats) + log_term) / lam  # h(λ), valid at every λ (Chernoff)

    found = minimize_scalar(
        width, bounds=(math.log(bottom), math.log(top)), method="bounded", options={"xatol": 1e-10}
    )
    best = min(width(float(found.x)), width(math.log(top)), width(math.log(guess)))
    if not math.isfinite(best):
        raise ParameterError("the noise is too large for a finite half-width")
    return math.nextafter(best * (1 + _MARGIN), math.inf)  # float error never makes h unsound


def _bins(noise: Noise, miss: float) -> tuple[FloatArray, FloatArray, float]:
    """Bins of Z ≥ 0's values up to a cut: (upper end of each bin, an upper bound on the mass
    of ±bin), and P(|Z| > cut) ≤ the returned tail. The bins cover 0..cut; bin 0 is {0}."""
    tail = max(miss * _CUT, _LEAST_TAIL)
    if noise.scale is not None:
        # P(|Z| > cut) ≤ tail exactly: the exact discrete half-width (CKS 2020 discrete tail).
        cut = discrete_laplace_half_width(noise.scale, 1 - tail)
        rate = noise.scale.denominator / noise.scale.numerator
    else:
        assert noise.sigma2 is not None
        cut = discrete_gaussian_half_width(noise.sigma2, 1 - tail)  # same, discrete Gaussian
        rate = None
    step = max(1, -(-cut // _BINS))
    lows = np.arange(1, cut + 1, step, dtype=np.float64)  # bin [lo, lo + step - 1] ∩ [1, cut]
    highs = np.minimum(lows + (step - 1), float(cut))
    counts = highs - lows + 1
    if rate is not None:
        zero = math.exp(_log_mass_zero(rate))  # P(Z = 0) = (1-p)/(1+p)
        densest = zero * np.exp(-lows * rate)  # pmf at the bin's point nearest 0
    else:
        assert noise.sigma2 is not None
        zero = discrete_gaussian_pmf(noise.sigma2, 0)
        densest = zero * np.exp(-(lows * lows) / (2 * float(noise.sigma2)))
    # Each bin's mass is at most its size times its largest pmf; ±z both counted.
    mass = np.concatenate(([zero], 2 * counts * densest)) * (1 + _MARGIN)
    return np.concatenate(([0.0], highs)), mass, tail


def _conditioned(terms: Sequence[tuple[Fraction, Noise]], miss: float) -> float:
    """The half-width from conditioning on the dominant term Z_0 exactly and bounding the rest
    R by Chernoff: P(S > h) ≤ Σ_z P(Z_0 = z)·min(1, exp(K_R(λ) - λ(h - |a_0|z))) for any λ > 0
    (Markov on e^{λR} given Z_0 = z, independence), found by bisection on h; inf if no h."""
    floats, _, _ = _prepare(terms)
    dominant = max(range(len(terms)), key=lambda k: floats[k][0] ** 2 * terms[k][1].variance())
    a0 = floats[dominant][0]
    rest_terms = [term for k, term in enumerate(terms) if k != dominant]
    rest, pole, spread = _prepare(rest_terms)
    ends, mass, tail = _bins(terms[dominant][1], miss)
    shifts = a0 * ends  # f(z) is increasing in |a_0|z: each bin's largest is at its top
    bottom, guess, top = _lambda_range(pole, spread, math.log(2 / miss))

    def bound(log_lam: float, h: float) -> float:
        lam = math.exp(log_lam)
        exponent = np.minimum(0.0, _log_mgf(lam, rest) - lam * (h - shifts))  # min(1, Chernoff)
        inner = float(np.sum(mass * np.exp(exponent)))  # Σ mass·f ≥ P(S > h, |Z_0| ≤ cut)
        return 2 * (inner + tail) * (1 + _MARGIN) + _SLACK  # two-sided: S is symmetric

    def covered(h: float) -> bool:
        found = minimize_scalar(
            bound,
            args=(h,),
            bounds=(math.log(bottom), math.log(top)),
            method="bounded",
            options={"xatol": 1e-6},
        )
        best = min(bound(float(found.x), h), bound(math.log(guess), h))
        return best <= miss  # any λ gives a valid bound (Chernoff): a verified h is sound

    hi = _chernoff(terms, miss)  # a first bracket; not itself verified here
    if not covered(hi):
        return math.inf
    lo = 0.0
    while hi - lo > _BISECT * hi:
        middle = (lo + hi) / 2
        if covered(middle):
            hi = middle
        else:
            lo = middle
    return hi


_CELLS = 2000
"""Grid cells per standard deviation of S, at least (and 20 per term): the rounding of each term
to the grid loosens the half-width by at most (number of terms)·δ/2, δ = sd(S)/cells."""

_WINDOW = 40
"""The circular grid spans ±_WINDOW standard deviations of S: what lies beyond (wrapped onto
the grid by the circular convolution) is bounded by Chernoff and counted as missed."""

_MAX_FFT = 1 << 22
"""The largest grid; beyond it the convolution is not tried."""

_MAX_WORK = 1 << 25
"""The most (distinct terms)·(grid cells), one FFT per distinct (|a|, scale): about a second."""

_FFT_ERROR = 1e-13
"""Per unit of √n·log2(n)·(terms), a bound on the absolute error of the computed central mass:
some 1000 times the float rounding of an FFT convolution of sub-probability vectors."""


def _rounded_pmf(a: float, scale: Fraction, delta: float, n: int, tail: float) -> FloatArray:
    """aZ rounded to the grid δZ (Z discrete Laplace of ``scale``), as a circular array of n
    cells: cell j holds P((j - 1/2)δ ≤ aZ < (j + 1/2)δ), computed from the closed-form tails
    (each a lower bound: masses are scaled down by 1e-12 against float error); |z| beyond the
    cut where P(|Z| > cut) ≤ ``tail`` is dropped (a sub-probability: only ever conservative)."""
    rate = scale.denominator / scale.numerator
    cut = discrete_laplace_half_width(scale, 1 - tail)
    reach = math.ceil(a * cut / delta + 0.5)
    cells = np.arange(-reach, reach + 1, dtype=np.float64)
    step = delta / a
    low = np.clip(np.ceil((cells - 0.5) * step), -cut, cut + 1)  # first integer of each cell
    high = np.clip(np.ceil((cells + 0.5) * step) - 1, -cut - 1, cut)  # last integer
    ratio = 1 / (1 + math.exp(-rate))  # P(Z = z) = (1-p)/(1+p)·p^|z| = ratio·(p^|z| - p^(|z|+1))

    def between(m: npt.NDArray[np.float64], k: npt.NDArray[np.float64]) -> FloatArray:
        # P(m ≤ Z ≤ k) for 0 ≤ m ≤ k: (p^m - p^(k+1))/(1+p), by expm1 (no cancellation).
        ok = m <= k
        width = np.where(ok, k + 1 - m, 0.0)
        return np.where(ok, ratio * np.exp(-m * rate) * -np.expm1(-width * rate), 0.0)

    positive = between(np.maximum(low, 0.0), high)  # the cell's integers z ≥ 0
    negative = between(np.maximum(-high, 1.0), -low)  # and z ≤ -1, by symmetry
    mass = (positive + negative) * (1 - 1e-12)
    out = np.zeros(n)
    np.add.at(out, cells.astype(np.int64) % n, mass)
    return out


def _convolved(terms: Sequence[tuple[Fraction, Noise]], miss: float) -> float:
    """A near-exact half-width for discrete Laplace terms: each term a_k·Z_k rounded to a grid
    δZ (|a_k Z_k - round| ≤ δ/2, so |S - Ŝ| ≤ Kδ/2), the distribution of the rounded sum Ŝ
    computed by FFT convolution on a circular grid, and h = δ·m + Kδ/2 for the smallest m with
    P(|Ŝ| > δm) ≤ miss, where P(|Ŝ| > δm) is bounded above by 1 minus the computed central
    mass, plus a bound on its float error and on the mass wrapped around the grid (Chernoff).
    Dropped tails only lower the central mass: the bound stays sound. inf when not tried."""
    if any(noise.scale is None for _, noise in terms) or len(terms) < 2:
        return math.inf
    groups: dict[tuple[Fraction, Fraction], int] = {}
    for a, noise in terms:
        assert noise.scale is not None
        key = (abs(a), noise.scale)
        groups[key] = groups.get(key, 0) + 1
    floats, pole, spread = _prepare(terms)
    sd = math.sqrt(spread)
    cells = max(_CELLS, 20 * len(terms))
    delta = sd / cells
    half = _WINDOW * cells
    n = int(next_fast_len(2 * half + 1, real=True))
    if n > _MAX_FFT or len(groups) * n > _MAX_WORK or not (math.isfinite(delta) and delta > 0):
        return math.inf
    tail = max(miss * _CUT / len(terms), _LEAST_TAIL)
    spectrum = np.ones(n // 2 + 1, dtype=np.complex128)
    for (a, scale), copies in groups.items():
        spectrum *= np.fft.rfft(_rounded_pmf(float(a), scale, delta, n, tail)) ** copies
    mass = np.fft.irfft(spectrum, n)
    # What lies beyond ±(n/2)δ wraps onto the grid: P(|Ŝ| ≥ y) ≤ P(|S| ≥ y - Kδ/2) ≤
    # 2·exp(K(λ) - λ(y - Kδ/2)) for any λ inside the poles (Chernoff, as in _chernoff).
    shift = len(terms) * delta / 2 * (1 + 1e-9)  # the rounding, and the float error of its cells
    reach = (n // 2) * delta - shift
    top = pole * (1 - _POLE_GAP)
    exponents = (_log_mgf(lam, floats) - lam * reach for lam in (top, top / 2))
    wrapped = min(1.0, *(2 * math.exp(min(0.0, x)) for x in exponents))
    error = _FFT_ERROR * math.sqrt(n) * math.log2(n) * len(terms) + wrapped
    central = mass[0] + np.cumsum(mass[1 : n // 2] + mass[n - 1 : n - n // 2 : -1])
    covered = np.nonzero(1 - central + error <= miss)[0]
    if covered.size == 0:
        return math.inf
    m = int(covered[0]) + 1  # central[i] sums the cells |j| ≤ i + 1
    if 1 - mass[0] + error <= miss:
        m = 0
    return math.nextafter((m * delta + shift) * (1 + _MARGIN), math.inf)


def _float_up(x: Fraction) -> float:
    """The smallest float ≥ x (a half-width rounded down would be unsound)."""
    value = float(x)
    return value if Fraction(value) >= x else math.nextafter(value, math.inf)


def _exact_half_width(noise: Noise, confidence: float) -> int:
    if noise.scale is not None:
        return discrete_laplace_half_width(noise.scale, confidence)
    assert noise.sigma2 is not None
    return discrete_gaussian_half_width(noise.sigma2, confidence)


def linear_half_width(terms: Sequence[tuple[Fraction, Noise]], confidence: float) -> float:
    """h ≥ 0 with P(|Σ a_k Z_k| ≤ h) ≥ ``confidence`` guaranteed (module docstring).

    ``terms`` are (a_k, noise) pairs of independent noises. Raises ParameterError for no terms,
    a coefficient that is not a Fraction or a confidence outside (0, 1)."""
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)):
        raise ParameterError("the confidence must be a float")
    if not (math.isfinite(confidence) and 0 < confidence < 1):
        raise ParameterError("the confidence must be strictly between 0 and 1")
    if not terms:
        raise ParameterError("a linear combination needs at least one noise term")
    for a, noise in terms:
        if not isinstance(a, Fraction):
            raise ParameterError("a coefficient must be a fractions.Fraction")
        if not isinstance(noise, Noise):
            raise ParameterError("a noise must be a Noise")
    live = [(a, noise) for a, noise in terms if a != 0]
    if not live:
        return 0.0
    miss = 1.0 - float(confidence)
    h = _chernoff(live, miss)
    if len(live) > 1:
        # The grid's near-exact bound when it can be computed, else conditioning on a term.
        convolved = _convolved(live, miss)
        h = min(h, convolved if math.isfinite(convolved) else _conditioned(live, miss))
    if len(live) == 1:
        a, noise = live[0]
        # P(|aZ| ≤ |a|k) = P(|Z| ≤ k) ≥ confidence: the exact discrete half-width k (CKS 2020).
        h = min(h, _float_up(abs(a) * _exact_half_width(noise, confidence)))
    # S ∈ gZ, g = gcd of the coefficients, so P(|S| ≤ g·floor(h/g)) = P(|S| ≤ h) ≥ confidence.
    lattice = Fraction(
        math.gcd(*(a.numerator for a, _ in live)), math.lcm(*(a.denominator for a, _ in live))
    )
    return _float_up(lattice * math.floor(Fraction(h) / lattice))


__all__ = ["Noise", "linear_half_width"]
