"""What the shell reads: when an input is complete, its statements, and its completions.

``is_complete`` decides on sqlglot's token stream whether an input is ready to run (a ``;``
inside a string or a comment ends nothing), ``split_statements`` cuts it at its semicolon
tokens, and ``SqlCompleter`` offers keywords, the policy's tables and columns, dpsql settings
and the meta-commands. ``META`` is the table of meta-commands (names, arguments, help), shared
by the completer and ``Shell``'s ``\\help`` (``shell_core.py``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence

import sqlglot
from prompt_toolkit.completion import CompleteEvent, Completer, Completion
from prompt_toolkit.document import Document
from sqlglot.errors import TokenError
from sqlglot.tokenizer_core import TokenType

from dpsql.session.settings import NAMES
from dpsql.sql.parse import DIALECT

__all__ = [
    "DEFAULT_LEDGER_ROWS",
    "KEYWORDS",
    "META",
    "SqlCompleter",
    "is_complete",
    "split_statements",
]

DEFAULT_LEDGER_ROWS = 10
KEYWORDS = (
    "SELECT", "FROM", "WHERE", "GROUP BY", "HAVING", "ORDER BY", "LIMIT", "OFFSET", "AS", "AND",
    "OR", "NOT", "IN", "IS", "NULL", "BETWEEN", "LIKE", "CASE", "WHEN", "THEN", "ELSE", "END",
    "COUNT", "SUM", "AVG", "MIN", "MAX", "DISTINCT", "ASC", "DESC", "CAST", "COALESCE",
    "EXPLAIN", "SET", "SHOW", "RESET", "DEFAULT", "TRUE", "FALSE",
)  # fmt: skip
META = {
    "\\budget": ("[compare]", "spent and remaining budget (compare: under every theorem)"),
    "\\ledger": ("[N]", f"the last N ledger records (default {DEFAULT_LEDGER_ROWS})"),
    "\\explain": ("[VERBOSE] QUERY", "the plan and cost of QUERY; nothing is charged"),
    "\\tables": ("", "the tables of the policy"),
    "\\describe": ("TABLE", "columns, types, bounds and public domains of TABLE"),
    "\\cache": ("", "the released answers the cache can serve again at no charge"),
    "\\diagnose": ("[on|off]", "toggle a diagnosis of how much the bounds cut (costs epsilon)"),
    "\\help": ("", "this help"),
    "\\quit": ("", "leave the shell (also Ctrl-D)"),
}
_SET_NAME = re.compile(r"(?is)\b(set|show|reset)\s+dpsql\.(\w*)$")
_DESCRIBE = re.compile(r"(?s)^\s*\\describe\s+(\w*)$")
_WORD = re.compile(r"[\w\\]*$")


def is_complete(text: str) -> bool:
    """Whether ``text`` is ready to run: blank, a meta-command, or SQL whose last token is a
    semicolon (a ``;`` inside a string or a comment does not end the input)."""
    stripped = text.strip()
    if not stripped or stripped.startswith("\\") or stripped.lower() in ("quit", "exit"):
        return True
    try:
        tokens = sqlglot.tokenize(stripped, read=DIALECT)
    except TokenError:
        return False  # an unclosed quote or comment: keep reading
    return bool(tokens) and tokens[-1].token_type == TokenType.SEMICOLON


def split_statements(text: str) -> list[str]:
    """The statements of ``text`` cut at its semicolon tokens (not at ``;`` in strings)."""
    try:
        tokens = sqlglot.tokenize(text, read=DIALECT)
    except TokenError:
        return [text.strip()]  # let the session report the error
    parts, start = [], 0
    for token in tokens:
        if token.token_type == TokenType.SEMICOLON:
            parts.append(text[start : token.start].strip())
            start = token.end + 1
    parts.append(text[start:].strip())
    return [part for part in parts if part]


class SqlCompleter(Completer):
    """Keywords, tables and columns of the policy's catalog; dpsql settings after ``SET dpsql.``;
    meta-commands after a backslash, and table names after ``\\describe``."""

    def __init__(self, tables: Sequence[str], columns: dict[str, Sequence[str]]):
        self.tables = sorted(tables)
        self.columns = columns

    def get_completions(
        self, document: Document, complete_event: CompleteEvent
    ) -> Iterable[Completion]:
        before = document.text_before_cursor
        setting = _SET_NAME.search(before)
        if setting:
            names = [*NAMES, "budget", "all"] if setting.group(1).lower() == "show" else NAMES
            yield from _matches(setting.group(2), names, "setting")
            return
        described = _DESCRIBE.search(before)
        if described:
            yield from _matches(described.group(1), self.tables, "table")
            return
        word = _WORD.search(before)
        prefix = word.group(0) if word else ""
        if prefix.startswith("\\"):
            if before.strip() == prefix:
                yield from _matches(prefix, list(META), "meta-command")
            return
        if not prefix:
            return
        yield from _matches(prefix, self.tables, "table")
        for table in self.tables:
            yield from _matches(prefix, self.columns.get(table, ()), f"column of {table}")
        words = [k.lower() if prefix.islower() else k for k in KEYWORDS]
        yield from _matches(prefix, words, "keyword")


def _matches(prefix: str, names: Iterable[str], meta: str) -> Iterator[Completion]:
    for name in names:
        if name.lower().startswith(prefix.lower()) and name.lower() != prefix.lower():
            yield Completion(name, start_position=-len(prefix), display_meta=meta)
