"""One plan per query: measurements, their sensitivities and noise scales, the privacy event.

A plan is frozen data and a pure function of the analysis, the options and the policy: it is
what EXPLAIN prints and what the accountant is asked to admit before anything runs.

Sensitivities (add/remove one unit, DESIGN.md section 3), with L0 groups per unit (1 without
GROUP BY) and C rows per unit and group, in integer units of each measurement:
COUNT L0·C; COUNT(DISTINCT unit) L0; SUM on grid g L0·C·max(|lo|, |hi|)/g; centred SUM
L0·C·(hi - lo)/g in units of g/2; centred sum of squares (VARIANCE, STDDEV) L0·C·((hi - lo)/g)²
in units of (g/2)², that is L0·C·((hi - lo)/2)² in value units. The query's epsilon is split
equally across measurements (sequential composition), and each is sampled from the discrete
Laplace with scale = sensitivity / epsilon_j, so the charged epsilon is exactly the query's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from decimal import Decimal
from fractions import Fraction
from functools import cached_property

from sqlglot import exp

from dpsql.accounting.events import (
    Composite,
    DiscreteGaussian,
    DiscreteLaplace,
    Event,
    Exponential,
    LaplacePartitionSelection,
)
from dpsql.errors import BoundsError, InternalError, ParameterError
from dpsql.noise.exponential import score_sensitivity
from dpsql.plan import calibration
from dpsql.plan.mechanisms import partition_threshold
from dpsql.policy import Mechanism, Policy
from dpsql.sql.analyze import SPREAD_KINDS, AggregateKind, Analysis
from dpsql.sql.grid import Grid, quantile_grid, value_grid
from dpsql.sql.parse import DIALECT
from dpsql.sql.rewrite import (
    Bounding,
    MeasurementSpec,
    ValueRole,
    ValueSpec,
    bounded_query,
    parse_bounded,
    public_size,
)

# More public keys than this would be released as one huge table of noise: refuse instead.
MAX_PUBLIC_GROUPS = 1_000_000


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
    """How one aggregate of the query is computed from measurements (post-processing)."""

    kind: AggregateKind
    # sum: (sum,); avg: (centred, count); counts: (count,); quantile: (quantile,);
    # var_* and stddev_*: (centred_squares, centred, count)
    measurements: tuple[int, ...]
    grid: Grid | None


@dataclass(frozen=True)
class Selection:
    """Private-key partition selection on the noisy count of distinct units per group."""

    measurement: int
    threshold: int
    delta: Fraction


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

    @property
    def epsilon(self) -> Fraction:
        return self.event.epsilon

    @property
    def delta(self) -> Fraction:
        return self.event.delta

    @cached_property
    def bounded(self) -> exp.Select:
        """The bounded query's tree, parsed from ``engine_sql`` on first use."""
        return parse_bounded(self.engine_sql)

    @property
    def bounded_sql(self) -> str:
        return self.bounded.sql(dialect=DIALECT, pretty=True)

    def explain(self, sql: bool = True) -> list[str]:
        """EXPLAIN's lines; with ``sql``, the bounded SQL pretty-printed at the end."""
        a = self.analysis
        rows = self.options.max_rows_per_unit
        source = ", ".join(a.tables) if a.base else f"{', '.join(a.tables)} (joined or derived)"
        lines = [
            f"table {source}: privacy unit {a.unit}; user-level, add/remove one unit",
            f"bounds: L0 = {self.max_groups} group(s) per unit, C = {self.max_rows} row(s) per "
            "unit and group" + (f", R = {rows} row(s) per unit in total" if rows else ""),
            "keys: "
            + (
                ", ".join(
                    f"{k.name} ({'public domain' if k.public else 'private'})" for k in a.keys
                )
                or "none (one global group)"
            ),
        ]
        lines.extend(f"skipped: {why}" for why in self.skipped)
        for m in self.measurements:
            lines.append(_explain_measurement(m))
        if self.selection is not None:
            lines.append(
                f"partition selection: release a group iff its noisy distinct-unit count >= "
                f"{self.selection.threshold}; delta {decimal_text(self.selection.delta)}"
            )
        lines.append(
            f"cost: epsilon {decimal_text(self.epsilon)}, delta {decimal_text(self.delta)}"
        )
        lines.append("bounded SQL:")
        if sql:
            lines.extend("  " + line for line in self.bounded_sql.splitlines())
        return lines


def _label(spec: MeasurementSpec, values: list[ValueSpec], grid: Grid | None) -> str:
    arg = values[spec.value].expr.sql(DIALECT) if spec.value is not None else ""
    if spec.kind == "quantile":
        return f"QUANTILE({arg}, {spec.p})"
    if spec.kind == "distinct":
        return f"COUNT(DISTINCT {arg})"
    if spec.kind == "rows":
        return "COUNT(*)"
    if spec.kind == "units":
        return "COUNT(DISTINCT unit)"
    if spec.kind == "count":
        return f"COUNT({arg})"
    if spec.kind == "sum":
        return f"SUM({arg})"
    assert grid is not None
    if spec.kind == "centred_squares":
        return f"SUM(({arg} - {grid.centre})^2)"
    return f"SUM({arg} - {grid.centre})"


class _Builder:
    def __init__(self) -> None:
        self.values: list[ValueSpec] = []
        self.specs: list[MeasurementSpec] = []

    def value(self, expr: exp.Expression, grid: Grid | None, role: ValueRole = "value") -> int:
        key = expr.sql(DIALECT)
        for i, v in enumerate(self.values):
            if (
                v.expr.sql(DIALECT) == key
                and v.role == role
                and (role == "value" or v.grid == grid)
            ):
                if grid is not None and v.grid is None:
                    self.values[i] = ValueSpec(v.expr, grid)
                return i
        self.values.append(ValueSpec(expr, grid, role))
        return len(self.values) - 1

    def measure(self, spec: MeasurementSpec) -> int:
        if spec not in self.specs:
            self.specs.append(spec)
        return self.specs.index(spec)


def _estimates(analysis: Analysis, builder: _Builder) -> list[Estimate]:
    estimates = []
    for agg in analysis.aggregates:
        if agg.kind == "count_rows":
            estimates.append(Estimate(agg.kind, (builder.measure(MeasurementSpec("rows")),), None))
        elif agg.kind == "count_units":
            estimates.append(Estimate(agg.kind, (builder.measure(MeasurementSpec("units")),), None))
        elif agg.kind == "count":
            assert agg.arg is not None
            v = builder.value(agg.arg, None)
            estimates.append(
                Estimate(agg.kind, (builder.measure(MeasurementSpec("count", v)),), None)
            )
        elif agg.kind == "count_distinct":
            assert agg.arg is not None
            v = builder.value(agg.arg, None, "distinct")
            estimates.append(
                Estimate(agg.kind, (builder.measure(MeasurementSpec("distinct", v)),), None)
            )
        elif agg.kind == "quantile":
            assert agg.arg is not None and agg.bounds is not None
            grid = quantile_grid(agg.bounds)
            v = builder.value(agg.arg, grid, "quantile")
            spec = MeasurementSpec("quantile", v, agg.p)
            estimates.append(Estimate(agg.kind, (builder.measure(spec),), grid))
        else:
            assert agg.arg is not None and agg.bounds is not None
            grid = value_grid(agg.bounds)
            v = builder.value(agg.arg, grid)
            parts: tuple[int, ...]
            if agg.kind == "sum":
                parts = (builder.measure(MeasurementSpec("sum", v)),)
            elif agg.kind in SPREAD_KINDS:
                parts = (
                    builder.measure(MeasurementSpec("centred_squares", v)),
                    builder.measure(MeasurementSpec("centred", v)),
                    builder.measure(MeasurementSpec("count", v)),
                )
            else:
                parts = (
                    builder.measure(MeasurementSpec("centred", v)),
                    builder.measure(MeasurementSpec("count", v)),
                )
            estimates.append(Estimate(agg.kind, parts, grid))
    return estimates


def _group_bounds(analysis: Analysis, options: QueryOptions) -> tuple[int, int]:
    """Effective (L0, C). L0 is 1 without GROUP BY, and at most the number of public keys."""
    max_rows = options.max_rows_per_unit_per_group
    if max_rows is None:
        # With R alone (BigQuery's max_rows_contributed), a unit has at most R rows in a group.
        max_rows = options.max_rows_per_unit
    if max_rows is None:
        raise BoundsError(
            f"table {analysis.table} has no max_rows_per_unit_per_group; declare it in the "
            "policy or SET dpsql.max_rows_per_unit_per_group"
        )
    if analysis.unit_rows is not None:
        # The relation holds at most this many rows per unit by construction (a per-unit
        # subquery grouped by the unit alone: one), a structural row cap.
        max_rows = min(max_rows, analysis.unit_rows)
    if not analysis.keys:
        return 1, min(max_rows, options.max_rows_per_unit or max_rows)
    max_groups = options.max_groups_per_unit
    if max_groups is None:
        # With R alone, a unit's R rows touch at most R groups.
        max_groups = options.max_rows_per_unit
    if max_groups is None:
        raise BoundsError(
            f"GROUP BY on table {analysis.table} needs max_groups_per_unit; declare it in the "
            "policy or SET dpsql.max_groups_per_unit"
        )
    size = public_size(analysis.keys)
    if size is not None:
        if size > MAX_PUBLIC_GROUPS:
            raise BoundsError(f"the public keys have {size} combinations; at most "
                              f"{MAX_PUBLIC_GROUPS} are released")  # fmt: skip
        max_groups = min(max_groups, size)
    if analysis.unit_rows is not None:
        max_groups = min(max_groups, analysis.unit_rows)
    if options.max_rows_per_unit is not None:
        # With R rows in total, a unit touches at most R groups with at most R rows each.
        return min(max_groups, options.max_rows_per_unit), min(max_rows, options.max_rows_per_unit)
    return max_groups, max_rows


@dataclass(frozen=True)
class Steps:
    """Which bounding steps the bounded query runs; a step is skipped only when the plan proves
    from public information that it cannot bind, or that no total depends on it."""

    ranking: int | None  # L0 for the keyed-hash ranking of a unit's groups
    window: int | None  # R for the keyed-hash window over a unit's rows
    direct: bool  # no per-(unit, group) step: every unit has <= C rows per group, <= L0 groups
    skipped: tuple[str, ...]  # why, for EXPLAIN


def _steps(
    analysis: Analysis, l0: int, c: int, r: int | None, specs: list[MeasurementSpec]
) -> Steps:
    skipped: list[str] = []
    window = r
    if r is not None and not analysis.keys and all(s.kind in ("rows", "units") for s in specs):
        # One group: a unit adds min(n, C) rows (C <= R) or 1 unit whichever R rows are kept,
        # so the totals and the sensitivity (C, or 1) are those of the window; it is not run.
        window = None
        skipped.append(f"R = {r}: no total depends on which of a unit's rows are kept")
    ranking: int | None = l0 if analysis.keys else None
    size = public_size(analysis.keys)
    if ranking is not None:
        # Rows outside a public domain are dropped before bounding, so a unit touches at most
        # `size` groups; after R's window, or with the relation's own row cap, at most that many.
        limits = [(size, "public key combinations"), (window, "rows kept per unit by R"),
                  (analysis.unit_rows, "rows per unit in the relation")]  # fmt: skip
        for limit, what in limits:
            if limit is not None and l0 >= limit:
                ranking = None
                skipped.append(f"L0 ranking: L0 = {l0} >= {limit} {what}")
                break
    rows = window if window is not None else analysis.unit_rows
    direct = ranking is None and rows is not None and rows <= c
    if direct:
        # Each unit then has at most `rows` <= C rows in any group: C cannot bind either.
        skipped.append(f"per-unit pre-aggregation: at most {rows} row(s) per unit <= C = {c}")
    return Steps(ranking, window, direct, tuple(skipped))


def _per_group(spec: MeasurementSpec, values: list[ValueSpec], c: int) -> int:
    """How far one unit can move one group's total, in integer units (DESIGN.md section 3)."""
    if spec.kind == "units":
        return 1
    if spec.kind in ("rows", "count", "distinct"):
        return c  # C rows, or C distinct values, per unit and group
    if spec.kind == "quantile":
        assert spec.p is not None
        return c * score_sensitivity(spec.p)  # C rows, each moving every score by <= this
    assert spec.value is not None
    grid = values[spec.value].grid
    assert grid is not None
    if spec.kind == "centred_squares":
        return c * grid.width**2  # each centred row value lies in ±width units of g/2
    return c * (grid.magnitude if spec.kind == "sum" else grid.width)


def _explain_measurement(m: Measurement) -> str:
    if m.exponential:
        assert m.scale is not None
        return (
            f"measurement {m.label}: exponential mechanism over the grid candidates of each "
            f"group; one unit moves {m.groups} group(s)' scores by <= {m.per_group}; "
            f"score sensitivity {m.sensitivity}, weights exp(-score/(2*{m.scale})), "
            f"epsilon {decimal_text(m.epsilon)}"
        )
    head = f"measurement {m.label}: one unit moves {m.groups} group(s) by <= {m.per_group * m.unit}"
    if m.scale is not None:
        return (
            f"{head}; L1 sensitivity {m.sensitivity * m.unit} (= {m.sensitivity} units of "
            f"{m.unit}); DiscreteLaplace scale {m.scale * m.unit} (= {m.scale} units), "
            f"epsilon {decimal_text(m.epsilon)}"
        )
    assert m.sigma2 is not None
    return (
        f"{head} (units of {m.unit}); DiscreteGaussian sigma^2 = {m.sigma2} units^2 "
        f"(sigma ~ {float(m.sigma2) ** 0.5 * float(m.unit):.6g}), rho {decimal_text(m.rho)}"
    )


def _unit(spec: MeasurementSpec, values: list[ValueSpec]) -> Fraction:
    if spec.kind in ("rows", "count", "units", "distinct"):
        return Fraction(1)
    assert spec.value is not None
    grid = values[spec.value].grid
    assert grid is not None
    if spec.kind == "centred_squares":
        return (grid.step / 2) ** 2
    return grid.step if spec.kind in ("sum", "quantile") else grid.step / 2


Calibrated = tuple[list[Measurement], list[Event], "tuple[Fraction, Fraction] | None"]


def _measurement(
    builder: _Builder, spec: MeasurementSpec, l0: int, c: int, r: int | None
) -> Measurement:
    grid = builder.values[spec.value].grid if spec.value is not None else None
    label = _label(spec, builder.values, grid)
    per_group = _per_group(spec, builder.values, c)
    # Every per-group bound is C times a per-row bound (units: one per group, not per row).
    row_bound = r * (per_group // c) if r is not None and spec.kind != "units" else None
    return Measurement(
        spec,
        label,
        per_group,
        l0,
        _unit(spec, builder.values),
        row_bound=row_bound,
        grid=grid if spec.kind == "quantile" else None,
    )


def _laplace(
    builder: _Builder, l0: int, c: int, options: QueryOptions, selection: int | None
) -> Calibrated:
    """Discrete Laplace on every measurement, epsilon split equally (sequential composition):
    scale_j = k·L1_j/epsilon, so Σ L1_j/scale_j = epsilon exactly."""
    k = len(builder.specs)
    measurements: list[Measurement] = []
    events: list[Event] = []
    for spec in builder.specs:
        base = _measurement(builder, spec, l0, c, options.max_rows_per_unit)
        scale = Fraction(base.sensitivity) * k / options.epsilon
        measurements.append(replace(base, scale=scale))
        events.append(_pure_event(replace(base, scale=scale)))
    return measurements, events, None


def _pure_event(m: Measurement) -> Event:
    """The event of a discrete Laplace or exponential-mechanism measurement."""
    assert m.scale is not None
    if m.exponential:
        # EM with weights exp(-score/(2·scale)) and score sensitivity Δ is Δ/scale-DP (McSherry
        # and Talwar 2007); per group, with the unit's L0 groups composed (basic composition).
        return Exponential(m.epsilon, m.label)
    return DiscreteLaplace(m.scale, Fraction(m.sensitivity), m.label)


def _gaussian(
    builder: _Builder, l0: int, c: int, options: QueryOptions, selection: int | None
) -> Calibrated:
    """Discrete Gaussians on the measurements; partition selection stays a discrete Laplace.

    With selection, it takes epsilon/k and half of delta, the Gaussians the rest: the query is
    the sequential composition of the two parts, so its (epsilon, delta) is the sum.
    """
    k = len(builder.specs)
    # Partition selection and quantiles are pure-epsilon mechanisms: each takes epsilon/k.
    pure = [j for j, s in enumerate(builder.specs) if j == selection or s.kind == "quantile"]
    eps_sel = options.epsilon * len(pure) / k
    delta_sel = options.delta / 2 if selection is not None else Fraction(0)
    eps_g, delta_g = options.epsilon - eps_sel, options.delta - delta_sel
    gaussian = [j for j in range(k) if j not in pure]
    base = [_measurement(builder, spec, l0, c, options.max_rows_per_unit) for spec in builder.specs]
    if options.sigma is not None:
        # A noise multiplier: sigma_j = sigma * L2_j, so each measurement is 1/(2 sigma^2)-zCDP.
        rho = len(gaussian) / (2 * options.sigma**2)
        eps_g = calibration.epsilon_for(rho, delta_g)
    elif options.rho is not None:
        rho = options.rho
        eps_g = calibration.epsilon_for(rho, delta_g)
    elif len(gaussian) == 1 and base[gaussian[0]].groups == 1:
        only = base[gaussian[0]]
        sigma2 = calibration.single_sigma2(only.per_group, eps_g, delta_g)
        rho = Fraction(only.per_group**2) / (2 * sigma2)
    else:
        rho = calibration.rho_for(eps_g, delta_g)
    measurements: list[Measurement] = []
    events: list[Event] = []
    for j, m in enumerate(base):
        if j in pure:
            scale = Fraction(m.sensitivity) * len(pure) / eps_sel
            measurements.append(replace(m, scale=scale))
            events.append(_pure_event(replace(m, scale=scale)))
        else:
            # rho split equally: Σ rho_j <= rho (zCDP composition, Bun-Steinke 2016); equal
            # but for the rounding up of each variance.
            sigma2 = calibration.sigma2_for(m.per_group, m.groups, rho / len(gaussian))
            measurements.append(replace(m, sigma2=sigma2))
            events.append(
                DiscreteGaussian(sigma2, Fraction(m.per_group), label=m.label, dimensions=m.groups)
            )
    return measurements, events, (eps_sel + eps_g, delta_sel + delta_g)


def _check_loss(event: Composite, options: QueryOptions, private_keys: bool) -> None:
    """Recompute the loss from the event and compare with what the query asked for: a mismatch
    is a planner bug, and nothing may be charged or released on a wrong figure."""
    if options.mechanism == "laplace":
        expected = (options.epsilon, options.delta if private_keys else Fraction(0))
        if (event.epsilon, event.delta) != expected:
            raise InternalError("the planned privacy loss does not match the query's parameters")
        return
    gaussians = [e for e in event.events if isinstance(e, DiscreteGaussian)]
    # Variances are rounded up (more noise), so the planned rho may only fall short of the ask.
    if options.sigma is not None:
        if any(e.rho > 1 / (2 * options.sigma**2) for e in gaussians):
            raise InternalError("the planned rho exceeds the query's noise multiplier")
        return
    if options.rho is not None and sum(e.rho for e in gaussians) > options.rho:
        raise InternalError("the planned rho exceeds the query's rho")
    if options.rho is None and (event.epsilon, event.delta) != (options.epsilon, options.delta):
        raise InternalError("the planned privacy loss does not match the query's parameters")


def plan_query(analysis: Analysis, options: QueryOptions, policy: Policy, query: str = "") -> Plan:
    """Plan ``analysis``; raises ``BoundsError`` or ``ParameterError`` (nothing is charged)."""
    l0, c = _group_bounds(analysis, options)
    builder = _Builder()
    estimates = _estimates(analysis, builder)
    private_keys = bool(analysis.keys) and not all(k.public for k in analysis.keys)
    if private_keys:
        if policy.budget.delta == 0 or options.delta == 0:
            raise ParameterError(
                "GROUP BY a column without a public domain needs partition selection, which "
                "needs delta > 0; declare public_values for the key or SET dpsql.delta"
            )
        selection_index = builder.measure(MeasurementSpec("units"))
    selection_at = selection_index if private_keys else None
    pure = sum(1 for s in builder.specs if s.kind == "quantile") + (selection_at is not None)
    if options.mechanism == "gaussian" and len(builder.specs) == pure:
        # Only pure-epsilon mechanisms (selection, quantiles): there is nothing to be Gaussian.
        options = replace(options, mechanism="laplace", rho=None, sigma=None)
    if options.mechanism == "gaussian":
        measurements, events, certified = _gaussian(builder, l0, c, options, selection_at)
    else:
        measurements, events, certified = _laplace(builder, l0, c, options, selection_at)
    selection = None
    if selection_at is not None:
        m = measurements[selection_at]
        assert m.scale is not None
        # The threshold takes the selection's share of delta (all of it with the Laplace).
        share = options.delta if options.mechanism == "laplace" else options.delta / 2
        threshold = partition_threshold(m.scale, l0, share)
        selection = Selection(selection_at, threshold, share)
        # Partition selection stays a discrete Laplace (Korolova et al. 2009; DESIGN.md 4).
        events[selection_at] = LaplacePartitionSelection(
            m.scale, Fraction(m.sensitivity), threshold, share, m.label
        )
    cell = None
    if analysis.cell is not None:
        # The partition family: one column of one table at one declared data version
        # (dpsql.sql.cells); queries of different keys within it touch disjoint units.
        family = f"{analysis.table}.{analysis.cell.column}@{policy.dataset.data_version}"
        cell = (family, analysis.cell.key)
    event = Composite(tuple(events), certified, cell)
    _check_loss(event, options, private_keys)
    steps = _steps(analysis, l0, c, options.max_rows_per_unit, builder.specs)
    bounding = Bounding(
        max_groups=steps.ranking,
        max_rows=c,
        max_total_rows=steps.window,
        values=tuple(builder.values),
        measurements=tuple(builder.specs),
        direct=steps.direct,
    )
    text = bounded_query(analysis, bounding)
    return Plan(
        analysis=analysis,
        measurements=tuple(measurements),
        estimates=tuple(estimates),
        selection=selection,
        event=event,
        max_groups=l0,
        max_rows=c,
        options=options,
        query=query,
        engine_sql=text,
        skipped=steps.skipped,
        bounding=bounding,
    )


def decimal_text(value: Fraction) -> str:
    """An exact cost as a decimal (1/5 as 0.2, 1/1000000 as 0.000001); one that has no finite
    decimal also in its exact form (``0.333333 (exactly 1/3)``)."""
    den = value.denominator
    for prime in (2, 5):
        while den % prime == 0:
            den //= prime
    if den == 1:
        text = f"{Decimal(value.numerator) / Decimal(value.denominator):f}"
        return text.rstrip("0").rstrip(".") if "." in text else text
    return f"{float(value):.6g} (exactly {value})"
