"""The policy's budget section: the data set's total budget, the filter that guards it, the
per-query defaults, the analysts' shares, and the PLD filter's declared mechanism (a part of
``dpsql.policy.spec``, which re-exports its names)."""

from __future__ import annotations

from fractions import Fraction
from typing import Literal

from pydantic import Field, model_validator

from dpsql.errors import ParameterError
from dpsql.policy.frozen import Frozen as _Frozen
from dpsql.policy.numbers import (
    MAX_QUERY_EPSILON,
    MAX_TOTAL_EPSILON,
    Exact,
    check_delta,
    check_epsilon,
)

__all__ = [
    "FILTER_VERSION",
    "BudgetSpec",
    "DeclaredMechanism",
    "FilterVersion",
    "Mechanism",
    "ShareSpec",
]

Mechanism = Literal["laplace", "gaussian"]
# Versions of the fixed parameters the rdp and zcdp filters take where the policy states none
# (the grid of orders, the split of delta across it, the selection reserve): 1 the first, 2
# the current (docs/accounting.md). A ledger pins the version it was created with.
FilterVersion = Literal[1, 2]
FILTER_VERSION: FilterVersion = 2
# The largest sigma of a declared discrete Gaussian: its PLD sums the pmf point by point over
# 22 sigma (dpsql.mechanisms.pld_lattice.MAX_SIGMA2).
MAX_DECLARED_SIGMA = 10**5
MAX_DECLARED_SENSITIVITY = 10**6


class DeclaredMechanism(_Frozen):
    """The one mechanism of the PLD filter (``accountant = "pld"``), in grid units: every
    measurement is a discrete Laplace of ``scale`` (or a discrete Gaussian of ``sigma``) on one
    coordinate that one unit shifts by at most ``sensitivity``. One mechanism repeated is the
    totally ordered family of the natural PLD filter (Regehr et al. 2026)."""

    kind: Literal["discrete_laplace", "discrete_gaussian"]
    sensitivity: int = Field(ge=1, le=MAX_DECLARED_SENSITIVITY)
    scale: Exact | None = None
    sigma: Exact | None = None

    @model_validator(mode="after")
    def _valid(self) -> DeclaredMechanism:
        laplace = self.kind == "discrete_laplace"
        noise, other = ("scale", "sigma") if laplace else ("sigma", "scale")
        value = self.scale if laplace else self.sigma
        if value is None or getattr(self, other) is not None:
            raise ValueError(f"a declared {self.kind} takes {noise} (and not {other})")
        if laplace and not 0 < self.sensitivity <= MAX_QUERY_EPSILON * value:
            raise ValueError("declared_mechanism: epsilon = sensitivity/scale must be in (0, 20]")
        # rho = sensitivity^2/(2 sigma^2) <= 10, the largest per-query rho a setting may ask.
        if not laplace and not 20 * value**2 >= self.sensitivity**2:
            raise ValueError("declared_mechanism: sigma must be at least sensitivity/sqrt(20)")
        if not laplace and value > MAX_DECLARED_SIGMA:
            raise ValueError(f"declared_mechanism: sigma must be at most {MAX_DECLARED_SIGMA}")
        return self

    @property
    def mechanism(self) -> Mechanism:
        """The session's name of its noise."""
        return "laplace" if self.kind == "discrete_laplace" else "gaussian"


class ShareSpec(_Frozen):
    """An analyst's share of the data set's budget, under the same filter."""

    epsilon: Exact
    delta: Exact = Fraction(0)


class BudgetSpec(_Frozen):
    """The total budget of the data set, the filter that guards it, per-query defaults."""

    epsilon: Exact | None = None
    delta: Exact = Fraction(0)
    # A zCDP budget instead of epsilon (with accountant = "zcdp"): the filter caps the summed
    # rho, and the epsilon it certifies at delta is the report's total.
    rho: Exact | None = None
    query_epsilon: Exact = Fraction(1, 10)
    query_delta: Exact = Fraction(0)
    mechanism: Mechanism = "laplace"
    # The filter that decides admission, valid under fully adaptive composition: the name of a
    # registered accountant that is a filter (basic, advanced, rdp, zcdp, pld), checked where
    # the budget is built (dpsql.accounting.registry), a later stage than the policy.
    accountant: str = Field(default="basic", pattern=r"^[a-z][a-z0-9_]*$", max_length=64)
    advanced_delta_prime: Exact | None = None
    rdp_order: float | None = Field(default=None, gt=1, le=1024)
    # Under the rdp and zcdp filters: the part of delta reserved for the additive deltas of
    # partition selection (approximate RDP / zCDP); the rest goes to the conversion.
    selection_delta: Exact | None = None
    # Under the rdp and zcdp filters: the version of their defaults; None is the current one
    # when a ledger is created, and the ledger's own when it is opened (store.pinned_spec).
    filter_version: FilterVersion | None = None
    # Under accountant = "pld": the one mechanism every measurement must be (the filter's
    # totally ordered family, fixed before the first query).
    declared_mechanism: DeclaredMechanism | None = None
    analysts: dict[str, ShareSpec] = Field(default_factory=dict)
    # Only a named analyst may be answered (charged or served from the cache), with or without
    # shares. Names are authenticated over the wire only; in-process they are self-declared.
    require_analyst: bool = False
    # A query on bounds dpsql did not choose also releases what they cut, at this share of the
    # query's epsilon more (dpsql.plan.diagnosis); off: only when an analyst asks for it.
    diagnose: bool = True
    diagnose_share: Exact = Fraction(1, 10)

    @model_validator(mode="after")
    def _valid(self) -> BudgetSpec:
        if (self.epsilon is None) == (self.rho is None):
            raise ValueError("give budget.epsilon, or budget.rho with accountant = 'zcdp'")
        if self.rho is not None and self.accountant != "zcdp":
            raise ValueError("budget.rho needs accountant = 'zcdp'")
        try:
            if self.epsilon is not None:
                check_epsilon(self.epsilon, "budget.epsilon", MAX_TOTAL_EPSILON)
            if self.rho is not None:
                check_epsilon(self.rho, "budget.rho", MAX_TOTAL_EPSILON)
            check_epsilon(self.query_epsilon, "budget.query_epsilon", MAX_QUERY_EPSILON)
            check_delta(self.delta, "budget.delta")
            check_delta(self.query_delta, "budget.query_delta")
            check_epsilon(self.diagnose_share, "budget.diagnose_share", Fraction(1))
        except ParameterError as exc:
            raise ValueError(str(exc)) from None
        if self.mechanism == "gaussian" and (self.delta == 0 or self.query_delta == 0):
            raise ValueError("the gaussian mechanism needs delta > 0 and query_delta > 0")
        if self.accountant == "advanced":
            prime = self.advanced_delta_prime
            if prime is None or not 0 < prime < self.delta:
                raise ValueError("the advanced filter needs 0 < advanced_delta_prime < delta")
        elif self.advanced_delta_prime is not None:
            raise ValueError("advanced_delta_prime is only used by accountant = 'advanced'")
        if self.rdp_order is not None and self.accountant != "rdp":
            raise ValueError("rdp_order is only used by accountant = 'rdp'")
        if self.selection_delta is not None and (
            self.accountant not in ("rdp", "zcdp") or not 0 <= self.selection_delta < self.delta
        ):
            raise ValueError("selection_delta needs accountant rdp or zcdp and 0 <= it < delta")
        if self.filter_version is not None and self.accountant not in ("rdp", "zcdp"):
            raise ValueError("filter_version is only used by accountant 'rdp' or 'zcdp'")
        if self.accountant in ("rdp", "zcdp") and self.delta == 0:
            raise ValueError(f"the {self.accountant} filter needs delta > 0")
        self._declared()
        for name, share in self.analysts.items():
            within = self.epsilon is None or share.epsilon <= self.epsilon
            if not (share.epsilon > 0 and within and 0 <= share.delta <= self.delta):
                raise ValueError(f"analysts.{name}: a share must lie within the total budget")
            if self.needs_delta and share.delta == 0:
                raise ValueError(f"analysts.{name}: the {self.accountant} filter needs delta > 0")
        return self

    @property
    def needs_delta(self) -> bool:
        """Whether the filter admits nothing at delta 0 (RDP and zCDP conversions, and the
        discrete Gaussian's PLD, have delta(epsilon) > 0 at every epsilon)."""
        gaussian = self.declared_mechanism is not None and self.declared_mechanism.kind != (
            "discrete_laplace"
        )
        return self.accountant in ("rdp", "zcdp") or gaussian

    def _declared(self) -> None:
        if (self.accountant == "pld") != (self.declared_mechanism is not None):
            raise ValueError("accountant = 'pld' goes with budget.declared_mechanism, and only it")
        declared = self.declared_mechanism
        gaussian = declared is not None and declared.kind == "discrete_gaussian"
        # query_delta: the delta at which a declared Gaussian query's charged epsilon is stated.
        if gaussian and (self.delta == 0 or self.query_delta == 0):
            raise ValueError("a declared discrete_gaussian needs delta > 0 and query_delta > 0")
