"""The kinds of event dpsql knows, by name: the ledger's exact JSON of a query's events, and
the event of the policy's declared mechanism.

A ledger names each event by its class (``EVENT_TYPES``) and stores every field exactly
(Fractions as their text, floats by ``repr``), so a charge read back is the charge written:
``composite_from_json(composite_to_json(c)) == c``. Only the kinds listed here are read back; a
record naming any other is not a ledger this code wrote.
"""

from __future__ import annotations

from fractions import Fraction

from dpsql.errors import InternalError, LedgerError
from dpsql.mechanisms.events import Composite, Event
from dpsql.mechanisms.gaussian_events import ZCDP, DiscreteGaussian, Gaussian
from dpsql.mechanisms.laplace_events import DiscreteLaplace, Laplace
from dpsql.mechanisms.selection_events import Exponential, LaplacePartitionSelection
from dpsql.mechanisms.stated_events import ApproxDP, PureDP, SubsampledGaussian
from dpsql.policy import DeclaredMechanism

__all__ = ["EVENT_TYPES", "composite_from_json", "composite_to_json", "declared_event"]

EVENT_TYPES: dict[str, type[Event]] = {
    cls.__name__: cls
    for cls in (
        DiscreteLaplace,
        Laplace,
        DiscreteGaussian,
        Gaussian,
        PureDP,
        ApproxDP,
        SubsampledGaussian,
        ZCDP,
        Exponential,
        LaplacePartitionSelection,
    )
}


def declared_event(declared: DeclaredMechanism) -> DiscreteLaplace | DiscreteGaussian:
    """The event of one measurement of the policy's declared mechanism (``budget.accountant =
    "pld"``): one coordinate, shifted by at most its sensitivity, with its noise."""
    shift = Fraction(declared.sensitivity)
    if declared.kind == "discrete_laplace":
        assert declared.scale is not None  # policy-validated
        return DiscreteLaplace(declared.scale, shift, dimensions=1)
    assert declared.sigma is not None  # policy-validated
    return DiscreteGaussian(declared.sigma**2, shift, dimensions=1)


def _plain(value: object) -> object:
    """Exact JSON for a field: Fractions as their text, so nothing is rounded in the ledger."""
    if isinstance(value, Fraction):
        return {"fraction": str(value)}
    if isinstance(value, float):
        return {"float": repr(value)}
    return value


def _exact(value: object) -> object:
    if isinstance(value, dict) and "fraction" in value:
        return Fraction(str(value["fraction"]))
    if isinstance(value, dict) and "float" in value:
        return float(str(value["float"]))
    return value


def composite_to_json(composite: Composite) -> dict[str, object]:
    """A JSON-ready, exact description of a query's events (what the ledger stores)."""
    return {
        "events": [
            {"type": type(e).__name__, **{k: _plain(v) for k, v in vars(e).items()}}
            for e in composite.events
        ],
        "certified": [_plain(x) for x in composite.certified] if composite.certified else None,
        "cell": list(composite.cell) if composite.cell is not None else None,
    }


def composite_from_json(data: dict[str, object]) -> Composite:
    """The inverse of ``composite_to_json``; raises ``ValueError`` on anything unknown, and
    ``LedgerError`` on a certified pair below what its events give (``events.supports``)."""
    events = []
    for item in data["events"]:  # type: ignore[attr-defined]
        fields = {k: _exact(v) for k, v in dict(item).items() if k != "type"}
        cls = EVENT_TYPES.get(str(item["type"]))
        if cls is None:
            raise ValueError(f"unknown event type {item['type']!r}")
        events.append(cls(**fields))
    certified = data.get("certified")
    cell = data.get("cell")
    # A (table, column, value) cell of an earlier version was keyed by the literal's text, not
    # the engine's value: two of its cells may hold the same units, so it composes sequentially.
    pinned = (str(cell[0]), str(cell[1])) if isinstance(cell, list) and len(cell) == 2 else None
    try:
        return Composite(
            tuple(events),
            tuple(_exact(x) for x in certified) if certified else None,  # type: ignore[arg-type, attr-defined]
            pinned,
        )
    except InternalError:
        # A record claiming less than its mechanisms give was not written by a sound planner:
        # the ledger is not trustworthy, and nothing may be charged on top of it.
        raise LedgerError(
            "a charge of the ledger certifies less than its mechanisms give: fail closed"
        ) from None
