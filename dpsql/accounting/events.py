"""Privacy events: what was sampled, with the parameters its guarantee follows from.

An event names the mechanism actually sampled (DESIGN.md section 1), so that every accountant
can recompute its loss from it later: a discrete Laplace is not a continuous one, and a discrete
Gaussian is not a continuous Gaussian (Canonne, Kamath, Steinke 2020). Events are frozen,
hashable values; ``label`` is a description only and takes no part in equality, so a history can
be grouped into (event, multiplicity) pairs.

Neighbouring data sets differ in one privacy unit (add/remove); every sensitivity below is for
that relation, in the integer units of the measurement.

Basic-composition cost (``epsilon``, ``delta``) is given by each event; the other accountants'
curves live in ``dpsql.accounting.curves``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from dpsql.policy import DeclaredMechanism
from dpsql.policy_numbers import decimal_text


@dataclass(frozen=True)
class DiscreteLaplace:
    """Discrete Laplace noise with ``scale`` on an integer query of L1 ``sensitivity``.

    Pure DP with epsilon = sensitivity / scale (Ghosh, Roughgarden, Sundararajan 2009; Canonne,
    Kamath, Steinke 2020, section 2): shifted pmfs differ by at most exp(|shift| / scale).
    ``dimensions``: how many coordinates one unit may move (L0); None where it was not recorded
    (ledgers written before it was), when only a sensitivity of at most 1 proves one coordinate.
    """

    scale: Fraction
    sensitivity: Fraction
    label: str = field(default="", compare=False)
    dimensions: int | None = None

    @property
    def epsilon(self) -> Fraction:
        return self.sensitivity / self.scale

    @property
    def delta(self) -> Fraction:
        return Fraction(0)


@dataclass(frozen=True)
class Laplace:
    """Continuous Laplace noise (reference and tests only: dpsql never samples it)."""

    scale: Fraction
    sensitivity: Fraction
    label: str = field(default="", compare=False)

    @property
    def epsilon(self) -> Fraction:
        return self.sensitivity / self.scale

    @property
    def delta(self) -> Fraction:
        return Fraction(0)


@dataclass(frozen=True)
class DiscreteGaussian:
    """Discrete Gaussian noise N_Z(0, sigma2) on each of ``dimensions`` integer coordinates,
    where one unit shifts each coordinate by at most ``sensitivity`` (so L2 <= sqrt(dimensions)
    times it; ``dimensions`` is L0, the groups one unit may touch).

    rho-zCDP with rho = dimensions * sensitivity^2 / (2 sigma2), exactly, for any integer shift
    (Canonne, Kamath, Steinke 2020, Theorem 14 and zCDP composition over coordinates). With one
    coordinate its (epsilon, delta) curve is its own (Theorem 7), not the continuous Gaussian's.
    ``target_epsilon``/``target_delta``: the (epsilon, delta) it was calibrated to, if alone.
    """

    sigma2: Fraction
    sensitivity: Fraction
    target_epsilon: Fraction = Fraction(0)
    target_delta: Fraction = Fraction(0)
    label: str = field(default="", compare=False)
    dimensions: int = 1

    @property
    def rho(self) -> Fraction:
        return self.dimensions * self.sensitivity**2 / (2 * self.sigma2)

    @property
    def epsilon(self) -> Fraction:
        return self.target_epsilon

    @property
    def delta(self) -> Fraction:
        return self.target_delta


@dataclass(frozen=True)
class Gaussian:
    """Continuous Gaussian noise N(0, sigma^2) with L2 ``sensitivity`` (reference and tests).

    Exactly mu-GDP with mu = sensitivity / sigma (Dong, Roth, Su 2019).
    """

    sigma: float
    sensitivity: float
    target_epsilon: Fraction = Fraction(0)
    target_delta: Fraction = Fraction(0)
    label: str = field(default="", compare=False)

    @property
    def mu(self) -> float:
        return self.sensitivity / self.sigma

    @property
    def epsilon(self) -> Fraction:
        return self.target_epsilon

    @property
    def delta(self) -> Fraction:
        return self.target_delta


@dataclass(frozen=True)
class PureDP:
    """Any epsilon-DP mechanism."""

    epsilon: Fraction
    label: str = field(default="", compare=False)

    @property
    def delta(self) -> Fraction:
        return Fraction(0)


@dataclass(frozen=True)
class ApproxDP:
    """Any (epsilon, delta)-DP mechanism."""

    epsilon: Fraction
    delta: Fraction
    label: str = field(default="", compare=False)


@dataclass(frozen=True)
class ZCDP:
    """Approximate zCDP: rho-zCDP except with probability ``delta_zcdp`` (Bun, Steinke 2016)."""

    rho: Fraction
    delta_zcdp: Fraction = Fraction(0)
    target_epsilon: Fraction = Fraction(0)
    label: str = field(default="", compare=False)

    @property
    def epsilon(self) -> Fraction:
        return self.target_epsilon

    @property
    def delta(self) -> Fraction:
        return self.delta_zcdp


@dataclass(frozen=True)
class Exponential:
    """The exponential mechanism with a utility of sensitivity 1: epsilon-DP and, having
    bounded range, epsilon^2/8-zCDP (Cesar, Rogers 2021)."""

    epsilon: Fraction
    label: str = field(default="", compare=False)

    @property
    def delta(self) -> Fraction:
        return Fraction(0)


@dataclass(frozen=True)
class LaplacePartitionSelection:
    """Release of the groups whose discrete-Laplace count of distinct units reaches a threshold.

    (epsilon, delta)-DP with epsilon = sensitivity / scale (sensitivity = L0, the groups one unit
    may touch) and delta the tail mass of the groups that only one unit creates
    (DESIGN.md section 4; Korolova et al. 2009, Wilson et al. 2020 with the discrete tail).
    The released counts of the groups that exist on both sides are a discrete Laplace with this
    scale and sensitivity, so apart from ``delta`` it is that mechanism.
    """

    scale: Fraction
    sensitivity: Fraction
    threshold: int
    delta_bound: Fraction
    label: str = field(default="partition selection", compare=False)

    @property
    def epsilon(self) -> Fraction:
        return self.sensitivity / self.scale

    @property
    def delta(self) -> Fraction:
        return self.delta_bound


Event = (
    DiscreteLaplace
    | Laplace
    | DiscreteGaussian
    | Gaussian
    | PureDP
    | ApproxDP
    | ZCDP
    | Exponential
    | LaplacePartitionSelection
)


@dataclass(frozen=True)
class Composite:
    """The events of one query, released together: they compose sequentially.

    ``certified`` is the query's (epsilon, delta) when the planner calibrated several events
    jointly (discrete Gaussians through their summed rho and the CKS conversion): the whole is
    (epsilon, delta)-DP although no split of it over the parts is. Basic composition charges
    that pair; without it, the sum of the parts' costs.
    """

    events: tuple[Event, ...]
    certified: tuple[Fraction, Fraction] | None = None
    # (family, key): the query touched only the units of one cell of a partition family (a
    # constant-per-unit column of one table at one data version, ``dpsql.sql.cells``): queries
    # of different keys of one family compose in parallel, all others sequentially.
    cell: tuple[str, str] | None = None

    @property
    def epsilon(self) -> Fraction:
        if self.certified is not None:
            return self.certified[0]
        return sum((e.epsilon for e in self.events), Fraction(0))

    @property
    def delta(self) -> Fraction:
        if self.certified is not None:
            return self.certified[1]
        return sum((e.delta for e in self.events), Fraction(0))

    def describe(self) -> list[str]:
        return [describe(e) for e in self.events]


def describe(event: Event) -> str:
    """One line naming the mechanism and its parameters."""
    suffix = f" {event.label}" if event.label else ""
    n = _decimal  # decimals people read (0.25, never 1/4)
    if isinstance(event, DiscreteLaplace | Laplace):
        name = type(event).__name__
        return f"{name}(scale={n(event.scale)}, L1={n(event.sensitivity)}){suffix}"
    if isinstance(event, DiscreteGaussian):
        return (
            f"DiscreteGaussian(sigma^2={n(event.sigma2)}, shift<={n(event.sensitivity)} on "
            f"{event.dimensions} coordinate(s), rho={n(event.rho)}){suffix}"
        )
    if isinstance(event, Gaussian):
        return f"Gaussian(sigma={n(event.sigma)}, L2={n(event.sensitivity)}){suffix}"
    if isinstance(event, LaplacePartitionSelection):
        return (
            f"LaplacePartitionSelection(scale={n(event.scale)}, L1={n(event.sensitivity)}, "
            f"threshold={n(event.threshold)}, delta={n(event.delta_bound)}){suffix}"
        )
    if isinstance(event, ZCDP):
        return f"zCDP(rho={n(event.rho)}, delta={n(event.delta_zcdp)}){suffix}"
    if isinstance(event, ApproxDP):
        return f"ApproxDP(epsilon={n(event.epsilon)}, delta={n(event.delta)}){suffix}"
    return f"{type(event).__name__}(epsilon={n(event.epsilon)}){suffix}"


def declared_event(declared: DeclaredMechanism) -> DiscreteLaplace | DiscreteGaussian:
    """The event of one measurement of the policy's declared mechanism (``budget.accountant =
    "pld"``): one coordinate, shifted by at most its sensitivity, with its noise."""
    shift = Fraction(declared.sensitivity)
    if declared.kind == "discrete_laplace":
        assert declared.scale is not None  # policy-validated
        return DiscreteLaplace(declared.scale, shift, dimensions=1)
    assert declared.sigma is not None  # policy-validated
    return DiscreteGaussian(declared.sigma**2, shift, dimensions=1)


def flatten(history: list[Composite] | tuple[Composite, ...]) -> list[Event]:
    """The events of a history of queries, in order (sequential composition)."""
    return [e for c in history for e in c.events]


_TYPES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        DiscreteLaplace,
        Laplace,
        DiscreteGaussian,
        Gaussian,
        PureDP,
        ApproxDP,
        ZCDP,
        Exponential,
        LaplacePartitionSelection,
    )
}


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
    """The inverse of ``composite_to_json``; raises ``ValueError`` on anything unknown."""
    events = []
    for item in data["events"]:  # type: ignore[attr-defined]
        fields = {k: _exact(v) for k, v in dict(item).items() if k != "type"}
        cls = _TYPES.get(str(item["type"]))
        if cls is None:
            raise ValueError(f"unknown event type {item['type']!r}")
        events.append(cls(**fields))
    certified = data.get("certified")
    cell = data.get("cell")
    # A (table, column, value) cell of an earlier version was keyed by the literal's text, not
    # the engine's value: two of its cells may hold the same units, so it composes sequentially.
    pinned = (str(cell[0]), str(cell[1])) if isinstance(cell, list) and len(cell) == 2 else None
    return Composite(
        tuple(events),
        tuple(_exact(x) for x in certified) if certified else None,  # type: ignore[arg-type, attr-defined]
        pinned,
    )


def _decimal(value: Fraction | float | int) -> str:
    """A mechanism parameter as a decimal: exact when it terminates, else exact in parentheses."""
    if isinstance(value, Fraction):
        return decimal_text(value)
    return f"{value:g}" if isinstance(value, float) else str(value)
