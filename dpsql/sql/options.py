"""BigQuery's per-query privacy clause, ``SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(...)``.

sqlglot reads no dialect that accepts the clause, so ``split_options`` takes it off the SQL text
before the text is parsed as DuckDB: it finds the clause on the tokenizer's tokens (so strings
and comments cannot confuse it) right after the outer ``SELECT``, blanks its characters (so
every line and column of the rest of the text, and of any syntax error in it, stay where they
were), and reads the option pairs with DuckDB's own parser. Everything else parses exactly as
in DuckDB, with no extended dialect (sqlglot's compiled build cannot be subclassed).

The options are mapped onto dpsql's settings (the table ``KEYS``); unknown or repeated keys are
a ``ParameterError`` naming the key. Values are kept as their literal text: the session
validates them with the same code as ``SET``.

>>> text, options = split_options(
...     "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1, max_groups_contributed=2) "
...     "COUNT(*) FROM visits")
>>> " ".join(text.split()), dict(options)
('SELECT COUNT(*) FROM visits', {'epsilon': '1', 'max_groups_per_unit': '2'})
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError as GlotParseError
from sqlglot.errors import TokenError
from sqlglot.tokenizer_core import Token, TokenType

from dpsql.errors import ParameterError, ParseError

# BigQuery's documented key, or dpsql's own setting name -> the dpsql setting it sets.
KEYS: Mapping[str, str] = MappingProxyType(
    {
        "epsilon": "epsilon",
        "delta": "delta",
        "max_groups_contributed": "max_groups_per_unit",
        "max_groups_per_unit": "max_groups_per_unit",
        "max_rows_per_unit_per_group": "max_rows_per_unit_per_group",
        # BigQuery's max_rows_contributed bounds a unit's rows across all groups: dpsql's R.
        "max_rows_contributed": "max_rows_per_unit",
        "max_rows_per_unit": "max_rows_per_unit",
        "bounds": "bounds",
        "bounds_share": "bounds_share",
        "mechanism": "mechanism",
        "rho": "rho",
        "sigma": "sigma",
        "confidence": "confidence",
        # dpsql's own: one group per public key for the rows outside its domain.
        "other_group": "other_group",
        "other_label": "other_label",
        "diagnose": "diagnose",
        "diagnose_epsilon": "diagnose_epsilon",
        "split": "split",
        "moments": "moments",
        # Accuracy targets: the cheapest epsilon that meets them (dpsql.plan.targets).
        "halfwidth": "halfwidth",
        "rank_error": "rank_error",
        "min_group": "min_group",
        # A unit-level Poisson sample of the query's table (dpsql.analyze.sample).
        "sample_rate": "sample_rate",
        "sample_scale": "sample_scale",
    }
)
# Checked against the policy's privacy unit of the query's table, never a setting.
PRIVACY_UNIT = "privacy_unit_column"
_HINTS = {
    "group_selection_strategy": "dpsql chooses public or private group selection from the "
    "policy and the GROUP BY keys (see docs/sql.md)",
}
EMPTY: Mapping[str, object] = MappingProxyType({})


def _value(node: exp.Expression, key: str) -> str:
    """The literal text of an option value (a number, a string, or a column for the unit)."""
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal):
        return "-" + str(node.this.this)
    if isinstance(node, exp.Literal):
        return str(node.this)
    if isinstance(node, exp.Boolean):
        return "true" if node.this else "false"
    if key == PRIVACY_UNIT and isinstance(node, exp.Column) and not node.table:
        return node.name
    raise ParseError(f"OPTIONS({key} = ...) takes a literal number or string")


def _pairs(expressions: list[exp.Expression]) -> dict[str, object]:
    options: dict[str, object] = {}
    for pair in expressions:
        if not isinstance(pair, exp.EQ) or not isinstance(pair.this, exp.Column):
            raise ParseError("OPTIONS(...) takes key = value pairs, e.g. OPTIONS(epsilon = 1)")
        key = pair.this.sql(dialect="duckdb").lower()
        if key != PRIVACY_UNIT and key not in KEYS:
            hint = _HINTS.get(key, f"known keys: {', '.join([*KEYS, PRIVACY_UNIT])}")
            raise ParameterError(f"unknown DIFFERENTIAL_PRIVACY option {key}; {hint}")
        name = KEYS.get(key, key)
        if name in options:
            raise ParameterError(f"DIFFERENTIAL_PRIVACY option {name} is given twice")
        options[name] = _value(pair.expression, key)
    return options


def _is_clause(tokens: list[Token], i: int) -> bool:
    """Whether ``tokens[i]`` is the WITH of ``SELECT WITH DIFFERENTIAL_PRIVACY``."""
    return (
        i > 0
        and i + 1 < len(tokens)
        and tokens[i].token_type == TokenType.WITH
        and tokens[i - 1].token_type == TokenType.SELECT
        and tokens[i + 1].text.upper() == "DIFFERENTIAL_PRIVACY"
    )


def _clause_end(tokens: list[Token], i: int) -> int:
    """The index of the last token of the clause whose WITH is ``tokens[i]``."""
    last = i + 1  # DIFFERENTIAL_PRIVACY
    if last + 1 < len(tokens) and tokens[last + 1].text.upper() == "OPTIONS":
        last += 1
        if last + 1 >= len(tokens) or tokens[last + 1].token_type != TokenType.L_PAREN:
            raise ParseError("OPTIONS must be followed by (key = value, ...)")
        depth = 0
        for j in range(last + 1, len(tokens)):
            if tokens[j].token_type == TokenType.L_PAREN:
                depth += 1
            elif tokens[j].token_type == TokenType.R_PAREN:
                depth -= 1
                if depth == 0:
                    return j
        raise ParseError("OPTIONS( is never closed")
    return last


def _options_of(text: str, tokens: list[Token], start: int, end: int) -> dict[str, object]:
    """The option pairs between the parentheses of ``tokens[start..end]``, read as a DuckDB
    select list (``epsilon = 1`` is an equality of a column and a literal there)."""
    if end - start < 3 or tokens[start + 2].text.upper() != "OPTIONS":
        return {}
    inner = text[tokens[start + 3].end + 1 : tokens[end].start]
    if not inner.strip():
        return {}
    try:
        select = sqlglot.parse_one("SELECT " + inner, read="duckdb")
    except (GlotParseError, TokenError, RecursionError):
        raise ParseError(
            "OPTIONS(...) takes key = value pairs, e.g. OPTIONS(epsilon = 1)"
        ) from None
    extra = any(v for k, v in select.args.items() if k != "expressions")
    if not isinstance(select, exp.Select) or extra:
        raise ParseError("OPTIONS(...) takes key = value pairs, e.g. OPTIONS(epsilon = 1)")
    return _pairs(list(select.expressions))


def split_options(text: str) -> tuple[str, Mapping[str, object]]:
    """``text`` with its ``WITH DIFFERENTIAL_PRIVACY [OPTIONS(...)]`` clause blanked out (each
    character but a line break becomes a space), and the clause's options by dpsql setting
    name (plus ``privacy_unit_column`` when given). A text without the clause comes back as it
    is. The clause must follow the outer SELECT, outside any parentheses, once."""
    if "differential_privacy" not in text.lower():
        return text, EMPTY
    try:
        tokens = sqlglot.tokenize(text, read="duckdb")
    except TokenError:
        return text, EMPTY  # the parser reports the text's own error
    depth, found = 0, list[int]()
    for i, token in enumerate(tokens):
        if token.token_type == TokenType.L_PAREN:
            depth += 1
        elif token.token_type == TokenType.R_PAREN:
            depth -= 1
        elif _is_clause(tokens, i):
            if depth != 0 or found:
                raise ParseError("WITH DIFFERENTIAL_PRIVACY belongs right after the outer SELECT")
            found.append(i)
    if not found:
        return text, EMPTY
    start = found[0]
    end = _clause_end(tokens, start)
    options = _options_of(text, tokens, start, end)
    first, last = tokens[start].start, tokens[end].end + 1
    blank = "".join(c if c in "\r\n" else " " for c in text[first:last])
    return text[:first] + blank + text[last:], MappingProxyType(options)


def merge_options(
    inline: Mapping[str, object], keywords: Mapping[str, object]
) -> dict[str, object]:
    """A statement's inline options under the call's keyword options: a keyword option that is
    given (not None) wins. ``privacy_unit_column`` is not a setting and is left out."""
    merged: dict[str, Any] = {k: v for k, v in inline.items() if k != PRIVACY_UNIT}
    merged.update({k: v for k, v in keywords.items() if v is not None})
    return merged


def check_privacy_unit(inline: Mapping[str, object], unit: str) -> None:
    """BigQuery's ``privacy_unit_column`` must name the policy's unit: the policy decides."""
    given = inline.get(PRIVACY_UNIT)
    if given is not None and str(given).lower() != unit.lower():
        shown = str(given) if len(str(given)) <= 64 else str(given)[:61] + "..."
        raise ParameterError(
            f"privacy_unit_column = {shown} is not the policy's privacy unit of this table "
            f"({unit}); the unit is set by the policy, not by the query"
        )


__all__ = [
    "EMPTY",
    "KEYS",
    "PRIVACY_UNIT",
    "check_privacy_unit",
    "merge_options",
    "split_options",
]
