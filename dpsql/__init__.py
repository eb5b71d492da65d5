"""dpsql: a differentially private SQL query proxy.

Analysts send ordinary SQL; dpsql answers only with noisy aggregates, after charging their
privacy loss to the data set's budget. ``dpsql.connect(policy)`` returns a PEP 249 connection.
"""

from dpsql.accounting.budget.report import BudgetReport
from dpsql.interfaces.dbapi import errors as _pep249
from dpsql.interfaces.dbapi.connection import (
    BINARY,
    DATETIME,
    NUMBER,
    ROWID,
    STRING,
    Connection,
    Cursor,
    apilevel,
    connect,
    paramstyle,
    threadsafety,
)

# PEP 249's exception classes, listed once, in dpsql.interfaces.dbapi.errors.__all__.
from dpsql.interfaces.dbapi.errors import *  # noqa: F403
from dpsql.policy import Policy, load_policy
from dpsql.release.result import Result
from dpsql.session.session import VERSION, Session

__version__ = VERSION

__all__ = [
    "BINARY",
    "DATETIME",
    "NUMBER",
    "ROWID",
    "STRING",
    "BudgetReport",
    "Connection",
    "Cursor",
    "Policy",
    "Result",
    "Session",
    "__version__",
    "apilevel",
    "connect",
    "load_policy",
    "paramstyle",
    "threadsafety",
]
__all__ += _pep249.__all__
