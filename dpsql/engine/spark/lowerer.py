"""The lowering of queries (``Lowerer``: WITH, UNION, SELECT, its output columns, QUALIFY), and
of every expression in them through the dispatch table of ``handlers``; the relations of FROM
are ``relations``'s.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import replace

from sqlglot import exp

from dpsql.engine.spark.dialect import refuse
from dpsql.engine.spark.handlers import FUNCTIONS, HANDLERS
from dpsql.engine.spark.histogram import rewrite_histogram
from dpsql.engine.spark.nodes import Context, Lowered, Source, col, ident
from dpsql.engine.spark.relations import Relations
from dpsql.engine.spark.types import norm_type, unify
from dpsql.sql.validate import describe

# -- the lowering -------------------------------------------------------------------------------


class Lowerer(Relations):
    """One lowering of one bounded query over one catalog."""

    def __init__(self, catalog: Mapping[str, Mapping[str, str]]):
        self.catalog = {
            t.lower(): {c.lower(): norm_type(ty) for c, ty in cols.items()}
            for t, cols in catalog.items()
        }
        self._fresh = itertools.count()

    def fresh(self, stem: str) -> str:
        # dpsql reserves names starting with _dpsql from analysts' queries: no clash.
        return f"_dpsql_{stem}{next(self._fresh)}"

    # -- queries --------------------------------------------------------------------------------

    def query(
        self, node: exp.Expression, ctes: Mapping[str, dict[str, str]]
    ) -> tuple[exp.Expression, dict[str, str]]:
        """A query (SELECT, UNION ALL, parenthesized) and its output columns."""
        if isinstance(node, exp.Subquery) and node.alias == "":
            return self.query(node.this, ctes)
        with_ = node.args.get("with_")
        ctes = dict(ctes)
        lowered_ctes: list[exp.CTE] = []
        if with_ is not None:
            if with_.args.get("recursive"):
                raise refuse("WITH RECURSIVE")
            for cte in with_.expressions:
                body, columns = self.query(cte.this, ctes)
                ctes[cte.alias.lower()] = columns
                lowered_ctes.append(
                    exp.CTE(this=body, alias=exp.TableAlias(this=ident(cte.alias.lower())))
                )
        if isinstance(node, exp.Select):
            out, columns = self.select(node, ctes)
        elif isinstance(node, exp.Union | exp.Intersect | exp.Except):
            out, columns = self.union(node, ctes)
        else:
            raise refuse(describe(node))
        if lowered_ctes:
            out.set("with_", exp.With(expressions=lowered_ctes))
        return out, columns

    def union(
        self, node: exp.Union | exp.Intersect | exp.Except, ctes: Mapping[str, dict[str, str]]
    ) -> tuple[exp.Expression, dict[str, str]]:
        """UNION, INTERSECT and EXCEPT (each DISTINCT or ALL, as Spark has them all): the
        columns unified alike on both engines."""
        left, lcols = self.query(node.this, ctes)
        right, rcols = self.query(node.expression, ctes)
        word = node.key.upper()
        if len(lcols) != len(rcols):
            raise refuse(f"{word} of queries with different numbers of columns")
        columns: dict[str, str] = {}
        for (name, lt), rt in zip(lcols.items(), rcols.values(), strict=True):
            # Numbers widen alike on both engines (BIGINT with DECIMAL(38, 0) is DECIMAL(38,
            # 0)); other mixed kinds are refused by unify.
            columns[name] = unify([lt, rt], word)
        distinct = bool(node.args.get("distinct"))
        return type(node)(this=left, expression=right, distinct=distinct), columns

    def select(
        self, sel: exp.Select, ctes: Mapping[str, dict[str, str]]
    ) -> tuple[exp.Expression, dict[str, str]]:
        if any(
            isinstance(node, exp.Anonymous) and node.name.upper() == "HISTOGRAM"
            for item in sel.expressions
            for node in item.walk()
        ):
            sel = rewrite_histogram(sel, self.fresh)
        for key in ("limit", "offset", "order", "prewhere", "windows", "laterals", "pivots"):
            if sel.args.get(key):
                # A LIMIT or ORDER BY does not occur in a bounded query; a LIMIT would keep an
                # arbitrary subset of the rows on Spark.
                raise refuse(f"{key.upper()} in the bounded query")
        group = sel.args.get("group")
        if group is not None and any(
            group.args.get(k) for k in ("grouping_sets", "rollup", "cube")
        ):
            raise refuse("GROUPING SETS, ROLLUP or CUBE")
        out = exp.Select()
        sources: list[Source] = []
        frm = sel.args.get("from_")
        if frm is not None:
            node, source = self.source(frm.this, ctes)
            out.set("from_", exp.From(this=node))
            sources.append(source)
        joins = []
        for join in sel.args.get("joins") or []:
            joins.append(self.join(join, sources, ctes))
        if joins:
            out.set("joins", joins)
        ctx = Context(tuple(sources), ctes, qualified=len(sources) > 1)
        where = sel.args.get("where")
        if where is not None:
            cond = self.boolean(where.this, ctx, "WHERE")
            out.set("where", exp.Where(this=cond.node))
        if group is not None:
            # DuckDB groups by a SELECT alias when FROM has no such column: its expression.
            aliases = {i.alias.lower(): i.this for i in sel.expressions if isinstance(i, exp.Alias)}
            keys = []
            for g in group.expressions:
                name = g.name.lower() if isinstance(g, exp.Column) and not g.table else ""
                aliased = name in aliases and not any(name in src.columns for src in sources)
                keys.append(self.expr(aliases[name] if aliased else g, ctx).node)
            out.set("group", exp.Group(expressions=keys))
        having = sel.args.get("having")
        agg_ctx = replace(ctx, aggregates=True)
        if having is not None:
            cond = self.boolean(having.this, agg_ctx, "HAVING")
            out.set("having", exp.Having(this=cond.node))
        items, columns = self.projections(sel, replace(agg_ctx, windows=True))
        if sel.args.get("distinct"):
            if sel.args["distinct"].args.get("on"):
                raise refuse("DISTINCT ON")
            out.set("distinct", exp.Distinct())
        out.set("expressions", items)
        qualify = sel.args.get("qualify")
        if qualify is not None:
            if sel.args.get("distinct"):
                raise refuse("QUALIFY with DISTINCT")
            return self.qualify(out, columns, qualify.this, agg_ctx)
        return out, columns

    def projections(
        self, sel: exp.Select, ctx: Context
    ) -> tuple[list[exp.Expression], dict[str, str]]:
        items: list[exp.Expression] = []
        columns: dict[str, str] = {}

        def add(name: str, node: exp.Expression, t: str, alias: bool) -> None:
            if name in columns:
                # Spark names a duplicate column differently; the bounded query has none.
                raise refuse(f"two output columns named {name}")
            columns[name] = t
            items.append(exp.Alias(this=node, alias=ident(name)) if alias else node)

        generators = 0
        for index, item in enumerate(sel.expressions):
            if isinstance(item.this if isinstance(item, exp.Alias) else item, exp.Explode):
                # UNNEST only as a whole SELECT item, one per SELECT (Spark's generators).
                generators += 1
                if generators > 1:
                    raise refuse("two UNNESTs in one SELECT")
                item_ctx = replace(ctx, generators=True)
            else:
                item_ctx = ctx
            star = item if isinstance(item, exp.Star) else None
            table = None
            if isinstance(item, exp.Column) and isinstance(item.this, exp.Star):
                star, table = item.this, item.table.lower()
            if star is not None:
                # SELECT * (and * EXCLUDE) become explicit columns: Spark has no EXCLUDE, and
                # a QUALIFY rewrite must list exactly the columns the query had.
                excluded = {e.name.lower() for e in star.args.get("except_") or []}
                if star.args.get("replace") or star.args.get("rename"):
                    raise refuse("SELECT * REPLACE")
                listed = [s for s in ctx.sources if (s.alias == table if table else s.star)]
                if table and not listed:
                    raise refuse(f"{table}.* of no table in FROM")
                for source in listed:
                    for name, t in source.columns.items():
                        if name not in excluded:
                            ref = col(name, source.alias if ctx.qualified or table else None)
                            add(name, ref, t, False)
                continue
            if isinstance(item, exp.Alias):
                lowered = self.expr(item.this, item_ctx)
                add(item.alias.lower(), lowered.node, lowered.type, True)
            elif isinstance(item, exp.Column):
                lowered = self.expr(item, item_ctx)
                add(item.name.lower(), lowered.node, lowered.type, False)
            else:
                lowered = self.expr(item, item_ctx)
                # An unnamed output: nothing refers to it by name (UNION takes the first
                # branch's names); named here only to be listed.
                add(f"_dpsql_c{index}", lowered.node, lowered.type, False)
        return items, columns

    def qualify(
        self, inner: exp.Select, columns: dict[str, str], condition: exp.Expression, ctx: Context
    ) -> tuple[exp.Expression, dict[str, str]]:
        """``SELECT cols ... QUALIFY cond`` as ``SELECT cols FROM (SELECT cols, <windows> ...)
        WHERE cond'``: Spark has no QUALIFY, and the outer SELECT lists exactly the query's
        columns (a rewrite keeping ``*`` would add the window's column to the output)."""
        windows: dict[str, exp.Window] = {}

        def swap(node: exp.Expression) -> exp.Expression:
            if isinstance(node, exp.Window):
                name = self.fresh("w")
                windows[name] = node
                return exp.column(name)
            return node

        replaced = condition.copy().transform(swap)
        if not windows:
            raise refuse("QUALIFY without a window function")
        win_ctx = replace(ctx, windows=True)
        extra: dict[str, str] = {}
        for name, window in windows.items():
            lowered = self.expr(window, win_ctx)
            inner.append("expressions", exp.Alias(this=lowered.node, alias=ident(name)))
            extra[name] = lowered.type
        alias = self.fresh("q")
        outer_source = Source(alias, {**columns, **extra})
        outer_ctx = Context((outer_source,), ctx.ctes)
        for column in replaced.find_all(exp.Column):
            if column.name.lower() not in extra:
                raise refuse("QUALIFY on a column outside its window functions")
        cond = self.boolean(replaced, outer_ctx, "QUALIFY")
        outer = exp.Select(expressions=[col(n) for n in columns])
        outer.set(
            "from_",
            exp.From(this=exp.Subquery(this=inner, alias=exp.TableAlias(this=ident(alias)))),
        )
        outer.set("where", exp.Where(this=cond.node))
        return outer, columns

    # -- expressions ----------------------------------------------------------------------------

    def boolean(self, node: exp.Expression, ctx: Context, where: str) -> Lowered:
        lowered = self.expr(node, ctx)
        if lowered.type not in ("BOOLEAN", "NULL"):
            raise refuse(f"{where} on a value of type {lowered.type}")
        return lowered

    def expr(self, node: exp.Expression, ctx: Context) -> Lowered:
        """``node`` lowered by its handler, looked up by its exact class (an anonymous function
        by its name): a subclass means something else (TRY_CAST is a CAST to sqlglot), so it is
        lowered by its own entry or refused, never as its parent."""
        if type(node) is exp.Anonymous:
            function = FUNCTIONS.get(node.name.upper())
            if function is None:
                raise refuse(describe(node))
            return function(self, node, ctx)
        handler = HANDLERS.get(type(node))
        if handler is None:
            raise refuse(describe(node))
        return handler(self, node, ctx)
