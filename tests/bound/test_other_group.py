"""The other group of a public GROUP BY key (``dpsql.other_group``, docs/sql.md).

Rows whose key is outside the public domain, dropped otherwise, are kept in one more group per
key. What must hold:

- membership is the engine's equality in the key's type and collation, the one that
  deduplicated the domain: no spelling of a value (``'1'`` and ``1``, ``1.0`` and ``1``, ``'EU'``
  and ``'eu'`` under NOCASE) is both in the domain and other, and every row is in exactly one
  released group (checked against a per-row oracle of scalar casts in plain DuckDB);
- NULL keys are other unless the domain lists NULL;
- the label is refused, naming the setting and never a value, when it is not a value of the
  key's type or equals a domain value as the engine compares keys; nothing is charged;
- the other group is one of a unit's L0 groups: on neighbouring data sets D and D' (D' = D plus
  one adversarial unit, drawn by hypothesis) every exact total, the other group's included,
  moves by at most the planned per-group bound, in at most L0 groups; the released key set is
  the cross product of each domain plus its other key, on D and D' alike, even when empty;
- the public size grows by one per key: L0's cap, the skipped ranking and the 1,000,000 limit
  use it;
- every interface (DB-API, shell, ``dpsql run``, the server) sets it through the session.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pytest
from conftest import examples, write_parquet
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from test_neighbours import _check

from dpsql import errors
from dpsql.errors import BoundsError, ParameterError, UnsupportedQueryError
from dpsql.plan.steps import MAX_PUBLIC_GROUPS
from dpsql.policy import Policy, load_policy
from dpsql.session.session import Session

SCHEMA = (
    ("user_id", "BIGINT"),
    ("region", "VARCHAR"),
    ("age", "INTEGER"),
    ("spend", "DOUBLE"),
    ("day", "DATE"),
)
REGIONS = ("north", "south", "east")
UNIT = 10**6


def _base_rows() -> list[tuple[Any, ...]]:
    regions = [*REGIONS, "NORTH", "north ", None, "west", ""]
    ages = [20, 21, 22, 23, None, -1]
    spends = [1.0, 2.0, -0.0, 0.0, 3.5, None, math.nan]
    return [
        (
            i % 60,
            regions[i % len(regions)],
            ages[i % len(ages)],
            spends[i % len(spends)],
            None if i % 11 == 0 else dt.date(2026, 1, 1) + dt.timedelta(days=(i * 7) % 120),
        )
        for i in range(360)
    ]


BASE = _base_rows()


def _policy(folder: Path, rows: Sequence[tuple[Any, ...]], name: str) -> Policy:
    path = folder / f"{name}.parquet"
    write_parquet(path, rows, SCHEMA)
    return load_policy(
        {
            "dataset": {"id": "other"},
            "data": {"tables": {"visits": str(path)}},
            "budget": {
                "diagnose": False,
                "epsilon": "10000",
                "delta": "0.5",
                "query_epsilon": "1",
                "query_delta": "0.000001",
            },
            "tables": {
                "visits": {
                    "privacy_unit": "user_id",
                    "max_groups_per_unit": 2,
                    "max_rows_per_unit_per_group": 3,
                    "columns": {
                        "region": {"public_values": list(REGIONS)},
                        # Spellings the INTEGER column's type makes one value: {20, 21, 22}.
                        "age": {"lower": 0, "upper": 100, "public_values": [20, "21", "022", 22]},
                        # The DOUBLE column's domain {0, 1, 2}: -0.0 and '0' are one value.
                        "spend": {"lower": 0, "upper": 10, "public_values": [1.0, "1", -0.0, "2"]},
                        "day": {"date_range": ["2026-01-01", "2026-02-28"]},
                    },
                },
            },
        },
        base_dir=folder,
    )


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    session = Session(_policy(tmp_path_factory.mktemp("other"), BASE, "base"))
    yield session
    session.close()


# -- neighbours --------------------------------------------------------------------------------

KEYS = st.sampled_from(
    [
        "region",
        "age",
        "spend",
        "CASE WHEN age < 21 THEN 1 WHEN age < 22 THEN '1' ELSE '01' END",
        "CASE WHEN spend > 3 THEN 'a' WHEN spend > 1 THEN 'a ' END",
        "month(day)",
        "date_trunc('month', day)",
        "upper(region)",  # a private key beside a public one: partition selection
    ]
)
AGGREGATES = st.lists(
    st.sampled_from(
        ["COUNT(*)", "SUM(spend)", "AVG(age)", "COUNT(DISTINCT user_id)", "COUNT(spend)"]
    ),
    min_size=1,
    max_size=3,
)
LABELS = st.sampled_from(
    [None, None, None, None, "other", "-1", "7", "1900-01-01", "a", "north", "21"]
)
HOSTILE = st.tuples(
    st.sampled_from([*REGIONS, "NORTH", "north ", " north", "", None, "other", "x" * 300]),
    st.sampled_from([20, 21, 22, 23, None, -1, 2**31 - 1, -(2**31)]),
    st.sampled_from([1.0, 2.0, -0.0, 0.0, math.nan, math.inf, -math.inf, None, 1e308]),
    st.sampled_from(
        [dt.date(2026, 1, 5), dt.date(2026, 3, 1), dt.date(1, 1, 1), dt.date(9999, 12, 31), None]
    ),
)


@st.composite
def queries(draw: st.DrawFn) -> str:
    keys = draw(st.lists(KEYS, min_size=1, max_size=2, unique=True))
    items = [f"{k} AS k{i}" for i, k in enumerate(keys)] + draw(AGGREGATES)
    options = ["other_group = true"]
    label = draw(LABELS)
    if label is not None:
        options.append(f"other_label = '{label}'")
    l0 = draw(st.sampled_from([None, 1, 3, 40]))
    if l0 is not None:
        options.append(f"max_groups_per_unit = {l0}")
    if draw(st.integers(0, 4)) == 0:
        options.append(f"max_rows_per_unit = {draw(st.sampled_from([1, 2, 5]))}")
    return (
        f"SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS({', '.join(options)}) {', '.join(items)} "
        f"FROM visits GROUP BY {', '.join(keys)}"
    )


@st.composite
def units(draw: st.DrawFn) -> list[tuple[Any, ...]]:
    """One new unit: a few distinct rows, each repeated up to 50 times."""
    kinds = draw(st.lists(HOSTILE, min_size=1, max_size=8))
    rows: list[tuple[Any, ...]] = []
    for kind in kinds:
        rows += [(UNIT, *kind)] * draw(st.sampled_from([1, 2, 7, 50]))
    return rows


def _released_keys(rows: Sequence[Sequence[Any]], n: int) -> set[tuple[str, ...]]:
    return {tuple(repr(v) for v in row[:n]) for row in rows}


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sql=queries(), unit=units())
def test_one_more_unit_moves_each_group_and_the_other_group_within_the_plan(
    base: Session, tmp_path_factory: pytest.TempPathFactory, sql: str, unit: list[tuple[Any, ...]]
) -> None:
    event(_neighbours(base, tmp_path_factory, sql, unit))


def _neighbours(
    base: Session, tmp_path_factory: pytest.TempPathFactory, sql: str, unit: list[tuple[Any, ...]]
) -> str:
    """Plan ``sql`` on D (``base``), run it on D and on D + ``unit``, and check the totals;
    returns what happened (a refusal, or ``checked``)."""
    try:
        plan = base.plan(sql)
    except errors.DpsqlError as exc:
        # A clash or a label of another type: refused before the charge, never by the engine.
        assert isinstance(exc, ParameterError | UnsupportedQueryError), (sql, exc)
        return f"refused: {type(exc).__name__}"
    assert all(k.other for k in plan.analysis.keys if k.public)
    neighbour = Session(_policy(tmp_path_factory.mktemp("d"), [*BASE, *unit], "neighbour"))
    neighbour.engine.salt = base.engine.salt  # the same keyed hash picks every other unit's rows
    try:
        assert neighbour.plan(sql).engine_sql == plan.engine_sql  # planning reads no data
        _, before = base.engine.run(plan.engine_sql)
        _, after = neighbour.engine.run(plan.engine_sql)
    finally:
        neighbour.close()
    # Each measurement's exact totals: at most L0 groups moved, each by its per-group bound.
    _check(plan, before, after)
    keys = plan.analysis.keys
    if all(k.public for k in keys):
        # Every domain value and the other key, crossed, on D and on D' (even when empty).
        expected = math.prod(len(k.domain or ()) + 1 for k in keys)
        assert len(before) == len(after) == expected
        assert _released_keys(before, len(keys)) == _released_keys(after, len(keys))
    return "checked"


# A unit with rows in every group of every key above, the other groups included: when L0 is
# at least the public size, the ranking is skipped and this unit moves every group, so L0 must
# count the other group (a size without it lets the unit move one group more than planned).
EVERYWHERE = [
    (UNIT, region, age, spend, day)
    for region, age, spend, day in [
        ("north", 20, 1.0, dt.date(2026, 1, 5)),
        ("south", 21, 2.0, dt.date(2026, 2, 5)),
        ("east", 22, 0.0, dt.date(2026, 3, 5)),
        ("elsewhere", 23, 3.5, None),
        (None, None, None, dt.date(2026, 4, 5)),
    ]
    for _ in range(4)
]


@pytest.mark.parametrize(
    "key",
    ["region", "age", "spend", "date_trunc('month', day)", "month(day)"],
)
def test_a_unit_in_every_group_moves_at_most_l0_of_them(
    base: Session, tmp_path_factory: pytest.TempPathFactory, key: str
) -> None:
    sql = (
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(other_group = true, max_groups_per_unit = 40) "
        f"{key} AS k, COUNT(*), SUM(spend) FROM visits GROUP BY k"
    )
    assert _neighbours(base, tmp_path_factory, sql, EVERYWHERE) == "checked"


# -- membership in the key's engine type ------------------------------------------------------

# (column type, domain spellings, row values): the spellings collide in the engine's type.
TYPED = {
    "INTEGER": (
        [1, "1", "01", " 1", "+1", "1.0", 2, "2 ", "x", None],
        [1, 2, 3, 0, -1, None, 2**31 - 1],
    ),
    "VARCHAR": (
        ["a", "a ", "A", "", " a", "other", None],
        ["a", "a ", "A", "", " a", "b", None, "other", "é"],
    ),
    "DOUBLE": (
        [1.0, "1", "1.0", "1e0", -0.0, "0", "nan", "inf", 2.5, None],
        [1.0, -0.0, 0.0, math.nan, math.inf, -math.inf, 2.5, 3.0, None],
    ),
}


def _typed_policy(folder: Path, kind: str, domain: list[Any], values: list[Any]) -> Policy:
    path = folder / "typed.parquet"
    # One row per unit: every unit is in exactly one group, so each exact count is the
    # number of rows in its group.
    rows = [(i, v) for i, v in enumerate(values)]
    write_parquet(path, rows, (("user_id", "BIGINT"), ("k", kind)))
    return load_policy(
        {
            "dataset": {"id": "typed"},
            "data": {"tables": {"visits": str(path)}},
            "budget": {"diagnose": False, "epsilon": "1000", "query_epsilon": "1"},
            "tables": {
                "visits": {
                    "privacy_unit": "user_id",
                    "max_groups_per_unit": 1,
                    "max_rows_per_unit_per_group": 1,
                    "columns": {"k": {"public_values": domain}},
                }
            },
        },
        base_dir=folder,
    )


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, float):
        return f"CAST('{value!r}' AS DOUBLE)"
    return str(value)


def _oracle(kind: str, domain: list[Any], values: list[Any]) -> tuple[int, int]:
    """(rows in the domain, rows in the other group), each row decided on its own by scalar
    casts and comparisons in plain DuckDB: in the domain iff it equals some spelling cast to
    the column's type, or is NULL and the domain lists NULL."""
    con = duckdb.connect()
    inside = 0
    try:
        for value in values:
            row = f"CAST({_literal(value)} AS {kind})"
            if value is None:
                member = None in domain
            else:
                tests = [
                    f"COALESCE(TRY_CAST({_literal(d)} AS {kind}) = {row}, false)"
                    for d in domain
                    if d is not None
                ]
                (hit,) = con.execute(f"SELECT {' OR '.join(tests) or 'false'}").fetchone()  # type: ignore[misc]
                member = bool(hit)
            inside += member
    finally:
        con.close()
    return inside, len(values) - inside


@settings(
    max_examples=examples(30),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data(), kind=st.sampled_from(sorted(TYPED)))
def test_every_row_is_in_exactly_one_group_as_the_engine_compares_keys(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject, kind: str
) -> None:
    spellings, row_values = TYPED[kind]
    domain = data.draw(st.lists(st.sampled_from(spellings), min_size=1, max_size=5, unique=True))
    values = data.draw(st.lists(st.sampled_from(row_values), min_size=1, max_size=12))
    label = data.draw(st.sampled_from([None, "zz", "-7", "123.25"]))
    try:
        policy = _typed_policy(tmp_path_factory.mktemp("typed"), kind, domain, values)
    except errors.PolicyError:
        assume(False)  # Python calls these duplicates (1 == 1.0): the policy refuses them
        return
    session = Session(policy)
    try:
        options = {"other_group": True, "other_label": label}
        sql = "SELECT k, COUNT(*) FROM visits GROUP BY k"
        try:
            plan = session.plan(sql, None, **options)
        except (ParameterError, BoundsError) as exc:
            # No label with NULL in the domain, a label of another type, a clash, or a domain
            # with no value of the type: refused before anything runs.
            event(f"refused: {type(exc).__name__}")
            assert session.budget().queries == 0
            return
        (key,) = plan.analysis.keys
        _, rows = session.engine.run(plan.engine_sql)
        counts = {r[0] if r[0] == r[0] else "nan": int(r[1]) for r in rows}
        assert len(counts) == len(rows) == len(key.domain or ()) + 1  # each key once
        other = None if key.other_text is None else _as_key(kind, key.other_text)
        inside, outside = _oracle(kind, domain, values)
        assert counts[other] == outside, (domain, values, rows)
        assert sum(counts.values()) - counts[other] == inside
    finally:
        session.close()


def _as_key(kind: str, text: str) -> Any:
    """The label as the engine returns a value of the key's type."""
    con = duckdb.connect()
    try:
        (value,) = con.execute(f"SELECT CAST({_literal(text)} AS {kind})").fetchone()  # type: ignore[misc]
    finally:
        con.close()
    return value


def _collated(tmp_path: Path) -> Session:
    database = tmp_path / "collated.duckdb"
    con = duckdb.connect(str(database))
    con.execute("CREATE TABLE visits (user_id BIGINT, region VARCHAR COLLATE NOCASE)")
    con.execute(
        "INSERT INTO visits SELECT u, ['EU', 'eu', 'Eu ', 'US', NULL][1 + u % 5] "
        "FROM range(100) t(u)"
    )
    con.close()
    return Session(
        load_policy(
            {
                "dataset": {"id": "collated"},
                "data": {"database": str(database)},
                "budget": {"diagnose": False, "epsilon": "10", "query_epsilon": "1"},
                "tables": {
                    "visits": {
                        "privacy_unit": "user_id",
                        "max_groups_per_unit": 1,
                        "max_rows_per_unit_per_group": 1,
                        "columns": {"region": {"public_values": ["eu", "US"]}},
                    }
                },
            }
        )
    )


def test_membership_follows_the_key_collation(tmp_path: Path) -> None:
    session = _collated(tmp_path)
    plan = session.plan(
        "SELECT region, COUNT(*) FROM visits GROUP BY region", None, other_group=True
    )
    _, rows = session.engine.run(plan.engine_sql)
    counts = {r[0]: int(r[1]) for r in rows}
    # 'EU' and 'eu' are the domain's 'eu' under NOCASE; 'Eu ' (a trailing space) and NULL
    # are other (NULL key).
    assert counts == {"eu": 40, "US": 20, None: 40}
    with pytest.raises(ParameterError, match=r"dpsql\.other_label equals a value"):
        session.plan(
            "SELECT region, COUNT(*) FROM visits GROUP BY region",
            None,
            other_group=True,
            other_label="EU",
        )
    session.close()


# -- NULL, labels, empty groups ---------------------------------------------------------------


def test_null_keys_are_other_unless_the_domain_lists_null(base: Session) -> None:
    # month(day) has the domain 1..12: a NULL day is month's other group (NULL key).
    sql = "SELECT month(day) AS m, COUNT(*) FROM visits GROUP BY m"
    plan = base.plan(sql, None, other_group=True, max_groups_per_unit=40)
    _, rows = base.engine.run(plan.engine_sql)
    counts = {r[0]: int(r[1]) for r in rows}
    assert set(counts) == {*range(1, 13), None}
    nulls = sum(1 for r in BASE if r[4] is None)
    assert counts[None] == nulls  # L0 = 13 groups and C = 3: 60 units, 6 rows each, no cap binds
    # A CASE with no ELSE lists NULL: its NULL group stays, and the other group needs a label.
    case = "SELECT CASE WHEN spend > 3 THEN 'a' WHEN spend > 1 THEN 'a ' END AS k, COUNT(*) "
    case += "FROM visits GROUP BY k"
    before = base.budget().queries
    with pytest.raises(ParameterError, match=r"lists NULL.*dpsql\.other_label"):
        base.execute(case, None, other_group=True)
    assert base.budget().queries == before
    plan = base.plan(case, None, other_group=True, other_label="other")
    _, rows = base.engine.run(plan.engine_sql)
    assert sorted(r[0] or "" for r in rows) == ["", "a", "a ", "other"]
    assert {r[0]: int(r[1]) for r in rows}["other"] == 0  # every row is a, 'a ' or NULL


@pytest.mark.parametrize(
    ("key", "label", "message"),
    [
        ("region", "north", "equals a value"),
        ("age", " 21", "equals a value"),  # the INTEGER 21
        ("age", "022", "equals a value"),
        ("spend", "-0", "equals a value"),  # the DOUBLE 0
        ("spend", "1e0", "equals a value"),
        ("month(day)", "12", "equals a value"),
        ("date_trunc('month', day)", "2026-02-01", "equals a value"),
        ("month(day)", "1.5", "equals a value"),  # the engine casts '1.5' to the BIGINT 2
        ("age", "other", "is not a value of the type"),
        ("month(day)", "x", "is not a value of the type"),
        ("date_trunc('month', day)", "2026-13-01", "is not a value of the type"),
    ],
)
def test_a_label_that_clashes_or_is_no_value_is_refused_naming_the_setting(
    base: Session, key: str, label: str, message: str
) -> None:
    before = base.budget().queries
    sql = f"SELECT {key} AS k, COUNT(*) FROM visits GROUP BY k"
    with pytest.raises(ParameterError, match=message) as caught:
        base.execute(sql, None, other_group=True, other_label=label)
    text = str(caught.value)
    assert "dpsql.other_label" in text
    assert f"'{label}'" not in text and f" {label} " not in text  # never the value
    assert base.budget().queries == before  # nothing charged


def test_the_other_group_is_released_even_when_empty(base: Session) -> None:
    # Every row of this CASE is in its domain {1}: its other group is empty, still released.
    sql = (
        "SELECT CASE WHEN age < 21 THEN 1 WHEN age < 22 THEN '1' ELSE '01' END AS k, "
        "COUNT(*) AS n FROM visits GROUP BY k"
    )
    result = base.execute(sql, None, other_group=True, other_label="-1")
    assert sorted(r[0] for r in result.rows) == [-1, 1]
    assert result.plan is not None
    _, rows = base.engine.run(result.plan.engine_sql)
    assert {r[0]: int(r[1]) for r in rows}[-1] == 0
    assert result.charge is not None and result.charge.delta == 0  # no partition selection


def test_a_private_key_beside_goes_through_partition_selection(base: Session) -> None:
    plan = base.plan(
        "SELECT region, upper(region) AS u, COUNT(*) FROM visits GROUP BY region, u",
        None,
        other_group=True,
    )
    assert plan.selection is not None
    assert "through partition selection" in "\n".join(plan.explain(sql=False))


# -- sizes, bounds, EXPLAIN -------------------------------------------------------------------


def test_the_public_size_grows_by_one_per_key(base: Session) -> None:
    sql = "SELECT region, month(day) AS m, COUNT(*) FROM visits GROUP BY region, m"
    plain = base.plan(sql, None, max_groups_per_unit=1000)
    other = base.plan(sql, None, max_groups_per_unit=1000, other_group=True)
    assert plain.max_groups == 3 * 12 and other.max_groups == 4 * 13
    # L0 >= the public size: the ranking is skipped, at the new size.
    assert any("L0 ranking: L0 = 52 >= 52 public key" in s for s in other.skipped)
    _, rows = base.engine.run(other.engine_sql)
    assert len(rows) == 4 * 13
    # L0 = 36 ranks with the other group (52 > 36) where it did not without it.
    assert not any("L0 ranking" in s for s in base.plan(sql, None, max_groups_per_unit=36,
                                                        other_group=True).skipped)  # fmt: skip
    assert any("L0 ranking" in s for s in base.plan(sql, None, max_groups_per_unit=36).skipped)
    # Sensitivities are those of L0 alone: unchanged by the other group at the same L0.
    same = base.plan(sql, None, max_groups_per_unit=2, other_group=True)
    assert [m.sensitivity for m in same.measurements] == [
        m.sensitivity for m in base.plan(sql, None, max_groups_per_unit=2).measurements
    ]
    assert same.epsilon == base.plan(sql, None, max_groups_per_unit=2).epsilon


def test_the_limit_on_public_groups_counts_the_other_groups(tmp_path: Path) -> None:
    path = tmp_path / "wide.parquet"
    write_parquet(path, [(1, 1, 1)], (("user_id", "BIGINT"), ("a", "INTEGER"), ("b", "INTEGER")))
    values = list(range(1000))
    policy = load_policy(
        {
            "dataset": {"id": "wide"},
            "data": {"tables": {"visits": str(path)}},
            "budget": {"diagnose": False, "epsilon": "10", "query_epsilon": "1"},
            "tables": {
                "visits": {
                    "privacy_unit": "user_id",
                    "max_groups_per_unit": 1,
                    "max_rows_per_unit_per_group": 1,
                    "columns": {"a": {"public_values": values}, "b": {"public_values": values}},
                }
            },
        },
        base_dir=tmp_path,
    )
    session = Session(policy)
    sql = "SELECT a, b, COUNT(*) FROM visits GROUP BY a, b"
    assert MAX_PUBLIC_GROUPS == 1000 * 1000
    session.plan(sql)  # exactly at the limit
    with pytest.raises(BoundsError, match="1002001 combinations"):
        session.plan(sql, None, other_group=True)
    session.close()


def test_explain_shows_the_other_group(base: Session) -> None:
    sql = "EXPLAIN VERBOSE SELECT region, COUNT(*) FROM visits GROUP BY region"
    result = base.execute(sql, None, other_group=True, other_label="elsewhere")
    text = "\n".join(r[0] for r in result.rows)
    assert "region (public domain of 3 value(s) + other group keyed 'elsewhere')" in text
    assert "other group: rows whose key is outside its domain" in text
    assert "always released, even when empty, with no delta" in text
    assert "LEFT JOIN _dom0 AS _j0" in text


def test_the_cache_tells_a_release_with_the_other_group_apart(base: Session) -> None:
    sql = "SELECT region, COUNT(*) FROM visits WHERE age = 20 GROUP BY region"
    first = base.execute(sql)
    other = base.execute(sql, None, other_group=True)
    assert other.cached_from is None and len(other.rows) == len(first.rows) + 1
    again = base.execute(sql, None, other_group=True)
    assert again.cached_from is not None and again.rows == other.rows
    labelled = base.execute(sql, None, other_group=True, other_label="zz")
    assert labelled.cached_from is None


def test_a_public_table_domain_is_refused(tmp_path: Path) -> None:
    path, zones = tmp_path / "v.parquet", tmp_path / "z.parquet"
    write_parquet(path, [(1, "a")], (("user_id", "BIGINT"), ("zone", "VARCHAR")))
    write_parquet(zones, [("a",), ("b",)], (("zone", "VARCHAR"),))
    policy = load_policy(
        {
            "dataset": {"id": "zones"},
            "data": {"tables": {"visits": str(path), "zones": str(zones)}},
            "budget": {"diagnose": False, "epsilon": "10", "query_epsilon": "1"},
            "tables": {
                "visits": {
                    "privacy_unit": "user_id",
                    "max_groups_per_unit": 1,
                    "max_rows_per_unit_per_group": 1,
                    "columns": {"zone": {"public_values_from": "zones.zone"}},
                },
                "zones": {"public": True},
            },
        },
        base_dir=tmp_path,
    )
    session = Session(policy)
    with pytest.raises(UnsupportedQueryError, match="held in a public table"):
        session.execute("SELECT zone, COUNT(*) FROM visits GROUP BY zone", None, other_group=True)
    assert session.budget().queries == 0
    session.close()


def test_the_settings_are_checked_and_shown(base: Session) -> None:
    with pytest.raises(ParameterError, match="other_group must be true or false"):
        base.execute("SET dpsql.other_group = maybe")
    with pytest.raises(ParameterError, match="other_label must be a string"):
        base.execute("SELECT COUNT(*) FROM visits", None, other_label=3)
    with pytest.raises(ParameterError, match="other_label must be a string"):
        base.execute("SET dpsql.other_label = '" + "x" * 300 + "'")
    assert base.execute("SHOW dpsql.other_label").rows == (("(none: NULL)",),)
    base.execute("SET dpsql.other_group = on")
    base.execute("SET dpsql.other_label = -1")
    try:
        assert base.execute("SHOW dpsql.other_group").rows == (("True",),)
        plan = base.plan("SELECT age, COUNT(*) FROM visits GROUP BY age")
        assert [k.other_text for k in plan.analysis.keys] == ["-1"]
        # An inline option wins over SET for its query.
        inline = base.plan(
            "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(other_group = false) age, COUNT(*) "
            "FROM visits GROUP BY age"
        )
        assert not inline.analysis.keys[0].other
    finally:
        base.execute("RESET dpsql.other_group")
        base.execute("RESET dpsql.other_label")
