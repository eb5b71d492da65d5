"""Public key domains as sets in the key's engine type (DESIGN.md section 4).

A public ``GROUP BY`` key releases one noisy row per value of its domain. The domain must be a
set *as the engine compares keys*, or one group's total is released several times with
independent noise for the price of one: DuckDB casts ``1``, ``'1'`` and ``'01'`` in one
``CASE`` to the INTEGER 1, a NOCASE column groups ``'EU'`` and ``'eu'`` together, and ``-0.0``
and ``0.0`` are one group. Python equality sees three, two and one values there.

So the domain is taken through the engine's own typing of the whole key expression: each value
is cast to the key's type (the CASE's result type, any cast in GROUP BY), and the distinct
values are those of a ``UNION ALL`` under the key expression itself, which gives them the key's
collation, with the key's branch reading no rows (``WHERE false``). Before the charge, the
session asks the engine for the distinct values of a literal domain (``probe_sql``); each comes
back as the engine's own text, and the bounded query casts that text back to the key's type
(checked to round-trip exactly). A domain held in a public table is deduplicated the same way
inside the bounded query (``domain_sql``).
"""

from __future__ import annotations

from collections.abc import Sequence


def text_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def value_sql(text: str | None, engine_type: str) -> str:
    """A canonical domain value (the engine's text of it) as SQL of the key's type."""
    if text is None:
        return f"CAST(NULL AS {engine_type})"
    return f"CAST({text_literal(text)} AS {engine_type})"


def _union(source: str, key_sql: str, branch: str) -> str:
    """Distinct values of ``branch`` under the key's type and collation: the key expression's
    branch comes first (its type and collation are the union's) and reads no rows."""
    keys = f"SELECT {key_sql} AS _k FROM {source} WHERE false"
    return f"SELECT DISTINCT _k FROM ({keys} UNION ALL {branch})"


def probe_sql(source: str, key_sql: str, engine_type: str, literals: Sequence[str | None]) -> str:
    """The engine's distinct values of a literal domain, as text (NULL for a NULL member).

    ``literals`` are SQL literals (None: the NULL member). A literal that is not a value of the
    key's type (its TRY_CAST is NULL) is dropped: no row can have that key. Each value also
    says whether its text casts back to the same value, which the plan relies on.
    """
    rows = ", ".join(f"(TRY_CAST({lit} AS {engine_type}))" for lit in literals if lit is not None)
    branches = []
    if rows:
        branches.append(f"SELECT _v FROM (VALUES {rows}) AS _l(_v) WHERE _v IS NOT NULL")
    if any(lit is None for lit in literals):
        branches.append(f"SELECT CAST(NULL AS {engine_type})")
    if not branches:
        branches.append(f"SELECT CAST(NULL AS {engine_type}) WHERE false")
    distinct = _union(source, key_sql, " UNION ALL ".join(branches))
    back = f"CAST(CAST(_k AS VARCHAR) AS {engine_type})"
    return (
        f"SELECT CAST(_k AS VARCHAR), {back} IS NOT DISTINCT FROM _k FROM ({distinct}) AS _u "
        "ORDER BY _k NULLS LAST"
    )


def domain_sql(
    index: int,
    engine_type: str,
    *,
    texts: Sequence[str | None] | None,
    table: tuple[str, str] | None,
    source: str,
    key_sql: str,
) -> str:
    """The domain of key ``index`` as a relation with one column ``_k{index}``: the canonical
    values of a literal domain, or a public table's column deduplicated in the key's type."""
    if texts is not None:
        rows = ", ".join(f"({value_sql(t, engine_type)})" for t in texts)
        return f"SELECT * FROM (VALUES {rows}) AS _l(_k{index})"
    assert table is not None
    name, column = table
    cast = f'TRY_CAST("{column}" AS {engine_type})'
    branch = f'SELECT {cast} FROM "{name}" WHERE {cast} IS NOT NULL OR "{column}" IS NULL'
    return f"SELECT _k AS _k{index} FROM ({_union(source, key_sql, branch)}) AS _u"


__all__ = ["domain_sql", "probe_sql", "text_literal", "value_sql"]
