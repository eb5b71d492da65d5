"""What only the engine can say about a query's constants, asked before the check.

A WHERE that pins a cell gets the cell's key (``dpsql.sql.cells``, on a connection without
data), and each public GROUP BY key its engine type and its domain as values of that type
(``dpsql.sql.domains``). Both read no rows, so they depend on the query and the schema only.
The ``Probes`` method is part of ``dpsql.session.Session``.
"""

from __future__ import annotations

from dataclasses import replace

from dpsql.engine.base import Engine
from dpsql.errors import BoundsError, UnsupportedQueryError
from dpsql.sql.analyze import Analysis
from dpsql.sql.cells import Cell
from dpsql.sql.domains import probe_sql
from dpsql.sql.rewrite import key_sql, literal_sql


class Probes:
    """The probing part of ``Session``: the engine's values of a query's constants."""

    engine: Engine

    def _engine_values(self, analysis: Analysis) -> Analysis:
        """What only the engine can say about a query's constants, asked before the check
        (reading no rows, so it depends on the query and the schema only): the key of the cell
        a WHERE pins (``dpsql.sql.cells``, on a connection without data; None composes
        sequentially), and each public key's type and domain as a set in that type
        (``dpsql.sql.domains``)."""
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
            ((_, engine_type),) = self.engine.describe(
                f"SELECT {expression} AS _k FROM {analysis.source}"
            )
            if engine_type.upper() == "NULL":
                raise UnsupportedQueryError(f"GROUP BY key {key.name} is NULL on every row")
            domain = key.domain
            if domain is not None:
                literals = [None if v is None else literal_sql(v) for v in domain]
                probe = probe_sql(analysis.source, expression, engine_type, literals)
                domain = tuple(self.engine.key_domain(probe))
                if not domain:
                    raise BoundsError(
                        f"the public domain of GROUP BY key {key.name} holds no value of the "
                        f"key's type {engine_type}"
                    )
            keys.append(replace(key, domain=domain, engine_type=engine_type))
        return replace(analysis, cell=cell, keys=tuple(keys))
