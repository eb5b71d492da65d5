"""The bounded query: contribution bounding by per-unit pre-aggregation inside the engine.

The steps of DESIGN.md section 3, each a CTE:

1. ``_rows``: the table's rows after WHERE, with the unit, the group keys and the raw values;
   every row-level expression wrapped in ``TRY`` and casts made ``TRY_CAST``, so no data value
   can make the query fail. Rows whose public key lies outside its domain are dropped here, so
   they never use up a unit's group budget; with ``dpsql.other_group`` they are mapped onto
   the key's other group instead (``dpsql.bound.filters._other_rows``), before any bounding.
2. ``_vals``: values rounded to their grid and clamped to the grid-aligned bounds, as integers.
3. ``_units``: per (unit, group): rows ``n``, non-NULL values ``n_i`` and exact integer sums;
   for a variance, also the exact sum of squared centred values ``Σ(2·v - lower - upper)²``.
4. ``_kept``: at most L0 groups per unit, ranked by a salted hash of (unit, keys), which depends
   only on the unit's own rows; units with at most L0 groups (``_multi`` lists the others)
   skip the ranking window, unless the public keys have at least 4·L0 combinations (then most
   units are ranked anyway, and finding the others costs more than it saves).
5. ``_capped``: ``n' = min(n, C)``; sums scaled to ``n'·S/n`` and clamped to ``[n'·lo, n'·hi]``;
   sums of squares scaled to ``C·Q/n`` when ``n > C`` and clamped to ``[0, C·width²]``.
6. the cross-unit aggregate per group; with a public domain, every key of the domain.

With a total row cap R, ``_rows`` keeps R rows per unit first (``_row_cap``). Steps the plan
proves unable to bind are left out (``dpsql.plan.steps._steps``); with ``Bounding.direct``
steps 3 to 5 are the identity and the aggregate reads the rows. Every choice between two forms
of a step rests on public numbers only, and both forms return the same totals.

The parts live in their own modules: ``dpsql.bound.specs`` (what the query enforces),
``dpsql.bound.values`` (values on their grids, what C leaves of a unit's values, and the
cross-unit aggregates), ``dpsql.bound.caps`` (R's window and L0's ranking) and
``dpsql.bound.filters`` (public key domains and cells); this module assembles the query.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import sqlglot
from sqlglot import exp

from dpsql.analyze.analysis import Analysis
from dpsql.analyze.sample import sample_filter
from dpsql.bound.caps import _kept, _picked, _row_cap
from dpsql.bound.filters import (
    _cell_join,
    _domain_ctes,
    _domain_filter,
    _domain_relation,
    _enforced_cell,
    _other_rows,
    _sql,
    public_size,
)
from dpsql.bound.pivot import Aggregate, pivot_cells, pivoted
from dpsql.bound.specs import Bounding
from dpsql.bound.values import (
    _capped_list,
    _capped_squares,
    _capped_sum,
    _centred,
    _counted,
    _direct,
    _grid_units,
    _list_measure,
    _listed,
    _summed_value,
    measurement_sql,
)
from dpsql.errors import UnsupportedQueryError
from dpsql.sql.parse import DIALECT
from dpsql.sql.totality import WIDENED, as_boolean, total


def bounded_query(analysis: Analysis, bounding: Bounding) -> str:
    """The bounded SQL for ``analysis``: one row per group, one column per measurement. The
    engine runs this text; ``parse_bounded`` gives its tree (EXPLAIN's pretty form), parsed
    only when asked for: parsing and printing it again costs some 5 ms per plan."""
    keys = [f"_k{i}" for i in range(len(analysis.keys))]
    key_list = "".join(f"{k}, " for k in keys)
    squared = sorted(
        {
            m.value
            for m in bounding.measurements
            if m.kind == "centred_squares" and m.value is not None
        }
    )
    rows = relation_rows(analysis, bounding)
    # Without values and with at most R key combinations, copies of a (unit, keys) row are
    # common: R's window then runs on those rows with their number of copies, _w. (A choice of
    # speed on public numbers only; the totals are the same either way.)
    size = public_size(analysis.keys)
    r = bounding.max_total_rows
    weighted = (
        r is not None
        and not bounding.values
        and (size is not None and size <= r)
        and bounding.select_at is None  # its row window reads rows, not weighted copies
    )
    vals = ", ".join(
        ["_u"]
        + keys
        + (["_w"] if weighted else [])
        + [
            f"{_grid_units(f'_x{i}', v.grid)} AS _v{i}"
            if v.grid is not None
            else f"{_counted(f'_x{i}', v.expr, analysis)} AS _v{i}"
            for i, v in enumerate(bounding.values)
        ]
    )
    aggregates = [
        Aggregate("SUM", "_w", "_n", zero=False) if weighted else Aggregate("COUNT", "*", "_n")
    ]
    aggregates += [
        Aggregate("COUNT", f"_v{i}", f"_n{i}")
        for i, v in enumerate(bounding.values)
        if not v.listed
    ]
    aggregates += [
        Aggregate("SUM", f"_v{i}", f"_s{i}")
        for i, v in enumerate(bounding.values)
        if v.grid is not None and not v.listed
    ]
    aggregates += [
        Aggregate(
            "SUM",
            f"CAST({_centred(i, bounding)} AS HUGEINT) * CAST({_centred(i, bounding)} AS HUGEINT)",
            f"_q{i}",
        )
        for i in squared
    ]
    ctes = ""
    c = bounding.max_rows
    capped = ", ".join(
        [*keys, f"LEAST(_n, {c}) AS _c"]
        + [f"LEAST(_n{i}, {c}) AS _c{i}" for i, v in enumerate(bounding.values) if not v.listed]
        + [
            f"{_capped_sum(i, c, v.grid)} AS _t{i}"
            for i, v in enumerate(bounding.values)
            if v.grid is not None and not v.listed
        ]
        + [f"{_capped_squares(i, bounding)} AS _r{i}" for i in squared]
        + [_capped_list(i, c) for i, v in enumerate(bounding.values) if v.listed]
    )
    listed = {
        j: m for j, m in enumerate(bounding.measurements) if m.kind in ("quantile", "distinct")
    }
    measures = ", ".join(
        [
            f"{measurement_sql(m, bounding)} AS _m{j}"
            for j, m in enumerate(bounding.measurements)
            if j not in listed
        ]
        + ["COUNT(*) AS _z"]
    )
    aggregated = f"SELECT {key_list}{measures} FROM _capped"
    if keys:
        aggregated += f" GROUP BY {', '.join(keys)}"
    ctes += "".join(f"{_list_measure(j, m, keys, bounding.direct)}, " for j, m in listed.items())
    outputs = [f"_agg.{k}" for k in keys] + [
        f"_x{j}._h AS _m{j}" if j in listed else f"_agg._m{j}"
        for j in range(len(bounding.measurements))
    ]
    joins = "".join(
        f" LEFT JOIN _x{j} ON "
        + (" AND ".join(f"_agg.{k} IS NOT DISTINCT FROM _x{j}.{k}" for k in keys) or "true")
        for j in listed
    )
    final = f"SELECT {', '.join(outputs)} FROM _agg{joins}"
    if keys and all(k.public for k in analysis.keys):
        on = " AND ".join(f"_d._k{i} IS NOT DISTINCT FROM _f._k{i}" for i in range(len(keys)))
        filled = ", ".join(
            [f"_d._k{i} AS _k{i}" for i in range(len(keys))]
            + [
                f"_f._m{j} AS _m{j}" if m.kind == "quantile" else f"COALESCE(_f._m{j}, 0) AS _m{j}"
                for j, m in enumerate(bounding.measurements)
            ]
        )
        final = (
            f"SELECT {filled} FROM (SELECT * FROM {_domain_relation(analysis.keys)}) AS _d "
            f"LEFT JOIN ({final}) AS _f ON {on}"
        )
    rows = _row_cap(rows, keys, len(bounding.values), r, weighted)
    picked = _picked(keys, bounding) if bounding.select_at is not None else ""
    cells = pivot_cells(analysis.keys, bounding)  # None for a direct bounding
    if bounding.direct:
        units = f"_capped AS ({_direct(keys, bounding, squared, weighted)}), "
    elif cells is not None:
        assert bounding.max_groups is not None  # pivot_cells: only where L0 ranks
        units = pivoted(aggregates, cells, bounding.max_groups)
        units += f"_capped AS (SELECT {capped} FROM _kept), "
    else:
        multi, kept = _kept(bounding, keys, size)
        per_unit = ", ".join(
            ["_u", *keys]
            + [f"{a.sql()} AS {a.name}" for a in aggregates]
            + [_listed(i, v) for i, v in enumerate(bounding.values) if v.listed]
        )
        units = (
            f"_units AS (SELECT {per_unit} FROM _vals GROUP BY {', '.join(['_u', *keys])}), "
            f"{multi}_kept AS ({kept}), _capped AS (SELECT {capped} FROM _kept), "
        )
    return (
        f"WITH {relation_ctes(analysis)}"
        f"{rows}{picked}"
        f"_vals AS (SELECT {vals} FROM {'_picked' if picked else '_rows'}), "
        f"{units}{ctes}_agg AS ({aggregated}) "
        f"{final}"
    )


def _total_sql(analysis: Analysis) -> Callable[[exp.Expression], str]:
    """A row-level expression made total (``dpsql.sql.totality``), as the engine's SQL."""
    ints = frozenset(n for n, t in analysis.columns.items() if t.lower() in WIDENED)

    def total_sql(node: exp.Expression) -> str:
        return _sql(total(node, ints))

    return total_sql


def relation_ctes(analysis: Analysis) -> str:
    """The CTEs the relation's rows read (a pinned cell, public key domains), each with its
    trailing comma: what follows ``WITH`` before ``relation_rows``."""
    return f"{_enforced_cell(analysis)}{_domain_ctes(analysis, _total_sql(analysis))}"


def relation_rows(
    analysis: Analysis, bounding: Bounding, extra: Mapping[str, str] | None = None
) -> str:
    """The relation the query bounds, before any bound (step 1): one row per row after joins,
    WHERE and the public domains' filter, with the unit ``_u``, the keys ``_k<i>``, the raw
    values ``_x<i>`` (bounded columns inside an expression already clamped) and ``extra``
    (more row-level columns over the relation's names, name -> SQL), then each key's other
    group mapped (``_other_rows``). The diagnosis of the bounds (``dpsql.bound.diagnosis``)
    reads the same rows as the bounded query."""
    total_sql = _total_sql(analysis)
    keys = [f"_k{i}" for i in range(len(analysis.keys))]
    raw = [
        total_sql(v.expr) if v.grid is None else _summed_value(v.expr, analysis, total_sql)
        for v in bounding.values
    ]
    predicate = analysis.where
    filters = [f"{total_sql(as_boolean(predicate))} IS TRUE"] if predicate is not None else []
    filters += [
        f
        for i, key in enumerate(analysis.keys)
        if (f := _domain_filter(key, i, total_sql(key.expr)))
    ]
    if bounding.sample is not None and (
        kept := sample_filter(f'"{analysis.unit}"', bounding.sample)
    ):
        # Each unit in or out as a whole, by a keyed PRF, before any bound (dpsql.analyze.sample).
        filters.insert(0, kept)
    rows_select = ", ".join(
        [f'"{analysis.unit}" AS _u']
        + [f"{total_sql(k.expr)} AS {name}" for k, name in zip(analysis.keys, keys, strict=True)]
        + [f"{expr} AS _x{i}" for i, expr in enumerate(raw)]
        + [f"{sql} AS {name}" for name, sql in (extra or {}).items()]
    )
    where = f" WHERE {' AND '.join(filters)}" if filters else ""
    rows = f"SELECT {rows_select} FROM {analysis.source}{_cell_join(analysis)}{where}"
    # Each key with an other group mapped onto its domain, row by row, before any bound.
    return _other_rows(rows, analysis.keys, len(bounding.values), list(extra or {}))


def parse_bounded(text: str) -> exp.Select:
    try:
        parsed = sqlglot.parse_one(text, read=DIALECT)
    except RecursionError:
        raise UnsupportedQueryError("the query is nested too deeply") from None
    assert isinstance(parsed, exp.Select)
    return parsed


__all__ = ["bounded_query", "parse_bounded", "relation_ctes", "relation_rows"]
