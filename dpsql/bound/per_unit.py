"""One unit's contribution to one group: the per-(unit, keys) aggregates of ``_units`` and what
the cap C leaves of them in ``_capped`` (or, when no per-unit step can bind, the rows as they
are), all in exact integer arithmetic.

>>> Aggregate("COUNT", "*", "_n").node(column("_k0")).sql("duckdb")
'COUNT(CASE WHEN _k0 THEN 1 END)'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlglot import exp

from dpsql.bound.grid import Grid
from dpsql.bound.nodes import (
    Node,
    alias,
    clamp,
    column,
    func,
    greatest,
    hugeint,
    is_null,
    least,
    not_null,
    number,
    paren,
    select,
    table,
    when,
)
from dpsql.bound.specs import Bounding, ValueSpec
from dpsql.bound.values import centred


@dataclass(frozen=True)
class Aggregate:
    """One per-(unit, keys) aggregate of ``_units``: ``COUNT(arg)`` or ``COALESCE(SUM(arg), 0)``
    (``arg`` "*" for COUNT(*), else a column of ``_vals``; or the product of the centred
    values ``squared``), named ``name``."""

    function: str  # "COUNT" or "SUM"
    arg: str
    name: str
    # A SUM over no row is NULL: 0 instead (a group's rows all NULL; a combination with no row)
    zero: bool = True
    squared: Grid | None = None  # SUM of the squares of the centred values of ``arg``
    # SUM of the products of the centred values of ``arg`` (on ``squared``) and ``other``
    other: tuple[str, Grid] | None = None

    def _arg(self) -> Node:
        if self.arg == "*":
            return exp.Star()
        if self.squared is None:
            return column(self.arg)
        if self.other is not None:
            return _product(self.arg, self.squared, *self.other)
        return _square(self.arg, self.squared)

    def node(self, only: Node | None = None) -> Node:
        """The aggregate over the rows (of one key combination, where ``only`` holds)."""
        arg = self._arg()
        if only is not None:
            arg = when((only, number(1) if self.arg == "*" else arg))
        if self.function == "SUM":
            total = func("SUM", arg)
            return (
                exp.Coalesce(this=total, expressions=[number(0)])
                if (self.zero or only is not None)
                else total
            )
        return func("COUNT", arg)


def _square(value: str, grid: Grid) -> Node:
    return exp.Mul(this=hugeint(centred(value, grid)), expression=hugeint(centred(value, grid)))


def _product(value: str, grid: Grid, other: str, other_grid: Grid) -> Node:
    return exp.Mul(
        this=hugeint(centred(value, grid)), expression=hugeint(centred(other, other_grid))
    )


def _suffix(i: int, j: int) -> str:
    """The column suffix of a sum of centred squares (i = j) or products."""
    return f"{i}" if i == j else f"{i}_{j}"


def aggregates(
    bounding: Bounding, squared: Sequence[tuple[int, int]], weighted: bool
) -> list[Aggregate]:
    """What ``_units`` aggregates per (unit, keys): rows (or their copies ``_w``), each value's
    non-NULL rows, grid sums and sums of centred squares."""
    values = bounding.values
    out = [Aggregate("SUM", "_w", "_n", zero=False) if weighted else Aggregate("COUNT", "*", "_n")]
    out += [Aggregate("COUNT", f"_v{i}", f"_n{i}") for i, v in enumerate(values) if not v.listed]
    out += [
        Aggregate("SUM", f"_v{i}", f"_s{i}")
        for i, v in enumerate(values)
        if v.grid is not None and not v.listed
    ]
    for i, j in squared:
        grid, other = values[i].grid, values[j].grid
        assert grid is not None and other is not None
        pair = None if i == j else (f"_v{j}", other)
        out.append(Aggregate("SUM", f"_v{i}", f"_q{_suffix(i, j)}", squared=grid, other=pair))
    return out


def listed(i: int, value: ValueSpec) -> Node:
    """Per unit and group, the value's non-NULL grid units (a quantile) or distinct values."""
    name = column(f"_v{i}")
    arg = exp.Distinct(expressions=[name]) if value.role == "distinct" else name
    where = exp.Where(this=not_null(column(f"_v{i}")))
    return alias(exp.Filter(this=func("list", arg), expression=where), f"_l{i}")


def capped_sum(i: int, c: int, grid: Grid) -> Node:
    """The unit's sum in grid units with at most C rows counted: S when n <= C, else
    round(C·S/n) clamped to [C·lower, C·upper], all in exact HUGEINT arithmetic.

    In DOUBLE, S (up to n·2^52) and the bounds C·lower, C·upper (up to 2^72) are rounded, and a
    unit could move a total by a grid unit more than the plan's sensitivity. Exact: with
    q = floor(S/n) and r = S - q·n in [0, n), round(C·S/n) = C·q + floor((2·C·r + n) / (2·n)).
    DuckDB's // truncates towards zero and % takes the dividend's sign, hence the correction.
    """
    low, high = hugeint(number(c * grid.lower)), hugeint(number(c * grid.upper))
    return _scaled(f"_s{i}", f"_n{i}", c, low, high)


def _scaled(total: str, count: str, c: int, low: Node, high: Node) -> Node:
    """``total`` over ``count`` rows scaled to C rows when count > C: round(C·S/n) in exact
    HUGEINT arithmetic (``capped_sum``), clamped to [low, high]; S itself otherwise."""

    def s() -> Node:
        return hugeint(column(total))

    def n() -> Node:
        return hugeint(column(count))

    def q() -> Node:
        negative = exp.LT(this=exp.Mod(this=s(), expression=n()), expression=number(0))
        below = when((negative, number(1)), otherwise=number(0))
        return paren(exp.Sub(this=exp.IntDiv(this=s(), expression=n()), expression=below))

    r = paren(exp.Sub(this=s(), expression=exp.Mul(this=q(), expression=n())))
    twice = exp.Mul(this=exp.Mul(this=number(2), expression=number(c)), expression=r)
    rounded = exp.IntDiv(
        this=paren(exp.Add(this=twice, expression=n())),
        expression=paren(exp.Mul(this=number(2), expression=n())),
    )
    scaled = paren(exp.Add(this=exp.Mul(this=number(c), expression=q()), expression=rounded))
    within = exp.LTE(this=column(count), expression=number(c))
    return when((within, s()), otherwise=clamp(scaled, low, high))


def capped_products(i: int, j: int, c: int, grid: Grid, other: Grid) -> Node:
    """The unit's sum of products of centred values of ``i`` and ``j`` (a pair's rows: both
    present), in units of (g_i/2)(g_j/2): each product lies in ±width_i·width_j, so the sum of
    n <= C rows does; with more it is scaled to round(C·P/n) exactly, and clamped to
    ±C·width_i·width_j whatever the rows (one unit moves one group's total by at most that)."""
    top = c * grid.width * other.width
    return _scaled(f"_q{i}_{j}", f"_n{i}", c, hugeint(number(-top)), hugeint(number(top)))


def capped_squares(i: int, c: int, grid: Grid) -> Node:
    """The unit's sum of squared centred values, in units of (g/2)², within [0, C·width²].

    With n <= C rows it is exact (each square is at most width²); with more, it is scaled to
    round(Q·C/n) in exact integer arithmetic and clamped, so that one unit moves one group's
    total by at most C·width² whatever its rows.
    """
    half = exp.IntDiv(this=column(f"_n{i}"), expression=number(2))
    times = exp.Add(this=exp.Mul(this=column(f"_q{i}"), expression=number(c)), expression=half)
    rounded = exp.IntDiv(this=paren(times), expression=column(f"_n{i}"))
    within = exp.LTE(this=column(f"_n{i}"), expression=number(c))
    scaled = when((within, column(f"_q{i}")), otherwise=rounded)
    return clamp(scaled, number(0), hugeint(number(c * grid.width**2)))


def capped_list(i: int, c: int) -> Node:
    """At most C of a unit's listed values, evenly spaced in sorted order: a function of the
    unit's own rows only, so one unit still moves a group by at most C values."""

    def length() -> Node:
        return func("len", column(f"_l{i}"))

    step = greatest(
        exp.IntDiv(this=paren(exp.Add(this=length(), expression=number(c - 1))),
                   expression=number(c)),
        number(1),
    )  # fmt: skip
    sliced = func("list_slice", func("list_sort", column(f"_l{i}")), number(1), length(), step)
    # A list of at most C values is kept whole: no sort needed (the slice would keep it all).
    short = exp.LTE(this=length(), expression=number(c))
    return alias(when((short, column(f"_l{i}")), otherwise=sliced), f"_l{i}")


def capped(
    keys: Sequence[str], bounding: Bounding, squared: Sequence[tuple[int, int]]
) -> exp.Select:
    """``_capped`` from ``_kept``: per (unit, keys), rows and values counted up to C, sums
    scaled to at most C rows, listed values cut to C."""
    c, values = bounding.max_rows, bounding.values
    out: list[Node] = [*(column(k) for k in keys), alias(least(column("_n"), number(c)), "_c")]
    out += [
        alias(least(column(f"_n{i}"), number(c)), f"_c{i}")
        for i, v in enumerate(values)
        if not v.listed
    ]
    out += [
        alias(capped_sum(i, c, v.grid), f"_t{i}")
        for i, v in enumerate(values)
        if v.grid is not None and not v.listed
    ]
    for i, j in squared:
        grid, other = values[i].grid, values[j].grid
        assert grid is not None and other is not None
        if i == j:
            out.append(alias(capped_squares(i, c, grid), f"_r{i}"))
        else:
            out.append(alias(capped_products(i, j, c, grid, other), f"_r{i}_{j}"))
    out += [capped_list(i, c) for i, v in enumerate(values) if v.listed]
    return select(out, table("_kept"))


def direct(keys: Sequence[str], bounding: Bounding, squared: Sequence[tuple[int, int]],
           weighted: bool) -> exp.Select:  # fmt: skip
    """``_capped`` when no per-(unit, group) bound can bind: one row per kept row (or per kept
    (unit, keys) row and its copies ``_w``), with the columns the cross-unit aggregate reads;
    nothing is capped or scaled."""
    out: list[Node] = [column("_u"), *(column(k) for k in keys)]
    out.append(alias(column("_w") if weighted else number(1), "_c"))
    for i, v in enumerate(bounding.values):
        if v.listed:
            out.append(column(f"_v{i}"))
            continue
        one = when((is_null(column(f"_v{i}")), number(0)), otherwise=number(1))
        out.append(alias(one, f"_c{i}"))
        if v.grid is not None:
            zero = exp.Coalesce(this=column(f"_v{i}"), expressions=[number(0)])
            out.append(alias(hugeint(zero), f"_t{i}"))
    for i, j in squared:
        grid, other = bounding.values[i].grid, bounding.values[j].grid
        assert grid is not None and other is not None
        if i == j:
            square = _square(f"_v{i}", grid)
            none = is_null(column(f"_v{i}"))
            out.append(alias(when((none, number(0)), otherwise=square), f"_r{i}"))
            continue
        product = _product(f"_v{i}", grid, f"_v{j}", other)
        either = exp.Or(this=is_null(column(f"_v{i}")), expression=is_null(column(f"_v{j}")))
        out.append(alias(when((either, number(0)), otherwise=product), f"_r{i}_{j}"))
    return select(out, table("_vals"))


__all__ = ["Aggregate", "aggregates", "capped", "capped_list", "capped_products", "capped_squares",
           "capped_sum", "direct", "listed"]  # fmt: skip
