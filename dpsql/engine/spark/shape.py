"""Shapes of the bounded query chosen for DuckDB that Spark runs faster in another form with
the same rows, rewritten on the DuckDB tree before it is lowered (``lower``).

``dpsql.bound.caps`` sends only the units that exceed a cap through its ranking window or its
top-R aggregate (the others keep every row, which is what the window would keep too): DuckDB
reads a CTE once, and its window over every unit costs more than finding the few that need it.
Spark inlines a CTE at each reference, so the split reads the table three times, where the
window alone (with Spark's per-partition limit) reads it once. ``reshape`` rewrites exactly
that shape, checked node by node, back into the window over every unit; anything else is left
as it is.

A row's key is held to a literal domain by ``key IN (SELECT _k FROM _dom)``, the domain a CTE
of VALUES (``dpsql.bound.filters``): Spark plans that as a join, where the same list written
``key IN (v1, ...)`` (equal by definition in SQL: an IN list is an IN over the table of its
values) is a filter it pushes into the Parquet scan. ``reshape`` writes the list for domains of
up to ``INLINE_DOMAIN`` values.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.bound.nodes import first_rows

__all__ = ["INLINE_DOMAIN", "reshape"]

INLINE_DOMAIN = 1000  # values; a longer list makes a long SQL text for no gain over the join


def _cte(node: exp.Expression, name: str) -> exp.Select | None:
    """The query of the CTE ``name`` visible from ``node`` (the nearest WITH that lists it)."""
    scope: exp.Expression | None = node
    while scope is not None:
        with_ = scope.args.get("with_")
        if isinstance(with_, exp.With):
            for cte in with_.expressions:
                if cte.alias_or_name == name:
                    query = cte.this
                    return query if isinstance(query, exp.Select) else None
        parent = scope.parent
        scope = parent if isinstance(parent, exp.Expression) else None
    return None


def _table(node: exp.Expression | None) -> str | None:
    """The name of a plain, unaliased table or CTE reference."""
    if isinstance(node, exp.Table) and not node.args.get("alias") and not node.args.get("db"):
        return node.name
    return None


def _unit_on(table: str, needing: str) -> exp.Expression:
    """``table._u IS NOT DISTINCT FROM needing._u``, as ``caps._ranked_where_needed`` joins."""
    return exp.NullSafeEQ(
        this=exp.column("_u", table=table), expression=exp.column("_u", table=needing)
    )


def _only(select: exp.Select, *allowed: str) -> bool:
    """No clause of ``select`` other than ``allowed`` (and its column list) is set."""
    present = {k for k, v in select.args.items() if v not in (None, [], False)}
    return present <= {"expressions", *allowed}


def _threshold(needing: exp.Select, table: str) -> tuple[str, int] | None:
    """For ``SELECT _u FROM table GROUP BY _u HAVING <agg> > k``: ("count", k) for COUNT(*),
    ("weight", k) for SUM(_w); None for anything else."""
    having = needing.args.get("having")
    group = needing.args.get("group")
    if (
        not _only(needing, "from_", "group", "having")
        or needing.expressions != [exp.column("_u")]
        or _table(needing.args["from_"].this) != table
        or group is None
        or group.expressions != [exp.column("_u")]
        or having is None
        or not isinstance(having.this, exp.GT)
        or not isinstance(having.this.expression, exp.Literal)
        or having.this.expression.is_string
    ):
        return None
    agg, k = having.this.this, int(having.this.expression.this)
    if isinstance(agg, exp.Count) and isinstance(agg.this, exp.Star):
        return "count", k
    if isinstance(agg, exp.Sum) and agg.this == exp.column("_w"):
        return "weight", k
    return None


def _limit(node: exp.Expression | None, kind: type[exp.Expression], left: exp.Expression) -> int:
    """k for ``left <= k`` (kind LTE) or ``left < k`` (kind LT); -1 if ``node`` is not that."""
    if (
        isinstance(node, kind)
        and node.this == left
        and isinstance(node.expression, exp.Literal)
        and not node.expression.is_string
    ):
        return int(node.expression.this)
    return -1


def _row_number_limit(select: exp.Select) -> int:
    """k for ``... QUALIFY ROW_NUMBER() OVER (PARTITION BY _u ORDER BY ...) <= k``; else -1."""
    qualify = select.args.get("qualify")
    condition = qualify.this if isinstance(qualify, exp.Qualify) else None
    window = condition.this if isinstance(condition, exp.LTE) else None
    if (
        not isinstance(window, exp.Window)
        or not isinstance(window.this, exp.RowNumber)
        or window.args.get("partition_by") != [exp.column("_u")]
        or window.args.get("spec") is not None
    ):
        return -1
    return _limit(condition, exp.LTE, window)


def _trims_to(select: exp.Select, k: int) -> bool:
    """``select`` lists ``* EXCLUDE (_w, _b), LEAST(_w, k - _b) AS _w``: every column as it is
    but the weight, trimmed to what is left of k (``caps._weighted_row_cap``)."""
    if len(select.expressions) != 2:
        return False
    star, weight = select.expressions
    if not isinstance(star, exp.Star) or not isinstance(weight, exp.Alias):
        return False
    excluded = star.args.get("except_") or []
    least = weight.this
    left = exp.Sub(this=exp.Literal.number(k), expression=exp.column("_b"))
    return (
        sorted(c.name for c in excluded) == ["_b", "_w"]
        and weight.alias == "_w"
        and isinstance(least, exp.Least)
        and least.this == exp.column("_w")
        and least.expressions == [left]
    )


def _split(union: exp.Union) -> tuple[exp.Select, str, str, exp.Expression] | None:
    """For a UNION ALL whose left branch is ``SELECT * FROM table ANTI JOIN needing ON
    table._u IS NOT DISTINCT FROM needing._u`` (``caps``' units within the cap): its right
    branch, ``table``, ``needing`` and that ON condition; None for anything else."""
    left, right = union.this, union.expression
    if (
        type(union) is not exp.Union
        or union.args.get("distinct")
        or not (isinstance(left, exp.Select) and isinstance(right, exp.Select))
    ):
        return None
    joins = left.args.get("joins") or []
    if len(joins) != 1 or not _only(left, "from_", "joins") or left.expressions != [exp.Star()]:
        return None
    anti = joins[0]
    table, needing = _table(left.args["from_"].this), _table(anti.this)
    if table is None or needing is None or anti.args.get("kind") != "ANTI":
        return None
    on = _unit_on(table, needing)
    if anti.args.get("on") != on or anti.args.get("using"):
        return None
    return right, table, needing, on


def _ranked_everywhere(union: exp.Union) -> exp.Select | None:
    """The window branch of ``caps._ranked_where_needed``'s UNION ALL, applied to every unit,
    or None if ``union`` is not that shape.

    The left branch keeps the units not in ``needing``; the right ranks those in it. Where
    ``needing`` lists the units with more than k rows (COUNT(*) > k) and the window keeps row
    numbers <= k, a unit outside it has at most k rows and keeps all of them in the window too;
    where it lists the units of weight above k (SUM(_w) > k, ``caps._weighted_row_cap``) and
    the window keeps rows whose weight before them is < k, trimmed to k, a unit of weight at
    most k keeps every row whole. Either way the window alone returns the same rows.
    """
    split = _split(union)
    if split is None:
        return None
    right, table, needing, on = split
    semis = [j for j in right.find_all(exp.Join) if j.args.get("kind") == "SEMI"]
    if len(semis) != 1 or semis[0].args.get("on") != on or _table(semis[0].this) != needing:
        return None
    semi = semis[0]
    inner = semi.parent
    if not isinstance(inner, exp.Select) or _table(inner.args["from_"].this) != table:
        return None
    if len(inner.args.get("joins") or []) != 1 or inner.args.get("where") is not None:
        return None
    definition = _cte(union, needing)
    threshold = _threshold(definition, table) if definition is not None else None
    if threshold is None:
        return None
    kind, k = threshold
    outer = right.args["from_"].this
    if not (isinstance(outer, exp.Subquery) and outer.this is inner):
        return None
    # The window branch must change nothing else: for COUNT(*), every column as it is and no
    # filter but the window; for weights, the filter on the weight before and the trim to k.
    if kind == "count" and (
        _row_number_limit(right) != k
        or right.expressions != [exp.Star()]
        or not _only(right, "from_", "qualify")
    ):
        return None
    where = right.args.get("where")
    below = _limit(where.this if where else None, exp.LT, exp.column("_b"))
    if kind == "weight" and (
        below != k or not _only(right, "from_", "where") or not _trims_to(right, k)
    ):
        return None
    collapsed = right.copy()
    for join in collapsed.find_all(exp.Join):
        if join.args.get("kind") == "SEMI":
            join.pop()
            break
    return collapsed


def _struct_fields(node: exp.Expression) -> list[tuple[str, exp.Expression]] | None:
    """The (name, value) fields of a struct literal ``{'a': x, ...}``; None for anything else."""
    if not isinstance(node, exp.Struct):
        return None
    out = []
    for field in node.expressions:
        if not isinstance(field, exp.PropertyEQ) or not isinstance(field.this, exp.Identifier):
            return None
        out.append((field.this.name, field.expression))
    return out


def _top_everywhere(union: exp.Union) -> exp.Select | None:
    """The window over every unit that ``caps._top_where_needed``'s UNION ALL stands for, or None
    if ``union`` is not that shape: the left branch keeps the units not in ``needing`` (COUNT(*)
    over k), the right keeps each unit in it down to its k rows of least key, by ``ARG_MIN(row,
    key, k)`` unnested, its row struct every column as it is. A unit within k rows keeps all of
    them in the window too, so the window ordered by the key's fields in turn, keeping row
    numbers <= k, returns the same rows (ties being rows equal in every column)."""
    split = _split(union)
    if split is None or not _only(split[0], "from_"):
        return None
    right, table, needing, on = split
    kept = right.args["from_"].this
    kept = kept.this if isinstance(kept, exp.Subquery) and not kept.args.get("alias") else None
    if not isinstance(kept, exp.Select) or not _only(kept, "from_", "group"):
        return None
    group = kept.args.get("group")
    if group is None or group.expressions != [exp.column("_u")] or len(kept.expressions) != 2:
        return None
    unit, unnested = kept.expressions
    top = unnested.this if isinstance(unnested, exp.Alias) else None
    if (
        unit != exp.column("_u")
        or not isinstance(unnested, exp.Alias)
        or unnested.alias != "_t"
        or not isinstance(top, exp.Explode)
        or not isinstance(top.this, exp.ArgMin)
    ):
        return None
    arg_min = top.this
    row, key = _struct_fields(arg_min.this), _struct_fields(arg_min.expression)
    count = arg_min.args.get("count")
    if row is None or not key or not isinstance(count, exp.Literal) or count.is_string:
        return None
    k = int(count.this)
    names = [n for n, _ in row]
    back = [
        exp.alias_(exp.Bracket(this=exp.column("_t"), expressions=[exp.Literal.string(n)]), n)
        for n in names
    ]
    if any(value != exp.column(n) for n, value in row) or right.expressions != [
        exp.column("_u"),
        *back,
    ]:
        return None
    inner = kept.args["from_"].this
    inner = inner.this if isinstance(inner, exp.Subquery) and not inner.args.get("alias") else None
    if not isinstance(inner, exp.Select) or _table(inner.args["from_"].this) != table:
        return None
    semis = inner.args.get("joins") or []
    if (
        len(semis) != 1
        or semis[0].args.get("kind") != "SEMI"
        or semis[0].args.get("on") != on
        or _table(semis[0].this) != needing
        or not _only(inner, "from_", "joins")
        or inner.expressions != [exp.Column(this=exp.Star(), table=exp.to_identifier(table))]
    ):
        return None
    definition = _cte(union, needing)
    if definition is None or _threshold(definition, table) != ("count", k):
        return None
    every = exp.select(exp.Column(this=exp.Star(), table=exp.to_identifier(table))).from_(table)
    window = first_rows([exp.column("_u")], [v.copy() for _, v in key], k)
    return exp.select(exp.Star()).from_(every.subquery()).qualify(window)


def _domain_values(node: exp.In) -> list[exp.Expression] | None:
    """The values of ``node``'s subquery when it is ``SELECT _k FROM _dom`` over a CTE of
    one-column VALUES (the literal domain of ``dpsql.analyze.domains.domain_sql``); else None."""
    query = node.args.get("query")
    select = query.this if isinstance(query, exp.Subquery) else None
    if not isinstance(select, exp.Select) or not _only(select, "from_"):
        return None
    name = _table(select.args["from_"].this)
    if name is None or len(select.expressions) != 1:
        return None
    column = select.expressions[0]
    definition = _cte(node, name)
    if (
        not isinstance(column, exp.Column)
        or column.table
        or definition is None
        or not _only(definition, "from_")
        or definition.expressions != [exp.Star()]
    ):
        return None
    values = definition.args["from_"].this
    alias = values.args.get("alias") if isinstance(values, exp.Values) else None
    if (
        not isinstance(values, exp.Values)
        or alias is None
        or [c.name for c in alias.columns] != [column.name]
        or not 0 < len(values.expressions) <= INLINE_DOMAIN
    ):
        return None
    rows = values.expressions
    if not all(isinstance(r, exp.Tuple) and len(r.expressions) == 1 for r in rows):
        return None
    return [r.expressions[0].copy() for r in rows]


def _inline_domains(tree: exp.Expression) -> None:
    for node in list(tree.find_all(exp.In)):
        values = _domain_values(node)
        if values is not None:
            node.set("query", None)
            node.set("expressions", values)


def _referenced(tree: exp.Expression, name: str) -> bool:
    return any(_table(t) == name for t in tree.find_all(exp.Table))


def reshape(tree: exp.Expression) -> exp.Expression:
    """``tree`` with every ranking split by ``caps._ranked_where_needed`` merged into its
    window over every unit, the CTEs that only the split read removed, and every literal domain
    of a filter written as an IN list."""
    _inline_domains(tree)
    changed = False
    for union in list(tree.find_all(exp.Union)):
        collapsed = _ranked_everywhere(union) or _top_everywhere(union)
        if collapsed is not None:
            union.replace(collapsed)
            changed = True
    if not changed:
        return tree
    with_ = tree.args.get("with_")
    if isinstance(with_, exp.With):
        unused = [c for c in with_.expressions if not _referenced(tree, c.alias_or_name)]
        for cte in unused:
            cte.pop()
    return tree
