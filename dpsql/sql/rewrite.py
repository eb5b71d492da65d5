"""The bounded query: contribution bounding by per-unit pre-aggregation inside the engine.

The steps of DESIGN.md section 3, each a CTE:

1. ``_rows``: the table's rows after WHERE, with the unit, the group keys and the raw values;
   every row-level expression wrapped in ``TRY`` and casts made ``TRY_CAST``, so no data value
   can make the query fail. Rows whose public key lies outside its domain are dropped here, so
   they never use up a unit's group budget.
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
proves unable to bind are left out (``dpsql.plan.planner._steps``); with ``Bounding.direct``
steps 3 to 5 are the identity and the aggregate reads the rows. Every choice between two forms
of a step rests on public numbers only, and both forms return the same totals.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

import sqlglot
from sqlglot import exp

from dpsql.errors import UnsupportedQueryError
from dpsql.sql.analyze import Analysis, GroupKey
from dpsql.sql.cells import normal_text
from dpsql.sql.domains import domain_sql, text_literal
from dpsql.sql.grid import Grid
from dpsql.sql.params import literal_for
from dpsql.sql.parse import DIALECT
from dpsql.sql.totality import WIDENED, as_boolean, total
from dpsql.sql.tree import transform

SALT_PARAMETER = "salt"
MeasurementKind = Literal[
    "rows", "count", "sum", "centred", "centred_squares", "units", "distinct", "quantile"
]
# value: counted, and summed on its grid; quantile: listed on its (coarser) grid, C per unit and
# group; distinct: its distinct values listed, C per unit and group.
ValueRole = Literal["value", "quantile", "distinct"]
_FLOATS = {"float", "double", "real"}


@dataclass(frozen=True)
class ValueSpec:
    """A distinct row-level expression that is counted, and summed on ``grid`` if given."""

    expr: exp.Expression
    grid: Grid | None
    role: ValueRole = "value"

    @property
    def listed(self) -> bool:
        return self.role != "value"


@dataclass(frozen=True)
class MeasurementSpec:
    """What one output column of the bounded query measures (see ``measurement_sql``)."""

    kind: MeasurementKind
    value: int | None = None
    p: Fraction | None = None  # the order of a quantile


@dataclass(frozen=True)
class Bounding:
    """The public numbers the bounded query enforces."""

    max_groups: int | None  # L0 for the ranking; None when no ranking is needed
    max_rows: int  # C
    values: tuple[ValueSpec, ...]
    measurements: tuple[MeasurementSpec, ...]
    max_total_rows: int | None = None  # R: rows per unit in total, kept by keyed hash
    # Every unit holds at most C rows per group and at most L0 groups once the rows are built
    # (after R's window, or by the relation's structure): the per-(unit, group) step is then
    # the identity and the aggregate reads the rows directly (``dpsql.plan.planner``).
    direct: bool = False


def _sql(node: exp.Expression) -> str:
    """Print a tree of its own: every caller passes a new one (``total``, ``literal_for``), so
    the generator may change it in place instead of copying it first."""
    return node.sql(dialect=DIALECT, copy=False)


def _clamp_columns(expr: exp.Expression, analysis: Analysis) -> exp.Expression:
    """Clamp each bounded numeric column inside an aggregate argument to its declared bounds."""

    def clamp(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.Column):
            return node
        bounds = analysis.bounds.get(node.name)
        if bounds is None:
            return node
        lo, hi = bounds
        inner = exp.cast(node.copy(), exp.DataType.Type.DOUBLE)
        clamped: exp.Expression = exp.Least(
            this=exp.Greatest(this=inner, expressions=[_number(lo)], ignore_nulls=True),
            expressions=[_number(hi)],
            ignore_nulls=True,
        )
        # NULL stays NULL (GREATEST ignores NULL, so the clamp alone would give the lower
        # bound); NaN counts as NULL (DuckDB orders NaN above +inf: the clamp would give hi).
        missing: exp.Expression = exp.Is(this=node.copy(), expression=exp.Null())
        if analysis.columns[node.name].lower() in _FLOATS:
            missing = exp.Or(this=missing, expression=exp.IsNan(this=node.copy()))
        return exp.Paren(this=exp.If(this=missing, true=exp.Null(), false=clamped))

    return transform(expr, clamp)


def _summed_value(
    expr: exp.Expression, analysis: Analysis, total_sql: Callable[[exp.Expression], str]
) -> str:
    """The raw DOUBLE of a summed value, before its grid clamp.

    A bare column needs no clamp of its own: the grid clamp enforces the same bounds (rounded
    out to the grid), and the NULL and NaN checks are there too. Inside a compound expression
    each bounded column is clamped first, so that the expression sees clamped inputs.
    """
    if isinstance(expr, exp.Column):
        column = expr.sql(dialect=DIALECT)
        if analysis.columns[expr.name].lower() in _FLOATS:
            return column
        return f"CAST({column} AS DOUBLE)"
    return total_sql(exp.cast(_clamp_columns(expr, analysis), exp.DataType.Type.DOUBLE))


def _number(value: Fraction | int) -> exp.Expression:
    value = Fraction(value)
    if value.denominator == 1:
        return exp.Literal.number(value.numerator)
    # Bounds are read from decimal text, so most are finite decimals; others become a ratio.
    return exp.Div(
        this=exp.cast(exp.Literal.number(value.numerator), exp.DataType.Type.DOUBLE),
        expression=exp.Literal.number(value.denominator),
    )


def _grid_units(raw: str, grid: Grid) -> str:
    """SQL for a raw DOUBLE value on its grid: round(x/g), clamped to [lower, upper]."""
    step = grid.step
    scaled = f"{raw} * {step.denominator}" if step <= 1 else f"{raw} / {step.numerator}"
    clamped = f"LEAST(GREATEST({scaled}, {grid.lower}), {grid.upper})"
    # NULL must stay NULL (DuckDB's GREATEST ignores NULL, so a clamp would turn it into the
    # lower bound) and NaN counts as NULL (DuckDB orders NaN above +inf: it would become hi).
    return (
        f"CASE WHEN {raw} IS NULL OR isnan({raw}) THEN NULL "
        f"ELSE CAST(ROUND({clamped}) AS BIGINT) END"
    )


def _counted(raw: str, expr: exp.Expression, analysis: Analysis) -> str:
    """A counted-only value: NaN counts as NULL here too, as it does where values are summed."""
    if isinstance(expr, exp.Column) and analysis.columns[expr.name].lower() in _FLOATS:
        return f"CASE WHEN isnan({raw}) THEN NULL ELSE {raw} END"
    return raw


def _domain_filter(key: GroupKey, index: int, name: str) -> str | None:
    if key.engine_type is not None:
        # The canonical domain (dpsql.sql.domains), held by the CTE _dom{index}.
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


def _domain_relation(keys: tuple[GroupKey, ...]) -> str:
    parts = []
    for i, key in enumerate(keys):
        if key.engine_type is not None:
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
    kept (``dpsql.sql.cells``). Every unit then lies in at most one cell, whatever the data and
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


def measurement_sql(spec: MeasurementSpec, bounding: Bounding) -> str:
    """The cross-unit aggregate of one measurement, over ``_capped``."""
    if spec.kind == "rows":
        return "SUM(_c)"
    if spec.kind == "units":
        if bounding.direct:
            # One row per kept row here, not per (unit, group): count the distinct units, the
            # NULL unit being one unit as everywhere else (COUNT(DISTINCT) skips it).
            return "COUNT(DISTINCT _u) + COALESCE(MAX(CASE WHEN _u IS NULL THEN 1 END), 0)"
        return "COUNT(*)"
    assert spec.value is not None
    i = spec.value
    if spec.kind == "count":
        return f"SUM(_c{i})"
    if spec.kind == "sum":
        return f"SUM(_t{i})"
    if spec.kind == "centred_squares":
        # Σ(x - m)² in units of (g/2)², per unit and group already capped in _capped.
        return f"SUM(_r{i})"
    grid = bounding.values[i].grid
    assert grid is not None
    # Centred sum in units of g/2: each row contributes 2·x - (lower + upper).
    return f"SUM(2 * _t{i} - _c{i} * CAST({grid.centre_units} AS HUGEINT))"


def _centred(i: int, bounding: Bounding) -> str:
    """A row's centred value ``2·v - (lower + upper)`` in units of g/2; within ±width."""
    grid = bounding.values[i].grid
    assert grid is not None
    return f"2 * _v{i} - {grid.centre_units}"


def _capped_sum(i: int, c: int, grid: Grid) -> str:
    """The unit's sum in grid units with at most C rows counted: S when n <= C, else
    round(C·S/n) clamped to [C·lower, C·upper], all in exact HUGEINT arithmetic.

    In DOUBLE, S (up to n·2^52) and the bounds C·lower, C·upper (up to 2^72) are rounded, and a
    unit could move a total by a grid unit more than the plan's sensitivity. Exact: with
    q = floor(S/n) and r = S - q·n in [0, n), round(C·S/n) = C·q + floor((2·C·r + n) / (2·n)).
    DuckDB's // truncates towards zero and % takes the dividend's sign, hence the correction.
    """
    s, n = f"CAST(_s{i} AS HUGEINT)", f"CAST(_n{i} AS HUGEINT)"
    q = f"({s} // {n} - CASE WHEN {s} % {n} < 0 THEN 1 ELSE 0 END)"
    r = f"({s} - {q} * {n})"
    scaled = f"({c} * {q} + (2 * {c} * {r} + {n}) // (2 * {n}))"
    low, high = f"CAST({c * grid.lower} AS HUGEINT)", f"CAST({c * grid.upper} AS HUGEINT)"
    return f"CASE WHEN _n{i} <= {c} THEN {s} ELSE LEAST(GREATEST({scaled}, {low}), {high}) END"


def _capped_squares(i: int, bounding: Bounding) -> str:
    """The unit's sum of squared centred values, in units of (g/2)², within [0, C·width²].

    With n <= C rows it is exact (each square is at most width²); with more, it is scaled to
    round(Q·C/n) in exact integer arithmetic and clamped, so that one unit moves one group's
    total by at most C·width² whatever its rows.
    """
    grid = bounding.values[i].grid
    assert grid is not None
    c = bounding.max_rows
    cap = c * grid.width**2
    scaled = f"CASE WHEN _n{i} <= {c} THEN _q{i} ELSE (_q{i} * {c} + _n{i} // 2) // _n{i} END"
    return f"LEAST(GREATEST({scaled}, 0), CAST({cap} AS HUGEINT))"


def _listed(i: int, value: ValueSpec) -> str:
    """Per unit and group, the value's non-NULL grid units (a quantile) or distinct values."""
    distinct = "DISTINCT " if value.role == "distinct" else ""
    return f"list({distinct}_v{i}) FILTER (WHERE _v{i} IS NOT NULL) AS _l{i}"


def _capped_list(i: int, c: int) -> str:
    """At most C of a unit's listed values, evenly spaced in sorted order: a function of the
    unit's own rows only, so one unit still moves a group by at most C values."""
    step = f"GREATEST((len(_l{i}) + {c - 1}) // {c}, 1)"
    # A list of at most C values is kept whole: no sort needed (the slice would keep it all).
    return (
        f"CASE WHEN len(_l{i}) <= {c} THEN _l{i} "
        f"ELSE list_slice(list_sort(_l{i}), 1, len(_l{i}), {step}) END AS _l{i}"
    )


def _list_measure(j: int, spec: MeasurementSpec, keys: list[str], direct: bool) -> str:
    """The cross-unit aggregate of a listed value: a histogram of grid units for a quantile's
    exponential mechanism, or the number of distinct values."""
    assert spec.value is not None
    i = spec.value
    agg = "histogram(_b)" if spec.kind == "quantile" else "COUNT(DISTINCT _b)"
    key_list = "".join(f"{k}, " for k in keys)
    group = f" GROUP BY {', '.join(keys)}" if keys else ""
    if direct:
        # Each unit has at most C rows per group: its list would be all its values, whole.
        values = f"SELECT {key_list}_v{i} AS _b FROM _capped WHERE _v{i} IS NOT NULL"
    else:
        values = f"SELECT {key_list}unnest(_l{i}) AS _b FROM _capped"
    return f"_x{j} AS (SELECT {key_list}{agg} AS _h FROM ({values}){group})"


def public_size(keys: Sequence[GroupKey]) -> int | None:
    """The number of public key combinations, when there are keys and every one lists its
    domain (rows outside it are dropped before bounding)."""
    if not keys or not all(k.domain is not None for k in keys):
        return None
    return math.prod(len(k.domain or ()) for k in keys)


def _ranked_where_needed(table: str, needing: str, qualify: str) -> str:
    """``table``'s rows, the units listed in ``needing`` only through the ranking window
    ``qualify``: the others keep every row, which is what the window would keep too. IS NOT
    DISTINCT FROM: rows with a NULL unit are one unit here as everywhere else (USING would match
    no NULL, and such a unit would escape the window)."""
    on = f"{table}._u IS NOT DISTINCT FROM {needing}._u"
    return (
        f"SELECT * FROM {table} ANTI JOIN {needing} ON {on} UNION ALL "
        f"SELECT * FROM (SELECT {table}.* FROM {table} SEMI JOIN {needing} ON {on}) {qualify}"
    )


def _row_cap(rows: str, keys: list[str], n_values: int, r: int | None, weighted: bool) -> str:
    """The CTEs ending in ``_rows``: with a total row cap R, each unit keeps R of its rows,
    ranked by a keyed hash of the row (DESIGN.md section 3): a function of the unit's own rows,
    so stability holds.

    Rows that tie on the hash are ordered by the columns themselves, so what is left tied is
    identical in every column a measurement reads (the unit, the keys, the raw values): which
    copy is kept cannot change any total, and the kept multiset is a function of the unit's
    rows whatever order the engine meets them in. (Numbering the copies first, to hash each
    apart, costs a window over every row partitioned by all the columns.) Only the units with
    more than R rows (``_heavy``) go through the window: the others keep every row, which is
    what the window would keep too.
    """
    if r is None:
        return f"_rows AS ({rows}), "
    if weighted:
        return _weighted_row_cap(rows, keys, r)
    columns = [*keys, *(f"_x{i}" for i in range(n_values))]
    order = ", ".join(["_u", *columns, f"CAST(${SALT_PARAMETER} AS BIGINT)"])
    ties = "".join(f", {c}" for c in columns)
    window = f"QUALIFY ROW_NUMBER() OVER (PARTITION BY _u ORDER BY hash({order}){ties}) <= {r}"
    return (
        f"_all AS ({rows}), "
        f"_heavy AS (SELECT _u FROM _all GROUP BY _u HAVING COUNT(*) > {r}), "
        f"_rows AS ({_ranked_where_needed('_all', '_heavy', window)}), "
    )


def _weighted_row_cap(rows: str, keys: list[str], r: int) -> str:
    """R's window when the query reads no value, only the unit and the keys: the copies of one
    (unit, keys) row are counted first (``_w``), and each unit keeps, in the order of the keyed
    hash of its distinct rows, whole rows until R is reached and part of the next, which is what
    the window over the rows keeps (identical rows tie, and are taken in a block), ranking far
    fewer rows."""
    group = ", ".join(["_u", *keys])
    order = ", ".join(["_u", *keys, f"CAST(${SALT_PARAMETER} AS BIGINT)"])
    ties = "".join(f", {k}" for k in keys)
    on = "_all._u IS NOT DISTINCT FROM _heavy._u"
    before = (
        f"COALESCE(SUM(_w) OVER (PARTITION BY _u ORDER BY hash({order}){ties} "
        "ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)"
    )
    return (
        f"_all AS (SELECT {group}, COUNT(*) AS _w FROM ({rows}) GROUP BY {group}), "
        f"_heavy AS (SELECT _u FROM _all GROUP BY _u HAVING SUM(_w) > {r}), "
        f"_rows AS (SELECT * FROM _all ANTI JOIN _heavy ON {on} UNION ALL "
        f"SELECT * EXCLUDE (_w, _b), LEAST(_w, {r} - _b) AS _w FROM (SELECT *, {before} AS _b "
        f"FROM _all SEMI JOIN _heavy ON {on}) WHERE _b < {r}), "
    )


def _direct(keys: list[str], bounding: Bounding, squared: list[int], weighted: bool) -> str:
    """``_capped`` when no per-(unit, group) bound can bind: one row per kept row (or per kept
    (unit, keys) row and its copies ``_w``), with the columns the cross-unit aggregate reads;
    nothing is capped or scaled."""
    columns = ["_u", *keys, "_w AS _c" if weighted else "1 AS _c"]
    for i, v in enumerate(bounding.values):
        if v.listed:
            columns.append(f"_v{i}")
            continue
        columns.append(f"CASE WHEN _v{i} IS NULL THEN 0 ELSE 1 END AS _c{i}")
        if v.grid is not None:
            columns.append(f"CAST(COALESCE(_v{i}, 0) AS HUGEINT) AS _t{i}")
    for i in squared:
        centred = f"CAST({_centred(i, bounding)} AS HUGEINT)"
        columns.append(f"CASE WHEN _v{i} IS NULL THEN 0 ELSE {centred} * {centred} END AS _r{i}")
    return f"SELECT {', '.join(columns)} FROM _vals"


def _kept(bounding: Bounding, keys: list[str], size: int | None) -> tuple[str, str]:
    """The ``_multi`` CTE (if any) and the query of ``_kept``: at most L0 groups per unit,
    ranked by a salted hash of (unit, keys), which depends only on the unit's own rows."""
    l0 = bounding.max_groups
    if bounding.direct:
        return "", ""
    if l0 is None or not keys:
        return "", "SELECT * FROM _units"
    # The salt is a parameter the engine binds: the plan, EXPLAIN and the bounded SQL text
    # never hold it (DESIGN.md section 3, step 4: a secret salt).
    order = ", ".join(["_u", *keys, f"CAST(${SALT_PARAMETER} AS BIGINT)"])
    window = f"QUALIFY ROW_NUMBER() OVER (PARTITION BY _u ORDER BY hash({order})) <= {l0}"
    if size is not None and size >= 4 * l0:
        # Many more public key combinations than L0: most units are expected to exceed L0, and
        # finding those that do not would cost more than ranking them too (same kept groups).
        return "", f"SELECT * FROM _units {window}"
    # Only units with more than L0 groups need the (expensive) ranking window.
    multi = f"_multi AS (SELECT _u FROM _units GROUP BY _u HAVING COUNT(*) > {l0}), "
    return multi, _ranked_where_needed("_units", "_multi", window)


def bounded_query(analysis: Analysis, bounding: Bounding) -> str:
    """The bounded SQL for ``analysis``: one row per group, one column per measurement. The
    engine runs this text; ``parse_bounded`` gives its tree (EXPLAIN's pretty form), parsed
    only when asked for: parsing and printing it again costs some 5 ms per plan."""
    keys = [f"_k{i}" for i in range(len(analysis.keys))]
    ints = frozenset(n for n, t in analysis.columns.items() if t.lower() in WIDENED)

    def total_sql(node: exp.Expression) -> str:
        return _sql(total(node, ints))

    key_list = "".join(f"{k}, " for k in keys)
    squared = sorted(
        {
            m.value
            for m in bounding.measurements
            if m.kind == "centred_squares" and m.value is not None
        }
    )
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
    rows_select = ", ".join(
        [f'"{analysis.unit}" AS _u']
        + [f"{total_sql(k.expr)} AS {name}" for k, name in zip(analysis.keys, keys, strict=True)]
        + [f"{expr} AS _x{i}" for i, expr in enumerate(raw)]
    )
    where = f" WHERE {' AND '.join(filters)}" if filters else ""
    # Without values and with at most R key combinations, copies of a (unit, keys) row are
    # common: R's window then runs on those rows with their number of copies, _w. (A choice of
    # speed on public numbers only; the totals are the same either way.)
    size = public_size(analysis.keys)
    r = bounding.max_total_rows
    weighted = r is not None and not bounding.values and (size is not None and size <= r)
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
    per_unit = ", ".join(
        ["_u", *keys, "SUM(_w) AS _n" if weighted else "COUNT(*) AS _n"]
        + [f"COUNT(_v{i}) AS _n{i}" for i, v in enumerate(bounding.values) if not v.listed]
        + [
            f"COALESCE(SUM(_v{i}), 0) AS _s{i}"
            for i, v in enumerate(bounding.values)
            if v.grid is not None and not v.listed
        ]
        + [_listed(i, v) for i, v in enumerate(bounding.values) if v.listed]
        + [
            f"COALESCE(SUM(CAST({_centred(i, bounding)} AS HUGEINT) * "
            f"CAST({_centred(i, bounding)} AS HUGEINT)), 0) AS _q{i}"
            for i in squared
        ]
    )
    group_units = ", ".join(["_u", *keys])
    ctes = ""
    multi, kept = _kept(bounding, keys, size)
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
    rows = f"SELECT {rows_select} FROM {analysis.source}{_cell_join(analysis)}{where}"
    rows = _row_cap(rows, keys, len(bounding.values), r, weighted)
    text = (
        f"WITH {_enforced_cell(analysis)}{_domain_ctes(analysis, total_sql)}"
        f"{rows}"
        f"_vals AS (SELECT {vals} FROM _rows), "
        + (
            f"_capped AS ({_direct(keys, bounding, squared, weighted)}), "
            if bounding.direct
            else f"_units AS (SELECT {per_unit} FROM _vals GROUP BY {group_units}), "
            f"{multi}_kept AS ({kept}), "
            f"_capped AS (SELECT {capped} FROM _kept), "
        )
        + f"{ctes}_agg AS ({aggregated}) "
        f"{final}"
    )
    return text


def parse_bounded(text: str) -> exp.Select:
    try:
        parsed = sqlglot.parse_one(text, read=DIALECT)
    except RecursionError:
        raise UnsupportedQueryError("the query is nested too deeply") from None
    assert isinstance(parsed, exp.Select)
    return parsed
