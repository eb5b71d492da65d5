"""A batch file planned as one workload: shared measurements and one budget.

Independent planning measures each statement on its own rows at its own epsilon. A workload
plan looks for statements that could share what they measure, all decided from public
quantities only (the statements, the policy, the key domains' sizes), never from the data:

* A **family** is a set of statements over the same rows before bounding (one table, the same
  WHERE, the same settings apart from epsilon: the same L0, C and R), with public key domains
  only, whose bounded rows are each exactly the rows the statement's own bounded query keeps
  (``keeps_own_rows``): a member is never answered at another statement's bounds, nor at
  another grouping's. L0 and C bound a unit per group of one grouping, and R's window ranks a
  unit's rows by a keyed hash of the columns its query reads, so this holds for statements of
  one grouping (the same key order where a keyed hash ranks), and for the total of rows when
  every unit keeps R rows and each of them (R <= C, L0 >= R). A key of the family's grouping
  that a member lacks (only the total's) needs its other group (``SET dpsql.other_group =
  on``), so that no row outside its domain is dropped that the total would count.
* The family's rows are **bounded once** (one bounded query at its grouping for the union of
  the members' measurements). The total is the sum of the cells, and a unit's kept rows (at
  most R) may all fall in one cell, so the total's measurement has L1 = L2 = R times the
  per-row bound: Hay, Rastogi, Miklau, Suciu, "Boosting the accuracy of differentially private
  histograms through consistency" (VLDB 2010), bounded at the leaves.
* Each measurement kind (a count, a sum on its grid, ...) is taken at the family's grouping
  and, for the total, at the total level if the plan chooses; the family's epsilon (the sum of
  its members' independent epsilons) is split across the measurements taken to minimise the
  sum over members of (weighted variance under the joint plan) / (under the member's
  independent plan), with no member's variance above 1.21 times its independent one (a
  half-width at most 10% wider). The weighted variance is ``dpsql.plan.split``'s objective
  (public weights).
* Answers combine every level taken by weighted least squares
  (``dpsql.plan.workload.least_squares``), in exact rationals: the cells sum to the total
  exactly. The released values are not rounded nor clamped at 0 (either would break the sums),
  and the output says so.

A family is taken only when it predicts a lower objective than independent planning; members
whose share would not gain are planned on their own. Everything else (quantiles, private keys,
samples, diagnoses, accuracy targets, the Gaussian mechanism, a declared PLD mechanism, joins,
partition cells) is planned independently, and still charged with the workload, before any
engine work.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from fractions import Fraction

from sqlglot import exp

from dpsql.bound.specs import Bounding
from dpsql.mechanisms.events import Event
from dpsql.mechanisms.laplace_events import DiscreteLaplace
from dpsql.plan.plans import Measurement, Plan
from dpsql.sql.parse import DIALECT

# The measurement kinds whose coarser cell is the sum of its fine cells: a count of distinct
# units (or values) is not (a unit in two fine cells of one coarser cell counts once there),
# nor is a quantile.
ADDITIVE = ("rows", "count", "sum", "centred", "centred_squares")
# What releases of the same bounded rows may answer, each measurement from its own releases
# (``dpsql.cache.derive.assemble``): a Bernstein vector's coordinates too (their noises stay
# independent of each other), though no family measures one.
ASSEMBLED = (*ADDITIVE, "bernstein")
# The statements of one group of shared rows the search considers (in file order).
MAX_CANDIDATES = 16
# The largest number of measured cells of one kind in a family: the least squares runs in
# exact rationals, and its covariance is dense.
MAX_FAMILY_CELLS = 2000
# A member may lose at most this much in variance to the family: (1.1)², a half-width at most
# 10% wider than under its own plan.
MAX_LOSS = Fraction(121, 100)
# A family is taken only if it gains at least this share of its objective.
MIN_GAIN = 0.01
# A measurement at a coarser level with less than this share of the family's epsilon is not
# taken (its level is answered from the finer levels).
MIN_SHARE = 0.02


@dataclass(frozen=True)
class Taken:
    """One measurement a family takes: kind ``spec`` (an index of the fine plan's
    measurements) at the level keeping the fine keys ``level`` (sorted positions)."""

    spec: int
    level: tuple[int, ...]
    measurement: Measurement  # its sensitivity and, once planned, its scale
    dimensions: int = 1  # the cells of its level one unit may move: L0 (at most its cells)

    @property
    def epsilon(self) -> Fraction:
        return self.measurement.epsilon


@dataclass(frozen=True)
class Member:
    """A statement answered from its family's measurements."""

    index: int  # its position among the workload's statements
    plan: Plan  # its independent plan (its estimates, outputs and post-processing)
    positions: tuple[int, ...]  # each of its keys, as a position among the fine keys
    specs: tuple[int, ...]  # each of its measurements, as an index of the fine plan's

    @property
    def level(self) -> tuple[int, ...]:
        return tuple(sorted(self.positions))


@dataclass(frozen=True)
class Family:
    """Statements answered from measurements on rows bounded once at the fine grouping."""

    fine: Plan  # the bounded query at the fine grouping, with every member's measurements
    fine_index: int  # the member whose grouping is the fine one (see ``union``)
    members: tuple[Member, ...]
    taken: tuple[Taken, ...]
    sizes: tuple[int, ...]  # the number of values of each fine key (its domain, other group)
    ratios: tuple[float, ...]  # per member: joint / independent weighted variance

    def cells(self, level: Sequence[int]) -> int:
        return math.prod(self.sizes[p] for p in level)

    @property
    def event(self) -> list[Event]:
        return [_event(t) for t in self.taken]


@dataclass(frozen=True)
class Joint:
    """A workload's plan: its families and, per statement, the predicted variance ratio."""

    families: tuple[Family, ...]
    ratios: tuple[float | None, ...]  # per statement: joint / independent (None: on its own)

    def family_of(self, index: int) -> tuple[Family, Member] | None:
        for family in self.families:
            for member in family.members:
                if member.index == index:
                    return family, member
        return None


def _event(t: Taken) -> Event:
    m = t.measurement
    assert m.scale is not None
    # Discrete Laplace on a vector of L1 sensitivity m.sensitivity (Ghosh, Roughgarden,
    # Sundararajan 2009); one unit moves at most L0 cells of any level.
    return DiscreteLaplace(m.scale, Fraction(m.sensitivity), m.label, dimensions=t.dimensions)


# -- who may share ------------------------------------------------------------------------------
def eligible(plan: Plan, kinds: tuple[str, ...] = ADDITIVE) -> bool:
    """Whether a statement may join a family (module docstring), from its plan alone; with
    ``kinds`` ``ASSEMBLED``, whether releases of its rows may answer it."""
    a, o = plan.analysis, plan.options
    return (
        a.base
        and a.cell is None
        and a.cell_predicate is None
        and plan.sample is None
        and plan.diagnosis is None
        and plan.selection is None
        and o.mechanism == "laplace"
        and o.declared is None
        and o.budgets is None
        and o.sample is None
        and all(k.domain is not None for k in a.keys)
        and bool(plan.measurements)
        and all(m.spec.kind in kinds for m in plan.measurements)
    )


def rows_and_settings(plan: Plan) -> tuple[object, ...]:
    """What two statements must share to be bounded together: the rows before bounding and
    every setting but epsilon and the confidence, the contribution bounds L0, C and R included.
    The family's rows are bounded once, at the fine statement's settings: a member that asked
    for other bounds (C = 50 beside a C = 1) would be answered at bounds it did not ask for."""
    o = plan.options
    return (*_rows_and_other_settings(plan), o.max_groups_per_unit, o.max_rows_per_unit_per_group)


def _rows_and_other_settings(plan: Plan) -> tuple[object, ...]:
    """The rows before bounding and every setting but epsilon, L0 and C."""
    a, o = plan.analysis, plan.options
    where = a.where.sql(dialect=DIALECT) if a.where is not None else None
    options = replace(
        o, epsilon=Fraction(1), max_groups_per_unit=None, max_rows_per_unit_per_group=None,
        asked=frozenset(), confidence=0.5,
    )  # fmt: skip
    return (a.table, a.source, a.unit, where, options)


def key_text(key: object) -> str:
    expr = getattr(key, "expr", None)
    assert isinstance(expr, exp.Expression)
    return str(expr.sql(dialect=DIALECT))


def key_descriptor(key: object) -> list[object]:
    """A group key as a family compares it, in JSON: its expression, its public domain (each
    value's repr: 1 and '1' differ), whether it has an other group, and that group's text."""
    domain = getattr(key, "domain", None)
    return [key_text(key), [repr(v) for v in domain or ()], bool(getattr(key, "other", False)),
            getattr(key, "other_text", None)]  # fmt: skip


def member_positions(fine: Plan, member: Plan) -> tuple[int, ...] | None:
    return positions_among(
        [key_descriptor(k) for k in fine.analysis.keys],
        [key_descriptor(k) for k in member.analysis.keys],
    )


def positions_among(
    fine: Sequence[Sequence[object]], member: Sequence[Sequence[object]]
) -> tuple[int, ...] | None:
    """The member's keys (``key_descriptor``) as positions among the fine keys; None when a key
    is not there (or differs in domain or other group), or when a fine key the member lacks has
    no other group: its rows outside the domain would be dropped at the fine grouping."""
    fine_keys = {str(k[0]): i for i, k in enumerate(fine)}
    out = []
    for key in member:
        i = fine_keys.get(str(key[0]))
        if i is None or list(fine[i]) != list(key):
            return None
        out.append(i)
    if len(set(out)) != len(out):
        return None
    for i, f in enumerate(fine):
        if i not in out and not f[2]:
            return None
    return tuple(out)


def keeps_own_rows(fine: Plan, member: Plan, positions: Sequence[int]) -> bool:
    """Whether ``fine``'s bounded rows, summed up to the member's level, are exactly the
    member's own bounded totals, decided from the two plans alone: a member is never answered
    at bounds other than its own (``rows_and_settings`` keeps their settings equal; this keeps
    the groupings the bounds apply to equal too). See ``same_rows``."""
    if fine.bounding is None:
        return False
    return same_rows(rows_text(fine.bounding), len(fine.analysis.keys), member, positions)


def rows_text(b: Bounding) -> dict[str, list[object]]:
    """What of a bounding decides which rows each unit keeps, in JSON (a ledger record keeps
    it): its steps, and the values R's window hashes."""
    sample = None if b.sample is None else str(b.sample)
    values: list[object] = [[v.expr.sql(dialect=DIALECT), repr(v.grid), v.role] for v in b.values]
    return {"steps": [b.max_groups, b.max_rows, b.max_total_rows, b.direct, sample],
            "values": values}  # fmt: skip


def same_rows(
    fine: dict[str, list[object]] | None, n: int, member: Plan, positions: Sequence[int]
) -> bool:
    """Whether a bounding of ``n`` keys (``rows_text``) keeps the rows ``member``'s own keeps,
    its keys at ``positions`` among the bounding's. Either:

    * the member is at the same grouping and bounds its rows with the same steps: the same L0
      ranking by the keyed hash of (unit, keys) in the same key order, the same C cap of each
      value on its own (``per_unit.capped``), and the same R window, whose keyed hash reads the
      keys and the values (``caps.row_cap``), so only with the same values in the same order;
    * or the member is the total of rows (``COUNT(*)`` with no key), whose own query skips R's
      window and adds min(n, C) rows of each unit with C <= R, and the bounding keeps R rows of
      each unit and every one of them (``direct``, R <= C): min(n, R) both.

    L0 and C bound a unit per group of one grouping, and R's window hashes the columns one
    query reads, so rows bounded at a finer grouping are another statement's rows: a coarser
    statement is never answered from them."""
    if fine is None or member.bounding is None:
        return False
    own = rows_text(member.bounding)
    groups, _, window, direct, _ = fine["steps"]
    if sorted(positions) == list(range(n)):
        if fine["steps"] != own["steps"]:
            return False
        ordered = tuple(positions) == tuple(range(n))
        if (groups is not None or window is not None) and not ordered:
            return False
        return window is None or fine["values"] == own["values"]
    own_groups, own_rows, own_window, _, _ = own["steps"]
    return (
        not positions
        and direct is True
        and window is not None
        and own_window is None
        and own_groups is None
        and own_rows == window
        and all(m.spec.kind == "rows" for m in member.measurements)
    )


def spec_key(plan: Plan, m: Measurement) -> tuple[object, ...]:
    """What one measurement measures, comparable across plans over the same rows."""
    assert plan.bounding is not None
    value = None
    if m.spec.value is not None:
        v = plan.bounding.values[m.spec.value]
        value = (v.expr.sql(dialect=DIALECT), repr(v.grid), v.role)
    return (m.spec.kind, value, m.spec.p, m.unit)


def spec_text(plan: Plan, m: Measurement) -> str:
    """``spec_key`` as a text a ledger record keeps."""
    kind, value, p, unit = spec_key(plan, m)
    return json.dumps([kind, value, None if p is None else str(p), str(unit)])


def base_digest(plan: Plan) -> str:
    """What a statement must share with a family's fine plan to be answered from its release:
    the rows before bounding, every setting but epsilon and the contribution bounds (L0, C,
    R). Its text is the one ledgers already keep: the bounds apart from the other settings."""
    o = plan.options
    bounds = (o.max_groups_per_unit, o.max_rows_per_unit_per_group, o.max_rows_per_unit)
    rows = _rows_and_other_settings(plan)
    return hashlib.sha256(repr((rows, bounds)).encode()).hexdigest()


__all__ = [
    "ASSEMBLED",
    "MAX_FAMILY_CELLS",
    "MAX_LOSS",
    "Family",
    "Joint",
    "Member",
    "Taken",
    "eligible",
]
