"""How many fresh queries fit a budget of (epsilon 1, delta 1e-6) under each filter dpsql offers.

Each stream is a run of fresh ``SELECT COUNT(*) FROM visits WHERE age > k`` (k varying, C = 10,
no GROUP BY) on the example data, through ``dpsql.connect`` with examples/policy.toml's
``[budget]`` replaced by the cap and one filter (``FILTERS``), counted until the first
``BudgetExceededError``. "discrete Laplace e": ``SET dpsql.epsilon = e``; "discrete Gaussian
s": ``SET dpsql.mechanism = 'gaussian'`` and ``SET dpsql.sigma = s`` (each query is then
1/(2 s^2)-zCDP); "alternating": the two in turn, each resetting the other's setting.

- The first table runs every query through ``dpsql.connect``.
- The column "rdp, one order" is ``budget.rdp_order`` set to the best single order for that
  stream (chosen in hindsight, on the session's own events through the Budget API, among
  ``CANDIDATE_ORDERS``), then run like the others.
- The other tables (more streams, other caps) charge the events a ``dpsql.connect`` session
  charges for the stream's queries through the Budget API (``dpsql.accounting.budget.build``), which
  decides exactly as the session does (their counts reach 10^5).
- Last, the RDP reading of 10^4 discrete Gaussians of sigma 1 at delta 1e-6.

Prints the Markdown of docs/accounting.md ("How many queries fit"). A filter joins the table as
one more ``FilterColumn`` (its ``[budget]`` fields).

    python benchmarks/fit_table.py
"""

from __future__ import annotations

import functools
import math
import sys
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import dpsql
from dpsql.accounting.budget.build import budget_for
from dpsql.accounting.budget.state import events_for
from dpsql.accounting.registry import SELECTION_PARTS
from dpsql.accounting.theorems.rdp import DEFAULT_ORDERS, ORDERS_V1, RdpAccountant, RdpFilter
from dpsql.errors import BudgetExceededError
from dpsql.mechanisms.conversions import zcdp_to_dp
from dpsql.mechanisms.events import Composite, Event
from dpsql.mechanisms.gaussian_events import DiscreteGaussian
from dpsql.mechanisms.laplace_events import DiscreteLaplace
from dpsql.policy import FILTER_VERSION, BudgetSpec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CAP: dict[str, Any] = {"epsilon": "1", "delta": "0.000001", "query_delta": "0.00000001"}
LIMIT = 200_000
# Single orders the "one order" column may fix (budget.rdp_order is at most 1024): 16 per
# doubling of alpha - 1, from 1.0078 to 983.
CANDIDATE_ORDERS = tuple(1 + 2 ** (k / 16) for k in range(-112, 160))


@dataclass(frozen=True)
class FilterColumn:
    """A column of the table: its heading and the ``[budget]`` fields beyond the cap. With
    ``best_order``, ``budget.rdp_order`` is the best single order for each stream."""

    label: str
    fields: dict[str, Any] = field(default_factory=dict)
    best_order: bool = False
    declares: bool = False  # the stream's one mechanism is ``budget.declared_mechanism``


FILTERS: tuple[FilterColumn, ...] = (
    FilterColumn("basic", {"accountant": "basic"}),
    FilterColumn("advanced", {"accountant": "advanced", "advanced_delta_prime": "0.0000005"}),
    FilterColumn("rdp", {"accountant": "rdp"}),
    FilterColumn("rdp, one order", {"accountant": "rdp"}, best_order=True),
    FilterColumn("zcdp", {"accountant": "zcdp"}),
    FilterColumn("zcdp, no reserve", {"accountant": "zcdp", "selection_delta": "0"}),
    # The PLD filter over the one mechanism the stream's queries are (a stream of two cannot
    # be declared: "-").
    FilterColumn("pld, declared", {"accountant": "pld"}, declares=True),
    # The defaults of ledgers created before version 2 (42 orders split equally, half of delta
    # reserved for partition selection), for comparison.
    FilterColumn("rdp, version 1", {"accountant": "rdp", "filter_version": 1}),
    FilterColumn("zcdp, version 1", {"accountant": "zcdp", "filter_version": 1}),
)


@dataclass(frozen=True)
class Stream:
    """Query i runs after the session commands ``steps[i % len(steps)]``."""

    label: str
    steps: tuple[tuple[str, ...], ...]


def laplace(epsilon: str) -> tuple[str, ...]:
    return (
        "RESET dpsql.sigma",
        "SET dpsql.mechanism = 'laplace'",
        f"SET dpsql.epsilon = {epsilon}",
    )


def gaussian(sigma: str) -> tuple[str, ...]:
    return ("RESET dpsql.epsilon", "SET dpsql.mechanism = 'gaussian'", f"SET dpsql.sigma = {sigma}")


def stream(label: str, *steps: tuple[str, ...]) -> Stream:
    return Stream(label, steps)


MAIN: tuple[Stream, ...] = (
    stream("discrete Laplace, epsilon 0.01", laplace("0.01")),
    stream("discrete Gaussian, sigma 50", gaussian("50")),
    stream("alternating the two", laplace("0.01"), gaussian("50")),
)
MORE: tuple[Stream, ...] = (
    stream("discrete Laplace, epsilon 0.1", laplace("0.1")),
    stream("discrete Laplace, epsilon 0.03", laplace("0.03")),
    stream("discrete Laplace, epsilon 0.001", laplace("0.001")),
    stream("discrete Gaussian, sigma 5", gaussian("5")),
    stream("discrete Gaussian, sigma 15", gaussian("15")),
    stream("discrete Gaussian, sigma 500", gaussian("500")),
    stream("one Laplace 0.1, nine Gaussians 50", laplace("0.1"), *[gaussian("50")] * 9),
)
OTHER_CAPS: tuple[str, ...] = ("0.25", "4")


def query(i: int) -> str:
    return f"SELECT COUNT(*) FROM visits WHERE age > {i % 50 + 1}"


def policy(budget: dict[str, Any]) -> dict[str, Any]:
    """examples/policy.toml with its ``[budget]`` replaced (and its data path made absolute)."""
    raw = tomllib.loads((EXAMPLES / "policy.toml").read_text(encoding="utf-8"))
    tables = {name: str(EXAMPLES / path) for name, path in raw["data"]["tables"].items()}
    # No diagnosis: each query of a stream is the stream's one mechanism alone.
    budget = {"diagnose": False, **budget}
    return {**raw, "data": {**raw["data"], "tables": tables}, "budget": budget}


def through_connect(budget: dict[str, Any], queries: Stream, limit: int = LIMIT) -> int:
    """Fresh queries of ``queries`` through ``dpsql.connect`` until the first refusal."""
    conn = dpsql.connect(policy(budget))
    try:
        cursor = conn.cursor()
        cursor.execute("SET dpsql.fresh = true")
        for i in range(limit):
            if i < len(queries.steps) or len(queries.steps) > 1:
                for command in queries.steps[i % len(queries.steps)]:
                    cursor.execute(command)
            try:
                cursor.execute(query(i))
            except BudgetExceededError:
                return i
            cursor.fetchall()
        return limit
    finally:
        conn.close()


def session_events(queries: Stream) -> list[Composite]:
    """What a ``dpsql.connect`` session charges for each step of ``queries`` (one query each,
    under a budget wide enough for any of them)."""
    conn = dpsql.connect(policy({**CAP, "epsilon": "1000", "delta": "0.5"}))
    try:
        cursor = conn.cursor()
        cursor.execute("SET dpsql.fresh = true")
        for i, commands in enumerate(queries.steps):
            for command in commands:
                cursor.execute(command)
            cursor.execute(query(i))
            cursor.fetchall()
        return [charge.event for charge in conn.session.filter.charges]
    finally:
        conn.close()


def declared(events: Sequence[Composite]) -> dict[str, Any] | None:
    """``budget.declared_mechanism`` for a stream whose every query is one and the same
    measurement, in the session's own grid units; None for any other stream."""
    kinds = {e.events for e in events}
    if len(kinds) != 1 or len(next(iter(kinds))) != 1:
        return None
    (event,) = next(iter(kinds))
    if isinstance(event, DiscreteLaplace):
        noise = {"kind": "discrete_laplace", "scale": str(event.scale)}
    elif isinstance(event, DiscreteGaussian):
        sigma = Fraction(math.isqrt(event.sigma2.numerator), math.isqrt(event.sigma2.denominator))
        if sigma**2 != event.sigma2:
            return None
        noise = {"kind": "discrete_gaussian", "sigma": str(sigma)}
    else:
        return None
    return {**noise, "sensitivity": int(event.sensitivity)}


def _cell(column: FilterColumn, budget: dict[str, Any], events: Sequence[Composite]) -> bool:
    """Complete ``budget`` for ``column``; False when the column cannot take the stream."""
    if not column.declares:
        return True
    mechanism = declared(events)
    if mechanism is None:
        return False
    budget["declared_mechanism"] = mechanism
    return True


def through_budget(budget: dict[str, Any], events: Sequence[Composite], limit: int = LIMIT) -> int:
    """The same count through the Budget API: ``events`` charged in turn until refused."""
    spent = budget_for("fit", BudgetSpec.model_validate(budget))
    for i in range(limit):
        try:
            spent.charge(events[i % len(events)], query(i), None)
        except BudgetExceededError:
            return i
    return limit


def best_order(budget: dict[str, Any], events: Sequence[Composite]) -> tuple[float, int]:
    """The single order (of ``CANDIDATE_ORDERS``) that admits the most of ``events`` in turn,
    and how many: each count by bisection on the filter's own decision (RDP only grows). The
    filter is the one ``budget.rdp_order`` gives: all of the conversion's delta at that order,
    the default selection reserve (``registry.SELECTION_PARTS``)."""
    spec = BudgetSpec.model_validate(budget)
    assert spec.epsilon is not None and spec.selection_delta is None
    reserve = spec.delta * SELECTION_PARTS[FILTER_VERSION]
    flat = [events_for("rdp", [event]) for event in events]
    best = (CANDIDATE_ORDERS[0], -1)
    for alpha in CANDIDATE_ORDERS:
        decider = RdpFilter(spec.epsilon, spec.delta, (alpha,), approx_delta_cap=reserve)
        n = _bisect(functools.partial(_admits_prefix, decider, flat))
        if n > best[1]:
            best = (alpha, n)
    return best


def _admits_prefix(decider: RdpFilter, events: Sequence[list[Event]], k: int) -> bool:
    """Whether ``decider`` admits the k-th query of ``events`` in turn after the first k - 1."""
    tally = decider.tally()
    for j, parts in enumerate(events):
        count = len(range(j, k - 1, len(events)))
        for part in parts:
            if count:
                tally.add(part, count)
    return decider.admits_tally(tally, events[(k - 1) % len(events)])


def _bisect(admits: Callable[[int], bool]) -> int:
    """How many queries are admitted before the first refusal, for a monotone ``admits``."""
    lo, hi = 0, 1
    while hi <= LIMIT and admits(hi):
        lo, hi = hi, 2 * hi
    if hi > LIMIT:
        return LIMIT
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if admits(mid) else (lo, mid)
    return lo


def _row(label: str, cells: list[str]) -> str:
    return f"| {label} | " + " | ".join(cells) + " |"


def _header(first: str) -> list[str]:
    labels = [f.label for f in FILTERS]
    return [_row(first, labels), "|---|" + "---|" * len(labels)]


def main_table() -> list[str]:
    lines = _header("stream (through dpsql.connect)")
    for queries in MAIN:
        events = session_events(queries)
        cells = []
        for column in FILTERS:
            budget = {**CAP, **column.fields}
            if not _cell(column, budget, events):
                cells.append("-")
            elif column.best_order:
                alpha, _ = best_order(budget, events)
                budget["rdp_order"] = alpha
                cells.append(f"{through_connect(budget, queries)} (order {alpha:.4g})")
            else:
                cells.append(str(through_connect(budget, queries)))
        lines.append(_row(queries.label, cells))
    return lines


def budget_table(streams: Sequence[Stream], epsilon: str) -> list[str]:
    lines = _header(f"stream, cap epsilon {epsilon} (Budget API)")
    for queries in streams:
        events = session_events(queries)
        cells = []
        for column in FILTERS:
            budget = {**CAP, "epsilon": epsilon, **column.fields}
            if not _cell(column, budget, events):
                cells.append("-")
            elif column.best_order:
                alpha, _ = best_order(budget, events)
                budget["rdp_order"] = alpha
                n = through_budget(budget, events)
                cells.append(f"{n} (order {alpha:.4g})")
            else:
                n = through_budget(budget, events)
                cells.append(f">{LIMIT}" if n == LIMIT else str(n))
        lines.append(_row(queries.label, cells))
    return lines


def gaussian_reading() -> str:
    """The RDP odometer on 10^4 discrete Gaussians of sigma 1 (sensitivity 1) at delta 1e-6."""
    history = [DiscreteGaussian(Fraction(1), Fraction(1))] * 10_000
    now = RdpAccountant().epsilon(history, 1e-6)
    before = RdpAccountant(ORDERS_V1).epsilon(history, 1e-6)
    return (
        f"RDP reading of 10^4 discrete Gaussians of sigma 1 at delta 1e-6: {now:,.2f} on the "
        f"{len(DEFAULT_ORDERS)}-order grid ({before:,.2f} on the {len(ORDERS_V1)}-order grid of "
        f"version 1; zCDP, the order optimized continuously: {zcdp_to_dp(5000.0, 1e-6):,.2f})."
    )


def main() -> None:
    start = time.monotonic()
    sections: list[Callable[[], list[str]]] = [
        main_table,
        functools.partial(budget_table, MORE, CAP["epsilon"]),
        *(functools.partial(budget_table, MAIN, epsilon) for epsilon in OTHER_CAPS),
    ]
    for section in sections:
        print("\n".join(section()) + "\n", flush=True)
    print(gaussian_reading())
    print(f"({time.monotonic() - start:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
