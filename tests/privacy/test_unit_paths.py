"""Units through foreign keys (``unit_path``, ``dpsql.policy.paths``) on neighbouring data sets.

A hospital: ``patients`` (the unit), ``admissions`` hanging off patients, ``labs`` off admissions.
Hypothesis draws all three tables with duplicate keys (an admission id shared by two patients,
a lab reaching two admissions), dangling keys (an admission of no patient, a lab of no
admission) and NULL keys; then one patient and the neighbour without that patient's row. The
guarantee is stated over the resolved rows (docs/privacy.md): removing a patient's row removes
exactly the resolved rows that carry that patient, whatever else its admissions and labs reach.
For every generated query on labs or admissions, planned on both data sets and run with one
salt: neither run raises, both plans are the same (planning reads no data), and every total
moves by at most the plan's sensitivity (``test_neighbours._check``). A Python join of the
generated rows is the oracle of the resolved relation: its row count is what the bounded query
reads with bounds that cannot bind.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import LONG, write_parquet
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from spark_fixtures import SOCKET_WARNINGS, spark  # noqa: F401  (the session-scoped fixture)
from test_neighbours import _check

from dpsql import errors
from dpsql.engine.duckdb import engine as duckdb_engine
from dpsql.errors import PolicyError, SchemaError
from dpsql.policy import Policy, load_policy
from dpsql.release import contribution_bounds
from dpsql.session.session import Session

PATIENTS = (("patient_id", "BIGINT"), ("ward", "VARCHAR"))
ADMISSIONS = (("adm_id", "BIGINT"), ("patient_id", "BIGINT"), ("kind", "VARCHAR"))
LABS = (("lab_id", "BIGINT"), ("adm_id", "BIGINT"), ("value", "DOUBLE"), ("test", "VARCHAR"))
TESTS = ("hb", "na", "k")
KINDS = ("er", "planned")

Rows = list[tuple[Any, ...]]
BUDGET = {"diagnose": False, "epsilon": "10000", "delta": "0.5", "query_epsilon": "1",
          "query_delta": "0.000001"}  # fmt: skip


def _policy(folder: Path, data: dict[str, Rows], bounds: dict[str, Any] | None = None) -> Policy:
    files = {}
    for name, schema in (("patients", PATIENTS), ("admissions", ADMISSIONS), ("labs", LABS)):
        files[name] = str(folder / f"{name}.parquet")
        write_parquet(folder / f"{name}.parquet", data[name], schema)
    caps = bounds or {"max_groups_per_unit": 2, "max_rows_per_unit_per_group": 3}
    return load_policy(
        {
            "dataset": {"id": "hospital"},
            "data": {"tables": files},
            "budget": BUDGET,
            "tables": {
                "patients": {"privacy_unit": "patient_id", **caps},
                "admissions": {
                    "unit_path": ["patient_id -> patients.patient_id"],
                    "columns": {"kind": {"public_values": list(KINDS)}},
                    **caps,
                },
                "labs": {
                    "unit_path": [
                        "adm_id -> admissions.adm_id",
                        "patient_id -> patients.patient_id",
                    ],
                    "columns": {
                        "value": {"lower": 0, "upper": 20},
                        "test": {"public_values": list(TESTS)},
                    },
                    **caps,
                },
            },
        },
        base_dir=folder,
    )


# Keys from small ranges, so that duplicates and dangling keys are common.
_ID = st.one_of(st.integers(0, 6), st.none())


@st.composite
def hospital(draw: st.DrawFn) -> tuple[dict[str, Rows], int]:
    """Three tables (duplicate, dangling and NULL keys included) and the patient to remove."""
    patients = draw(st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["n", "s"])),
                             min_size=1, max_size=6))  # fmt: skip
    admissions = draw(
        st.lists(st.tuples(_ID, _ID, st.sampled_from([*KINDS, "other", None])), max_size=10)
    )
    labs = draw(
        st.lists(
            st.tuples(
                st.integers(0, 99),
                _ID,
                st.sampled_from([0.0, 5.5, 19.0, 25.0, -3.0, None, float("nan")]),
                st.sampled_from([*TESTS, "zz", None]),
            ),
            max_size=25,
        )
    )
    # Some rows repeated, as a heavy patient's would be.
    labs += draw(st.lists(st.sampled_from(labs), max_size=20)) if labs else []
    removed = draw(st.sampled_from([p for p, _ in patients]))
    # The removed patient is often heavy: admissions (their ids may be another patient's too)
    # and many labs, distinct or repeated.
    stays = draw(st.lists(st.integers(0, 6), max_size=3))
    admissions += [(a, removed, draw(st.sampled_from(KINDS))) for a in stays]
    if stays and draw(st.booleans()):
        # One of those admission ids listed for another patient too.
        other = draw(st.sampled_from([p for p, _ in patients]))
        admissions.append((draw(st.sampled_from(stays)), other, "er"))
    if stays:
        many = draw(st.integers(0, 30))
        labs += [(100 + i, draw(st.sampled_from(stays)), float(i % 21), TESTS[i % 3])
                 for i in range(many)]  # fmt: skip
    return {"patients": patients, "admissions": admissions, "labs": labs}, removed


def resolved(data: dict[str, Rows], table: str) -> Counter[Any]:
    """The oracle: each resolved row's unit, counted (inner join semantics, NULL never equal)."""
    units = [p for p, _ in data["patients"]]
    adm_units: list[tuple[Any, Any]] = [
        (a, u) for a, p, _ in data["admissions"] for u in units if p is not None and p == u
    ]
    if table == "admissions":
        return Counter(u for _, u in adm_units)
    return Counter(
        u for _, a, _, _ in data["labs"] for b, u in adm_units if a is not None and a == b
    )


QUERIES = (
    "SELECT COUNT(*) FROM labs",
    "SELECT SUM(value) FROM labs",
    "SELECT AVG(value) FROM labs WHERE test <> 'k'",
    "SELECT test, COUNT(*), SUM(value) FROM labs GROUP BY test",
    "SELECT COUNT(DISTINCT adm_id) FROM labs",
    "SELECT kind, COUNT(*) FROM admissions GROUP BY kind",
    "SELECT COUNT(*) FROM (SELECT * FROM labs WHERE value > 1)",
    "SELECT COUNT(*) FROM labs TABLESAMPLE BERNOULLI (50 PERCENT)",
    # Joins along the declared keys (dpsql adds the equality of the two sides' units).
    "SELECT COUNT(*) FROM labs JOIN admissions ON labs.adm_id = admissions.adm_id",
    "SELECT kind, SUM(value) FROM labs l JOIN admissions a ON a.adm_id = l.adm_id GROUP BY kind",
    "SELECT COUNT(*) FROM admissions a JOIN patients p ON a.patient_id = p.patient_id",
    # Along each path's first link the child takes the parent row's unit (path_joins): a
    # chain of two, a SEMI join, and a taken unit compared again with a later parent's.
    "SELECT ward, SUM(value) FROM labs l JOIN admissions a ON l.adm_id = a.adm_id "
    "JOIN patients p ON a.patient_id = p.patient_id GROUP BY ward",
    "SELECT kind, COUNT(*) FROM admissions a SEMI JOIN labs l ON l.adm_id = a.adm_id GROUP BY kind",
    "SELECT COUNT(*) FROM labs l JOIN admissions a ON l.adm_id = a.adm_id "
    "JOIN admissions a2 ON l.adm_id = a2.adm_id",
    "SELECT test, COUNT(*) FROM labs l LEFT JOIN admissions a ON l.adm_id = a.adm_id "
    "WHERE a.kind = 'er' GROUP BY test",
    # Outer joins of two private relations along the key: each row carries its side's unit.
    "SELECT COUNT(*), SUM(value) FROM labs l RIGHT JOIN admissions a ON l.adm_id = a.adm_id",
    "SELECT kind, COUNT(*) FROM labs l FULL JOIN admissions a ON l.adm_id = a.adm_id GROUP BY kind",
    "SELECT COUNT(*) FROM patients p FULL JOIN admissions a ON p.patient_id = a.patient_id",
    # UNION ALL of the two tables' resolved rows (one unit domain: patients).
    "SELECT COUNT(*) FROM (SELECT adm_id FROM labs UNION ALL SELECT adm_id FROM admissions)",
    "SELECT k, COUNT(*) FROM (SELECT test AS k FROM labs UNION ALL SELECT kind FROM admissions "
    "UNION ALL SELECT ward FROM patients) GROUP BY k",
)


@settings(
    max_examples=300 if LONG else 40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=hospital(), sql=st.sampled_from(QUERIES))
def test_removing_a_patient_moves_every_total_within_the_plan_sensitivity(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    case: tuple[dict[str, Rows], int],
    sql: str,
) -> None:
    # One sample secret for both runs (drawn afresh per run otherwise: dpsql.analyze.sample).
    monkeypatch.setattr(
        duckdb_engine.secrets, "token_hex", lambda n: "00112233445566778899aabbccddeeff"
    )
    data, removed = case
    without = {**data, "patients": [p for p in data["patients"] if p[0] != removed]}
    sessions = [Session(_policy(tmp_path_factory.mktemp("d"), d)) for d in (data, without)]
    try:
        sessions[1].engine.salt = sessions[0].engine.salt
        plan = sessions[0].plan(sql)
        assert sessions[1].plan(sql).engine_sql == plan.engine_sql  # planning reads no data
        _, before = sessions[0].engine.run(plan.engine_sql)
        _, after = sessions[1].engine.run(plan.engine_sql)
    finally:
        for s in sessions:
            s.close()
    event("sampled" if plan.sample is not None else "checked")
    _check(plan, before, after)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=hospital())
def test_the_resolved_rows_are_the_join_along_the_path(
    tmp_path_factory: pytest.TempPathFactory, case: tuple[dict[str, Rows], int]
) -> None:
    """With bounds that cannot bind, COUNT(*)'s exact total is the oracle's number of resolved
    rows: one per patient row each lab reaches through each admission, none for a NULL or
    dangling key."""
    data, _ = case
    loose = {"max_groups_per_unit": 10, "max_rows_per_unit_per_group": 10**6}
    s = Session(_policy(tmp_path_factory.mktemp("r"), data, loose))
    try:
        for table in ("labs", "admissions"):
            plan = s.plan(f"SELECT COUNT(*) FROM {table}")
            (row,) = s.engine.run(plan.engine_sql)[1]
            truth = resolved(data, table)
            assert (row[0] or 0) == sum(truth.values()), table  # NULL: no rows
            # Rows per resolved unit, as ESTIMATE BOUNDS reads them: the units are the oracle's.
            sql = contribution_bounds.bounds_query(s.policy, s.engine.catalog, table, [])
            per_unit = {int(v): int(n) for _, v, n in s.engine.run(sql)[1]}
            assert per_unit == Counter(truth.values()), table
        # A join along the lab's first link pairs it with each resolved admission row of its
        # id, whose unit the joined row takes (dpsql.analyze.path_joins): per patient u and
        # lab, the resolved admission rows of its id for u, as SQL over the tables pairs them.
        plan = s.plan("SELECT COUNT(*) FROM labs l JOIN admissions a ON l.adm_id = a.adm_id")
        (row,) = s.engine.run(plan.engine_sql)[1]
        units = Counter(p for p, _ in data["patients"])  # a patient's row may be listed twice
        rows = Counter()
        for a, p, _ in data["admissions"]:
            if a is not None and p in units:
                rows[(a, p)] += units[p]
        paired = sum(n for _, a, _, _ in data["labs"] for (b, _), n in rows.items() if a == b)
        assert (row[0] or 0) == paired
    finally:
        s.close()


def _data() -> dict[str, Rows]:
    return {
        "patients": [(1, "n"), (2, "s")],
        "admissions": [(10, 1, "er"), (10, 2, "er"), (11, 3, "planned")],
        "labs": [(1, 10, 5.0, "hb"), (2, 11, 1.0, "na"), (3, None, 2.0, "k")],
    }


def test_a_lab_reaching_two_patients_is_a_row_of_each(tmp_path: Path) -> None:
    """Admission 10 is listed for patients 1 and 2: its lab is one resolved row of each, and
    the lab of admission 11 (patient 3 is no patient) and the one with no admission resolve to
    none. Both spellings of a path (strings, tables) load alike."""
    assert resolved(_data(), "labs") == Counter({1: 1, 2: 1})
    s = Session(
        _policy(tmp_path, _data(), {"max_groups_per_unit": 3, "max_rows_per_unit_per_group": 9})
    )
    try:
        plan = s.plan("SELECT COUNT(*) FROM labs")
        assert s.engine.run(plan.engine_sql)[1] == [(2,)]
        head = "\n".join(plan.head())
        assert "through adm_id -> admissions.adm_id, then patient_id -> patients.patient_id" in head
    finally:
        s.close()


@pytest.mark.parametrize(
    ("path", "message"),
    [
        (["adm_id -> nowhere.adm_id"], "nowhere, which the policy lacks"),
        (["adm_id -> admissions.adm_id"], "must end at a table with a privacy_unit"),
        (["adm_id admissions.adm_id"], "column -> table.key"),
        (["adm_id -> labs.adm_id", "patient_id -> patients.patient_id"], "leads back"),
    ],
)
def test_a_bad_path_is_refused_when_the_policy_loads(
    tmp_path: Path, path: Sequence[str], message: str
) -> None:
    policy = _policy(tmp_path, _data())
    raw = policy.model_dump(mode="json")
    raw["tables"]["labs"]["unit_path"] = list(path)
    with pytest.raises(PolicyError, match=message):
        load_policy(raw, base_dir=tmp_path)


def test_keys_of_two_types_are_refused_before_anything_runs(tmp_path: Path) -> None:
    """A VARCHAR key against a BIGINT one would make the engine cast values, which can fail on
    one value: refused on the schema, naming the path, and nothing is charged."""
    data = _data()
    policy = _policy(tmp_path, data)
    write_parquet(
        tmp_path / "labs.parquet",
        [(1, "10", 5.0, "hb")],
        (("lab_id", "BIGINT"), ("adm_id", "VARCHAR"), ("value", "DOUBLE"), ("test", "VARCHAR")),
    )
    s = Session(policy)
    try:
        with pytest.raises(SchemaError, match=r"labs\.adm_id \(VARCHAR\) with admissions\.adm_id"):
            s.execute("SELECT COUNT(*) FROM labs")
        assert s.budget().epsilon_spent == 0
    finally:
        s.close()


def test_a_path_s_estimate_reads_the_resolved_units(tmp_path: Path) -> None:
    """ESTIMATE BOUNDS over a table with a unit path counts its resolved units (here two
    patients with one lab each): the estimate runs on the join, never on a missing column."""
    s = Session(_policy(tmp_path, _data()))
    try:
        result = s.execute("ESTIMATE BOUNDS FOR labs GROUP BY test")
        assert result.charge is not None
        assert {r[1] for r in result.rows} == {"max_groups_per_unit", "max_rows_per_unit_per_group"}
    finally:
        s.close()


@pytest.mark.spark
@SOCKET_WARNINGS[0]
@SOCKET_WARNINGS[1]
def test_a_path_table_bounds_alike_on_spark(tmp_path: Path, spark: Any) -> None:  # noqa: F811
    """The resolution's joins and everything bounded over them: the same bounded query and
    exact totals on Spark as on DuckDB (bounds that cannot bind: the engines' keyed hashes
    differ), duplicate, dangling and NULL keys included."""
    data = {
        "patients": [(p, "n") for p in range(6)],
        "admissions": [(a % 9, a % 7, KINDS[a % 2]) for a in range(30)] + [(None, 1, "er")],
        "labs": [
            (i, (i % 11) if i % 13 else None, float(i % 23), TESTS[i % 3]) for i in range(300)
        ],
    }
    loose = {"max_groups_per_unit": 10, "max_rows_per_unit_per_group": 10**6}
    policy = _policy(tmp_path, data, loose)
    on_spark = policy.model_copy(
        update={"engine": policy.engine.model_copy(update={"name": "spark", "master": "local[2]"})}
    )
    duck, sparky = Session(policy), Session(on_spark)
    distinct = [
        f"SELECT COUNT(*) FROM (SELECT patient_id, ward FROM patients {op} SELECT patient_id, "
        "ward FROM patients WHERE patient_id > 2)"
        for op in ("UNION", "INTERSECT", "EXCEPT")
    ]
    try:
        for sql in [*QUERIES, *distinct]:
            if "TABLESAMPLE" in sql:
                continue
            plan = duck.plan(sql)
            assert sparky.plan(sql).engine_sql == plan.engine_sql
            expected = sorted(map(repr, duck.engine.run(plan.engine_sql)[1]))
            assert sorted(map(repr, sparky.engine.run(plan.engine_sql)[1])) == expected, sql
    finally:
        duck.close()
        sparky.close()


def _refused_free(tmp_path: Path, sql: str, named: str) -> None:
    """``sql`` is refused with a message naming ``named``, and nothing is charged."""
    s = Session(_policy(tmp_path, _data()))
    try:
        with pytest.raises(errors.UnsupportedQueryError, match=named) as refused:
            s.execute(sql)
        assert "_dpsql" not in str(refused.value)  # dpsql's own names stay hidden
        assert s.budget().epsilon_spent == 0
    finally:
        s.close()


@pytest.mark.parametrize(
    ("sql", "named"),
    [
        ("SELECT COUNT(*) FROM labs l JOIN admissions a ON l.lab_id = a.adm_id", "foreign key"),
        ("SELECT COUNT(*) FROM labs l1 JOIN labs l2 ON l1.test = l2.test", "foreign key"),
        ("SELECT COUNT(*) FROM labs l JOIN patients p ON l.adm_id = p.patient_id", "foreign key"),
        ("SELECT COUNT(*) FROM admissions a RIGHT JOIN labs l ON l.lab_id = a.adm_id",
         "foreign key"),
        ("SELECT COUNT(*) FROM labs l JOIN admissions a ON l.adm_id = a.adm_id RIGHT JOIN "
         "patients p ON a.patient_id = p.patient_id", "RIGHT JOIN keeps rows"),
        # A per-unit subquery cannot group by a unit resolved along the path (TPC-H Q15).
        ("SELECT COUNT(*) FROM (SELECT test, COUNT(*) AS n FROM labs GROUP BY test) AS t",
         "reached through its unit_path"),
    ],
)  # fmt: skip
def test_a_join_of_private_tables_off_the_declared_keys_is_refused(
    tmp_path: Path, sql: str, named: str
) -> None:
    """Only a join along a declared key (or on equal units) pairs rows of one unit; anything
    else between private tables is refused with the reason, before anything is charged."""
    _refused_free(tmp_path, sql, named)


def test_a_join_along_the_key_pairs_rows_of_one_patient(tmp_path: Path) -> None:
    """Admission 10 is listed for patients 1 and 2; its lab resolves to both. Joined along the
    key, each of the lab's rows meets its own patient's admission only: two rows, not four."""
    s = Session(
        _policy(tmp_path, _data(), {"max_groups_per_unit": 3, "max_rows_per_unit_per_group": 9})
    )
    try:
        plan = s.plan("SELECT COUNT(*) FROM labs l JOIN admissions a ON l.adm_id = a.adm_id")
        assert s.engine.run(plan.engine_sql)[1] == [(2,)]
    finally:
        s.close()


@pytest.mark.parametrize(
    ("sql", "named"),
    [
        ("SELECT COUNT(*) FROM (SELECT adm_id FROM labs UNION SELECT adm_id FROM admissions)",
         "UNION compares whole rows"),
        ("SELECT COUNT(*) FROM (SELECT patient_id FROM patients EXCEPT SELECT adm_id FROM labs)",
         "EXCEPT compares whole rows"),
        ("SELECT COUNT(*) FROM (SELECT test FROM labs UNION ALL SELECT adm_id FROM admissions)",
         "types BIGINT, VARCHAR"),
        ("SELECT COUNT(*) FROM (SELECT adm_id, test FROM labs UNION ALL SELECT adm_id FROM "
         "admissions)", "differ in columns"),
        ("SELECT COUNT(*) FROM (SELECT adm_id FROM labs UNION ALL SELECT adm_id FROM admissions "
         "LIMIT 5)", "LIMIT on a UNION ALL"),
        ("SELECT COUNT(*) FROM labs WHERE adm_id IN (SELECT adm_id FROM admissions UNION ALL "
         "SELECT adm_id FROM labs)", "only as a FROM-subquery or a CTE"),
    ],
)  # fmt: skip
def test_a_set_operation_that_could_mix_units_is_refused(
    tmp_path: Path, sql: str, named: str
) -> None:
    _refused_free(tmp_path, sql, named)


def test_a_path_column_the_data_lacks_is_refused_at_connect(tmp_path: Path) -> None:
    """A link naming a column the table does not have: the connection is refused, naming the
    field, before any query."""
    policy = _policy(tmp_path, _data())
    raw = policy.model_dump(mode="json")
    raw["tables"]["labs"]["unit_path"] = [
        "adm -> admissions.adm_id",
        "patient_id -> patients.patient_id",
    ]
    with pytest.raises(
        PolicyError, match=r"tables\.labs\.unit_path: the table labs has no column adm"
    ):
        Session(load_policy(raw, base_dir=tmp_path))
