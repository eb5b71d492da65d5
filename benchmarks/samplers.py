"""Throughput of dpsql's exact discrete Laplace and discrete Gaussian samplers, with OpenDP and
numpy for context.

Run: ``python benchmarks/samplers.py``. Every row draws 100,000 values; the figure is the
median wall time over several repeats, in microseconds per value.

Discrete Laplace:

* dpsql: ``discrete_laplace(scale, 100_000)`` (exact; Canonne–Kamath–Steinke 2020 on os.urandom).
* OpenDP: ``make_laplace`` on a vector domain of ints, invoked once on 100,000 zeros: OpenDP's
  exact discrete Laplace sampler in Rust, called in one batch like ours, which is the fair
  comparison. Its one-value-per-call cost (dominated by the Python/FFI round trip) is also
  shown, measured on 2,000 calls.
* numpy: ``Generator.laplace`` (continuous float noise, NOT private: Mironov 2012). Context only.

Discrete Gaussian (same columns):

* dpsql: ``discrete_gaussian(sigma2, 100_000)`` (exact; CKS 2020 Algorithm 3). 10**10/3 has
  2·p·q·t² beyond int64, so each proposal's acceptance runs in Python integers (the slow path).
* OpenDP: ``make_gaussian`` on a vector domain of ints with ``l2_distance``, scale = sigma
  (its exact discrete Gaussian), in one call; and one value per call.
* numpy: ``Generator.normal`` (float, NOT private). Context only.
"""

from __future__ import annotations

import importlib
import statistics
import time
from collections.abc import Callable
from fractions import Fraction
from functools import partial
from typing import Any

import numpy as np

from dpsql.noise.gaussian import discrete_gaussian
from dpsql.noise.laplace import discrete_laplace

N = 100_000
REPEATS = 7
OPENDP_REPEATS = 3  # OpenDP takes ~0.7 s per 100,000 values
ONE_BY_ONE = 2_000
SCALES = [Fraction(1, 3), Fraction(1), Fraction(10), Fraction(1000, 7), Fraction(10**6)]
TARGET_MS = 50.0
SIGMA2S = [Fraction(1, 4), Fraction(1), Fraction(10), Fraction(2500, 7), Fraction(10**6)]
SIGMA2S += [Fraction(10**9), Fraction(10**10, 3)]


def load_opendp() -> Any | None:
    try:
        dp = importlib.import_module("opendp.prelude")
    except ImportError:  # optional dev dependency: its columns are skipped
        return None
    dp.enable_features("contrib")
    return dp


def median_seconds(draw: Callable[[], object], repeats: int) -> float:
    draw()  # warm up (imports, allocator, OpenDP construction caches)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        draw()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def opendp_columns(dp: Any | None, scale: Fraction, ours_us: float) -> str:
    """OpenDP vector call (µs/value), its ratio to dpsql, and the one-value-per-call cost."""
    if dp is None:
        return f"{'n/a':>10} | {'':>6} | {'n/a':>13}"
    vector = dp.m.make_laplace(
        dp.vector_domain(dp.atom_domain(T=int)), dp.l1_distance(T=int), float(scale)
    )
    scalar = dp.m.make_laplace(dp.atom_domain(T=int), dp.absolute_distance(T=int), float(scale))
    vec_us = median_seconds(partial(vector, [0] * N), OPENDP_REPEATS) / N * 1e6

    def one_by_one() -> list[int]:
        return [scalar(0) for _ in range(ONE_BY_ONE)]

    one_us = median_seconds(one_by_one, OPENDP_REPEATS) / ONE_BY_ONE * 1e6
    return f"{vec_us:>10.3f} | {vec_us / ours_us:>5.1f}x | {one_us:>13.2f}"


def opendp_gaussian_columns(dp: Any | None, sigma2: Fraction, ours_us: float) -> str:
    """As ``opendp_columns`` for OpenDP's exact discrete Gaussian (scale = sigma)."""
    if dp is None:
        return f"{'n/a':>10} | {'':>6} | {'n/a':>13}"
    sigma = float(sigma2) ** 0.5
    vector = dp.m.make_gaussian(
        dp.vector_domain(dp.atom_domain(T=int)), dp.l2_distance(T=int), sigma
    )
    scalar = dp.m.make_gaussian(dp.atom_domain(T=int), dp.absolute_distance(T=int), sigma)
    vec_us = median_seconds(partial(vector, [0] * N), OPENDP_REPEATS) / N * 1e6

    def one_by_one() -> list[int]:
        return [scalar(0) for _ in range(ONE_BY_ONE)]

    one_us = median_seconds(one_by_one, OPENDP_REPEATS) / ONE_BY_ONE * 1e6
    return f"{vec_us:>10.3f} | {vec_us / ours_us:>5.1f}x | {one_us:>13.2f}"


def gaussian_table(dp: Any | None, rng: np.random.Generator) -> None:
    print(f"\ndiscrete Gaussian: {N:,} values per draw; median of {REPEATS} repeats; µs/value\n")
    header = (
        f"{'sigma2':>13} | {'dpsql':>7} | {'ms/100k':>7} | {'OpenDP vec':>10} | {'ratio':>6} | "
        f"{'OpenDP 1/call':>13} | {'numpy float':>11} | {'ratio':>6}"
    )
    print(header)
    print("-" * len(header))
    for sigma2 in SIGMA2S:
        ours_us = median_seconds(partial(discrete_gaussian, sigma2, N), REPEATS) / N * 1e6
        numpy_draw = partial(rng.normal, 0.0, float(sigma2) ** 0.5, N)
        numpy_us = median_seconds(numpy_draw, REPEATS) / N * 1e6
        print(
            f"{sigma2!s:>13} | {ours_us:>7.3f} | {ours_us * N / 1e3:>7.1f} | "
            f"{opendp_gaussian_columns(dp, sigma2, ours_us)} | {numpy_us:>11.4f} | "
            f"{ours_us / numpy_us:>5.0f}x"
        )


def main() -> None:
    dp = load_opendp()
    rng = np.random.default_rng()  # numpy's float Laplace, for context only
    print(f"{N:,} values per draw; median of {REPEATS} repeats; microseconds per value\n")
    header = (
        f"{'scale':>9} | {'dpsql':>7} | {'ms/100k':>7} | {'OpenDP vec':>10} | {'ratio':>6} | "
        f"{'OpenDP 1/call':>13} | {'numpy float':>11} | {'ratio':>6}"
    )
    print(header)
    print("-" * len(header))
    worst_ms = 0.0
    for scale in SCALES:
        ours_us = median_seconds(partial(discrete_laplace, scale, N), REPEATS) / N * 1e6
        worst_ms = max(worst_ms, ours_us * N / 1e3)
        numpy_draw = partial(rng.laplace, 0.0, float(scale), N)
        numpy_us = median_seconds(numpy_draw, REPEATS) / N * 1e6
        print(
            f"{scale!s:>9} | {ours_us:>7.3f} | {ours_us * N / 1e3:>7.1f} | "
            f"{opendp_columns(dp, scale, ours_us)} | {numpy_us:>11.4f} | "
            f"{ours_us / numpy_us:>5.0f}x"
        )
    print(
        "\nratio columns: OpenDP-vector time / dpsql time (higher = dpsql faster); "
        "dpsql time / numpy float time (the price of exactness)."
    )
    if dp is None:
        print("opendp is not importable: its columns were skipped.")
    verdict = "meets" if worst_ms < TARGET_MS else "MISSES"
    print(f"slowest dpsql scale: {worst_ms:.1f} ms per {N:,} values ({verdict} < {TARGET_MS} ms)")
    gaussian_table(dp, rng)


if __name__ == "__main__":
    main()
