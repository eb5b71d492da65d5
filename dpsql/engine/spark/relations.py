"""The relations of FROM as the lowering writes them: tables, VALUES, subqueries and joins
(``Relations``, the part of ``Lowerer`` that lowers them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from sqlglot import exp

from dpsql.engine.spark.dialect import refuse
from dpsql.engine.spark.nodes import Context, Lowered, Source, cast_to, ident
from dpsql.engine.spark.types import unify
from dpsql.sql.validate import describe


class Relations:
    """The relations of FROM: the methods of ``Lowerer`` that lower them."""

    if TYPE_CHECKING:  # the rest of ``Lowerer``, which these methods call
        catalog: dict[str, dict[str, str]]

        def fresh(self, stem: str) -> str: ...

        def query(
            self, node: exp.Expression, ctes: Mapping[str, dict[str, str]]
        ) -> tuple[exp.Expression, dict[str, str]]: ...

        def boolean(self, node: exp.Expression, ctx: Context, where: str) -> Lowered: ...

        def expr(self, node: exp.Expression, ctx: Context) -> Lowered: ...

    def source(
        self, node: exp.Expression, ctes: Mapping[str, dict[str, str]]
    ) -> tuple[exp.Expression, Source]:
        if isinstance(node, exp.Table):
            if (
                node.args.get("db")
                or node.args.get("catalog")
                or not isinstance(node.this, exp.Identifier)
            ):
                raise refuse("a qualified table name or table function")
            name = node.name.lower()
            alias = (node.alias or name).lower()
            if name in ctes:
                columns = dict(ctes[name])
            elif name in self.catalog:
                columns = dict(self.catalog[name])
            else:
                raise refuse(f"the table {name}, which is not in the catalog,")
            if node.args.get("alias") is not None and node.args["alias"].columns:
                raise refuse("column aliases on a table")
            table = exp.Table(this=ident(name))
            if alias != name:
                table.set("alias", exp.TableAlias(this=ident(alias)))
            return table, Source(alias, columns)
        if isinstance(node, exp.Values):
            return self.values(node)
        if isinstance(node, exp.Subquery):
            body, columns = self.query(node.this, ctes)
            alias = (node.alias or self.fresh("s")).lower()
            alias_node = node.args.get("alias")
            renamed = alias_node.columns if alias_node is not None else []
            if renamed:
                if len(renamed) != len(columns):
                    raise refuse("a column alias list of another length than its query")
                columns = dict(
                    zip([c.name.lower() for c in renamed], columns.values(), strict=True)
                )
            ta = exp.TableAlias(this=ident(alias))
            if renamed:
                ta.set("columns", [ident(c) for c in columns])
            return exp.Subquery(this=body, alias=ta), Source(alias, columns)
        raise refuse(f"{describe(node)} in FROM")

    def values(self, node: exp.Values) -> tuple[exp.Expression, Source]:
        """VALUES: a Spark inline table whose every value is cast to its column's type (Spark
        would otherwise type a column by its own coercion rules)."""
        alias = node.args.get("alias")
        if alias is None or not alias.columns:
            raise refuse("VALUES without column names")
        names = [c.name.lower() for c in alias.columns]
        ctx = Context((), {})
        rows = []
        for row in node.expressions:
            values = row.expressions if isinstance(row, exp.Tuple) else [row]
            if len(values) != len(names):
                raise refuse("VALUES rows of different lengths")
            rows.append([self.constant(v, ctx) for v in values])
        types = [unify([r[i].type for r in rows], "VALUES") for i in range(len(names))]
        tuples = []
        for r in rows:
            cells = []
            for value, t in zip(r, types, strict=True):
                cells.append(value.node if t in (value.type, "NULL") else cast_to(value.node, t))
            tuples.append(exp.Tuple(expressions=cells))
        table = exp.Values(
            expressions=tuples,
            alias=exp.TableAlias(this=ident(alias.name.lower()), columns=[ident(n) for n in names]),
        )
        return table, Source(alias.name.lower(), dict(zip(names, types, strict=True)))

    def constant(self, node: exp.Expression, ctx: Context) -> Lowered:
        lowered = self.expr(node, ctx)
        if any(isinstance(n, exp.Column) for n in node.walk()):
            raise refuse("a column in VALUES")
        return lowered

    def join(
        self, join: exp.Join, sources: list[Source], ctes: Mapping[str, dict[str, str]]
    ) -> exp.Join:
        node, source = self.source(join.this, ctes)
        kind = (join.args.get("kind") or "").upper()
        side = (join.args.get("side") or "").upper()
        if join.args.get("using") or join.args.get("method"):
            raise refuse("JOIN ... USING or NATURAL JOIN")
        out = exp.Join(this=node)
        if kind in ("SEMI", "ANTI"):
            if side not in ("", "LEFT"):
                raise refuse(f"{side} {kind} JOIN")
            # DuckDB's SEMI and ANTI JOIN keep the left side's rows and columns, as Spark's
            # LEFT SEMI and LEFT ANTI JOIN do.
            out.set("side", "LEFT")
            out.set("kind", kind)
            source.star = False
        elif kind == "CROSS":
            out.set("kind", "CROSS")
        elif side in ("LEFT", "RIGHT", "FULL") and kind in ("", "OUTER"):
            # RIGHT and FULL only join two private relations on their units (dpsql.analyze.joins).
            out.set("side", side)
        elif side == "" and kind in ("", "INNER"):
            pass  # an inner join
        else:
            raise refuse(f"{side} {kind} JOIN".replace("  ", " "))
        sources.append(source)
        on = join.args.get("on")
        if on is not None:
            ctx = Context(tuple(sources), ctes, qualified=True)
            cond = self.boolean(
                on, replace(ctx, sources=tuple(replace(s, star=True) for s in sources)), "ON"
            )
            out.set("on", cond.node)
        elif kind != "CROSS":
            raise refuse("a JOIN without ON")
        return out
