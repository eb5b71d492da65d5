"""The checks of the per-query settings (``dpsql.session.settings``).

Each refuses a value on its form alone, before anything is charged, and reads only a word, a
number or a short text: ``str()`` of an arbitrary object is never taken (a 5,000-digit integer
is refused unexpanded by ``to_fraction``), and a message names the setting, never the value.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

from dpsql.analyze.sample import check_rate
from dpsql.errors import ParameterError
from dpsql.plan.split import ALIASES, SPLITS
from dpsql.policy import (
    MAX_CONTRIBUTION_BOUND,
    MAX_QUERY_EPSILON,
    Policy,
    check_delta,
    check_epsilon,
    to_fraction,
)
from dpsql.policy.numbers import MAX_QUERY_RHO

# sigma is a noise multiplier (noise standard deviation per unit of L2 sensitivity).
MAX_NOISE_MULTIPLIER = Fraction(10**6)
DEFAULT_CONFIDENCE = 0.95
# The longest label of the other group (dpsql.analyze.domains); a label is public, like the query.
MAX_OTHER_LABEL = 256
# An accuracy target's half-width is a number in the values' units, like a bound (2^52 at most).
MAX_HALFWIDTH = Fraction(2**52)
# A stated group size is a count of units, so at most a BIGINT.
MAX_MIN_GROUP = 2**63 - 1


def whole(value: object, name: str, top: int) -> int:
    number = to_fraction(value, name)
    if number.denominator != 1 or not 1 <= number <= top:
        raise ParameterError(f"{name} must be an integer from 1 to {top}")
    return int(number)


def epsilon(value: object) -> Fraction:
    return check_epsilon(value, "epsilon", MAX_QUERY_EPSILON)


def delta(value: object) -> Fraction:
    return check_delta(value, "delta")


def bound(name: str) -> Callable[[object], int]:
    # L0, C and R: a contribution bound is a whole number of groups or rows.
    return lambda value: whole(value, name, MAX_CONTRIBUTION_BOUND)


_TRUE, _FALSE = ("true", "on", "1", "yes"), ("false", "off", "0", "no")


def boolean(name: str) -> Callable[[object], bool]:
    def check(value: object) -> bool:
        if isinstance(value, bool):
            return value
        # Only a word or 0/1 is read: str() of an arbitrary object (or of a 5,000-digit
        # integer, which raises ValueError) is never taken.
        if isinstance(value, int) and value in (0, 1):
            return value == 1
        text = value.strip().lower() if isinstance(value, str) and len(value) <= 32 else None
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ParameterError(f"{name} must be true or false")

    return check


def confidence(value: object) -> float:
    message = "confidence must be a number in [0.5, 0.9999]"
    try:
        number = to_fraction(value, "confidence")
    except ParameterError:
        raise ParameterError(message) from None
    if not Fraction(1, 2) <= number <= Fraction(9999, 10000):
        raise ParameterError(message)
    return float(number)


def word(name: str, words: tuple[str, ...], message: str) -> Callable[[object], str]:
    def check(value: object) -> str:
        chosen = value.strip().lower() if isinstance(value, str) and len(value) <= 32 else None
        if chosen not in words:
            raise ParameterError(message)
        return chosen

    return check


bounds = word("bounds", ("declared", "auto"), "bounds must be 'declared' or 'auto'")
DEFAULT_BOUNDS_SHARE = Fraction(1, 4)  # of a query's epsilon, choosing its bounds under auto


def bounds_share(value: object) -> Fraction:
    share = check_epsilon(value, "bounds_share", Fraction(1, 2))
    return share


mechanism = word("mechanism", ("laplace", "gaussian"), "mechanism must be 'laplace' or 'gaussian'")
moments = word("moments", ("joint", "separate"), "moments must be 'joint' or 'separate'")
_split_word = word(
    "split", (*SPLITS, *ALIASES), "split must be 'min_max_ratio', 'min_total_variance' or 'even'"
)


def split(value: object) -> str:
    """A rule of ``dpsql.plan.split``; an old name reads as the rule it names now."""
    chosen = _split_word(value)
    return ALIASES.get(chosen, chosen)


def rho(value: object) -> Fraction:
    return check_epsilon(value, "rho", MAX_QUERY_RHO)


def sigma(value: object) -> Fraction:
    sigma = check_epsilon(value, "sigma", MAX_NOISE_MULTIPLIER)
    # Below this noise multiplier one measurement of sensitivity 1 alone costs more than the
    # largest per-query rho (rho = 1/(2 sigma^2)): refused as absurd, like that rho.
    if 2 * sigma * sigma * MAX_QUERY_RHO < 1:
        raise ParameterError(f"sigma must be at least sqrt(1/{2 * MAX_QUERY_RHO})")
    return sigma


def label(value: object) -> str:
    """The other group's label: text, cast to each key's type when the query is planned (a
    number arrives as its text from SET and OPTIONS; from Python, give a string)."""
    if not isinstance(value, str) or len(value) > MAX_OTHER_LABEL:
        raise ParameterError(
            f"other_label must be a string of at most {MAX_OTHER_LABEL} characters"
        )
    return value


def diagnose_epsilon(value: object) -> Fraction:
    return check_epsilon(value, "diagnose_epsilon", MAX_QUERY_EPSILON)


def halfwidth(value: object) -> Fraction:
    number = to_fraction(value, "halfwidth")
    if not 0 < number <= MAX_HALFWIDTH:
        raise ParameterError(
            f"halfwidth must be a number above 0 and at most 2^52 ({MAX_HALFWIDTH})"
        )
    return number


def rank_error(value: object) -> int:
    return whole(value, "rank_error", MAX_CONTRIBUTION_BOUND)


def min_group(value: object) -> int:
    return whole(value, "min_group", MAX_MIN_GROUP)


def rate(value: object) -> Fraction:
    return check_rate(value)


def none(policy: Policy) -> None:
    return None
