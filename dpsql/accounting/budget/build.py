"""The budget: the history of charges, the filter that admits queries, the odometer report.

The deciding filter is fixed when the budget is created (the policy's ``budget.accountant``),
never switched by the history: a filter chosen after seeing the history is not a filter.
``basic`` is sequential composition over queries in exact rationals (Dwork, McSherry, Nissim,
Smith 2006; valid adaptively, Rogers, Roth, Ullman, Vadhan 2016): each query is charged its
certified (epsilon, delta). The other filters decide on the queries' events as each reads them
(its registration's ``steps``, ``dpsql.accounting.registry``; their own theorems, see their
modules). Optional analyst shares cap each analyst's own history under the
same filter; the data set's cap holds for everyone's together.

Decisions are incremental: the budget folds each charge into the deciding filter's running
tallies (``base.Tally``), one per view of parallel composition and per analyst, and decides from
those in O(views); ``Budget(replay=True)`` decides by replaying the whole history through the
filters' stateless ``admits`` instead, the reference the incremental path is tested against.

This module builds a data set's budget from its policy and ledger (``budget_for``, with every
registered accountant's odometer for the report, ``dpsql.accounting.registry``). The parts live
in one module per concept: ``budget.py`` (``Budget``, the deciding filter), ``state.py`` (the
history folded into running sums and tallies), ``report.py`` (``Charge`` and the reports) and
``dpsql.accounting.ledger.store`` (the in-memory ledger, and the policy's ledger: pinned caps,
create, open).
"""

from __future__ import annotations

from dpsql.accounting.budget.budget import Budget
from dpsql.accounting.ledger.ledger import BUDGET_RECORD
from dpsql.accounting.ledger.store import (
    MemoryLedger,
    Store,
    budget_caps,
    pinned_spec,
)
from dpsql.accounting.registry import BASIC, entries
from dpsql.accounting.theorems.base import Accountant
from dpsql.policy import BudgetSpec, PeriodsSpec

__all__ = ["budget_for", "odometers"]


def odometers() -> list[Accountant]:
    """Every registered accountant's reading of a history, for the report, in its order (basic
    composition is the budget's own: its running sums)."""
    return [r.odometer() for r in entries() if r.name != BASIC]


def budget_for(
    dataset: str,
    spec: BudgetSpec,
    store: Store | None = None,
    periods: PeriodsSpec | None = None,
) -> Budget:
    """The budget a ledger pinned (``pinned_spec``), which the policy's must equal; over a
    durable ledger, or in memory (whose budget is the policy's: it lives as long as the
    process, and is created here). A ``PolicyError`` if the policy names no registered filter
    (``registry.deciding``, through ``budget_caps``)."""
    store = store if store is not None else MemoryLedger()
    if not store.durable and not store.records():
        store.append(BUDGET_RECORD, budget_caps(spec))
    return Budget(dataset, pinned_spec(spec, store), store, odometers(), periods=periods)
