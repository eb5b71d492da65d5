"""Sensitivities and noise: how far one unit moves each measurement, the noise scale or
variance that calibrates it, and the check of the planned loss against the query's parameters.

Sensitivities (add/remove one unit, DESIGN.md section 3), with L0 groups per unit (1 without
GROUP BY) and C rows per unit and group, in integer units of each measurement:
COUNT L0·C; COUNT(DISTINCT unit) L0; SUM on grid g L0·C·max(|lo|, |hi|)/g; centred SUM
L0·C·(hi - lo)/g in units of g/2; centred sum of squares (VARIANCE, STDDEV) L0·C·((hi - lo)/g)²
in units of (g/2)², that is L0·C·((hi - lo)/2)² in value units. The query's epsilon is split
across measurements (sequential composition) by ``dpsql.plan.split``, evenly or to minimise the
released error, and each is sampled from the discrete Laplace with scale = sensitivity /
epsilon_j, so the charged epsilon is exactly the query's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from fractions import Fraction

from dpsql.bound.grid import Grid
from dpsql.bound.specs import MeasurementSpec, ValueSpec
from dpsql.errors import BoundsError, InternalError
from dpsql.mechanisms.events import Composite, Event
from dpsql.mechanisms.gaussian_events import DiscreteGaussian
from dpsql.mechanisms.laplace_events import DiscreteLaplace
from dpsql.mechanisms.quantile_score import score_sensitivity
from dpsql.mechanisms.selection_events import Exponential
from dpsql.plan import calibration
from dpsql.plan.aggregates.pairs import unpaired
from dpsql.plan.estimates import _Builder
from dpsql.plan.plans import Estimate, Measurement, QueryOptions, fits_exactly
from dpsql.plan.split import shares
from dpsql.policy.numbers import decimal_text
from dpsql.sql.parse import DIALECT


def _label(spec: MeasurementSpec, values: list[ValueSpec], grid: Grid | None) -> str:
    """How EXPLAIN and the ledger name a measurement; a value read on the pairs' rows of
    F(y, x) (``pairs.paired``) is named as written, with where it is read."""
    if spec.value is None:
        return _bare_label(spec, values, grid, "")
    pair = unpaired(values[spec.value].expr)
    if pair is None:
        return _bare_label(spec, values, grid, values[spec.value].expr.sql(DIALECT))
    value, partner = pair
    where = "" if spec.kind == "centred_products" else f" where {partner.sql(DIALECT)} is present"
    return _bare_label(spec, values, grid, value.sql(DIALECT)) + where


def _bare_label(spec: MeasurementSpec, values: list[ValueSpec], grid: Grid | None,
                arg: str) -> str:  # fmt: skip
    if spec.kind == "quantile":
        assert spec.p is not None  # a quantile always has its rank
        end = {-1: " interval's lower end", 1: " interval's upper end"}.get(spec.side, "")
        return f"QUANTILE({arg}, {decimal_text(spec.p)}){end}"
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
    if spec.kind == "bernstein":
        assert spec.part is not None
        term = ("(hi - x)^2", "2(hi - x)(x - lo)", "(x - lo)^2")[spec.part]
        lo, hi = decimal_text(grid.lower_value), decimal_text(grid.upper_value)
        return (f"SUM({term}) for x = {arg} in [{lo}, {hi}] (Bernstein coordinate "
                f"{spec.part} of 3, noised as one vector)")  # fmt: skip
    if spec.kind == "centred_products":
        assert spec.other is not None
        other = values[spec.other]
        assert other.grid is not None
        pair = unpaired(other.expr)
        text = (pair[0] if pair is not None else other.expr).sql(DIALECT)
        return f"SUM(({arg} - {grid.centre})*({text} - {other.grid.centre})) over the pairs"
    return f"SUM({arg} - {grid.centre})"


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
    if spec.kind == "bernstein":
        # The whole vector's: a cell's three coordinates are non-negative and sum to 4w²·c,
        # c <= C its rows (dpsql.bound.values.bernstein), so one unit moves a group's vector by
        # at most 4w²·C in L1 (Lipschitz: the joint measurement's sensitivity, not a part's).
        return c * 4 * grid.width**2
    if spec.kind == "centred_products":
        # |(x - m_x)(y - m_y)| <= width_x·width_y in units of (g_x/2)(g_y/2), C rows of a unit
        assert spec.other is not None
        other = values[spec.other].grid
        assert other is not None
        return c * grid.width * other.width
    return c * (grid.magnitude if spec.kind == "sum" else grid.width)


def _unit(spec: MeasurementSpec, values: list[ValueSpec]) -> Fraction:
    if spec.kind in ("rows", "count", "units", "distinct"):
        return Fraction(1)
    assert spec.value is not None
    grid = values[spec.value].grid
    assert grid is not None
    if spec.kind in ("centred_squares", "bernstein"):
        return (grid.step / 2) ** 2
    if spec.kind == "centred_products":
        assert spec.other is not None
        other = values[spec.other].grid
        assert other is not None
        return (grid.step / 2) * (other.step / 2)
    return grid.step if spec.kind in ("sum", "quantile") else grid.step / 2


Calibrated = tuple[list[Measurement], list[Event], "tuple[Fraction, Fraction] | None"]


def _measurement(
    builder: _Builder, spec: MeasurementSpec, l0: int, c: int, r: int | None
) -> Measurement:
    grid = builder.values[spec.value].grid if spec.value is not None else None
    label = _label(spec, builder.values, grid)
    per_group = _per_group(spec, builder.values, c)
    # A group's exact total sums at most per_group from each unit, and no table holds more than
    # 2^63 - 1 units: proven to fit 38 digits, the range of Spark's DECIMAL(38,0) (and within
    # DuckDB's HUGEINT), it can neither overflow nor fail on any data. Both engines refuse the
    # same queries.
    if not fits_exactly(per_group):
        raise BoundsError(
            f"{label}: its exact total could exceed 38 digits on some data; tighten the "
            "bounds of its value or max_rows_per_unit_per_group"
        )
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
    builder: _Builder,
    l0: int,
    c: int,
    options: QueryOptions,
    selection: int | None,
    *,
    estimates: Sequence[Estimate],
) -> Calibrated:
    """Discrete Laplace on every measurement (sequential composition, Dwork and Roth 2014,
    Theorem 3.16): scale_j = L1_j/epsilon_j with Σ epsilon_j = epsilon exactly. Pure parts
    (partition selection, quantiles) take their slot of an even split each (epsilon/k, an
    interval's end half of it), the rest is split by ``shares``."""
    k = len(builder.specs)
    _check_budgets(options, k)
    base = [_measurement(builder, spec, l0, c, options.max_rows_per_unit) for spec in builder.specs]
    pure = [j for j, s in enumerate(builder.specs) if j == selection or s.kind == "quantile"]
    # A Bernstein vector's coordinates 1 and 2 ride on coordinate 0's share: the three are one
    # measurement of L1 sensitivity 4w²·C (per group) with i.i.d. noise on each coordinate.
    tied = tied_parts(builder.specs)
    free = [j for j in range(k) if j not in pure and j not in tied]
    slots = _slots(builder)
    if options.budgets is not None:
        # An accuracy target's own epsilon_j per measurement (dpsql.plan.targets), summing to
        # the query's epsilon.
        if tied:
            raise InternalError("an accuracy target's plan has a joint measurement")
        share = {j: b / options.epsilon for j, b in enumerate(options.budgets)}
    else:
        whole = sum((slots[j] for j in range(k) if j not in tied), Fraction(0))
        share = {j: slots[j] / whole for j in pure}
        rest = len(free) / whole
        split = shares(base, estimates, free, False, options.split)
        share.update({j: rest * s for j, s in split.items()})
    if sum(share.values(), Fraction(0)) != 1:
        raise InternalError("the epsilon shares of the query do not sum to 1")
    share.update({j: share[head] for j, head in tied.items()})
    measurements: list[Measurement] = []
    events: list[Event] = []
    for j, m in enumerate(base):
        scale = Fraction(m.sensitivity) / (options.epsilon * share[j])
        measured = replace(m, scale=scale, share=share[j])
        measurements.append(measured)
        if j in tied:
            continue  # in its vector's event (coordinate 0's)
        if m.spec.kind == "bernstein":
            # The Laplace mechanism on a 3·L0-coordinate vector of L1 sensitivity Δ: i.i.d.
            # discrete Laplace of scale Δ/epsilon_j on each is epsilon_j-DP (Dwork and Roth
            # 2014, Theorem 3.6; Canonne, Kamath, Steinke 2020 for the discrete noise).
            events.append(DiscreteLaplace(scale, Fraction(m.sensitivity), m.label,
                                          dimensions=3 * m.groups))  # fmt: skip
            continue
        events.append(_pure_event(measured))
    return measurements, events, None


def tied_parts(specs: Sequence[MeasurementSpec]) -> dict[int, int]:
    """Each Bernstein coordinate 1 and 2, to its vector's coordinate 0 (same value)."""
    heads = {s.value: j for j, s in enumerate(specs) if s.kind == "bernstein" and s.part == 0}
    tied = {j: heads.get(s.value, -1) for j, s in enumerate(specs)
            if s.kind == "bernstein" and s.part != 0}  # fmt: skip
    if any(h < 0 for h in tied.values()) or len(tied) != 2 * len(heads):
        raise InternalError("a Bernstein vector lacks a coordinate")
    return tied


def _slots(builder: _Builder) -> list[Fraction]:
    """Each measurement's part of an even split: 1, or 1/2 for a quantile interval's end
    (``MeasurementSpec.slot``). All 1 without an interval: epsilon/k each."""
    return [spec.slot for spec in builder.specs]


def _check_budgets(options: QueryOptions, k: int) -> None:
    """A target's budgets: one positive budget per measurement, or a planner bug."""
    budgets = options.budgets
    if budgets is not None and (len(budgets) != k or any(b <= 0 for b in budgets)):
        raise InternalError("the solved budgets do not match the query's measurements")


def _pure_event(m: Measurement) -> Event:
    """The event of a discrete Laplace or exponential-mechanism measurement."""
    assert m.scale is not None
    if m.exponential:
        # EM with weights exp(-score/(2·scale)) and score sensitivity Δ is Δ/scale-DP (McSherry
        # and Talwar 2007); per group, with the unit's L0 groups composed (basic composition).
        return Exponential(m.epsilon, m.label)
    return DiscreteLaplace(m.scale, Fraction(m.sensitivity), m.label, dimensions=m.groups)


def _gaussian(
    builder: _Builder,
    l0: int,
    c: int,
    options: QueryOptions,
    selection: int | None,
    *,
    estimates: Sequence[Estimate],
) -> Calibrated:
    """Discrete Gaussians on the measurements; partition selection stays a discrete Laplace.

    With selection, it takes epsilon/k and half of delta, the Gaussians the rest: the query is
    the sequential composition of the two parts, so its (epsilon, delta) is the sum.
    """
    k = len(builder.specs)
    _check_budgets(options, k)
    # Partition selection and quantiles are pure-epsilon mechanisms: each takes epsilon/k.
    pure = [j for j, s in enumerate(builder.specs) if j == selection or s.kind == "quantile"]
    slots = _slots(builder)
    whole = sum(slots, Fraction(0))
    eps_sel = options.epsilon * sum((slots[j] for j in pure), Fraction(0)) / whole
    delta_sel = options.delta / 2 if selection is not None else Fraction(0)
    eps_g, delta_g = options.epsilon - eps_sel, options.delta - delta_sel
    gaussian = [j for j in range(k) if j not in pure]
    base = [_measurement(builder, spec, l0, c, options.max_rows_per_unit) for spec in builder.specs]
    pure_eps = {j: options.epsilon * slots[j] / whole for j in pure}
    if options.budgets is not None:
        # An accuracy target's own budget per measurement (dpsql.plan.targets): epsilon_j for
        # the pure parts, rho_j for the Gaussians; the query's loss is their composition.
        pure_eps = {j: options.budgets[j] for j in pure}
        eps_sel = sum(pure_eps.values(), Fraction(0))
        rho = sum((options.budgets[j] for j in range(k) if j not in pure), Fraction(0))
        eps_g = calibration.epsilon_for(rho, delta_g)
    elif options.sigma is not None:
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
    # A noise multiplier fixes each measurement's rho: there is nothing to split.
    split = "even" if options.sigma is not None else options.split
    if options.budgets is not None:
        share = {j: options.budgets[j] / rho for j in gaussian}
    else:
        share = shares(base, estimates, gaussian, True, split)
    measurements: list[Measurement] = []
    events: list[Event] = []
    for j, m in enumerate(base):
        if j in pure:
            scale = Fraction(m.sensitivity) / pure_eps[j]
            shown = None if options.budgets is not None else slots[j] / whole
            measurements.append(replace(m, scale=scale, share=shown))
            events.append(_pure_event(replace(m, scale=scale)))
        else:
            # Σ rho_j <= rho (zCDP composition, Bun and Steinke 2016, Lemma 2.3): the shares
            # sum to 1, and each variance is rounded up (less rho, never more).
            sigma2 = calibration.sigma2_for(m.per_group, m.groups, rho * share[j])
            measurements.append(replace(m, sigma2=sigma2, share=share[j]))
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
    # Each Gaussian's exact rho (its zCDP map), and the sum the query was calibrated on.
    rhos = [z[0] for e in event.events if e.targeted and (z := e.zcdp()) is not None]
    # Variances are rounded up (more noise), so the planned rho may only fall short of the ask.
    if options.sigma is not None:
        if any(rho > 1 / (2 * options.sigma**2) for rho in rhos):
            raise InternalError("the planned rho exceeds the query's noise multiplier")
        return
    if options.rho is not None and sum(rhos) > options.rho:
        raise InternalError("the planned rho exceeds the query's rho")
    if options.rho is None and (event.epsilon, event.delta) != (options.epsilon, options.delta):
        raise InternalError("the planned privacy loss does not match the query's parameters")
