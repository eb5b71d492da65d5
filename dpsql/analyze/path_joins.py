"""Joins along a unit path's first link: the child takes the parent row's unit.

A table with a ``unit_path`` is resolved to its units by joining its path (``dpsql.analyze.units``)
inside every bounded query. When a query itself joins that table (the child) to the parent its
path starts with, along that very link (``lineitem JOIN orders ON l_orderkey = o_orderkey``),
and the rest of the child's path is the parent's own, resolving the child again would join the
same parent (and its path) twice. ``borrow`` finds such a join: the child is then read as the
table itself, the join keeps the analyst's ON (no equality of units is added), and the joined
row's unit is the parent row's (``unit_of``), as ``dpsql.analyze.joins`` builds it.

Why every joined row is still one unit's: a child row pairs with a parent row only when its
first link reaches that row, and the rest of its path is the parent's, so the parent row's unit
is one the child row resolves to. The joined row is a function of that unit's resolved rows (the
parent row and the child rows whose path runs through it): removing or adding a unit removes or
adds exactly its joined rows, and the bounds that follow cap them as before. Where keys are
unique, the rows are those of the resolved child joined on equal units; with a key listed twice,
this join keeps one copy of each (child row, parent row) pair where the resolved form kept one
per path (docs/policy.md, unit paths).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlglot import exp

from dpsql.analyze.scope import Relation, _quote

__all__ = ["OUTER", "Taken", "and_terms", "borrow", "column_equality", "source", "unit_of"]


def and_terms(node: exp.Expression) -> list[exp.Expression]:
    """The operands of a top-level AND (a parenthesised term stays one)."""
    if not isinstance(node, exp.And):
        return [node]
    return [n for n in node.flatten() if isinstance(n, exp.Expression)]


def column_equality(node: exp.Expression) -> bool:
    return (
        isinstance(node, exp.EQ)
        and isinstance(node.this, exp.Column)
        and isinstance(node.expression, exp.Column)
    )


# Joins that may keep a row of one side alone: no unit is taken across them.
OUTER = ("LEFT", "RIGHT", "FULL")


@dataclass
class Taken:
    """Per FROM clause: the children that took a parent's unit (child input -> parent input),
    and the inputs whose unit column an ON names (a child among them takes no unit then)."""

    parents: dict[int, int] = field(default_factory=dict)
    named: set[int] = field(default_factory=set)

    def end(self, i: int) -> int:
        """The input whose own unit column input ``i``'s unit is (itself, or a parent's)."""
        while i in self.parents:
            i = self.parents[i]
        return i


def source(i: int, name: str, relation: Relation, borrowed_units: dict[int, str]) -> str:
    """What a joined relation's column ``name`` of input ``i`` reads: its own column, or, for
    the unit of a child that took its parent's, the parent's unit (the row's unit)."""
    if name == relation.unit and i in borrowed_units:
        return borrowed_units[i]
    return f"{_quote('_j' + str(i))}.{_quote(name)}"


def unit_of(i: int, inputs: list[Relation], taken: Taken) -> str:
    end = taken.end(i)
    return f"{_quote('_j' + str(end))}.{_quote(str(inputs[end].unit))}"


def borrow(
    on: exp.Expression,
    inputs: list[Relation],
    kind: str,
    taken: Taken,
) -> tuple[int, int] | None:
    """(child, parent) when the ON of an inner (or SEMI/ANTI, child on the right) join equates
    a child's column with its parent's key along the first link of the child's unit path, and
    the rest of that path is the parent's own: a child row then pairs with a parent row exactly
    when its path runs through that row, and the joined row takes the parent row's unit. Each
    joined row is one parent row's, with child rows whose path reaches its unit, so it is one
    unit's, as with the resolved child and the units' equality (the same rows where keys are
    unique; with a key listed twice, one copy where the resolved child pairs every path with
    every parent row of its unit), and the child's path is not joined again. None when the
    child's unit column is named already (an ON compares it) or is taken already."""
    right = len(inputs) - 1
    for conjunct in and_terms(on):
        if not column_equality(conjunct):
            continue
        ends = [(int(c.table[2:]), c.name) for c in (conjunct.this, conjunct.expression)]
        for (c, column), (p, key) in (ends, ends[::-1]):
            if right not in (c, p) or c == p or (kind in ("SEMI", "ANTI") and c != right):
                continue
            child, parent = inputs[c], inputs[p]
            if c in taken.parents or c in taken.named or taken.end(p) == c:
                continue
            if not (child.direct and parent.direct and child.spec and parent.spec):
                continue
            path, own = child.spec.unit_path, parent.spec.unit_path
            if not path or parent.unit is None or child.unit is None:
                continue
            link = path[0]
            if (link.column, link.table, link.key) != (column, parent.table, key):
                continue
            if tuple(path[1:]) != tuple(own):
                continue
            return c, p
    return None
