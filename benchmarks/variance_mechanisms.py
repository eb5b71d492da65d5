"""DPSQL+'s Bézier mechanisms beside dpsql's variance and covariance, at equal epsilon.

    python benchmarks/variance_mechanisms.py          # 10 data sets x 1,000 draws a cell: ~5 s
    python benchmarks/variance_mechanisms.py --quick  # 2 x 100, n 100 and 10,000 only: ~2 s
    python benchmarks/variance_mechanisms.py --seeds 10 --mechanism gaussian

A numpy simulation of the mechanisms' arithmetic (no engine, no policy): continuous Laplace
noise (dpsql draws the discrete Laplace on its value grid: its error is the same to within the
grid's step), one row per unit (C = 1), values already clamped to public bounds [lo, hi].

* dpsql (``dpsql/plan/aggregates/spreads.py``): three measurements, Q = Σ(x - m)², S = Σ(x - m)
  and N, m the bounds' midpoint, w = (hi - lo)/2; L1 sensitivities w², w and 1; Laplace scale
  Δ_j/(s_j·ε) for share s_j; VAR_POP = clip(max(Q/n - (S/n)², 0), 0, w²) with n = max(N, 1).
  Shares: ``even`` (1/3 each) and ``split``, the default ``min_max_ratio`` split, which for one
  estimate alone is s_j ∝ (W_j·Δ_j²)^(1/3) with the weights of spreads.py (1 on Q, 4w²/3 on S,
  11w⁴/45 on N). COVAR_POP (``pairs.py``): P = Σ(x - m_x)(y - m_y), S_x, S_y, N, sensitivities
  w_x·w_y, w_x, w_y, 1, weights 1, w_y²/3, w_x²/3, 4w_x²w_y²/9; cov = P/n - (S_x/n)(S_y/n),
  clipped to ±w_x·w_y.
* Bézier (DPSQL+, ``src/dpsql/backend/bezier_mechanisms.py``, ``private_var`` and
  ``private_covar``): the values normalised to u = (x - lo)/(hi - lo) in [0, 1] and the
  Bernstein coefficients of degree 2, b = Σ((1 - u)², 2u(1 - u), u²) (degree 1 in each of x and
  y for the covariance, b = Σ((1 - u)(1 - v), (1 - u)v, u(1 - v), uv)), each coordinate with
  independent noise; n = Σ b, then VAR_POP = clip(b2/n - ((b1/2 + b2)/n)², 0, 1/4)·(hi - lo)²
  and cov = clip(b3/n - ((b2 + b3)/n)((b1 + b3)/n), ±1/4)·dx·dy, as DPSQL+ computes them. One
  row's coefficient vector is a probability vector (non-negative, summing to 1), so a unit of
  C complete rows moves b by at most C in L1 and in L2: the Laplace version spends the whole ε
  on the vector, scale C/ε per coordinate, with no split. DPSQL+ itself uses the Gaussian with
  L2 sensitivity C (``--mechanism gaussian`` compares both at ρ = ε²/2 in zCDP: dpsql's
  measurements σ_j = Δ_j/√(2ρ_j), ρ split evenly or ρ_j ∝ √W_j·Δ_j, its min_max_ratio rule
  for one estimate alone; Bézier σ = C/√(2ρ) per coordinate).

Data (not tuned on): ``uniform`` U[0, 100]; ``normal`` N(50, 15²) clamped to [0, 100];
``lognormal`` exp(N(3, 1)) clamped to [0, 200]; ``bimodal`` 0.3·N(20, 5²) + 0.7·N(80, 8²) clamped
to [0, 100]. For the covariance x is drawn so and y = 10·(0.6·x + 0.4·x'), x' an independent
draw of the same law, bounds [0, 10·hi] (so dx ≠ dy). Per cell (data, n, ε): ``--seeds`` data
sets, ``--draws`` noise draws on each; the median absolute error and the median relative error
(|error| / true value) against the exact VAR_POP (COVAR_POP) of the data set.

Last, the neighbouring pair on which DPSQL+'s ``private_covar`` exceeds its budget: a row with
x NULL and y present enters COUNT(x) not, SUM(y) yes, so its coefficient change is (-v, v, 0, 0),
of L2 norm √2·v (module ``counterexample``).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.stats import norm

Array = npt.NDArray[np.float64]
EPSILONS = (0.1, 0.5, 1.0, 2.0)
SIZES = (100, 1_000, 10_000, 100_000)


@dataclass(frozen=True)
class Law:
    name: str
    hi: float  # bounds [0, hi]
    draw: Callable[[np.random.Generator, int], Array]


LAWS = (
    Law("uniform", 100.0, lambda g, n: g.uniform(0.0, 100.0, n)),
    Law("normal", 100.0, lambda g, n: np.clip(g.normal(50.0, 15.0, n), 0.0, 100.0)),
    Law("lognormal", 200.0, lambda g, n: np.clip(np.exp(g.normal(3.0, 1.0, n)), 0.0, 200.0)),
    Law(
        "bimodal",
        100.0,
        lambda g, n: np.clip(
            np.where(g.random(n) < 0.3, g.normal(20.0, 5.0, n), g.normal(80.0, 8.0, n)),
            0.0,
            100.0,
        ),
    ),
)


def noise(g: np.random.Generator, scale: float, size: int, gaussian: bool) -> Array:
    """Laplace of scale ``scale`` (b), or Gaussian of standard deviation ``scale``."""
    return g.normal(0.0, scale, size) if gaussian else g.laplace(0.0, scale, size)


def shares(weights: tuple[float, ...], sens: tuple[float, ...], gaussian: bool) -> Array:
    """dpsql's min_max_ratio split for one estimate alone (``dpsql.plan.split.alone_shares``):
    ε_j ∝ (W_j·Δ_j²)^(1/3) under Laplace, ρ_j ∝ √W_j·Δ_j under zCDP."""
    w, d = np.array(weights), np.array(sens)
    raw = np.sqrt(w) * d if gaussian else (w * d * d) ** (1 / 3)
    out: Array = raw / raw.sum()
    return out


def scales(budget: float, parts: Array, sens: tuple[float, ...], gaussian: bool) -> Array:
    """Each measurement's noise scale from its share of the budget (ε, or ρ)."""
    d = np.array(sens)
    out: Array = d / np.sqrt(2 * parts * budget) if gaussian else d / (parts * budget)
    return out


def dpsql_var(
    x: Array,
    hi: float,
    *,
    budget: float,
    split: str,
    gaussian: bool,
    k: int,
    g: np.random.Generator,
) -> Array:
    w, m = hi / 2, hi / 2
    c = x - m
    sens = (w * w, w, 1.0)
    weights = (1.0, 4 * w * w / 3, 11 * w**4 / 45)
    parts = np.full(3, 1 / 3) if split == "even" else shares(weights, sens, gaussian)
    sq, ss, sn = scales(budget, parts, sens, gaussian)
    q = float(np.sum(c * c)) + noise(g, sq, k, gaussian)
    s = float(np.sum(c)) + noise(g, ss, k, gaussian)
    n = np.maximum(len(x) + noise(g, sn, k, gaussian), 1.0)
    out: Array = np.clip(np.maximum(q / n - (s / n) ** 2, 0.0), 0.0, w * w)
    return out


def bezier_var(
    x: Array, hi: float, *, budget: float, gaussian: bool, k: int, g: np.random.Generator
) -> Array:
    """DPSQL+'s ``private_var`` (pop=True) with noise of L1 (L2) sensitivity 1 per row."""
    u = x / hi
    b_true = (np.sum((1 - u) ** 2), np.sum(2 * u * (1 - u)), np.sum(u * u))
    scale = 1 / math.sqrt(2 * budget) if gaussian else 1 / budget
    b0, b1, b2 = (float(b) + noise(g, scale, k, gaussian) for b in b_true)
    n = b0 + b1 + b2
    out: Array = np.clip(b2 / n - ((b1 / 2 + b2) / n) ** 2, 0.0, 0.25) * hi * hi
    return out


def dpsql_covar(
    x: Array,
    y: Array,
    hx: float,
    hy: float,
    *,
    budget: float,
    split: str,
    gaussian: bool,
    k: int,
    g: np.random.Generator,
) -> Array:
    wx, wy = hx / 2, hy / 2
    cx, cy = x - wx, y - wy
    sens = (wx * wy, wx, wy, 1.0)
    weights = (1.0, wy * wy / 3, wx * wx / 3, 4 * wx * wx * wy * wy / 9)
    parts = np.full(4, 1 / 4) if split == "even" else shares(weights, sens, gaussian)
    sp, sx, sy, sn = scales(budget, parts, sens, gaussian)
    p = float(np.sum(cx * cy)) + noise(g, sp, k, gaussian)
    s_x = float(np.sum(cx)) + noise(g, sx, k, gaussian)
    s_y = float(np.sum(cy)) + noise(g, sy, k, gaussian)
    n = np.maximum(len(x) + noise(g, sn, k, gaussian), 1.0)
    out: Array = np.clip(p / n - (s_x / n) * (s_y / n), -wx * wy, wx * wy)
    return out


def bezier_coefficients(u: Array, v: Array) -> tuple[float, float, float, float]:
    return (
        float(np.sum((1 - u) * (1 - v))),
        float(np.sum((1 - u) * v)),
        float(np.sum(u * (1 - v))),
        float(np.sum(u * v)),
    )


def bezier_cov_of(b: tuple[Array, ...], dx: float, dy: float) -> Array:
    """DPSQL+'s ``private_covar`` (pop=True) after the noise, on noisy coefficients."""
    b0, b1, b2, b3 = b
    n = b0 + b1 + b2 + b3
    out: Array = np.clip(b3 / n - ((b2 + b3) / n) * ((b1 + b3) / n), -0.25, 0.25) * dx * dy
    return out


def bezier_covar(
    x: Array,
    y: Array,
    hx: float,
    hy: float,
    *,
    budget: float,
    gaussian: bool,
    k: int,
    g: np.random.Generator,
) -> Array:
    scale = 1 / math.sqrt(2 * budget) if gaussian else 1 / budget
    b = tuple(t + noise(g, scale, k, gaussian) for t in bezier_coefficients(x / hx, y / hy))
    return bezier_cov_of(b, hx, hy)


METHODS = ("dpsql even", "dpsql split", "Bézier")


def cell(
    law: Law, n: int, eps: float, *, covar: bool, gaussian: bool, seeds: int, draws: int
) -> tuple[float, list[float], list[float]]:
    """(median true value, median |error| per method, median relative error per method)."""
    budget = eps * eps / 2 if gaussian else eps
    errs: list[list[Array]] = [[] for _ in METHODS]
    truths = []
    for seed in range(seeds):
        g = np.random.default_rng([seed, n, LAWS.index(law), int(covar)])
        x = law.draw(g, n)
        gn = np.random.default_rng([seed, n, LAWS.index(law), int(covar), int(eps * 1000)])
        b, gs = budget, gaussian
        if covar:
            y = 10 * (0.6 * x + 0.4 * law.draw(g, n))
            hx, hy = law.hi, 10 * law.hi
            truth = float(np.mean((x - x.mean()) * (y - y.mean())))
            outs = [
                dpsql_covar(x, y, hx, hy, budget=b, split=s, gaussian=gs, k=draws, g=gn)
                for s in ("even", "split")
            ]
            outs.append(bezier_covar(x, y, hx, hy, budget=b, gaussian=gs, k=draws, g=gn))
        else:
            truth = float(np.var(x))
            outs = [
                dpsql_var(x, law.hi, budget=b, split=s, gaussian=gs, k=draws, g=gn)
                for s in ("even", "split")
            ]
            outs.append(bezier_var(x, law.hi, budget=b, gaussian=gs, k=draws, g=gn))
        truths.append(truth)
        for i, o in enumerate(outs):
            errs[i].append(np.abs(o - truth) / np.array([1.0, abs(truth)])[:, None])
    stacked = [np.concatenate(e, axis=1) for e in errs]  # (2, seeds*draws): abs, rel
    return (
        float(np.median(truths)),
        [float(np.median(s[0])) for s in stacked],
        [float(np.median(s[1])) for s in stacked],
    )


def fmt(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 1e5 else f"{x:.2e}"


def tables(covar: bool, gaussian: bool, sizes: tuple[int, ...], seeds: int, draws: int) -> None:
    name = "COVAR_POP" if covar else "VAR_POP"
    mech = "Gaussian, ρ = ε²/2" if gaussian else "Laplace, pure ε"
    rows: dict[tuple[str, int], list[float]] = {}
    print(f"\n### {name}, {mech}: median |error| (relative) per method\n")
    print("| data | n | ε | true | " + " | ".join(METHODS) + " | Bézier / split |")
    print("|---|---:|---:|---:|" + "---:|" * (len(METHODS) + 1))
    for law in LAWS:
        for n in sizes:
            for eps in EPSILONS:
                truth, ab, rel = cell(
                    law, n, eps, covar=covar, gaussian=gaussian, seeds=seeds, draws=draws
                )
                ratio = ab[2] / ab[1]
                rows.setdefault((law.name, n), []).append(ratio)
                parts = [f"{fmt(a)} ({r:.2%})" for a, r in zip(ab, rel, strict=True)]
                cells = " | ".join(parts)
                print(f"| {law.name} | {n:,} | {eps:g} | {fmt(truth)} | {cells} | {ratio:.2f} |")
    print(f"\n### {name}, {mech}: Bézier / dpsql split, median |error|\n")
    print("| data | n | " + " | ".join(f"ε {e:g}" for e in EPSILONS) + " |")
    print("|---|---:|" + "---:|" * len(EPSILONS))
    for (law_name, n), ratios in rows.items():
        print(f"| {law_name} | {n:,} | " + " | ".join(f"{r:.2f}" for r in ratios) + " |")
    all_r = [r for v in rows.values() for r in v]
    print(
        f"\nBézier / split over all {len(all_r)} cells: median {np.median(all_r):.2f}, "
        f"range {min(all_r):.2f}-{max(all_r):.2f}"
    )


def gauss_delta(eps: float, mu: float) -> float:
    """The tightest δ(ε) of a Gaussian mechanism with sensitivity/σ = mu (Balle and Wang 2018)."""
    return float(norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu))


def gauss_mu(eps: float, delta: float) -> float:
    """The largest sensitivity/σ with δ(ε) <= delta: DPSQL+'s analytic Gaussian calibration."""
    lo, hi = 1e-6, 100.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gauss_delta(eps, mid) <= delta else (lo, mid)
    return lo


def gauss_eps(mu: float, delta: float) -> float:
    lo, hi = 0.0, 100.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if gauss_delta(mid, mu) <= delta else (mid, hi)
    return hi


def counterexample(draws: int) -> None:
    """D: N complete rows, x at its upper bound, y half at each bound (true covariance 0).
    D': D and one more unit of C rows with x NULL and y at its upper bound. DPSQL+'s backends
    (polars, pandas, Spark) take COUNT over x only, SUM(x) and SUM(y) over their non-NULL values
    and SUM(x·y) over rows with both; ``private_covar`` maps those to b exactly as below."""
    big_n, c, lx, hx, ly, hy = 10_000, 5, 0.0, 1.0, 0.0, 1000.0
    dx, dy = hx - lx, hy - ly
    rows_d: list[tuple[float | None, float]] = [(hx, ly if i % 2 else hy) for i in range(big_n)]
    rows_d2 = rows_d + [(None, hy)] * c

    def coefficients(rows: Sequence[tuple[float | None, float]]) -> Array:
        cnt = sum(1 for r in rows if r[0] is not None)
        sx = sum(r[0] for r in rows if r[0] is not None)
        sy = sum(r[1] for r in rows)
        sxy = sum(r[0] * r[1] for r in rows if r[0] is not None)
        nx, ny = (sx - lx * cnt) / dx, (sy - ly * cnt) / dy
        nxy = (sxy - ly * sx - lx * sy + cnt * lx * ly) / (dx * dy)
        return np.array([cnt - nx - ny + nxy, ny - nxy, nx - nxy, nxy])

    b, b2 = coefficients(rows_d), coefficients(rows_d2)
    l2 = float(np.linalg.norm(b2 - b))
    print("\n### The counterexample: DPSQL+'s COVAR with a NULL x\n")
    print(
        f"D: {big_n:,} rows (x = {hx:g}, y alternately {ly:g} and {hy:g}); D' adds one unit "
        f"of C = {c} rows (x NULL, y = {hy:g}); x in [{lx:g}, {hx:g}], y in [{ly:g}, {hy:g}]."
    )
    print(
        f"b(D') - b(D) = {np.round(b2 - b, 9).tolist()}: L2 = {l2:.4f} = {l2 / c:.4f}·C; "
        "the noise is calibrated to C (sensitivity C·dx, σ/dx per coordinate)."
    )
    # DPSQL+ splits the query's (ε, δ) evenly over its aggregates plus the key selection: one
    # COVAR_POP takes (ε/2, δ/2).
    rng = np.random.default_rng(0)
    print(
        "\n| query ε, δ | COVAR's share | σ/dx (normalised) | claimed μ | actual μ (b) | "
        "measured μ (released cov) | actual ε of the share at its δ | δ at its ε |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for eps, delta in ((1.0, 1e-5), (0.5, 1e-6)):
        e_a, d_a = eps / 2, delta / 2
        mu = gauss_mu(e_a, d_a)
        sig = c / mu  # noise std of each normalised coefficient: σ/dx with σ = C·dx/μ
        outs = []
        for coef in (b, b2):
            noisy = tuple(t + rng.normal(0.0, sig, draws) for t in coef)
            outs.append(bezier_cov_of(noisy, dx, dy))
        pooled = math.sqrt((np.var(outs[0]) + np.var(outs[1])) / 2)
        mu_out = abs(float(np.mean(outs[1]) - np.mean(outs[0]))) / pooled
        se = math.sqrt(2 / draws)  # the standard error of that mean shift, in units of σ
        actual = l2 / sig
        print(
            f"| {eps:g}, {delta:g} | {e_a:g}, {d_a:g} | {sig:.3f} | {mu:.4f} | {actual:.4f} | "
            f"{mu_out:.4f} ± {2 * se:.4f} | {gauss_eps(actual, d_a):.3f} | "
            f"{gauss_delta(e_a, actual):.2e} |"
        )
    print(
        "\n(μ = sensitivity/σ of a Gaussian mechanism. Measured: the released covariance's mean "
        f"shift between D and D' over its standard deviation, {draws:,} draws on each, ± two "
        "standard errors; near-linear in the noise at this N, so it is the released output's μ.)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 seeds x 100 draws, n 100, 10,000")
    parser.add_argument("--seeds", type=int, help="data sets per cell (10; 2 with --quick)")
    parser.add_argument("--draws", type=int, help="noise draws per data set (1,000; 100 --quick)")
    parser.add_argument("--mechanism", choices=("laplace", "gaussian"), default="laplace")
    parser.add_argument("--only", choices=("var", "covar"), help="one aggregate only")
    args = parser.parse_args()
    seeds = args.seeds or (2 if args.quick else 10)
    draws = args.draws or (100 if args.quick else 1_000)
    sizes = (100, 10_000) if args.quick else SIZES
    gaussian = args.mechanism == "gaussian"
    start = time.perf_counter()
    print(f"{seeds} data sets x {draws} noise draws per cell, {args.mechanism}, C = 1")
    for covar in (False, True):
        if args.only != ("var" if covar else "covar"):
            tables(covar, gaussian, sizes, seeds, draws)
    counterexample(100_000 if args.quick else 1_000_000)
    print(f"\n{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
