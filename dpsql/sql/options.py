"""BigQuery's per-query privacy clause, ``SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(...)``.

sqlglot reads no dialect that accepts the clause, so ``OptionsDialect`` extends DuckDB's: its
parser reads the clause right after ``SELECT`` (where the hint of other dialects sits) into a
``DifferentialPrivacy`` node, and its generator writes it back, so the clause round-trips.
Strings and comments cannot confuse it: it works on the parser's tokens. Everything else
parses exactly as in DuckDB.

``pop_options`` takes the clause off a parsed SELECT and maps its keys onto dpsql's settings
(the table ``KEYS``); unknown or repeated keys are a ``ParameterError`` naming the key. Values
are kept as their literal text: the session validates them with the same code as ``SET``.

>>> import sqlglot
>>> select, options = pop_options(sqlglot.parse_one(
...     "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1, max_groups_contributed=2) "
...     "COUNT(*) FROM visits", read=OptionsDialect))
>>> select.sql(dialect="duckdb"), dict(options)
('SELECT COUNT(*) FROM visits', {'epsilon': '1', 'max_groups_per_unit': '2'})
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, ClassVar

from sqlglot import exp
from sqlglot.dialects.duckdb import DuckDB
from sqlglot.generators.duckdb import DuckDBGenerator
from sqlglot.parsers.duckdb import DuckDBParser
from sqlglot.tokenizer_core import TokenType

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
        "mechanism": "mechanism",
        "rho": "rho",
        "sigma": "sigma",
        "confidence": "confidence",
    }
)
# Checked against the policy's privacy unit of the query's table, never a setting.
PRIVACY_UNIT = "privacy_unit_column"
_HINTS = {
    "group_selection_strategy": "dpsql chooses public or private group selection from the "
    "policy and the GROUP BY keys (see docs/sql.md)",
}
EMPTY: Mapping[str, object] = MappingProxyType({})


class DifferentialPrivacy(exp.Hint):
    """``WITH DIFFERENTIAL_PRIVACY [OPTIONS(key = value, ...)]``; ``expressions`` are ``EQ``s."""

    arg_types: ClassVar[dict[str, bool]] = {"expressions": False}


class _Parser(DuckDBParser):
    def _parse_hint(self) -> exp.Hint | None:
        index = self._index
        if self._match(TokenType.WITH) and self._match_text_seq("DIFFERENTIAL_PRIVACY"):
            pairs: list[exp.Expr] = []
            if self._match_text_seq("OPTIONS"):
                self._match_l_paren()
                pairs = [p for p in self._parse_csv(self._parse_assignment) if p is not None]
                self._match_r_paren()
            return self.expression(DifferentialPrivacy(expressions=pairs))
        self._retreat(index)
        return super()._parse_hint()


def _clause_sql(generator: DuckDBGenerator, expression: DifferentialPrivacy) -> str:
    return f" WITH DIFFERENTIAL_PRIVACY OPTIONS({generator.expressions(expression, flat=True)})"


class _Generator(DuckDBGenerator):
    TRANSFORMS: ClassVar[dict[type[exp.Expr], Callable[..., str]]] = {
        **DuckDBGenerator.TRANSFORMS,
        DifferentialPrivacy: _clause_sql,
    }


class OptionsDialect(DuckDB):
    """DuckDB, plus BigQuery's ``WITH DIFFERENTIAL_PRIVACY OPTIONS(...)`` after ``SELECT``."""

    Parser = _Parser
    Generator = _Generator


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


def _pairs(clause: DifferentialPrivacy) -> dict[str, object]:
    options: dict[str, object] = {}
    for pair in clause.expressions:
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


def pop_options(select: exp.Select) -> tuple[exp.Select, Mapping[str, object]]:
    """The SELECT without its ``WITH DIFFERENTIAL_PRIVACY`` clause (a copy), and the clause's
    options by dpsql setting name (plus ``privacy_unit_column`` when given)."""
    clause = select.args.get("hint")
    nested = [n for n in select.find_all(DifferentialPrivacy) if n is not clause]
    if nested:
        raise ParseError("WITH DIFFERENTIAL_PRIVACY belongs right after the outer SELECT")
    if not isinstance(clause, DifferentialPrivacy):
        return select, EMPTY
    options = _pairs(clause)
    bare = select.copy()
    bare.set("hint", None)
    return bare, MappingProxyType(options)


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
    "DifferentialPrivacy",
    "OptionsDialect",
    "check_privacy_unit",
    "merge_options",
    "pop_options",
]
