"""Privacy events: what was sampled, with the parameters its guarantee follows from.

An event names the mechanism actually sampled (DESIGN.md section 1), so that every accountant
can recompute its loss from it later: a discrete Laplace is not a continuous one, and a discrete
Gaussian is not a continuous Gaussian (Canonne, Kamath, Steinke 2020). Events are frozen,
hashable values; ``label`` is a description only and takes no part in equality, so a history can
be grouped into (event, multiplicity) pairs.

Neighbouring data sets differ in one privacy unit (add/remove); every sensitivity below is for
that relation, in the integer units of the measurement.

Basic-composition cost (``epsilon``, ``delta``) is given by each event, and guarded for the
Gaussian family by ``basic_pair``: a Gaussian's stated (target) pair never costs less than its own
curve gives. A ``Composite`` (one query) is charged its ``certified`` pair, which it refuses at
construction unless a theorem supports it for its events (``supports``), or else the sum of its
events' guarded pairs: so no path that reads a query's cost (the ledger's basic composition, its
replay, the report) can charge less than its mechanisms give. The other accountants' curves live
in ``dpsql.mechanisms.curves``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache

from dpsql.errors import InternalError, LedgerError
from dpsql.mechanisms.conversions import (
    discrete_gaussian_delta,
    frac_down,
    frac_up,
    gdp_delta,
    round_up,
    zcdp_to_delta,
    zcdp_to_dp,
)
from dpsql.policy import DeclaredMechanism
from dpsql.policy.numbers import decimal_text


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
class SubsampledGaussian(ApproxDP):
    """A query whose measurements are all discrete Gaussians, rho-zCDP in total, run on a
    Poisson sample of the units at ``rate`` (``dpsql.plan.sample``). ``epsilon`` and ``delta``
    are the amplified pair of the query's certified pair (Balle, Barthe, Gaboardi 2018), which
    the accountants that compose pairs read, as for any ApproxDP; the RDP filter reads the
    subsampled curve of its rho (``curves.subsampled_rdp``, Zhu and Wang 2019), the zCDP filter
    its rho (subsampling never raises a Renyi divergence: joint convexity)."""

    rate: Fraction = Fraction(0)
    rho: Fraction = Fraction(0)


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
    | SubsampledGaussian
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
    that pair; without it, the sum of the parts' guarded costs (``basic_pair``). A certified
    pair that no theorem gives for the events (``supports``) raises ``InternalError``: a query
    cannot claim less than its mechanisms give, whatever path later reads its cost.
    """

    events: tuple[Event, ...]
    certified: tuple[Fraction, Fraction] | None = None
    # (family, key): the query touched only the units of one cell of a partition family (a
    # constant-per-unit column of one table at one data version, ``dpsql.analyze.cells``): queries
    # of different keys of one family compose in parallel, all others sequentially.
    cell: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        if self.certified is not None and not supports(self.events, self.certified):
            raise InternalError(
                "a query's certified (epsilon, delta) is below what its mechanisms give"
            )

    @property
    def epsilon(self) -> Fraction:
        if self.certified is not None:
            return self.certified[0]
        return sum((basic_pair(e)[0] for e in self.events), Fraction(0))

    @property
    def delta(self) -> Fraction:
        if self.certified is not None:
            return self.certified[1]
        return sum((basic_pair(e)[1] for e in self.events), Fraction(0))

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
    if isinstance(event, SubsampledGaussian):
        return (
            f"SubsampledGaussian(rate={n(event.rate)}, rho={n(event.rho)}, "
            f"epsilon={n(event.epsilon)}, delta={n(event.delta)}){suffix}"
        )
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


_GAUSSIAN = (DiscreteGaussian, Gaussian, ZCDP)
# The exact one-dimensional curve sums the pmf over a window of 40 sigma; above this variance
# the calibration (``dpsql.plan.calibration``) certifies through zCDP, and so does ``supports``.
EXACT_CURVE_MAX_SIGMA2 = 10**6


@lru_cache(maxsize=4096)
def basic_pair(event: Event) -> tuple[Fraction, Fraction]:
    """The (epsilon, delta)-DP pair of one event, as exact rationals: the pair it states, except
    that a Gaussian-type event is charged at its target epsilon with delta = max(target delta,
    the mechanism's own delta at that epsilon), so a missing or wrong calibration never makes
    its cost smaller than its curve gives."""
    if not isinstance(event, _GAUSSIAN):
        return event.epsilon, event.delta
    eps = event.target_epsilon
    eps_float = frac_down(eps)  # a smaller epsilon only raises the curve's delta: safe
    if isinstance(event, Gaussian):
        curve = gdp_delta(_mu(event), eps_float)  # the exact mu-GDP profile (DRS 2019, Cor 2.13)
    elif isinstance(event, DiscreteGaussian) and event.dimensions == 1:
        # Its own curve (Canonne, Kamath, Steinke 2020, Theorem 7), at the lowest variance
        # float; a non-integer sensitivity goes up to the next integer shift.
        sigma2 = frac_down(event.sigma2)
        curve = discrete_gaussian_delta(sigma2, math.ceil(event.sensitivity), eps_float)
    elif isinstance(event, DiscreteGaussian):
        # Several coordinates: no one-dimensional curve applies; its exact rho and the CKS
        # conversion (Corollary 13) do (DESIGN.md section 3).
        curve = zcdp_to_delta(frac_up(event.rho), eps_float)
    else:
        # Approximate zCDP: the conversion's delta plus the additive delta (Bun, Steinke 2016).
        curve = zcdp_to_delta(frac_up(event.rho), eps_float) + frac_up(event.delta_zcdp)
    delta = max(event.delta, Fraction(min(1.0, curve)))
    return eps, min(delta, Fraction(1))


@lru_cache(maxsize=4096)
def supports(events: tuple[Event, ...], certified: tuple[Fraction, Fraction]) -> bool:
    """Whether a theorem makes ``events``, composed, (certified epsilon, certified delta)-DP.

    The non-Gaussian events take their own pairs (basic composition, Dwork, Roth 2014,
    Theorem 3.16); the Gaussian-type events the rest, (epsilon_g, delta_g), by one of: their
    summed rho (zCDP composes, Bun, Steinke 2016, Lemma 2.3; approximate zCDP adds its deltas,
    Lemma 8.3) through the CKS conversion (Corollary 13); a single continuous Gaussian, its
    mu-GDP curve (Dong, Roth, Su 2019); a single discrete Gaussian on one coordinate, its exact
    curve (Canonne, Kamath, Steinke 2020, Theorem 7) up to EXACT_CURVE_MAX_SIGMA2. The same
    functions the calibration uses, which rounds with a margin of 1e-12 on the safe side, so
    every pair the planner certifies passes.
    """
    eps, delta = certified
    gaussians = [e for e in events if isinstance(e, _GAUSSIAN)]
    for e in events:
        if not isinstance(e, _GAUSSIAN):
            eps, delta = eps - basic_pair(e)[0], delta - basic_pair(e)[1]
    if eps < 0 or delta < 0:
        return False
    if not gaussians:
        return True
    rho = sum((_rho(e) for e in gaussians), Fraction(0))
    share = delta - sum((e.delta_zcdp for e in gaussians if isinstance(e, ZCDP)), Fraction(0))
    if share >= 1:
        return True  # delta 1 holds of anything
    if share > 0 and Fraction(zcdp_to_dp(frac_up(rho), frac_down(share))) <= eps:
        return True  # the cheap route first: every joint calibration takes it
    if len(gaussians) != 1:
        return False
    only = gaussians[0]
    if isinstance(only, Gaussian):
        return Fraction(gdp_delta(_mu(only), frac_down(eps))) <= delta
    if not isinstance(only, DiscreteGaussian) or only.dimensions != 1:
        return False
    if only.sigma2 > EXACT_CURVE_MAX_SIGMA2:
        return False  # the calibration takes the zCDP route there too
    shift = math.ceil(only.sensitivity)
    curve = discrete_gaussian_delta(frac_down(only.sigma2), shift, frac_down(eps))
    return Fraction(curve) <= delta


def _mu(event: Gaussian) -> float:
    """mu = sensitivity/sigma, rounded up: N(0, sigma^2) is exactly mu-GDP (Dong, Roth, Su 2019)."""
    squared = Fraction(event.sensitivity) ** 2 / Fraction(event.sigma) ** 2
    return round_up(math.sqrt(frac_up(squared)))


def _rho(event: DiscreteGaussian | Gaussian | ZCDP) -> Fraction:
    if isinstance(event, Gaussian):
        # N(0, sigma^2) with L2 sensitivity Delta is Delta^2/(2 sigma^2)-zCDP (Bun, Steinke 2016)
        return Fraction(event.sensitivity) ** 2 / (2 * Fraction(event.sigma) ** 2)
    return event.rho


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
        SubsampledGaussian,
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
    """The inverse of ``composite_to_json``; raises ``ValueError`` on anything unknown, and
    ``LedgerError`` on a certified pair below what its events give (``supports``)."""
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


def _decimal(value: Fraction | float | int) -> str:
    """A mechanism parameter as a decimal: exact when it terminates, else exact in parentheses."""
    if isinstance(value, Fraction):
        return decimal_text(value)
    return f"{value:g}" if isinstance(value, float) else str(value)
