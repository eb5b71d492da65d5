"""Continual-release views: a query answered period by period over a declared horizon of T
periods, and every range of periods estimated from what was released (pure planning).

Three mechanisms release a view, each at the same cost per person-period unit as the query's own
plan (``base``): one unit lies in one period, so it moves

- **plain**: one released total per period, with the plan's noise; a range of n periods sums
  n of them (variance n·v);
- **tree**: the binary tree's dyadic nodes [k·2^j, (k+1)·2^j) inside the horizon (Dwork, Naor,
  Pitassi, Rothblum 2010; Chan, Shi, Song 2011), each node the total of its periods; a unit is in
  at most L = floor(log2 T) + 1 nodes, so each node takes L times the plan's Laplace scale (L
  times its Gaussian variance: the same rho); a node is released when its last period arrives.
  Ranges are read from the least-squares estimates of the periods given the released nodes
  (Hay, Rastogi, Miklau, Suciu 2010; ``dpsql.plan.workload.least_squares``): consistent, parts
  summing to wholes;
- **factorization** (Gaussian only): the square-root factorization of the prefix-sum matrix
  W = C·C, C lower-triangular Toeplitz with c_j = binom(2j, j)/4^j (Fichtenberger, Henzinger,
  Upadhyay 2023; Henzinger, Upadhyay, Upadhyay 2023). Period t releases u_t = round(s·(C x)_t) +
  Z_t, Z_t a discrete Gaussian, in units of 1/s of the measurement (``SCALE``) so that every
  shift is an integer: a unit in period p shifts u_t (t >= p) by at most ceil(s·c_(t-p)·D) + 1
  (the rounding moves by at most one more), so sigma_f^2 = sigma^2·sum_j shift_j^2/D^2 gives the
  plan's rho exactly (Canonne, Kamath, Steinke 2020: rho = sum of shift^2/(2 sigma^2) for any
  integer shifts). Prefix sums are C·u/s; the rounding's bias, at most sum |w_j|/2, is added to
  every ±.

The mechanism a view is released by is the one whose ± over a range of periods, averaged over
all ranges of the horizon, is smallest (``choose``); ``breakeven`` is the horizon from which the
tree or the factorization beats plain per-period answers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from fractions import Fraction
from functools import lru_cache
from typing import Any, Literal

import numpy as np

from dpsql.errors import InternalError, UnsupportedQueryError
from dpsql.mechanisms.events import Composite, Event
from dpsql.mechanisms.gaussian_events import DiscreteGaussian
from dpsql.mechanisms.group import certified
from dpsql.mechanisms.laplace_events import DiscreteLaplace
from dpsql.mechanisms.tails import Noise, linear_half_width
from dpsql.plan.plans import Measurement, Plan
from dpsql.plan.workload.least_squares import Adjustment, adjust

__all__ = [
    "BREAKEVEN",
    "MAX_HORIZON",
    "MECHANISMS",
    "SCALE",
    "Design",
    "Node",
    "breakeven",
    "choose",
    "coefficients",
    "design",
    "levels",
    "mean_half_widths",
    "nodes",
]

MechanismName = Literal["plain", "tree", "factorization"]
MECHANISMS: tuple[MechanismName, ...] = ("plain", "tree", "factorization")
MAX_HORIZON = 256  # a tree's consistency step is exact rational elimination: at most 255 sums
SCALE = 256  # s: the factorization's values in units of 1/s of the measurement (module doc)
KINDS = ("rows", "count", "sum")  # a view's measurements: totals, which ranges add up
Node = tuple[int, int]  # [start, end) in period indices


def levels(horizon: int) -> int:
    """L: the most dyadic nodes one period lies in, over a horizon of T periods."""
    return horizon.bit_length()


def nodes(horizon: int, mechanism: MechanismName) -> tuple[Node, ...]:
    """What a mechanism releases, in release order (by last period, shortest first): each
    period for plain and factorization, every dyadic node inside the horizon for the tree."""
    if mechanism != "tree":
        return tuple((t, t + 1) for t in range(horizon))
    out = [(k << j, (k + 1) << j) for j in range(levels(horizon)) for k in range(horizon >> j)]
    return tuple(sorted(out, key=lambda n: (n[1], n[1] - n[0])))


@lru_cache(maxsize=64)
def coefficients(horizon: int) -> tuple[Fraction, ...]:
    """c_j = binom(2j, j)/4^j, j < T: the square root of the prefix-sum matrix's Toeplitz
    sequence (sum_(i<=j) c_i c_(j-i) = 1)."""
    return tuple(Fraction(math.comb(2 * j, j), 4**j) for j in range(horizon))


@dataclass(frozen=True)
class Design:
    """How a view is released: the mechanism, the horizon, each measurement's noise per
    released value, and the unit's loss over the whole horizon (``event``: what one person-period
    pays, the reservation in each period)."""

    mechanism: MechanismName
    horizon: int
    noises: tuple[Noise, ...]  # per measurement, of each released value
    event: Composite

    def explain(self) -> list[str]:
        kinds = {"plain": "one total per period", "tree": f"a binary tree of {levels(self.horizon)}"
                 " levels, read by least squares", "factorization": "the square-root "
                 "factorization of the prefix sums"}  # fmt: skip
        return [f"view mechanism: {self.mechanism} ({kinds[self.mechanism]}) over "
                f"{self.horizon} period(s)"]  # fmt: skip


def _shifts(sensitivity: Fraction, horizon: int) -> list[int]:
    """A unit's integer shift of each u_t (t >= its period), in units of 1/SCALE."""
    return [math.ceil(SCALE * c * sensitivity) + 1 for c in coefficients(horizon)]


def _events(base: Plan, mechanism: MechanismName, horizon: int) -> tuple[list[Event], list[Noise]]:
    events = list(base.event.events)
    if len(events) != len(base.measurements):
        raise UnsupportedQueryError("a view's measurements are each one noisy total")
    out: list[Event] = []
    noises: list[Noise] = []
    width = levels(horizon)
    for e, m in zip(events, base.measurements, strict=True):
        if isinstance(e, DiscreteLaplace) and m.scale == e.scale:
            if mechanism == "factorization":
                raise UnsupportedQueryError("the factorization releases Gaussian noise only")
            copies = width if mechanism == "tree" else 1
            laplace = replace(e, scale=e.scale * copies)
            out += [laplace] * copies
            noises.append(Noise(scale=laplace.scale))
        elif isinstance(e, DiscreteGaussian) and m.sigma2 == e.sigma2:
            if mechanism == "factorization":
                shifts = _shifts(e.sensitivity, horizon)
                sigma2 = e.sigma2 * Fraction(sum(s * s for s in shifts)) / e.sensitivity**2
                out += [replace(e, sigma2=sigma2, sensitivity=Fraction(s),
                                target_epsilon=e.target_epsilon / horizon,
                                target_delta=e.target_delta / horizon) for s in shifts]  # fmt: skip
                noises.append(Noise(sigma2=sigma2))
                continue
            copies = width if mechanism == "tree" else 1
            gauss = replace(e, sigma2=e.sigma2 * copies, target_epsilon=e.target_epsilon / copies,
                            target_delta=e.target_delta / copies)  # fmt: skip
            out += [gauss] * copies
            noises.append(Noise(sigma2=gauss.sigma2))
        else:
            raise UnsupportedQueryError("a view's measurements are each one noisy total")
    return out, noises


def design(base: Plan, mechanism: MechanismName, horizon: int) -> Design:
    """The view of ``base`` (its measurements, noise and cost per period) under ``mechanism``;
    ``UnsupportedQueryError`` for a query a view cannot release."""
    if not 1 <= horizon <= MAX_HORIZON:
        raise UnsupportedQueryError(f"a view's horizon is 1 to {MAX_HORIZON} periods")
    if base.selection is not None or base.diagnosis is not None or base.sample is not None:
        raise UnsupportedQueryError(
            "a view groups by public keys only, without a diagnosis or a sample"
        )
    if base.auto is not None or any(m.spec.kind not in KINDS for m in base.measurements):
        raise UnsupportedQueryError(
            "a view releases COUNT and SUM totals, on bounds the policy or the query states"
        )
    events, noises = _events(base, mechanism, horizon)
    # The unit's loss is the plan's: its rho (Gaussian) or its epsilon (Laplace) is split
    # over the values one unit moves; the plan's certified pair holds where a theorem gives it.
    try:
        event = Composite(tuple(events), base.event.certified, base.event.cell)
    except InternalError:
        pair = certified(tuple(events), base.event.delta)
        event = Composite(tuple(events), pair, base.event.cell)
    return Design(mechanism, horizon, tuple(noises), event)


# -- accuracy, in variance units of the plan's own noise (pure numbers: the choice) -----------
def _range_variances(mechanism: MechanismName, horizon: int, gaussian: bool) -> Any:
    """var[a, b] of the estimate of the periods a..b, for unit variance of the plan's noise."""
    t = horizon
    cov: Any
    if mechanism == "plain":
        cov = np.eye(t)
    elif mechanism == "tree":
        width = levels(t)
        node_var = float(width if gaussian else width * width)  # L sigma^2, or (L scale)^2
        rows = np.zeros((len(nodes(t, "tree")), t))
        for i, (a, b) in enumerate(nodes(t, "tree")):
            rows[i, a:b] = 1
        cov = node_var * np.linalg.inv(rows.T @ rows)
    else:
        c = np.array([float(x) for x in coefficients(t)])
        lower = np.array([[c[i - j] if i >= j else 0.0 for j in range(t)] for i in range(t)])
        shifts = float(sum(x * x for x in c)) * SCALE * SCALE  # sigma_f^2/sigma^2 ~ s^2 sum c^2
        prefix_cov = (shifts / SCALE**2) * lower @ lower.T  # Cov(prefix sums)
        diff = np.eye(t) - np.eye(t, k=-1)  # periods from prefix sums
        cov = diff @ prefix_cov @ diff.T
    total = np.cumsum(np.cumsum(cov, axis=0), axis=1)
    padded = np.zeros((t + 1, t + 1))
    padded[1:, 1:] = total
    first, last = np.meshgrid(np.arange(t), np.arange(t), indexing="ij")
    return (padded[last + 1, last + 1] - padded[first, last + 1] - padded[last + 1, first]
            + padded[first, first])  # fmt: skip


def mean_half_widths(horizon: int, gaussian: bool) -> dict[str, float]:
    """Each mechanism's standard deviation of a range's estimate, averaged over all ranges of
    the horizon, in units of the plan's own noise (what ``choose`` compares)."""
    a, b = np.triu_indices(horizon)
    out: dict[str, float] = {}
    for mechanism in MECHANISMS:
        if mechanism == "factorization" and not gaussian:
            continue
        var = _range_variances(mechanism, horizon, gaussian)
        out[mechanism] = float(np.mean(np.sqrt(np.maximum(var[a, b], 0))))
    return out


def choose(horizon: int, gaussian: bool) -> MechanismName:
    """The mechanism of the smallest mean ± over the ranges of the horizon (plain on a tie)."""
    widths = mean_half_widths(horizon, gaussian)
    best = min(widths.values())
    return next(m for m in MECHANISMS if m in widths and widths[m] <= best * (1 + 1e-12))


# ``breakeven`` of each mechanism and noise (Gaussian or not), computed once and checked by
# tests/plan/test_view_mechanisms.py: under pure epsilon the tree's L-fold Laplace scale never pays.
BREAKEVEN: dict[tuple[str, bool], int | None] = {
    ("tree", False): None,
    ("tree", True): 12,
    ("factorization", True): 7,
}


@lru_cache(maxsize=4)
def breakeven(mechanism: MechanismName, gaussian: bool) -> int | None:
    """The smallest horizon from which ``mechanism`` has a smaller mean ± than plain answers;
    None if it does not up to MAX_HORIZON."""
    for t in range(1, MAX_HORIZON + 1):
        widths = mean_half_widths(t, gaussian)
        if mechanism in widths and widths[mechanism] < widths["plain"]:
            return t
    return None


# -- estimates from released values (post-processing) -----------------------------------------
@dataclass(frozen=True)
class Reading:
    """How a mechanism's released values give each range: the least-squares adjustment over the
    released nodes (tree and plain), or the prefix sums (factorization)."""

    design: Design
    released: tuple[Node, ...]  # in the order of the values
    adjustment: Adjustment | None
    # Each range's weights and each (range, noise, confidence)'s ±, computed once.
    _known: dict[object, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, design: Design, released: tuple[Node, ...]) -> Reading:
        if design.mechanism == "factorization":
            return cls(design, released, None)
        index = {n: i for i, n in enumerate(released)}
        constraints = []
        for (a, b), i in index.items():
            mid = (a + b) // 2
            if b - a > 1 and (a, mid) in index and (mid, b) in index:
                constraints.append({i: Fraction(1), index[(a, mid)]: Fraction(-1),
                                    index[(mid, b)]: Fraction(-1)})  # fmt: skip
        return cls(design, released, adjust([Fraction(1)] * len(released), constraints))

    def covered(self) -> int:
        """How many periods, from the first, every range may read (all released)."""
        leaves = {a for a, b in self.released if b - a == 1}
        t = 0
        while t in leaves:
            t += 1
        return t

    def weights(self, start: int, end: int) -> dict[int, Fraction]:
        """The coefficients, on the released values, of the estimate of periods [start, end)."""
        key = (start, end)
        if key not in self._known:
            self._known[key] = self._weights(start, end)
        return self._known[key]  # type: ignore[no-any-return]

    def _weights(self, start: int, end: int) -> dict[int, Fraction]:
        if not 0 <= start < end <= self.covered():
            raise UnsupportedQueryError("the range reads a period the view has not released")
        if self.adjustment is None:
            c = coefficients(self.design.horizon)
            w: dict[int, Fraction] = {}
            for j in range(end):  # prefix(end - 1) - prefix(start - 1), each C·u/s
                value = c[end - 1 - j] - (c[start - 1 - j] if j <= start - 1 else 0)
                if value:
                    w[j] = value / SCALE
            return w
        leaves = {n: i for i, n in enumerate(self.released) if n[1] - n[0] == 1}
        return self.adjustment.combination({leaves[(p, p + 1)]: Fraction(1)
                                            for p in range(start, end)})  # fmt: skip

    def estimate(
        self, values: list[int], start: int, end: int, noise: Noise, confidence: float
    ) -> tuple[Fraction, float]:
        """The range's estimate (in measurement units) and its ± at ``confidence``."""
        w = self.weights(start, end)
        value = sum((a * values[k] for k, a in w.items()), Fraction(0))
        key = (start, end, noise, confidence)
        if key not in self._known:
            width = linear_half_width([(a, noise) for a in w.values()], confidence)
            if self.adjustment is None:
                width += float(sum(abs(a) for a in w.values())) / 2  # the rounding's bias
            self._known[key] = width
        return value, float(self._known[key])


def same_measurements(a: tuple[Measurement, ...], b: tuple[Measurement, ...]) -> bool:
    """Whether a node's plan measures what the view's plan does, with the same sensitivities."""
    keep = ("spec", "per_group", "groups", "unit", "row_bound")
    return len(a) == len(b) and all(
        all(getattr(x, k) == getattr(y, k) for k in keep) for x, y in zip(a, b, strict=True)
    )
