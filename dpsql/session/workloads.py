"""Running a file planned as one workload: its one charge, then its answers in order.

``run_workload`` commits the workload's one charge before any engine work, then answers each
statement: from its own plan, or with its family. ``run_script`` plans and runs a text of
statements (the shell's multi-statement input, ``Cursor.executescript``), refusing it whole
when it does not fit (unless ``partial``).

``answer_members`` runs a family's one bounded query (its charge already committed within the
workload's), noises and combines its measurements (``dpsql.release.families``) and publishes each
member from its own plan. A failure after the charge is the session's one ``EngineError``,
recorded like any other: the charge stands.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import replace

from dpsql.accounting.budget.report import Charge
from dpsql.cache import releases as cache
from dpsql.cache.families import RECORD_KIND, family_key, family_payload, from_payload
from dpsql.errors import BudgetExceededError, EngineError
from dpsql.plan.workload.family import Family
from dpsql.policy.numbers import exact
from dpsql.release.families import combine, measure_family
from dpsql.release.post import accuracy_columns, publish
from dpsql.release.result import Result, _with_accuracy
from dpsql.session.session import Session
from dpsql.session.workload_plan import Step, Workload, _one_line, _totals, plan_workload
from dpsql.sql.parse import EstimateBounds, parse_statement
from dpsql.sql.split import split_statements

__all__ = ["answer_members", "run_script", "run_workload"]

NOTE = (
    "answered with statement(s) {members} from measurements on rows bounded once at the "
    "grouping {grouping}, combined by least squares: unrounded, and not clamped at 0, so that "
    "children sum to their parents"
)


def answer_members(session: Session, family: Family, charge: Charge) -> dict[int, Result]:
    """Per member (its statement index), its result."""
    try:
        _, rows = session.engine.run(family.fine.engine_sql)
        values, noised = measure_family(family, rows)
        answered = combine(family, values, noised)
        released = {i: (plan, publish(plan, noisy)) for i, (plan, noisy) in answered.items()}
    except (EngineError, MemoryError) as exc:
        cause = getattr(exc, "cause", None) or type(exc).__name__
        raise session._failed(charge, cause) from None
    except KeyboardInterrupt:
        session._failed(charge, "KeyboardInterrupt")
        raise
    # The measurements released, kept for a later plan of the same family: post-processing.
    key = family_key(family, session.policy.dataset.id, session.policy_version(),
                     session.policy.dataset.data_version)  # fmt: skip
    payload = family_payload(family, key, charge.seq, values, noised)
    if payload is not None:
        record = session.filter.store.append(RECORD_KIND, payload, session.analyst,
                                             synced=False)  # fmt: skip
        # Each member's answer under its own query's key: asked again alone, the same answer,
        # free (post-processing of the family's release).
        version = session.policy_version()
        for member in family.members:
            plan, noisy = answered[member.index]
            k = cache.keys(member.plan, session.policy, version)
            session.cache.record_member(plan, k, noisy, charge.seq, record.seq, member.plan.query)
    members = ", ".join(str(m.index + 1) for m in family.members)
    grouping = f"({family.grouping})" if family.union else f"of statement {family.fine_index + 1}"
    note = NOTE.format(members=members, grouping=grouping)
    out = {}
    for i, (plan, release) in released.items():
        result = session._result(plan, release, charge, None)
        out[i] = replace(result, note=note)
    return out


def served_members(session: Session, family: Family, seq: int) -> dict[int, Result]:
    """Per member, its answer from the family's earlier release (ledger record ``seq``):
    post-processing of released measurements, recorded and never charged."""
    record = next(r for r in session.filter.store.records() if r.seq == seq)
    values, noised = from_payload(dict(record.payload))
    answered = combine(family, values, noised)
    out = {}
    for i, (plan, noisy) in answered.items():
        release = publish(plan, noisy)
        session.filter.store.append("reserve", {"query": plan.query, "release": seq},
                                    session.analyst, synced=False)  # fmt: skip
        result = session._result(plan, release, None, seq)
        out[i] = replace(result, note=f"served again from the family release {seq}")
    return out


def _with_settings(session: Session, result: Result) -> Result:
    """``result`` as the settings in force show it (accuracy columns)."""
    if result.plan is not None and session.settings()["accuracy_columns"]:
        return _with_accuracy(result, accuracy_columns(result.plan))
    return result


def run_workload(session: Session, workload: Workload) -> Iterator[tuple[Step, Result | None]]:
    """The workload's results in order (None for a step refused as not fitting). The one
    charge is committed before any engine work: another session that spent the budget since
    the plan makes it raise ``BudgetExceededError`` with nothing charged or run."""
    charge = None
    if workload.event is not None:
        texts = [s.piece.text for s in workload.steps if s.charged]
        # The statements are in the details; the label names them by a digest (a file may be
        # 16 MiB: it is not written twice).
        digest = hashlib.sha256("\0".join(texts).encode()).hexdigest()[:12]
        query = f"WORKLOAD of {len(texts)} statement(s) {digest}: " + _one_line(texts[0])
        details = {
            "statements": texts,
            "bounded_sql": ";\n".join(_bounded(workload)),
            "engine": session.engine.name,
            "policy_version": session.policy_version(),
            "data_version": session.policy.dataset.data_version,
        }
        charge = session.filter.charge(workload.event, query, session.analyst, details)
    answered: dict[int, Result] = {}
    for i, step in enumerate(workload.steps):
        if step.source == "refused":
            yield step, None
            continue
        found = workload.joint.family_of(i)
        seq = workload.released.get(found[0].fine_index) if found is not None else None
        if found is not None and seq is not None:
            if i not in answered:
                answered.update(served_members(session, found[0], seq))
            yield step, _with_settings(session, answered.pop(i))
            continue
        if step.charged:
            assert charge is not None
            if step.kind == "estimate":
                statement = parse_statement(step.piece.text)
                assert isinstance(statement, EstimateBounds)
                yield step, session._estimate_bounds(statement, {}, charge=charge)
                continue
            found = workload.joint.family_of(i)
            if found is not None:
                if i not in answered:
                    answered.update(answer_members(session, found[0], charge))
                yield step, _with_settings(session, answered.pop(i))
                continue
            assert step.plan is not None
            keys = cache.keys(step.plan, session.policy, session.policy_version())
            result = session._run_charged(step.plan, keys, charge)
            yield step, _with_settings(session, result)
            continue
        yield step, session.execute(step.piece.text)


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
        eps, delta = _totals(workload.steps, "charge")
        more_eps, more_delta = _totals(workload.steps, "refused")
        raise BudgetExceededError(
            f"the statements need epsilon {exact(eps + more_eps)}, delta "
            f"{exact(delta + more_delta)} and {len(refused)} of them do not fit the remaining "
            "budget; nothing was run or charged"
        )
    return list(run_workload(session, workload))
