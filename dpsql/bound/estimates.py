"""The engine queries of ``ESTIMATE BOUNDS``: one value per unit, counted per value, which the
sparse vector releases read (``dpsql.release.clamp_bounds``, ``dpsql.release.contribution_bounds``).

A column's clamps read each unit's extreme values on a fixed ladder that needs no prior range:
``0`` and ``±m·2^e`` for the mantissas ``m = 1, 1.25, 1.5, 1.75`` and ``e = -20, ..., 51``, up
to ``±2^52`` (the largest bound a policy may declare). All rungs are exact doubles, so the
engine places each value exactly (``ladder_index``); ``candidate`` is the rung at an index.

>>> candidate(ZERO_INDEX + 1), candidate(TOP_INDEX)
(Fraction(1, 1048576), Fraction(4503599627370496, 1))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction

from sqlglot import exp

from dpsql.bound.nodes import (
    Node,
    Type,
    alias,
    any_of,
    cast,
    clamp,
    column,
    cte,
    fragment,
    func,
    is_null,
    not_null,
    number,
    paren,
    quoted,
    select,
    subquery,
    table,
    union_all,
    when,
    with_ctes,
)

LOWEST_POWER = -20  # the smallest non-zero magnitude on the ladder, 2^-20
HIGHEST_POWER = 52  # the largest, 2^52 (the largest bound a policy may declare)
PER_OCTAVE = 4  # rungs per doubling: mantissas 1, 1.25, 1.5, 1.75
_RUNGS = (HIGHEST_POWER - LOWEST_POWER) * PER_OCTAVE + 1  # positive rungs
ZERO_INDEX = _RUNGS  # the index of the candidate 0
TOP_INDEX = 2 * _RUNGS  # the index of +2^52 (0 is -2^52)
_TOP = float(2**HIGHEST_POWER)
_SMALLEST = float(Fraction(2) ** LOWEST_POWER)

Value = Callable[[], Node]  # a value, built anew each time it is read


def _positive(k: int) -> Fraction:
    """The k-th positive rung, from 2^LOWEST_POWER (k = 0) to 2^HIGHEST_POWER."""
    octave, step = divmod(k, PER_OCTAVE)
    return Fraction(2) ** (LOWEST_POWER + octave) * (1 + Fraction(step, PER_OCTAVE))


def candidate(index: int) -> Fraction:
    """The ladder value at ``index`` in [0, TOP_INDEX]."""
    if not 0 <= index <= TOP_INDEX:
        raise ValueError("a ladder index out of range")
    if index == ZERO_INDEX:
        return Fraction(0)
    if index > ZERO_INDEX:
        return _positive(index - ZERO_INDEX - 1)
    return -_positive(ZERO_INDEX - 1 - index)


def _double(value: float) -> Node:
    return exp.Literal.number(value)


def _octave(a: Value) -> Node:
    """floor(log2(a)) for a double in [2^-20, 2^52], exactly: LOG2 may round an argument just
    below a power of two up to it (or just above, down), so the estimate is corrected against
    the exact power."""

    def e() -> Node:
        return func("FLOOR", func("LOG2", a()))

    below = exp.LT(this=a(), expression=func("POW", _double(2.0), e()))
    power = func("POW", _double(2.0), exp.Add(this=e(), expression=number(1)))
    fix = when((below, number(1)), (exp.GTE(this=a(), expression=power), number(-1)),
               otherwise=number(0))  # fmt: skip
    return paren(exp.Sub(this=e(), expression=fix))


def _rung(x: Value, octave: Value, rounding: str) -> tuple[Node, Node]:
    """The rung of |x| = x > 0 within its octave, counted from the ladder's bottom, in two
    terms: (e - LOW)·P and ceil((x/2^e - 1)·P) (``rounding`` CEIL; FLOOR for the rung at or
    below). x/2^e and (m - 1)·P are exact in binary floating point."""
    shift = paren(exp.Sub(this=octave(), expression=paren(number(LOWEST_POWER))))
    whole = exp.Mul(this=shift, expression=number(PER_OCTAVE))
    ratio = exp.Div(this=x(), expression=func("POW", _double(2.0), octave()))
    part = exp.Mul(this=paren(exp.Sub(this=ratio, expression=number(1))),
                   expression=number(PER_OCTAVE))  # fmt: skip
    return whole, func(rounding, part)


def ladder_index(name: str, up: bool = True) -> Node:
    """Column ``name``'s ladder index, row by row, NULL and NaN staying NULL.

    ``up``: the smallest rung at or above the value (for the upper bound); otherwise the largest
    rung at or below it (for the lower bound), which is minus the rung above the negated value.
    Either way the estimated bound lies beyond the data it was read from, never inside it.
    Values beyond ±2^52 (infinities included) go to the ends of the ladder.
    """

    def raw() -> Node:
        value = exp.TryCast(this=quoted(name), to=exp.DataType(this=Type.DOUBLE))
        return value if up else paren(exp.Neg(this=value))

    def x() -> Node:
        return clamp(raw(), _double(-_TOP), _double(_TOP))

    def a() -> Node:
        return paren(exp.Neg(this=x()))

    # x > 0: the rung at or above x; x < 0: minus the largest rung at or below |x| (floor
    # instead of ceil), or 0 when |x| < 2^-20.
    up_whole, up_part = _rung(x, lambda: _octave(x), "CEIL")
    dn_whole, dn_part = _rung(a, lambda: _octave(a), "FLOOR")
    above = exp.Add(this=exp.Add(this=number(ZERO_INDEX + 1), expression=up_whole),
                    expression=up_part)  # fmt: skip
    below = exp.Sub(
        this=number(ZERO_INDEX - 1),
        expression=paren(exp.Add(this=dn_whole, expression=dn_part)),
    )
    positive = exp.GT(this=x(), expression=number(0))
    small = exp.LTE(this=x(), expression=_double(_SMALLEST))
    ladder = when(
        (exp.EQ(this=x(), expression=number(0)), number(ZERO_INDEX)),
        (exp.And(this=positive, expression=small), number(ZERO_INDEX + 1)),
        (positive.copy(), above),
        (exp.LT(this=a(), expression=_double(_SMALLEST)), number(ZERO_INDEX)),
        otherwise=below,
    )
    index = ladder if up else exp.Sub(this=number(TOP_INDEX), expression=paren(ladder))
    # DuckDB's GREATEST skips NULL and orders NaN above every number, so the NULL/NaN test
    # sits outside the clamp.
    missing = any_of([is_null(raw()), func("isnan", raw())])
    bounded = cast(clamp(index, number(0), number(TOP_INDEX)), Type.BIGINT)
    return when((missing, exp.Null()), otherwise=bounded)


def _counts(labels: tuple[str, str], side: int, name: str, where: Node | None = None) -> exp.Select:
    """``SELECT side, name, COUNT(*) AS _n FROM _p GROUP BY name``, the first two labelled."""
    return select(
        [alias(number(side), labels[0]), alias(column(name), labels[1]),
         alias(func("COUNT", exp.Star()), "_n")],
        table("_p"),
        where=where,
        group=[column(name)],
    )  # fmt: skip


def _source(source: str) -> exp.Expression:
    """A FROM item: a policy table's name, or a parenthesised relation's SQL (a table's rows
    resolved along its unit path, ``dpsql.analyze.units.unit_source``)."""
    if not source.startswith("("):
        return table(source, quote=True)
    return subquery(fragment(source[1:-1]), "_s")


def extremes_query(unit: str, source: str, column_name: str) -> exp.Query:
    """Per side (0 upper, 1 lower, mirrored so that both walk up) and ladder index, how many
    units have their extreme value there. One row per unit before the histogram, whatever the
    unit's rows: a unit moves each count by at most 1. A unit whose values are all NULL or NaN
    is in no count."""
    mirrored = exp.Sub(this=number(TOP_INDEX), expression=ladder_index(column_name, up=False))
    values = select(
        [
            alias(quoted(unit), "_u"),
            alias(ladder_index(column_name), "_hi"),
            alias(mirrored, "_lo"),
        ],
        _source(source),
    )
    extremes = select(
        [column("_u"), alias(func("MAX", column("_hi")), "_hi"),
         alias(func("MAX", column("_lo")), "_lo")],
        table("_b"),
        group=[column("_u")],
    )  # fmt: skip
    sides = union_all(
        _counts(("_side", "_i"), 0, "_hi", not_null(column("_hi"))),
        _counts(("_side", "_i"), 1, "_lo", not_null(column("_lo"))),
    )
    return with_ctes(sides, [cte("_b", values), cte("_p", extremes)])


def contributions_query(unit: str, source: str, keys: Sequence[str]) -> exp.Query:
    """Per bound (0: the rows of a unit without keys, or its groups; 1: its largest group's
    rows) and per-unit value, how many units have it: one value per unit and bound, whatever
    its rows. Reads the unit and the keys only, with no filter."""
    count = func("COUNT", exp.Star())
    if not keys:
        per_unit = select([alias(count, "_r")], _source(source), group=[quoted(unit)])
        return select(
            [alias(number(0), "_b"), alias(column("_r"), "_v"), alias(count.copy(), "_n")],
            subquery(per_unit),
            group=[column("_r")],
        )
    cells = select(
        [alias(quoted(unit), "_u"), alias(count, "_c")],
        _source(source),
        group=[quoted(unit), *(quoted(k) for k in keys)],
    )
    units = select(
        [alias(count.copy(), "_g"), alias(func("MAX", column("_c")), "_c")],
        subquery(cells),
        group=[column("_u")],
    )
    both = union_all(_counts(("_b", "_v"), 0, "_g"), _counts(("_b", "_v"), 1, "_c"))
    return with_ctes(both, [cte("_p", units)])


__all__ = [
    "HIGHEST_POWER",
    "LOWEST_POWER",
    "PER_OCTAVE",
    "TOP_INDEX",
    "ZERO_INDEX",
    "candidate",
    "contributions_query",
    "extremes_query",
    "ladder_index",
]
