"""Every bound the bounded query enforces is exact integer arithmetic (DESIGN.md section 3).

The C-scaling of a unit's sum, round(C·S/n) clamped to [C·lower, C·upper], was computed in
DOUBLE: above 2^53 the sum and the clamp bounds are rounded, and one unit could move a total by
a grid unit more than the plan's sensitivity. These tests generate units with sums far beyond
2^53 grid units and compare what the engine keeps per unit with the exact rational formula.
"""

from __future__ import annotations

from fractions import Fraction

from conftest import TinyPolicy, examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlglot import exp

from dpsql.session.session import Session

SCHEMA = (("user_id", "BIGINT"), ("region", "VARCHAR"), ("age", "BIGINT"), ("spend", "DOUBLE"))


def _per_unit(session: Session, sql: str) -> list[tuple[int, int]]:
    """(_c0, _t0) of every unit: the bounded query cut after its _capped step."""
    plan = session.plan(sql)
    cut = plan.bounded.copy()
    cut.set("expressions", [exp.column("_c0"), exp.column("_t0")])
    cut.set("from_", exp.From(this=exp.to_table("_capped")))
    for clause in ("joins", "where", "group"):
        cut.set(clause, None)
    _, rows = session.engine.run(cut.sql(dialect="duckdb"))
    return [(int(c), int(t)) for c, t in rows]


@settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    top=st.integers(2**51, 2**52),
    width=st.integers(1, 2**19),
    cap=st.integers(1, 7),
    offsets=st.lists(st.integers(0, 2**19), min_size=1, max_size=40),
)
def test_capped_sum_is_the_exact_rounded_mean_times_c(
    tiny_policy: TinyPolicy, top: int, width: int, cap: int, offsets: list[int]
) -> None:
    lower, upper = top - width, top
    rows = [(1, "east", min(max(top - o, lower), upper), 0.0) for o in offsets]
    policy = tiny_policy(
        rows,
        max_rows=cap,
        schema=SCHEMA,
        columns={"age": {"lower": lower, "upper": upper}},
    )
    session = Session(policy)
    try:
        ((kept, total),) = _per_unit(session, "SELECT SUM(age) FROM visits")
    finally:
        session.close()
    values = [r[2] for r in rows]
    n, s = len(values), sum(values)
    exact = s if n <= cap else (Fraction(cap * s, n) + Fraction(1, 2)).__floor__()
    assert kept == min(n, cap)
    assert total == exact
    # The bound the sensitivity is computed from holds exactly, not up to a rounding of it.
    assert cap * lower <= total <= cap * upper if n > cap else True


def test_a_unit_at_the_top_of_the_grid_moves_a_sum_by_at_most_its_sensitivity(
    tiny_policy: TinyPolicy,
) -> None:
    # C·upper = 3·(2^52 - 3) is odd and above 2^53: no DOUBLE holds it, and the nearest one is
    # above it. With the sum and the clamp in DOUBLE, four rows at the upper bound contributed
    # 3·upper + 1: one grid unit more than the sensitivity the plan charges for.
    upper = 2**52 - 3
    rows = [(1, "east", upper, 0.0)] * 4
    policy = tiny_policy(
        rows, max_rows=3, schema=SCHEMA, columns={"age": {"lower": upper - 2**19, "upper": upper}}
    )
    session = Session(policy)
    try:
        ((kept, total),) = _per_unit(session, "SELECT SUM(age) FROM visits")
    finally:
        session.close()
    assert (kept, total) == (3, 3 * upper)
