"""The analyst's side of the console: a preview before spending, an answer, downloads, the
analyst's own share and history.

Each statement runs on a ``Session`` under the login's name, its SET values those of the login
(the session's own reset first): the same pipeline as every interface, so the charge is recorded
against that analyst and their share before anything is released, and a repeat is served free
from the cache. A session is kept for the analyst's next statement (``SessionPool``: at most
one idle per analyst and ``MAX_IDLE`` in all, the least recently used closed first), as a
``dpsql serve`` connection keeps one, so that its plans and engine are not made again for each
statement; one that ended in anything but a refusal (an engine failure, a changed file, a ledger
error, an interrupt) is closed instead. At most ``max_running`` statements run at once; one more
is refused as busy (HTTP 503) before anything is planned or charged.

The history an analyst sees is their own ledger records only (charges and answers served
again), and an answer served again never says whose release served it.
"""

from __future__ import annotations

import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from dpsql.accounting.budget.report import spent_text
from dpsql.errors import BudgetExceededError, DpsqlError, ParameterError, QueryError
from dpsql.interfaces.report.report import iso_time
from dpsql.interfaces.web.answers import SERVED_FREE, answer_json
from dpsql.interfaces.web.config import WebConfig
from dpsql.interfaces.web.logins import Login
from dpsql.mechanisms.event_kinds import composite_from_json
from dpsql.plan.explain import explain
from dpsql.policy.numbers import decimal_text
from dpsql.session.plans import with_periods
from dpsql.session.session import Session
from dpsql.sql.parse import SetOption, parse_statement
from dpsql.sql.split import split_statements

__all__ = ["Analyst", "Busy", "SessionPool", "deadline"]

MAX_HISTORY = 200  # the newest records an analyst's history shows
MAX_KEPT_CELLS = 1_000_000  # an answer larger than this is shown, not kept for download


def fits_kept(result: Any) -> bool:
    return len(result.rows) * max(1, len(result.columns)) <= MAX_KEPT_CELLS


@contextmanager
def deadline(interrupt: Callable[[], None], seconds: float) -> Iterator[None]:
    """Past ``seconds``, call ``interrupt`` every 10 ms until the block ends (DuckDB forgets an
    interrupt that comes between two of its queries): the statement then fails as an engine
    failure does, after its charge, which stands (``dpsql serve``'s statement timeout)."""
    done = threading.Event()

    def watch() -> None:
        if done.wait(seconds):
            return
        while not done.wait(0.01):
            interrupt()

    watcher = threading.Thread(target=watch, name="dpsql-web-deadline", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


class Busy(Exception):  # noqa: N818 - HTTP 503, nothing planned or charged
    """Every statement slot is taken."""


MAX_IDLE = 16  # idle sessions kept for analysts' next statements, in all
# Refusals after which a session is as it was: kept. Anything else closes it.
KEEPS = (QueryError, BudgetExceededError)


class SessionPool:
    """Idle sessions by analyst, least recently used first (thread-safe)."""

    def __init__(self, config: WebConfig) -> None:
        self.config = config
        self._idle: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, name: str) -> Session:
        with self._lock:
            session = self._idle.pop(name, None)
        if session is None:
            session = Session(self.config.policy, name, self.config.memory_limit)
        return session

    def give_back(self, session: Session) -> None:
        name = session.analyst or ""
        with self._lock:
            spare = self._idle.pop(name, None)
            self._idle[name] = session
            while len(self._idle) > MAX_IDLE:
                _, oldest = self._idle.popitem(last=False)
                oldest.close()
        if spare is not None:
            spare.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = list(self._idle.values()), OrderedDict()
        for session in idle:
            session.close()


class Analyst:
    """The analyst's actions, each on a session of the pool (thread-safe)."""

    def __init__(self, config: WebConfig) -> None:
        self.config = config
        self._slots = threading.BoundedSemaphore(config.max_running)
        self.pool = SessionPool(config)

    @contextmanager
    def session(self, login: Login) -> Iterator[Session]:
        if not self._slots.acquire(blocking=False):
            raise Busy("the console is running as many statements as it may; try again")
        try:
            session = self.pool.take(login.name)
            keep = False
            try:
                for name in session.set_values.values():
                    session.set_option(name, None)  # another login's SET values: reset
                for name, value in login.settings.items():
                    session.set_option(name, value)
                with deadline(session.engine.interrupt, self.config.statement_timeout):
                    yield session
                keep = True
            except KEEPS:
                keep = True
                raise
            finally:
                if keep:
                    self.pool.give_back(session)
                else:
                    session.close()
        finally:
            self._slots.release()

    def _one(self, sql: str) -> str:
        if len(sql.encode("utf-8", "surrogatepass")) > self.config.max_statement_bytes:
            raise ParameterError(
                f"the statement is longer than {self.config.max_statement_bytes} bytes"
            )
        pieces = split_statements(sql)
        if len(pieces) != 1:
            raise ParameterError(
                "give one statement at a time (a file of several runs as one workload with "
                "dpsql run, or is costed on the owner's what-if)"
            )
        return pieces[0].text

    def preview(self, login: Login, sql: str) -> dict[str, Any]:
        """What the query would cost, its expected ±, whether it fits the analyst's share and
        whether it would be served free: nothing runs, nothing is charged or recorded."""
        text = self._one(sql)
        with self.session(login) as session:
            plan = session.plan(text)
            lines = with_periods(explain(plan, False), plan, session.pipeline.persons)
            served = session.served_from(plan) is not None
            refusal = (
                None if served else session.pipeline.refusal(plan.event, session.details(plan))
            )
        return {
            "lines": lines,
            "epsilon": decimal_text(plan.event.epsilon),
            "delta": decimal_text(plan.event.delta),
            "served_free": served,
            "fits": served or refusal is None,
            "refusal": refusal,
            "verdict": (
                "it would be served free from an earlier release: nothing would be charged"
                if served
                else "it fits your share and the budget now"
                if refusal is None
                else f"it would be refused now: {refusal}"
            ),
        }

    def run(self, login: Login, sql: str) -> dict[str, Any]:
        """Run one statement: a query is charged before it is answered (or served free); a SET
        changes the login's settings for its later statements."""
        text = self._one(sql)
        statement = parse_statement(text)
        with self.session(login) as session:
            result = session.execute(text)
            if isinstance(statement, SetOption):
                with login.lock:
                    login.settings = session.set_values.values()
        answer_id = None
        if result.columns and result.plan is not None and fits_kept(result):
            answer_id = secrets.token_urlsafe(12)
            with login.lock:
                login.results[answer_id] = result
                while len(login.results) > self.config.max_kept_results:
                    login.results.popitem(last=False)
        return answer_json(result, answer_id)

    def kept(self, login: Login, answer_id: str) -> Any:
        with login.lock:
            result = login.results.get(answer_id)
        if result is None:
            raise ParameterError("no such answer of this login (answers are kept a while only)")
        return result

    def mine(self, login: Login) -> dict[str, Any]:
        """The analyst's share and spend (the deciding filter's reading) and their own history:
        their ledger records only, newest first."""
        with self.session(login) as session:
            report = session.budget()
            every = session.pipeline.budget.store.records()
        records = [r for r in every if r.analyst == login.name]
        set_by = "the policy"
        for record in every:  # the latest allocate record of this analyst overrides the policy
            if record.kind == "allocate" and record.payload.get("analyst") == login.name:
                set_by = f"the data owner {record.payload.get('by')} (ledger record {record.seq})"
        history = []
        for record in reversed(records):
            if record.kind not in ("charge", "reserve"):
                continue
            entry: dict[str, Any] = {
                "time": iso_time(record.time),
                "query": str(record.payload.get("query", "")),
            }
            if record.kind == "charge":
                event = composite_from_json(dict(record.payload["event"]))
                entry["cost"] = (
                    f"charged epsilon {decimal_text(event.epsilon)}, delta "
                    f"{decimal_text(event.delta)}"
                )
            else:
                entry["cost"] = SERVED_FREE
            history.append(entry)
            if len(history) >= MAX_HISTORY:
                break
        share = report.share
        return {
            "name": login.name,
            "role": login.role,
            "budget": str(report),
            "share": None
            if share is None
            else {
                "epsilon": float(share.epsilon_share),
                "spent": float(share.epsilon_spent),
                "left": float(share.epsilon_remaining),
                "text": str(share),
                "set_by": set_by,
            },
            "dataset": {
                "epsilon": float(report.epsilon_total),
                "spent": float(report.epsilon_spent),
                "left": float(report.epsilon_remaining),
                "text": f"epsilon {spent_text(report.epsilon_spent)} spent of the data set's "
                f"{decimal_text(report.epsilon_total)}",
            },
            "history": history,
        }


def error_json(exc: BaseException) -> dict[str, str]:
    """A refusal as the page shows it: the error's class and its message (which names the
    construct, never a data value), with what to do where the message says it."""
    name = type(exc).__name__ if isinstance(exc, DpsqlError) else "Error"
    return {"error": name, "message": str(exc)}
