"""The join rules: which joins keep every row of a private relation one unit's.

* ``private JOIN public`` (inner, LEFT from the private side, SEMI, ANTI, CROSS): a joined row
  is one private row with public columns attached, so it is still that row's unit's.
* ``private JOIN private`` on equal units (same table, or tables declaring the same
  ``unit_domain``): a joined row pairs two rows of one unit. Join fan-out multiplies a unit's
  rows but never mixes units; the bounding after the join caps it.

RIGHT and FULL joins, which keep rows with no unit, and private tables joined on other columns,
which pair rows of different units, are refused with the reason. The methods here are part of
``dpsql.analyze.relations.Builder``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from sqlglot import exp

from dpsql.analyze import path_joins
from dpsql.analyze.equalities import conjuncts
from dpsql.analyze.intervals import Interval
from dpsql.analyze.path_joins import OUTER, Taken, and_terms, borrow, column_equality
from dpsql.analyze.scope import (
    COMPARABLE,
    Relation,
    RelColumn,
    _alias_of,
    _quote,
    _reject_nested_queries,
)
from dpsql.errors import SchemaError, UnsupportedQueryError
from dpsql.policy import Policy, TableSpec
from dpsql.sql.totality import as_boolean
from dpsql.sql.tree import transform


class Joins:
    """The join half of ``Builder``: a FROM clause's joined inputs, checked and combined."""

    total: Callable[[exp.Expression, frozenset[str]], exp.Expression]
    policy: Policy
    # Per joined input: its USING columns -> (input, column) of the left side they merge with.
    using: dict[int, dict[str, tuple[int, str]]]

    if TYPE_CHECKING:

        def item(self, node: exp.Expression) -> Relation: ...

    def joined(
        self, first: Relation, joins: list[exp.Join], where: exp.Expression | None = None
    ) -> Relation:
        inputs = [first]
        aliases = [_alias_of(first)]
        pending: list[tuple[str, str]] = []  # per join: its word and its condition
        kinds: list[str] = []
        self.using = {}
        # A child joined to its path's parent along the path's first link takes the parent's
        # unit (child input -> parent input); the inputs whose unit column an ON names.
        taken = Taken()
        for join in joins:
            right = self.item(join.this)
            side = (join.args.get("side") or "").upper()
            kind = (join.args.get("kind") or "").upper()
            if side in ("RIGHT", "FULL") and join.args.get("using"):
                # USING merges the right column into the left one, NULL on a right-only row.
                raise UnsupportedQueryError(f"a {side} JOIN needs ON, not USING")
            if side in ("RIGHT", "FULL") and not (
                right.private and len(inputs) == 1 and first.private and kind in ("", "OUTER")
            ):
                raise UnsupportedQueryError(
                    f"{side} JOIN keeps rows that belong to no privacy unit unless it joins two "
                    "private relations on their units (or along a declared key); write it as a "
                    "LEFT JOIN from the private table"
                )
            if any(k in ("RIGHT", "FULL") for k in kinds):
                raise UnsupportedQueryError(
                    "a RIGHT or FULL JOIN of two private relations is the FROM clause's only join"
                )
            method = str(join.args.get("method") or "").upper()
            if method or kind in ("ASOF", "POSITIONAL", "NATURAL"):
                raise UnsupportedQueryError(
                    f"{method or kind} JOIN is not supported; name the columns with ON or USING"
                )
            left_private = [r for r in inputs if r.private]
            filtering = kind in ("SEMI", "ANTI")
            if right.private and not left_private and (side == "LEFT" or filtering):
                raise UnsupportedQueryError(
                    "a private table must be on the preserved (left) side of a LEFT, SEMI or "
                    "ANTI JOIN: otherwise a row's existence depends on other units' rows"
                )
            alias = _alias_of(right)
            if alias in aliases:
                raise SchemaError(f"table name or alias {alias} is used twice in FROM")
            inputs.append(right)
            aliases.append(alias)
            written = join if where is None else self._comma_on(join, inputs, where)
            on = self._on(written, inputs, kind)
            word = {"SEMI": "SEMI JOIN", "ANTI": "ANTI JOIN", "CROSS": "CROSS JOIN"}.get(
                kind, f"{side} JOIN" if side in ("LEFT", "RIGHT", "FULL") else "JOIN"
            )
            if right.private and left_private:
                said = "," if not any(join.args.get(a) for a in _WRITTEN) else word
                inner = side not in OUTER and not any(k in OUTER for k in kinds)
                found = borrow(on, inputs, kind, taken) if inner else None
                if found is not None:
                    taken.parents[found[0]] = found[1]
                else:
                    on = self._check_unit_join(left_private, on, inputs, said, taken)
            condition = f" ON {on.sql(dialect='duckdb')}" if kind != "CROSS" else ""
            pending.append((word, condition))
            kinds.append(side if side in ("LEFT", "RIGHT", "FULL") else kind)
        if not any(r.private for r in inputs):
            names = ", ".join(dict.fromkeys(t for r in inputs for t in r.tables))
            raise UnsupportedQueryError(
                f"a join of public tables only ({names}): dpsql answers queries over private "
                "tables; query public data directly"
            )
        # A child that takes its parent's unit is read as the table itself, not resolved.
        sqls = [_quote(r.table) if i in taken.parents else r.sql for i, r in enumerate(inputs)]
        clauses = [
            f"{word} {sqls[i]} AS {_quote(f'_j{i}')}{condition}"
            for i, (word, condition) in enumerate(pending, start=1)
        ]
        units = {i: path_joins.unit_of(i, inputs, taken) for i in taken.parents}
        return self._combine(
            inputs, aliases, clauses, kinds, first_sql=sqls[0], borrowed_units=units
        )

    @staticmethod
    def _resolve_in(column: exp.Column, inputs: list[Relation]) -> tuple[int, str]:
        """(input index, relation column) a reference names among the joined inputs."""
        qualifier = column.table.lower() if column.table else None
        matches: list[tuple[int, str]] = []
        for i, relation in enumerate(inputs):
            if qualifier is not None and qualifier not in relation.scope:
                continue
            try:
                probe = column if qualifier is not None else exp.column(column.name)
                matches.append((i, relation.resolve(probe)))
            except SchemaError:
                continue
        if not matches:
            raise SchemaError(f"unknown column {column.name.lower()} in the joined tables")
        if len(matches) > 1:
            raise SchemaError(
                f"column {column.name.lower()} is ambiguous; qualify it with its table"
            )
        return matches[0]

    def _comma_on(self, join: exp.Join, inputs: list[Relation], where: exp.Expression) -> exp.Join:
        """A join written without ON (``FROM a, b WHERE a.k = b.k``) takes as its ON the WHERE's
        top-level equalities of a column of its right input and one of an earlier input. An
        inner join's ON and its WHERE keep the same rows, and the WHERE keeps them too: the
        rows are the same, the join's unit rule (``_check_unit_join``) reads them, and the
        engine joins on them instead of filtering a cross product (a later SEMI or ANTI join
        can keep it from pushing the WHERE down)."""
        if any(join.args.get(a) for a in _WRITTEN):
            return join
        right = len(inputs) - 1
        taken = []
        for conjunct in conjuncts(where):
            if not (
                isinstance(conjunct, exp.EQ)
                and isinstance(conjunct.this, exp.Column)
                and isinstance(conjunct.expression, exp.Column)
            ):
                continue
            try:
                ends = {
                    self._resolve_in(c, inputs)[0] for c in (conjunct.this, conjunct.expression)
                }
            except SchemaError:
                continue  # not both among these inputs (or ambiguous): the WHERE reports it
            if right in ends and len(ends) == 2:
                taken.append(conjunct.copy())
        if not taken:
            return join
        join = join.copy()
        join.set("on", exp.and_(*taken))
        return join

    def _on(self, join: exp.Join, inputs: list[Relation], kind: str) -> exp.Expression:
        right = len(inputs) - 1
        using = join.args.get("using") or []
        on = join.args.get("on")
        if kind == "CROSS" or (on is None and not using):
            if kind not in ("CROSS", ""):
                raise UnsupportedQueryError(f"{kind} JOIN needs ON or USING")
            return exp.true()
        conjuncts: list[exp.Expression] = []
        for ident in using:
            name = ident.name.lower()
            left_index, left_col = self._resolve_in(exp.column(name), inputs[:right])
            right_col = inputs[right].resolve(exp.column(name))
            # USING merges the two columns into one, as in SQL: the right one is not output.
            self.using.setdefault(right, {})[right_col] = (left_index, left_col)
            conjuncts.append(
                exp.EQ(
                    this=exp.column(left_col, table=f"_j{left_index}", quoted=True),
                    expression=exp.column(right_col, table=f"_j{right}", quoted=True),
                )
            )
        if on is not None:
            _reject_nested_queries(on, "ON")
            for agg in on.find_all(exp.AggFunc):
                raise UnsupportedQueryError(f"aggregate {agg.key.upper()} is not allowed in ON")

            def swap(n: exp.Expression) -> exp.Expression:
                if isinstance(n, exp.Column):
                    index, name = self._resolve_in(n, inputs)
                    return exp.column(name, table=f"_j{index}", quoted=True)
                return n

            resolved = transform(on, swap)
            conjuncts.extend(and_terms(resolved))
        integers: frozenset[str] = frozenset()  # TRY covers what can raise in a join condition
        parts = []
        for conjunct in conjuncts:
            if column_equality(conjunct) and self._same_kind(conjunct, inputs):
                parts.append(conjunct)  # cannot raise; kept bare so the engine can hash-join
            else:
                # A condition the engine casts to BOOLEAN, on the data: cast it totally.
                checked = self.total(as_boolean(conjunct), integers)
                parts.append(exp.Is(this=checked, expression=exp.true()))
        return exp.and_(*parts) if len(parts) > 1 else parts[0]  # type: ignore[return-value]

    @staticmethod
    def _same_kind(conjunct: exp.Expression, inputs: list[Relation]) -> bool:
        """Whether ``a = b`` compares columns of one type, or two numbers: only then can it not
        raise (DuckDB casts the other side implicitly, and '1' = 'east' fails on the data)."""
        types = []
        for column in (conjunct.this, conjunct.expression):
            assert isinstance(column, exp.Column)
            types.append(inputs[int(column.table[2:])].columns[column.name].type.lower())
        return types[0] == types[1] or all(t in COMPARABLE for t in types)

    def _check_unit_join(
        self,
        left_private: list[Relation],
        on: exp.Expression,
        inputs: list[Relation],
        word: str,
        taken: Taken,
    ) -> exp.Expression:
        """Two private relations join only on equal units of one unit domain, or along a
        foreign key a unit path declares (``dpsql.policy.paths``), to which the equality of the
        two sides' units is added: with keys that are not unique, a child's row and a parent's
        row of equal keys may carry different units, and must not pair. The ON condition the
        join runs with."""
        right = inputs[-1]
        domain = left_private[0].domain
        if right.domain != domain:
            raise UnsupportedQueryError(
                f"tables {left_private[0].table} and {right.table} have different privacy units; "
                "they can be joined only if the policy gives both the same unit_domain"
            )
        right_index = len(inputs) - 1
        units = {(i, r.unit) for i, r in enumerate(inputs[:right_index]) if r.private and r.unit}
        assert right.unit is not None
        links = _links(self.policy)
        for conjunct in and_terms(on):
            if not column_equality(conjunct):
                continue
            a, b = conjunct.this, conjunct.expression
            ends = {(int(a.table[2:]), a.name), (int(b.table[2:]), b.name)}
            if (right_index, right.unit) in ends and ends & units:
                taken.named.update(i for i, _ in ends)
                return on
        for conjunct in and_terms(on):
            if not column_equality(conjunct):
                continue
            (i, x), (j, y) = sorted(
                [(int(conjunct.this.table[2:]), conjunct.this.name),
                 (int(conjunct.expression.table[2:]), conjunct.expression.name)]
            )  # fmt: skip
            left = inputs[i]
            if j != right_index or not (left.private and left.direct and right.direct):
                continue
            if {(left.table, x, right.table, y), (right.table, y, left.table, x)} & links:
                assert left.unit is not None
                kinds = {
                    left.columns[left.unit].type.lower(),
                    right.columns[right.unit].type.lower(),
                }
                if len(kinds) > 1 and not kinds <= COMPARABLE:
                    # The engine would cast one unit to the other's type, which can fail on a
                    # value: refused on the schema.
                    raise UnsupportedQueryError(
                        f"joining {left.table} and {right.table} along their key pairs rows of "
                        "one unit, but their units are of different types; declare units of "
                        "one type"
                    )
                # A left input that took its parent's unit has it from that parent's column.
                end = taken.end(i)
                taken.named.update((end, right_index))
                same = exp.EQ(
                    this=exp.column(str(inputs[end].unit), table=f"_j{end}", quoted=True),
                    expression=exp.column(right.unit, table=f"_j{right_index}", quoted=True),
                )
                return exp.And(this=on, expression=same)
        reach = (
            "equality of their privacy unit columns, or of a foreign key and the key a unit_path "
            "declares it reaches: rows of different units must never pair"
        )
        if word == ",":
            raise UnsupportedQueryError(
                f"private tables {left_private[0].table} and {right.table}, listed with a comma, "
                f"need in WHERE (ANDed at its top, as a column = column) an {reach}"
            )
        raise UnsupportedQueryError(
            f"a {word} of private tables {left_private[0].table} and {right.table} needs ON "
            + reach
        )

    def _combine(
        self,
        inputs: list[Relation],
        aliases: list[str],
        clauses: list[str],
        kinds: list[str],
        *,
        first_sql: str,
        borrowed_units: dict[int, str],
    ) -> Relation:
        # SEMI and ANTI joins only filter: their right side's columns are not visible.
        visible = [True] + [k not in ("SEMI", "ANTI") for k in kinds]
        counts: dict[str, int] = {}
        for i, (relation, show) in enumerate(zip(inputs, visible, strict=True)):
            if show:
                for name in relation.columns:
                    counts[name] = counts.get(name, 0) + (name not in self.using.get(i, {}))
        mappings: list[dict[str, str]] = []
        columns: dict[str, RelColumn] = {}
        select: list[str] = []
        scope: dict[str, dict[str, str]] = {}
        # The inputs whose columns may be NULL on a row (the side an outer join may leave out).
        nullable = {i + 1 for i, k in enumerate(kinds) if k in ("LEFT", "FULL")}
        nullable |= {0 for k in kinds if k in ("RIGHT", "FULL")}
        anchor = next(
            i for i, r in enumerate(inputs) if r.private and (i not in nullable or "FULL" in kinds)
        )
        unit_name = ""
        units: set[str] = set()
        for i, (relation, alias, show) in enumerate(zip(inputs, aliases, visible, strict=True)):
            if not show:
                mappings.append({})
                continue
            mapping: dict[str, str] = {}
            mappings.append(mapping)
            for name, column in relation.columns.items():
                merged = self.using.get(i, {}).get(name)
                if merged is not None and merged[1] in mappings[merged[0]]:
                    mapping[name] = mappings[merged[0]][merged[1]]
                    continue
                out = name if counts[name] == 1 else f"{alias}_{name}"
                if name.startswith("_dpsql") and out != name:
                    out = f"_dpsql_{alias}{name}"  # dpsql's own columns stay hidden
                while out in columns:
                    out = "_" + out
                columns[out] = column
                mapping[name] = out
                select.append(
                    f"{path_joins.source(i, name, relation, borrowed_units)} AS {_quote(out)}"
                )
            for qualifier, names in relation.scope.items():
                scope[qualifier] = {
                    written: mapping[target]
                    for written, target in names.items()
                    if target in mapping
                }
            if i == anchor:
                assert relation.unit is not None
                unit_name = mapping[relation.unit]
            if relation.private and i not in nullable:
                # Inner joins on the unit make every private input's unit column equal to it.
                units.update(mapping[u] for u in relation.units if u in mapping)
        if "FULL" in kinds:
            # A row of either side alone carries that side's unit; a matched row, both (equal).
            ends = [_quote(f"_j{i}") + "." + _quote(str(inputs[i].unit)) for i in (0, 1)]
            kinds_of_units = {inputs[i].columns[str(inputs[i].unit)].type.lower() for i in (0, 1)}
            if len(kinds_of_units) > 1 and not kinds_of_units <= COMPARABLE:
                raise UnsupportedQueryError(
                    "a FULL JOIN of private relations needs units of one type"
                )
            unit_name = "_dpsql_full_unit"
            unit_type = inputs[0].columns[str(inputs[0].unit)].type
            columns[unit_name] = RelColumn(unit_type, Interval(None, None, False))
            select.append(f"COALESCE({ends[0]}, {ends[1]}) AS {_quote(unit_name)}")
            units = {unit_name}
        private = [r for r in inputs if r.private]
        spec = _merged_spec([r.spec for r in private if r.spec is not None])
        sql = (
            f"(SELECT {', '.join(select)} FROM {first_sql} AS {_quote('_j0')} "
            + " ".join(clauses)
            + ")"
        )
        tables = tuple(dict.fromkeys(t for r in inputs for t in r.tables))
        return Relation(
            sql=sql,
            base=False,
            table=private[0].table if private else inputs[0].table,
            tables=tables,
            unit=unit_name or None,
            spec=spec,
            domain=private[0].domain if private else None,
            columns=columns,
            scope=scope,
            unit_columns=frozenset(units),
        )


def _links(policy: Policy) -> set[tuple[str, str, str, str]]:
    """Every foreign key a unit path declares: (table, column, parent table, key)."""
    out = set()
    for name, spec in policy.tables.items():
        at = name
        for link in spec.unit_path:
            out.add((at, link.column, link.table, link.key))
            at = link.table
    return out


# What a join written out has and a comma (FROM a, b) has not.
_WRITTEN = ("on", "using", "kind", "side", "method")


def _merged_spec(specs: list[TableSpec]) -> TableSpec | None:
    """The bounds of a join of private tables: the smallest each table declares (any bounds
    are valid, since they are enforced after the join; the smallest is what every table's owner
    accepts)."""
    if not specs:
        return None
    first = specs[0]

    def smallest(values: list[int | None]) -> int | None:
        known = [v for v in values if v is not None]
        return min(known) if known else None

    return first.model_copy(
        update={
            "max_groups_per_unit": smallest([s.max_groups_per_unit for s in specs]),
            "max_rows_per_unit_per_group": smallest([s.max_rows_per_unit_per_group for s in specs]),
            "max_rows_per_unit": smallest([s.max_rows_per_unit for s in specs]),
            "constant_per_unit": (),
        }
    )
