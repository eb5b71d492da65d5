"""Unit-level Poisson sampling: ``FROM t TABLESAMPLE BERNOULLI (p PERCENT)`` (or ``SET
dpsql.sample_rate``), interpreted by dpsql and never passed to the engine.

The engine's own TABLESAMPLE samples rows with a non-cryptographic generator: a unit with n rows
would be kept with probability 1 - (1 - q)^n, and nothing would be amplified. dpsql keeps each
privacy unit with probability q instead, all its rows or none, deciding by a keyed PRF of the
unit: the first 64 bits of SHA-256(secret || unit as text), kept iff below k = ceil(q·2^64).
The secret is 128 bits from the operating system's CSPRNG, drawn afresh by the engine for every
run of a query (``dpsql.engine.duckdb.engine``) and bound as a parameter, so no EXPLAIN, log or
engine text holds it and the samples of two queries are independent. The rate charged is the one
implemented, k/2^64 (at least q). Amplification: ``dpsql.plan.sample``.

>>> select = sqlglot.parse_one(
...     "SELECT COUNT(*) FROM visits TABLESAMPLE BERNOULLI (1 PERCENT)", read="duckdb")
>>> rest, rate, tables = take_sample(select)
>>> rest.sql("duckdb"), rate, tables
('SELECT COUNT(*) FROM visits', Fraction(1, 100), (('visits', True),))
"""

from __future__ import annotations

from fractions import Fraction

import sqlglot  # noqa: F401  (the doctest parses with it)
from sqlglot import exp

from dpsql.errors import ParameterError, UnsupportedQueryError
from dpsql.policy import to_fraction

__all__ = [
    "SAMPLE_PARAMETER",
    "check_rate",
    "implemented",
    "sample_filter",
    "take_sample",
    "threshold",
]

# The engine binds the per-run secret under this name (never in the text).
SAMPLE_PARAMETER = "sample"
_BITS = 64

_SYNTAX = "TABLESAMPLE takes BERNOULLI (p PERCENT) with 0 < p <= 100, a literal number"


def check_rate(value: object, name: str = "sample_rate") -> Fraction:
    """A sampling rate q with 0 < q <= 1, exact."""
    q = to_fraction(value, name)
    if not 0 < q <= 1:
        raise ParameterError(f"{name} must be a number above 0 and at most 1")
    return q


def _outer_tables(select: exp.Select) -> list[exp.Table]:
    """The tables the outer query reads directly: its FROM table and its joins' tables."""
    from_ = select.args.get("from_")
    items = [from_.this] if isinstance(from_, exp.From) else []
    items += [j.this for j in select.args.get("joins") or []]
    return [t for t in items if isinstance(t, exp.Table)]


def _rate(node: exp.TableSample) -> Fraction:
    method = node.args.get("method")
    name = method.name.upper() if isinstance(method, exp.Expression) else ""
    percent = node.args.get("percent")
    extra = [k for k, v in node.args.items() if v is not None and k not in ("method", "percent")]
    if name != "BERNOULLI" or percent is None or extra:
        hint = (
            "; SYSTEM samples blocks of rows, not units"
            if name == "SYSTEM"
            else "; a row count samples rows, not units"
            if node.args.get("size") is not None
            else ""
        )
        raise UnsupportedQueryError(_SYNTAX + hint)
    if not isinstance(percent, exp.Literal) or percent.is_string:
        raise UnsupportedQueryError(_SYNTAX)
    try:
        return check_rate(to_fraction(percent.this, "the TABLESAMPLE percent") / 100)
    except ParameterError:
        raise ParameterError(_SYNTAX) from None


def take_sample(
    select: exp.Select,
) -> tuple[exp.Select, Fraction | None, tuple[tuple[str, bool], ...]]:
    """``select`` without its TABLESAMPLE clauses, the rate they ask (None: no clause) and the
    tables the outer query reads, each (lower-case name, whether a clause samples it).

    A clause must sample a table the outer query reads directly (its FROM table or a joined
    one), BERNOULLI by a literal percent, at one rate for all; anything else (a clause in a CTE
    or a subquery, SYSTEM or RESERVOIR, a row count, two rates) is refused."""
    samples = list(select.find_all(exp.TableSample))
    if not samples:
        return select, None, ()
    outer = {id(t.args.get("sample")): t for t in _outer_tables(select) if t.args.get("sample")}
    if select.args.get("with_") or any(id(node) not in outer for node in samples):
        raise UnsupportedQueryError(
            "TABLESAMPLE samples a table the query reads in its own FROM or JOIN (not in a CTE "
            "or a subquery)"
        )
    rates = {_rate(node) for node in samples}
    if len(rates) != 1:
        raise UnsupportedQueryError("TABLESAMPLE samples every sampled table at one rate")
    tables = tuple((t.name.lower(), bool(t.args.get("sample"))) for t in _outer_tables(select))
    try:
        rest = select.copy()
    except RecursionError:
        raise UnsupportedQueryError("the query is nested too deeply") from None
    for table in _outer_tables(rest):
        table.set("sample", None)
    return rest, rates.pop(), tables


def threshold(rate: Fraction) -> int:
    """k = ceil(q·2^64): a unit is kept iff its 64-bit PRF value is below k."""
    return -((-rate.numerator << _BITS) // rate.denominator)  # exact ceiling


def implemented(rate: Fraction) -> Fraction:
    """The rate the threshold implements, k/2^64 >= q: what is charged."""
    return Fraction(threshold(rate), 2**_BITS)


def sample_filter(unit_sql: str, rate: Fraction) -> str:
    """The row filter keeping the units of the sample: SHA-256 of the secret (32 hex digits,
    fixed length, so the encoding is prefix-free) and the unit's text, its first 16 hex digits
    compared as text with k's (equal-length lowercase hex orders as the numbers do)."""
    k = threshold(rate)
    if k >= 2**_BITS:
        return ""  # q = 1: every unit
    prf = f"left(sha256(CAST(${SAMPLE_PARAMETER} AS VARCHAR) || CAST({unit_sql} AS VARCHAR)), 16)"
    return f"{prf} < '{k:016x}'"
