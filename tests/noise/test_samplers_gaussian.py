"""Unit tests for the exact discrete Gaussian in dpsql.noise.gaussian (its maths in
dpsql.mechanisms.gaussian): fail closed, validation, the exact distribution helpers against
independent high-precision sums, and the bit source."""

from __future__ import annotations

import hashlib
import inspect
import math
from collections.abc import Callable, Iterator
from decimal import Decimal
from fractions import Fraction

import mpmath
import numpy as np
import numpy.typing as npt
import pytest
from scipy import stats

from dpsql.errors import EntropyError, ParameterError
from dpsql.mechanisms import gaussian as gaussian_maths
from dpsql.mechanisms.gaussian import (
    MAX_SIGMA2,
    _upper_sum,
    discrete_gaussian_half_width,
    discrete_gaussian_pmf,
    discrete_gaussian_tail,
)
from dpsql.noise import bits, gaussian
from dpsql.noise.gaussian import discrete_gaussian

SMALL = [Fraction(1, 10**6), Fraction(1, 4), Fraction(1), Fraction(7, 3), Fraction(10)]
SMALL += [Fraction(2500, 7)]
LARGE = [Fraction(10**6), Fraction(10**6 + 1), Fraction(10**8, 3)]
HUGE_DENOMINATOR = Fraction(3 * 10**20 + 1, 3 * 10**20)  # ~1; 2·p·q·t² far beyond int64

ALPHA = 1e-6
"""False-failure rate of every goodness-of-fit check in this file."""

CONFIDENCES = [0.01, 0.5, 0.9, 0.95, 0.99, 1 - 1e-6, 1 - 2**-52]


class CounterBits:
    """A deterministic bit source: call i returns SHAKE-256(i) truncated to the requested size."""

    def __init__(self) -> None:
        self.calls = 0
        self.bytes = 0

    def __call__(self, n: int) -> bytes:
        out = hashlib.shake_256(self.calls.to_bytes(8, "little")).digest(n)
        self.calls += 1
        self.bytes += n
        return out


@pytest.fixture
def counter_bits(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], CounterBits]]:
    def install() -> CounterBits:
        source = CounterBits()
        monkeypatch.setattr(bits, "_random_bytes", source)
        return source

    yield install


@pytest.fixture
def no_urandom(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(n: int) -> bytes:
        raise OSError("getrandom failed")

    monkeypatch.setattr("os.urandom", broken)


def reference_terms(sigma2: Fraction, upto: int) -> list[mpmath.mpf]:
    """exp(-k²/(2 sigma2)) for k = 0..upto at 40 digits (independent of the module)."""
    with mpmath.workdps(40):
        s = mpmath.mpf(sigma2.numerator) / sigma2.denominator
        return [mpmath.exp(-mpmath.mpf(k * k) / (2 * s)) for k in range(upto + 1)]


def reference_normaliser(sigma2: Fraction) -> mpmath.mpf:
    """Σ_k exp(-k²/(2 sigma2)) = θ3(0, exp(-1/(2 sigma2))), Jacobi's theta function (mpmath
    accepts the nome only up to about 1 - 1e-7, i.e. sigma2 up to ~5·10**6)."""
    with mpmath.workdps(40):
        s = mpmath.mpf(sigma2.numerator) / sigma2.denominator
        return mpmath.jtheta(3, 0, mpmath.exp(-1 / (2 * s)))


# --- randomness source ----------------------------------------------------------------------


@pytest.mark.usefixtures("no_urandom")
@pytest.mark.parametrize(
    "sigma2", [Fraction(10), Fraction(2500, 7), Fraction(10**10, 3), HUGE_DENOMINATOR], ids=str
)
def test_fails_closed_without_os_randomness(sigma2: Fraction) -> None:
    with pytest.raises(EntropyError, match="nothing was released") as info:
        discrete_gaussian(sigma2, 5)
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_short_read_fails_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.urandom", lambda n: b"\x00" * (n - 1))
    with pytest.raises(EntropyError):
        discrete_gaussian(Fraction(1), 3)


@pytest.mark.parametrize("sigma2", [Fraction(7, 2), Fraction(10**10, 3), HUGE_DENOMINATOR], ids=str)
def test_sampler_consumes_only_random_bytes(
    counter_bits: Callable[[], CounterBits], no_urandom: None, sigma2: Fraction
) -> None:
    # os.urandom is broken and numpy's global generator is reseeded between runs: identical
    # outputs from identical streams show that _random_bytes is the only source of randomness.
    first = counter_bits()
    np.random.seed(1)
    a = discrete_gaussian(sigma2, 3000)
    second = counter_bits()
    np.random.seed(2)
    b = discrete_gaussian(sigma2, 3000)
    np.testing.assert_array_equal(a, b)
    assert first.bytes == second.bytes > 0
    assert len(set(a.tolist())) > 3  # the stream really drove the sampler


def test_no_seed_or_generator_parameter() -> None:
    public: list[Callable[..., object]] = [discrete_gaussian, discrete_gaussian_pmf]
    public += [discrete_gaussian_tail, discrete_gaussian_half_width]
    for function in public:
        names = set(inspect.signature(function).parameters)
        assert not names & {"seed", "rng", "random_state", "generator"}


def test_size_zero_consumes_no_randomness(no_urandom: None) -> None:
    out = discrete_gaussian(Fraction(1), 0)
    assert out.dtype == np.int64 and out.shape == (0,)


def test_sampling_path_has_no_float_arithmetic() -> None:
    """The sampling functions never construct a float or call float math (CKS 2020: exactness
    is the point; Mironov 2012 shows what floats leak)."""
    functions = [bits._bernoulli_exp_rational_python, bits._bernoulli_exp_whole_fast]
    functions += [gaussian._gaussian_accept_fast, gaussian._gaussian_accept_python]
    functions += [gaussian._gaussian_round, gaussian.discrete_gaussian]
    for function in functions:
        code = inspect.getsource(function).split('"""')[-1]  # the body after the docstring
        for forbidden in ("float", "math.exp", "math.sqrt", "np.exp", "np.sqrt", " / "):
            assert forbidden not in code, (function.__name__, forbidden)


# --- validation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sigma2",
    [1.0, 1, Decimal(1), Fraction(0), Fraction(-1, 2), MAX_SIGMA2 + 1, "1", None, True],
)
def test_rejects_bad_sigma2(sigma2: object) -> None:
    for call in (
        lambda: discrete_gaussian(sigma2, 3),  # type: ignore[arg-type]
        lambda: discrete_gaussian_pmf(sigma2, 0),  # type: ignore[arg-type]
        lambda: discrete_gaussian_tail(sigma2, 1),  # type: ignore[arg-type]
        lambda: discrete_gaussian_half_width(sigma2, 0.9),  # type: ignore[arg-type]
    ):
        with pytest.raises(ParameterError, match="sigma2"):
            call()


@pytest.mark.parametrize("size", [-1, 2.0, True, "3", None, np.int64(-1)])
def test_rejects_bad_size(size: object) -> None:
    with pytest.raises(ParameterError, match="size"):
        discrete_gaussian(Fraction(1), size)  # type: ignore[arg-type]


@pytest.mark.parametrize("confidence", [0.0, 1.0, -0.1, 1.5, math.nan, math.inf, "0.9", True])
def test_half_width_rejects_bad_confidence(confidence: object) -> None:
    with pytest.raises(ParameterError, match="confidence"):
        discrete_gaussian_half_width(Fraction(1), confidence)  # type: ignore[arg-type]


@pytest.mark.parametrize("k", [1.0, True, None, "2"])
def test_pmf_and_tail_reject_non_integer_k(k: object) -> None:
    with pytest.raises(ParameterError):
        discrete_gaussian_pmf(Fraction(1), k)  # type: ignore[arg-type]
    with pytest.raises(ParameterError):
        discrete_gaussian_tail(Fraction(1), k)  # type: ignore[arg-type]


def test_numpy_integers_are_accepted() -> None:
    three, zero = np.int64(3), np.int32(0)
    assert discrete_gaussian(Fraction(1), three).shape == (3,)  # type: ignore[arg-type]
    pmf = discrete_gaussian_pmf(Fraction(1), zero)  # type: ignore[arg-type]
    assert pmf == discrete_gaussian_pmf(Fraction(1), 0)


# --- exact distribution helpers -------------------------------------------------------------


@pytest.mark.parametrize("sigma2", SMALL, ids=str)
def test_pmf_sums_to_one_and_matches_reference(sigma2: Fraction) -> None:
    m = int(40 * math.sqrt(sigma2)) + 5
    pmf = [discrete_gaussian_pmf(sigma2, k) for k in range(-m, m + 1)]
    assert math.fsum(pmf) == pytest.approx(1, abs=1e-13)
    terms, norm = reference_terms(sigma2, 12), reference_normaliser(sigma2)
    for k in range(13):
        assert discrete_gaussian_pmf(sigma2, k) == pytest.approx(float(terms[k] / norm), rel=1e-13)


@pytest.mark.parametrize("sigma2", [*SMALL, *LARGE, Fraction(10**30, 7), MAX_SIGMA2], ids=str)
def test_normaliser_matches_jacobi_theta(sigma2: Fraction) -> None:
    """The normaliser against mpmath's theta function (large sigma2: the Poisson formula)."""
    pmf0 = discrete_gaussian_pmf(sigma2, 0)
    if sigma2 <= 10**6 + 1:
        assert pmf0 == pytest.approx(float(1 / reference_normaliser(sigma2)), rel=1e-13)
    else:  # θ3 near q = 1 is out of mpmath's reach; sqrt(2πσ²) is exact to 1e-18 beyond σ² = 2.1
        assert pmf0 == pytest.approx(1 / math.sqrt(2 * math.pi * float(sigma2)), rel=1e-14)


@pytest.mark.parametrize("sigma2", [*SMALL, *LARGE, MAX_SIGMA2], ids=str)
def test_symmetry_and_tail_consistency(sigma2: Fraction) -> None:
    sigma = math.isqrt(int(sigma2)) + 1
    for k in (0, 1, 2, 5, sigma, 3 * sigma):
        assert discrete_gaussian_pmf(sigma2, -k) == discrete_gaussian_pmf(sigma2, k)
        # P(Z >= k) + P(Z >= 1 - k) = 1 since P(Z >= 1 - k) = P(Z <= k - 1)
        total = discrete_gaussian_tail(sigma2, k) + discrete_gaussian_tail(sigma2, 1 - k)
        assert total == pytest.approx(1, abs=1e-15)
        if k >= 1 and discrete_gaussian_tail(sigma2, k) > 1e-300:
            step = discrete_gaussian_pmf(sigma2, k) + discrete_gaussian_tail(sigma2, k + 1)
            assert discrete_gaussian_tail(sigma2, k) == pytest.approx(step, rel=1e-12)
    # P(Z >= 1) = (1 - P(Z = 0)) / 2
    half = (1 - discrete_gaussian_pmf(sigma2, 0)) / 2
    assert discrete_gaussian_tail(sigma2, 1) == pytest.approx(half, rel=1e-14)


@pytest.mark.parametrize("sigma2", SMALL, ids=str)
def test_tail_matches_reference(sigma2: Fraction) -> None:
    m = int(40 * math.sqrt(sigma2)) + 5
    terms, norm = reference_terms(sigma2, m), reference_normaliser(sigma2)
    with mpmath.workdps(40):
        for k in {1, 2, 3, m // 8, m // 4, m // 2}:
            if k >= 1:
                expected = float(mpmath.fsum(terms[k:]) / norm)
                assert discrete_gaussian_tail(sigma2, k) == pytest.approx(expected, rel=1e-12)


def test_euler_maclaurin_agrees_with_direct_sum(monkeypatch: pytest.MonkeyPatch) -> None:
    """The two tail methods meet at sigma2 = 10**6, where both are accurate to ~1e-14."""
    for sigma2 in (Fraction(10**6), Fraction(4 * 10**6, 3)):
        sigma = math.sqrt(sigma2)
        for m in (1, int(sigma / 2), int(sigma), int(3 * sigma), int(6 * sigma), int(9 * sigma)):
            monkeypatch.setattr(gaussian_maths, "_EM_FROM", 10**9)
            direct = _upper_sum(sigma2, m)
            monkeypatch.setattr(gaussian_maths, "_EM_FROM", 0)
            euler_maclaurin = _upper_sum(sigma2, m)
            assert euler_maclaurin == pytest.approx(direct, rel=1e-13)


def test_extreme_variances() -> None:
    tiny = Fraction(1, 10**30)
    assert discrete_gaussian_pmf(tiny, 0) == 1.0 and discrete_gaussian_pmf(tiny, 1) == 0.0
    assert discrete_gaussian_tail(tiny, 1) == 0.0 and discrete_gaussian_tail(tiny, 0) == 1.0
    assert (discrete_gaussian(tiny, 200) == 0).all()  # P(Z != 0) ~ 2 exp(-5e29)
    assert discrete_gaussian_pmf(MAX_SIGMA2, 10**40) == 0.0  # no overflow for huge k


def _coverage(sigma2: Fraction, k: int) -> mpmath.mpf:
    """P(|Z| <= k) at 40 digits from the reference terms and theta normaliser."""
    if k < 0:
        return mpmath.mpf(0)
    terms = reference_terms(sigma2, k)
    with mpmath.workdps(40):
        return (2 * mpmath.fsum(terms) - 1) / reference_normaliser(sigma2)


@pytest.mark.parametrize("sigma2", [*SMALL, Fraction(10**6 + 1), Fraction(4 * 10**6, 3)], ids=str)
def test_half_width_covers_and_is_minimal(sigma2: Fraction) -> None:
    for confidence in CONFIDENCES:
        k = discrete_gaussian_half_width(sigma2, confidence)
        assert isinstance(k, int) and k >= 0
        assert _coverage(sigma2, k) >= confidence  # mpf vs float: compared exactly
        assert _coverage(sigma2, k - 1) < confidence


def test_half_width_known_values() -> None:
    # sigma2 = 1/4: P(Z = 0) = 1/θ3(0, e^-2) = 0.78657..., P(|Z| <= 1) = 0.99947...
    assert [discrete_gaussian_half_width(Fraction(1, 4), c) for c in (0.78, 0.79)] == [0, 1]
    assert discrete_gaussian_half_width(Fraction(1, 4), 0.9994) == 1
    assert discrete_gaussian_half_width(Fraction(1, 4), 0.9995) == 2
    # Large sigma: the continuous Gaussian's 1.959964·sigma, to within a unit.
    assert abs(discrete_gaussian_half_width(Fraction(10**8), 0.95) - 1.959964 * 10**4) < 1
    k = discrete_gaussian_half_width(MAX_SIGMA2, 0.95)  # sigma = 2**55
    assert abs(k / 2**55 - stats.norm.isf(0.025)) < 1e-8


# --- samplers -------------------------------------------------------------------------------


def _gof_pvalue(sample: npt.NDArray[np.int64], sigma2: Fraction, m: int) -> float:
    """Chi-square on the bins Z <= -m-1, each k in [-m, m], Z >= m+1."""
    observed = np.bincount(np.clip(sample, -m - 1, m + 1) + m + 1, minlength=2 * m + 3)
    tail = discrete_gaussian_tail(sigma2, m + 1)
    probs = [tail, *(discrete_gaussian_pmf(sigma2, k) for k in range(-m, m + 1)), tail]
    expected = np.array(probs) * sample.size
    statistic = float(((observed - expected) ** 2 / expected).sum())
    return float(stats.chi2.sf(statistic, df=len(probs) - 1))


def test_discrete_gaussian_dtype_and_spread() -> None:
    x = discrete_gaussian(Fraction(2**100, 3), 1000)  # sigma ~ 5.8e14: Python acceptance
    assert x.dtype == np.int64 and x.shape == (1000,)
    assert (x > 0).any() and (x < 0).any() and np.abs(x).max() > 10**14


def test_python_acceptance_distribution() -> None:
    """2·p·q·t² beyond int64 forces the Python-integer acceptance; alpha = 1e-6."""
    sample = discrete_gaussian(HUGE_DENOMINATOR, 40_000)
    assert _gof_pvalue(sample, HUGE_DENOMINATOR, 2) > ALPHA
    assert _gof_pvalue(sample, Fraction(3, 2), 2) < ALPHA  # the check has power


def test_big_integer_continuations_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    """A limit of 16 sends, for sigma2 = 1 (t = 2, den = 8), proposals with |Y| >= 3 to the
    Python acceptance and Algorithm 1 ranges 8·K >= 16 to its Python continuation, in the
    middle of vectorized batches; and for sigma2 = 2500/7 (t = 19 >= 16) everything runs in
    Python. Both mixed batches must have the exact distribution. alpha = 1e-6.
    """
    calls = {"acceptance": 0, "bernoulli": 0}
    acceptance, bernoulli = bits._bernoulli_exp_rational_python, bits._bernoulli_exp_python

    def counted_acceptance(num: int, den: int) -> bool:
        calls["acceptance"] += 1
        return acceptance(num, den)

    def counted_bernoulli(a: int, b: int, k: int = 1) -> bool:
        calls["bernoulli"] += 1
        return bernoulli(a, b, k)

    monkeypatch.setattr(bits, "_FAST_LIMIT", 16)
    # patched where it is looked up: gaussian.py imports the acceptance draw from bits.py
    monkeypatch.setattr(gaussian, "_bernoulli_exp_rational_python", counted_acceptance)
    monkeypatch.setattr(bits, "_bernoulli_exp_python", counted_bernoulli)
    sample = discrete_gaussian(Fraction(1), 100_000)
    assert calls["acceptance"] > 1000 and calls["bernoulli"] > 1000  # both continuations ran
    assert _gof_pvalue(sample, Fraction(1), 3) > ALPHA
    # the check has power: noncentrality ~860 against sigma2 1.15, so it never misses
    assert _gof_pvalue(sample, Fraction(115, 100), 3) < ALPHA
    sample = discrete_gaussian(Fraction(2500, 7), 20_000)
    assert _gof_pvalue(sample, Fraction(2500, 7), 15) > ALPHA
