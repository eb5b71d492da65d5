"""Bounds chosen per query (``dpsql.bounds = auto``, or a table's policy ``bounds``): the plan.

A query whose contribution bounds or clamps nothing declares (the policy, a SET, an estimate)
may leave them to dpsql, which spends a share ``s`` of the query's epsilon choosing them from
its own rows under differential privacy, then answers with the rest. Everything here is public:
which bounds are chosen, each choice's epsilon and the rank it aims at, the ladder of
candidates, and the charged event; the choice itself runs after the charge
(``dpsql.release.auto_bounds``). EXPLAIN shows this plan and never a chosen value.

**The trade-off.** A bound B cuts what lies beyond it (a bias) and scales the noise (a spread).
For a total COUNT under a row cap R, the bias is ``Σ_u (n_u − R)+``, whose derivative in R is
minus the number of units with more than R rows, and the noise's standard deviation is
``σ₁·R``, where ``σ₁ = √2/ε_j`` is the deviation of a discrete Laplace at sensitivity 1 (ε_j the
measurement's epsilon). Their sum is least near the R with about ``k = σ₁`` units above it.
For the per-group cap C under L0 groups, each of G groups has deviation ``σ₁·L0·C`` and a
bias whose derivative is minus its (unit, group) cells above C, so group g's own error is least
near the C with about ``L0·σ₁`` of its cells above it. One C serves every group, and each output
is read relative to its size: the walk weighs each group's cells by the inverse of its noisy
size (``GroupWeights``), so that a small group counts as much as a large one, and aims at
``L0·σ₁`` weighted cells. (Weighing every group alike, as the summed absolute error does, lets
the largest groups set C: measured 3-6 times the best error on groups of Zipf sizes,
``benchmarks/README.md``, bounds.) A clamp's
upper bound U aims at ``σ₁`` units with a value beyond it (each cut unit loses at least a
row's excess, so this errs high: a bound too high costs noise linearly, one too low costs every
row beyond it).

**The choice** (``Choice``) walks a ladder of candidates upward and stops at the first with at
most about k units (or cells) beyond it: AboveThreshold over monotone counts
(``dpsql.noise.sparse_vector``; Lyu, Su and Li 2017), the same walk as ``ESTIMATE BOUNDS ... FOR
EPSILON``, with 3/5 of its epsilon on the threshold (``TRADEOFF_THRESHOLD``). Where the walk
cannot resolve its target (its threshold noise's scale exceeds k, as for a total at the default
share), it **overshoots by one rung** (``overshoot``): the first rung whose noisy count dips to
the threshold is the least of many noisy counts, so the walk errs low, and a cap one rung (1.33
to 1.5 times) too high costs at most that factor in noise where one too low costs every row
beyond it (``benchmarks/README.md``, bounds, has the measured gain). Grouped walks under
L0 of 6 or more (at the default share), whose target is L0 times larger, resolve it and do not
step. L0 over a public
domain of at most ``ALL_GROUPS`` key combinations is every combination, a public fact, and
costs nothing.

**The group weights** (``GroupWeights``, C's walk over a public domain of G groups) take
``WEIGHTS_SHARE`` of the walk's epsilon: each group's size, the rows of its cells with each
cell's counted up to ``WEIGHT_CAP``, gets a discrete Laplace of scale ``WEIGHT_CAP·G/ε_w`` (one
unit adds at most ``WEIGHT_CAP`` to each of at most G groups: L1 sensitivity ``WEIGHT_CAP·G``;
the Laplace mechanism, Dwork and Roth 2014, Theorem 3.6). The weights are post-processing:
``w_g = ⌊WEIGHT_TOTAL·(1/d_g)/Σ_h(1/d_h)⌋``, d_g the noisy size read as at least
``WEIGHT_FLOOR`` noise scales (a size within the noise weighs as a small group, never as an
empty one), for every group of the domain, present or not. The walk then reads
``Σ_g w_g·(cells of g above the rung)``, which one unit moves by at most ``W = Σ_g w_g`` (one
cell per group), all upward: the monotone sparse vector at sensitivity W and the rest of the
epsilon, target ``W·L0·σ₁``. Equal sizes give equal weights and the walk of the summed error.

**The charge.** One ``PureDP`` event of the choices' epsilon (sequential composition of pure
mechanisms, Dwork and Roth 2014, Theorem 3.16), beside one event of the answer's
(1 − s)·epsilon: ``PureDP`` for a pure answer, ``ApproxDP`` with partition selection. The answer
is planned again with the chosen bounds, and any bounds give a Laplace plan of exactly that
epsilon and delta (its split across measurements may differ; the sum does not), so the charge
is fixed before anything is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from dpsql.mechanisms.events import Composite
from dpsql.mechanisms.stated_events import ApproxDP, PureDP
from dpsql.policy.numbers import decimal_text

ROWS = "max_rows_per_unit"
GROUPS = "max_groups_per_unit"
ROWS_PER_GROUP = "max_rows_per_unit_per_group"
CLAMPS = "clamps"
ALL_GROUPS = 64  # L0 is every public key combination up to this many (free); else chosen
TOP = 65536  # the largest contribution bound a choice returns (2^16)
LADDER_TEXT = "1, 2, 3, 4, 6, 8, 12, ..., 65536"


def ladder(top: int) -> tuple[int, ...]:
    """The powers of two and 1.5 times them from 1 up to ``top``, and ``top`` itself."""
    rungs, power = {top}, 1
    while power <= top:
        rungs.update(r for r in (power, 3 * power // 2) if 1 <= r <= top)
        power *= 2
    return tuple(sorted(rungs))


def rung_index(value: int, rungs: tuple[int, ...]) -> int:
    """The index of the smallest rung at or above ``value`` (the top for anything beyond)."""
    for i, rung in enumerate(rungs):
        if value <= rung:
            return i
    return len(rungs) - 1


LADDER = ladder(TOP)  # powers of two and 1.5 times them, 1 to 2^16: 33 candidates
SQRT2 = Fraction(665857, 470832)  # a rational within 2e-12 of √2 (a Pell convergent)
TRADEOFF_THRESHOLD = Fraction(3, 5)  # a trade-off walk's threshold share of its epsilon
WEIGHTS_SHARE = Fraction(7, 20)  # of C's cell walk's epsilon: the groups' noisy sizes
WEIGHT_CAP = 4  # a cell's rows counted in its group's size, at most
WEIGHT_FLOOR = 2  # a group's noisy size is read as at least this many noise scales
WEIGHT_TOTAL = 1024  # the integer group weights sum to at most this (the walk's sensitivity)


def overshoot(epsilon: Fraction, sensitivity: int, target: Fraction) -> int:
    """How many rungs a trade-off walk of ``epsilon`` steps past its stop: 1 where its threshold
    noise's scale, Δ/(3/5·ε), exceeds the target k (it cannot resolve k), else 0 (module
    docstring). Public: it reads parameters only; stepping is post-processing of the stop."""
    return 1 if sensitivity / (epsilon * TRADEOFF_THRESHOLD) > target else 0


@dataclass(frozen=True)
class GroupWeights:
    """The noisy group sizes of C's walk over the cells of ``groups`` public key combinations,
    at ``epsilon`` (module docstring)."""

    epsilon: Fraction
    groups: int

    @property
    def scale(self) -> Fraction:
        """The discrete Laplace scale of each size: L1 sensitivity WEIGHT_CAP·G over epsilon."""
        return WEIGHT_CAP * self.groups / self.epsilon

    def weights(self, noisy: list[int]) -> list[int]:
        """The integer weights from the noisy sizes, one per group (post-processing)."""
        floor = WEIGHT_FLOOR * self.scale
        inverse = [1 / max(Fraction(n), floor) for n in noisy]
        total = sum(inverse)
        return [int(WEIGHT_TOTAL * v / total) for v in inverse]


@dataclass(frozen=True)
class Choice:
    """One bound chosen by a walk up a ladder: ``bound`` (ROWS, GROUPS, ROWS_PER_GROUP, or
    CLAMPS for a column's lower and upper), the walk's ``epsilon``, and what it counts:
    ``statistic`` ``units`` (units whose value exceeds the rung: rows for R, groups for L0, the
    largest group's rows for C) or ``cells`` ((unit, group) cells with more rows than the rung,
    sensitivity the G public key combinations a unit can touch). ``table``/``column``: a
    clamp's column."""

    bound: str
    epsilon: Fraction
    statistic: str = "units"
    sensitivity: int = 1
    table: str = ""
    column: str = ""

    def target(self, noise: Fraction, l0: int, groups: int | None) -> Fraction:
        """k, the count of units (cells) beyond the bound the walk stops at (module
        docstring); ``noise``: σ₁, ``l0``: the L0 of the answer (known before C's walk)."""
        if self.bound == ROWS_PER_GROUP:
            return l0 * noise  # per unit of weight for the cells (GroupWeights)
        return noise

    @property
    def weights(self) -> GroupWeights | None:
        """The group weights of C's walk over cells (module docstring), else None."""
        if self.statistic != "cells":
            return None
        return GroupWeights(self.epsilon * WEIGHTS_SHARE, self.sensitivity)

    def steps(self, target: Fraction) -> int:
        """The walk's overshoot (``overshoot``) at ``target``; a weighted walk's sensitivity W
        and target W·``target`` give the same as sensitivity 1 and ``target``."""
        if self.weights is not None:
            return overshoot(self.walk_epsilon, 1, target)
        return overshoot(self.epsilon, self.sensitivity, target)

    @property
    def walk_epsilon(self) -> Fraction:
        """The epsilon of the walk itself: the choice's, less its group weights'."""
        w = self.weights
        return self.epsilon - (w.epsilon if w is not None else 0)

    def explain(self, noise: Fraction, l0: int | None, groups: int | None) -> str:
        what = {
            ROWS: "max_rows_per_unit (R): units with more rows than the rung",
            GROUPS: "max_groups_per_unit (L0): units in more groups than the rung",
            ROWS_PER_GROUP: (
                "max_rows_per_unit_per_group (C): (unit, group) cells with more rows than the "
                "rung, each group's weighed by the inverse of its noisy size"
                if self.statistic == "cells"
                else "max_rows_per_unit_per_group (C): units whose largest group has more rows "
                "than the rung"
            ),
            CLAMPS: f"lower and upper of {self.table}.{self.column}: units with a value beyond "
            "the rung, on each side",
        }[self.bound]
        if self.bound == ROWS_PER_GROUP and l0 is None:
            k = f"{_num(self.target(noise, 1, groups))}·L0 (L0 as chosen)"
        else:
            k = _num(self.target(noise, l0 or 1, groups))
        ladder = "0 and ±m·2^e up to ±2^52" if self.bound == CLAMPS else LADDER_TEXT
        one = f", one unit moves it by <= {self.sensitivity}" if self.sensitivity > 1 else ""
        w = self.weights
        if w is not None:
            k = f"{k}·W (W the weights' total, at most {WEIGHT_TOTAL})"
            one = (
                f" (the sizes: rows of each group's cells, at most {WEIGHT_CAP} a cell, discrete "
                f"Laplace of scale {_num(w.scale)}, epsilon {_num(w.epsilon)}; one unit moves the "
                "weighted count by <= W)"
            )
        step = ""
        if self.bound == ROWS_PER_GROUP and l0 is None:
            step = " (then one rung higher where the walk's noise exceeds k)"
        elif self.bound != CLAMPS and self.steps(self.target(noise, l0 or 1, groups)):
            step = ", then one rung higher (the walk's noise exceeds k: it overshoots)"
        return (
            f"auto bound {what}{one}; the first rung of {ladder}, walking up, with at most about "
            f"k = {k} beyond it{step} (sparse vector, epsilon {_num(self.walk_epsilon)})"
        )


@dataclass(frozen=True)
class AutoBounds:
    """The bounds a query chooses, all public: the selection's share and epsilon, the answer's
    epsilon, each walk, L0 fixed to every public key combination (or None), and the answer's
    σ₁ the targets are read from. ``sql``: the engine's histograms of the query's relation for
    the contribution walks (``dpsql.bound.selection``), ``clamp_sql`` one per clamped column."""

    share: Fraction
    epsilon: Fraction
    answer_epsilon: Fraction
    choices: tuple[Choice, ...]
    fixed: tuple[tuple[str, int], ...]  # bounds set without a walk (public facts, free)
    groups: int | None
    noise: Fraction
    sql: str | None
    clamp_sql: tuple[str, ...]

    @property
    def fixed_l0(self) -> int | None:
        return dict(self.fixed).get(GROUPS)

    def explain(self) -> list[str]:
        lines = [
            f"auto bounds: share {decimal_text(self.share)} of the query's epsilon chooses them "
            f"(epsilon {_num(self.epsilon)}, split evenly among the walks), the rest answers "
            f"(epsilon {_num(self.answer_epsilon)}); the chosen values are released with the "
            "answer, never shown here"
        ]
        for name, value in self.fixed:
            why = (
                "every public key combination"
                if name == GROUPS
                else "the query measures distinct units only, which it does not change"
            )
            lines.append(f"auto bound {name} = {value}: {why} (a public fact: free)")
        lines.extend(c.explain(self.noise, self.fixed_l0, self.groups) for c in self.choices)
        lines.append(
            f"auto bounds: targets k from the answer's noise, sigma_1 = sqrt(2)/epsilon_j = "
            f"{_num(self.noise)} per unit of sensitivity"
        )
        return lines

    def event(self, answer: Composite) -> Composite:
        """The charged event: the walks' PureDP beside the answer's stated loss (module
        docstring), whatever bounds the walks choose."""
        stated = (
            PureDP(answer.epsilon, "the answer, at the bounds chosen")
            if answer.delta == 0
            else ApproxDP(answer.epsilon, answer.delta, "the answer, at the bounds chosen")
        )
        walks = PureDP(self.epsilon, "auto bounds: " + ", ".join(c.bound for c in self.choices))
        # A clamp's walk reads its whole column, not one cell's units: no parallel composition.
        cell = None if any(c.bound == CLAMPS for c in self.choices) else answer.cell
        return Composite((walks, stated), None, cell)


def noise_per_unit(epsilons: list[Fraction]) -> Fraction:
    """σ₁ of the answer's most precise Laplace measurement: √2/ε_j (erring towards a higher
    bound, since the noisiest measurement's target would cut more)."""
    return SQRT2 / max(epsilons)


def _num(value: Fraction) -> str:
    text = decimal_text(value)
    return text if len(text) <= 8 else f"{float(value):.4g}"


__all__ = [
    "ALL_GROUPS",
    "CLAMPS",
    "GROUPS",
    "LADDER",
    "ROWS",
    "ROWS_PER_GROUP",
    "TOP",
    "TRADEOFF_THRESHOLD",
    "WEIGHTS_SHARE",
    "WEIGHT_CAP",
    "WEIGHT_FLOOR",
    "WEIGHT_TOTAL",
    "AutoBounds",
    "Choice",
    "GroupWeights",
    "ladder",
    "noise_per_unit",
    "overshoot",
    "rung_index",
]
