"""The diagnosis of a query's bounds: per unit, which contribution bounds and clamps cut it.

``diagnosis_query`` reads the relation the bounded query bounds (``relation_rows``: after joins,
WHERE and the public domains' filter, before R, L0 and C) and returns, for each pattern of
flags, the number of units whose rows show it:

* ``L0``: the unit touches more than L0 groups;
* ``C``: the unit has more than C rows in some group;
* ``R``: the unit has more than R rows in total (only when R is set);
* ``clamped``: some value of an aggregated expression is changed by a clamp: a bounded column
  inside it lies outside its bounds, or its value lies outside the expression's grid-aligned
  bounds (NULL and NaN are skipped, not clamped, and are never flagged).

Each flag is a function of the unit's own rows (and public tables), read before any bound, so
every unit lands in exactly one pattern: adding or removing one unit moves one cell of the
histogram by one (L1 = L2 = 1, the sensitivity of a histogram: Dwork, McSherry, Nissim, Smith
2006), which ``dpsql.plan.diagnosis`` calibrates. The cells are public (2^k patterns), so the
empty ones are filled with 0 after the engine runs; NULL units are one unit, as everywhere.

>>> pattern_sql(("L0", "C"), {"L0": 2, "C": 5})
'CASE WHEN _g > 2 THEN 1 ELSE 0 END + CASE WHEN _mx > 5 THEN 2 ELSE 0 END'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dpsql.analyze.analysis import Analysis
from dpsql.bound.rewrite import _total_sql, relation_ctes, relation_rows
from dpsql.bound.specs import Bounding
from dpsql.bound.values import _number, _unclamped_value

__all__ = ["FLAGS", "diagnosis_query", "pattern_sql"]

# Every flag a diagnosis may carry, in the order of their bits.
FLAGS = ("L0", "C", "R", "clamped")

# What each flag compares, over the per-unit row of ``diagnosis_query``.
_COLUMN = {"L0": "_g", "C": "_mx", "R": "_tot"}


def pattern_sql(flags: Sequence[str], limits: Mapping[str, int]) -> str:
    """The pattern of a unit's flags as an integer: bit j set when flag j holds."""
    terms = []
    for j, flag in enumerate(flags):
        test = "_cl = 1" if flag == "clamped" else f"{_COLUMN[flag]} > {limits[flag]}"
        terms.append(f"CASE WHEN {test} THEN {2**j} ELSE 0 END")
    return " + ".join(terms) or "0"


def _clamped(analysis: Analysis, bounding: Bounding) -> list[tuple[int, str | None, str]]:
    """Per value on a grid: its index i, the SQL of its value with no column clamped (``_o<i>``;
    None for a bare column, where it is the raw value ``_x<i>``) and the row-level test "a
    clamp changes this value": the value lies beyond the grid-aligned bounds, where the grid
    clamp acts, or a column clamp inside the expression changed it."""
    total_sql = _total_sql(analysis)
    out = []
    for i, v in enumerate(bounding.values):
        if v.grid is None:
            continue
        unclamped = _unclamped_value(v.expr, analysis, total_sql)
        o = f"_x{i}" if unclamped is None else f"_o{i}"
        lo = _number(v.grid.lower_value).sql(dialect="duckdb")
        hi = _number(v.grid.upper_value).sql(dialect="duckdb")
        changed = "" if unclamped is None else f" OR _x{i} IS DISTINCT FROM {o}"
        # NULL and NaN are skipped by every aggregate, never clamped.
        test = f"{o} IS NOT NULL AND NOT isnan({o}) AND ({o} < {lo} OR {o} > {hi}{changed})"
        out.append((i, unclamped, test))
    return out


def diagnosis_query(
    analysis: Analysis, bounding: Bounding, flags: Sequence[str], limits: Mapping[str, int]
) -> str:
    """One row per flag pattern present: ``_p`` the pattern, ``_z`` its number of units."""
    keys = [f"_k{i}" for i in range(len(analysis.keys))]
    clamps = _clamped(analysis, bounding)
    extra = {f"_o{i}": sql for i, sql, _ in clamps if sql is not None}
    flagged = " OR ".join(f"({test})" for _, _, test in clamps) or "false"
    rows = relation_rows(analysis, bounding, extra)
    group = ", ".join(["_u", *keys])
    return (
        f"WITH {relation_ctes(analysis)}"
        f"_rows AS ({rows}), "
        f"_dg AS (SELECT {group}, COUNT(*) AS _n, "
        f"MAX(CASE WHEN {flagged} THEN 1 ELSE 0 END) AS _cl FROM _rows GROUP BY {group}), "
        "_du AS (SELECT _u, COUNT(*) AS _g, MAX(_n) AS _mx, SUM(_n) AS _tot, MAX(_cl) AS _cl "
        "FROM _dg GROUP BY _u), "
        f"_dp AS (SELECT CAST({pattern_sql(flags, limits)} AS BIGINT) AS _p FROM _du) "
        "SELECT _p, COUNT(*) AS _z FROM _dp GROUP BY _p"
    )
