"""The last steps of the bounded query: the cross-unit aggregates over ``_capped`` (``_agg``,
each measurement's ``dpsql.bound.values.measure``, and ``_x<j>`` for a listed value), and the
answer: one row per group, one column per measurement; with a public domain, one row per key of
the domain.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.bound.filters import domain_relation
from dpsql.bound.nodes import (
    Node,
    alias,
    all_of,
    column,
    columns,
    cte,
    func,
    join,
    not_null,
    number,
    same,
    select,
    subquery,
    table,
)
from dpsql.bound.shape import Shape
from dpsql.bound.values import measure


def aggregated(shape: Shape) -> exp.CTE:
    """``_agg``: per group, every measurement that is not read from listed values, and the
    number of (unit, group) rows ``_z``."""
    listed = shape.listed
    measures = [
        alias(measure(m, shape.bounding), f"_m{j}")
        for j, m in enumerate(shape.bounding.measurements)
        if j not in listed
    ]
    measures.append(alias(func("COUNT", exp.Star()), "_z"))
    keys = shape.keys
    return cte("_agg", select([*columns(keys), *measures], table("_capped"), group=columns(keys)))


def list_measures(shape: Shape) -> list[exp.CTE]:
    """``_x<j>``: the cross-unit aggregate of a listed value, a histogram of grid units for a
    quantile's exponential mechanism or the number of distinct values."""
    out = []
    keys = shape.keys
    source = _sources(shape)
    for j, spec in shape.listed.items():
        assert spec.value is not None
        if source[j] != j:
            continue  # a quantile interval's end reads its quantile's histogram
        i = spec.value
        if shape.bounding.direct:
            # Each unit has at most C rows per group: its list would be all its values, whole.
            kept = not_null(column(f"_v{i}"))
            values = select([*columns(keys), alias(column(f"_v{i}"), "_b")], table("_capped"),
                            where=kept)  # fmt: skip
        else:
            unnested = alias(func("unnest", column(f"_l{i}")), "_b")
            values = select([*columns(keys), unnested], table("_capped"))
        if spec.kind == "quantile":
            agg = func("histogram", column("_b"))
        else:
            agg = func("COUNT", exp.Distinct(expressions=[column("_b")]))
        query = select([*columns(keys), alias(agg, "_h")], subquery(values), group=columns(keys))
        out.append(cte(f"_x{j}", query))
    return out


def _sources(shape: Shape) -> dict[int, int]:
    """For each listed measurement, the one whose CTE it reads: the first quantile of the same
    value (the value and its interval's ends share one histogram), else itself."""
    first: dict[int, int] = {}
    out = {}
    for j, spec in shape.listed.items():
        if spec.kind == "quantile" and spec.value is not None:
            out[j] = first.setdefault(spec.value, j)
        else:
            out[j] = j
    return out


def answer(shape: Shape) -> exp.Select:
    """The answer: ``_agg`` with each listed measurement joined in; with public keys only,
    every combination of their domains, a group with no row counting 0 (a quantile's missing
    histogram stays NULL)."""
    keys, listed = shape.keys, shape.listed
    source = _sources(shape)
    outputs: list[Node] = columns(keys, "_agg")
    outputs += [
        alias(column("_h", f"_x{source[j]}"), f"_m{j}") if j in listed else column(f"_m{j}", "_agg")
        for j in range(len(shape.bounding.measurements))
    ]
    joins = []
    for j in sorted(set(source.values())):
        tests = [same(column(k, "_agg"), column(k, f"_x{j}")) for k in keys]
        joins.append(join(table(f"_x{j}"), side="LEFT", on=all_of(tests) if tests else exp.true()))
    final = select(outputs, table("_agg"), joins=joins)
    analysis = shape.analysis
    if not keys or not all(k.public for k in analysis.keys):
        return final
    filled: list[Node] = [alias(column(k, "_d"), k) for k in keys]
    for j, m in enumerate(shape.bounding.measurements):
        value: Node = column(f"_m{j}", "_f")
        if m.kind != "quantile":
            value = exp.Coalesce(this=value, expressions=[number(0)])
        filled.append(alias(value, f"_m{j}"))
    on = all_of([same(column(k, "_d"), column(k, "_f")) for k in keys])
    domains = subquery(domain_relation(analysis.keys), "_d")
    return select(filled, domains, joins=[join(subquery(final, "_f"), side="LEFT", on=on)])


__all__ = ["aggregated", "answer", "list_measures"]
