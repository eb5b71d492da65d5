"""The dpsql error tree.

Every error dpsql raises on purpose is a ``DpsqlError``. Messages name the construct (a table,
a column, an SQL node, a policy field), never a value taken from the data.

::

    DpsqlError
    ├── QueryError                 the query cannot be answered as written; nothing is charged
    │   ├── ParseError             not valid SQL (carries line and column)
    │   ├── UnsupportedQueryError  valid SQL that dpsql does not answer (names the construct)
    │   │   ├── NotSupportedOnEngineError  answered on DuckDB, not on the policy's engine
    │   │   └── UndeclaredMechanismError   not the mechanism the PLD filter was declared for
    │   ├── SchemaError            unknown table or column, or a unit column in the output
    │   ├── BoundsError            a contribution or value bound is missing or unusable
    │   └── ParameterError         a privacy parameter or bound parameter is invalid
    ├── PolicyError                the policy file is invalid
    │   └── DataChangedError       a data file changed since the session bound it; not charged
    ├── InputError                 a file or stream to read is unreadable, too large or not UTF-8
    ├── OutputError                a result, report or chart file cannot be written
    ├── BudgetExceededError        the query would take the budget over its cap; nothing is charged
    ├── LedgerError                the ledger cannot record a charge; nothing is released
    ├── EntropyError               no secure randomness; fails closed (the charge stays)
    ├── EngineError                the engine failed after the charge (the charge stays)
    └── InternalError              a dpsql bug detected by an internal consistency check

The PEP 249 classes (``dpsql.Error`` and friends) are defined over this tree in
``dpsql.interfaces.dbapi.connection``; the CLI maps it to exit codes in one table.
"""

from __future__ import annotations


class DpsqlError(Exception):
    """Root of every error dpsql raises on purpose."""


class QueryError(DpsqlError):
    """The query cannot be answered as written. Rejected before any charge."""


class ParseError(QueryError):
    """The text is not valid SQL. ``line`` and ``column`` are 1-based when known."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None):
        where = f" (line {line}, column {column})" if line is not None else ""
        super().__init__(message + where)
        self.line = line
        self.column = column


class UnsupportedQueryError(QueryError):
    """Valid SQL that dpsql does not answer; the message names the construct."""


class NotSupportedOnEngineError(UnsupportedQueryError):
    """Valid SQL that dpsql answers on DuckDB but cannot run on the policy's engine with the
    same guarantees (exact sums, totality, determinism); names the construct and the engine."""


class UndeclaredMechanismError(UnsupportedQueryError):
    """A query that the PLD filter (``budget.accountant = "pld"``) cannot account: one of its
    measurements is not the policy's declared mechanism (partition selection, a quantile, several
    coordinates, a larger sensitivity, a setting asking for other noise). The natural PLD filter
    is valid only for a family of mechanisms totally ordered under composition and fixed before
    the first query; names the construct."""


class SchemaError(QueryError):
    """An unknown table or column, or a column that may not appear where it does."""


class BoundsError(QueryError):
    """A contribution or value bound that the query needs is missing or unusable."""


class ParameterError(QueryError):
    """An invalid privacy parameter, session setting or bound query parameter."""


class PolicyError(DpsqlError):
    """The policy is invalid; the message names the field."""


class DataChangedError(PolicyError):
    """A data file the query reads is no longer the one the session bound (another file, or
    the same one written to) while the policy declares the same ``data_version``. Raised
    before the charge: nothing is charged. The message names the table, never a value."""


class InputError(DpsqlError):
    """A file or stream dpsql was told to read cannot be used: it cannot be read, is larger
    than its limit, or is not UTF-8 text. The message names the file, never its content."""


class OutputError(DpsqlError):
    """A result, report or chart file cannot be written. The message names the file (and, in
    ``dpsql run``, the statement whose result it holds). A charge already made stays."""


class BudgetExceededError(DpsqlError):
    """Answering would take a budget over its cap. Nothing was charged or run."""


class LedgerError(DpsqlError):
    """The ledger could not record a charge, or is not trustworthy. Nothing is released."""


class EntropyError(DpsqlError):
    """Secure randomness is unavailable. The query fails closed; its charge stays."""


# The one message of every engine failure after a charge: whether a query fails, and how (out
# of memory, interrupted, an engine error), can depend on the data, so the analyst is told the
# same thing whatever the cause (DESIGN.md section 5).
ENGINE_FAILURE = "the engine failed while running the query; the charge stands"
# Checks before the charge bind over the schema or an empty table, so running out of memory
# there says something about this process, never about the data.
CHECK_OUT_OF_MEMORY = "the engine ran out of memory while checking this query; nothing was charged"


class EngineError(DpsqlError):
    """The engine failed while running a bounded query. The charge stays.

    The engine's own message is never shown: DuckDB quotes offending data values. ``cause``
    (the engine exception's class name) is set by the engine for the session, which records it
    in the ledger for the owner and raises a fresh ``EngineError`` without it to the analyst.
    """

    def __init__(self, message: str = ENGINE_FAILURE, cause: str | None = None):
        super().__init__(message)
        self.cause = cause


class InternalError(DpsqlError):
    """An internal consistency check failed: a dpsql bug. Nothing is released."""


__all__ = [
    "BoundsError",
    "BudgetExceededError",
    "DataChangedError",
    "DpsqlError",
    "EngineError",
    "EntropyError",
    "InputError",
    "InternalError",
    "LedgerError",
    "NotSupportedOnEngineError",
    "OutputError",
    "ParameterError",
    "ParseError",
    "PolicyError",
    "QueryError",
    "SchemaError",
    "UndeclaredMechanismError",
    "UnsupportedQueryError",
]
