"""The budget: the history of charges, the filter that admits queries, the odometer report.

The deciding filter is fixed when the budget is created (the policy's ``budget.accountant``),
never switched by the history: a filter chosen after seeing the history is not a filter.
``basic`` is sequential composition over queries in exact rationals (Dwork, McSherry, Nissim,
Smith 2006; valid adaptively, Rogers, Roth, Ullman, Vadhan 2016): each query is charged its
certified (epsilon, delta). The other filters decide on the flattened events (their own
theorems, see their modules). Optional analyst shares cap each analyst's own history under the
same filter; the data set's cap holds for everyone's together.

This budget lives in memory: it resets when the process ends, until the durable ledger lands.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from dpsql.accounting.advanced import AdvancedAccountant, AdvancedFilter
from dpsql.accounting.base import Accountant, Filter
from dpsql.accounting.events import (
    ZCDP,
    ApproxDP,
    Composite,
    Event,
    LaplacePartitionSelection,
    flatten,
)
from dpsql.accounting.gdp import GdpAccountant
from dpsql.accounting.optimal import OptimalAccountant
from dpsql.accounting.pld import PldAccountant
from dpsql.accounting.rdp import DEFAULT_ORDERS, RdpAccountant, RdpFilter
from dpsql.accounting.zcdp import ZcdpAccountant, ZcdpFilter
from dpsql.errors import BudgetExceededError
from dpsql.policy import BudgetSpec


@dataclass(frozen=True)
class Charge:
    """One committed charge: a fresh release's privacy event and who asked."""

    time: float
    analyst: str | None
    query: str
    event: Composite

    @property
    def epsilon(self) -> Fraction:
        return self.event.epsilon

    @property
    def delta(self) -> Fraction:
        return self.event.delta


@dataclass(frozen=True)
class Figure:
    """One accountant's reading of the history: epsilon at the budget's delta."""

    accountant: str
    epsilon: float
    note: str  # "decides", "valid adaptively", or "as if fixed in advance"


@dataclass(frozen=True)
class BudgetReport:
    """Spent and remaining budget; ``figures`` is the same history under every accountant."""

    dataset: str
    accountant: str
    epsilon_total: Fraction
    delta_total: Fraction
    # Under basic composition: the exact sums of the charged queries (worst cell). Under another
    # filter: its own accountant's epsilon at delta_total (rounded up), and the additive deltas
    # (partition selection) charged so far.
    epsilon_spent: Fraction
    delta_spent: Fraction
    queries: int
    durable: bool
    figures: tuple[Figure, ...] = ()

    @property
    def epsilon_remaining(self) -> Fraction:
        return self.epsilon_total - self.epsilon_spent

    @property
    def delta_remaining(self) -> Fraction:
        return self.delta_total - self.delta_spent

    def __str__(self) -> str:
        return (
            f"dataset {self.dataset}: epsilon {float(self.epsilon_spent):.6g} spent of "
            f"{float(self.epsilon_total):.6g} ({float(self.epsilon_remaining):.6g} left), delta "
            f"{float(self.delta_spent):.3g} of {float(self.delta_total):.3g}; {self.queries} "
            f"charged queries; {self.accountant} composition decides"
            + ("" if self.durable else "; in memory: resets when the process ends")
        )


# Accountants and filters that compose (epsilon, delta) pairs per step: a query whose events
# were calibrated jointly (``certified``) is one (epsilon, delta) step for them, which is
# exactly what it is; its discrete Gaussians alone have no (epsilon, delta) of their own.
_PAIRWISE = {"advanced", "optimal", "pld"}


def events_for(name: str, composites: Sequence[Composite]) -> list[Event]:
    """The history as the accountant or filter ``name`` reads it."""
    if name not in _PAIRWISE:
        return flatten(list(composites))
    events: list[Event] = []
    for c in composites:
        if c.certified is not None:
            events.append(ApproxDP(c.certified[0], c.certified[1], "jointly calibrated query"))
        else:
            events.extend(c.events)
    return events


def _additive_delta(view: Sequence[Composite]) -> Fraction:
    """The deltas charged outright (partition selection, approximate DP) in a view."""
    additive = (LaplacePartitionSelection, ApproxDP, ZCDP)
    return sum((e.delta for c in view for e in c.events if isinstance(e, additive)), Fraction(0))


def _basic_fits(
    history: Sequence[Composite], new: Composite, cap: tuple[Fraction, Fraction]
) -> bool:
    epsilon = sum((c.epsilon for c in history), Fraction(0)) + new.epsilon
    delta = sum((c.delta for c in history), Fraction(0)) + new.delta
    return epsilon <= cap[0] and delta <= cap[1]


class Budget:
    """Check-and-charge under one filter, atomic across threads; optional analyst shares."""

    def __init__(
        self,
        dataset: str,
        epsilon: Fraction,
        delta: Fraction,
        *,
        decider: Filter | None = None,
        shares: dict[str, Filter | tuple[Fraction, Fraction]] | None = None,
        accountants: Sequence[Accountant] = (),
    ):
        self.dataset = dataset
        self.epsilon_total = epsilon
        self.delta_total = delta
        self._decider = decider  # None: basic composition over queries
        self._shares = shares or {}
        self._accountants = tuple(accountants)
        self._charges: list[Charge] = []
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self._decider.name if self._decider is not None else "basic"

    def _admits(
        self, rule: Filter | tuple[Fraction, Fraction] | None, history: list[Charge], new: Composite
    ) -> bool:
        """Whether ``rule`` admits ``new`` in every view of the history it belongs to.

        Parallel composition (McSherry 2009): queries pinned to different cells of a
        constant-per-unit column touch disjoint units, so a unit's loss is that of the
        unpinned queries plus its own cell's. A pinned query must fit its cell's view; an
        unpinned one, every view.
        """
        composites = [c.event for c in history]
        cells = {c.cell for c in composites if c.cell is not None}
        targets = [new.cell] if new.cell is not None else [None, *cells]
        for cell in targets:
            view = [c for c in composites if c.cell is None or c.cell == cell]
            if rule is None:
                fits = _basic_fits(view, new, (self.epsilon_total, self.delta_total))
            elif isinstance(rule, tuple):
                fits = _basic_fits(view, new, rule)
            else:
                fits = rule.admits(events_for(rule.name, view), events_for(rule.name, [new]))
            if not fits:
                return False
        return True

    def charge(self, event: Composite, query: str, analyst: str | None) -> Charge:
        """Record the charge, or raise ``BudgetExceededError`` and record nothing.

        Decided from public information only: the event and the earlier charges.
        """
        with self._lock:
            if not self._admits(self._decider, self._charges, event):
                raise BudgetExceededError(
                    f"this query (epsilon {event.epsilon}, delta {event.delta}) would take the "
                    f"data set over its budget under the {self.name} filter; nothing was charged"
                )
            if self._shares and (analyst is None or analyst not in self._shares):
                # With shares declared, only the analysts they name may spend anything.
                raise BudgetExceededError(
                    "the policy gives budget shares to named analysts only, and this "
                    "connection's analyst has none; nothing was charged"
                )
            if analyst is not None and analyst in self._shares:
                own = [c for c in self._charges if c.analyst == analyst]
                if not self._admits(self._shares[analyst], own, event):
                    raise BudgetExceededError(
                        f"this query would take analyst {analyst} over their share of the "
                        "budget; nothing was charged"
                    )
            record = Charge(time.time(), analyst, query, event)
            self._charges.append(record)
            return record

    @property
    def charges(self) -> tuple[Charge, ...]:
        with self._lock:
            return tuple(self._charges)

    def views(self) -> list[list[Composite]]:
        """The histories a unit can be exposed to: the unpinned queries plus one cell's (or
        the unpinned ones alone when no query was pinned). The guarantee is the worst view."""
        composites = [c.event for c in self.charges]
        cells = {c.cell for c in composites if c.cell is not None}
        if not cells:
            return [composites]
        return [[c for c in composites if c.cell is None or c.cell == cell] for cell in cells]

    def report(self) -> BudgetReport:
        charges = self.charges
        views = self.views()
        eps = max(sum((c.epsilon for c in v), Fraction(0)) for v in views)
        delta = max(sum((c.delta for c in v), Fraction(0)) for v in views)
        figures = [
            Figure("basic", float(eps), "decides" if self.name == "basic" else "valid adaptively")
        ]
        for accountant in self._accountants:
            note = "as if fixed in advance" if accountant.fixed_in_advance else "valid adaptively"
            if accountant.name == self.name:
                note = "decides" + (
                    "; figure as if fixed in advance" if accountant.fixed_in_advance else ""
                )
            readings = [
                accountant.epsilon(events_for(accountant.name, v), float(self.delta_total))
                if v
                else 0.0
                for v in views
            ]
            figures.append(Figure(accountant.name, max(readings), note))
            if accountant.name == self.name:
                # The deciding filter's own bound where it has one, else its family's reading;
                # Fraction(repr) keeps the rounded-up float exactly.
                bound = getattr(self._decider, "bound", None)
                if bound is not None:
                    readings = [float(bound(events_for(self.name, v))) for v in views]
                eps = Fraction(repr(max(readings)))
                delta = max(
                    sum(
                        (e.delta for c in v for e in c.events if not hasattr(e, "rho")), Fraction(0)
                    )
                    for v in views
                )
        return BudgetReport(
            self.dataset,
            self.name,
            self.epsilon_total,
            self.delta_total,
            eps,
            delta,
            len(charges),
            False,
            tuple(figures),
        )


def _decider(
    spec: BudgetSpec, epsilon: Fraction | None, delta: Fraction, rho: Fraction | None = None
) -> Filter | None:
    """The filter the policy names, for a cap (epsilon, delta) or (rho, delta); None is basic
    composition."""
    if spec.accountant == "advanced":
        assert spec.advanced_delta_prime is not None and epsilon is not None  # policy-validated
        return AdvancedFilter(epsilon, delta, spec.advanced_delta_prime)
    # The part of delta reserved for partition selection's additive deltas, as a fraction of
    # the total (half by default), applied alike to the data set's cap and to analyst shares.
    part = spec.selection_delta / spec.delta if spec.selection_delta is not None else Fraction(1, 2)
    selection = delta * part
    if spec.accountant == "rdp":
        assert epsilon is not None
        orders = (spec.rdp_order,) if spec.rdp_order is not None else DEFAULT_ORDERS
        return RdpFilter(epsilon, delta, orders, approx_delta_cap=selection)
    if spec.accountant == "zcdp":
        if rho is not None:
            return ZcdpFilter(delta_cap=delta, rho_cap=rho, approx_delta_cap=selection)
        return ZcdpFilter(epsilon, delta, approx_delta_cap=selection)
    return None


def odometers() -> list[Accountant]:
    """Every accountant's reading of a history, for the report (basic is the report's own)."""
    return [
        AdvancedAccountant(),
        OptimalAccountant(),
        RdpAccountant(),
        ZcdpAccountant(),
        GdpAccountant(),
        PldAccountant(),
    ]


def budget_for(dataset: str, spec: BudgetSpec) -> Budget:
    """The budget a policy declares: its deciding filter, analyst shares, odometers."""
    shares: dict[str, Filter | tuple[Fraction, Fraction]] = {}
    for name, share in spec.analysts.items():
        rule = _decider(spec, share.epsilon, share.delta)
        shares[name] = rule if rule is not None else (share.epsilon, share.delta)
    decider = _decider(spec, spec.epsilon, spec.delta, spec.rho)
    # With a rho budget the epsilon total is the one the zCDP filter certifies at delta.
    epsilon = spec.epsilon if spec.epsilon is not None else getattr(decider, "epsilon_cap", None)
    assert epsilon is not None
    return Budget(
        dataset,
        epsilon,
        spec.delta,
        decider=decider,
        shares=shares,
        accountants=odometers(),
    )
