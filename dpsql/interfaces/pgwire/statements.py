"""What ``dpsql serve`` answers itself, and how dpsql's answers and errors go on the wire.

Statements clients send that are not queries (transaction control, client settings, catalog
probes of public constants) are answered here with fixed, public values; everything else goes
to the Session. Errors map to SQLSTATEs; results to PostgreSQL row descriptions and text rows.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction

from dpsql import errors
from dpsql.interfaces.pgwire import protocol as pg
from dpsql.release.diagnosis import covers
from dpsql.release.result import INTERVALS_COVER, Result, interval_text, noise_names
from dpsql.session.session import VERSION

# The server_version clients see: PostgreSQL 15 features (what psql and drivers test for).
SERVER_VERSION = f"15.0 (dpsql {VERSION})"
BUDGET_EXHAUSTED = "53R01"  # dpsql's own SQLSTATE: the privacy budget would be exceeded
# dpsql's own SQLSTATE for a failure in the engine after the charge, in class 58 (system error):
# not XX000, which says "a dpsql bug", and the same code whatever the cause (out of memory, an
# interrupt, an engine error), since the cause can depend on the data.
ENGINE_FAILED = "58R01"
PROGRAM_LIMIT_EXCEEDED = "54000"  # a statement text or an answer over the server's limits
_ERROR_CODES: tuple[tuple[type[errors.DpsqlError], str], ...] = (
    (errors.ParseError, "42601"),  # syntax_error
    (errors.NotSupportedOnEngineError, "0A000"),  # feature_not_supported, on this engine
    (errors.UndeclaredMechanismError, "0A000"),  # feature_not_supported, by the PLD filter
    (errors.UnsupportedQueryError, "0A000"),  # feature_not_supported
    (errors.SchemaError, "42P01"),  # undefined_table (or column: the message says which)
    (errors.BoundsError, "22023"),  # invalid_parameter_value
    (errors.ParameterError, "22023"),
    (errors.BudgetExceededError, BUDGET_EXHAUSTED),
    # object_not_in_prerequisite_state: a data file changed without a new data version
    (errors.DataChangedError, "55000"),
    (errors.PolicyError, "F0000"),  # config_file_error
    (errors.LedgerError, "58000"),  # system_error
    (errors.EntropyError, "58000"),
    (errors.EngineError, ENGINE_FAILED),
    (errors.InputError, "58030"),  # io_error (files of the command line; not on the wire)
    (errors.OutputError, "58030"),
    (errors.InternalError, "XX000"),
)


def sqlstate(exc: errors.DpsqlError) -> str:
    """The SQLSTATE of a dpsql error (documented in docs/server.md)."""
    if isinstance(exc, errors.SchemaError) and "column" in str(exc):
        return "42703"  # undefined_column
    if isinstance(exc, InFailedTransaction):
        return "25P02"  # in_failed_sql_transaction
    if isinstance(exc, InsufficientPrivilege):
        return "42501"  # insufficient_privilege
    if isinstance(exc, ConnectionLimitExceeded):
        return "53400"  # configuration_limit_exceeded
    if isinstance(exc, AnswerTooLarge):
        return PROGRAM_LIMIT_EXCEEDED
    return next((code for cls, code in _ERROR_CODES if isinstance(exc, cls)), "XX000")


def engine_failure() -> tuple[str, str]:
    """The SQLSTATE and message of a statement cut off by the statement timeout, a cancel
    request or the loss of its worker: those of any engine failure after the charge. Whether a
    query ends before a deadline depends on the data, so a code of its own would tell."""
    return sqlstate(errors.EngineError()), errors.ENGINE_FAILURE


class InFailedTransaction(errors.DpsqlError):
    """A statement after an error inside BEGIN ... (SQLSTATE 25P02) until ROLLBACK."""


class ConnectionLimitExceeded(errors.DpsqlError):
    """A prepared statement, portal or SET value past its per-connection cap (SQLSTATE 53400,
    configuration_limit_exceeded: a limit the operator configures, that the client can make room
    under by freeing what it holds)."""


class InsufficientPrivilege(errors.DpsqlError):
    """A statement reserved to the data owner, asked by an analyst (SQLSTATE 42501)."""


class AnswerTooLarge(errors.DpsqlError):
    """An answer whose DataRow messages pass the server's byte cap (``Limits.max_answer``),
    found while its rows are fetched and encoded (SQLSTATE 54000). The message states whether
    a charge stands; it names the cap, never a value or the answer's size."""


# -- statements the server answers itself -----------------------------------------------------

# Every pattern ends in possessive quantifiers: "\s*;?\s*$" backtracks over every way to split
# a run of spaces between its two "\s*", so a statement of "SHOW x", 20,000 spaces and a "("
# took a second of C code that holds the interpreter lock (about 25 s at 100,000 bytes).
TRANSACTION = re.compile(
    r"^\s*+(BEGIN|START\s++TRANSACTION|COMMIT|END|ROLLBACK|ABORT)\b[\w\s]*+(?:;\s*+)?$",
    re.IGNORECASE,
)
# Savepoints (psycopg's nested transaction blocks, which SQLAlchemy opens on connect): no-ops
# like the transactions around them; ROLLBACK TO leaves a failed block usable again.
SAVEPOINT = re.compile(
    r"^\s*+(SAVEPOINT|RELEASE(?:\s++SAVEPOINT)?+|ROLLBACK\s++TO(?:\s++SAVEPOINT)?+)\s++"
    r'(?:"[^"]{1,63}+"|\w{1,63}+)\s*+(?:;\s*+)?$',
    re.IGNORECASE,
)
CLIENT_SET = re.compile(r"^\s*(SET|RESET)\s+(SESSION\s+|LOCAL\s+)?(?!dpsql\.)([\w.]+)", re.I)
# SET name = value, SET name TO value (the value as written, for its length).
SET_VALUE = re.compile(
    r"^\s*+SET\s++(?:SESSION\s++|LOCAL\s++)?+([\w.]++)\s*+(?:=|\bTO\b)(.*)$",
    re.IGNORECASE | re.DOTALL,
)
RESET = re.compile(r"^\s*+RESET\s++([\w.]++)\s*+(?:;\s*+)?$", re.IGNORECASE)
DEALLOCATE = re.compile(
    r'^\s*+DEALLOCATE\s++(?:PREPARE\s++)?+("(?:[^"]|"")*+"|\w++)\s*+(?:;\s*+)?$', re.IGNORECASE
)
SHOW = re.compile(r"^\s*+SHOW\s++([\w.]++)\s*+(?:;\s*+)?$", re.IGNORECASE)
ISOLATION = re.compile(
    r"^\s*+SHOW\s++TRANSACTION\s++ISOLATION\s++LEVEL\s*+(?:;\s*+)?$", re.IGNORECASE
)
# The connection check of pools and BI tools: a constant, no data read.
HEALTH_CHECK = re.compile(r"^\s*+SELECT\s++\d{1,9}+\s*+(?:;\s*+)?$", re.IGNORECASE)
PROBE = re.compile(
    r"^\s*+SELECT\s++(version\(\)|current_database\(\)|current_schema\(\)|current_user|"
    r"session_user|current_setting\('[\w.]++'\))\s*+(?:;\s*+)?$",
    re.IGNORECASE,
)
OWNER_ONLY = {"dpsql.report", "dpsql.ledger"}


def public_settings(user: str, database: str) -> dict[str, str]:
    """Settings clients read on connect or probe with SHOW: fixed, public values."""
    return {
        "server_version": SERVER_VERSION,
        "server_version_num": "150000",
        "server_encoding": "UTF8",
        "client_encoding": "UTF8",
        "datestyle": "ISO, MDY",
        "timezone": "UTC",
        "integer_datetimes": "on",
        "standard_conforming_strings": "on",
        "transaction_isolation": "read committed",
        "default_transaction_read_only": "on",
        "is_superuser": "off",
        "session_authorization": user,
        "application_name": "",
        "search_path": "main",
        "max_identifier_length": "63",
        "max_index_keys": "32",
        "default_table_access_method": "heap",
        "database": database,
    }


_PARAMETER = re.compile(r"\$(\d+)")


def numbered_to_qmark(sql: str) -> tuple[str, list[int]]:
    """Rewrite PostgreSQL's ``$n`` parameters (outside strings, identifiers and comments) to
    dpsql's ``?``, and return, for each ``?`` in order, the 0-based index of its parameter."""
    return _markers(sql, qmark=True)


def qmark_to_numbered(sql: str) -> str:
    """The inverse for the catalog's PostgreSQL parser: the k-th ``?`` (outside strings,
    identifiers and comments) becomes ``$k``."""
    return _markers(sql, qmark=False)[0]


def _markers(sql: str, *, qmark: bool) -> tuple[str, list[int]]:
    out: list[str] = []
    order: list[int] = []
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c in "'\"":
            j = i + 1
            while j < n and not (sql[j] == c and not (j + 1 < n and sql[j + 1] == c)):
                j += 2 if sql[j] == c else 1
            out.append(sql[i : j + 1])
            i = j + 1
        elif sql.startswith("--", i):
            j = sql.find("\n", i)
            j = n if j < 0 else j
            out.append(sql[i:j])
            i = j
        elif sql.startswith("/*", i):
            j = sql.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(sql[i:j])
            i = j
        elif qmark and c == "$" and (m := _PARAMETER.match(sql, i)) is not None:
            order.append(int(m.group(1)) - 1)
            out.append("?")
            i = m.end()
        elif not qmark and c == "?":
            order.append(len(order))
            out.append(f"${len(order)}")
            i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out), order


@dataclass
class Answer:
    """What one statement returns over the wire."""

    columns: tuple[tuple[str, int, int], ...] | None  # None: no row description (SET, BEGIN)
    # DataRow messages, encoded (``AnswerRows``); an iterator for an answer streamed as it is
    # fetched, whose tag then gets the row count once the last is sent
    rows: list[bytes] | Iterator[bytes]
    tag: str
    notice: str | None = None


class AnswerRows:
    """The DataRow messages of one answer, counted against the byte cap as each is encoded, so
    that a statement is refused before the rest of its rows are fetched, encoded or sent (one
    analyst's free catalog answer held 100 MB in the process every connection shares).

    ``charged`` says what the refusal adds about the statement's charge: whether an answer is
    over the cap is a function of the rows it would release, which for a DP answer are noisy
    already (post-processing), and for every other answer hold no data."""

    def __init__(self, cap: int, charged: str = "nothing was charged") -> None:
        self.cap = cap
        self.charged = charged
        self.rows: list[bytes] = []
        self.size = 0

    def encode(self, values: Sequence[bytes | None]) -> bytes:
        """One DataRow, counted (``AnswerTooLarge`` past the cap), not kept."""
        row = pg.data_row(values)
        self.size += len(row)
        if self.size > self.cap:
            raise AnswerTooLarge(
                f"the answer is over this server's limit of {self.cap} bytes; {self.charged}; "
                "ask for fewer rows or narrower columns"
            )
        return row

    def add(self, values: Sequence[bytes | None]) -> None:
        self.rows.append(self.encode(values))


def _decimal(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{float(value):.6g}"


def to_answer(result: Result, cap: int) -> Answer:
    if not result.columns:  # SET dpsql.x
        return Answer(None, [], result.message.split(" ")[0] if result.message else "SET")
    columns = tuple(
        (name, *pg.pg_type(dtype)) for name, dtype in zip(result.columns, result.types, strict=True)
    )
    oids = [oid for _, oid, _ in columns]
    plan = result.plan
    cost = f"epsilon {_decimal(plan.epsilon)}, delta {_decimal(plan.delta)}" if plan else ""
    # A charged answer past the cap keeps its charge, as an engine failure after the charge
    # does: the release happened (the ledger and the cache hold it), only its sending is refused.
    charged = "nothing was charged"
    if result.charge is not None:
        charged = f"the charge stands ({cost})" if cost else "the charge stands"
    rows = AnswerRows(cap, charged)
    for row in result.rows:
        rows.add([pg.encode_text(v, oid=o) for v, o in zip(row, oids, strict=True)])
    notice = None
    if result.charge is not None or result.cached_from is not None:
        source = "charged" if result.charge is not None else "served from the cache, free"
        widths = [
            f"{name} in {interval_text(width)}" if isinstance(width, tuple)
            else f"{name} ± {width:.6g}"
            for name, width in zip(result.columns, result.accuracy[0] if result.accuracy else (),
                                   strict=False)
            if width is not None
        ]  # fmt: skip
        notice = f"dpsql: {source}: {cost}" if cost else f"dpsql: {source}"
        shown = bool(widths) and len(result.rows) == 1
        sampled = result.plan is not None and result.plan.sample is not None
        if shown:
            intervals = any(isinstance(w, tuple) for w in result.accuracy[0])
            what = "accuracy" if intervals else "half-widths"
            notice += f"; {result.confidence:.0%} {what}: " + ", ".join(widths)
            if intervals:
                notice += f"; [lo, hi]: {INTERVALS_COVER}"
        if shown or result.diagnosis is not None or sampled:
            # What the ± covers, never a confidence interval of the true value.
            notice += f"; ± covers {covers(result.diagnosis, result.plan)}"
        if result.diagnosis is not None:
            notice += f"; diagnosis: {result.diagnosis.describe()}"
        if result.bounds_note:
            notice += f"; {result.bounds_note}"
        flagged = noise_names(result)
        if flagged:
            notice += "; mostly noise (± at least the value) in: " + ", ".join(flagged)
    tag = f"SELECT {len(rows.rows)}"
    if result.columns == ("plan",):
        tag = "EXPLAIN"
    return Answer(columns, rows.rows, tag, notice)


def text_table(name: str, lines: Sequence[str], cap: int) -> Answer:
    rows = AnswerRows(cap)
    for line in lines:
        rows.add([line.encode()])
    return Answer(((name, 25, -1),), rows.rows, f"SELECT {len(lines)}")
