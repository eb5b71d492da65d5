"""Candidate mechanisms for choosing a contribution bound privately, simulated with numpy for
``bounds.py``: these are simulations of mechanisms dpsql might adopt, not dpsql features (dpsql
runs none of them; no neighbouring-data-set test checks them yet).

Each route spends a share s of the query's epsilon choosing the bound from the ladder 2^0 ..
2^16 with a differentially private mechanism, then answers at (1 - s)·epsilon with the noise
dpsql uses (a discrete Laplace on counts, a Laplace on sums) and dpsql's sensitivity for the
chosen bound. The exact bounded totals are the oracle's (``bounds.candidates``: a random R of a
unit's rows, min(n, C) rows per (unit, group), a sum scaled to S·C/n), so only the choice differs.

The selection statistic, c(B) on the ladder, is a count of what a bound B cuts off, each unit
moving it by at most 1 (add/remove of a unit, sensitivity 1):

* total COUNT(*) under R: c(R) = #{u : n_u > R}. The bias is sum_u (n_u - R)+, its derivative
  -c(R); the noise's standard deviation sqrt(2)·R/eps_ans. The best R is near c(R) = k with
  k = sqrt(2)/eps_ans.
* total SUM(amount) under R (the rows bound, sensitivity 100·R, as dpsql plans it; not a bound on
  a unit's sum): the bias of keeping R of a unit's n_u rows is (n_u - R)+·a_u, a_u the unit's
  mean amount, so its derivative is -sum_{u: n_u > R} a_u. In units of the upper bound 100:
  c(R) = sum_{u: n_u > R} a_u / 100, each unit contributing at most 1, and the noise's deviation
  sqrt(2)·100·R/eps_ans gives the same target k = sqrt(2)/eps_ans.
* grouped COUNT(*) and SUM by grp under L0 = 8 (every public group) and C: each group's noise has
  deviation sqrt(2)·8·C/eps_ans (×100 for SUM), its bias derivative -#{u : n_ug > C} (for SUM
  weighted by a_ug / 100). One C for all groups minimises the sum of the groups' errors where the
  mean over groups of those counts is sqrt(2)·8/eps_ans, so c(C) = (1/8)·sum over the (unit,
  group) cells with n_ug > C (weighted for SUM) and k = 8·sqrt(2)/eps_ans. A unit is in at most 8
  cells, so c moves by at most 8/8 = 1.

Mechanisms (utility sensitivity 1 in each):

* ``em_rank``: the exponential mechanism over the ladder, u(B) = -|c(B) - k|, P(B) proportional
  to exp(eps_sel·u(B)/2) (McSherry and Talwar, FOCS 2007).
* ``em_overshoot``: the same aimed at a higher bound: the target max(k/4, 1) (``/k4``), or the
  asymmetric u(B) = -max(c(B) - k, 0) - 0.25·max(k - c(B), 0) (``/asym``, still 1-Lipschitz in c).
* ``svt_down``: AboveThreshold (Dwork and Roth 2014, Algorithm 1; one positive answer): the
  threshold k + Lap(2/eps_sel) drawn once, then from the top of the ladder down the first B with
  c(B) + Lap(4/eps_sel) >= it (none: the smallest B). eps_sel in all.
* ``svt_up`` (a variant of this harness's own, not from a paper): AboveThreshold walking the
  ladder from the bottom up on -c(B) against -k: the first B where fewer than about k units
  (noisily) lie above it (none: the largest B). It errs low where ``svt_down`` errs high.
* ``r2t``: Race-to-the-Top (Dong, Fang, Yi, Tao and Machanavajjhala, SIGMOD 2022) for the totals:
  Q~_j = Q(tau_j) + Lap(17·tau_j/eps) - 17·ln(17/beta)·tau_j/eps over the 17 tau_j of the ladder
  (×100 for SUM), beta = 0.1, released max(max_j Q~_j, 0) (Q(0) = 0, the paper's floor). The
  whole epsilon; no separate answer. Its noise here: discrete Laplace on COUNT, Laplace on SUM.
* ``all_groups_em``: grouped COUNT(*) and SUM: L0 = 8 (no L0 cap: every public group), C by the
  exponential mechanism on the grouped c(C) above (rank or asymmetric utility); COUNT(DISTINCT
  user_id) by grp: L0 = 8, nothing to select, the whole epsilon on the answer (``all_groups``).
* ``all_groups_svt_up`` (this harness's own, as ``svt_up``): L0 = 8, C by the bottom-up
  AboveThreshold on the grouped c(C) against k = 8·sqrt(2)/eps_ans.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

LADDER = np.array([2.0**k for k in range(17)])  # R or C: 1 .. 2^16
SHARES = (0.1, 0.25)  # the selection's share of the query's epsilon
UPPER = 100.0  # amount's declared upper bound: a row's most
BETA = 0.1  # Race-to-the-Top's failure probability
OVERSHOOT = 0.25  # the asymmetric utility's weight below the target
GROUPS = 8


@dataclass(frozen=True)
class Stats:
    """What the selection statistics need of one data set: rows per unit and per (unit, group)
    cell, and their mean amount over the upper bound (in [0, 1])."""

    rows: FloatArray
    mean: FloatArray
    cell_rows: FloatArray
    cell_mean: FloatArray


def stats(unit: IntArray, group: IntArray, amount: FloatArray) -> Stats:
    rows = np.bincount(unit).astype(np.float64)
    sums = np.bincount(unit, weights=amount)
    _, inverse, cell_rows = np.unique(unit * GROUPS + group, return_inverse=True,
                                      return_counts=True)  # fmt: skip
    cell_sums = np.bincount(inverse, weights=amount)
    return Stats(
        rows,
        sums / rows / UPPER,
        cell_rows.astype(np.float64),
        cell_sums / cell_rows / UPPER,
    )


def _exceed(n: FloatArray, weight: FloatArray | None) -> FloatArray:
    """sum of ``weight`` (1 if None) over the items with n > B, for each B of the ladder."""
    w = np.ones_like(n) if weight is None else weight
    return np.array([float(w[n > b].sum()) for b in LADDER])


def statistic(s: Stats, kind: str, grouped: bool) -> FloatArray:
    """c(B) on the ladder (module docstring): sensitivity 1."""
    if grouped:
        return _exceed(s.cell_rows, s.cell_mean if kind == "sum" else None) / GROUPS
    return _exceed(s.rows, s.mean if kind == "sum" else None)


def target(epsilon_answer: float, grouped: bool) -> float:
    """k: where c(B) meets the noise's marginal cost, sqrt(2)·(8 grouped, 1 total)/eps_ans."""
    return math.sqrt(2) * (GROUPS if grouped else 1) / epsilon_answer


def exponential(utility: FloatArray, epsilon: float, rng: np.random.Generator) -> int:
    """The exponential mechanism, utility of sensitivity 1: P(i) ~ exp(epsilon·u_i / 2)."""
    logits = epsilon * utility / 2.0
    p = np.exp(logits - logits.max())
    return int(rng.choice(len(p), p=p / p.sum()))


def above_threshold(c: FloatArray, k: float, epsilon: float, rng: np.random.Generator) -> int:
    """AboveThreshold from the top of the ladder down: the first B with c(B) + Lap(4/eps) >=
    k + Lap(2/eps), else the smallest."""
    threshold = k + rng.laplace(scale=2.0 / epsilon)
    for i in range(len(c) - 1, -1, -1):
        if c[i] + rng.laplace(scale=4.0 / epsilon) >= threshold:
            return i
    return 0


def below_threshold(c: FloatArray, k: float, epsilon: float, rng: np.random.Generator) -> int:
    """AboveThreshold from the bottom of the ladder up, on -c(B) (sensitivity 1): the first B
    with -c(B) + Lap(4/eps) >= -k + Lap(2/eps), else the largest."""
    threshold = -k + rng.laplace(scale=2.0 / epsilon)
    for i in range(len(c)):
        if -c[i] + rng.laplace(scale=4.0 / epsilon) >= threshold:
            return i
    return len(c) - 1


def discrete_laplace(scale: float, size: int, rng: np.random.Generator) -> FloatArray:
    p = -math.expm1(-1.0 / scale)
    return (rng.geometric(p, size) - rng.geometric(p, size)).astype(np.float64)


def noise(kind: str, scale: float, size: int, rng: np.random.Generator) -> FloatArray:
    """dpsql's noise: discrete Laplace on counts, Laplace on sums."""
    if kind == "sum":
        return rng.laplace(scale=scale, size=size)
    return discrete_laplace(scale, size, rng)


@dataclass(frozen=True)
class Mechanism:
    """One variant of a candidate route: ``route`` its family (the column), ``rule`` the
    selection (``rank``, ``k4``, ``asym``, ``svt``, ``svt_up``, ``r2t``), ``share`` the
    selection's share of epsilon."""

    route: str
    rule: str
    share: float
    grouped: bool

    @property
    def name(self) -> str:
        rule = f"/{self.rule}" if self.rule in ("k4", "asym") else ""
        share = f" s={self.share:g}" if self.rule != "r2t" else ""
        return f"{self.route}{rule}{share}"

    def applies(self, kind: str, grouped: bool) -> bool:
        if grouped != self.grouped:
            return False
        return grouped or kind != "units"  # a total COUNT(DISTINCT) has no bound to choose

    def select(self, c: FloatArray, epsilon: float, rng: np.random.Generator) -> int:
        """The chosen ladder index, spending share·epsilon."""
        selection = self.share * epsilon
        k = target((1.0 - self.share) * epsilon, self.grouped)
        if self.rule == "svt":
            return above_threshold(c, k, selection, rng)
        if self.rule == "svt_up":
            return below_threshold(c, k, selection, rng)
        if self.rule == "k4":
            return exponential(-np.abs(c - max(k / 4.0, 1.0)), selection, rng)
        if self.rule == "asym":
            u = -np.maximum(c - k, 0.0) - OVERSHOOT * np.maximum(k - c, 0.0)
            return exponential(u, selection, rng)
        return exponential(-np.abs(c - k), selection, rng)

    def answer(
        self,
        s: Stats,
        kind: str,
        bounded: FloatArray,
        epsilon: float,
        rng: np.random.Generator,
    ) -> tuple[FloatArray, dict[str, int]]:
        """The released values and the bounds, from ``bounded`` (ladder, outputs): the exact
        totals under each bound of the ladder (R for a total, C under L0 = 8 grouped; for a
        grouped COUNT(DISTINCT) one row, L0 = 8)."""
        outputs = bounded.shape[1]
        if kind == "units":  # grouped COUNT(DISTINCT): L0 = 8, the whole epsilon
            return bounded[0] + noise(kind, GROUPS / epsilon, outputs, rng), {"L0": GROUPS}
        per_row = UPPER if kind == "sum" else 1.0
        if self.rule == "r2t":
            steps = len(LADDER)
            tau = per_row * LADDER
            released = (
                bounded[:, 0]
                + np.array([noise(kind, steps * t / epsilon, 1, rng)[0] for t in tau])
                - steps * math.log(steps / BETA) * tau / epsilon
            )
            best = int(np.argmax(released))
            return np.array([max(float(released[best]), 0.0)]), {"R": int(LADDER[best])}
        i = self.select(statistic(s, kind, self.grouped), epsilon, rng)
        answer = (1.0 - self.share) * epsilon
        scale = (GROUPS if self.grouped else 1) * per_row * LADDER[i] / answer
        values = bounded[i] + noise(kind, scale, outputs, rng)
        bound = int(LADDER[i])
        return values, ({"L0": GROUPS, "C": bound} if self.grouped else {"R": bound})

    def seed(self) -> int:
        return zlib.crc32(self.name.encode())


ROUTES = (
    "em_rank",
    "em_overshoot",
    "svt_down",
    "svt_up",
    "r2t",
    "all_groups_em",
    "all_groups_svt_up",
)
MECHANISMS = (
    *(Mechanism("em_rank", "rank", s, False) for s in SHARES),
    *(Mechanism("em_overshoot", r, s, False) for r in ("k4", "asym") for s in SHARES),
    *(Mechanism("svt_down", "svt", s, False) for s in SHARES),
    *(Mechanism("svt_up", "svt_up", s, False) for s in SHARES),
    Mechanism("r2t", "r2t", 0.0, False),
    *(Mechanism("all_groups_em", r, s, True) for r in ("rank", "asym") for s in SHARES),
    *(Mechanism("all_groups_svt_up", "svt_up", s, True) for s in SHARES),
)


def geometric_mean(ratios: list[float]) -> float:
    known = [r for r in ratios if r > 0 and math.isfinite(r)]
    return math.exp(sum(map(math.log, known)) / len(known)) if known else math.inf
