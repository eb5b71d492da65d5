"""Split a text of several SQL statements on the tokenizer's semicolons (``dpsql run`` and the
simple query protocol of ``dpsql serve``)."""

from __future__ import annotations

from dataclasses import dataclass

import sqlglot
from sqlglot.errors import TokenError
from sqlglot.tokenizer_core import TokenType

from dpsql.errors import ParseError
from dpsql.sql.parse import DIALECT


@dataclass(frozen=True)
class Piece:
    """One statement of a file: its position (1-based) and line, and its text."""

    number: int
    line: int
    text: str


def split_statements(text: str) -> list[Piece]:
    """The statements of ``text``, split on the tokenizer's semicolons (never on one inside a
    string or a comment); empty statements are dropped."""
    try:
        tokens = sqlglot.tokenize(text, read=DIALECT)
    except TokenError as exc:
        raise ParseError(f"cannot read the SQL file: {str(exc).splitlines()[0]}") from None
    pieces: list[Piece] = []
    start: int | None = None  # offset of the current statement's first token
    line = 1
    for token in [*tokens, None]:
        if token is None or token.token_type == TokenType.SEMICOLON:
            if start is not None:
                end = token.start if token is not None else len(text)
                pieces.append(Piece(len(pieces) + 1, line, text[start:end].strip()))
            start = None
        elif start is None:
            start, line = token.start, token.line
    return pieces
