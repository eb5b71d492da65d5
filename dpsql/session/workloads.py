"""Running a file planned as one workload: its one charge, then its answers in order.

``run_workload`` commits the workload's one charge before any engine work, then answers each
statement: from its own plan, or with its family. ``run_script`` plans and runs a text of
statements (the shell's multi-statement input, ``Cursor.executescript``), refusing it whole
when it does not fit (unless ``partial``).

Every release goes through the session's pipeline under the workload's one charge
(``Pipeline.under``): a plain statement as a ``QueryRequest``, an estimate as an ``Estimate``,
and a family as a ``FamilyRequest``, which runs its one bounded query, noises and combines its
measurements (``dpsql.release.families``) and publishes each member from its own plan. A
failure after the charge is the session's one ``EngineError``, recorded like any other: the
charge stands.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from dpsql.accounting.budget.report import Charge
from dpsql.cache import keys as cache
from dpsql.cache.families import (
    RECORD_KIND,
    family_blocks,
    family_key,
    family_payload,
    from_payload,
)
from dpsql.cache.keys import data_key, scope
from dpsql.engine.base import Engine
from dpsql.errors import BudgetExceededError
from dpsql.mechanisms.events import Composite
from dpsql.noise.measure import Noisy
from dpsql.plan.plans import Plan
from dpsql.plan.workload.family import Family
from dpsql.policy.numbers import exact
from dpsql.release.families import combine, measure_family
from dpsql.release.post import Release, accuracy_columns, publish
from dpsql.release.result import Result, _with_accuracy
from dpsql.session.overrides import overrides
from dpsql.session.pipeline import Pipeline, QueryRequest, Request, result
from dpsql.session.workload_plan import (
    Session,
    Step,
    Workload,
    blocks_read,
    one_line,
    plan_workload,
    statement_totals,
)
from dpsql.sql.parse import EstimateBounds, parse_statement
from dpsql.sql.split import split_statements

__all__ = ["FamilyRequest", "run_script", "run_workload", "served_members"]

NOTE = (
    "answered with statement(s) {members} from measurements on rows bounded once at the "
    "grouping {grouping}, combined by least squares: unrounded, and not clamped at 0, so that "
    "children sum to their parents"
)


Released = tuple[list[list[Any]], Any, dict[int, tuple[Plan, Noisy]], dict[int, Release]]


class FamilyRequest(Request[Released, dict[int, Result]]):
    """A family's one bounded query at the fine grouping, its measurements noised and combined
    by least squares (``dpsql.release.families``), each member published from its own plan;
    released under the workload's one charge (``Pipeline.under``)."""

    def __init__(self, session: Session, family: Family) -> None:
        self.session, self.family = session, family
        self.event, self.query, self.details = Composite(()), "", {}

    def measure(self, engine: Engine) -> Released:
        _, rows = engine.run(self.family.fine.engine_sql)
        values, noised = measure_family(self.family, rows)
        answered = combine(self.family, values, noised)
        # Published under the charge too: a failure of the post-processing keeps it.
        released = {i: publish(plan, noisy) for i, (plan, noisy) in answered.items()}
        return values, noised, answered, released

    def record(self, pipeline: Pipeline, charge: Charge, measured: Released) -> None:
        # The measurements released, kept for a later plan of the same family: post-processing.
        session, family = self.session, self.family
        values, noised, answered, _ = measured
        key = family_key(family, session.policy.dataset.id, session.policy_version(),
                         session.policy.dataset.data_version)  # fmt: skip
        policy = session.policy
        data = data_key(policy.dataset.data_version, family_blocks(family))
        where = scope(policy.dataset.id, session.policy_version(), data, policy.engine.name)
        payload = family_payload(family, key, charge.seq, values, noised, where=where)
        if payload is None:
            return
        record = pipeline.budget.store.append(RECORD_KIND, payload, pipeline.analyst,
                                              synced=False)  # fmt: skip
        # Each member's answer under its own query's key: asked again alone, the same answer,
        # free (post-processing of the family's release).
        version = session.policy_version()
        for member in family.members:
            plan, noisy = answered[member.index]
            k = cache.keys(member.plan, session.policy, version)
            pipeline.cache.record_member(plan, k, noisy, charge.seq, record.seq, member.plan.query)

    def publish(self, pipeline: Pipeline, charge: Charge, measured: Released) -> dict[int, Result]:
        family = self.family
        _, _, answered, released = measured
        members = ", ".join(str(m.index + 1) for m in family.members)
        grouping = f"of statement {family.fine_index + 1}"
        note = NOTE.format(members=members, grouping=grouping)
        return {
            i: replace(result(answered[i][0], release, charge, None), note=note)
            for i, release in released.items()
        }


def served_members(session: Session, family: Family, seq: int) -> dict[int, Result]:
    """Per member, its answer from the family's earlier release (ledger record ``seq``):
    post-processing of released measurements, recorded and never charged."""
    record = next(r for r in session.filter.store.records() if r.seq == seq)
    values, noised = from_payload(dict(record.payload))
    answered = combine(family, values, noised)
    out = {}
    for i, (plan, noisy) in answered.items():
        release = publish(plan, noisy)
        session.pipeline.reserve(plan.query, seq)
        out[i] = replace(result(plan, release, None, seq),
                         note=f"served again from the family release {seq}")  # fmt: skip
    return out


def _with_settings(session: Session, result: Result) -> Result:
    """``result`` as the settings in force show it (accuracy columns)."""
    if result.plan is not None and session.settings().accuracy_columns:
        return _with_accuracy(result, accuracy_columns(result.plan))
    return result


def run_workload(session: Session, workload: Workload) -> Iterator[tuple[Step, Result | None]]:
    """The workload's results in order (None for a step refused as not fitting). The one
    charge is committed before any engine work: another session that spent the budget since
    the plan makes it raise ``BudgetExceededError`` with nothing charged or run."""
    query, details = "", {}
    if workload.event is not None:
        effective = session.estimates.known()  # what the statements were planned with
        texts = [s.piece.text for s in workload.steps if s.charged]
        # The statements are in the details; the label names them by a digest (a file may be
        # 16 MiB: it is not written twice).
        digest = hashlib.sha256("\0".join(texts).encode()).hexdigest()[:12]
        query = f"WORKLOAD of {len(texts)} statement(s) {digest}: " + one_line(texts[0])
        changed = [
            {**entry, "statement": str(i)}
            for i, step in enumerate(workload.steps, start=1)
            if step.charged and step.plan is not None
            for entry in overrides(session.policy, effective, step.plan)
        ]
        details = {
            "statements": texts,
            "bounded_sql": ";\n".join(_bounded(workload)),
            **({"overrides": changed} if changed else {}),
            "engine": session.engine.name,
            "policy_version": session.policy_version(),
            "data_version": session.policy.dataset.data_version,
            **({"blocks": read} if (read := blocks_read(workload.steps)) else {}),
        }
    answered: dict[int, Result] = {}
    steps = [_stepper(session, workload, i, answered) for i in range(len(workload.steps))]
    results = session.pipeline.batch(workload.event, query, details, steps)
    yield from zip(workload.steps, results, strict=True)


def _stepper(
    session: Session, workload: Workload, i: int, answered: dict[int, Result]
) -> Callable[[Charge | None], Result | None]:
    """Statement ``i``'s answer, given the workload's charge (``answered`` holds the members of
    a family answered with an earlier statement)."""
    step = workload.steps[i]

    def answer(charge: Charge | None) -> Result | None:
        if step.source == "refused":
            return None
        found = workload.joint.family_of(i)
        seq = workload.released.get(found[0].fine_index) if found is not None else None
        if found is not None and seq is not None:
            if i not in answered:
                answered.update(served_members(session, found[0], seq))
            return _with_settings(session, answered.pop(i))
        if not step.charged:
            done: Result = session.execute(step.piece.text)
            return done
        assert charge is not None
        if step.kind == "estimate":
            statement = parse_statement(step.piece.text)
            assert isinstance(statement, EstimateBounds)
            estimate = session.estimates.plan(statement, session.settings())
            return session.pipeline.under(charge, estimate)
        if found is not None:
            if i not in answered:
                members = session.pipeline.under(charge, FamilyRequest(session, found[0]))
                answered.update(members)
            return _with_settings(session, answered.pop(i))
        assert step.plan is not None
        keys = cache.keys(step.plan, session.policy, session.policy_version())
        fresh = session.pipeline.under(charge, QueryRequest(step.plan, keys, {}))
        return _with_settings(session, fresh)

    return answer


def _bounded(workload: Workload) -> list[str]:
    out = [f.fine.engine_sql for f in workload.joint.families]
    for i, s in enumerate(workload.steps):
        if s.charged and s.plan is not None and workload.joint.family_of(i) is None:
            out.append(s.plan.engine_sql)
    return out


def run_script(
    session: Session, text: str, partial: bool = False
) -> list[tuple[Step, Result | None]]:
    """Plan ``text`` as one workload and run it: all or nothing, or with ``partial`` the
    longest prefix that fits (None for the statements after it)."""
    workload = plan_workload(session, split_statements(text))
    refused = [s for s in workload.steps if s.source == "refused"]
    if refused and not partial:
        eps, delta = statement_totals(workload.steps, "charge")
        more_eps, more_delta = statement_totals(workload.steps, "refused")
        raise BudgetExceededError(
            f"the statements need epsilon {exact(eps + more_eps)}, delta "
            f"{exact(delta + more_delta)} and {len(refused)} of them do not fit the remaining "
            "budget; nothing was run or charged"
        )
    return list(run_workload(session, workload))
