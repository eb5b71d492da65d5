"""Per-unit subqueries: a FROM-subquery or CTE that aggregates and groups by the unit.

A subquery that aggregates and groups by the unit: each output row summarises one unit's rows,
so every row of the relation is still one unit's. GROUP BY must hold the unit column itself;
grouped by the unit alone, the relation holds one row per unit.

Also here: the names of a subquery's outputs, and the DuckDB types of a derived relation, which
every subquery and CTE shares. The methods here are part of ``dpsql.analyze.relations.Builder``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from fractions import Fraction

from sqlglot import exp

from dpsql.analyze.intervals import Interval, interval_of
from dpsql.analyze.scope import UNIT_COLUMN, Describe, Relation, RelColumn, _quote, resolve_expr
from dpsql.errors import SchemaError, UnsupportedQueryError
from dpsql.sql.totality import WIDENED, as_boolean
from dpsql.sql.tree import transform


class PerUnit:
    """The per-unit half of ``Builder``: pre-aggregation per unit, and typing derived relations."""

    describe: Describe | None
    total: Callable[[exp.Expression, frozenset[str]], exp.Expression]

    def _per_unit(  # noqa: PLR0915 - one pass over the subquery's clauses
        self, select: exp.Select, source: Relation, filters: str, name: str
    ) -> Relation:
        """A subquery that aggregates per unit: GROUP BY must hold the unit column itself."""
        group = select.args.get("group")
        keys = [resolve_expr(k, source, "GROUP BY") for k in (group.expressions if group else [])]
        assert source.unit is not None
        if not any(isinstance(k, exp.Column) and k.name == source.unit for k in keys):
            if source.unit.startswith("_dpsql"):
                # A unit resolved along a path (or a FULL JOIN's) is no column a query can name.
                raise UnsupportedQueryError(
                    f"a subquery that aggregates must GROUP BY the privacy unit, and "
                    f"{source.table}'s unit is reached through its unit_path (or an outer "
                    "join), not a column: aggregate per unit from the table the path ends at"
                )
            raise UnsupportedQueryError(
                f"a subquery that aggregates must GROUP BY the privacy unit {source.unit}: "
                "otherwise its rows combine several units"
            )
        integers = frozenset(c for c, col in source.columns.items() if col.type.lower() in WIDENED)
        key_sql = {k.sql(dialect="duckdb"): i for i, k in enumerate(keys)}
        aggregates: list[str] = []
        intervals: dict[str, Interval] = {}
        for i, k in enumerate(keys):
            intervals[f"_g{i}"] = interval_of(k, source.bounds)

        counts: set[str] = set()

        def lift(node: exp.Expression) -> exp.Expression:
            """Replace each aggregate and key by a reference into the grouped inner SELECT."""

            def swap(n: exp.Expression) -> exp.Expression:
                if isinstance(n, exp.AggFunc):
                    ref = f"_v{len(aggregates)}"
                    sql, interval = self._inner_aggregate(n, source, integers)
                    aggregates.append(f"{sql} AS {ref}")
                    intervals[ref] = interval
                    if sql.startswith("COUNT("):
                        counts.add(ref)  # BIGINT: widened under arithmetic, like a column
                    return exp.column(ref)
                if not isinstance(n, exp.Literal):
                    text = n.sql(dialect="duckdb")
                    if text in key_sql:
                        return exp.column(f"_g{key_sql[text]}")
                return n

            lifted = transform(node, swap)
            for column in lifted.find_all(exp.Column):
                if not (column.name.startswith("_g") or column.name.startswith("_v")):
                    raise SchemaError(
                        f"column {column.name} in subquery {name} must be in GROUP BY or inside "
                        "an aggregate"
                    )
            return lifted

        outputs: dict[str, tuple[exp.Expression, RelColumn]] = {}
        for index, item in enumerate(select.expressions):
            if isinstance(item, exp.Star):
                raise UnsupportedQueryError("SELECT * is not allowed in a subquery with GROUP BY")
            resolved = resolve_expr(item.unalias(), source, "a subquery's SELECT list")
            out = _item_name(item, index)
            if out in outputs:
                raise SchemaError(f"the subquery {name} has two columns named {out}")
            lifted = lift(resolved)
            interval = interval_of(lifted, lambda c: intervals.get(c.name, Interval(None, None)))
            spec = None
            if isinstance(resolved, exp.Column) and resolved.sql(dialect="duckdb") in key_sql:
                spec = source.columns[resolved.name].spec
            outputs[out] = (lifted, RelColumn("", interval, spec))
        having = select.args.get("having")
        post = ""
        if having is not None:
            condition = lift(resolve_expr(having.this, source, "HAVING"))
            checked = self.total(as_boolean(condition), frozenset(counts))
            post = f" WHERE {checked.sql(dialect='duckdb')} IS TRUE"
        unit_key = next(
            i for i, k in enumerate(keys) if isinstance(k, exp.Column) and k.name == source.unit
        )
        unit = _output_named(outputs, f"_g{unit_key}")
        if unit is None:
            unit = UNIT_COLUMN
            outputs[unit] = (exp.column(f"_g{unit_key}"), source.columns[source.unit])
        grouped = ", ".join(
            [
                f"{self.total(k, integers).sql(dialect='duckdb')} AS _g{i}"
                for i, k in enumerate(keys)
            ]
            + aggregates
        )
        group_by = ", ".join(f"_g{i}" for i in range(len(keys)))
        inner = f"(SELECT {grouped} FROM {source.sql} AS _s{filters} GROUP BY {group_by})"
        outer = ", ".join(
            f"{self.total(e, frozenset(counts)).sql(dialect='duckdb')} AS {_quote(o)}"
            for o, (e, _) in outputs.items()
        )
        sql = f"(SELECT {outer} FROM {inner} AS _p{post})"
        # GROUP BY the unit alone leaves one row per unit (DESIGN.md section 3: C' = L0' = 1).
        one_row = len(keys) == 1
        columns = {o: c for o, (_, c) in outputs.items()}
        return self._typed(sql, source, unit, columns, name, 1 if one_row else None)

    def _inner_aggregate(
        self, node: exp.Expression, source: Relation, integers: frozenset[str]
    ) -> tuple[str, Interval]:
        """An aggregate inside a per-unit subquery: its SQL and the range of its value."""
        arg = node.this
        if isinstance(node, exp.Count):
            if isinstance(arg, exp.Distinct):
                inner = ", ".join(
                    self.total(e, integers).sql(dialect="duckdb") for e in arg.expressions
                )
                return f"COUNT(DISTINCT {inner})", Interval(Fraction(0), None, True)
            if arg is None or isinstance(arg, exp.Star):
                return "COUNT(*)", Interval(Fraction(0), None, True)
            return (
                f"COUNT({self.total(arg, integers).sql(dialect='duckdb')})",
                Interval(Fraction(0), None, True),
            )
        kinds = {exp.Sum: "SUM", exp.Avg: "AVG", exp.Min: "MIN", exp.Max: "MAX"}
        word = next((w for t, w in kinds.items() if isinstance(node, t)), None)
        if word is not None and isinstance(arg, exp.Distinct):
            raise UnsupportedQueryError(f"{word}(DISTINCT ...) is not supported in a subquery")
        if word is None:
            raise UnsupportedQueryError(
                f"{node.key.upper()} is not supported inside a per-unit subquery "
                "(COUNT, SUM, AVG, MIN and MAX are)"
            )
        value = self.total(arg, integers).sql(dialect="duckdb")
        iv = interval_of(arg, source.bounds)
        if word in ("SUM", "AVG"):
            # An integer or DECIMAL SUM (and AVG) raises on overflow, which one unit's many or
            # huge values trigger: whether the query fails would depend on the data. fsum and
            # favg add in DOUBLE (compensated), which saturates at inf instead; the outer query
            # clamps the value to its bounds like any other.
            word = "FSUM" if word == "SUM" else "FAVG"
        if word == "FSUM":
            # A sum of n values has no bound without a bound on n: only its sign is known.
            lower = Fraction(0) if iv.lower is not None and iv.lower >= 0 else None
            upper = Fraction(0) if iv.upper is not None and iv.upper <= 0 else None
            iv = Interval(lower, upper, iv.integral)
        elif word == "FAVG":
            iv = Interval(iv.lower, iv.upper, False)
        return f"{word}({value})", iv

    def _typed(  # noqa: PLR0917 - the parts of one derived relation
        self,
        sql: str,
        source: Relation,
        unit: str,
        columns: dict[str, RelColumn],
        name: str,
        unit_rows: int | None,
    ) -> Relation:
        """Fill in the DuckDB types of a derived relation (DESCRIBE reads no rows)."""
        if self.describe is None:
            raise UnsupportedQueryError("subqueries need the engine's catalog")
        described = dict(self.describe(f"SELECT * FROM {sql} AS _t"))
        typed = {
            o: RelColumn(described.get(o, c.type) or c.type, c.interval, c.spec)
            for o, c in columns.items()
        }
        spec = source.spec
        if spec is not None and source.base:
            # constant_per_unit is enforced on base tables only: a derived relation has none.
            spec = spec.model_copy(update={"constant_per_unit": (), "columns": {}})
        return Relation(
            sql=sql,
            base=False,
            table=source.table,
            tables=source.tables,
            unit=unit,
            spec=spec,
            domain=source.domain,
            columns=typed,
            scope={name: {o: o for o in typed if o != UNIT_COLUMN}},
            unit_rows=unit_rows,
        )


def _output_named(outputs: Mapping[str, tuple[exp.Expression, RelColumn]], name: str) -> str | None:
    """The output that is exactly the column ``name``, if any."""
    return next(
        (o for o, (e, _) in outputs.items() if isinstance(e, exp.Column) and e.name == name),
        None,
    )


def _item_name(item: exp.Expression, index: int) -> str:
    if isinstance(item, exp.Alias):
        name = item.alias.lower()
    elif isinstance(item, exp.Column):
        name = item.name.lower()
    else:
        name = f"col{index}"
    if name.startswith("_dpsql"):
        raise SchemaError("column names starting with _dpsql are reserved")
    return name
