"""Continual-release views: declared once, released as each period's block arrives, read free.

``declare`` plans the view's query on the table of a person-within-period unit
(``dpsql.policy.periods``) at the stated epsilon, chooses its mechanism (``dpsql.plan.views``),
and charges, through the session's one charge (``Pipeline``), the unit's loss of the whole
horizon to each of its calendar's periods and, for a person who can be in all of them, to the
lifetime cap: a reservation that does not fit is refused at creation, and nothing is recorded.

``release`` computes the values of the view whose periods have all arrived (a period arrives
when an active block of exactly its dates is registered): each node's bounded totals, from
the engine, plus the design's noise. A value is recorded once: its record is appended under
the ledger's lock only if no value of that node was recorded before (two sessions releasing
at once: one value, the other discarded unseen), so no node is ever noised twice.

``answer`` reads every period released, or one range of periods, from the recorded values
(post-processing: free), each with its ± (``dpsql.plan.views.Reading``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any, Protocol

from sqlglot import exp

from dpsql.accounting.budget.budget import Budget
from dpsql.accounting.ledger.views import (
    VIEW_NAME,
    VIEW_RECORD,
    VIEW_VALUE,
    Calendar,
    View,
    view_values,
    views,
)
from dpsql.engine.base import Engine
from dpsql.errors import EngineError, ParameterError, PolicyError, UnsupportedQueryError
from dpsql.mechanisms.event_kinds import composite_to_json
from dpsql.mechanisms.group import for_group
from dpsql.mechanisms.tails import Noise
from dpsql.noise.gaussian import discrete_gaussian
from dpsql.noise.laplace import discrete_laplace
from dpsql.plan.plans import Plan
from dpsql.plan.views import (
    BREAKEVEN,
    MAX_HORIZON,
    MECHANISMS,
    SCALE,
    Design,
    Reading,
    choose,
    coefficients,
    design,
    mean_half_widths,
    nodes,
    same_measurements,
)
from dpsql.policy import Policy
from dpsql.policy.blocks import iso_date
from dpsql.policy.numbers import decimal_text
from dpsql.release.result import Result
from dpsql.session.blocks import Registered
from dpsql.session.effective import Settings, SetValues
from dpsql.session.pipeline import Pipeline
from dpsql.sql.parse import DIALECT, ReadView, parse_select


class Session(Protocol):
    """What the views read of a ``dpsql.session.session.Session``."""

    policy: Policy
    pipeline: Pipeline
    registered: Registered
    engine: Engine
    analyst: str | None
    set_values: SetValues

    @property
    def filter(self) -> Budget: ...

    def plan(self, sql: str, params: Sequence[object] | None = None, **options: object) -> Plan:
        """Plan without running or charging anything."""

    def settings(self, options: Mapping[str, object] | None = None) -> Settings:
        """The effective settings."""


__all__ = ["answer", "declare", "explain", "plan_lines", "plan_view", "read", "release", "views_of"]


# Settings that change no bounded row and no noise: a view is read under any of them.
_NEUTRAL = frozenset({"confidence", "accuracy_columns", "fresh", "share"})


def _base(session: Session, sql: str, epsilon: Fraction, delta: Fraction | None) -> Plan:
    periods = session.policy.periods
    if periods is None:
        raise PolicyError("a view needs a person-within-period unit (the policy's periods)")
    moved = sorted(set(session.set_values.values()) - _NEUTRAL)
    if moved:
        # Its every value is planned on the policy alone, as when its cost was reserved.
        raise ParameterError(
            "a view is planned and released on the policy's settings: RESET "
            + ", ".join(f"dpsql.{name}" for name in moved)
        )
    plan = (
        session.plan(sql, epsilon=epsilon)
        if delta is None
        else session.plan(sql, epsilon=epsilon, delta=delta)
    )
    if plan.analysis.table != periods.table:
        raise UnsupportedQueryError(f"a view reads the table of periods, {periods.table}")
    refs = {f"_a{i}" for i in range(len(plan.estimates))} | {
        f"_k{j}" for j in range(len(plan.analysis.keys))
    }
    if any(not (isinstance(o.expr, exp.Column) and o.expr.name in refs)
           for o in plan.analysis.outputs):  # fmt: skip
        raise UnsupportedQueryError("a view's outputs are its group keys and its aggregates")
    return plan


def plan_view(
    session: Session,
    sql: str,
    *,
    horizon: int,
    epsilon: Fraction,
    delta: Fraction | None = None,
    mechanism: str = "auto",
) -> tuple[Plan, Design]:
    """The view's plan (one period's) and its design, without charging anything."""
    base = _base(session, sql, epsilon, delta)
    gaussian = any(m.sigma2 is not None for m in base.measurements)
    if mechanism == "auto":
        chosen = choose(horizon, gaussian)
    elif mechanism in MECHANISMS:
        chosen = mechanism
    else:
        raise ParameterError(f"a view's mechanism is auto or one of {', '.join(MECHANISMS)}")
    return base, design(base, chosen, horizon)


def declare(
    session: Session,
    name: str,
    sql: str,
    *,
    start: str,
    every: str,
    horizon: int,
    epsilon: Fraction,
    delta: Fraction | None = None,
    mechanism: str = "auto",
    by: str,
) -> View:
    """Declare a view and reserve its cost (module docstring); ``BudgetExceededError`` when the
    reservation does not fit, and nothing recorded."""
    if not VIEW_NAME.match(name):
        raise ParameterError("a view's name is a plain identifier of at most 64 characters")
    first = iso_date(start)
    if first is None or every not in ("day", "week", "month"):
        raise ParameterError("a view's calendar is a start YYYY-MM-DD and day, week or month")
    if every == "month" and first.day > 28:
        raise ParameterError("a monthly calendar starts on a day of the month up to 28")
    store = session.filter.store
    if name in views(store.records()):
        raise ParameterError(f"a view named {name} exists already")
    base, chosen = plan_view(session, sql, horizon=horizon, epsilon=epsilon, delta=delta,
                             mechanism=mechanism)  # fmt: skip
    calendar = Calendar(first, every, horizon)  # type: ignore[arg-type]
    details = {"view": name, "reserved": calendar.reserved(),
               "unit_event": composite_to_json(chosen.event)}  # fmt: skip
    # The one charge: each period pays the unit's loss, the lifetime cap the person's.
    (charged,) = session.pipeline.batch(
        chosen.event, f"VIEW {name}: {sql}", details, [lambda made: made]
    )
    assert charged is not None  # an event is always charged
    charge = charged.seq  # this charge's own record, whatever other processes appended
    view = View(name, sql, base.analysis.table, calendar, chosen.mechanism, base.event.epsilon,
                base.event.delta, charge, by)  # fmt: skip
    record = store.append(VIEW_RECORD, view.payload(), session.analyst)
    return View.of(record.payload, record.seq)


def views_of(session: Session) -> dict[str, View]:
    """Every view declared in the session's ledger, by name."""
    return views(session.filter.store.records())


def _design_of(session: Session, view: View) -> tuple[Plan, Design]:
    """The view's plan and design now, which must be what its reservation paid for."""
    base, chosen = plan_view(session, view.sql, horizon=view.calendar.horizon,
                             epsilon=view.epsilon, delta=view.delta or None,
                             mechanism=view.mechanism)  # fmt: skip
    paid = next((c.event for c in session.filter.charges if c.seq == view.charge), None)
    persons = session.pipeline.persons
    event = chosen.event
    if persons is not None:
        event = persons.person(event, {"reserved": view.calendar.reserved()})[0]
    if paid is None or paid != event:
        # The policy changed since the reservation: the noise would not be what was paid.
        raise PolicyError(f"view {view.name} was reserved under another policy; declare it anew")
    return base, chosen


def _arrived(session: Session, view: View) -> dict[int, str]:
    """Period index -> the id of the active block of exactly its dates."""
    active = session.registered.blocks.active(view.table)
    at = {(b.start, b.end): b.id for b in active}
    out = {}
    for i in range(view.calendar.horizon):
        block = at.get(view.calendar.bounds(i))
        if block is not None:
            out[i] = block
    return out


def _totals(
    session: Session, view: View, base: Plan, first: int, end: int
) -> tuple[list[tuple[Any, ...]], list[list[int]]]:
    """The bounded totals of periods [first, end): keys (sorted) and per measurement the ints."""
    period = session.policy.data.blocks[view.table].period
    a, b = view.calendar.bounds(first)[0], view.calendar.bounds(end - 1)[1]
    select = parse_select(view.sql)
    column = exp.column(period, quoted=True)
    window = exp.and_(
        exp.GTE(this=column.copy(), expression=exp.cast(exp.Literal.string(a.isoformat()), "DATE")),
        exp.LT(this=column.copy(), expression=exp.cast(exp.Literal.string(b.isoformat()), "DATE")),
    )
    select = select.where(window, copy=False)
    plan = session.plan(select.sql(dialect=DIALECT), epsilon=view.epsilon)
    if not same_measurements(plan.measurements, base.measurements):
        raise PolicyError(f"view {view.name}'s query no longer measures what it reserved")
    try:
        _, rows = session.engine.run(plan.engine_sql)
    except EngineError:
        raise EngineError() from None
    n = len(plan.analysis.keys)
    rows = sorted(rows, key=lambda r: tuple(str(v) for v in r[:n]))
    keys = [tuple(r[:n]) for r in rows]
    return keys, [[int(r[n + j] or 0) for r in rows] for j in range(len(base.measurements))]


def _noised(values: Sequence[int | Fraction], noise: Noise) -> list[int]:
    draws = (discrete_laplace(noise.scale, len(values)) if noise.scale is not None
             else discrete_gaussian(noise.sigma2, len(values)))  # type: ignore[arg-type]  # fmt: skip
    return [int(v) + int(z) for v, z in zip(values, draws, strict=True)]


def _plain_key(value: object) -> object:
    if isinstance(value, (dt.date, dt.datetime)):
        return value.isoformat()
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)


def release(session: Session, view: View) -> int:
    """Record the values of ``view`` whose periods have arrived; how many this call recorded."""
    base, chosen = _design_of(session, view)
    arrived = _arrived(session, view)
    store = session.filter.store
    recorded = view_values(store.records(), view.name)
    done = set(recorded)
    known = next(iter(recorded.values()))["keys"] if recorded else None
    exact: dict[int, Any] = {}
    made = 0
    for first, end in nodes(view.calendar.horizon, chosen.mechanism):
        if (first, end) in done:
            continue
        needed = range(0, end) if chosen.mechanism == "factorization" else range(first, end)
        if any(i not in arrived for i in needed):
            continue
        if chosen.mechanism == "factorization":
            keys, values = _prefix_rounded(session, view, base, end - 1, exact)
        else:
            keys, totals = _totals(session, view, base, first, end)
            values = [list(t) for t in totals]
        noisy = [_noised(v, noise) for v, noise in zip(values, chosen.noises, strict=True)]
        plain = [[_plain_key(k) for k in key] for key in keys]
        if known is not None and plain != known:
            # The groups moved (a public domain changed): its values would not add up.
            raise PolicyError(f"view {view.name}'s groups changed since its first value")
        known = plain
        payload = {"view": view.name, "start": first, "end": end, "keys": plain, "values": noisy}

        def once(records: Sequence[Any], node: tuple[int, int] = (first, end)) -> None:
            # Noised once only: a value another session recorded first is kept, this one dropped.
            if node in view_values(records, view.name):
                raise _TakenError()

        try:
            store.append(VIEW_VALUE, payload, session.analyst, once)
            made += 1
        except _TakenError:
            pass  # recorded by another session meanwhile: that value stands
        done.add((first, end))
    return made


class _TakenError(Exception):
    """Another session recorded this node's value first."""


def _prefix_rounded(
    session: Session, view: View, base: Plan, t: int, periods: dict[int, Any]
) -> tuple[list[tuple[Any, ...]], list[list[int]]]:
    """round(s·(C x)_t) per group and measurement, from each period's exact totals (read once
    per release into ``periods``, never kept beyond it)."""
    c = coefficients(view.calendar.horizon)
    keys: list[tuple[Any, ...]] = []
    acc: list[list[Fraction]] = []
    for j in range(t + 1):
        if j not in periods:
            periods[j] = _totals(session, view, base, j, j + 1)
        k, totals = periods[j]
        if not acc:
            keys, acc = k, [[Fraction(0)] * len(k) for _ in totals]
        for m, column in enumerate(totals):
            for g, x in enumerate(column):
                acc[m][g] += c[t - j] * x
    rounded = [[int((SCALE * v + Fraction(1, 2)) // 1) for v in column] for column in acc]
    return keys, rounded


def _index(view: View, text: str, edge: str) -> int:
    day = iso_date(text)
    for i in range(view.calendar.horizon + 1):
        if day == view.calendar.bounds(i)[0]:
            return i
    raise ParameterError(f"the range's {edge} is not a period boundary of view {view.name}")


def answer(session: Session, name: str, start: str | None = None, end: str | None = None) -> Result:
    """Each released period of view ``name``, or the range [start, end) of periods, with ±."""
    store = session.filter.store
    view = views(store.records()).get(name)
    if view is None:
        raise ParameterError(f"no view is named {name}")
    release(session, view)
    base, chosen = _design_of(session, view)
    found = view_values(store.records(), name)
    released = tuple(sorted(found, key=lambda n: (n[1], n[1] - n[0])))
    reading = Reading.of(chosen, released)
    if start is None or end is None:
        ranges = [(p, p + 1) for p in range(reading.covered())]
    else:
        ranges = [(_index(view, start, "start"), _index(view, end, "end"))]
    confidence = session.settings().confidence
    keys = [k.name for k in base.analysis.keys]
    outputs = [o for o in base.analysis.outputs if o.expr.name.startswith("_a")]
    columns = ["period_start", "period_end", *keys]
    for o in outputs:
        columns += [o.name, f"{o.name}_pm"]
    rows = []
    first = found[released[0]] if released else {"keys": []}
    for a, b in ranges:
        for g, key in enumerate(first["keys"]):
            row: list[Any] = [view.calendar.bounds(a)[0], view.calendar.bounds(b - 1)[1], *key]
            for o in outputs:
                j = base.estimates[int(o.expr.name[2:])].measurements[0]
                values = [int(found[n]["values"][j][g]) for n in released]
                value, width = reading.estimate(values, a, b, chosen.noises[j], confidence)
                unit = base.measurements[j].unit
                row += [float(value * unit), width * float(unit)]
            rows.append(tuple(row))
    types = ("DATE", "DATE", *("VARCHAR" for _ in keys), *("DOUBLE" for _ in outputs for _ in "ab"))
    message = f"view {name}: {chosen.mechanism}, served free from released values"
    return Result(tuple(columns), types, tuple(rows), message=message)


def plan_lines(
    session: Session,
    sql: str,
    *,
    horizon: int,
    epsilon: Fraction,
    delta: Fraction | None = None,
    mechanism: str = "auto",
) -> list[str]:
    """How a view of ``sql`` would be released (``dpsql views plan``, ``EXPLAIN VIEW``): its
    mechanism, each mechanism's mean ± over the ranges of the horizon, from which horizon the
    tree and the factorization beat plain answers, and what a period and a person pay."""
    base, chosen = plan_view(session, sql, horizon=horizon, epsilon=epsilon, delta=delta,
                             mechanism=mechanism)  # fmt: skip
    gaussian = any(m.sigma2 is not None for m in base.measurements)
    widths = mean_half_widths(horizon, gaussian)
    lines = chosen.explain()
    lines.append("mean standard deviation of a range, in units of one period's: "
                 + ", ".join(f"{m} {w:.3f}" for m, w in widths.items()))  # fmt: skip
    for name in ("tree", "factorization"):
        if (name, gaussian) in BREAKEVEN:
            at = BREAKEVEN[(name, gaussian)]
            lines.append(f"{name} beats plain answers from a horizon of {at} periods"
                         if at is not None else f"{name} never beats plain answers up to "
                         f"{MAX_HORIZON} periods under this noise")  # fmt: skip
    # A reservation's charge for a person in all its periods (``Persons.read``: k = horizon).
    person = for_group(chosen.event, horizon) if session.pipeline.persons else chosen.event
    n = decimal_text
    lines.append(f"each period pays epsilon {n(chosen.event.epsilon)}, delta "
                 f"{n(chosen.event.delta)} per person-period")  # fmt: skip
    lines.append(f"a person in all {horizon} periods: epsilon {n(person.epsilon)}, delta "
                 f"{n(person.delta)} of the lifetime cap")  # fmt: skip
    return lines


def explain(session: Session, name: str) -> Result:
    """``EXPLAIN VIEW name``: ``plan_lines`` of a declared view, reading nothing."""
    view = views_of(session).get(name)
    if view is None:
        raise ParameterError(f"no view is named {name}")
    c = view.calendar
    lines = [f"view {name}: {c.horizon} {c.every}(s) from {c.start}, reserved by charge "
             f"{view.charge}"]  # fmt: skip
    lines += plan_lines(session, view.sql, horizon=c.horizon, epsilon=view.epsilon,
                        delta=view.delta or None, mechanism=view.mechanism)  # fmt: skip
    return Result(("plan",), ("VARCHAR",), tuple((line,) for line in lines))


def read(session: Session, statement: ReadView) -> Result:
    """``VIEW name [FROM ... TO ...]`` or ``EXPLAIN VIEW name``."""
    if statement.explain:
        return explain(session, statement.name)
    return answer(session, statement.name, statement.start, statement.end)
