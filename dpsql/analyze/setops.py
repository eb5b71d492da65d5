"""Set operations of private relations in a FROM-subquery or CTE: ``UNION ALL``, and ``UNION``,
``INTERSECT`` and ``EXCEPT`` where the unit is part of the rows they compare.

* ``UNION ALL`` of relations of one unit domain: each row is a row of one branch, so it is still
  its unit's and depends only on that unit's rows. dpsql carries each branch's unit through as
  its own column; bounding runs after the union, on the rows of each unit from every branch.
* ``UNION`` (distinct), ``INTERSECT`` and ``EXCEPT`` compare whole rows across branches and
  across units. They are allowed only when every branch outputs its unit column at the same
  position: then two rows can match only within one unit, and whether a row is kept depends on
  that unit's rows alone. Otherwise they are refused, naming the construct.

A branch of public rows (no unit), units of different domains, a different number of columns,
or columns whose types differ (unless both are numbers) are refused on the schema, before
anything runs: the engine would cast one branch's values to the other's type, which can fail on
a value. ``ORDER BY``, ``LIMIT`` and ``OFFSET`` on a set operation are refused as in any
subquery. The methods here are part of ``dpsql.analyze.relations.Builder``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from sqlglot import exp

from dpsql.analyze.intervals import Interval
from dpsql.analyze.joins import _merged_spec
from dpsql.analyze.scope import COMPARABLE, UNIT_COLUMN, Describe, Relation, RelColumn, _quote
from dpsql.errors import UnsupportedQueryError

_MAX_BRANCHES = 16


def _word(node: exp.SetOperation) -> str:
    kind = {exp.Union: "UNION", exp.Intersect: "INTERSECT", exp.Except: "EXCEPT"}[type(node)]
    return kind if node.args.get("distinct") else f"{kind} ALL"


def _hull(a: Interval, b: Interval) -> Interval:
    """The smallest interval holding both (unbounded on a side either is unbounded there)."""
    lo = None if a.lower is None or b.lower is None else min(a.lower, b.lower)
    hi = None if a.upper is None or b.upper is None else max(a.upper, b.upper)
    return Interval(lo, hi, a.integral and b.integral)


class SetOps:
    """The set-operation half of ``Builder``: a subquery or CTE whose body is one."""

    describe: Describe | None

    if TYPE_CHECKING:

        def derived(self, select: exp.Select, name: str) -> Relation: ...

    def combined(self, node: exp.SetOperation, name: str) -> Relation:
        for clause in ("order", "limit", "offset"):
            if node.args.get(clause):
                raise UnsupportedQueryError(
                    f"{clause.upper()} on a {_word(node)} is not supported in a subquery"
                )
        words = _words(node)
        selects = _branches(node)
        if len(selects) > _MAX_BRANCHES:
            raise UnsupportedQueryError(f"a set operation of more than {_MAX_BRANCHES} branches")
        branches = []
        for i, select in enumerate(selects):
            try:
                branches.append(self.derived(select, f"{name}_{i}"))
            except UnsupportedQueryError as error:
                if type(error) is not UnsupportedQueryError:
                    raise
                raise UnsupportedQueryError(f"a branch of {words[0]}: {error}") from None
        first = branches[0]
        visible = [c for c in first.columns if c != UNIT_COLUMN]
        for b in branches:
            if not b.private:
                raise UnsupportedQueryError(f"{words[0]} of a branch with no privacy unit")
            if b.domain != first.domain:
                raise UnsupportedQueryError(
                    f"{words[0]} of relations of different unit domains ({first.table}, "
                    f"{b.table}): their units are different kinds of thing"
                )
            if len([c for c in b.columns if c != UNIT_COLUMN]) != len(visible):
                raise UnsupportedQueryError(f"the branches of a {words[0]} differ in columns")
        names_of = [[c for c in b.columns if c != UNIT_COLUMN] for b in branches]
        positions = [
            n.index(b.unit) if b.unit in n else None
            for n, b in zip(names_of, branches, strict=True)
        ]
        if any(w not in ("UNION ALL",) for w in words) and (
            None in positions or len(set(positions)) != 1
        ):
            word = next(w for w in words if w != "UNION ALL")
            raise UnsupportedQueryError(
                f"{word} compares whole rows: every branch must output its privacy unit column at "
                "the same position, so that rows match only within one unit"
            )
        columns: dict[str, RelColumn] = {}
        for i, out in enumerate(visible):
            kinds = {b.columns[n[i]].type.lower() for b, n in zip(branches, names_of, strict=True)}
            if len(kinds) > 1 and not kinds <= COMPARABLE:
                raise UnsupportedQueryError(
                    f"column {i + 1} of the {words[0]} is of types "
                    f"{', '.join(sorted(k.upper() for k in kinds))}: the engine would cast one "
                    "to the other, which can fail on a value; cast them to one type"
                )
            interval = first.columns[out].interval
            for b, n in zip(branches[1:], names_of[1:], strict=True):
                interval = _hull(interval, b.columns[n[i]].interval)
            columns[out] = RelColumn(first.columns[out].type, interval)
        assert first.unit is not None
        kinds = {b.columns[str(b.unit)].type.lower() for b in branches}
        if len(kinds) > 1 and not kinds <= COMPARABLE:
            raise UnsupportedQueryError(
                f"the branches of the {words[0]} have units of types "
                f"{', '.join(sorted(k.upper() for k in kinds))}; declare units of one type"
            )
        columns[UNIT_COLUMN] = RelColumn(
            first.columns[first.unit].type, Interval(None, None, False)
        )
        parts = iter(
            "SELECT "
            + ", ".join([*(f"{_quote(c)} AS {_quote(o)}" for c, o in zip(n, visible, strict=True)),
                         f"{_quote(str(b.unit))} AS {_quote(UNIT_COLUMN)}"])
            + f" FROM {b.sql} AS _b"
            for b, n in zip(branches, names_of, strict=True)
        )  # fmt: skip
        sql = f"({_tree(node, parts)})"
        # The engine's own types of the result (DESCRIBE reads no rows).
        described = dict(self.describe(f"SELECT * FROM {sql} AS _t")) if self.describe else {}
        typed = {
            o: RelColumn(described.get(o, c.type) or c.type, c.interval) for o, c in columns.items()
        }
        # A column that is the unit in every branch is the unit on every row.
        units = frozenset(
            visible[p]
            for p in set(positions)
            if p is not None and positions.count(p) == len(branches)
        )
        return Relation(
            sql=sql,
            base=False,
            table=first.table,
            tables=tuple(dict.fromkeys(t for b in branches for t in b.tables)),
            unit=UNIT_COLUMN,
            spec=_merged_spec([b.spec for b in branches if b.spec is not None]),
            domain=first.domain,
            columns=typed,
            scope={name: {o: o for o in visible}},
            unit_columns=units,
        )


def _tree(node: exp.Expression, parts: Iterator[str]) -> str:
    """The set operation's SQL with each branch replaced by the next of ``parts`` (in order),
    every operand parenthesised so that the tree is the one written."""
    if isinstance(node, exp.SetOperation):
        left = _tree(node.this, parts)
        right = _tree(node.expression, parts)
        return f"({left}) {_word(node)} ({right})"
    if isinstance(node, exp.Subquery):
        return _tree(node.this, parts)
    return next(parts)


def _branches(node: exp.Expression) -> list[exp.Select]:
    if isinstance(node, exp.SetOperation):
        return [*_branches(node.this), *_branches(node.expression)]
    if isinstance(node, exp.Subquery):
        return _branches(node.this)
    if not isinstance(node, exp.Select):
        raise UnsupportedQueryError(f"{node.key.upper()} is not supported in a set operation")
    return [node]


def _words(node: exp.Expression) -> list[str]:
    """The operators between the branches, left to right."""
    if isinstance(node, exp.SetOperation):
        return [*_words(node.this), _word(node), *_words(node.expression)]
    if isinstance(node, exp.Subquery):
        return _words(node.this)
    return []
