"""The registry: the rule of every aggregate kind (``dpsql.plan.aggregates.rule``), one list.

The planner asks it what each aggregate of a query measures (``dpsql.plan.estimates``), the
split its variance weights (``dpsql.plan.split``), the accuracy targets what they bind
(``dpsql.plan.targets``) and the release how to estimate and scale each one
(``dpsql.release.post``). None of them names a kind.

Adding an aggregate kind: its SQL function in ``dpsql.sql.aggregates`` (the stages before
planning read it there), its rule in a module of this package (or a new one), and the rule in
``AGGREGATES``. The list is a plain tuple read on every lookup, so a test may extend it.
"""

from __future__ import annotations

from dpsql.errors import InternalError
from dpsql.plan.aggregates.avg import AVG
from dpsql.plan.aggregates.pairs import PAIRS
from dpsql.plan.aggregates.quantiles import QUANTILE
from dpsql.plan.aggregates.rule import AggregateRule
from dpsql.plan.aggregates.spreads import SPREADS
from dpsql.plan.aggregates.totals import COUNTS, SUM

AGGREGATES: tuple[AggregateRule, ...] = (*COUNTS, SUM, AVG, *SPREADS, QUANTILE, *PAIRS)


def rule_of(kind: str) -> AggregateRule:
    """The rule of ``kind``; an unknown kind is a bug (the analyzer reads only kinds of
    ``dpsql.sql.aggregates``, each with its rule here)."""
    index: dict[str, AggregateRule] = {r.kind: r for r in AGGREGATES}
    rule = index.get(kind)
    if rule is None:
        raise InternalError(f"the aggregate kind {kind} has no rule")
    return rule


__all__ = ["AGGREGATES", "rule_of"]
