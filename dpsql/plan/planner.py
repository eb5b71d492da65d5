"""One plan per query: measurements, their sensitivities and noise scales, the privacy event.

A plan is frozen data and a pure function of the analysis, the options and the policy: it is
what EXPLAIN prints and what the accountant is asked to admit before anything runs.

Its parts: ``dpsql.plan.plans`` (the plan and EXPLAIN), ``dpsql.plan.estimates`` (what each
aggregate measures), ``dpsql.plan.steps`` (the bounds and the bounding steps) and
``dpsql.plan.sensitivity`` (sensitivities, noise scales and the loss check); this module plans.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction

from dpsql.analyze.analysis import Analysis
from dpsql.bound.rewrite import bounded_query
from dpsql.bound.specs import Bounding, MeasurementSpec
from dpsql.errors import BoundsError, InternalError, ParameterError, UnsupportedQueryError
from dpsql.mechanisms.events import Composite, Event, joint_zcdp
from dpsql.mechanisms.laplace import MAX_SCALE
from dpsql.mechanisms.partition import partition_threshold
from dpsql.mechanisms.selection_events import LaplacePartitionSelection
from dpsql.plan import calibration
from dpsql.plan.aggregates import bernstein
from dpsql.plan.declared import (
    check_declared,
    declared_calibration,
    refuse_sample,
    refuse_selection,
)
from dpsql.plan.diagnosis import plan_diagnosis
from dpsql.plan.estimates import _Builder, _estimates
from dpsql.plan.plans import Estimate, Measurement, Plan, QueryOptions, Selection
from dpsql.plan.sample import amplified
from dpsql.plan.sensitivity import _check_loss, _gaussian, _laplace, tied_parts
from dpsql.plan.steps import _group_bounds, _steps
from dpsql.policy import Policy


@dataclass(frozen=True)
class Calibration:
    """A query's measurements and their noise at one set of options, before the bounded SQL:
    what accuracy targets search over (``dpsql.plan.targets``), cheaply, many times."""

    options: QueryOptions  # as planned (a Gaussian with only pure parts runs as a Laplace)
    l0: int
    c: int
    builder: _Builder
    estimates: tuple[Estimate, ...]
    measurements: tuple[Measurement, ...]
    events: tuple[Event, ...]
    certified: tuple[Fraction, Fraction] | None
    selection_at: int | None
    private_keys: bool


def calibrate(analysis: Analysis, options: QueryOptions, policy: Policy) -> Calibration:
    """The measurements of ``analysis`` and their noise under ``options``; raises
    ``BoundsError`` or ``ParameterError`` (nothing is charged)."""
    l0, c = _group_bounds(analysis, options)
    builder = _Builder(options.confidence)
    estimates = _estimates(analysis, builder)
    if bernstein.applies(options):
        # A variance's Q, S and N as one joint vector where nothing else reads them (public:
        # the query, the options and the bounds).
        grids = [v.grid for v in builder.values]
        builder.specs, estimates = bernstein.adopt(builder.specs, estimates, grids, c)
    private_keys = bool(analysis.keys) and not all(k.public for k in analysis.keys)
    if private_keys and options.declared is not None:
        # Partition selection is another mechanism: outside the PLD filter's one (Regehr 2026).
        raise refuse_selection(options.declared)
    if private_keys:
        if policy.budget.delta == 0 or options.delta == 0:
            raise ParameterError(
                "GROUP BY a column without a public domain needs partition selection, which "
                "needs delta > 0; declare public_values for the key or SET dpsql.delta"
            )
        selection_index = builder.measure(MeasurementSpec("units"))
    selection_at = selection_index if private_keys else None
    pure = sum(1 for s in builder.specs if s.kind == "quantile") + (selection_at is not None)
    if options.declared is None and options.mechanism == "gaussian" and len(builder.specs) == pure:
        # Only pure-epsilon mechanisms (selection, quantiles): there is nothing to be Gaussian.
        options = replace(options, mechanism="laplace", rho=None, sigma=None)
    if options.declared is not None:
        measurements, events, certified = declared_calibration(
            builder, l0, c, options, options.declared
        )
    else:
        # The split weighs public numbers: the query's estimates and bounds (dpsql.plan.split).
        noise = _gaussian if options.mechanism == "gaussian" else _laplace
        measurements, events, certified = noise(
            builder, l0, c, options, selection_at, estimates=estimates
        )
        if any(m.spec.kind == "bernstein" and m.scale is not None and m.scale > MAX_SCALE
               for m in measurements):  # fmt: skip
            # A vector's one share can be past what the sampler draws where three shares
            # are not (its scale is about 1.5 times the sum of squares'): measured apart.
            return calibrate(analysis, replace(options, joint_moments=False), policy)
    return Calibration(
        options,
        l0,
        c,
        builder,
        tuple(estimates),
        tuple(measurements),
        tuple(events),
        certified,
        selection_at,
        private_keys,
    )


def plan_query(analysis: Analysis, options: QueryOptions, policy: Policy, query: str = "") -> Plan:
    """Plan ``analysis``; raises ``BoundsError`` or ``ParameterError`` (nothing is charged)."""
    cal = calibrate(analysis, options, policy)
    options, l0, c, builder = cal.options, cal.l0, cal.c, cal.builder
    estimates, measurements, events = cal.estimates, list(cal.measurements), list(cal.events)
    certified, selection_at, private_keys = cal.certified, cal.selection_at, cal.private_keys
    selection = None
    if selection_at is not None:
        m = measurements[selection_at]
        assert m.scale is not None
        if m.scale > MAX_SCALE:
            # Refused before its threshold is searched: past what the sampler draws, the search
            # would step through ~t·ln(L0/delta) candidates (an EXPLAIN that never ends).
            raise BoundsError(
                f"the noise of {m.label} would be too large to sample exactly; raise epsilon, "
                "or lower the contribution limits"
            )
        # The threshold takes the selection's share of delta (all of it with the Laplace).
        share = options.delta if options.mechanism == "laplace" else options.delta / 2
        threshold = partition_threshold(m.scale, l0, share)
        selection = Selection(selection_at, threshold, share)
        # Partition selection stays a discrete Laplace (Korolova et al. 2009; DESIGN.md 4).
        # Its event's place: a Bernstein vector's coordinates 1 and 2 have none of their own.
        at = selection_at - sum(1 for j in tied_parts(builder.specs) if j < selection_at)
        events[at] = LaplacePartitionSelection(
            m.scale, Fraction(m.sensitivity), threshold, share, m.label
        )
    cell = None
    if analysis.cell is not None:
        # The partition family: one column of one table at one declared data version
        # (dpsql.analyze.cells); queries of different keys within it touch disjoint units.
        # Never the blocks read (dpsql.session.blocks): one unit has rows in many blocks, so
        # queries of one key over other blocks compose sequentially, in one family.
        family = f"{analysis.table}.{analysis.cell.column}@{policy.dataset.data_version}"
        cell = (family, analysis.cell.key)
    event = Composite(tuple(events), certified, cell)
    if options.declared is not None:
        check_declared(event, options.declared)
    else:
        _check_loss(event, options, private_keys)
    sample = None
    if options.sample is not None:
        if options.declared is not None:
            raise refuse_sample(options.declared)
        if options.diagnose and options.diagnose_asked:
            raise UnsupportedQueryError(
                "a sampled query is not diagnosed yet; SET dpsql.diagnose = off"
            )
        # One sample under every measurement and the selection: amplified as one event.
        event, sample = amplified(event, options.sample)
        options = replace(options, diagnose=False)  # the policy's default leaves a sample out
    steps = _steps(analysis, l0, c, options.max_rows_per_unit, builder.specs)
    bounding = Bounding(
        max_groups=steps.ranking,
        max_rows=c,
        max_total_rows=steps.window,
        values=tuple(builder.values),
        measurements=tuple(builder.specs),
        direct=steps.direct,
        sample=options.sample,
        one_table=analysis.base,
    )
    text = bounded_query(analysis, bounding)
    diagnosis = None
    if options.diagnose:
        diagnosis, extra = plan_diagnosis(analysis, bounding, options, (l0, c), event.epsilon)
        event = _with_diagnosis(event, extra, options)
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
        diagnosis=diagnosis,
        sample=sample,
    )


def _with_diagnosis(event: Composite, extra: Event, options: QueryOptions) -> Composite:
    """The query's event with its diagnosis: one more event, released with the query and
    charged with it (sequential composition, Dwork and Roth 2014, Theorem 3.16)."""
    events = (*event.events, extra)
    certified = event.certified
    if options.declared is not None:
        joint = joint_zcdp(events)
        if extra.targeted and joint is not None:
            # k + 1 declared Gaussians: their summed rho through the CKS conversion
            # (Canonne, Kamath, Steinke 2020, Corollary 13), as declared_calibration does.
            certified = (calibration.epsilon_for(joint[0], options.delta), options.delta)
        combined = Composite(events, certified, event.cell)
        check_declared(combined, options.declared)
        return combined
    if certified is not None:
        # A pure epsilon_d event beside the Gaussians: basic composition adds (epsilon_d, 0).
        certified = (certified[0] + extra.epsilon, certified[1])
    combined = Composite(events, certified, event.cell)
    if combined.epsilon != event.epsilon + extra.epsilon or combined.delta != event.delta:
        raise InternalError("the diagnosed query's loss is not the query's plus the diagnosis's")
    return combined


__all__ = ["Calibration", "calibrate", "plan_query"]
