"""The exception classes of PEP 249 (DB-API 2.0), over the ``DpsqlError`` tree.

Each dpsql leaf has a class that is both the PEP 249 class and the dpsql class, e.g.
``BudgetExceededError`` is an ``OperationalError`` and a ``dpsql.errors.BudgetExceededError``::

    Warning
    Error
    ├── InterfaceError                 (closed connection or cursor, misuse of the API)
    └── DatabaseError
        ├── OperationalError
        │   ├── BudgetExceededError    (budget cap reached; nothing charged)
        │   ├── EngineFailure          (engine failed after the charge)
        │   ├── EntropyFailure         (no secure randomness; fails closed)
        │   ├── LedgerFailure
        │   └── DataChanged            (a data file replaced without a new data version)
        ├── ProgrammingError
        │   ├── QuerySyntaxError       (ParseError)
        │   ├── UnknownObjectError     (SchemaError)
        │   ├── MissingBoundsError     (BoundsError)
        │   └── InvalidParameterError  (ParameterError)
        ├── NotSupportedError
        │   └── UnsupportedQuery       (UnsupportedQueryError)
        │       ├── UnsupportedOnEngine  (NotSupportedOnEngineError)
        │       └── UndeclaredMechanism  (UndeclaredMechanismError)
        ├── IntegrityError, DataError  (never raised: dpsql does not write data)
        └── InternalError
            └── DpsqlInternalError     (a dpsql bug)
    PolicyFailure                      (an InterfaceError: the policy given to connect())
    InputFailure, OutputFailure        (InterfaceErrors: a file to read or write; the CLI's)

``_MAPPING`` is the one mapping from the dpsql tree to these classes, and ``_pep249`` wraps a
DB-API method so that a dpsql error leaves it as its PEP 249 class.
The ``dpsql`` package exports every class here under its own name.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from dpsql import errors

__all__ = [
    "BudgetExceededError",
    "DataChanged",
    "DataError",
    "DatabaseError",
    "DpsqlInternalError",
    "EngineFailure",
    "EntropyFailure",
    "Error",
    "InputFailure",
    "IntegrityError",
    "InterfaceError",
    "InternalError",
    "InvalidParameterError",
    "LedgerFailure",
    "MissingBoundsError",
    "NotSupportedError",
    "OperationalError",
    "OutputFailure",
    "PolicyFailure",
    "ProgrammingError",
    "QuerySyntaxError",
    "UndeclaredMechanism",
    "UnknownObjectError",
    "UnsupportedOnEngine",
    "UnsupportedQuery",
    "Warning",
]


class Warning(Exception):
    """PEP 249 Warning (dpsql raises none)."""


class Error(Exception):
    """PEP 249 root of all errors."""


class InterfaceError(Error):
    pass


class DatabaseError(Error):
    pass


class DataError(DatabaseError):
    pass


class OperationalError(DatabaseError):
    pass


class IntegrityError(DatabaseError):
    pass


class InternalError(DatabaseError):
    pass


class ProgrammingError(DatabaseError):
    pass


class NotSupportedError(DatabaseError):
    pass


class BudgetExceededError(OperationalError, errors.BudgetExceededError):
    """The query would exceed the budget; nothing was charged."""


class EngineFailure(OperationalError, errors.EngineError):
    pass


class EntropyFailure(OperationalError, errors.EntropyError):
    pass


class LedgerFailure(OperationalError, errors.LedgerError):
    pass


class QuerySyntaxError(ProgrammingError, errors.ParseError):
    pass


class UnknownObjectError(ProgrammingError, errors.SchemaError):
    pass


class MissingBoundsError(ProgrammingError, errors.BoundsError):
    pass


class InvalidParameterError(ProgrammingError, errors.ParameterError):
    pass


class UnsupportedQuery(NotSupportedError, errors.UnsupportedQueryError):
    pass


class UnsupportedOnEngine(UnsupportedQuery, errors.NotSupportedOnEngineError):
    pass


class UndeclaredMechanism(UnsupportedQuery, errors.UndeclaredMechanismError):
    pass


class DpsqlInternalError(InternalError, errors.InternalError):
    pass


class PolicyFailure(InterfaceError, errors.PolicyError):
    pass


class DataChanged(OperationalError, errors.DataChangedError):
    pass


class InputFailure(InterfaceError, errors.InputError):
    pass


class OutputFailure(InterfaceError, errors.OutputError):
    pass


# The one mapping from the dpsql tree to PEP 249 (most specific first).
_MAPPING: tuple[tuple[type[errors.DpsqlError], type[Error]], ...] = (
    (errors.BudgetExceededError, BudgetExceededError),
    (errors.EngineError, EngineFailure),
    (errors.EntropyError, EntropyFailure),
    (errors.LedgerError, LedgerFailure),
    (errors.ParseError, QuerySyntaxError),
    (errors.SchemaError, UnknownObjectError),
    (errors.BoundsError, MissingBoundsError),
    (errors.ParameterError, InvalidParameterError),
    (errors.NotSupportedOnEngineError, UnsupportedOnEngine),
    (errors.UndeclaredMechanismError, UndeclaredMechanism),
    (errors.UnsupportedQueryError, UnsupportedQuery),
    (errors.DataChangedError, DataChanged),
    (errors.PolicyError, PolicyFailure),
    (errors.InputError, InputFailure),
    (errors.OutputError, OutputFailure),
    (errors.InternalError, DpsqlInternalError),
)

F = TypeVar("F", bound=Callable[..., Any])


def _translate(exc: errors.DpsqlError) -> Error:
    for source, target in _MAPPING:
        if isinstance(exc, source):
            mapped = target(str(exc))
            for attr in ("line", "column"):
                if hasattr(exc, attr):
                    setattr(mapped, attr, getattr(exc, attr))
            return mapped
    return DatabaseError(str(exc))


def _pep249(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except errors.DpsqlError as exc:
            raise _translate(exc) from None

    return wrapper  # type: ignore[return-value]


# Every class here is public as dpsql's (the package exports them, as PEP 249 asks of a driver
# module): each carries that name, in tracebacks and pickles as in docs/errors.md.
for _name in __all__:
    globals()[_name].__module__ = "dpsql"
