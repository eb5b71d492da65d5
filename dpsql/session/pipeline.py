"""The one path of every release: lookup -> check -> charge -> run -> noise -> record -> publish.

A query, a bounds estimate and a workload (a file planned as one) are all released here, after
their plans were made from public facts alone (``dpsql.session.planning``):

* **lookup**: a released answer that serves the plan is post-processing: recorded as a
  re-serve, never charged (``serve``);
* **check and charge**: the files the request reads are first checked to be the ones the
  session bound (``FileSet.verify``: a file replaced without a new data version is refused,
  nothing charged, rather than charged and then failed in the engine); ``charge`` is the
  only call of the budget's check-and-charge outside ``dpsql.accounting``. The filter
  decides and the ledger records in one transaction, before the engine runs: a crash after it
  loses budget, never privacy. Before the charge, the event
  is read back as the ledger will keep it (``composite_to_json`` and back), and it must give the
  loss that was planned; after it, the charge must hold that very event: a mismatch is a dpsql
  bug (Tumult Analytics' internal check), and nothing runs;
* **run and noise**: ``run`` does the engine's work and draws the noise under a committed
  charge; a failure there keeps the charge (whether the engine failed can depend on the data)
  and is the one ``EngineError``, its cause recorded for the owner only;
* **record and publish**: the noisy measurements are kept in the cache, then post-processed
  into the released table (``release``).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import Generic, TypeVar

from dpsql.accounting.budget.budget import Budget
from dpsql.accounting.budget.periods import PeriodCharge
from dpsql.accounting.budget.report import Charge
from dpsql.bound.together import split
from dpsql.cache import keys as cache
from dpsql.cache.releases import Hit, ReleaseCache
from dpsql.engine.base import Engine
from dpsql.errors import (
    BudgetExceededError,
    DataChangedError,
    EngineError,
    InternalError,
    LedgerError,
)
from dpsql.mechanisms.event_kinds import composite_from_json, composite_to_json
from dpsql.mechanisms.events import Composite
from dpsql.noise.measure import Noisy, measure, measure_diagnosis
from dpsql.plan.plans import Plan
from dpsql.policy.files import FileSet
from dpsql.policy.numbers import decimal_text
from dpsql.release.diagnosis import diagnose
from dpsql.release.post import Release, publish
from dpsql.release.result import Result
from dpsql.session.periods import Persons

__all__ = ["Pipeline", "QueryRequest", "Request", "digest", "result", "served"]

log = logging.getLogger("dpsql")
T = TypeVar("T")
M = TypeVar("M")  # what a request measures
P = TypeVar("P")  # what it publishes

FAMILY_SERVED = (
    "served again from release {seq}: a workload family's answer to this query, combined by "
    "least squares (unrounded, and not clamped at 0)"
)
DERIVED = (
    "derived from the measurements of release {seq} (post-processing, free): an AVG from its "
    "noisy SUM and COUNT, or a COUNT, SUM or AVG from a variance's noisy Bernstein coordinates"
)
ASSEMBLED = (
    "derived from release(s) {seqs}: measurements of the same bounded rows (post-processing, "
    "free), weighted by their inverse variances where measured more than once; its accuracy is "
    "theirs, whatever this query's epsilon (SET dpsql.fresh = on for a fresh answer)"
)
FAMILY_DERIVED = (
    "derived from release {seq}, a workload family's measurements (post-processing, free): "
    "its cells are sums of the family's least-squares values (unrounded, and not clamped at 0)"
)


def digest(text: str) -> str:
    """A short digest of a query's text for the log (never its values: the text is the
    analyst's own, and the log holds no data)."""
    return hashlib.sha256(text.encode()).hexdigest()[:12]


class Request(Generic[M, P]):
    """One release through the pipeline: its event, what the ledger names it, and its steps.
    ``M`` is what the engine and the noise give (noisy measurements), ``P`` what is published."""

    event: Composite
    query: str
    details: Mapping[str, object]
    # The files it reads, fixed when it was planned; None: every file the engine bound.
    files: FileSet | None = None

    def lookup(self, pipeline: Pipeline) -> P | None:
        """A released answer that serves this request (post-processing, recorded as a
        re-serve), or None."""
        return None

    def measure(self, engine: Engine) -> M:
        """The engine's work and the noise, under the committed charge."""
        raise NotImplementedError

    def record(self, pipeline: Pipeline, charge: Charge, measured: M) -> None:
        """Keep the noisy measurements (post-processing of the release just charged)."""

    def publish(self, pipeline: Pipeline, charge: Charge, measured: M) -> P:
        """The released answer, by post-processing of ``measured``."""
        raise NotImplementedError


class Pipeline:
    """The release path of one session: its budget (the filter and the ledger), its release
    cache, its engine and its analyst."""

    def __init__(
        self, budget: Budget, cache: ReleaseCache, engine: Engine, analyst: str | None
    ) -> None:
        self.budget = budget
        self.cache = cache
        self.engine = engine
        self.analyst = analyst
        # Under a person-within-period unit: each charge for a person (``session.periods``).
        self.persons: Persons | None = None

    def admit(self) -> None:
        """``budget.require_analyst``: an unnamed connection gets no answer, fresh or cached
        (``BudgetExceededError``, nothing charged or recorded)."""
        if self.refused_unnamed():
            raise BudgetExceededError(
                "the policy admits named analysts only (budget.require_analyst): connect with "
                "an analyst name (dpsql.connect(..., analyst=...), --analyst or DPSQL_ANALYST); "
                "nothing was charged"
            )

    def refused_unnamed(self) -> bool:
        """Whether ``admit`` refuses this connection (no epsilon would help)."""
        return self.analyst is None and self.budget.spec.require_analyst

    def release(self, request: Request[M, P]) -> P:
        """admit -> lookup -> check -> charge -> run -> noise -> record -> publish."""
        self.admit()
        served = request.lookup(self)
        if served is not None:
            return served
        # Committed, and counted by every later decision; on disk by the end of ``run``, while
        # the engine works (``run``: nothing is released before).
        charge = self.charge(
            request.event, request.query, request.details, request.files, wait=False
        )
        log.info(
            "charged query %s: epsilon=%s delta=%s analyst=%s", digest(request.query),
            decimal_text(request.event.epsilon), decimal_text(request.event.delta), self.analyst,
        )  # fmt: skip
        return self.under(charge, request)

    def batch(
        self,
        event: Composite | None,
        query: str,
        details: Mapping[str, object],
        steps: Iterable[Callable[[Charge | None], P]],
        files: FileSet | None = None,
    ) -> Iterator[P]:
        """A workload: one charge for every measurement of its steps (``event``; None when
        nothing is charged), committed before any engine work, then each step in order with
        it. Nothing runs when the charge is refused."""
        self.admit()
        charge = None if event is None else self.charge(event, query, details, files)
        for step in steps:
            yield step(charge)

    def under(self, charge: Charge, request: Request[M, P]) -> P:
        """run -> noise -> record -> publish, under ``charge``, committed for this request
        alone or within a workload's one charge."""
        measured = self.run(charge, lambda: request.measure(self.engine))
        request.record(self, charge, measured)
        return request.publish(self, charge, measured)

    def reserve(self, query: str, seq: int, sources: tuple[int, ...] = ()) -> None:
        """The record of a release served again (post-processing: it changes no budget)."""
        payload: dict[str, object] = {"query": query, "release": seq}
        if sources:
            payload["releases"] = list(sources)
        self.budget.store.append("reserve", payload, self.analyst, synced=False)

    def refusal(self, event: Composite, details: Mapping[str, object]) -> str | None:
        """Why ``event`` (with its charge's ``details``) would be refused now, or None: the
        charge's decision, for the person under a person-within-period unit, recording nothing."""
        period = None
        if self.persons is not None:
            event, details = self.persons.person(event, details)
            read = details.get("periods")
            period = PeriodCharge.of(read) if isinstance(read, Mapping) else None
        return self.budget.refusal(event, self.analyst, period)

    # -- the one charge -------------------------------------------------------------------------
    def charge(
        self,
        event: Composite,
        query: str,
        details: Mapping[str, object],
        files: FileSet | None = None,
        *,
        wait: bool = True,
    ) -> Charge:
        """Check and charge ``event`` in one ledger transaction (``BudgetExceededError``:
        nothing recorded); the loss the ledger keeps must be the loss planned (see above).
        ``wait=False``: return once the charge is committed; ``run`` waits until it is on disk.
        First, the files the query reads (``files``; None: every file the engine bound) must
        be those the session bound (``DataChangedError``, nothing charged)."""
        # A file replaced under an open session (a column dropped, a truncated file) would fail
        # the engine after the charge: a refresh would cost budget for no answer. Refused here,
        # from the files' identities alone (never a row), before anything is recorded.
        bound = self.engine.files
        if files is not None and files.blocks != bound.blocks:
            # Planned on another list of blocks than the engine now reads (a block registered
            # in between): refused before the charge, never charged and then run on others.
            raise DataChangedError(
                "blocks were registered since this query was planned; nothing was charged: "
                "run it again to read the blocks registered now"
            )
        (bound if files is None else files).verify()
        if self.persons is not None:
            # The lifetime cap is a person's: the loss for all the periods the query read.
            event, details = self.persons.person(event, details)
        kept = composite_from_json(composite_to_json(event))
        if kept != event or (kept.epsilon, kept.delta) != (event.epsilon, event.delta):
            raise InternalError("the ledger would keep another loss than the planned one")
        charge = self.budget.charge(event, query, self.analyst, dict(details), wait=wait)
        charged = (charge.epsilon, charge.delta)
        if charge.event != event or charged != (event.epsilon, event.delta):
            raise InternalError("the charged loss is not the planned one")
        return charge

    # -- under a committed charge ---------------------------------------------------------------
    def run(self, charge: Charge, work: Callable[[], T]) -> T:
        """``work`` (the engine's and the noise's) under ``charge``: its failure keeps the charge
        and is the one ``EngineError``; Ctrl-C is recorded, then left to the caller. Whatever
        happens, nothing leaves before the charge is on disk and anchored: the engine works
        while the disk syncs (group commit, ``ledger_group``), and a charge that cannot be made
        durable is a ``LedgerError`` in place of any answer or error."""
        try:
            return work()
        except (EngineError, MemoryError) as exc:
            cause = getattr(exc, "cause", None) or type(exc).__name__
            raise self.failed(charge, cause) from None
        except KeyboardInterrupt:  # the shell's Ctrl-C: recorded, then left to the shell
            self.failed(charge, "KeyboardInterrupt")
            raise
        finally:
            self.budget.on_disk(charge)

    def failed(self, charge: Charge, cause: str) -> EngineError:
        """The one error of a failure after the charge, which stays (whether the engine failed
        can depend on the data). The cause goes to a ``failure`` record, for the owner only;
        the record changes no budget."""
        log.warning("the query of charge %d failed after it: %s", charge.seq, cause)
        try:
            self.budget.store.append(
                "failure", {"charge": charge.seq, "cause": cause}, self.analyst
            )
        except (LedgerError, MemoryError) as error:
            log.error("the failure of charge %d is not recorded: %s", charge.seq, error)
        return EngineError()


class QueryRequest(Request[Noisy, Result]):
    """A SELECT's release: served from the cache when a release answers it (unless ``fresh``),
    else its bounded query and noise, kept in the cache, then post-processed."""

    def __init__(
        self,
        plan: Plan,
        keys: cache.Keys,
        details: Mapping[str, object],
        *,
        fresh: bool = False,
        shared: bool = True,
        bare: tuple[Plan, Callable[[], cache.Keys]] | None = None,
        files: FileSet | None = None,
    ) -> None:
        self.plan, self.keys, self.details, self.files = plan, keys, details, files
        self.event, self.query = plan.event, plan.query
        self.fresh, self.shared = fresh, shared
        # The plan without the diagnosis the policy's default gave it, and how to key it: what
        # a release answers for free when none answers the diagnosed plan (post-processing);
        # keyed only then, so a repeat or a fresh answer pays nothing for it.
        self.bare = bare

    def lookup(self, pipeline: Pipeline) -> Result | None:
        if self.fresh:
            return None
        hit = pipeline.cache.lookup(self.plan, self.keys, self.shared)
        if hit is not None:
            return served(pipeline, self.plan, hit)
        if self.bare is None:
            return None
        plan, keys = self.bare
        hit = pipeline.cache.lookup(plan, keys(), self.shared)
        return None if hit is None else served(pipeline, plan, hit)

    def measure(self, engine: Engine) -> Noisy:
        plan, diagnosis = self.plan, self.plan.diagnosis
        if diagnosis is None:
            return measure(plan, engine.run(plan.engine_sql)[1])
        # The diagnosis is charged with the query, in its one event, and released with it.
        if engine.shares_rows:
            rows, patterns = split(engine.run(diagnosis.together_sql)[1], diagnosis.width)
        else:
            rows = engine.run(plan.engine_sql)[1]
            patterns = engine.run(diagnosis.engine_sql)[1]
        noisy = measure(plan, rows)
        return replace(noisy, diagnosis=measure_diagnosis(diagnosis, patterns))

    def record(self, pipeline: Pipeline, charge: Charge, measured: Noisy) -> None:
        pipeline.cache.record(self.plan, self.keys, measured, charge.seq, self.plan.query)

    def publish(self, pipeline: Pipeline, charge: Charge, measured: Noisy) -> Result:
        try:
            released = publish(self.plan, measured)
        except (EngineError, MemoryError):
            raise pipeline.failed(charge, "post-processing") from None
        log.info("released query %s: %d row(s)", digest(self.plan.query), len(released.rows))
        return result(self.plan, released, charge, None, measured.diagnosis)


def served(pipeline: Pipeline, plan: Plan, hit: Hit) -> Result:
    """A released answer served again: post-processing, recorded and never charged."""
    if hit.combined is not None:
        # Values combined from released measurements (a workload family's least squares, a
        # centred sum from a SUM and a COUNT, a count or sum from a Bernstein vector): the
        # half-widths of their combination.
        plan = replace(plan, measurements=tuple(
            m if c is None else replace(m, combined=c)
            for m, c in zip(plan.measurements, hit.combined, strict=True)))  # fmt: skip
    pipeline.reserve(plan.query, hit.release_seq, hit.sources)
    log.info("served query %s from release %d", digest(plan.query), hit.release_seq)
    released = publish(plan, hit.noisy)
    out = result(plan, released, None, hit.release_seq, hit.noisy.diagnosis)
    note = {"member": FAMILY_SERVED, "family": FAMILY_DERIVED}.get(hit.source)
    if hit.source == "releases":
        note = ASSEMBLED.format(seqs=", ".join(map(str, hit.sources)))
    elif note is None and hit.derived:
        note = DERIVED
    return out if note is None else replace(out, note=note.format(seq=hit.release_seq))


def result(
    plan: Plan,
    released: Release,
    charge: Charge | None,
    cached: int | None,
    cells: tuple[int, ...] | None = None,
) -> Result:
    """A published release as a statement's ``Result``, with the diagnosis's fractions when the
    plan carried one."""
    diagnosed = None
    if plan.diagnosis is not None and cells is not None:
        diagnosed = diagnose(plan.diagnosis, cells, plan.options.confidence)
    return Result(
        columns=released.columns,
        types=released.types,
        rows=released.rows,
        accuracy=released.accuracy,
        noise=released.noise,
        confidence=released.confidence,
        plan=plan,
        charge=charge,
        cached_from=cached,
        diagnosis=diagnosed,
    )
