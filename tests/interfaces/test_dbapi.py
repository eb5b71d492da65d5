"""The PEP 249 (DB-API 2.0) surface: module globals, exceptions, connections and cursors."""

from __future__ import annotations

import datetime as dt
import importlib
import inspect
from fractions import Fraction
from pathlib import Path
from typing import Any

import duckdb
import pytest

import dpsql as dbapi
from dpsql import errors
from dpsql.policy import Policy, load_policy

REGIONS = ["east", "north", "south", "west"]


def policy_dict(data: Path) -> dict[str, Any]:
    return {
        "dataset": {"id": "dbapi", "data_version": "1"},
        "data": {"tables": {"visits": str(data)}},
        "budget": {
            "diagnose": False,
            "epsilon": "10",
            "delta": "1e-6",
            "query_epsilon": "1",
            "query_delta": "1e-8",
        },
        "tables": {
            "visits": {
                "privacy_unit": "user_id",
                "max_groups_per_unit": 2,
                "max_rows_per_unit_per_group": 4,
                "columns": {
                    "age": {"lower": 18, "upper": 90},
                    "spend": {"lower": 0, "upper": 200},
                    "region": {"public_values": REGIONS},
                },
            }
        },
    }


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("dbapi") / "visits.parquet"
    con = duckdb.connect()
    con.execute(
        f"""COPY (SELECT (i % 300)::BIGINT AS user_id, {REGIONS}[1 + i % 4] AS region,
            (18 + i % 70)::INTEGER AS age, (i % 150)::DOUBLE AS spend,
            DATE '2026-01-01' + (i % 28)::INTEGER AS day
            FROM range(1200) r(i)) TO '{path}' (FORMAT parquet)"""
    )
    con.close()
    return path


@pytest.fixture
def policy(data: Path) -> Policy:
    return load_policy(policy_dict(data), base_dir=data.parent)


@pytest.fixture
def conn(policy: Policy) -> Any:
    connection = dbapi.connect(policy)
    yield connection
    connection.close()


def spent(connection: dbapi.Connection) -> Fraction:
    return connection.budget().epsilon_spent


# -- module ----------------------------------------------------------------------------------


def test_module_globals() -> None:
    assert dbapi.apilevel == "2.0"
    assert dbapi.threadsafety in (0, 1, 2, 3)
    assert dbapi.paramstyle == "qmark"


def test_package_reexports_the_dbapi() -> None:
    # If this fails with a missing attribute while dpsql/__init__.py defines it, the editable
    # install is stale (it predates dpsql/__init__.py): reinstall with `pip install -e .`.
    package = importlib.import_module("dpsql")
    for name in ("connect", "apilevel", "paramstyle", "threadsafety", "Error", "Warning"):
        assert getattr(package, name) is getattr(dbapi, name), name
    for name in ("BudgetExceededError", "ProgrammingError", "NotSupportedError"):
        assert getattr(package, name) is getattr(dbapi, name), name


def test_exception_hierarchy() -> None:
    assert issubclass(dbapi.Warning, Exception)
    assert issubclass(dbapi.Error, Exception)
    assert not issubclass(dbapi.Warning, dbapi.Error)
    assert issubclass(dbapi.InterfaceError, dbapi.Error)
    assert issubclass(dbapi.DatabaseError, dbapi.Error)
    for name in (
        "DataError",
        "OperationalError",
        "IntegrityError",
        "InternalError",
        "ProgrammingError",
        "NotSupportedError",
    ):
        assert issubclass(getattr(dbapi, name), dbapi.DatabaseError), name
    pairs = [
        (dbapi.BudgetExceededError, dbapi.OperationalError, errors.BudgetExceededError),
        (dbapi.EngineFailure, dbapi.OperationalError, errors.EngineError),
        (dbapi.EntropyFailure, dbapi.OperationalError, errors.EntropyError),
        (dbapi.LedgerFailure, dbapi.OperationalError, errors.LedgerError),
        (dbapi.QuerySyntaxError, dbapi.ProgrammingError, errors.ParseError),
        (dbapi.UnknownObjectError, dbapi.ProgrammingError, errors.SchemaError),
        (dbapi.MissingBoundsError, dbapi.ProgrammingError, errors.BoundsError),
        (dbapi.InvalidParameterError, dbapi.ProgrammingError, errors.ParameterError),
        (dbapi.UnsupportedQuery, dbapi.NotSupportedError, errors.UnsupportedQueryError),
        (dbapi.DpsqlInternalError, dbapi.InternalError, errors.InternalError),
        (dbapi.PolicyFailure, dbapi.InterfaceError, errors.PolicyError),
    ]
    for cls, pep, tree in pairs:
        assert issubclass(cls, pep), cls
        assert issubclass(cls, tree), cls
        assert issubclass(cls, errors.DpsqlError), cls


def test_exceptions_are_attributes_of_the_connection_module() -> None:
    # PEP 249 optional extension: names reachable from the module; check no name is missing.
    for name in (
        "Warning",
        "Error",
        "InterfaceError",
        "DatabaseError",
        "DataError",
        "OperationalError",
        "IntegrityError",
        "InternalError",
        "ProgrammingError",
        "NotSupportedError",
    ):
        assert isinstance(getattr(dbapi, name), type)


# -- connect -----------------------------------------------------------------------------------


def test_connect_with_a_policy_a_dict_and_a_path(
    policy: Policy, data: Path, tmp_path: Path
) -> None:
    toml = tmp_path / "policy.toml"
    toml.write_text(
        f"""
[dataset]
id = "dbapi"
[data]
tables = {{ visits = "{data.as_posix()}" }}
[budget]
diagnose = false
epsilon = 10
query_epsilon = 1
[tables.visits]
privacy_unit = "user_id"
max_groups_per_unit = 1
max_rows_per_unit_per_group = 4
""",
        encoding="utf-8",
    )
    for source in (policy, policy_dict(data), toml, str(toml)):
        with dbapi.connect(source, analyst="alice") as connection:
            cursor = connection.cursor()
            cursor.execute("SELECT COUNT(*) FROM visits")
            assert len(cursor.fetchall()) == 1
            assert connection.session.analyst == "alice"


def test_connect_with_an_invalid_policy_is_a_policy_failure(data: Path) -> None:
    raw = policy_dict(data)
    raw["budget"]["epsilon"] = "-1"
    with pytest.raises(dbapi.PolicyFailure):
        dbapi.connect(raw)
    with pytest.raises(dbapi.InterfaceError):
        dbapi.connect(raw)


# -- cursor ------------------------------------------------------------------------------------


def test_cursor_before_execute(conn: dbapi.Connection) -> None:
    cursor = conn.cursor()
    assert cursor.rowcount == -1
    assert cursor.description is None
    assert cursor.arraysize == 1
    assert cursor.accuracy == ()
    for fetch in (cursor.fetchone, cursor.fetchall, cursor.fetchmany):
        with pytest.raises(dbapi.ProgrammingError):
            fetch()


def test_description_and_rowcount_after_execute(conn: dbapi.Connection) -> None:
    cursor = conn.cursor()
    returned = cursor.execute(
        "SELECT region, COUNT(*) AS n, SUM(spend) AS s, AVG(age) FROM visits GROUP BY region"
    )
    assert returned is cursor
    description = cursor.description
    assert description is not None
    assert [d[0] for d in description] == ["region", "n", "s", "avg"]
    for d in description:
        assert len(d) == 7
        assert d[2:] == (None, None, None, None, None)
    assert description[0][1] == dbapi.STRING
    assert description[1][1] == dbapi.NUMBER
    assert description[2][1] == dbapi.NUMBER
    assert description[3][1] == dbapi.NUMBER
    assert cursor.rowcount == len(REGIONS)
    rows = cursor.fetchall()
    assert [r[0] for r in rows] == REGIONS  # public keys, all released, sorted by key
    assert all(isinstance(r[1], int) for r in rows)
    assert all(18 <= r[3] <= 90 for r in rows)


def test_fetchone_fetchmany_fetchall_iteration(conn: dbapi.Connection) -> None:
    cursor = conn.cursor()
    query = "SELECT region, COUNT(*) FROM visits GROUP BY region"
    cursor.execute(query)
    first = cursor.fetchone()
    assert first is not None and first[0] == "east"
    assert cursor.fetchmany() == [cursor.result.rows[1]]  # arraysize 1
    cursor.arraysize = 5
    rest = cursor.fetchmany()
    assert [r[0] for r in rest] == ["south", "west"]
    assert cursor.fetchone() is None
    assert cursor.fetchmany(3) == []
    assert cursor.fetchall() == []

    cursor.execute(query)
    assert [r[0] for r in cursor.fetchmany(2)] == ["east", "north"]
    assert [r[0] for r in cursor.fetchall()] == ["south", "west"]

    cursor.execute(query)
    assert [row[0] for row in cursor] == REGIONS


def test_executemany_charges_each_parameter_set(conn: dbapi.Connection) -> None:
    cursor = conn.cursor()
    before = spent(conn)
    cursor.executemany(
        "SELECT COUNT(*) FROM visits WHERE region = ?", [("east",), ("west",), ("north",)]
    )
    assert spent(conn) - before == 3  # query_epsilon 1, three queries
    assert len(cursor.fetchall()) == 1  # the last result


def test_closed_cursor_raises_interface_error(conn: dbapi.Connection) -> None:
    cursor = conn.cursor()
    cursor.execute("SELECT COUNT(*) FROM visits")
    cursor.close()
    before = spent(conn)
    with pytest.raises(dbapi.InterfaceError):
        cursor.execute("SELECT COUNT(*) FROM visits")
    with pytest.raises(dbapi.InterfaceError):
        cursor.fetchone()
    with pytest.raises(dbapi.InterfaceError):
        cursor.fetchall()
    assert spent(conn) == before


def test_cursor_context_manager(conn: dbapi.Connection) -> None:
    with conn.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM visits")
    with pytest.raises(dbapi.InterfaceError):
        cursor.fetchall()


def test_connection_close_and_context_manager(policy: Policy) -> None:
    with dbapi.connect(policy) as connection:
        cursor = connection.cursor()
        connection.commit()  # a no-op
        cursor.execute("SELECT COUNT(*) FROM visits")
    with pytest.raises(dbapi.InterfaceError):
        cursor.execute("SELECT COUNT(*) FROM visits")
    with pytest.raises(dbapi.InterfaceError):
        cursor.fetchall()
    with pytest.raises(dbapi.InterfaceError):
        connection.cursor().execute("SELECT COUNT(*) FROM visits")
    with pytest.raises(dbapi.InterfaceError):
        connection.commit()
    connection.close()  # closing twice is harmless


def test_commit_is_a_noop_and_rollback_is_refused(conn: dbapi.Connection) -> None:
    conn.cursor().execute("SELECT COUNT(*) FROM visits")
    charged = spent(conn)
    assert conn.commit() is None
    with pytest.raises(dbapi.NotSupportedError):
        conn.rollback()
    assert spent(conn) == charged  # a charge is never undone


# -- parameters --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("where", "value"),
    [
        ("age > ?", 30),
        ("spend < ?", 99.5),
        ("region = ?", "east"),
        ("day >= ?", dt.date(2026, 1, 10)),
        ("COALESCE(?, region) = region", None),
        ("(age > 30) = ?", True),
    ],
)
def test_parameters_are_bound(conn: dbapi.Connection, where: str, value: object) -> None:
    cursor = conn.cursor()
    cursor.execute(f"SELECT COUNT(*) FROM visits WHERE {where}", (value,))
    assert len(cursor.fetchall()) == 1
    bounded = cursor.result.plan.bounded_sql
    assert "?" not in bounded


def test_parameters_are_bound_in_order(conn: dbapi.Connection) -> None:
    plan = conn.session.plan(
        "SELECT COUNT(*) FROM visits WHERE age > ? AND region = ? AND spend < ?", [41, "west", 7.5]
    )
    sql = plan.bounded_sql
    assert sql.index("41") < sql.index("'west'") < sql.index("7.5")


@pytest.mark.parametrize("params", [(), (1, 2), ["a", "b", "c"]])
def test_wrong_parameter_count_is_a_programming_error(
    conn: dbapi.Connection, params: tuple[object, ...]
) -> None:
    before = spent(conn)
    with pytest.raises(dbapi.ProgrammingError) as info:
        conn.cursor().execute("SELECT COUNT(*) FROM visits WHERE age > ?", params)
    assert isinstance(info.value, dbapi.InvalidParameterError)
    assert spent(conn) == before


@pytest.mark.parametrize("params", ["ab", 5, {"a": 1}, (object(),), (float("nan"),)])
def test_bad_parameters_are_programming_errors(conn: dbapi.Connection, params: Any) -> None:
    before = spent(conn)
    with pytest.raises(dbapi.ProgrammingError):
        conn.cursor().execute("SELECT COUNT(*) FROM visits WHERE region = ?", params)
    assert spent(conn) == before


def test_parameters_on_a_query_without_markers(conn: dbapi.Connection) -> None:
    with pytest.raises(dbapi.ProgrammingError):
        conn.cursor().execute("SELECT COUNT(*) FROM visits", (1,))


# -- per-query options, SET, SHOW, EXPLAIN -----------------------------------------------------


def test_execute_options_charge_exactly(conn: dbapi.Connection) -> None:
    cursor = conn.cursor()
    cursor.execute("SELECT COUNT(*), SUM(spend) FROM visits", epsilon=0.25)
    assert spent(conn) == Fraction(1, 4)
    assert cursor.result.charge.epsilon == Fraction(1, 4)
    # Another filter: the count above would answer the same rows at any epsilon, free.
    cursor.execute("SELECT COUNT(*) FROM visits WHERE age > 30", epsilon="0.1")
    assert spent(conn) == Fraction(1, 4) + Fraction(1, 10)
    with pytest.raises(dbapi.ProgrammingError):
        cursor.execute("SELECT COUNT(*) FROM visits", seed=1)
    with pytest.raises(dbapi.InvalidParameterError):
        cursor.execute("SELECT COUNT(*) FROM visits", epsilon=0)
    assert spent(conn) == Fraction(7, 20)


def test_set_epsilon_then_query_charges_exactly(conn: dbapi.Connection) -> None:
    cursor = conn.cursor()
    cursor.execute("SET dpsql.epsilon = 0.2")
    assert cursor.description is None
    assert cursor.rowcount == -1
    assert spent(conn) == 0
    cursor.execute("SELECT AVG(age) FROM visits")
    assert spent(conn) == Fraction(1, 5)
    cursor.execute("SHOW dpsql.epsilon")
    assert cursor.description is not None and cursor.description[0][0] == "epsilon"
    assert cursor.fetchall() == [("0.2",)]
    # A per-query option wins over the session setting; RESET restores the policy default.
    cursor.execute("SELECT COUNT(*) FROM visits", epsilon=0.5)
    assert spent(conn) == Fraction(7, 10)
    cursor.execute("RESET dpsql.epsilon")
    # Fresh: at another epsilon the count above would answer the same rows, free.
    cursor.execute("SELECT COUNT(*) FROM visits", fresh=True)
    assert spent(conn) == Fraction(17, 10)
    conn.set("epsilon", "0.125")
    cursor.execute("SELECT COUNT(*) FROM visits", fresh=True)
    assert spent(conn) == Fraction(17, 10) + Fraction(1, 8)


def test_show_all_and_budget(conn: dbapi.Connection) -> None:
    cursor = conn.cursor()
    cursor.execute("SHOW dpsql.all")
    names = [r[0] for r in cursor.fetchall()]
    assert "epsilon" in names and "delta" in names
    cursor.execute("SHOW dpsql.budget")
    assert "epsilon 0 spent of 10" in cursor.fetchone()[0]


def test_explain_returns_rows_and_charges_nothing(conn: dbapi.Connection) -> None:
    cursor = conn.cursor()
    cursor.execute("EXPLAIN SELECT region, SUM(spend) FROM visits GROUP BY region")
    assert cursor.description is not None and cursor.description[0][0] == "plan"
    lines = [r[0] for r in cursor.fetchall()]
    assert lines and all(isinstance(line, str) for line in lines)
    assert any("visits" in line for line in lines)
    assert spent(conn) == 0
    assert conn.budget().queries == 0


def test_accuracy_and_confidence_align_with_rows(conn: dbapi.Connection) -> None:
    cursor = conn.cursor()
    cursor.execute(
        "SELECT region, COUNT(*), SUM(spend), AVG(age), COUNT(*) + 1 FROM visits GROUP BY region"
    )
    rows = cursor.fetchall()
    accuracy = cursor.accuracy
    assert cursor.confidence == 0.95
    assert len(accuracy) == len(rows)
    for row, widths in zip(rows, accuracy, strict=True):
        assert len(widths) == len(row)
        assert widths[0] is None  # a released public key carries no noise
        assert all(w is not None and w > 0 for w in widths[1:4])
        assert widths[4] is None  # an expression over noisy values: no interval given
    cursor.execute("SELECT COUNT(*) FROM visits", confidence=0.5)
    narrow = cursor.accuracy[0][0]
    cursor.execute("SELECT COUNT(*) FROM visits", confidence=0.99)
    assert cursor.confidence == 0.99
    assert cursor.accuracy[0][0] > narrow


def test_budget_exceeded_is_an_operational_error(data: Path) -> None:
    raw = policy_dict(data)
    raw["budget"]["epsilon"] = "1.5"
    with dbapi.connect(raw) as connection:
        cursor = connection.cursor()
        cursor.execute("SELECT COUNT(*) FROM visits")
        with pytest.raises(dbapi.BudgetExceededError) as info:
            cursor.execute("SELECT COUNT(*) FROM visits", fresh=True)
        assert isinstance(info.value, dbapi.OperationalError)
        assert isinstance(info.value, errors.BudgetExceededError)
        assert spent(connection) == 1
        cursor.execute("SELECT COUNT(*) FROM visits", epsilon=0.5, fresh=True)
        assert spent(connection) == Fraction(3, 2)


def test_syntax_error_carries_position(conn: dbapi.Connection) -> None:
    with pytest.raises(dbapi.QuerySyntaxError) as info:
        conn.cursor().execute("SELECT COUNT(*) FROM visits WHERE (")
    assert isinstance(info.value, dbapi.ProgrammingError)
    assert hasattr(info.value, "line")


def test_setinputsizes_and_setoutputsize_exist(conn: dbapi.Connection) -> None:
    cursor = conn.cursor()
    cursor.setinputsizes([None])
    cursor.setoutputsize(10)
    cursor.setoutputsize(10, 0)


def test_no_api_takes_a_seed() -> None:
    for fn in (dbapi.connect, dbapi.Cursor.execute, dbapi.Cursor.executemany):
        names = set(inspect.signature(fn).parameters)
        assert not {n for n in names if "seed" in n.lower() or "rng" in n.lower()}


def test_the_other_group_through_set_options_and_the_connection(conn: dbapi.Connection) -> None:
    cur = conn.cursor()
    sql = "SELECT region, COUNT(*) AS n FROM visits GROUP BY region"
    cur.execute("SET dpsql.other_group = on")
    cur.execute(sql)
    # The four regions of the data and the domain's, plus the other group (NULL key).
    assert sorted(str(r[0]) for r in cur.fetchall()) == sorted([*REGIONS, "None"])
    conn.set("other_label", "elsewhere")
    cur.execute(sql)
    assert "elsewhere" in [r[0] for r in cur.fetchall()]
    cur.execute("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(other_group = false) " + sql[7:])
    assert len(cur.fetchall()) == len(REGIONS)
    before = spent(conn)
    with pytest.raises(dbapi.ProgrammingError, match=r"dpsql\.other_label equals a value"):
        cur.execute(sql, other_label="east")
    assert spent(conn) == before  # refused before the charge
