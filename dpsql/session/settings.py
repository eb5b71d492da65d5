"""The per-query settings: their names, checks and defaults, and the SET and SHOW statements.

``SET dpsql.<name> = value``, a statement's ``WITH DIFFERENTIAL_PRIVACY OPTIONS(...)`` and a
keyword option of ``Session.execute`` set the names in ``SETTINGS``; ``check_setting``
validates and normalises each value before it is kept. The ``Settings`` methods (``SET``,
the effective settings over the policy's defaults, a query's ``QueryOptions``, ``SHOW``) are
part of ``dpsql.session.session.Session``, which re-exports the public names.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import TYPE_CHECKING

from dpsql.accounting.budget.report import BudgetReport
from dpsql.analyze.sample import check_rate
from dpsql.errors import ParameterError
from dpsql.plan.plans import QueryOptions
from dpsql.plan.split import SPLITS
from dpsql.plan.targets import Target
from dpsql.policy import (
    MAX_CONTRIBUTION_BOUND,
    MAX_QUERY_EPSILON,
    Policy,
    TableSpec,
    check_delta,
    check_epsilon,
    to_fraction,
)
from dpsql.policy.numbers import MAX_QUERY_RHO
from dpsql.release.result import Result

SETTINGS = (
    "epsilon",
    "delta",
    "max_groups_per_unit",
    "max_rows_per_unit_per_group",
    "max_rows_per_unit",
    "confidence",
    "mechanism",
    "rho",
    "sigma",
    "fresh",
    "share",
    "accuracy_columns",
    "other_group",
    "other_label",
    "diagnose",
    "diagnose_epsilon",
    "split",
    "halfwidth",
    "rank_error",
    "min_group",
    "sample_rate",
    "sample_scale",
)
# sigma is a noise multiplier (noise standard deviation per unit of L2 sensitivity).
MAX_NOISE_MULTIPLIER = Fraction(10**6)
DEFAULT_CONFIDENCE = 0.95
# The longest label of the other group (dpsql.analyze.domains); a label is public, like the query.
MAX_OTHER_LABEL = 256
# The epsilon of a diagnosis of the bounds (``SET dpsql.diagnose = on``): fixed, not a share of
# the query's, so that what a diagnosis costs never depends on anything but this setting.
DEFAULT_DIAGNOSE_EPSILON = Fraction(1, 10)
# An accuracy target's half-width is a number in the values' units, like a bound (2^52 at most).
MAX_HALFWIDTH = Fraction(2**52)
# A stated group size is a count of units, so at most a BIGINT.
MAX_MIN_GROUP = 2**63 - 1


def _positive_int(value: object, name: str) -> int:
    message = f"{name} must be an integer from 1 to {MAX_CONTRIBUTION_BOUND}"
    # to_fraction bounds the text before any arithmetic ("1e999999999" is refused unexpanded).
    number = to_fraction(value, name)
    if number.denominator != 1 or not 1 <= number <= MAX_CONTRIBUTION_BOUND:
        raise ParameterError(message)
    return int(number)


_TRUE, _FALSE = ("true", "on", "1", "yes"), ("false", "off", "0", "no")


def _boolean(value: object, name: str) -> bool:
    if isinstance(value, bool):
        return value
    # Only a word or 0/1 is read: str() of an arbitrary object (or of a 5,000-digit integer,
    # which raises ValueError) is never taken.
    if isinstance(value, int) and value in (0, 1):
        return value == 1
    text = value.strip().lower() if isinstance(value, str) and len(value) <= 16 else None
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ParameterError(f"{name} must be true or false")


def _confidence(value: object) -> float:
    message = "confidence must be a number in [0.5, 0.9999]"
    try:
        number = to_fraction(value, "confidence")
    except ParameterError:
        raise ParameterError(message) from None
    if not Fraction(1, 2) <= number <= Fraction(9999, 10000):
        raise ParameterError(message)
    return float(number)


def _mechanism(value: object) -> str:
    mechanism = value.strip().lower() if isinstance(value, str) and len(value) <= 16 else None
    if mechanism not in ("laplace", "gaussian"):
        raise ParameterError("mechanism must be 'laplace' or 'gaussian'")
    return mechanism


def _count(value: object, name: str, top: int) -> int:
    message = f"{name} must be an integer from 1 to {top}"
    number = to_fraction(value, name)
    if number.denominator != 1 or not 1 <= number <= top:
        raise ParameterError(message)
    return int(number)


def _halfwidth(value: object) -> Fraction:
    message = f"halfwidth must be a number above 0 and at most 2^52 ({MAX_HALFWIDTH})"
    number = to_fraction(value, "halfwidth")
    if not 0 < number <= MAX_HALFWIDTH:
        raise ParameterError(message)
    return number


def _split(value: object) -> str:
    split = value.strip().lower() if isinstance(value, str) and len(value) <= 16 else None
    if split not in SPLITS:
        raise ParameterError("split must be 'optimal' or 'even'")
    return split


def _label(value: object) -> str:
    """The other group's label: text, cast to each key's type when the query is planned (a
    number arrives as its text from SET and OPTIONS; from Python, give a string)."""
    if not isinstance(value, str) or len(value) > MAX_OTHER_LABEL:
        raise ParameterError(
            f"other_label must be a string of at most {MAX_OTHER_LABEL} characters"
        )
    return value


def _setting_name(name: object) -> str:
    """A setting's name as a message may show it: the user's text, cut short."""
    text = name if isinstance(name, str) else type(name).__name__
    return text if len(text) <= 64 else text[:61] + "..."


def check_setting(name: str, value: object) -> object:
    """Validate one per-query setting; returns its normalised value."""
    if name == "epsilon":
        return check_epsilon(value, "epsilon", MAX_QUERY_EPSILON)
    if name == "delta":
        return check_delta(value, "delta")
    if name in ("max_groups_per_unit", "max_rows_per_unit_per_group", "max_rows_per_unit"):
        return _positive_int(value, name)
    if name == "confidence":
        return _confidence(value)
    if name == "mechanism":
        return _mechanism(value)
    if name == "rho":
        return check_epsilon(value, "rho", MAX_QUERY_RHO)
    if name == "sigma":
        sigma = check_epsilon(value, "sigma", MAX_NOISE_MULTIPLIER)
        # Below this noise multiplier one measurement of sensitivity 1 alone costs more than
        # the largest per-query rho (rho = 1/(2 sigma^2)): refused as absurd, like that rho.
        if 2 * sigma * sigma * MAX_QUERY_RHO < 1:
            raise ParameterError(f"sigma must be at least sqrt(1/{2 * MAX_QUERY_RHO})")
        return sigma
    if name == "diagnose_epsilon":
        return check_epsilon(value, "diagnose_epsilon", MAX_QUERY_EPSILON)
    if name in ("fresh", "share", "accuracy_columns", "other_group", "diagnose", "sample_scale"):
        return _boolean(value, name)
    if name == "other_label":
        return _label(value)
    if name == "split":
        return _split(value)
    if name == "halfwidth":
        return _halfwidth(value)
    if name == "rank_error":
        return _count(value, name, MAX_CONTRIBUTION_BOUND)
    if name == "min_group":
        return _count(value, name, MAX_MIN_GROUP)
    if name == "sample_rate":
        return check_rate(value)
    raise ParameterError(
        f"unknown setting dpsql.{_setting_name(name)}; known: {', '.join(SETTINGS)}"
    )


class Settings:
    """The settings part of ``Session``: SET values over the policy's defaults, and SHOW."""

    policy: Policy
    _settings: dict[str, object]

    if TYPE_CHECKING:

        def budget(self) -> BudgetReport: ...

    # -- settings ------------------------------------------------------------------------------
    def set_option(self, name: str, value: object) -> None:
        """``SET dpsql.name = value``; ``None`` resets to the policy default."""
        name = name.lower()
        if value is None:
            if name not in SETTINGS:
                raise ParameterError(f"unknown setting dpsql.{name}")
            self._settings.pop(name, None)
            return
        self._settings[name] = check_setting(name, value)

    def settings(self, overrides: Mapping[str, object] | None = None) -> dict[str, object]:
        """The effective settings: policy defaults, then SET values, then ``overrides``."""
        budget = self.policy.budget
        merged: dict[str, object] = {
            "epsilon": budget.query_epsilon,
            "delta": budget.query_delta,
            "max_groups_per_unit": None,
            "max_rows_per_unit_per_group": None,
            "max_rows_per_unit": None,
            "confidence": DEFAULT_CONFIDENCE,
            "mechanism": budget.mechanism,
            "rho": None,
            "sigma": None,
            "fresh": False,
            "share": True,
            "accuracy_columns": False,
            "other_group": False,
            "other_label": None,
            "diagnose": False,
            "diagnose_epsilon": DEFAULT_DIAGNOSE_EPSILON,
            "split": "optimal",
            "halfwidth": None,
            "rank_error": None,
            "min_group": None,
            "sample_rate": None,
            "sample_scale": False,
        }
        merged.update(self._settings)
        for name, value in (overrides or {}).items():
            if value is not None:
                merged[name] = check_setting(name, value)
        return merged

    def _options(
        self,
        settings: Mapping[str, object],
        spec: TableSpec,
        asked: frozenset[str] = frozenset(),
    ) -> QueryOptions:
        """A query's options; ``asked``: the settings the analyst gave (SET, inline options,
        keywords), which under a declared mechanism must ask for its noise."""
        declared = self.policy.budget.declared_mechanism
        if declared is not None and "mechanism" not in asked:
            # The declared mechanism's noise, not the policy's default one.
            settings = {**settings, "mechanism": declared.mechanism}
        epsilon, delta = settings["epsilon"], settings["delta"]
        groups = settings["max_groups_per_unit"] or spec.max_groups_per_unit
        rows = settings["max_rows_per_unit_per_group"] or spec.max_rows_per_unit_per_group
        total_rows = settings["max_rows_per_unit"] or spec.max_rows_per_unit
        confidence, mechanism = settings["confidence"], settings["mechanism"]
        rho, sigma = settings["rho"], settings["sigma"]
        # check_setting normalised every value; these asserts only narrow the types.
        assert isinstance(epsilon, Fraction) and isinstance(delta, Fraction)
        assert groups is None or isinstance(groups, int)
        assert rows is None or isinstance(rows, int)
        assert total_rows is None or isinstance(total_rows, int)
        assert isinstance(confidence, float)
        assert mechanism in ("laplace", "gaussian")
        assert rho is None or isinstance(rho, Fraction)
        assert sigma is None or isinstance(sigma, Fraction)
        diagnose, diagnose_epsilon = settings["diagnose"], settings["diagnose_epsilon"]
        assert isinstance(diagnose, bool) and isinstance(diagnose_epsilon, Fraction)
        split = settings["split"]
        assert split in SPLITS
        if mechanism == "gaussian" and delta == 0:
            raise ParameterError("the gaussian mechanism needs delta > 0; SET dpsql.delta")
        if (rho is not None or sigma is not None) and mechanism != "gaussian":
            raise ParameterError("rho and sigma set the noise of the gaussian mechanism only")
        if rho is not None and sigma is not None:
            raise ParameterError("give rho or sigma, not both")
        return QueryOptions(
            epsilon,
            delta,
            groups,
            rows,
            confidence,
            mechanism,
            rho,
            sigma,
            total_rows,
            declared,
            asked & {"mechanism", "epsilon", "rho", "sigma", "diagnose_epsilon"}
            if declared
            else frozenset(),
            diagnose,
            diagnose_epsilon,
            split,
        )

    def _show(self, name: str) -> Result:
        if name == "budget":
            report = self.budget()
            return Result(("budget",), ("VARCHAR",), ((str(report),),))
        settings = self.settings()
        if name == "all":
            rows = tuple((k, _show_value(settings[k])) for k in SETTINGS)
            return Result(("name", "setting"), ("VARCHAR", "VARCHAR"), rows)
        if name not in settings:
            raise ParameterError(
                f"unknown setting dpsql.{name}; known: {', '.join(SETTINGS)}, budget, all"
            )
        value = settings[name]
        shown = "(none: NULL)" if name == "other_label" and value is None else _show_value(value)
        return Result((name,), ("VARCHAR",), ((shown,),))


def target_of(settings: Mapping[str, object]) -> Target | None:
    """The query's accuracy target, or None: ``min_group`` alone states a size, no target."""
    halfwidth, rank, group = settings["halfwidth"], settings["rank_error"], settings["min_group"]
    assert halfwidth is None or isinstance(halfwidth, Fraction)
    assert rank is None or isinstance(rank, int)
    assert group is None or isinstance(group, int)
    if halfwidth is None and rank is None:
        return None
    return Target(halfwidth, rank, group)


def _show_value(value: object) -> str:
    if value is None:
        return "(policy default)"
    if isinstance(value, Fraction):
        return str(float(value)) if value.denominator != 1 else str(value.numerator)
    return str(value)
