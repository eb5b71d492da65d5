"""Split a text of several SQL statements on the tokenizer's semicolons (``dpsql run`` and the
simple query protocol of ``dpsql serve``).

The text is tokenized a window at a time, never whole: a token costs about a hundred times
the text it covers, so a 16 MiB file of ``1;1;1;...`` tokenized at once would take gigabytes.
Each window starts at a statement boundary. Every semicolon token of a window, up to where its
tokenization fails (an unterminated string or comment that the window's end cuts), is a
semicolon of the whole text: sqlglot's tokenizer reads left to right, and no token depends on
the text after it but for one character of look-ahead, so a semicolon in a window's last
character waits for the next window. A statement longer than ``MAX_STATEMENT_LENGTH`` is
refused before it is parsed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import TokenError
from sqlglot.tokenizer_core import Token, TokenType

from dpsql.errors import ParseError
from dpsql.sql.parse import DIALECT, MAX_QUERY_LENGTH

# One statement of a file may be as long as one query sent alone.
MAX_STATEMENT_LENGTH = MAX_QUERY_LENGTH
_WINDOW = 1 << 16  # characters tokenized at a time, grown for a statement that needs more
_SPACES = re.compile(r"[ \t\n\r\f\v]*")


@dataclass(frozen=True)
class Piece:
    """One statement of a file: its position (1-based) and line, and its text."""

    number: int
    line: int
    text: str


def _line_breaks(text: str, start: int, end: int) -> int:
    """Line breaks in ``text[start:end]``: a ``\\n``, a ``\\r``, and a ``\\r\\n`` once; a
    piece's line is the line where its first token starts."""
    return (
        text.count("\n", start, end) + text.count("\r", start, end) - text.count("\r\n", start, end)
    )


def _tokens(window: str) -> tuple[list[Token], TokenError | None]:
    """The tokens of ``window`` up to where its tokenization fails, and the failure if any."""
    tokenizer = Dialect.get_or_raise(DIALECT).tokenizer()
    try:
        return tokenizer.tokenize(window), None
    except TokenError as exc:
        # The tokens read before the failure stand: the failing construct starts after them.
        return list(tokenizer.tokens), exc


def _look_ahead(tokens: list[Token], window: str) -> int:
    """Where the window's tokens stop standing for the whole text's: at a ``$`` read as a
    parameter because the scan for its tag's closing ``$`` reached the window's end. DuckDB's
    tokenizer opens a dollar-quoted string ``$tag$ ... $tag$`` at a ``$`` when the tag's
    closing ``$`` is found before the text ends, and reads a parameter otherwise: with the text
    after the window, that ``$`` may open a string that runs over the window's later
    semicolons (``$$q;$$`` cut after ``$$q;``)."""
    for token in tokens:
        if token.token_type == TokenType.PARAMETER and window[token.start] == "$":
            closing = window.find("$", token.start + 1)
            if closing == -1 or closing >= len(window) - 1:
                return token.start
    return len(window)


def _statements(text: str, base: int, end: int) -> tuple[list[tuple[int, int]], int | None]:
    """The statements that the window ``text[base:end]`` ends, as the offsets of their first
    token and of their semicolon, and the offset after the last such semicolon (None when the
    window ends none). At the end of the text, the rest is the last statement."""
    whole = end == len(text)
    window = text[base:end]
    tokens, error = _tokens(window)
    trusted = end if whole else _look_ahead(tokens, window) + base
    cut = [
        i for i, t in enumerate(tokens)
        if t.token_type == TokenType.SEMICOLON and (whole or base + t.end < min(end - 1, trusted))
    ]  # fmt: skip
    if not cut and not whole:
        return [], None
    if error is not None and not cut:
        raise ParseError(f"cannot read the SQL file: {str(error).splitlines()[0]}") from None
    spans: list[tuple[int, int]] = []
    first: int | None = None
    for token in tokens[: cut[-1] + 1] if cut else [*tokens, None]:
        if token is not None and token.token_type != TokenType.SEMICOLON:
            first = base + token.start if first is None else first
            continue
        if first is not None:
            spans.append((first, base + token.start if token is not None else len(text)))
        first = None
    return spans, base + tokens[cut[-1]].end + 1 if cut else len(text)


def split_statements(text: str, max_length: int = MAX_STATEMENT_LENGTH) -> list[Piece]:
    """The statements of ``text``, split on the tokenizer's semicolons (never on one inside a
    string or a comment); empty statements are dropped. A statement longer than
    ``max_length`` characters is a ``ParseError`` naming its number and line."""
    pieces: list[Piece] = []
    base, line, size = 0, 1, _WINDOW  # base: where the window starts; line: the line of base
    while True:
        start = _SPACES.match(text, base).end()  # type: ignore[union-attr]  # always matches
        line, base = line + _line_breaks(text, base, start), start
        if base >= len(text):
            return pieces
        end = min(len(text), base + size)
        spans, after = _statements(text, base, end)
        if after is None:
            if end - base > max_length + 1:  # no statement end within max_length characters
                window = text[base:end]
                dollar = _look_ahead(_tokens(window)[0], window)
                if dollar < len(window):
                    # A semicolon after it is not known to end a statement: ``_look_ahead``.
                    raise ParseError(
                        f"statement {len(pieces) + 1} (line "
                        f"{line + _line_breaks(text, base, base + dollar)}): a $ outside a "
                        f"string is not closed within {max_length} characters, so where the "
                        "statement ends depends on a dollar-quoted string that may follow; "
                        "put the $ inside a quoted string"
                    )
                raise ParseError(
                    f"statement {len(pieces) + 1} (line {line}) is longer than {max_length} "
                    "characters"
                )
            size = min(2 * size, max_length + 2)
            continue
        position, at = base, line
        for first, stop in spans:
            position, at = first, at + _line_breaks(text, position, first)
            piece = text[first:stop].strip()
            if len(piece) > max_length:
                raise ParseError(
                    f"statement {len(pieces) + 1} (line {at}) is longer than {max_length} "
                    "characters"
                )
            pieces.append(Piece(len(pieces) + 1, at, piece))
        line, base, size = at + _line_breaks(text, position, after), after, _WINDOW
