"""Parse one statement: a SELECT query, or a session command handled before validation.

Session commands (``SET dpsql.x = v``, ``RESET dpsql.x``, ``SHOW dpsql.x``, ``EXPLAIN q``) are
recognised on the token stream, so they never reach the SQL validator; every other statement
must parse as a single ``SELECT``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError as GlotParseError
from sqlglot.errors import TokenError
from sqlglot.tokenizer_core import Token, TokenType

from dpsql.errors import ParseError, UnsupportedQueryError
from dpsql.sql.options import split_options

DIALECT = "duckdb"
# Node types that are whole statements; anything else at the top is a syntax error.
_STATEMENTS: tuple[type[exp.Expression], ...] = tuple(
    getattr(exp, name)
    for name in (
        "Query",
        "Command",
        "DML",
        "DDL",
        "Set",
        "Pragma",
        "Use",
        "Describe",
        "Copy",
        "Attach",
        "Detach",
        "Install",
        "Transaction",
        "Commit",
        "Rollback",
        "Summarize",
        "Load",
        "Insert",
        "Update",
        "Delete",
        "Merge",
        "Create",
        "Drop",
        "Alter",
    )
    if hasattr(exp, name)
)
MAX_QUERY_LENGTH = 100_000
# A number literal is read exactly (its interval, a LIMIT, a quantile's order), so the length of
# its decimal expansion is bounded like the query's: "1e999999999" is eleven characters that
# expand to a billion digits. 400 digits cover every finite double (5e-324 has 324).
MAX_NUMBER_DIGITS = 400
_NUMBER = re.compile(r"([0-9_]*)(?:\.([0-9_]*))?(?:[eE][+-]?0*([0-9_]+))?")


@dataclass(frozen=True)
class Query:
    """A SELECT statement to answer; ``options`` are its ``WITH DIFFERENTIAL_PRIVACY`` ones."""

    select: exp.Select
    options: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Explain:
    """``EXPLAIN <select>``: plan only; nothing runs and nothing is charged."""

    select: exp.Select
    options: Mapping[str, object] = field(default_factory=dict)
    verbose: bool = False  # EXPLAIN VERBOSE (or PostgreSQL's EXPLAIN (VERBOSE)): every figure


# EXPLAIN's one option, as PostgreSQL spells it: VERBOSE, or (VERBOSE [TRUE|ON|FALSE|OFF]).
_VERBOSE = re.compile(
    r"\s*(?:VERBOSE\b|\(\s*VERBOSE(?:\s+(TRUE|ON|FALSE|OFF|1|0))?\s*\))", re.IGNORECASE
)


def _verbose(text: str) -> tuple[str, bool]:
    """The text after EXPLAIN's option, and whether it asks for VERBOSE."""
    found = _VERBOSE.match(text)
    if found is None:
        return text, False
    return text[found.end() :], (found.group(1) or "true").upper() in ("TRUE", "ON", "1")


@dataclass(frozen=True)
class SetOption:
    """``SET dpsql.name = value`` (value is the literal's text, or None for DEFAULT)."""

    name: str
    value: str | None


@dataclass(frozen=True)
class ShowOption:
    """``SHOW dpsql.name`` (or ``SHOW dpsql.all``)."""

    name: str


@dataclass(frozen=True)
class EstimateBounds:
    """``ESTIMATE BOUNDS FOR table.column``: DP clamping bounds from the data (charged);
    ``ESTIMATE BOUNDS FOR table [GROUP BY key, ...]`` (``column`` None): DP contribution bounds,
    R without keys, L0 and C with them."""

    table: str
    column: str | None = None
    keys: tuple[str, ...] = ()
    # ``FOR EPSILON e``: aimed at queries at epsilon e (the bias-noise trade-off); ``AT QUANTILE
    # q``: each contribution bound at the q quantile of the units' values. Neither: the trade-off
    # at the session's epsilon for contribution bounds, today's rule for clamps.
    target: Fraction | None = None
    quantile: Fraction | None = None


@dataclass(frozen=True)
class ReadView:
    """``VIEW name`` (each period the view released) or ``VIEW name FROM 'start' TO 'end'``
    (one range of its periods): read from released values, free (``dpsql.session.views``)."""

    name: str
    start: str | None = None
    end: str | None = None
    explain: bool = False  # ``EXPLAIN VIEW name``: how it is released and what it costs


Statement = Query | Explain | SetOption | ShowOption | EstimateBounds | ReadView
_VIEW_FORMS = "write VIEW name, or VIEW name FROM 'YYYY-MM-DD' TO 'YYYY-MM-DD'"


def _parse_view(tokens: list[Token]) -> ReadView:
    if not tokens or not _is_name(tokens[0]):
        raise ParseError(f"VIEW needs a view's name: {_VIEW_FORMS}")
    name, rest = tokens[0].text, tokens[1:]
    if not rest:
        return ReadView(name)
    words = [t.text.upper() for t in rest]
    strings = [t.token_type == TokenType.STRING for t in rest]
    if len(rest) != 4 or words[0] != "FROM" or words[2] != "TO" or not (strings[1] and strings[3]):
        raise ParseError(f"VIEW takes a name and an optional range: {_VIEW_FORMS}")
    return ReadView(name, rest[1].text, rest[3].text)


_ESTIMATE_FORMS = (
    "write ESTIMATE BOUNDS FOR table.column (clamping bounds), ESTIMATE BOUNDS FOR table "
    "(a row cap) or ESTIMATE BOUNDS FOR table GROUP BY column, ... (group and row caps), "
    "each optionally followed by FOR EPSILON e or AT QUANTILE q"
)
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")


def _is_name(token: Token) -> bool:
    """A quoted identifier, or a bare word (``day`` and other keywords included)."""
    return token.token_type == TokenType.IDENTIFIER or (
        token.token_type not in (TokenType.FOR, TokenType.GROUP_BY)
        and _WORD.fullmatch(token.text) is not None
    )


_TAILS = "FOR EPSILON e (aimed at queries at epsilon e) or AT QUANTILE q"


def _tail(tokens: list[Token]) -> tuple[list[Token], Fraction | None, Fraction | None]:
    """The statement's tokens before ``FOR EPSILON e`` or ``AT QUANTILE q``, and e or q."""
    for i, token in enumerate(tokens):
        # After BOUNDS FOR table: a tail follows a name, never a comma or GROUP BY.
        after_name = i > 2 and tokens[i - 1].token_type not in (TokenType.COMMA,
                                                                 TokenType.GROUP_BY)  # fmt: skip
        is_for = token.token_type == TokenType.FOR
        is_at = token.text.upper() == "AT" and token.token_type != TokenType.IDENTIFIER
        if not (is_for or is_at) or not after_name:
            continue
        word = "EPSILON" if is_for else "QUANTILE"
        tail = tokens[i + 1 :]
        if len(tail) != 2 or tail[0].text.upper() != word or tail[1].token_type != TokenType.NUMBER:
            raise ParseError(f"ESTIMATE BOUNDS ends with {_TAILS}, a number literal")
        try:
            value = Fraction(tail[1].text) if len(tail[1].text) <= 32 else None
        except ValueError:
            value = None
        if value is None:
            raise ParseError(f"ESTIMATE BOUNDS ends with {_TAILS}, a number literal")
        return tokens[:i], (value if is_for else None), (None if is_for else value)
    return tokens, None, None


def _parse_estimate(tokens: list[Token]) -> EstimateBounds:
    tokens, target, quantile = _tail(tokens)
    statement = _parse_estimate_target(tokens)
    if target is not None and not 0 < target <= 20:
        raise ParseError("ESTIMATE BOUNDS ... FOR EPSILON takes an epsilon in (0, 20]")
    if quantile is not None:
        if statement.column is not None:
            raise ParseError("ESTIMATE BOUNDS FOR table.column has no AT QUANTILE form")
        if not Fraction(1, 2) <= quantile < 1:
            raise ParseError("ESTIMATE BOUNDS ... AT QUANTILE takes a quantile in [0.5, 1)")
    return replace(statement, target=target, quantile=quantile)


def _parse_estimate_target(tokens: list[Token]) -> EstimateBounds:
    if not tokens or tokens[0].text.upper() != "BOUNDS":
        raise ParseError(f"ESTIMATE is incomplete: {_ESTIMATE_FORMS}")
    rest = tokens[1:]
    if not rest or rest[0].token_type != TokenType.FOR:
        raise ParseError(f"ESTIMATE BOUNDS needs FOR: {_ESTIMATE_FORMS}")
    rest = rest[1:]
    if not rest or not _is_name(rest[0]):
        raise ParseError(f"ESTIMATE BOUNDS FOR needs a table name: {_ESTIMATE_FORMS}")
    table, rest = rest[0].text.lower(), rest[1:]
    if not rest:
        return EstimateBounds(table)
    if rest[0].token_type == TokenType.DOT:
        if len(rest) == 2 and _is_name(rest[1]):
            return EstimateBounds(table, rest[1].text.lower())
        raise ParseError(f"ESTIMATE BOUNDS FOR table.column takes one column: {_ESTIMATE_FORMS}")
    if rest[0].token_type != TokenType.GROUP_BY:
        raise ParseError(f'ESTIMATE BOUNDS: unexpected "{rest[0].text[:30]}": {_ESTIMATE_FORMS}')
    names = rest[1:]
    keys = tuple(t.text.lower() for t in names[::2])
    separators = names[1::2]
    if (
        not names
        or len(names) % 2 == 0
        or any(not _is_name(t) for t in names[::2])
        or any(t.token_type != TokenType.COMMA for t in separators)
    ):
        raise ParseError(
            "ESTIMATE BOUNDS ... GROUP BY takes column names separated by commas "
            "(no expressions, positions or aliases)"
        )
    if len(set(keys)) != len(keys):
        raise ParseError("ESTIMATE BOUNDS ... GROUP BY names a column twice")
    return EstimateBounds(table, None, keys)


def _tokens(text: str) -> list[Token]:
    try:
        tokens = [
            t for t in sqlglot.tokenize(text, read=DIALECT) if t.token_type != TokenType.SEMICOLON
        ]
    except TokenError as exc:
        raise ParseError(f"cannot read the SQL text: {_first_line(str(exc))}") from None
    for token in tokens:
        number = token.token_type == TokenType.NUMBER
        if number and _expanded_length(token.text) > MAX_NUMBER_DIGITS:
            raise ParseError(
                f"a number literal is longer than {MAX_NUMBER_DIGITS} digits written out",
                token.line,
                token.col,
            )
    return tokens


def _expanded_length(text: str) -> int:
    """How many digits ``text`` (a number token) has written out without an exponent."""
    match = _NUMBER.fullmatch(text)
    if match is None:  # hexadecimal or another notation: as long as it is written
        return len(text)
    whole, fraction, exponent = match.group(1), match.group(2) or "", match.group(3) or "0"
    if len(exponent) > 6:  # read as text: int() of 4,300 digits or more raises ValueError
        return MAX_NUMBER_DIGITS + 1
    return len(whole) + len(fraction) + int(exponent.replace("_", "") or 0)


def _first_line(message: str) -> str:
    return message.splitlines()[0] if message else "syntax error"


def _option_name(tokens: list[Token], command: str) -> tuple[str, list[Token]]:
    """Read ``dpsql.name`` from the front of ``tokens``; return the name and the rest."""
    if (
        len(tokens) < 3
        or tokens[0].text.lower() != "dpsql"
        or tokens[1].token_type != TokenType.DOT
        or tokens[2].token_type not in (TokenType.VAR, TokenType.ALL)
    ):
        raise UnsupportedQueryError(
            f"{command} is only supported for dpsql settings, e.g. {command} dpsql.epsilon"
        )
    return tokens[2].text.lower(), tokens[3:]


def _parse_set(tokens: list[Token]) -> SetOption:
    name, rest = _option_name(tokens, "SET")
    if rest and (rest[0].token_type == TokenType.EQ or rest[0].text.upper() == "TO"):
        rest = rest[1:]
    if len(rest) == 2 and rest[0].token_type == TokenType.DASH:
        return SetOption(name, "-" + rest[1].text)
    if len(rest) != 1:
        raise ParseError(f"SET dpsql.{name} takes one value, e.g. SET dpsql.{name} = 0.5")
    token = rest[0]
    if token.token_type == TokenType.DEFAULT or token.text.upper() == "DEFAULT":
        return SetOption(name, None)
    if token.token_type in (TokenType.TRUE, TokenType.FALSE, TokenType.ON):
        return SetOption(name, token.text.lower())  # SET dpsql.fresh = true (or on)
    if token.token_type not in (TokenType.NUMBER, TokenType.STRING, TokenType.VAR):
        raise ParseError(f"SET dpsql.{name} takes a number or a quoted string")
    return SetOption(name, token.text)


def parse_statement(text: str) -> Statement:
    """Parse exactly one statement, raising ``ParseError`` or ``UnsupportedQueryError``."""
    if not isinstance(text, str):
        raise ParseError("the query must be a string")
    if len(text) > MAX_QUERY_LENGTH:
        raise ParseError(f"the query is longer than {MAX_QUERY_LENGTH} characters")
    tokens = _tokens(text)
    if not tokens:
        raise ParseError("empty query")
    head = tokens[0].text.upper()
    # The tokenizer reads RESET, SHOW and EXPLAIN as commands whose argument is the raw rest of
    # the text; tokenize that rest again as SQL.
    rest_text = text[tokens[0].end + 1 :]
    if head == "SET":
        return _parse_set(tokens[1:])
    if head in ("RESET", "SHOW"):
        name, rest = _option_name(_tokens(rest_text), head)
        if rest:
            raise ParseError(f"{head} takes one setting name")
        return SetOption(name, None) if head == "RESET" else ShowOption(name)
    if head == "EXPLAIN":
        rest = _tokens(rest_text)
        if rest and rest[0].text.upper() == "VIEW":
            view = _parse_view(rest[1:])
            if view.start is not None:
                raise ParseError("EXPLAIN VIEW takes a view's name only")
            return replace(view, explain=True)
        rest_text, verbose = _verbose(rest_text)
        rest_text, options = split_options(rest_text)
        return Explain(parse_select(rest_text), options, verbose)
    if head == "ESTIMATE":
        return _parse_estimate(tokens[1:])
    if head == "VIEW":
        return _parse_view(tokens[1:])
    text, options = split_options(text)
    return Query(parse_select(text), options)


def parse_select(text: str) -> exp.Select:
    """Parse text that must be a single SELECT statement (with BigQuery's ``WITH
    DIFFERENTIAL_PRIVACY OPTIONS(...)`` clause already taken off: ``dpsql.sql.options``)."""
    try:
        statements = sqlglot.parse(text, read=DIALECT)
    except GlotParseError as exc:
        detail = exc.errors[0] if exc.errors else {}
        raise ParseError(syntax_message(detail), detail.get("line"), detail.get("col")) from None
    except TokenError as exc:
        raise ParseError(f"cannot read the SQL text: {_first_line(str(exc))}") from None
    except RecursionError:
        raise ParseError("the query is nested too deeply") from None
    statements = [s for s in statements if s is not None]
    if len(statements) != 1:
        raise ParseError("send exactly one statement at a time")
    statement = statements[0]
    if not isinstance(statement, _STATEMENTS):
        raise ParseError("syntax error: expected a SELECT statement")
    if isinstance(statement, exp.SetOperation):
        raise UnsupportedQueryError(
            f"{statement_kind(statement)} of whole queries is not supported: a set operation is "
            "answered only as a FROM-subquery or a CTE that a query aggregates"
        )
    if not isinstance(statement, exp.Select):
        raise UnsupportedQueryError(
            f"{statement_kind(statement)} statements are not supported: dpsql answers SELECT "
            "queries (and SET/SHOW/RESET dpsql.*, EXPLAIN and ESTIMATE BOUNDS)"
        )
    return statement


# What sqlglot's node names mean to a person, for "the ... is incomplete".
_CONSTRUCTS = {
    "eq": "comparison", "neq": "comparison", "gt": "comparison", "gte": "comparison",
    "lt": "comparison", "lte": "comparison", "like": "LIKE", "in": "IN list",
    "where": "WHERE clause", "having": "HAVING clause", "group": "GROUP BY",
    "order": "ORDER BY", "limit": "LIMIT", "join": "JOIN", "from": "FROM clause",
    "and": "AND condition", "or": "OR condition", "not": "NOT", "add": "arithmetic",
    "sub": "arithmetic", "mul": "arithmetic", "div": "arithmetic", "cast": "CAST",
    "case": "CASE", "if": "CASE", "between": "BETWEEN", "alias": "alias", "with": "WITH",
    "cte": "WITH", "select": "SELECT", "subquery": "subquery", "is": "IS",
}  # fmt: skip
_REQUIRED = re.compile(r"Required keyword: '\w+' missing for <class '[\w.]*?(\w+)'>")
_EXPECTING = re.compile(r"^Expecting (.{1,20})$")


def syntax_message(detail: Mapping[str, object]) -> str:
    """A syntax error as PostgreSQL words it, ``syntax error at or near "x"``, with what was
    expected when that is clear, and never the parser's internals (class names, its own
    wording of tokens). The quoted text is the query's own, cut to 30 characters."""
    near = " ".join(str(detail.get("highlight") or "").split())
    where = f' at or near "{near[:30]}{"..." if len(near) > 30 else ""}"' if near else ""
    description = str(detail.get("description") or "")
    hint = ""
    if (found := _REQUIRED.search(description)) is not None:
        construct = _CONSTRUCTS.get(found.group(1).lower())
        hint = f"; the {construct} is incomplete" if construct else "; something is missing"
    elif (found := _EXPECTING.match(description)) is not None:
        hint = f"; expected {found.group(1)}"
    elif "number of provided arguments" in description:
        few = "less than the minimum" in description
        hint = f"; too {'few' if few else 'many'} arguments for the function"
    elif description.startswith("Expected ") and "<" not in description:
        hint = "; " + description[0].lower() + description[1:]
    return f"syntax error{where}{hint}"


def statement_kind(node: exp.Expression) -> str:
    """A user-facing name for the kind of a top-level statement."""
    if isinstance(node, exp.Command):
        return str(node.this).upper()
    if isinstance(node, exp.Union):
        return "UNION"
    if isinstance(node, exp.Except):
        return "EXCEPT"
    if isinstance(node, exp.Intersect):
        return "INTERSECT"
    return node.key.upper()
