"""The accountants, each registered once: its name, odometer, filter, label and chart style.

Everything that lists accountants reads this table, in its order: the budget (the filter the
policy's ``budget.accountant`` names, and every odometer of its report: ``budget.build``), the
report's figures, the composition curves (``dpsql.interfaces.report.charts``), what-if
(``dpsql.interfaces.report.whatif``) and ``dpsql budget``. A new accountant is its theorem
module and one ``Registration`` in ``BUILT_IN``; ``register`` adds one at run time.

A registration states:

- ``name``: the report's row, and the policy's ``budget.accountant`` when it is a filter;
- ``label``: its long name in the charts;
- ``odometer``: a fresh odometer (``base.Accountant``), whose ``fixed_in_advance`` says whether
  its figure holds only as if every query had been fixed before the first answer;
- ``filter``: its admission rule for a cap (``Caps``), valid when each query's parameters are
  chosen adaptively; None when its theorem gives no valid filter (optimal composition; GDP is
  not offered as one);
- ``pairs``: whether it composes (epsilon, delta) pairs, so that a jointly calibrated query is
  one step at its certified pair (``base.as_pair``) and what-if reads a Gaussian at a pair;
  ``reads``, how it reads one query's events when that is neither (the PLD's own);
- ``colour`` and ``line``: its curve in the composition charts (no colour: not drawn);
- ``whatif``: whether ``dpsql budget what-if`` asks it (a count bisects up to 10^5 queries).

The policy, an earlier stage, cannot read this table: it keeps ``budget.accountant`` a plain
name, and the name is checked here when a budget is built (``deciding``: a ``PolicyError``
naming the field).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction

from dpsql.accounting.theorems.advanced import AdvancedAccountant, AdvancedFilter
from dpsql.accounting.theorems.base import Accountant, Filter, as_events, as_pair
from dpsql.accounting.theorems.basic import BasicFilter, BasicSpend
from dpsql.accounting.theorems.gdp import GdpAccountant
from dpsql.accounting.theorems.optimal import OptimalAccountant
from dpsql.accounting.theorems.pld import PldAccountant
from dpsql.accounting.theorems.pld_filter import PldFilter
from dpsql.accounting.theorems.pld_grid import pld_steps
from dpsql.accounting.theorems.rdp import RDP_GRIDS, RdpAccountant, RdpFilter
from dpsql.accounting.theorems.zcdp import ZcdpAccountant, ZcdpFilter
from dpsql.errors import PolicyError
from dpsql.mechanisms.event_kinds import declared_event
from dpsql.mechanisms.events import Composite, Event
from dpsql.policy import FILTER_VERSION, BudgetSpec

__all__ = [
    "BASIC",
    "BUILT_IN",
    "SELECTION_PARTS",
    "Caps",
    "Names",
    "Registration",
    "deciding",
    "entries",
    "filter_for",
    "get",
    "register",
    "unregister",
]

BASIC = "basic"
"""The accountant whose sums the budget keeps itself, for every filter (``Budget.report``)."""

# Per version of the filters' defaults: the part of delta the rdp and zcdp filters reserve for
# partition selection where the policy states no ``selection_delta``. Version 2's tenth admits
# ten private-key GROUP BYs at a query delta of delta/100 (twenty with the Gaussian, whose
# selection takes half of it) and costs the conversion ln(10/9) = 0.105 of ln(1/delta), under 1%
# of the queries at delta 1e-6; version 1's half cost ln 2, about 5% (docs/accounting.md).
SELECTION_PARTS: dict[int, Fraction] = {1: Fraction(1, 2), 2: Fraction(1, 10)}


@dataclass(frozen=True)
class Caps:
    """What a filter is built from: the policy's budget, and a cap (epsilon, delta), or
    (rho, delta) for a zCDP budget (epsilon None)."""

    spec: BudgetSpec
    epsilon: Fraction | None
    delta: Fraction
    rho: Fraction | None = None


@dataclass(frozen=True)
class Registration:
    """One accountant as every lister reads it (module docstring)."""

    name: str
    label: str
    odometer: Callable[[], Accountant]
    filter: Callable[[Caps], Filter] | None = None
    pairs: bool = False
    reads: Callable[[Composite], list[Event]] | None = None
    colour: str | None = None
    line: str = "-"
    whatif: bool = False
    fixed_in_advance: bool = field(init=False)

    def __post_init__(self) -> None:
        reader = self.odometer()
        if reader.name != self.name:
            raise ValueError(f"the odometer of {self.name!r} is named {reader.name!r}")
        object.__setattr__(self, "fixed_in_advance", reader.fixed_in_advance)

    def steps(self, composite: Composite) -> list[Event]:
        """One query's events as this accountant composes them."""
        if self.reads is not None:
            return self.reads(composite)
        return as_pair(composite) if self.pairs else as_events(composite)

    @property
    def validity(self) -> str:
        """Its figure's label when it does not decide (``Accountant.fixed_in_advance``)."""
        return "as if fixed in advance" if self.fixed_in_advance else "valid adaptively"


def _epsilon(caps: Caps) -> Fraction:
    assert caps.epsilon is not None  # policy-validated: only the zcdp filter takes a rho cap
    return caps.epsilon


def _basic(caps: Caps) -> Filter:
    return BasicFilter(_epsilon(caps), caps.delta)


def _advanced(caps: Caps) -> Filter:
    assert caps.spec.advanced_delta_prime is not None  # policy-validated
    return AdvancedFilter(_epsilon(caps), caps.delta, caps.spec.advanced_delta_prime)


def _pld(caps: Caps) -> Filter:
    # The natural PLD filter over one mechanism fixed in the policy (Regehr et al. 2026).
    assert caps.spec.declared_mechanism is not None  # policy-validated
    mechanism = declared_event(caps.spec.declared_mechanism)
    return PldFilter(_epsilon(caps), caps.delta, "identical", mechanism)


def _version_and_reserve(caps: Caps) -> tuple[int, Fraction]:
    """The filter's ``filter_version`` (the ledger's, ``store.pinned_spec``) and the part of
    delta reserved for partition selection's additive deltas: a fraction of the total, applied
    alike to the data set's cap and to analyst shares. Fixed in advance: the additive deltas
    then add to the conversion's (``curves`` module docstring)."""
    spec = caps.spec
    version = spec.filter_version if spec.filter_version is not None else FILTER_VERSION
    part = spec.selection_delta / spec.delta if spec.selection_delta is not None else None
    return version, caps.delta * (part if part is not None else SELECTION_PARTS[version])


def _rdp(caps: Caps) -> Filter:
    version, reserve = _version_and_reserve(caps)
    orders, main_share = RDP_GRIDS[version]
    if caps.spec.rdp_order is not None:
        orders = (caps.spec.rdp_order,)
    return RdpFilter(
        _epsilon(caps), caps.delta, orders, approx_delta_cap=reserve, main_share=main_share
    )


def _zcdp(caps: Caps) -> Filter:
    _, reserve = _version_and_reserve(caps)
    if caps.rho is not None:
        return ZcdpFilter(delta_cap=caps.delta, rho_cap=caps.rho, approx_delta_cap=reserve)
    return ZcdpFilter(_epsilon(caps), caps.delta, approx_delta_cap=reserve)


BUILT_IN: tuple[Registration, ...] = (
    Registration(
        BASIC, "basic composition", BasicSpend, _basic, pairs=True, colour="#1f77b4", whatif=True
    ),
    Registration(
        "advanced",
        "advanced composition",
        AdvancedAccountant,
        _advanced,
        pairs=True,
        colour="#ff7f0e",
        line="--",
        whatif=True,
    ),
    Registration("optimal", "optimal composition", OptimalAccountant, pairs=True),
    Registration(
        "rdp", "Rényi DP (RDP)", RdpAccountant, _rdp, colour="#2ca02c", line="-.", whatif=True
    ),
    Registration("zcdp", "zero-concentrated DP (zCDP)", ZcdpAccountant, _zcdp, whatif=True),
    Registration("gdp", "Gaussian DP (GDP)", GdpAccountant),
    Registration(
        "pld",
        "privacy loss distribution (PLD)",
        PldAccountant,
        _pld,
        reads=pld_steps,
        colour="#d62728",
        line=":",
        whatif=True,
    ),
)

_lock = threading.Lock()
_registered: dict[str, Registration] = {r.name: r for r in BUILT_IN}


def register(registration: Registration) -> None:
    """Add an accountant after the built-in ones; a name is registered once."""
    with _lock:
        if registration.name in _registered:
            raise ValueError(f"an accountant named {registration.name!r} is registered")
        _registered[registration.name] = registration


def unregister(name: str) -> None:
    """Remove an accountant added by ``register`` (the built-in ones stay)."""
    with _lock:
        if any(r.name == name for r in BUILT_IN):
            raise ValueError(f"{name!r} is built in")
        _registered.pop(name, None)


def entries() -> tuple[Registration, ...]:
    """Every registered accountant, in report order."""
    with _lock:
        return tuple(_registered.values())


def get(name: str) -> Registration:
    """The registration of ``name``; KeyError if none."""
    with _lock:
        return _registered[name]


class Names:
    """A live view of the registered names that ``keep`` selects, in report order."""

    def __init__(self, keep: Callable[[Registration], bool]):
        self._keep = keep

    def _names(self) -> list[str]:
        return [r.name for r in entries() if self._keep(r)]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __len__(self) -> int:
        return len(self._names())


def deciding(spec: BudgetSpec) -> Registration:
    """The registration of the filter the policy names; a ``PolicyError`` naming the field if
    no registered accountant of that name is a filter."""
    filters = [r.name for r in entries() if r.filter is not None]
    with _lock:
        found = _registered.get(spec.accountant)
    if found is None or found.filter is None:
        what = "an odometer only, not a filter" if found is not None else "not an accountant"
        raise PolicyError(
            f"budget.accountant: {spec.accountant!r} is {what}; the filters are "
            f"{', '.join(filters)}"
        )
    return found


def filter_for(
    spec: BudgetSpec, epsilon: Fraction | None, delta: Fraction, rho: Fraction | None = None
) -> Filter:
    """The filter the policy names, for a cap (epsilon, delta) or (rho, delta). Where the
    policy leaves a parameter of the rdp or zcdp filter unstated, its ``filter_version`` (the
    ledger's) gives it: the grid and split (``rdp.RDP_GRIDS``) and the selection reserve
    (``SELECTION_PARTS``)."""
    make = deciding(spec).filter
    assert make is not None  # ``deciding`` returns filters only
    return make(Caps(spec, epsilon, delta, rho))
