"""The plans a session keeps: what a plan is a pure function of (its key), and what is kept.

A statement seen again under the same key reuses its ``Planned``, everything before the check;
never a charge or noise, which each fresh answer gets on its own (``docs/cache.md``).
``plan_key`` keys a statement on exactly the inputs of its plan, with each value typed by
``_keyable``; ``KeptPlans`` is the session's store of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from dpsql.cache import keys as cache
from dpsql.plan.explain import explain
from dpsql.plan.plans import Plan
from dpsql.policy.files import FileSet
from dpsql.release.result import Result
from dpsql.session import periods

# Values a plan key may hold: with their type name, they identify the input exactly.
_KEYABLE = (type(None), bool, int, float, str, Fraction)


@dataclass(frozen=True)
class Planned:
    """A statement planned once, kept under its ``Session.plan_key``: everything before the
    check that a repeat of the same key may reuse. Never a charge, never noise: each fresh
    answer is still checked, charged and noised on its own."""

    explain: bool
    plan: Plan
    keys: cache.Keys
    details: Mapping[str, object]
    verbose: bool = False  # EXPLAIN VERBOSE: every exact figure and the bounded SQL
    # The files the plan reads as the session bound them, checked before each charge.
    files: FileSet | None = None


def _keyable(values: Sequence[object] | Mapping[str, object] | None) -> tuple[object, ...] | None:
    """``values`` as a hashable tuple that tells any two inputs apart (each value with its type
    name; a float by its repr, since -0.0 == 0.0), or None when one value is of a type outside
    ``_KEYABLE`` (the plan is then not kept). No value is converted to decimal text: a huge
    integer is refused by validation later, not here."""
    if values is None:
        return ()
    named: list[tuple[str | None, object]] = (
        sorted(values.items()) if isinstance(values, Mapping) else [(None, v) for v in values]
    )
    if any(type(value) not in _KEYABLE for _, value in named):
        return None
    return tuple(
        (name, type(value).__name__, repr(value) if isinstance(value, float) else value)
        for name, value in named
    )


def plan_key(
    sql: str,
    params: Sequence[object] | None,
    options: Mapping[str, object],
    *,
    set_values: Mapping[str, object],
    analyst: str | None,
    version: tuple[object, ...],
    estimated: Mapping[tuple[str, str], tuple[Fraction, Fraction]],
) -> tuple[object, ...] | None:
    """What a plan is a pure function of: the statement's text, its parameters and options,
    every SET value, the analyst, the policy's content digest and the data version the owner
    declares (``version``), and the bounds estimated so far (the engine's key domains and cell
    keys are functions of the query and the schema, which the data version covers). None when
    a value cannot be keyed exactly: the statement is then planned afresh."""
    # Only a list or tuple is read here: a generator would be used up before binding.
    bound = _keyable(params) if params is None or isinstance(params, list | tuple) else None
    given = _keyable(options)
    settings = _keyable(set_values)
    if not isinstance(sql, str) or bound is None or given is None or settings is None:
        return None
    estimates = tuple(sorted((k, str(lo), str(hi)) for k, (lo, hi) in estimated.items()))
    return (sql, bound, given, settings, analyst, *version, estimates)


class KeptPlans(dict[tuple[object, ...], Planned]):
    """The plans a session keeps, by ``plan_key``, the oldest dropped first beyond ``limit``."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def keep(self, key: tuple[object, ...], planned: Planned) -> None:
        if len(self) >= self.limit:
            self.pop(next(iter(self)))
        self[key] = planned


def ledger_details(
    plan: Plan,
    *,
    engine: str,
    overrides: list[dict[str, str]],
    policy_version: str,
    data_version: str,
    dpsql_version: str,
) -> dict[str, object]:
    """What the ledger keeps beside a charge, so that a report can be reproduced later."""
    # The plan's lines without its bounded SQL (kept below as the engine runs it), since
    # parsing and pretty-printing the bounded SQL costs some 5 ms.
    header = plan.explain(sql=False)
    return {
        "plan": [line for line in header if not line.startswith("  ")],
        # Bounds chosen after the charge: what runs first is the walks' query; the answer's
        # bounded SQL is recorded with its release (dpsql.cache.releases.record_auto).
        "bounded_sql": plan.engine_sql if plan.auto is None else (plan.auto.sql or ""),
        **({"diagnosis_sql": plan.diagnosis.engine_sql} if plan.diagnosis is not None else {}),
        "engine": engine,  # the bounded SQL is DuckDB's; Spark runs its lowering
        # The bounds that differ from the policy's, for the owner's audit.
        **({"overrides": overrides} if overrides else {}),
        "policy_version": policy_version,
        "data_version": data_version,
        # The blocks it read of each table made of blocks (dpsql.session.blocks).
        **({"blocks": {t: list(ids) for t, ids in plan.blocks}} if plan.blocks else {}),
        "dpsql_version": dpsql_version,
    }


def explained(plan: Plan, verbose: bool, engine: str, persons: periods.Persons | None) -> Result:
    """EXPLAIN's answer: the plan's lines, with the engine that will run it before the cost
    line, and after it, under a person-within-period unit, what a person and a period pay."""
    lines = explain(plan, verbose)
    at = next((i for i, line in enumerate(lines) if line.startswith("cost:")), len(lines))
    lines.insert(at, f"engine: {engine}")
    lines = with_periods(lines, plan, persons)
    return Result(("plan",), ("VARCHAR",), tuple((line,) for line in lines), plan=plan)


def with_periods(lines: list[str], plan: Plan, persons: periods.Persons | None) -> list[str]:
    """EXPLAIN's ``lines`` with, after the cost line, what a person's lifetime cap and each
    period read pay under a person-within-period unit (``periods.explain``)."""
    at = next((i for i, line in enumerate(lines) if line.startswith("cost:")), None)
    if persons is None or at is None:
        return lines
    return [*lines[: at + 1], *periods.explain(persons, plan), *lines[at + 1 :]]
