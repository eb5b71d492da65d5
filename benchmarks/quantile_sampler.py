"""Latency of dpsql's exact exponential mechanism on quantile scores, with baselines.

Run: ``python benchmarks/quantile_sampler.py`` (about half a minute). Scores are
``quantile_scores`` of the median (p = 1/2, sensitivity 1) over K grid candidates, for 10,000
rows drawn once from a seeded normal centred on the grid (the scores are public benchmark
inputs, so a seeded generator is fine here). Three γ per K:

* concentrated: γ = 1/2 (ε = 1 with γ = ε/(2Δ)): the mass sits on a few candidates;
* spread: γ = 1/256: the mass spreads over a few hundred candidates around the median;
* flat: γ = 1/10**6: every candidate has weight above e^-0.01, nearly uniform.

Columns, each the median wall time of one draw (µs) over several repeats, after a warm-up:

* dpsql: ``exponential_mechanism(scores, gamma)``, one exact draw (table build included), and
  which proposal scheme the table chose;
* numpy Gumbel: ``argmax(-γ·s + Generator.gumbel(size=K))``, the floating-point Gumbel-max
  trick (NOT private: Ilvento 2020). Context only;
* OpenDP: ``make_noisy_max`` (max-divergence, scale 1/γ, negate=True: lower is better) invoked
  on the score list; its exact noisy-max sampler in Rust. ``make_report_noisy_max_gumbel`` is
  deprecated since OpenDP 0.14 in favour of it.
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
import numpy.typing as npt

from dpsql.mechanisms.quantile_score import quantile_scores
from dpsql.noise.exponential import exponential_mechanism
from dpsql.noise.exponential_sampler import _build_table

SIZES = [256, 2048, 16384]
GAMMAS = [
    ("concentrated", Fraction(1, 2)),
    ("spread", Fraction(1, 256)),
    ("flat", Fraction(1, 10**6)),
]
ROWS = 10_000
TARGET_SECONDS = 0.25  # per measured column and configuration
REPEATS = 5


def load_opendp() -> Any | None:
    try:
        dp = importlib.import_module("opendp.prelude")
    except ImportError:  # optional dev dependency: its column is skipped
        return None
    dp.enable_features("contrib")
    return dp


def per_call_us(call: Callable[[], object]) -> float:
    """Median over REPEATS of the mean time per call (µs), each repeat about
    TARGET_SECONDS / REPEATS long."""
    call()  # warm up
    start = time.perf_counter()
    call()
    one = max(time.perf_counter() - start, 1e-6)
    calls = max(1, int(TARGET_SECONDS / REPEATS / one))
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times) * 1e6


def median_scores(size: int, rng: np.random.Generator) -> list[int]:
    rows = np.clip(np.rint(rng.normal(size / 2, size / 8, ROWS)), 0, size - 1).astype(int)
    values, counts = np.unique(rows, return_counts=True)
    histogram = dict(zip(values.tolist(), counts.tolist(), strict=True))
    return quantile_scores(histogram, 0, size - 1, Fraction(1, 2))


def gumbel_max(scores: npt.NDArray[np.float64], gamma: float, rng: np.random.Generator) -> int:
    return int(np.argmax(-gamma * scores + rng.gumbel(size=scores.size)))


def opendp_call(dp: Any | None, scores: list[int], gamma: Fraction) -> Callable[[], object] | None:
    if dp is None:
        return None
    measurement = dp.m.make_noisy_max(
        dp.vector_domain(dp.atom_domain(T=int, nan=False)),
        dp.linf_distance(T=int),
        dp.max_divergence(),
        scale=float(1 / gamma),
        negate=True,
    )
    return partial(measurement, scores)


def main() -> None:
    dp = load_opendp()
    rng = np.random.default_rng(20201109)  # benchmark inputs and the float baseline only
    print(f"median of {REPEATS} repeats; µs per draw (one draw per call)\n")
    header = (
        f"{'K':>6} | {'distribution':>12} | {'gamma':>9} | {'scheme':>7} | {'dpsql':>8} | "
        f"{'numpy Gumbel':>12} | {'OpenDP':>8} | {'dpsql/OpenDP':>12}"
    )
    print(header)
    print("-" * len(header))
    for size in SIZES:
        scores = median_scores(size, rng)
        as_float = np.asarray(scores, dtype=np.float64)
        for name, gamma in GAMMAS:
            table = _build_table(scores, gamma, "auto")
            ours = per_call_us(partial(exponential_mechanism, scores, gamma))
            numpy_us = per_call_us(partial(gumbel_max, as_float, float(gamma), rng))
            call = opendp_call(dp, scores, gamma)
            theirs = per_call_us(call) if call is not None else float("nan")
            scheme = "levels" if table.geometric else "uniform"
            print(
                f"{size:>6} | {name:>12} | {gamma!s:>9} | {scheme:>7} | {ours:>8.1f} | "
                f"{numpy_us:>12.1f} | {theirs:>8.1f} | {ours / theirs:>11.2f}x"
            )


if __name__ == "__main__":
    main()
