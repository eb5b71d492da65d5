"""The settings a statement runs with: a frozen ``Settings`` value, and the connection's SETs.

``Settings`` has one typed field per row of ``dpsql.session.settings.SETTINGS`` (a test holds
the two to the same names, in the same order). It is resolved from three layers, each value
checked by its row's check: the row's default (most are the policy's), the connection's
``SET`` values (``SetValues``), and the statement's own (its inline ``OPTIONS(...)`` and the
call's keyword arguments). Nothing reads a setting from anywhere else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from fractions import Fraction

from dpsql.errors import ParameterError
from dpsql.plan.plans import QueryOptions
from dpsql.plan.split import Split
from dpsql.plan.targets import Target
from dpsql.policy import Mechanism, Policy, TableSpec
from dpsql.session.settings import BY_NAME, NAMES, SETTINGS, check_setting

__all__ = ["SetValues", "Settings", "field_names", "show_rows", "shown"]

# The settings that ask the declared mechanism of the PLD filter for its noise
# (dpsql.plan.declared): under it, one the analyst gave must ask for exactly that noise.
_NOISE = frozenset({"mechanism", "epsilon", "rho", "sigma", "diagnose_epsilon"})


@dataclass(frozen=True)
class Settings:
    """The effective value of every setting for one statement (read by name as well)."""

    epsilon: Fraction
    delta: Fraction
    max_groups_per_unit: int | None
    max_rows_per_unit_per_group: int | None
    max_rows_per_unit: int | None
    bounds: str
    bounds_share: Fraction
    confidence: float
    mechanism: Mechanism
    rho: Fraction | None
    sigma: Fraction | None
    fresh: bool
    share: bool
    accuracy_columns: bool
    other_group: bool
    other_label: str | None
    diagnose: bool
    diagnose_epsilon: Fraction | None
    split: Split
    moments: str
    halfwidth: Fraction | None
    rank_error: int | None
    min_group: int | None
    sample_rate: Fraction | None
    sample_scale: bool
    # The settings the analyst gave (SET, inline options, keywords), apart from the defaults.
    asked: frozenset[str] = frozenset()

    @classmethod
    def resolve(
        cls, policy: Policy, set_values: Mapping[str, object], given: Mapping[str, object]
    ) -> Settings:
        """The row defaults, then ``set_values`` (checked when SET), then ``given`` (checked
        here; a None value is not given)."""
        values = {s.name: s.default(policy) for s in SETTINGS}
        values.update(set_values)
        asked = set(set_values)
        for name, value in given.items():
            if value is not None:
                values[name] = check_setting(name, value)
                asked.add(name)
        return cls(**values, asked=frozenset(asked))  # type: ignore[arg-type]

    def __getitem__(self, name: str) -> object:
        if name not in BY_NAME:
            raise KeyError(name)
        return getattr(self, name)

    @property
    def target(self) -> Target | None:
        """The query's accuracy target, or None: ``min_group`` alone states a size, no target."""
        if self.halfwidth is None and self.rank_error is None:
            return None
        return Target(self.halfwidth, self.rank_error, self.min_group)

    def query_options(self, spec: TableSpec, policy: Policy) -> QueryOptions:
        """The options one query over ``spec`` runs with; the contribution bounds set here
        replace the table's. Under the policy's declared mechanism, the noise is the declared
        one unless the analyst asked for a mechanism (``asked``)."""
        declared = policy.budget.declared_mechanism
        mechanism = self.mechanism
        if declared is not None and "mechanism" not in self.asked:
            mechanism = declared.mechanism
        if mechanism == "gaussian" and self.delta == 0:
            raise ParameterError("the gaussian mechanism needs delta > 0; SET dpsql.delta")
        if (self.rho is not None or self.sigma is not None) and mechanism != "gaussian":
            raise ParameterError("rho and sigma set the noise of the gaussian mechanism only")
        if self.rho is not None and self.sigma is not None:
            raise ParameterError("give rho or sigma, not both")
        return QueryOptions(
            epsilon=self.epsilon,
            delta=self.delta,
            max_groups_per_unit=self.max_groups_per_unit or spec.max_groups_per_unit,
            max_rows_per_unit_per_group=(
                self.max_rows_per_unit_per_group or spec.max_rows_per_unit_per_group
            ),
            confidence=self.confidence,
            mechanism=mechanism,
            rho=self.rho,
            sigma=self.sigma,
            max_rows_per_unit=self.max_rows_per_unit or spec.max_rows_per_unit,
            declared=declared,
            asked=self.asked & _NOISE if declared else frozenset(),
            diagnose=self.diagnose,
            diagnose_asked="diagnose" in self.asked,
            diagnose_epsilon=self.diagnose_epsilon,
            diagnose_share=policy.budget.diagnose_share,
            split=self.split,
            joint_moments=self.moments == "joint",
        )


def shown(value: object) -> str:
    """A setting's value as SHOW prints it."""
    if value is None:
        return "(policy default)"
    if isinstance(value, Fraction):
        return str(float(value)) if value.denominator != 1 else str(value.numerator)
    return str(value)


class SetValues:
    """The connection's ``SET dpsql.<name>`` values, each checked when it is set."""

    def __init__(self) -> None:
        self._values: dict[str, object] = {}

    def set(self, name: str, value: object) -> None:
        """``SET dpsql.name = value``; ``None`` resets to the default."""
        name = name.lower()
        if value is None:
            if name not in BY_NAME:
                raise ParameterError(f"unknown setting dpsql.{name}")
            self._values.pop(name, None)
            return
        self._values[name] = check_setting(name, value)

    def values(self) -> dict[str, object]:
        """A copy of the values set (a caller may restore them with ``set``)."""
        return dict(self._values)

    def __len__(self) -> int:
        return len(self._values)


def show_rows(settings: Settings, name: str) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
    """SHOW dpsql.<name> (or all): its columns and rows; ``budget`` is the session's."""
    if name == "all":
        return ("name", "setting"), tuple((n, shown(settings[n])) for n in NAMES)
    if name not in BY_NAME:
        raise ParameterError(
            f"unknown setting dpsql.{name}; known: {', '.join(NAMES)}, budget, all"
        )
    value = settings[name]
    text = "(none: NULL)" if name == "other_label" and value is None else shown(value)
    return (name,), ((text,),)


def field_names() -> tuple[str, ...]:
    """The settings ``Settings`` holds, in order (``asked`` is not a setting)."""
    return tuple(f.name for f in fields(Settings) if f.name != "asked")
