"""The plans a session keeps: what a plan is a pure function of (its key), and what is kept.

A statement seen again under the same key reuses its ``Planned``, everything before the check;
never a charge or noise, which each fresh answer gets on its own (``docs/cache.md``).
``plan_key`` keys a statement on exactly the inputs of its plan, with each value typed by
``_keyable``. The ``PlanKeys`` methods are part of ``dpsql.session.session.Session``, which keeps
the plans (up to ``MAX_KEPT_PLANS``) and re-exports ``Planned``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

from dpsql.cache import releases as cache
from dpsql.plan.plans import Plan
from dpsql.policy import Policy

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


class PlanKeys:
    """The plan-key part of ``Session``: the policy's digest, and the key of a statement."""

    policy: Policy
    analyst: str | None
    _settings: dict[str, object]
    _estimated: dict[tuple[str, str], tuple[Fraction, Fraction]]
    _version: tuple[Policy, str] | None

    if TYPE_CHECKING:

        def _effective_policy(self) -> Policy: ...

    def policy_version(self) -> str:
        """The policy's content digest, computed once per policy object (a Policy is frozen)."""
        if self._version is None or self._version[0] is not self.policy:
            self._version = (self.policy, self.policy.version)
        return self._version[1]

    def plan_key(
        self,
        sql: str,
        params: Sequence[object] | None,
        options: Mapping[str, object],
        current: bool = True,
    ) -> tuple[object, ...] | None:
        """What a plan is a pure function of: the statement's text, its parameters and options,
        every SET value, the analyst, the policy's content digest, the data version the owner
        declares and the bounds estimated so far (the engine's key domains and cell keys are
        functions of the query and the schema, which the data version covers). None when a
        value cannot be keyed exactly: the statement is then planned afresh. ``current=False``
        keys on the bounds estimates read so far, without reading the ledger again (a caller
        planning many statements at once reads it once)."""
        # Only a list or tuple is read here: a generator would be used up before binding.
        bound = _keyable(params) if params is None or isinstance(params, list | tuple) else None
        given = _keyable(options)
        settings = _keyable(self._settings)
        if not isinstance(sql, str) or bound is None or given is None or settings is None:
            return None
        if current:
            self._effective_policy()  # reads bounds estimated since the last statement
        estimated = tuple(sorted((k, str(lo), str(hi)) for k, (lo, hi) in self._estimated.items()))
        data = self.policy.dataset.data_version
        return (sql, bound, given, settings, self.analyst, self.policy_version(), data, estimated)
