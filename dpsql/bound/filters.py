"""The groups and units a bounded query is held to: the domains of public keys (rows outside
them are dropped, and the answer lists every key of the domain) and the one cell a query pinned
to a constant-per-unit column touches; with the literals and key SQL they print.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from sqlglot import exp

from dpsql.analyze.analysis import Analysis, GroupKey
from dpsql.analyze.cells import normal_text
from dpsql.analyze.domains import domain_sql, text_literal, value_sql
from dpsql.bound.specs import SALT_PARAMETER
from dpsql.sql.params import literal_for
from dpsql.sql.parse import DIALECT
from dpsql.sql.totality import WIDENED, total


def _sql(node: exp.Expression) -> str:
    """Print a tree of its own: every caller passes a new one (``total``, ``literal_for``), so
    the generator may change it in place instead of copying it first."""
    return node.sql(dialect=DIALECT, copy=False)


def _domain_filter(key: GroupKey, index: int, name: str) -> str | None:
    if key.other:
        # Rows outside the domain are kept, in the key's other group (``_other_rows``).
        return None
    if key.engine_type is not None:
        # The canonical domain (dpsql.analyze.domains), held by the CTE _dom{index}.
        test = f"{name} IN (SELECT _k{index} FROM _dom{index})"
        return f"({test} OR {name} IS NULL)" if key.domain and None in key.domain else test
    if key.domain is not None:
        values = [v for v in key.domain if v is not None]
        parts = []
        if values:
            parts.append(f"{name} IN ({', '.join(_literal(v) for v in values)})")
        if None in key.domain:
            parts.append(f"{name} IS NULL")
        return "(" + " OR ".join(parts) + ")"
    if key.domain_table is not None:
        table, column = key.domain_table
        return f'{name} IN (SELECT "{column}" FROM "{table}")'
    return None


def _literal(value: object) -> str:
    return _sql(literal_for(value, 0))


def literal_sql(value: object) -> str:
    """A public value (of a policy domain, a CASE branch, a date range) as an SQL literal; a
    policy may list NaN or an infinity, which have no literal of their own."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"CAST('{value!r}' AS DOUBLE)"
    return _literal(value)


def key_sql(analysis: Analysis, index: int) -> str:
    """Key ``index`` as the bounded query computes it (total, over ``analysis.source``)."""
    ints = frozenset(n for n, t in analysis.columns.items() if t.lower() in WIDENED)
    return _sql(total(analysis.keys[index].expr, ints))


def _domain_ctes(analysis: Analysis, total_sql: Callable[[exp.Expression], str]) -> str:
    """``_dom{i}``: the domain of each public key as a set in the key's engine type."""
    ctes = ""
    for i, key in enumerate(analysis.keys):
        if key.engine_type is not None and key.public:
            texts = [None if v is None else str(v) for v in key.domain] if key.domain else None
            relation = domain_sql(
                i, key.engine_type, texts=texts, table=key.domain_table,
                source=analysis.source, key_sql=total_sql(key.expr),
            )  # fmt: skip
            ctes += f"_dom{i} AS ({relation}), "
    return ctes


def _other_sql(key: GroupKey) -> str:
    assert key.engine_type is not None  # set with the other group (dpsql.session.probes)
    return value_sql(key.other_text, key.engine_type)


def _other_rows(
    rows: str, keys: Sequence[GroupKey], n_values: int, extra: Sequence[str] = ()
) -> str:
    """``rows`` with each key that has an other group (``dpsql.other_group``) mapped onto its
    domain: a row whose key equals a domain value gets that value (the domain's own canonical
    one), any other row the other group's key, so every row lands in exactly one released
    group. Membership is the engine's equality in the key's type and collation, the equality
    that deduplicated the domain (``dpsql.analyze.domains``) and that ``key IN (SELECT ...)``
    tests for the keys without one: a LEFT JOIN on ``=`` matches at most one value of a
    deduplicated domain and never a NULL, so a NULL key is other unless the domain lists NULL.
    (A join rather than ``IN`` in the select list, which Spark allows only in a filter.)
    Row-level: each row's group depends on that row alone, before any bounding, so the other
    group is one of the unit's groups like any other under L0 (DESIGN.md section 3). The
    ``extra`` columns (the diagnosis's, ``dpsql.bound.diagnosis``) are carried through."""
    if not any(k.other for k in keys):
        return rows
    columns = ["_p._u"]
    joins = ""
    for i, key in enumerate(keys):
        if not key.other:
            columns.append(f"_p._k{i}")
            continue
        listed = None in (key.domain or ())
        null = f" WHEN _p._k{i} IS NULL THEN _p._k{i}" if listed else ""
        columns.append(
            f"CASE WHEN _j{i}._k{i} IS NOT NULL THEN _j{i}._k{i}{null} "
            f"ELSE {_other_sql(key)} END AS _k{i}"
        )
        joins += f" LEFT JOIN _dom{i} AS _j{i} ON _p._k{i} = _j{i}._k{i}"
    columns += [f"_p._x{j}" for j in range(n_values)] + [f"_p.{name}" for name in extra]
    return f"SELECT {', '.join(columns)} FROM ({rows}) AS _p{joins}"


def _domain_relation(keys: tuple[GroupKey, ...]) -> str:
    parts = []
    for i, key in enumerate(keys):
        if key.other:
            # The released keys: the domain and the other group's key (not a domain value).
            other = f"SELECT {_other_sql(key)} AS _k{i}"
            parts.append(f"(SELECT _k{i} FROM _dom{i} UNION ALL {other}) AS _o{i}")
        elif key.engine_type is not None:
            parts.append(f"_dom{i}")
        elif key.domain is not None:
            rows = ", ".join(f"({_literal(v)})" for v in key.domain)
            parts.append(f"(VALUES {rows}) AS _d{i}(_k{i})")
        else:
            assert key.domain_table is not None
            table, column = key.domain_table
            parts.append(f'(SELECT DISTINCT "{column}" AS _k{i} FROM "{table}") AS _d{i}')
    return " CROSS JOIN ".join(parts)


def _enforced_cell(analysis: Analysis) -> str:
    """For a query pinned to a cell of a constant-per-unit column: each unit's one value,
    chosen by keyed hash among all its rows before any filter, so it depends only on the unit's
    own rows; only the units whose chosen value's normal form renders to the cell's key are
    kept (``dpsql.analyze.cells``). Every unit then lies in at most one cell, whatever the data and
    whatever the query's WHERE says, which parallel composition across cells relies on."""
    cell = analysis.cell
    if cell is None:
        return ""
    column, unit = f'"{cell.column}"', f'"{analysis.unit}"'
    order = f"hash({unit}, {column}, CAST(${SALT_PARAMETER} AS BIGINT))"
    text = normal_text("_cv", analysis.columns[cell.column], cell.collation)
    assert text is not None  # the session keys only cells with a normal form
    key = text_literal(cell.key)
    return (
        f"_picked AS (SELECT {unit} AS _cu, arg_min({column}, {order}) AS _cv "
        f'FROM "{analysis.table}" GROUP BY {unit}), '
        f"_chosen AS (SELECT _cu, _cv FROM _picked WHERE {text} = {key}), "
    )


def _cell_join(analysis: Analysis) -> str:
    if analysis.cell is None:
        return ""
    column, unit = f'"{analysis.cell.column}"', f'"{analysis.unit}"'
    return (
        f' SEMI JOIN _chosen ON "{analysis.table}".{unit} = _chosen._cu '
        f'AND "{analysis.table}".{column} = _chosen._cv'
    )


def public_size(keys: Sequence[GroupKey]) -> int | None:
    """The number of public key combinations, when there are keys and every one lists its
    domain (rows outside it are dropped before bounding, or kept in the key's other group,
    one more value of the key: every group a unit can touch is one of these)."""
    if not keys or not all(k.domain is not None for k in keys):
        return None
    return math.prod(len(k.domain or ()) + k.other for k in keys)
