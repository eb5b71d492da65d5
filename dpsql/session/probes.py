"""What only the engine can say about a query's constants, asked before the check.

A WHERE that pins a cell gets the cell's key (``dpsql.analyze.cells``, on a connection without
data), and each public GROUP BY key its engine type and its domain as values of that type
(``dpsql.analyze.domains``). Both read no rows, so they depend on the query and the schema only.
``Probes`` is a part of ``dpsql.session.session.Session``.
"""

from __future__ import annotations

import re
from dataclasses import replace

from dpsql.analyze.analysis import Analysis, GroupKey
from dpsql.analyze.cells import Cell
from dpsql.analyze.domains import probe_sql
from dpsql.analyze.scope import SIGNED_RANGES, _quote
from dpsql.bound.filters import key_sql, literal_sql
from dpsql.engine.base import Engine
from dpsql.errors import BoundsError, ParameterError, UnsupportedQueryError

_BARE_COLUMN = re.compile(r'"((?:[^"]|"")+)"')


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# The key types whose domains are deduplicated in Python (a HUGEINT key still asks the engine).
_INTEGER_RANGES = {t: r for t, r in SIGNED_RANGES.items() if t != "HUGEINT"}


def _integer_domain(engine_type: str, domain: tuple[object, ...]) -> list[str | None] | None:
    """The engine's distinct values of a domain of Python integers in a signed integer type:
    those in the type's range (TRY_CAST drops the rest), distinct, in numeric order, as their
    decimal text (DuckDB's CAST to VARCHAR), NULL last. None if any value is not an integer
    (a text '01', a float, a boolean): the engine decides what those spell."""
    low, high = _INTEGER_RANGES[engine_type]
    values: set[int] = set()
    for value in domain:
        if value is None:
            continue
        if type(value) is not int:
            return None
        if low <= value <= high:
            values.add(value)
    return [*(str(v) for v in sorted(values)), *([None] if None in domain else [])]


class Probes:
    """The engine's values of a query's constants: a part of ``Session``, over its engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def engine_values(
        self, analysis: Analysis, other: bool = False, label: str | None = None
    ) -> Analysis:
        """What only the engine can say about a query's constants, asked before the check
        (reading no rows, so it depends on the query and the schema only): the key of the cell
        a WHERE pins (``dpsql.analyze.cells``, on a connection without data; None composes
        sequentially), and each public key's type and domain as a set in that type
        (``dpsql.analyze.domains``). With ``other`` (``dpsql.other_group``), each public key also
        gets its other group, keyed ``label`` in the key's type (``other_text``)."""
        cell = None
        if analysis.cell_predicate is not None:
            column, literal = analysis.cell_predicate
            text = self.engine.cell_key(analysis.table, column, literal)
            if text is not None:
                collation = self.engine.collations.get((analysis.table, column))
                cell = Cell(column, text, collation)
        keys = []
        for index, key in enumerate(analysis.keys):
            if not key.public:
                keys.append(key)
                continue
            expression = key_sql(analysis, index)
            engine_type = self.key_type(analysis, expression)
            if engine_type.upper() == "NULL":
                raise UnsupportedQueryError(f"GROUP BY key {key.name} is NULL on every row")
            domain = key.domain
            if domain is not None:
                values = self.python_domain(analysis, expression, engine_type, domain)
                if values is None:
                    literals = [None if v is None else literal_sql(v) for v in domain]
                    probe = probe_sql(analysis.source, expression, engine_type, literals)
                    values = self.engine.key_domain(probe)
                domain = tuple(values)
                if not domain:
                    raise BoundsError(
                        f"the public domain of GROUP BY key {key.name} holds no value of the "
                        f"key's type {engine_type}"
                    )
            typed = replace(key, domain=domain, engine_type=engine_type)
            if other:
                text = self.other_text(analysis, index, typed, label)
                typed = replace(typed, other=True, other_text=text)
            keys.append(typed)
        return replace(analysis, cell=cell, keys=tuple(keys))

    def key_type(self, analysis: Analysis, expression: str) -> str:
        """The engine's type of a key expression over the query's relation: for a bare column
        of a table read directly on DuckDB, the type the engine's catalog gives that column (what
        DESCRIBE would bind it to, ``tests/analyze/test_check_types.py``), else the engine's
        DESCRIBE (about a millisecond). Either reads no rows."""
        bare = _BARE_COLUMN.fullmatch(expression)
        table = self.engine.catalog.get(analysis.table.lower(), {})
        direct = analysis.source == _quote(analysis.table)
        if bare is not None and direct and self.engine.name == "duckdb":
            column = bare.group(1).replace('""', '"').lower()
            if column in table:
                return table[column]
        ((_, engine_type),) = self.engine.describe(
            f"SELECT {expression} AS _k FROM {analysis.source}"
        )
        return engine_type

    def python_domain(
        self, analysis: Analysis, expression: str, engine_type: str, domain: tuple[object, ...]
    ) -> list[str | None] | None:
        """The engine's distinct values of a domain, known without asking it. Texts, for a
        bare VARCHAR column of a table read directly, with no collation, on DuckDB: distinct and
        sorted by code point (UTF-8's byte order, DuckDB's order of such a column), NULL last
        -- what ``probe_sql`` returns there, without its millisecond or two
        (``tests/analyze/test_key_domains.py`` compares the two on hostile texts). None elsewhere: a
        collation, a cast, a value of another type, or a text DuckDB may read otherwise (a NUL
        character, a lone surrogate) goes through the engine. A key of a signed integer type
        with a domain of Python integers (a date part, a CASE of integers, an integer column)
        is ``_integer_domain``."""
        if self.engine.name != "duckdb":
            return None
        if engine_type in _INTEGER_RANGES:
            return _integer_domain(engine_type, domain)
        bare = _BARE_COLUMN.fullmatch(expression)
        if engine_type != "VARCHAR" or bare is None or analysis.source != _quote(analysis.table):
            return None
        column = bare.group(1).replace('""', '"').lower()
        if self.engine.collations.get((analysis.table.lower(), column)) is not None:
            return None
        texts: set[str] = set()
        for value in domain:
            if value is None:
                continue
            if not isinstance(value, str) or "\x00" in value or not _encodes(value):
                return None
            texts.add(value)
        return [*sorted(texts), *([None] if None in domain else [])]

    def other_text(
        self, analysis: Analysis, index: int, key: GroupKey, label: str | None
    ) -> str | None:
        """The other group's key: the engine's text of ``label`` cast to the key's type, or
        None (NULL) without a label. It must not be a value of the domain *as the engine
        compares keys* (the domain's own deduplication, ``dpsql.analyze.domains``): else one group
        would hold both the domain value's rows and the others', released as the value. So the
        label is probed with the domain, under the key's type and collation, and a probe that
        finds no more values than the domain alone means a clash. Only the setting is named in
        an error, never a value. Reads no rows, like every probe."""
        setting = "dpsql.other_label"
        if key.domain is None:
            # A public table's values are not known when planning: no label can be checked.
            raise UnsupportedQueryError(
                f"dpsql.other_group needs the domain of GROUP BY key {key.name} listed in the "
                "policy or the query; it is held in a public table"
            )
        assert key.engine_type is not None
        if label is None:
            if None in key.domain:
                raise ParameterError(
                    f"the domain of GROUP BY key {key.name} lists NULL, so its other group "
                    f"needs a label: SET {setting}"
                )
            return None
        expression = key_sql(analysis, index)
        literal = literal_sql(label)
        alone = self.engine.key_domain(
            probe_sql(analysis.source, expression, key.engine_type, [literal])
        )
        if not alone:
            raise ParameterError(
                f"{setting} is not a value of the type {key.engine_type} of GROUP BY key {key.name}"
            )
        literals = [None if v is None else literal_sql(v) for v in key.domain]
        together = self.engine.key_domain(
            probe_sql(analysis.source, expression, key.engine_type, [*literals, literal])
        )
        if len(together) == len(key.domain):
            raise ParameterError(
                f"{setting} equals a value of the public domain of GROUP BY key {key.name} "
                "(as the engine compares that key's values); choose another label"
            )
        (text,) = alone
        return text
