"""Contribution bounds estimated from the data: ``ESTIMATE BOUNDS FOR table [GROUP BY keys]``.

Each bound is a high quantile of one value per unit, so that most units keep all their rows:

* ``max_rows_per_unit`` (R), without ``GROUP BY``: the unit's number of rows;
* ``max_groups_per_unit`` (L0), with ``GROUP BY``: the unit's number of distinct key
  combinations;
* ``max_rows_per_unit_per_group`` (C), with ``GROUP BY``: the unit's largest row count in one
  group.

The quantile is ``QUANTILE`` (0.95: 95% of the units are kept whole, the others lose rows but
still count), read on a fixed ladder of integers ``1, 2, 3, 4, 6, 8, 12, 16, ...`` up to the
policy's largest bound (rounded up to a rung: a bound never cuts the values it was read from).
The number of units is released first with a discrete Laplace (``COUNT_SHARE`` of epsilon; one
unit moves it by 1), then each bound is the first rung, walking up, with at most
``(1 - QUANTILE)`` of the released count of units beyond it, by the sparse vector technique over
the walks together (``dpsql.noise.sparse_vector``; Durfee, NeurIPS 2023): a unit moves each
walk's counts by at most 1, all in one direction. The walks' threshold is a post-processing of
the released count, so the whole is pure epsilon-DP by sequential composition (one ``PureDP``
event of the statement's epsilon).

By the trade-off (``FOR EPSILON``, the default), each bound aims at the least error of a query at
that epsilon (``dpsql.plan.auto``), by the same walks as ``dpsql.bounds = auto``. Keys whose
public domains hold at most ``auto.ALL_GROUPS`` combinations G in all take ``auto``'s route
(``cells_query``): L0 = G, every combination, a public fact that costs nothing, and C by its
walk over the (unit, group) cells of the relation a ``GROUP BY`` of those keys bounds (rows
outside the domains dropped), each group's cells weighed by the inverse of its noisy size
(``dpsql.plan.auto.GroupWeights``) with the whole epsilon. Other keys walk L0, then C on the
units' largest groups, at half the epsilon each.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from sqlglot import exp

from dpsql.analyze.analyze import analyze
from dpsql.analyze.scope import Describe
from dpsql.analyze.units import unit_source
from dpsql.bound.estimates import contributions_query
from dpsql.bound.selection import selection_query
from dpsql.bound.shape import public_size
from dpsql.bound.specs import Bounding
from dpsql.errors import ParseError, QueryError, SchemaError, UnsupportedQueryError
from dpsql.noise.laplace import discrete_laplace
from dpsql.noise.sparse_vector import Walks, above_threshold, beyond_each, overrun, tail
from dpsql.plan import auto
from dpsql.plan.auto import ladder
from dpsql.policy import Policy
from dpsql.policy.numbers import MAX_CONTRIBUTION_BOUND
from dpsql.release import auto_bounds
from dpsql.sql.parse import DIALECT

QUANTILE = Fraction(95, 100)
COUNT_SHARE = Fraction(1, 5)  # of the statement's epsilon, to the count of units
RECORD_KIND = "contribution_bounds"  # ledger records (post-processing, never charged)
ROWS = "max_rows_per_unit"
GROUPS = "max_groups_per_unit"
ROWS_PER_GROUP = "max_rows_per_unit_per_group"


LADDER = ladder(MAX_CONTRIBUTION_BOUND)  # 1, 2, 3, 4, 6, 8, 12, ..., 786432, 1000000


def rung_index(value: int) -> int:
    """The index of the smallest rung at or above ``value`` (the top for anything beyond)."""
    return auto.rung_index(value, LADDER)


@dataclass(frozen=True)
class Rule:
    """How an estimate sets its bounds: at the ``quantile`` of the units' values, or (None)
    by the bias-noise trade-off for queries at epsilon ``target`` (``dpsql.plan.auto``)."""

    quantile: Fraction | None = None
    target: Fraction | None = None
    # The trade-off over keys with a public domain of this many combinations (``cells_query``):
    # L0 is all of them, C the weighted cell walk; None: the walks of L0, then C.
    groups: int | None = None

    def units_beyond(self) -> Fraction:
        """k = √2/target: the units the trade-off leaves beyond a row cap."""
        assert self.target is not None
        return auto.noise_per_unit([self.target])

    def text(self) -> str:
        if self.quantile is not None:
            return f"quantile {self.quantile.numerator}/{self.quantile.denominator}"
        assert self.target is not None
        return f"trade-off for epsilon {self.target.numerator}/{self.target.denominator}"


def bounds_of(keys: Sequence[str]) -> tuple[str, ...]:
    """The bounds a statement estimates, in the order of its rows."""
    return (GROUPS, ROWS_PER_GROUP) if keys else (ROWS,)


def check_table(policy: Policy, catalog: Any, table: str, keys: Sequence[str]) -> tuple[str, str]:
    """(source, unit column) of ``table``'s rows (``dpsql.analyze.units.unit_source``: through
    its unit path if it has one), after checking the keys; refused on the schema and the
    policy alone, before anything is charged."""
    spec = policy.tables.get(table)
    if spec is None or table not in catalog:
        raise SchemaError(f"unknown table {table}")
    if not spec.is_private:
        raise UnsupportedQueryError(f"table {table} is public: it has no contribution bounds")
    for key in keys:
        if key not in catalog[table]:
            raise SchemaError(f"unknown column {key} in table {table}")
        if key == spec.privacy_unit:
            raise UnsupportedQueryError("ESTIMATE BOUNDS ... GROUP BY cannot group by the unit")
    if len(set(keys)) != len(keys):
        raise ParseError("ESTIMATE BOUNDS ... GROUP BY names a column twice")
    return unit_source(policy, catalog, table, list(keys))


def bounds_query(policy: Policy, catalog: Any, table: str, keys: Sequence[str]) -> str:
    """The engine's SQL (``dpsql.bound.estimates.contributions_query``), after the checks on
    public facts: per bound and per-unit value, how many units have it (one value per unit and
    bound, whatever its rows)."""
    source, unit = check_table(policy, catalog, table, keys)
    return contributions_query(unit, source, keys).sql(dialect=DIALECT)


def cells_query(
    policy: Policy, catalog: Any, describe: Describe | None, table: str, keys: Sequence[str]
) -> tuple[int, str] | None:
    """(G, the engine's SQL) of the grouped trade-off over a public domain (module docstring):
    ``dpsql.bound.selection``'s histograms of ``SELECT COUNT(*) FROM table GROUP BY keys``,
    read as that query's relation (through the table's unit path, rows outside the domains
    dropped); None when the keys' domains are not all public or hold more than
    ``auto.ALL_GROUPS`` combinations, or the query is not one dpsql answers. Public facts
    only: the policy, the schema and the keys."""
    check_table(policy, catalog, table, keys)
    select = (
        exp.select(exp.Count(this=exp.Star()))
        .from_(exp.Table(this=exp.to_identifier(table, quoted=True)))
        .group_by(*(exp.column(exp.to_identifier(k, quoted=True)) for k in keys))
    )
    try:
        analysis = analyze(select, policy, catalog, describe)
    except QueryError:
        return None  # e.g. a key the engine cannot group by: the walks of L0 and C
    groups = public_size(analysis.keys)
    if groups is None or groups > auto.ALL_GROUPS:
        return None
    return groups, selection_query(analysis, Bounding(None, 1, (), ()), True)


def _above(rows: Sequence[tuple[Any, ...]], count: int) -> list[list[int]]:
    """Per bound, the units beyond each rung of ``LADDER``."""
    hist = [[0] * len(LADDER) for _ in range(count)]
    for bound, value, units in rows:
        hist[int(bound)][rung_index(int(value))] += int(units)
    return [beyond_each(h) for h in hist]


def release(
    epsilon: Fraction,
    keys: Sequence[str],
    rows: Sequence[tuple[Any, ...]],
    rule: Rule | None = None,
) -> tuple[int, ...]:
    """The noisy bounds from the engine's histograms (charged before this runs), by ``rule``
    (None: the 95% quantile)."""
    rule = rule or Rule(quantile=QUANTILE)
    if rule.groups is not None:
        return _cells(epsilon, rows, rule)
    count = len(bounds_of(keys))
    above = _above(rows, count)
    if rule.quantile is None:
        # The bias-noise trade-off (dpsql.plan.auto): each walk aims at k units beyond its
        # bound; L0's walk first, since C's k is L0·k. Sequential walks of epsilon/count each.
        k, each = rule.units_beyond(), epsilon / count
        stops, l0 = [], 1
        for i in range(count):
            target = k * l0 if i == 1 else k
            stop = auto_bounds.tradeoff_walk(each, 1, above[i], target)
            stops.append(stop)
            l0 = LADDER[stop]
        return tuple(LADDER[i] for i in stops)
    # Every unit has one value for each bound: the first histogram counts the units.
    n = sum(int(u) for b, _, u in rows if int(b) == 0)
    n += int(discrete_laplace(1 / (epsilon * COUNT_SHARE), 1)[0])
    threshold = (1 - rule.quantile) * max(n, 0)
    walks = Walks(epsilon * (1 - COUNT_SHARE), count)
    stops = above_threshold(walks, above, [threshold] * count)
    return tuple(LADDER[i] for i in stops)


def cell_choice(epsilon: Fraction, groups: int) -> auto.Choice:
    """C's weighted walk over the cells of ``groups`` public key combinations, at ``epsilon``
    (the group sizes' share of it included: ``dpsql.plan.auto.GroupWeights``)."""
    return auto.Choice(auto.ROWS_PER_GROUP, epsilon, "cells", groups)


def _cells(epsilon: Fraction, rows: Sequence[tuple[Any, ...]], rule: Rule) -> tuple[int, int]:
    """(L0, C) over a public domain of ``rule.groups`` combinations: L0 all of them (public),
    C ``auto``'s weighted cell walk aimed at L0·k cells per group (``auto_bounds.cell_walk``;
    charged before this runs)."""
    assert rule.groups is not None
    cells = auto_bounds.group_cells(auto_bounds.read_histograms(rows), rule.groups)
    target = rule.units_beyond() * rule.groups
    return rule.groups, auto_bounds.cell_walk(cell_choice(epsilon, rule.groups), cells, target)


def scales(
    epsilon: Fraction, keys: Sequence[str], rule: Rule | None = None
) -> tuple[Fraction, ...]:
    """Every discrete Laplace scale the release draws at ``epsilon``: the count's and the
    walks' (checked before the charge)."""
    count = len(bounds_of(keys))
    if rule is not None and rule.groups is not None:
        choice = cell_choice(epsilon, rule.groups)
        assert choice.weights is not None
        walk = auto_bounds.tradeoff_scales(choice.walk_epsilon, auto.WEIGHT_TOTAL)
        return (choice.weights.scale, *walk)
    if rule is not None and rule.quantile is None:
        return tuple(auto_bounds.tradeoff_scales(epsilon / count))
    walks = Walks(epsilon * (1 - COUNT_SHARE), count)
    return (1 / (epsilon * COUNT_SHARE), walks.threshold_scale, walks.query_scale)


def describe(epsilon: Fraction, keys: Sequence[str], rule: Rule | None = None) -> str:
    """The mechanism's parameters, for the charge's label."""
    count = len(bounds_of(keys))
    if rule is not None and rule.groups is not None:
        choice = cell_choice(epsilon, rule.groups)
        assert choice.weights is not None
        walk = Walks(choice.walk_epsilon, 1, 1, auto.TRADEOFF_THRESHOLD)
        return (
            f"max_groups_per_unit = {rule.groups}, every public key combination (free); "
            f"max_rows_per_unit_per_group by the groups' noisy sizes (discrete Laplace scale "
            f"{float(choice.weights.scale):.4g}) and a {walk.describe()} over the cells they "
            "weigh (per unit of weight), one rung higher where it overshoots"
        )
    if rule is not None and rule.quantile is None:
        walks = Walks(epsilon / count, 1, 1, auto.TRADEOFF_THRESHOLD)
        return f"{count} sequential {walks.describe()}, each one rung higher where it overshoots"
    walks = Walks(epsilon * (1 - COUNT_SHARE), count)
    return f"{walks.describe()} (count noise scale {float(1 / (epsilon * COUNT_SHARE)):.4g})"


def cuts(
    keys: Sequence[str],
    values: Sequence[int],
    rule: Rule,
    epsilon: Fraction | None = None,
    confidence: float = 0.95,
) -> str:
    """What each bound is expected to cut, for the estimate's note, and with the statement's
    ``epsilon`` how many units it cuts at most at ``confidence`` (``uncertainty``): all
    post-processing of the released values and public numbers."""
    names = bounds_of(keys)
    at_most = uncertainty(epsilon, keys, rule, confidence) if epsilon is not None else None
    if rule.quantile is not None:
        share = f"{float(1 - rule.quantile):.4g}"
        worst = (
            ""
            if at_most is None
            else (
                f"; at {confidence:.4g} confidence at most {share} of the units and {at_most} more"
            )
        )
        return "; ".join(f"{n} = {v}: about {share} of the units lie beyond it (they lose rows)"
                         f"{worst}" for n, v in zip(names, values, strict=True))  # fmt: skip
    k = rule.units_beyond()
    if rule.groups is not None:
        return _cells_cuts(values, rule, at_most, confidence)
    parts = []
    for i, (name, value) in enumerate(zip(names, values, strict=True)):
        aim = k * values[0] if i == 1 else k
        what = "units whose largest group has more rows" if i == 1 else (
            "units in more groups" if keys else "units with more rows")  # fmt: skip
        worst = (
            ""
            if at_most is None
            else (f"; at {confidence:.4g} confidence at most {int(aim) + at_most}")
        )
        parts.append(
            f"{name} = {value}: aimed at about {float(aim):.3g} {what} (they lose rows){worst}"
        )
    target = f"{float(rule.target or 0):.4g}"
    return "; ".join(parts) + f"; the least error of a Laplace total at epsilon {target}"


def uncertainty(epsilon: Fraction, keys: Sequence[str], rule: Rule, confidence: float) -> int:
    """How many units beyond its aim a bound may cut, at ``confidence``, for every bound of the
    statement at once: each walk stops at a rung with at most its threshold + t units beyond it
    (``sparse_vector.overrun``; an overshooting walk's chosen rung is higher still, so cuts no
    more). Under a quantile the threshold is (1 − q) times the noisy count of units, whose noise
    adds (1 − q)·|Z| (a third of 1 − confidence each: the count's two tails, the walks)."""
    count = len(bounds_of(keys))
    beta = 1 - confidence
    if rule.groups is not None:
        # C's walk alone (L0 is no estimate), on its weighted counts per unit of weight.
        walk_epsilon = cell_choice(epsilon, rule.groups).walk_epsilon
        walks = Walks(walk_epsilon, 1, 1, auto.TRADEOFF_THRESHOLD)
        return overrun(walks, len(auto.LADDER), beta)
    if rule.quantile is None:
        walks = Walks(epsilon / count, 1, 1, auto.TRADEOFF_THRESHOLD)
        return overrun(walks, len(LADDER), beta / count)
    walks = Walks(epsilon * (1 - COUNT_SHARE), count)
    count_noise = tail(1 / (epsilon * COUNT_SHARE), beta / 6)  # |Z| at beta/3 over both tails
    return overrun(walks, len(LADDER), beta / 3 * 2) + math.ceil(
        float(1 - rule.quantile) * count_noise
    )


def _cells_cuts(values: Sequence[int], rule: Rule, at_most: int | None, confidence: float) -> str:
    """The note of the grouped trade-off over a public domain (``cells_query``)."""
    l0, c = values
    aim = rule.units_beyond() * l0
    worst = (
        ""
        if at_most is None
        else f"; at {confidence:.4g} confidence at most {int(aim) + at_most} on that average"
    )
    return (
        f"max_groups_per_unit = {l0}: every public key combination (a public fact, not "
        f"estimated); max_rows_per_unit_per_group = {c}: aimed at about {float(aim):.3g} (unit, "
        "group) cells with more rows in a group, averaged over the groups with each weighed by "
        f"the inverse of its noisy size (they lose rows){worst}; the least error of a Laplace "
        f"total at epsilon {float(rule.target or 0):.4g}"
    )
