"""Total row-level expressions: what the engine evaluates on private rows must never raise.

Whether a query fails must depend on the query and the schema only, never on a data value
(DESIGN.md section 5).
"""

from __future__ import annotations

from sqlglot import exp

# Integer types widened to HUGEINT under arithmetic (each fits in it; HUGEINT and UHUGEINT
# columns are left as they are, and TRY catches their overflow).
WIDENED = frozenset(
    {"tinyint", "smallint", "integer", "bigint", "utinyint", "usmallint", "uinteger", "ubigint"}
)
_ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.IntDiv, exp.Mod, exp.Neg, exp.Abs)


def total(node: exp.Expression, integer_columns: frozenset[str] = frozenset()) -> exp.Expression:
    """A row-level expression that cannot raise, wrapped in TRY(...) as a last resort.

    DuckDB raises on failed casts, integer overflow and ``//`` or ``%`` by zero (DESIGN.md
    section 5), so: casts become TRY_CAST; divisors of ``//`` and ``%`` become NULLIF(d, 0);
    integer columns under arithmetic are widened to HUGEINT, where sums and products of two
    64-bit values cannot overflow. What can still raise (longer products of huge integers) is
    caught by TRY and yields NULL. TRY re-evaluates a failing batch row by row, so making the
    expression total first also keeps the query's time from depending on such rows.
    """

    def fix(n: exp.Expression, parent: exp.Expression | None) -> exp.Expression:
        if isinstance(n, exp.Cast) and not isinstance(n, exp.TryCast):
            return exp.TryCast(this=n.this, to=n.to)
        # Operands of AND, OR, NOT and conditions of CASE/IF are cast to BOOLEAN by the engine,
        # which raises on a text that is not a boolean: cast them ourselves, with TRY_CAST.
        if isinstance(n, exp.Connector):
            n.set("this", as_boolean(n.this))
            n.set("expression", as_boolean(n.expression))
        elif isinstance(n, exp.Not | exp.If):
            n.set("this", as_boolean(n.this))
        if isinstance(n, exp.IntDiv | exp.Mod):
            divisor = exp.Nullif(this=n.expression, expression=exp.Literal.number(0))
            return n.__class__(this=n.this, expression=divisor)
        if (
            isinstance(n, exp.Column)
            and n.name in integer_columns
            and isinstance(parent, _ARITHMETIC)
        ):
            return exp.cast(n, exp.DataType.Type.INT128)
        return n

    def walk(n: exp.Expression, parent: exp.Expression | None) -> exp.Expression:
        # Children first (post-order): a node replaced above (a CAST made TRY_CAST) still has
        # its own casts, divisors and integer columns made total underneath.
        for key, value in list(n.args.items()):
            if isinstance(value, exp.Expression):
                n.set(key, walk(value, n))
            elif isinstance(value, list):
                n.set(key, [walk(v, n) if isinstance(v, exp.Expression) else v for v in value])
        return fix(n, parent)

    fixed = walk(node.copy(), None)
    # A column or a literal cannot fail: TRY around it only costs time (20% of the CPU of a
    # grouped query at 10M rows when every key and value was wrapped).
    if isinstance(fixed, exp.Column | exp.Literal | exp.Null | exp.Boolean):
        return fixed
    if isinstance(fixed, exp.TryCast) and isinstance(fixed.this, exp.Column):
        return fixed
    return exp.Try(this=fixed)


def as_boolean(node: exp.Expression) -> exp.Expression:
    """``node`` where the engine needs a boolean: as it is if it is a predicate, else cast with
    TRY_CAST (a VARCHAR column in WHERE fails, on the data, for any row that is not 'true' or
    'false' and the like; TRY_CAST makes that row NULL, which a filter drops)."""
    inner = node
    while isinstance(inner, exp.Paren):
        inner = inner.this
    if isinstance(inner, exp.Predicate | exp.Connector | exp.Not | exp.Boolean | exp.Null):
        return node
    return exp.TryCast(this=node, to=exp.DataType.build("BOOLEAN"))
