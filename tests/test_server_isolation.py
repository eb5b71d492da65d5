"""One connection of ``dpsql serve`` cannot stall the others.

The event loop that every connection shares only frames messages, authenticates and passes
requests to each connection's own worker process; these tests hold it to that: a statement
that takes seconds to parse keeps only its own connection busy, an over-long text is refused
before any parsing, a timeout and a cancel end like any engine failure after the charge, and a
worker killed mid-statement takes only its own connection down. Real psql and psycopg clients,
real DuckDB, real worker processes; helpers in tests/server_fixtures.py.
"""

from __future__ import annotations

import re
from time import perf_counter

import pytest

from dpsql.server.statements import HEALTH_CHECK, PROBE, SHOW, TRANSACTION

# -- the patterns the server matches statements with ----------------------------------------


@pytest.mark.parametrize(
    ("pattern", "head"),
    [
        (TRANSACTION, "BEGIN"),
        (SHOW, "SHOW x"),
        (HEALTH_CHECK, "SELECT 1"),
        (PROBE, "SELECT current_user"),
    ],
    ids=["transaction", "show", "health-check", "probe"],
)
def test_statement_patterns_fail_in_linear_time(pattern: re.Pattern[str], head: str) -> None:
    """``\\s*;?\\s*$`` tries every split of a run of spaces between its two ``\\s*``: such a
    statement of 20,000 spaces took a second to refuse, holding the interpreter lock. One
    pass must do; a second for 100,000 spaces is a generous bound."""
    began = perf_counter()
    assert pattern.match(head + " " * 100_000 + "(") is None
    assert perf_counter() - began < 1.0
    assert pattern.match(head + " " * 1000 + ";  ") is not None
