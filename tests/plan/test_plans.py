"""Golden plans: sensitivities, scales and costs written by hand from DESIGN.md sections 3-4.

Nothing here is a snapshot of the planner's output: every expected number is derived in the
test from the formulas (L1, add/remove one unit, L0 groups and C rows per unit):
COUNT L0·C; COUNT(DISTINCT unit) L0; SUM L0·C·max(|lo_g|, |hi_g|); centred SUM (for AVG)
L0·C·(hi_g - lo_g)/2; grid g = 2^(floor(log2(hi - lo)) - 20) (at least 1 for an integer column
with integer bounds), lo_g = g·floor(lo/g), hi_g = g·ceil(hi/g); epsilon split equally over the
k measurements, scale_j = k·Δ_j/ε; private keys add a distinct-unit count used for partition
selection at 1 + ceil(t·ln(L0/(δ·(1 + e^(-1/t))))), t its scale.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Any

import pytest
import sqlglot

from dpsql.errors import BoundsError, ParameterError
from dpsql.plan.plans import Measurement, Plan
from dpsql.policy import Policy
from dpsql.session.session import Session

TinyPolicy = Callable[..., Policy]
ROWS = [(1, "east", 30, 10.0), (2, "west", 40, 20.0)]
SPEND_G = Fraction(1, 2**13)  # hi - lo = 200: floor(log2 200) = 7, g = 2^(7 - 20)


def plan(policy: Policy, sql: str, **options: Any) -> Plan:
    """The plan under the even split, whose arithmetic these tests pin by hand (the optimal
    split's shares are pinned by tests/plan/test_split.py)."""
    options.setdefault("split", "even")
    session = Session(policy)
    try:
        return session.plan(sql, **options)
    finally:
        session.close()


def hand_grid(
    lo: Fraction, hi: Fraction, integral: bool = False
) -> tuple[Fraction, Fraction, Fraction]:
    """(g, lo_g, hi_g), by the formula of DESIGN.md section 3."""
    k = 0
    while Fraction(2) ** (k + 1) <= hi - lo:
        k += 1
    while Fraction(2) ** k > hi - lo:
        k -= 1
    g = Fraction(2) ** (k - 20)
    if integral:
        g = max(g, Fraction(1))
    return g, g * math.floor(lo / g), g * math.ceil(hi / g)


def by_kind(p: Plan) -> dict[str, Measurement]:
    out: dict[str, Measurement] = {m.spec.kind: m for m in p.measurements}
    assert len(out) == len(p.measurements), "one measurement per kind in these tests"
    return out


def value_sensitivity(m: Measurement) -> Fraction:
    return m.sensitivity * m.unit


def value_scale(m: Measurement) -> Fraction:
    return m.scale * m.unit


def assert_split(p: Plan, epsilon: Fraction, sensitivities: dict[str, Fraction]) -> None:
    """Each measurement: the hand sensitivity (value units), scale k·Δ/ε, epsilon ε/k."""
    k = len(p.measurements)
    got = by_kind(p)
    assert set(got) == set(sensitivities)
    for kind, delta_value in sensitivities.items():
        m = got[kind]
        assert value_sensitivity(m) == delta_value, kind
        assert value_scale(m) == k * delta_value / epsilon, kind
        assert m.epsilon == epsilon / k, kind
    assert p.event.epsilon == epsilon
    assert sum((m.epsilon for m in p.measurements), Fraction(0)) == epsilon


@pytest.fixture
def visits(tiny_policy: TinyPolicy) -> Policy:
    """L0 = 2, C = 10, spend in [0, 200], age in [18, 90], region public; query epsilon 1."""
    return tiny_policy(ROWS, max_groups=2, max_rows=10)


# -- counts, sums, averages -------------------------------------------------------------------


def test_count_rows_group_by_public_key(visits: Policy) -> None:
    p = plan(visits, "SELECT region, COUNT(*) FROM visits GROUP BY region")
    assert (p.max_groups, p.max_rows) == (2, 10)
    assert_split(p, Fraction(1), {"rows": Fraction(2 * 10)})
    assert by_kind(p)["rows"].sensitivity == 20 and by_kind(p)["rows"].unit == 1
    assert p.selection is None and p.event.delta == 0


def test_sum_sensitivity_in_value_units(visits: Policy) -> None:
    p = plan(visits, "SELECT region, SUM(spend) FROM visits GROUP BY region")
    assert_split(p, Fraction(1), {"sum": Fraction(2 * 10 * 200)})
    m = by_kind(p)["sum"]
    assert m.unit == SPEND_G
    assert m.sensitivity == 2 * 10 * 200 * 2**13  # integer units of g


def test_avg_is_a_centred_sum_and_a_count_each_with_half_the_epsilon(visits: Policy) -> None:
    p = plan(visits, "SELECT region, AVG(spend) FROM visits GROUP BY region")
    # Centred around m = 100: each row moves the centred sum by at most (200 - 0)/2.
    assert_split(p, Fraction(1), {"centred": Fraction(2 * 10 * 100), "count": Fraction(20)})
    m = by_kind(p)["centred"]
    assert m.unit == SPEND_G / 2
    assert m.epsilon == Fraction(1, 2) and by_kind(p)["count"].epsilon == Fraction(1, 2)
    (est,) = p.estimates
    assert est.grid is not None and est.grid.centre == 100


def test_several_aggregates_share_measurements(visits: Policy) -> None:
    sql = (
        "SELECT region, COUNT(*), COUNT(*) AS again, SUM(spend), AVG(spend), COUNT(spend) "
        "FROM visits GROUP BY region"
    )
    p = plan(visits, sql, epsilon="0.4")
    # rows, sum, centred, count (COUNT(spend) is AVG's count): k = 4, epsilon 1/10 each.
    assert_split(
        p,
        Fraction(2, 5),
        {
            "rows": Fraction(20),
            "sum": Fraction(4000),
            "centred": Fraction(2000),
            "count": Fraction(20),
        },
    )


def test_count_distinct_units_has_sensitivity_l0(visits: Policy) -> None:
    p = plan(visits, "SELECT region, COUNT(DISTINCT user_id) FROM visits GROUP BY region")
    assert_split(p, Fraction(1), {"units": Fraction(2)})


def test_asymmetric_bounds_centred_is_22_times_smaller(tiny_policy: TinyPolicy) -> None:
    policy = tiny_policy(ROWS, columns={"spend": {"lower": 100, "upper": 110}})
    g, lo_g, hi_g = hand_grid(Fraction(100), Fraction(110))
    assert (g, lo_g, hi_g) == (
        Fraction(1, 2**17),
        Fraction(100),
        Fraction(110),
    )  # floor(log2 10) = 3
    total = by_kind(plan(policy, "SELECT SUM(spend) FROM visits"))["sum"]
    mean = by_kind(plan(policy, "SELECT AVG(spend) FROM visits"))["centred"]
    # No GROUP BY: L0 = 1.
    assert value_sensitivity(total) == 1 * 10 * 110
    assert value_sensitivity(mean) == 1 * 10 * 5
    assert value_sensitivity(total) / value_sensitivity(mean) == 22


def test_symmetric_bounds_gain_nothing_from_centring(tiny_policy: TinyPolicy) -> None:
    policy = tiny_policy(ROWS, columns={"spend": {"lower": -50, "upper": 50}})
    total = by_kind(plan(policy, "SELECT SUM(spend) FROM visits"))["sum"]
    mean = by_kind(plan(policy, "SELECT AVG(spend) FROM visits"))["centred"]
    assert value_sensitivity(total) == value_sensitivity(mean) == 10 * 50


def test_no_group_by_uses_l0_one(visits: Policy) -> None:
    p = plan(visits, "SELECT SUM(spend), COUNT(*) FROM visits")
    assert p.max_groups == 1
    assert_split(p, Fraction(1), {"sum": Fraction(1 * 10 * 200), "rows": Fraction(10)})


@pytest.mark.parametrize(("l0", "c"), [(1, 1), (3, 7), (5, 2)])
def test_sensitivity_scales_with_l0_and_c(tiny_policy: TinyPolicy, l0: int, c: int) -> None:
    policy = tiny_policy(ROWS, max_groups=l0, max_rows=c)
    p = plan(policy, "SELECT region, COUNT(*), SUM(spend) FROM visits GROUP BY region")
    assert (p.max_groups, p.max_rows) == (l0, c)
    assert_split(p, Fraction(1), {"rows": Fraction(l0 * c), "sum": Fraction(l0 * c * 200)})


def test_query_options_override_policy_bounds(visits: Policy) -> None:
    p = plan(
        visits,
        "SELECT region, COUNT(*) FROM visits GROUP BY region",
        max_groups_per_unit=3,
        max_rows_per_unit_per_group=4,
    )
    assert (p.max_groups, p.max_rows) == (3, 4)
    assert_split(p, Fraction(1), {"rows": Fraction(12)})


# -- grids ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lower", "upper"),
    [("-0.3", "2.35"), ("-1/3", "7/3"), ("0.1", "0.7"), ("-1000.001", "3.5")],
)
def test_bounds_off_the_grid_are_widened_to_it(
    tiny_policy: TinyPolicy, lower: str, upper: str
) -> None:
    lo, hi = Fraction(lower), Fraction(upper)
    policy = tiny_policy(ROWS, columns={"spend": {"lower": lower, "upper": upper}})
    g, lo_g, hi_g = hand_grid(lo, hi)
    assert lo_g <= lo < lo_g + g and hi_g - g < hi <= hi_g
    total = plan(policy, "SELECT region, SUM(spend) FROM visits GROUP BY region")
    mean = plan(policy, "SELECT region, AVG(spend) FROM visits GROUP BY region")
    (est,) = mean.estimates
    assert est.grid is not None
    assert (est.grid.step, est.grid.lower_value, est.grid.upper_value) == (g, lo_g, hi_g)
    assert est.grid.centre == (lo_g + hi_g) / 2
    assert value_sensitivity(by_kind(total)["sum"]) == 2 * 10 * max(abs(lo_g), abs(hi_g))
    assert by_kind(total)["sum"].unit == g
    assert value_sensitivity(by_kind(mean)["centred"]) == 2 * 10 * (hi_g - lo_g) / 2
    assert by_kind(mean)["centred"].unit == g / 2


def test_grid_for_minus_one_third_by_hand(tiny_policy: TinyPolicy) -> None:
    policy = tiny_policy(ROWS, columns={"spend": {"lower": "-0.3", "upper": "2.35"}})
    # hi - lo = 2.65, floor(log2 2.65) = 1, g = 2^-19.
    g = Fraction(1, 2**19)
    lo_g, hi_g = g * math.floor(Fraction(-3, 10) / g), g * math.ceil(Fraction(235, 100) / g)
    assert (lo_g, hi_g) == (Fraction(-157287, 2**19), Fraction(1232077, 2**19))
    m = by_kind(plan(policy, "SELECT SUM(spend) FROM visits"))["sum"]
    assert value_sensitivity(m) == 10 * hi_g  # L0 = 1
    assert m.sensitivity == 10 * 1232077


@pytest.mark.parametrize(
    ("lower", "upper", "g"),
    [(18, 90, 1), (0, 3_000_000, 2), (1, 3_000_001, 2), (0, 2**31, 2**11)],
)
def test_integer_column_grid_is_at_least_one(
    tiny_policy: TinyPolicy, lower: int, upper: int, g: int
) -> None:
    policy = tiny_policy(ROWS, columns={"age": {"lower": lower, "upper": upper}})
    hg, lo_g, hi_g = hand_grid(Fraction(lower), Fraction(upper), integral=True)
    assert hg == g
    p = plan(policy, "SELECT AVG(age), SUM(age) FROM visits")
    kinds = by_kind(p)
    assert kinds["sum"].unit == g
    assert value_sensitivity(kinds["sum"]) == 10 * max(abs(lo_g), abs(hi_g))
    assert value_sensitivity(kinds["centred"]) == 10 * (hi_g - lo_g) / 2
    assert_split(
        p,
        Fraction(1),
        {
            "centred": 10 * (hi_g - lo_g) / 2,
            "count": Fraction(10),
            "sum": 10 * max(abs(lo_g), abs(hi_g)),
        },
    )


def test_sum_over_expressions_uses_interval_bounds(visits: Policy) -> None:
    cases = {
        "SUM(spend * 2)": Fraction(400),
        "SUM(CASE WHEN age > 30 THEN spend ELSE 0 END)": Fraction(200),
        "SUM(LEAST(GREATEST(spend, 0), 50))": Fraction(50),
        "SUM(spend - 300)": Fraction(300),
        "SUM(age)": Fraction(90),
    }
    for expr, magnitude in cases.items():
        m = by_kind(plan(visits, f"SELECT {expr} FROM visits"))["sum"]
        assert value_sensitivity(m) == 10 * magnitude, expr


# -- private keys and partition selection ------------------------------------------------------


def threshold_by_hand(t: Fraction, l0: int, delta: Fraction) -> int:
    """1 + ceil(t·ln(L0/(δ·(1 + e^(-1/t))))) in 50-digit decimal arithmetic."""
    with localcontext() as ctx:
        ctx.prec = 50
        td = Decimal(t.numerator) / Decimal(t.denominator)
        dd = Decimal(delta.numerator) / Decimal(delta.denominator)
        q = (Decimal(-1) / td).exp()
        x = td * (Decimal(l0) / (dd * (1 + q))).ln()
        return 1 + max(1, math.ceil(x))


@pytest.mark.parametrize(
    ("epsilon", "delta", "l0"),
    [("1", "0.00000001", 2), ("0.1", "0.000001", 2), ("2.5", "1e-10", 5), ("1", "0.01", 1)],
)
def test_private_key_selection_threshold(
    tiny_policy: TinyPolicy, epsilon: str, delta: str, l0: int
) -> None:
    policy = tiny_policy(ROWS, max_groups=l0)
    eps, dlt = Fraction(epsilon), Fraction(Decimal(delta))
    p = plan(policy, "SELECT age, COUNT(*) FROM visits GROUP BY age", epsilon=epsilon, delta=delta)
    # Two measurements: rows (L0·C) and distinct units (L0), epsilon/2 each.
    assert_split(p, eps, {"rows": Fraction(l0 * 10), "units": Fraction(l0)})
    units = by_kind(p)["units"]
    t = Fraction(2 * l0) / eps
    assert units.scale == t
    assert p.selection is not None
    assert p.selection.measurement == p.measurements.index(units)
    assert p.selection.threshold == threshold_by_hand(t, l0, dlt)
    assert p.selection.delta == dlt
    assert p.event.delta == dlt and p.event.epsilon == eps


def test_threshold_example_by_hand(visits: Policy) -> None:
    # t = 2·2/1 = 4: 4·ln(2/(1e-8·(1 + e^-0.25))) = 74.15..., so 1 + 75.
    p = plan(visits, "SELECT age, COUNT(*) FROM visits GROUP BY age")
    assert p.selection is not None and p.selection.threshold == 76


def test_private_key_count_distinct_is_the_selection_measurement(visits: Policy) -> None:
    p = plan(visits, "SELECT age, COUNT(DISTINCT user_id) FROM visits GROUP BY age")
    assert_split(p, Fraction(1), {"units": Fraction(2)})
    assert p.selection is not None and p.selection.measurement == 0
    assert p.selection.threshold == threshold_by_hand(Fraction(2), 2, Fraction(1, 10**8))


def test_private_key_needs_delta(visits: Policy) -> None:
    with pytest.raises(ParameterError):
        plan(visits, "SELECT age, COUNT(*) FROM visits GROUP BY age", delta=0)


# -- exact costs and effective L0 ---------------------------------------------------------------


@pytest.mark.parametrize("epsilon", [0.1, 0.3, "0.7", 1, Fraction(1, 3)])
def test_total_epsilon_is_exactly_the_query_epsilon(visits: Policy, epsilon: object) -> None:
    want = Fraction(repr(epsilon)) if isinstance(epsilon, float) else Fraction(str(epsilon))
    for sql in [
        "SELECT COUNT(*) FROM visits",
        "SELECT region, AVG(spend), SUM(age), COUNT(*) FROM visits GROUP BY region",
        "SELECT age, AVG(spend) FROM visits GROUP BY age",
    ]:
        p = plan(visits, sql, epsilon=epsilon)
        assert p.event.epsilon == want, sql
        assert p.epsilon == want
    assert plan(visits, "SELECT COUNT(*) FROM visits", epsilon=0.1).event.epsilon == Fraction(1, 10)


def test_policy_default_epsilon_is_exact(tiny_policy: TinyPolicy) -> None:
    policy = tiny_policy(ROWS, budget={"query_epsilon": "0.01"})
    p = plan(policy, "SELECT region, AVG(spend) FROM visits GROUP BY region")
    assert p.event.epsilon == Fraction(1, 100)


@pytest.mark.parametrize(
    ("sql", "l0", "effective"),
    [
        ("SELECT region, COUNT(*) FROM visits GROUP BY region", 10, 5),
        ("SELECT region, COUNT(*) FROM visits GROUP BY region", 5, 5),
        ("SELECT region, COUNT(*) FROM visits GROUP BY region", 4, 4),
        (
            "SELECT CASE WHEN age < 40 THEN 'a' ELSE 'b' END AS b, COUNT(*) FROM visits GROUP BY b",
            7,
            2,
        ),
        (
            "SELECT CASE WHEN age < 40 THEN 'a' END AS b, COUNT(*) FROM visits GROUP BY b",
            7,
            2,  # 'a' and NULL
        ),
        (
            "SELECT region, CASE WHEN age < 40 THEN 'a' ELSE 'b' END AS b, COUNT(*) FROM visits "
            "GROUP BY region, b",
            20,
            10,
        ),
    ],
)
def test_public_domain_smaller_than_l0_lowers_l0(
    tiny_policy: TinyPolicy, sql: str, l0: int, effective: int
) -> None:
    policy = tiny_policy(ROWS, max_groups=l0)
    p = plan(policy, sql)
    assert p.max_groups == effective
    assert_split(p, Fraction(1), {"rows": Fraction(effective * 10)})


def test_private_key_keeps_full_l0(tiny_policy: TinyPolicy) -> None:
    policy = tiny_policy(ROWS, max_groups=10)
    p = plan(policy, "SELECT region, age, COUNT(*) FROM visits GROUP BY region, age")
    assert p.max_groups == 10
    assert by_kind(p)["rows"].sensitivity == 100


def test_sum_without_bounds_is_rejected(visits: Policy) -> None:
    with pytest.raises(BoundsError):
        plan(visits, "SELECT SUM(user_id) FROM visits")


def test_sum_of_a_product_uses_the_product_interval(visits: Policy) -> None:
    m = by_kind(plan(visits, "SELECT SUM(spend * age) FROM visits"))["sum"]
    assert value_sensitivity(m) == 10 * 200 * 90


def test_a_per_unit_subquery_grouped_by_the_unit_alone_has_one_row_per_unit(
    visits: Policy,
) -> None:
    """GROUP BY the unit leaves one row per unit: C' = L0' = 1 whatever the policy says, so a
    count over it has sensitivity 1 (not C); grouped by the unit and a key, no such cap."""
    per_user = "(SELECT user_id, COUNT(*) AS n FROM visits GROUP BY user_id)"
    one = plan(visits, f"SELECT COUNT(*), SUM(LEAST(n, 20)) FROM {per_user} AS t")
    assert (one.max_groups, one.max_rows) == (1, 1)
    assert [m.sensitivity for m in one.measurements] == [1, 20]
    filtered = plan(visits, f"SELECT COUNT(*) FROM (SELECT * FROM {per_user} WHERE n > 3)")
    assert filtered.max_rows == 1
    joined = plan(visits, f"SELECT COUNT(*) FROM {per_user} AS t JOIN visits USING (user_id)")
    assert joined.max_rows == 10  # the join fans out again: the policy's C applies
    two_keys = "(SELECT user_id, region, COUNT(*) n FROM visits GROUP BY user_id, region)"
    assert plan(visits, f"SELECT COUNT(*) FROM {two_keys}").max_rows == 10


def _kept_rows(session: Session, sql: str, **options: Any) -> list[tuple[Any, ...]]:
    """The rows R's window keeps (the bounded query's ``_rows``), per unit: (unit, key, n); a
    query reading no value keeps (unit, key) rows with their number of copies ``_w``."""
    plan = session.plan(sql, **options)
    tree = sqlglot.parse_one(plan.engine_sql, read="duckdb")
    n = "COUNT(*)" if "_x0" in plan.engine_sql else "SUM(_w)"
    probe = sqlglot.parse_one(
        f"SELECT _u, _k0, {n} AS n FROM _rows GROUP BY _u, _k0 ORDER BY _u, _k0",
        read="duckdb",
    )
    probe.set("with_", tree.args.get("with_") or tree.args.get("with"))
    return session.engine.run(probe.sql(dialect="duckdb"))[1]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT region, COUNT(*) FROM visits GROUP BY region",
        "SELECT region, SUM(spend) FROM visits GROUP BY region",
    ],
)
def test_row_cap_keeps_r_rows_whatever_the_row_order(tiny_policy: Any, sql: str) -> None:
    """With R, a unit's identical rows tie on the hash and are ordered by their own columns: the
    kept rows are exactly R per unit and the same multiset whatever order the rows are stored
    in (a function of the unit's own rows), and copies of one row are kept or dropped together."""
    rows = [(u, region, 30, 1.0) for u in range(40) for region in ("east", "west")
            for _ in range(50)]  # fmt: skip
    first = Session(tiny_policy(rows, max_groups=2, max_rows=10))
    kept = _kept_rows(first, sql, max_rows_per_unit=10)
    per_unit: dict[Any, int] = {}
    for unit, _, n in kept:
        per_unit[unit] = per_unit.get(unit, 0) + n
    assert per_unit == {u: 10 for u in range(40)}
    # 10 copies of one row: all of one kind, chosen per unit by the keyed hash.
    assert all(n == 10 for _, _, n in kept)
    assert {key for _, key, _ in kept} == {"east", "west"}
    shuffled = list(rows)
    random.Random(5).shuffle(shuffled)
    second = Session(tiny_policy(shuffled, max_groups=2, max_rows=10))
    second.engine.salt = first.engine.salt  # the same secret: the same rows must be kept
    assert _kept_rows(second, sql, max_rows_per_unit=10) == kept
