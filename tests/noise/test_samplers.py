"""Unit tests for the exact discrete Laplace (dpsql.noise.laplace, its maths in
dpsql.mechanisms.laplace) and the bit source in dpsql.noise.bits: fail closed, validation, exact
helpers."""

from __future__ import annotations

import ast
import hashlib
import inspect
import math
from collections.abc import Callable, Iterator
from decimal import Decimal, localcontext
from fractions import Fraction
from types import ModuleType

import numpy as np
import pytest
from scipy import stats

from dpsql.errors import EntropyError, ParameterError
from dpsql.mechanisms import gaussian as gaussian_maths
from dpsql.mechanisms import laplace as laplace_maths
from dpsql.mechanisms.gaussian import MAX_SIGMA2
from dpsql.mechanisms.laplace import (
    MAX_SCALE,
    discrete_laplace_half_width,
    discrete_laplace_pmf,
    discrete_laplace_tail,
)
from dpsql.noise import bits, gaussian, laplace
from dpsql.noise.bits import uniform_integers
from dpsql.noise.gaussian import discrete_gaussian
from dpsql.noise.laplace import discrete_laplace

SCALES = [Fraction(1, 1000), Fraction(1, 3), Fraction(1), Fraction(7, 2), Fraction(10)]
SCALES += [Fraction(1000, 7), Fraction(2**40, 3)]

ALPHA = 1e-6
"""False-failure rate of every goodness-of-fit check in this file."""


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
    """Replace ``bits._random_bytes``, the one place all bits come from, by a fresh counter
    stream each time the factory is called."""

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


# --- randomness source ----------------------------------------------------------------------


@pytest.mark.usefixtures("no_urandom")
@pytest.mark.parametrize(
    "draw",
    [
        lambda: discrete_laplace(Fraction(10), 5),
        lambda: discrete_laplace(Fraction(3 * 10**20 + 1, 10**20), 5),  # big-integer path
        lambda: uniform_integers(10, 5),
        lambda: uniform_integers(10**30, 5),
    ],
)
def test_fails_closed_without_os_randomness(draw: Callable[[], object]) -> None:
    with pytest.raises(EntropyError, match="nothing was released") as info:
        draw()
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_short_read_fails_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.urandom", lambda n: b"\x00" * (n - 1))
    with pytest.raises(EntropyError):
        discrete_laplace(Fraction(1), 3)


def test_random_bytes_reads_os_urandom_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.urandom", lambda n: bytes(range(n)))
    assert bits._random_bytes(4) == b"\x00\x01\x02\x03"


def test_sampler_consumes_only_random_bytes(
    counter_bits: Callable[[], CounterBits], no_urandom: None
) -> None:
    # os.urandom is broken and numpy's global generator is reseeded between runs: identical
    # outputs from identical streams show that _random_bytes is the only source of randomness.
    first = counter_bits()
    np.random.seed(1)
    a = discrete_laplace(Fraction(7, 2), 10_000)
    u = uniform_integers(1000, 100)
    second = counter_bits()
    np.random.seed(2)
    b = discrete_laplace(Fraction(7, 2), 10_000)
    v = uniform_integers(1000, 100)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(u, v)
    assert first.bytes == second.bytes > 0
    assert len(set(a.tolist())) > 10  # the stream really drove the sampler


def test_one_bit_source_feeds_both_samplers(
    counter_bits: Callable[[], CounterBits], no_urandom: None
) -> None:
    # With os.urandom broken, every draw must come from the patched bits._random_bytes: both
    # samplers (and their big-integer paths) are fed from that one place.
    source = counter_bits()
    draws: list[Callable[[], object]] = [
        lambda: discrete_laplace(Fraction(7, 2), 50),
        lambda: discrete_laplace(Fraction(3 * 10**20 + 1, 10**20), 5),
        lambda: discrete_gaussian(Fraction(10), 50),
        lambda: discrete_gaussian(Fraction(3 * 10**20 + 1, 3 * 10**20), 5),
        lambda: uniform_integers(10**30, 5),
    ]
    for draw in draws:
        before = source.bytes
        draw()
        assert source.bytes > before


def _identifiers(module: ModuleType) -> set[str]:
    """Every name, attribute and imported module a module's code mentions (not its docstrings)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.add(node.module or "")
    return found


def test_bits_is_the_only_randomness() -> None:
    # The split keeps one source: only bits.py may touch os.urandom, and only its uniform
    # draws call _random_bytes (so patching bits._random_bytes reaches every sampler).
    entropy = {"os", "urandom", "_random_bytes", "random", "secrets", "default_rng"}
    for module in (laplace, gaussian, laplace_maths, gaussian_maths):
        assert not _identifiers(module) & entropy, module.__name__
    assert {"os", "urandom", "_random_bytes"} <= _identifiers(bits)
    assert not _identifiers(bits) & {"random", "secrets", "default_rng"}
    callers = {
        node.name
        for node in ast.walk(ast.parse(inspect.getsource(bits)))
        if isinstance(node, ast.FunctionDef) and "_random_bytes(" in ast.unparse(node)
    }
    assert callers == {"_random_bytes", "_uniform_python", "_uniform_fast"}


def test_each_name_has_one_home() -> None:
    # The samplers draw (dpsql.noise, the only randomness); their distributions' pmf, tail and
    # half-width are mathematics (dpsql.mechanisms), which planning reads without drawing.
    assert bits.__all__ == ["uniform_integers"]
    assert laplace.__all__ == ["discrete_laplace"] and gaussian.__all__ == ["discrete_gaussian"]
    assert sorted(laplace_maths.__all__) == [
        "MAX_SCALE",
        "discrete_laplace_half_width",
        "discrete_laplace_pmf",
        "discrete_laplace_tail",
    ]
    assert sorted(gaussian_maths.__all__) == [
        "MAX_SIGMA2",
        "discrete_gaussian_half_width",
        "discrete_gaussian_pmf",
        "discrete_gaussian_tail",
    ]
    assert MAX_SCALE == 2**56 and MAX_SIGMA2 == 2**110


def test_no_seed_or_generator_parameter() -> None:
    public: list[Callable[..., object]] = [discrete_laplace, uniform_integers]
    public += [discrete_laplace_pmf, discrete_laplace_tail, discrete_laplace_half_width]
    for function in public:
        names = set(inspect.signature(function).parameters)
        assert not names & {"seed", "rng", "random_state", "generator"}


def test_size_zero_consumes_no_randomness(no_urandom: None) -> None:
    out = discrete_laplace(Fraction(1), 0)
    assert out.dtype == np.int64 and out.shape == (0,)
    assert uniform_integers(7, 0).shape == (0,)
    assert uniform_integers(1, 5).tolist() == [0] * 5  # one possible value: no bits needed


# --- validation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "scale",
    [1.0, 1, Decimal(1), Fraction(0), Fraction(-1, 2), MAX_SCALE + 1, "1", None, True],
)
def test_rejects_bad_scale(scale: object) -> None:
    for call in (
        lambda: discrete_laplace(scale, 3),  # type: ignore[arg-type]
        lambda: discrete_laplace_pmf(scale, 0),  # type: ignore[arg-type]
        lambda: discrete_laplace_tail(scale, 1),  # type: ignore[arg-type]
        lambda: discrete_laplace_half_width(scale, 0.9),  # type: ignore[arg-type]
    ):
        with pytest.raises(ParameterError, match="scale"):
            call()


@pytest.mark.parametrize("size", [-1, 2.0, True, "3", None, np.int64(-1)])
def test_rejects_bad_size(size: object) -> None:
    with pytest.raises(ParameterError, match="size"):
        discrete_laplace(Fraction(1), size)  # type: ignore[arg-type]
    with pytest.raises(ParameterError, match="size"):
        uniform_integers(5, size)  # type: ignore[arg-type]


@pytest.mark.parametrize("n", [0, -3, 2.0, True, None])
def test_uniform_rejects_bad_range(n: object) -> None:
    with pytest.raises(ParameterError, match="range"):
        uniform_integers(n, 3)  # type: ignore[arg-type]


@pytest.mark.parametrize("confidence", [0.0, 1.0, -0.1, 1.5, math.nan, math.inf, "0.9", True])
def test_half_width_rejects_bad_confidence(confidence: object) -> None:
    with pytest.raises(ParameterError, match="confidence"):
        discrete_laplace_half_width(Fraction(1), confidence)  # type: ignore[arg-type]


@pytest.mark.parametrize("k", [1.0, True, None])
def test_pmf_rejects_non_integer_k(k: object) -> None:
    with pytest.raises(ParameterError):
        discrete_laplace_pmf(Fraction(1), k)  # type: ignore[arg-type]


# --- exact distribution helpers -------------------------------------------------------------


@pytest.mark.parametrize("scale", SCALES[:-1])
def test_pmf_sums_to_one(scale: Fraction) -> None:
    m = int(60 * scale) + 5
    central = math.fsum(discrete_laplace_pmf(scale, k) for k in range(-m, m + 1))
    assert math.fsum([central, 2 * discrete_laplace_tail(scale, m + 1)]) == pytest.approx(
        1, abs=1e-12
    )
    assert central == pytest.approx(1, abs=1e-12)  # the tail beyond 60 scales is negligible


@pytest.mark.parametrize("scale", SCALES)
def test_pmf_and_tail_match_closed_form(scale: Fraction) -> None:
    q = math.exp(-1 / float(scale))
    for k in (0, 1, 2, 5):
        assert discrete_laplace_pmf(scale, k) == pytest.approx((1 - q) / (1 + q) * q**k)
        assert discrete_laplace_pmf(scale, -k) == discrete_laplace_pmf(scale, k)
    for k in (1, 2, 5):
        assert discrete_laplace_tail(scale, k) == pytest.approx(q**k / (1 + q))
        # P(Z >= k) = P(Z = k) + P(Z >= k + 1)
        assert discrete_laplace_tail(scale, k) == pytest.approx(
            discrete_laplace_pmf(scale, k) + discrete_laplace_tail(scale, k + 1)
        )
    for k in (0, -1, -4):  # complement and symmetry
        assert discrete_laplace_tail(scale, k) == pytest.approx(
            1 - discrete_laplace_tail(scale, 1 - k)
        )
    assert discrete_laplace_tail(scale, 0) == pytest.approx(
        discrete_laplace_pmf(scale, 0) + discrete_laplace_tail(scale, 1)
    )


def _coverage(scale: Fraction, k: int) -> Decimal:
    """P(|Z| <= k) summed term by term (small k) or from the closed form (large k), 50 digits."""
    if k < 0:
        return Decimal(0)
    with localcontext(prec=50):
        q = (-Decimal(scale.denominator) / Decimal(scale.numerator)).exp()
        if k <= 2000:
            terms = sum(q ** abs(j) for j in range(-k, k + 1))
            return (1 - q) / (1 + q) * terms
        return 1 - 2 * q ** (k + 1) / (1 + q)


@pytest.mark.parametrize("scale", [*SCALES, MAX_SCALE])
@pytest.mark.parametrize("confidence", [0.01, 0.5, 0.9, 0.95, 0.99, 1 - 1e-6, 1 - 2**-52])
def test_half_width_covers_and_is_minimal(scale: Fraction, confidence: float) -> None:
    k = discrete_laplace_half_width(scale, confidence)
    assert isinstance(k, int) and k >= 0
    assert _coverage(scale, k) >= Decimal(confidence)
    assert _coverage(scale, k - 1) < Decimal(confidence)


def test_half_width_known_values() -> None:
    # scale 1/3: P(Z = 0) = (1 - e^-3)/(1 + e^-3) ~ 0.905, so k = 0 covers 0.9 but not 0.95.
    assert discrete_laplace_half_width(Fraction(1, 3), 0.9) == 0
    assert discrete_laplace_half_width(Fraction(1, 3), 0.95) == 1
    # Large scale: close to the continuous Laplace half width scale · ln(1 / (1 - c)).
    k = discrete_laplace_half_width(Fraction(10**6), 0.95)
    assert abs(k - 10**6 * math.log(20)) < 2


# --- samplers -------------------------------------------------------------------------------


def test_numpy_integers_are_accepted() -> None:
    three, zero = np.int64(3), np.int32(0)
    assert discrete_laplace(Fraction(1), three).shape == (3,)  # type: ignore[arg-type]
    pmf = discrete_laplace_pmf(Fraction(1), zero)  # type: ignore[arg-type]
    assert pmf == discrete_laplace_pmf(Fraction(1), 0)


def test_uniform_integers_range_and_dtype() -> None:
    for n in (1, 2, 3, 255, 256, 257, 2**32 + 1, 2**63 - 1):
        x = uniform_integers(n, 2000)
        assert x.dtype == np.int64 and x.shape == (2000,)
        assert x.min() >= 0 and x.max() < n
    big = uniform_integers(2**200 + 3, 50)
    assert big.dtype == object and all(0 <= int(v) < 2**200 + 3 for v in big)


def test_uniform_integers_is_uniform() -> None:
    counts = np.bincount(uniform_integers(12, 60_000), minlength=12)
    assert stats.chisquare(counts).pvalue > ALPHA


def test_discrete_laplace_dtype_and_symmetry() -> None:
    x = discrete_laplace(Fraction(2**40, 3), 1000)
    assert x.dtype == np.int64 and x.shape == (1000,)
    assert (x > 0).any() and (x < 0).any()
    assert (discrete_laplace(Fraction(1, 10**6), 100) == 0).all()  # P(Z != 0) ~ 2e^-1e6


def _small_gof_pvalue(sample: np.ndarray, scale: Fraction) -> float:
    """Chi-square on the bins Z <= -2, -1, 0, 1, Z >= 2 (expected counts >> 5 for scale ~1)."""
    observed = np.bincount(np.clip(sample, -2, 2) + 2, minlength=5)
    tail = discrete_laplace_tail(scale, 2)
    probs = [tail] + [discrete_laplace_pmf(scale, k) for k in (-1, 0, 1)] + [tail]
    expected = np.array(probs) * sample.size
    statistic = float(((observed - expected) ** 2 / expected).sum())
    return float(stats.chi2.sf(statistic, df=4))


def test_big_integer_path_distribution() -> None:
    """Numerator and denominator beyond 2**63 force the pure-Python path; alpha = 1e-6."""
    scale = Fraction(3 * 10**20 + 1, 3 * 10**20)  # ~1, needs big integers
    sample = discrete_laplace(scale, 30_000)
    assert sample.dtype == np.int64
    assert _small_gof_pvalue(sample, scale) > ALPHA
    assert _small_gof_pvalue(sample, Fraction(5, 4)) < ALPHA  # the check has power


def test_big_integer_continuations_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    """A limit of 16 sends uniform ranges t·K >= 16 (K >= 3 for t = 7) and X = U + tV with
    V >= 2 to the exact Python continuations in the middle of a vectorized batch; the mixed
    batch must still have the exact distribution. alpha = 1e-6.
    """
    calls = {"bernoulli": 0, "magnitude": 0}
    bernoulli, to_int64 = bits._bernoulli_exp_python, laplace._to_int64

    def counted_bernoulli(a: int, b: int, k: int = 1) -> bool:
        calls["bernoulli"] += 1
        return bernoulli(a, b, k)

    def counted_to_int64(value: int) -> int:
        calls["magnitude"] += 1
        return to_int64(value)

    monkeypatch.setattr(bits, "_FAST_LIMIT", 16)
    monkeypatch.setattr(bits, "_bernoulli_exp_python", counted_bernoulli)
    monkeypatch.setattr(laplace, "_to_int64", counted_to_int64)
    scale = Fraction(7, 6)
    sample = discrete_laplace(scale, 100_000)
    assert calls["bernoulli"] > 100 and calls["magnitude"] > 1000  # both continuations ran
    assert _small_gof_pvalue(sample, scale) > ALPHA
    assert uniform_integers(100, 10).dtype == object  # beyond the (lowered) fast limit


def test_a_few_draws_one_at_a_time_are_discrete_laplace(monkeypatch: pytest.MonkeyPatch) -> None:
    """Up to ``_ONE_BY_ONE`` values are drawn one at a time with Python integers (faster for an
    ungrouped total or a handful of groups); 20,000 values from 5,000 calls of 4 fit the
    distribution (alpha = 1e-6), the check has power, and larger sizes stay vectorized."""
    calls = {"python": 0}
    one = laplace._laplace_python

    def counted(t: int, s: int) -> int:
        calls["python"] += 1
        return one(t, s)

    monkeypatch.setattr(laplace, "_laplace_python", counted)
    scale = Fraction(7, 6)
    sample = np.concatenate([discrete_laplace(scale, 4) for _ in range(5000)])
    assert calls["python"] == 20_000
    assert _small_gof_pvalue(sample, scale) > ALPHA
    assert _small_gof_pvalue(sample, Fraction(3, 2)) < ALPHA
    discrete_laplace(scale, laplace._ONE_BY_ONE + 1)
    assert calls["python"] == 20_000
