"""The groups and units a bounded query is held to: the domains of public keys (rows outside
them are dropped, or mapped onto the key's other group, and the answer lists every key of the
domain) and the one cell a query pinned to a constant-per-unit column touches; with the
literals and key SQL the session's probes print.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from sqlglot import exp

from dpsql.analyze.analysis import Analysis, GroupKey
from dpsql.analyze.cells import normal_text
from dpsql.analyze.domains import domain_sql
from dpsql.bound.nodes import (
    Node,
    Type,
    alias,
    all_of,
    any_of,
    cast,
    column,
    columns,
    cte,
    engine_type,
    fragment,
    func,
    is_null,
    join,
    not_null,
    paren,
    quoted,
    salted_hash,
    select,
    subquery,
    table,
    union_all,
    values,
    when,
)
from dpsql.sql.params import literal_for
from dpsql.sql.parse import DIALECT
from dpsql.sql.totality import WIDENED, total

# A row-level expression made total, a new tree on every call (``dpsql.bound.relation``).
Total = Callable[[exp.Expression], exp.Expression]


def typed_value(text: str | None, type_name: str) -> exp.Cast:
    """A canonical domain value (the engine's text of it; None: NULL) in the key's type, as
    ``dpsql.analyze.domains.value_sql`` writes it."""
    literal = exp.Null() if text is None else exp.Literal.string(text)
    return exp.Cast(this=literal, to=engine_type(type_name))


def _literal(value: object) -> Node:
    return literal_for(value, 0)


def literal_sql(value: object) -> str:
    """A public value (of a policy domain, a CASE branch, a date range) as an SQL literal, for
    the session's probes; a policy may list NaN or an infinity, which have no literal."""
    if isinstance(value, float) and not math.isfinite(value):
        return cast(exp.Literal.string(repr(value)), Type.DOUBLE).sql(dialect=DIALECT)
    return _literal(value).sql(dialect=DIALECT)


def key_sql(analysis: Analysis, index: int) -> str:
    """Key ``index`` as the bounded query computes it (total, over ``analysis.source``)."""
    ints = frozenset(n for n, t in analysis.columns.items() if t.lower() in WIDENED)
    return total(analysis.keys[index].expr, ints).sql(dialect=DIALECT)


def domain_filter(key: GroupKey, index: int, key_node: Callable[[], Node]) -> Node | None:
    """The row filter of a public key's domain (None: no filter), over the key ``key_node``."""
    if key.other:
        # Rows outside the domain are kept, in the key's other group (``other_rows``).
        return None
    if key.engine_type is not None:
        # The canonical domain (dpsql.analyze.domains), held by the CTE _dom{index}.
        held = select([column(f"_k{index}")], table(f"_dom{index}"))
        test = exp.In(this=key_node(), query=subquery(held))
        if key.domain and None in key.domain:
            return paren(any_of([test, is_null(key_node())]))
        return test
    if key.domain is not None:
        listed = [v for v in key.domain if v is not None]
        parts: list[Node] = []
        if listed:
            parts.append(exp.In(this=key_node(), expressions=[_literal(v) for v in listed]))
        if None in key.domain:
            parts.append(is_null(key_node()))
        return paren(any_of(parts))
    if key.domain_table is not None:
        name, col = key.domain_table
        held = select([quoted(col)], table(name, quote=True))
        return exp.In(this=key_node(), query=subquery(held))
    return None


def domain_ctes(analysis: Analysis, total_: Total) -> list[exp.CTE]:
    """``_dom{i}``: the domain of each public key as a set in the key's engine type. A literal
    domain is already one (its values are the engine's canonical texts, ``dpsql.session.probes``),
    listed in the key's type as ``dpsql.analyze.domains.domain_sql`` lists it; a public table's
    column is deduplicated in the key's type by the relation that module writes."""
    out = []
    for i, key in enumerate(analysis.keys):
        if key.engine_type is None or not key.public:
            continue
        if key.domain:
            rows = [
                [typed_value(None if v is None else str(v), key.engine_type)] for v in key.domain
            ]
            relation: Node = select([exp.Star()], values(rows, "_l", [f"_k{i}"]))
        else:
            text = domain_sql(
                i, key.engine_type, texts=None, table=key.domain_table,
                source=analysis.source, key_sql=total_(key.expr).sql(dialect=DIALECT),
            )  # fmt: skip
            relation = fragment(text)
        out.append(cte(f"_dom{i}", relation))
    return out


def _other_value(key: GroupKey) -> exp.Cast:
    assert key.engine_type is not None  # set with the other group (dpsql.session.probes)
    return typed_value(key.other_text, key.engine_type)


def other_rows(
    rows: exp.Select, keys: Sequence[GroupKey], n_values: int, extra: Sequence[str] = ()
) -> exp.Select:
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
    out: list[Node] = [column("_u", "_p")]
    joins = []
    for i, key in enumerate(keys):
        k, j = f"_k{i}", f"_j{i}"
        if not key.other:
            out.append(column(k, "_p"))
            continue
        branches: list[tuple[Node, Node]] = [(not_null(column(k, j)), column(k, j))]
        if None in (key.domain or ()):
            branches.append((is_null(column(k, "_p")), column(k, "_p")))
        out.append(alias(when(*branches, otherwise=_other_value(key)), k))
        on = exp.EQ(this=column(k, "_p"), expression=column(k, j))
        joins.append(join(table(f"_dom{i}", j), side="LEFT", on=on))
    out += columns([f"_x{v}" for v in range(n_values)], "_p") + columns(extra, "_p")
    return select(out, subquery(rows, "_p"), joins=joins)


def _domain_part(key: GroupKey, i: int) -> Node:
    """The released keys of key ``i``: its domain (and its other group's key)."""
    k = f"_k{i}"
    if key.other:
        # The released keys: the domain and the other group's key (not a domain value).
        other = exp.Select(expressions=[alias(_other_value(key), k)])
        return subquery(union_all(select([column(k)], table(f"_dom{i}")), other), f"_o{i}")
    if key.engine_type is not None:
        return table(f"_dom{i}")
    if key.domain is not None:
        return values([[_literal(v)] for v in key.domain], f"_d{i}", [k])
    assert key.domain_table is not None
    name, col = key.domain_table
    distinct = select([alias(quoted(col), k)], table(name, quote=True))
    distinct.set("distinct", exp.Distinct())
    return subquery(distinct, f"_d{i}")


def domain_relation(keys: Sequence[GroupKey]) -> exp.Select:
    """Every combination of the public keys' released values: ``SELECT * FROM`` the keys'
    domains, cross joined."""
    parts = [_domain_part(key, i) for i, key in enumerate(keys)]
    return select([exp.Star()], parts[0], joins=[join(p, "CROSS") for p in parts[1:]])


def enforced_cell(analysis: Analysis) -> list[exp.CTE]:
    """For a query pinned to a cell of a constant-per-unit column: each unit's one value,
    chosen by keyed hash among all its rows before any filter, so it depends only on the unit's
    own rows; only the units whose chosen value's normal form renders to the cell's key are
    kept (``dpsql.analyze.cells``). Every unit then lies in at most one cell, whatever the data and
    whatever the query's WHERE says, which parallel composition across cells relies on."""
    cell = analysis.cell
    if cell is None:
        return []
    unit, value = quoted(analysis.unit), quoted(cell.column)
    order = salted_hash(quoted(analysis.unit), quoted(cell.column))
    each = select(
        [alias(unit, "_cu"), alias(func("arg_min", value, order), "_cv")],
        table(analysis.table, quote=True),
        group=[quoted(analysis.unit)],
    )
    text = normal_text("_cv", analysis.columns[cell.column], cell.collation)
    assert text is not None  # the session keys only cells with a normal form
    test = exp.EQ(this=fragment(text), expression=exp.Literal.string(cell.key))
    chosen = select(columns(["_cu", "_cv"]), table("_picked"), where=test)
    return [cte("_picked", each), cte("_chosen", chosen)]


def cell_join(analysis: Analysis) -> list[exp.Join]:
    """The join that keeps only the rows of the cell's units, with their chosen value."""
    cell = analysis.cell
    if cell is None:
        return []
    on = all_of([
        exp.EQ(this=quoted(analysis.unit, analysis.table), expression=column("_cu", "_chosen")),
        exp.EQ(this=quoted(cell.column, analysis.table), expression=column("_cv", "_chosen")),
    ])  # fmt: skip
    return [join(table("_chosen"), "SEMI", on=on)]


__all__ = [
    "cell_join",
    "domain_ctes",
    "domain_filter",
    "domain_relation",
    "enforced_cell",
    "key_sql",
    "literal_sql",
    "other_rows",
    "typed_value",
]
