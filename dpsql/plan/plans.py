"""The plan of one query and what it is made of: the options it runs with, its measurements,
the estimates computed from them, partition selection, and EXPLAIN's account of it all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property
from typing import Literal

from sqlglot import exp

from dpsql.analyze.analysis import Analysis, GroupKey
from dpsql.bound.grid import Grid
from dpsql.bound.rewrite import bound_contributions, parse_bounded
from dpsql.bound.specs import Bounding, MeasurementSpec
from dpsql.mechanisms.events import Composite
from dpsql.plan.auto import AutoBounds
from dpsql.plan.sample import Sample
from dpsql.policy import DeclaredMechanism, Mechanism
from dpsql.policy.numbers import decimal_text
from dpsql.sql.aggregates import AggregateKind
from dpsql.sql.parse import DIALECT


@dataclass(frozen=True)
class QueryOptions:
    """The privacy parameters and bounds one query runs with (public values)."""

    epsilon: Fraction
    delta: Fraction
    max_groups_per_unit: int | None
    max_rows_per_unit_per_group: int | None
    confidence: float = 0.95
    mechanism: Mechanism = "laplace"
    rho: Fraction | None = None  # with the gaussian: the query's rho instead of (epsilon, delta)
    sigma: Fraction | None = (
        None  # or a noise multiplier: rho is then 1/(2 sigma^2) per measurement
    )
    max_rows_per_unit: int | None = None  # R: a unit's rows across all groups
    # Under the PLD filter: the policy's declared mechanism, which calibrates every measurement
    # (dpsql.plan.declared), and the settings the analyst gave (not the policy's defaults).
    declared: DeclaredMechanism | None = None
    asked: frozenset[str] = frozenset()
    # Release a diagnosis of the bounds too (``dpsql.plan.diagnosis``), at this epsilon (None:
    # diagnose_share of the query's). Not asked (the policy's default), it is left out where it
    # does not apply (a sample) rather than refused.
    diagnose: bool = False
    diagnose_asked: bool = True
    diagnose_epsilon: Fraction | None = Fraction(1, 10)
    diagnose_share: Fraction = Fraction(1, 10)
    # How the budget is split across the measurements (``dpsql.plan.split``).
    split: Literal["min_max_ratio", "min_total_variance", "even"] = "min_max_ratio"
    # Or each measurement's own budget, solved for an accuracy target (dpsql.plan.targets):
    # epsilon_j for a discrete Laplace or exponential mechanism, rho_j for a discrete Gaussian.
    budgets: tuple[Fraction, ...] | None = None
    # A unit-level Poisson sample at this rate (``dpsql.analyze.sample``; None: every unit).
    sample: Fraction | None = None
    # On a sample: release COUNT and SUM estimates of the whole table, scaled by 1/q.
    sample_scale: bool = False
    # VARIANCE and STDDEV from one joint Bernstein measurement where it applies (the Laplace,
    # no accuracy target: ``dpsql.plan.aggregates.bernstein``); off: Q, S and N each measured.
    # Not in the repr: it chooses measurements, not rows or settings a family's digest compares
    # (``dpsql.plan.workload.family.base_digest``; the measurements are compared apart).
    joint_moments: bool = field(default=True, repr=False)


MAX_ROWS = 2**63 - 1  # the rows (so units) any table can hold: a row count is a BIGINT
MAX_EXACT_TOTAL = 10**38 - 1  # DECIMAL(38,0); DuckDB's HUGEINT holds more


def fits_exactly(per_group: int) -> bool:
    """Whether a group's exact total, at most ``per_group`` from each of at most 2^63 - 1
    units, is proven to fit 38 digits (Spark's DECIMAL(38,0), within DuckDB's HUGEINT) on any
    data: the check both engines refuse the same queries by (``dpsql.plan.sensitivity``)."""
    return per_group * MAX_ROWS <= MAX_EXACT_TOTAL


@dataclass(frozen=True)
class Measurement:
    """One noisy measurement: an integer total per group plus discrete noise.

    One unit moves at most ``groups`` groups' totals (L0, or 1 without GROUP BY), each by at most
    ``per_group`` integer units: L1 = groups·per_group, L2 = sqrt(groups)·per_group.
    Exactly one of ``scale`` (discrete Laplace) and ``sigma2`` (discrete Gaussian) is set.
    """

    spec: MeasurementSpec
    label: str
    per_group: int
    groups: int
    unit: Fraction  # the value of one integer unit (1 for counts, g or g/2 for sums)
    scale: Fraction | None = None
    sigma2: Fraction | None = None
    # With a total row cap R: R times what one row can move a total (None without R).
    row_bound: int | None = None
    grid: Grid | None = None  # the candidates of a quantile
    # Its share of the query's epsilon (discrete Laplace, exponential) or of the Gaussian
    # part's rho (discrete Gaussian), from ``dpsql.plan.split``; None under a declared mechanism.
    share: Fraction | None = None
    # Answered from a workload's measurements (``dpsql.release.families``): its error is a linear
    # combination of their noises, one signature of (coefficient, discrete Laplace scale)
    # pairs per distinct combination among its cells; None for a measurement of its own.
    combined: tuple[tuple[tuple[Fraction, Fraction], ...], ...] | None = None

    @property
    def sensitivity(self) -> int:
        """L1 sensitivity in integer units: L0·(per group), and at most R·(per row) when the
        unit's rows are capped at R in total (DESIGN.md section 3: L1 = min(L0'·C', R))."""
        full = self.groups * self.per_group
        return full if self.row_bound is None else min(full, self.row_bound)

    @property
    def exponential(self) -> bool:
        """A quantile: the exponential mechanism with ``scale`` (Smith 2011)."""
        return self.spec.kind == "quantile"

    @property
    def epsilon(self) -> Fraction:
        """The pure epsilon of a discrete Laplace measurement."""
        assert self.scale is not None
        return self.sensitivity / self.scale

    @property
    def rho(self) -> Fraction:
        """The zCDP rho of a discrete Gaussian measurement."""
        assert self.sigma2 is not None
        return self.groups * self.per_group**2 / (2 * self.sigma2)


@dataclass(frozen=True)
class Estimate:
    """How one aggregate of the query is computed from measurements (post-processing): the
    measurements its kind's rule declares (``dpsql.plan.aggregates``), in the rule's order."""

    kind: AggregateKind
    measurements: tuple[int, ...]
    grid: Grid | None
    grid2: Grid | None = None  # the other value's, for F(y, x) (``dpsql.plan.aggregates.pairs``)
    # Its measurements are one Bernstein vector's coordinates 0, 1, 2, not Q, S and N
    # (``dpsql.plan.aggregates.bernstein``).
    joint: bool = False


@dataclass(frozen=True)
class Selection:
    """Private-key partition selection on the noisy count of distinct units per group."""

    measurement: int
    threshold: int
    delta: Fraction


@dataclass(frozen=True)
class Diagnosis:
    """The diagnosis of a query's bounds: a noisy histogram of the 2^k patterns of its flags
    (``dpsql.bound.diagnosis``), one unit in exactly one cell, so one unit moves one cell by 1:
    L1 = L2 = 1 (Dwork, McSherry, Nissim, Smith 2006). ``measurement`` carries its noise."""

    flags: tuple[str, ...]  # in the order of their bits: "L0", "C", "R", "clamped"
    limits: tuple[tuple[str, int], ...]  # the bound each contribution flag compares with
    measurement: Measurement
    engine_sql: str
    epsilon: Fraction | None = None  # the pure epsilon charged for it (None: a Gaussian)
    table: str = ""  # the table whose bounds it diagnoses (what ESTIMATE BOUNDS would read)
    keys: tuple[str, ...] = ()  # the query's GROUP BY columns, for the advice it gives
    share: Fraction | None = None  # its epsilon as the policy's share of the query's (or set)
    # The query and the diagnosis as one statement over one scan (``dpsql.bound.together``),
    # for an engine that ``shares_rows``, and the number of the answer's columns in it.
    together_sql: str = field(default="", compare=False, repr=False)
    width: int = 0

    @property
    def cells(self) -> int:
        return 1 << len(self.flags)

    def cost_text(self) -> str:
        """What the diagnosis costs: ``epsilon 0.05``, or under a declared Gaussian its rho."""
        if self.epsilon is not None:
            return f"epsilon {decimal_text(self.epsilon)}"
        return f"rho {decimal_text(self.measurement.rho)}"

    def cost(self) -> str:
        """What EXPLAIN's cost line says of the diagnosis's part in it."""
        return f" (the diagnosis's {self.cost_text()} included)"

    def explain(self) -> list[str]:
        limits = dict(self.limits)
        what = {
            "L0": f"more than L0 = {limits.get('L0')} group(s)",
            "C": f"more than C = {limits.get('C')} row(s) in some group",
            "R": f"more than R = {limits.get('R')} row(s) in total",
            "clamped": "a value outside the bounds of an aggregated expression",
        }
        m = self.measurement
        if m.scale is not None:
            charged = decimal_text(self.epsilon or m.epsilon)
            noise = f"DiscreteLaplace scale {m.scale}, epsilon {charged}"
        else:
            assert m.sigma2 is not None
            noise = f"DiscreteGaussian sigma^2 = {m.sigma2}, rho {decimal_text(m.rho)}"
        if self.epsilon is None:
            why = "the declared mechanism's"
        elif self.share is None:
            why = "dpsql.diagnose_epsilon"
        else:
            why = f"budget.diagnose_share {decimal_text(self.share)} of the query's epsilon"
        return [
            f"diagnosis: units with {'; '.join(f'{f}: {what[f]}' for f in self.flags)}",
            f"diagnosis: a histogram of the {self.cells} flag patterns over the units, "
            f"before bounding; one unit is in one cell, so L1 = L2 = 1; {noise}",
            f"diagnosis: {self.cost_text()} ({why}), a line of the query's charge; "
            "SET dpsql.diagnose = off leaves it out",
        ]


@dataclass(frozen=True)
class Plan:
    analysis: Analysis
    measurements: tuple[Measurement, ...]
    estimates: tuple[Estimate, ...]
    selection: Selection | None
    event: Composite
    max_groups: int
    max_rows: int
    options: QueryOptions
    query: str  # the parameter-bound query text the plan answers
    engine_sql: str  # the bounded query as the engine runs it (generated once)
    skipped: tuple[str, ...] = ()  # bounding steps proven unable to bind, and why
    bounding: Bounding | None = None  # the public numbers the bounded query enforces
    # The histogram of the units' flags, charged in ``event`` with the query (or None).
    diagnosis: Diagnosis | None = None
    # The accuracy target the epsilon was solved for, and what it plans (``dpsql.plan.targets``).
    targets: tuple[str, ...] = ()
    # The query's sample and its own loss before amplification (``dpsql.plan.sample``).
    sample: Sample | None = None
    # The engine's own text of engine_sql for EXPLAIN (Spark SQL on Spark); default DuckDB's.
    shown: Callable[[str], str] | None = field(default=None, compare=False, repr=False)
    # The query is of a grammar the engine is sure to plan (``dpsql.analyze.binds``): its
    # pre-charge check, which only spares the analyst a charge for a query that cannot run,
    # is left out.
    binds: bool = False
    # Bounds chosen after the charge (``dpsql.plan.auto``): this plan is then the answer's at the
    # top candidates, for EXPLAIN, the charge and the cache key; ``replan`` plans the answer at
    # the chosen values (a pure function of them and of what this plan was made from).
    # The key types its post-processing was bound with before the charge (the engine's, by
    # ``dpsql.session.planning.check_soon``); None where no check typed them.
    key_types: tuple[str, ...] | None = field(default=None, compare=False)
    auto: AutoBounds | None = None
    replan: Callable[[Mapping[str, object]], Plan] | None = field(
        default=None, compare=False, repr=False
    )
    # The blocks it reads of each table made of blocks (``dpsql.session.blocks``): (table, ids)
    # fixed at planning; a release is keyed by them (``dpsql.cache.keys``).
    blocks: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def epsilon(self) -> Fraction:
        return self.event.epsilon

    @property
    def delta(self) -> Fraction:
        return self.event.delta

    @cached_property
    def bounded(self) -> exp.Select:
        """The bounded query's tree, built on first use as ``engine_sql`` was (its text:
        ``dpsql.bound.rewrite.bounded_query`` of ``analysis`` and ``bounding``), not parsed
        from it; a plan without a bounding has its text parsed. Shared: copy it to change it."""
        if self.bounding is None:
            return parse_bounded(self.engine_sql)
        return bound_contributions(self.analysis, self.bounding)

    @property
    def bounded_sql(self) -> str:
        return self.bounded.sql(dialect=DIALECT, pretty=True)

    def head(self) -> list[str]:
        """EXPLAIN's first lines: the tables and unit, the bounds, the keys, the other group."""
        a = self.analysis
        rows = self.options.max_rows_per_unit
        source = ", ".join(a.tables) if a.base else f"{', '.join(a.tables)} (joined or derived)"
        bounds = (
            f"bounds: L0 = {self.max_groups} group(s) per unit, C = {self.max_rows} row(s) per "
            "unit and group" + (f", R = {rows} row(s) per unit in total" if rows else "")
        )
        if self.auto is not None:
            bounds = "bounds: chosen for this query (auto), see below; the rest as declared"
        unit = a.unit
        if a.spec.unit_path and a.unit.startswith("_dpsql"):
            # A table's rows resolved along its unit path (dpsql.analyze.units).
            unit = a.spec.unit_text
        lines = [
            f"table {source}: privacy unit {unit}; user-level, add/remove one unit",
            bounds,
            "keys: " + (", ".join(_explain_key(k) for k in a.keys) or "none (one global group)"),
        ]
        for table, ids in self.blocks:
            lines.append(f"blocks of {table} read: " + (", ".join(ids) or "none"))
        if any(k.other for k in a.keys):
            released = (
                "always released, even when empty, with no delta"
                if all(k.public for k in a.keys)
                else "released like any group, through partition selection"
            )
            lines.append(
                "other group: rows whose key is outside its domain (NULL too, unless the domain "
                f"lists it) form one more group of that key, one of a unit's L0 groups; "
                f"{released}"
            )
        return lines

    def selection_lines(self) -> list[str]:
        """The partition selection's threshold, if any."""
        if self.selection is None:
            return []
        return [
            f"partition selection: release a group iff its noisy distinct-unit count >= "
            f"{self.selection.threshold}; delta {decimal_text(self.selection.delta)}"
        ]

    def cost_line(self) -> str:
        """What the query costs in all, the diagnosis's part said."""
        return f"cost: epsilon {decimal_text(self.epsilon)}, delta {decimal_text(self.delta)}" + (
            self.diagnosis.cost() if self.diagnosis is not None else ""
        )

    def explain(self, sql: bool = True) -> list[str]:
        """EXPLAIN VERBOSE's lines, exact; with ``sql``, the bounded SQL pretty-printed at the
        end (``dpsql.plan.explain`` adds each measurement's ± and makes the concise form)."""
        lines = self.head()
        if self.auto is not None:
            # The answer's sensitivities and scales follow the chosen values: none is shown.
            lines.extend(self.auto.explain())
            lines.extend(auto_line(m) for m in self.measurements)
            lines.append(self.cost_line())
            lines.append("selection SQL (the answer's bounded SQL is built after the choice):")
            if sql and self.auto.sql is not None:
                text = parse_bounded(self.auto.sql).sql(dialect=DIALECT, pretty=True)
                lines.extend("  " + line for line in text.splitlines())
            return lines
        lines.extend(f"skipped: {why}" for why in self.skipped)
        lines.extend(measurement_line(m) for m in self.measurements)
        lines.extend(self.selection_lines())
        if self.diagnosis is not None:
            lines.extend(self.diagnosis.explain())
        lines.extend(self.targets)
        if self.sample is not None:
            lines.extend(self.sample.explain())
        lines.append(self.cost_line())
        lines.append("bounded SQL:")
        if sql:
            text = self.bounded_sql if self.shown is None else self.shown(self.engine_sql)
            lines.extend("  " + line for line in text.splitlines())
        return lines


def _explain_key(key: GroupKey) -> str:
    if not key.public:
        return f"{key.name} (private)"
    if not key.other:
        return f"{key.name} (public domain)"
    label = "NULL" if key.other_text is None else "'" + key.other_text.replace("'", "''") + "'"
    size = len(key.domain or ())
    return f"{key.name} (public domain of {size} value(s) + other group keyed {label})"


def share_text(m: Measurement, of: str) -> str:
    """A measurement's share of the budget, when it is not the whole of it."""
    if m.share is None or m.share == 1:
        return ""
    return f", share {float(m.share):.4g} of the query's {of}"


def auto_line(m: Measurement) -> str:
    """A measurement of an answer whose bounds are chosen after the charge: its mechanism and
    epsilon, never a sensitivity or scale (they follow the chosen values)."""
    if m.exponential:
        return f"measurement {m.label}: exponential mechanism, epsilon {decimal_text(m.epsilon)}"
    return (
        f"measurement {m.label}: discrete Laplace, epsilon {decimal_text(m.epsilon)} at these "
        "bounds (the split follows the chosen values; the sum does not); its ± comes with the "
        "answer"
    )


def measurement_line(m: Measurement) -> str:
    """A measurement as EXPLAIN VERBOSE shows it: its sensitivity and noise, exactly."""
    if m.exponential:
        assert m.scale is not None
        return (
            f"measurement {m.label}: exponential mechanism over the grid candidates of each "
            f"group; one unit moves {m.groups} group(s)' scores by <= {m.per_group}; "
            f"score sensitivity {m.sensitivity}, weights exp(-score/(2*{m.scale})), "
            f"epsilon {decimal_text(m.epsilon)}{share_text(m, 'epsilon')}"
        )
    head = f"measurement {m.label}: one unit moves {m.groups} group(s) by <= {m.per_group * m.unit}"
    if m.scale is not None:
        return (
            f"{head}; L1 sensitivity {m.sensitivity * m.unit} (= {m.sensitivity} units of "
            f"{m.unit}); DiscreteLaplace scale {m.scale * m.unit} (= {m.scale} units), "
            f"epsilon {decimal_text(m.epsilon)}{share_text(m, 'epsilon')}"
        )
    assert m.sigma2 is not None
    return (
        f"{head} (units of {m.unit}); DiscreteGaussian sigma^2 = {m.sigma2} units^2 "
        f"(sigma ~ {float(m.sigma2) ** 0.5 * float(m.unit):.6g}), rho {decimal_text(m.rho)}"
        f"{share_text(m, 'Gaussian rho')}"
    )
