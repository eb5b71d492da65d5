"""The data owner's side of the console: the budget over time under each accountant, what-if,
analysts' shares, the release schedule, the ledger's verification, the data check, the audit of
overrides and the report.

Everything is read from the real ledger (``dpsql.interfaces.report``, the same arithmetic as
``dpsql budget``, ``budget what-if`` and ``dpsql report``). The owner's only change is an
analyst's share (``Budget.allocate``: a ledger record that overrides the policy's share, within
the data set's total, kept with who set it and why); the total budget is never raised here. A
share is changed only with the owner's password given again and an explicit confirmation.

The data check (``dpsql check``) reads every line of the data files: it runs as the owner's own
command in a process of its own, so no module that serves analysts imports it.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from fractions import Fraction
from typing import Any

from dpsql.accounting.ledger.chain import GENESIS
from dpsql.errors import ParameterError
from dpsql.interfaces.cli.ledger import open_ledger
from dpsql.interfaces.pgwire.users import check_name
from dpsql.interfaces.report.charts import Curves, history_curves, label, points
from dpsql.interfaces.report.html import render_html
from dpsql.interfaces.report.report import build_report
from dpsql.interfaces.report.whatif import Query, after_n, fit_count, whatif_fits, whatif_label
from dpsql.interfaces.web.config import WebConfig
from dpsql.interfaces.web.logins import Login
from dpsql.policy import MAX_QUERY_EPSILON, check_delta, check_epsilon
from dpsql.policy.numbers import decimal_text
from dpsql.session.session import Session
from dpsql.sql.split import split_statements

__all__ = ["Owner", "curves_json"]

WHATIF_MOST_QUERIES = 1000  # the slider's end (a second or so for every theorem's curve)
WHATIF_POINTS = 24  # prefixes read per what-if curve (the history's: up to 200)
MAX_ROUNDS = 10_000  # refreshes of a pasted file counted at most
CHECK_TIMEOUT = 600.0  # seconds the data check may run
SHARE_CAP = Fraction(10**6)  # a share's epsilon is then checked against the data set's total


def curves_json(curves: Curves) -> dict[str, Any]:
    """Curves as the page draws them: per accountant its label and points; the cap."""
    return {
        "title": curves.title,
        "queries": list(curves.queries),
        "delta": curves.delta,
        "cap": curves.cap,
        "cap_label": curves.cap_label,
        "cap_steps": [list(step) for step in curves.cap_steps],
        "curves": [
            {
                "name": name,
                "label": label(name),
                "epsilons": [e if math.isfinite(e) else None for e in values],
            }
            for name, values in curves.epsilons.items()
        ],
    }


class Owner:
    """The owner's reads and their one change (each on a fresh Session: the same ledger)."""

    def __init__(self, config: WebConfig) -> None:
        self.config = config

    @contextmanager
    def session(self, name: str | None) -> Iterator[Session]:
        session = Session(self.config.policy, name, self.config.memory_limit)
        try:
            yield session
        finally:
            session.close()

    def overview(self, login: Login) -> dict[str, Any]:
        """The budget over time under each accountant, the shares with who set them, the
        release schedule (newest first) and the overrides audit."""
        with self.session(login.name) as session:
            budget = session.pipeline.budget
            data = build_report(self.config.policy, budget)
            curves = history_curves(budget)
        budget_data = data["budget"]
        return {
            "glance": budget_data["glance"],
            "budget": {k: budget_data[k] for k in ("epsilon", "delta", "accountant")},
            "figures": data["accounting"]["figures"],
            "curves": curves_json(curves),
            "analysts": budget_data["analysts"],
            "schedule": list(reversed(data["schedule"]))[:500],
            "audit": data["audit"],
            "ledger": data["ledger"],
        }

    def whatif(self, login: Login, epsilon: str, queries: int) -> dict[str, Any]:
        """N identical queries of epsilon E: each theorem's curve and how many fit the
        remaining budget (``dpsql budget what-if``'s arithmetic); nothing is charged."""
        eps = check_epsilon(epsilon, "epsilon", MAX_QUERY_EPSILON)
        if not 1 <= queries <= WHATIF_MOST_QUERIES:
            raise ParameterError(f"queries must be between 1 and {WHATIF_MOST_QUERIES}")
        query = Query(epsilon=eps)
        with self.session(login.name) as session:
            report = session.pipeline.budget.report()
        delta = float(report.delta_total)
        # Every what-if theorem (zCDP too) read afresh at each prefix: after_n's arithmetic.
        xs = points(queries, WHATIF_POINTS)
        readings = [after_n(query, k, delta) if k else {} for k in xs]
        names = list(readings[-1])
        curves = Curves(
            tuple(xs),
            {n: tuple(r.get(n, 0.0) for r in readings) for n in names},
            delta,
            float(report.epsilon_remaining),
            f"remaining budget ε = {decimal_text(report.epsilon_remaining)}",
            f"What if: {queries} queries, each a {query.describe()}",
        )
        fits = whatif_fits(query, report.epsilon_remaining, report.delta_remaining)
        after = readings[-1]
        theorems = [
            {
                "name": name,
                "label": whatif_label(name),
                "fit": fit_count(test),
                "after": after[name] if math.isfinite(after[name]) else None,
            }
            for name, test in fits.items()
        ]
        return {"curves": curves_json(curves), "theorems": theorems}

    def batch(self, login: Login, text: str, analyst: str) -> dict[str, Any]:
        """A pasted batch file planned as ``dpsql run`` plans it for ``analyst`` (their share
        counts; empty: the data set's budget alone), one workload whose statements a release
        answers are free: its cost now and how many refreshes the deciding filter admits (a
        dry run on a copy of the ledger; nothing is charged)."""
        name = analyst.strip() or None
        with self.session(name) as session:
            workload = session.plan_workload(split_statements(text))
            budget = session.pipeline.budget
            event = workload.event
            rounds, why = budget.rounds([event], name, MAX_ROUNDS) if event else (0, None)
            accountant = budget.report().accountant
        refused = [s for s in workload.steps if s.source == "refused"]
        if refused and why is None:
            why = refused[0].note or "refused"
        return {
            "statements": len(workload.steps),
            "charged": sum(1 for s in workload.steps if s.charged),
            "free": sum(1 for s in workload.steps if s.source == "cache"),
            "refused": len(refused),
            "epsilon": None if event is None else decimal_text(event.epsilon),
            "delta": None if event is None else decimal_text(event.delta),
            "refreshes": None if event is None else rounds,
            "at_least": event is not None and rounds >= MAX_ROUNDS,
            "why_not_more": why,
            "accountant": accountant,
        }

    def allocate(
        self,
        login: Login,
        analyst: str,
        epsilon: str,
        delta: str,
        why: str,
        *,
        top_up: bool = False,
    ) -> dict[str, Any]:
        """Set ``analyst``'s share (a ledger record, within the data set's total), or with
        ``top_up`` raise it by the amounts given; the caller has checked the owner's password
        and the confirmation."""
        check_name(analyst)
        eps = check_epsilon(epsilon.strip(), "epsilon", SHARE_CAP)
        dlt = check_delta(delta.strip() or "0", "delta")
        if not why.strip():
            raise ParameterError("say why the share changes (it is kept in the ledger)")
        policy = self.config.policy
        with self.session(login.name) as session:
            budget = session.pipeline.budget
            total = budget.report()
            if top_up:
                now = budget.report(analyst).share
                if now is None:
                    raise ParameterError(f"{analyst} has no share to top up: set one")
                eps, dlt = now.epsilon_share + eps, now.delta_share + dlt
            if eps > total.epsilon_total or dlt > total.delta_total:
                raise ParameterError("a share must lie within the data set's total budget")
            if policy.budget.needs_delta and dlt == 0:
                raise ParameterError(
                    f"the {policy.budget.accountant} filter needs a delta share > 0"
                )
            record = budget.allocate(analyst, eps, dlt, login.name, why.strip())
        return {
            "record": record.seq,
            "text": f"{analyst} may spend epsilon {decimal_text(eps)}, delta "
            f"{decimal_text(dlt)} (set by {login.name})",
        }

    def verify(self) -> dict[str, Any]:
        """``dpsql ledger verify``: the whole chain against its anchor."""
        policy = self.config.policy
        ledger = open_ledger(policy)
        try:
            records = ledger.records()
            count = ledger.verify()
        finally:
            ledger.close()
        return {
            "ok": True,
            "records": count,
            "head": records[-1].hash if records else GENESIS,
            "text": f"ledger {ledger.identity['ledger_id']} ({policy.dataset.id}): ok; "
            f"{count} records",
        }

    def check(self) -> dict[str, Any]:
        """``dpsql check --json``'s report, run as its own process (see the module
        docstring)."""
        if self.config.policy_file is None:
            raise ParameterError("the data check needs the policy file dpsql web was given")
        done = subprocess.run(
            [sys.executable, "-c", "from dpsql.interfaces.cli.main import main; main()",
             "--policy", str(self.config.policy_file), "check", "--json"],
            capture_output=True, timeout=CHECK_TIMEOUT, check=False,
        )  # fmt: skip
        try:
            document = json.loads(done.stdout)
        except ValueError:
            raise ParameterError("the data check gave no report (see the server's log)") from None
        return {"status": done.returncode, "report": document}

    def report_html(self, login: Login) -> str:
        """``dpsql report --format html``."""
        with self.session(login.name) as session:
            budget = session.pipeline.budget
            return render_html(build_report(self.config.policy, budget), history_curves(budget))
