"""The parameter types of the ``dpsql`` commands, and the decimals their numbers print as.

Privacy parameters are read as exact rationals from their decimal text (``0.1`` is exactly
1/10): ``EPSILON`` (positive, at most the total-budget cap) and ``DELTA`` (in [0, 1)) fail as
usage errors before anything is opened; ``TEXT`` is a name or a reason, one line and not
blank. ``_decimal`` prints such a number back as the decimal it was written as. The commands
of ``cli.py`` and ``ledger_cli.py`` take them from here; ``cli.py`` re-exports them.
"""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING, Any

import click

from dpsql.errors import ParameterError
from dpsql.policy import MAX_TOTAL_EPSILON, check_delta, check_epsilon
from dpsql.policy.numbers import decimal_text

__all__ = ["DELTA", "EPSILON", "TEXT", "DeltaType", "EpsilonType", "NonEmpty"]

if TYPE_CHECKING:  # ParamType is generic from click 8.2 on; the project allows click 8.1
    _FractionParam = click.ParamType[Fraction]
    _TextParam = click.ParamType[str]
else:
    _FractionParam = _TextParam = click.ParamType


class EpsilonType(_FractionParam):
    """A positive epsilon, exact from its decimal text, at most the total-budget cap."""

    name = "epsilon"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> Fraction:
        if isinstance(value, Fraction):
            return value
        try:
            return check_epsilon(value, param.name if param else "epsilon", MAX_TOTAL_EPSILON)
        except ParameterError as exc:
            self.fail(str(exc), param, ctx)


class DeltaType(_FractionParam):
    """A delta in [0, 1), exact from its decimal text."""

    name = "delta"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> Fraction:
        if isinstance(value, Fraction):
            return value
        try:
            return check_delta(value, param.name if param else "delta")
        except ParameterError as exc:
            self.fail(str(exc), param, ctx)


class NonEmpty(_TextParam):
    """A name or reason: one line of text, not blank."""

    name = "text"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        text = " ".join(str(value).split())
        if not text:
            self.fail("must not be blank", param, ctx)
        return text


EPSILON, DELTA, TEXT = EpsilonType(), DeltaType(), NonEmpty()


def _decimal(value: Fraction | None) -> str:
    """An exact policy or command-line number as the decimal it was written as."""
    return "none" if value is None else decimal_text(value)
