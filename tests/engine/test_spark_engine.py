"""The Spark engine behind the one seam: the policy picks it, every interface works on it, and it
keeps DuckDB's decisions and exact totals (the lowering's own tests: test_spark_lower.py and
test_spark_differential.py).

One local Spark serves the whole test run (``spark_fixtures.spark``); each engine has its own
Spark session on it, so their views never meet.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import duckdb
import pytest
from click.testing import CliRunner
from server_fixtures import ServerThread, psql, write_dataset, write_users
from server_fixtures import write_policy as write_server_policy
from spark_fixtures import SOCKET_WARNINGS, spark  # noqa: F401  (the session-scoped fixture)

from dpsql.bound.selection import GROUP_CELLS, selection_query
from dpsql.engine.base import open_engine
from dpsql.engine.duckdb import engine as duckdb_engine
from dpsql.engine.spark import engine as spark_engine
from dpsql.errors import PolicyError
from dpsql.interfaces.cli import main as cli
from dpsql.policy import load_policy
from dpsql.session.session import Session
from dpsql.session.workload_plan import plan_workload
from dpsql.session.workloads import run_workload
from dpsql.sql.split import split_statements

pytestmark = [pytest.mark.spark, *SOCKET_WARNINGS]

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "examples" / "data" / "visits.parquet"
SPARK = '[engine]\nname = "spark"\nmaster = "local[2]"\n\n'
# Bounds that cannot bind on the example (5 regions, 12 months; at most 10 visits a user and
# group): the engines' keyed hashes differ, so their totals agree exactly where no cap binds.
LOOSE = {"max_groups_per_unit": 12, "max_rows_per_unit_per_group": 1000}
QUERIES = (
    "SELECT COUNT(*) AS n FROM visits",
    "SELECT SUM(spend) AS s, AVG(age) AS a FROM visits WHERE region <> 'east'",
    "SELECT region, COUNT(*) AS n, AVG(spend) AS s FROM visits GROUP BY region",
    "SELECT date_trunc('month', day) AS m, COUNT(*) AS n FROM visits GROUP BY 1",
    "SELECT CASE WHEN age < 40 THEN 'young' ELSE 'old' END AS b, SUM(spend) AS s "
    "FROM visits GROUP BY b",
    "SELECT COUNT(DISTINCT user_id) AS users, STDDEV(spend) AS sd FROM visits",
)


def _policy_text(tmp_path: Path, spark_engine: bool, ledger: bool = False) -> Path:
    text = (ROOT / "examples" / "policy.toml").read_text(encoding="utf-8")
    text = text.replace('"data/visits.parquet"', f'"{DATA}"')
    for name, value in LOOSE.items():
        text = re.sub(rf"^{name} = \d+", f"{name} = {value}", text, flags=re.M)
    if ledger:
        text += f'\n[ledger]\npath = "{tmp_path / "visits.ledger"}"\n'
    path = tmp_path / ("spark.toml" if spark_engine else "duckdb.toml")
    path.write_text((SPARK if spark_engine else "") + text, encoding="utf-8")
    return path


@pytest.fixture
def sessions(tmp_path: Path, spark: Any) -> Iterator[tuple[Session, Session]]:  # noqa: F811
    if not DATA.exists():
        pytest.skip("run `make demo` (or examples/make_data.py) to create the example data")
    duck = Session(_policy_text(tmp_path, False))
    on_spark = Session(_policy_text(tmp_path, True))
    try:
        yield duck, on_spark
    finally:
        duck.close()
        on_spark.close()


def test_the_policy_picks_the_engine(sessions: tuple[Session, Session]) -> None:
    duck, on_spark = sessions
    assert (duck.engine.name, on_spark.engine.name) == ("duckdb", "spark")
    assert on_spark.engine.catalog == duck.engine.catalog  # Spark's schema, in DuckDB's types


@pytest.mark.parametrize("sql", QUERIES)
def test_the_exact_totals_are_duckdb_s(sessions: tuple[Session, Session], sql: str) -> None:
    duck, on_spark = sessions
    plan = duck.plan(sql)
    assert on_spark.plan(sql).engine_sql == plan.engine_sql  # one bounded query for both
    _, expected = duck.engine.run(plan.engine_sql)
    _, got = on_spark.engine.run(plan.engine_sql)
    assert sorted(map(repr, got)) == sorted(map(repr, expected))  # same values, same types


# R <= C with L0 >= R: every unit keeps R rows and each of them, so the total of rows and the
# count by region share the rows they bound: one family. No unit has more than R rows here, so
# no keyed hash decides (the engines' hashes differ).
WORKLOAD = """SET dpsql.other_group = on;
SET dpsql.max_rows_per_unit = 1000;
SET dpsql.max_rows_per_unit_per_group = 1000;
SET dpsql.max_groups_per_unit = 1000;
SELECT COUNT(*) AS n FROM visits;
SELECT region, COUNT(*) AS n FROM visits GROUP BY region;
"""


def test_a_workload_family_bounds_and_answers_alike_on_spark(
    sessions: tuple[Session, Session],
) -> None:
    """A batch file's family (the total and the count by region): the same bounded query on
    both engines, the same exact totals, and the file answered on Spark in its one charge."""
    duck, on_spark = sessions
    families = []
    for session in (duck, on_spark):
        workload = plan_workload(session, split_statements(WORKLOAD))
        assert len(workload.joint.families) == 1
        families.append(workload.joint.families[0])
    fine = families[0].fine
    assert len(families[0].members) == 2
    assert families[1].fine.engine_sql == fine.engine_sql
    _, expected = duck.engine.run(fine.engine_sql)
    _, got = on_spark.engine.run(fine.engine_sql)
    assert sorted(map(repr, got)) == sorted(map(repr, expected))
    planned = plan_workload(on_spark, split_statements(WORKLOAD))
    results = [r for _, r in run_workload(on_spark, planned)]
    assert len(on_spark.filter.charges) == 1
    assert all(r is not None and "least squares" in r.note for r in results[4:])


def test_an_answer_is_charged_once_and_published_like_duckdb_s(
    sessions: tuple[Session, Session],
) -> None:
    _, on_spark = sessions
    sql = "SELECT region, COUNT(*) AS n FROM visits GROUP BY region"
    result = on_spark.execute(sql)
    assert [row[0] for row in result.rows] == sorted(row[0] for row in result.rows)
    assert all(isinstance(row[1], int) for row in result.rows)
    # The query's epsilon 0.5 and its diagnosis's tenth of it (run on Spark too), one charge.
    assert result.diagnosis is not None
    assert on_spark.budget().epsilon_spent == Fraction(11, 20)
    again = on_spark.execute(sql)
    assert again.cached_from is not None and on_spark.budget().epsilon_spent == Fraction(11, 20)
    assert again.diagnosis == result.diagnosis


def test_explain_shows_the_spark_sql_with_the_salt_as_a_placeholder(
    sessions: tuple[Session, Session],
) -> None:
    _, on_spark = sessions
    on_spark.execute("SET dpsql.max_groups_per_unit = 2")  # so that the keyed hash ranks groups
    result = on_spark.execute(
        "EXPLAIN VERBOSE SELECT region, COUNT(*) AS n FROM visits GROUP BY region"
    )
    text = "\n".join(row[0] for row in result.rows)
    assert "XXHASH64(" in text.upper() and ":salt" in text
    assert str(on_spark.engine.salt) not in text
    assert on_spark.budget().queries == 0


def test_closing_drops_the_engine_s_views(tmp_path: Path, spark: Any) -> None:  # noqa: F811
    if not DATA.exists():
        pytest.skip("needs the example data")
    engine = open_engine(load_policy(_policy_text(tmp_path, True)), salt=7)
    session = engine._session  # type: ignore[attr-defined]
    # The settings the guarantees rest on hold in the engine's own session.
    assert session.conf.get("spark.sql.ansi.enabled") == "true"
    assert session.conf.get("spark.sql.session.timeZone") == "UTC"
    assert session.catalog.tableExists("visits")
    engine.close()
    assert not session.catalog.tableExists("visits")
    engine.close()  # a second close does nothing


def test_a_duckdb_database_file_is_refused_on_spark(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data")
    written, _ = write_server_policy(tmp_path, data, database=True)
    text = written.read_text(encoding="utf-8")
    path = tmp_path / "spark.toml"
    path.write_text(SPARK + text, encoding="utf-8")
    with pytest.raises(PolicyError, match=r"data\.database"):
        Session(load_policy(path))


def test_the_command_line_runs_on_spark(tmp_path: Path, spark: Any) -> None:  # noqa: F811
    if not DATA.exists():
        pytest.skip("needs the example data")
    policy = _policy_text(tmp_path, True, ledger=True)
    runner = CliRunner()
    assert runner.invoke(cli.cli, ["--policy", str(policy), "init"]).exit_code == 0
    done = runner.invoke(
        cli.cli, ["--policy", str(policy), "query", "SELECT COUNT(*) AS n FROM visits"]
    )
    assert done.exit_code == 0, done.stderr
    assert "charged epsilon 0.5" in done.stdout
    report = runner.invoke(cli.cli, ["--policy", str(policy), "budget"])
    assert "epsilon 0.55 spent of 10" in report.stdout  # with the default diagnosis


def test_psql_over_the_wire_on_spark(tmp_path: Path, spark: Any) -> None:  # noqa: F811
    data = write_dataset(tmp_path / "data")
    written, _ = write_server_policy(tmp_path, data)
    text = written.read_text(encoding="utf-8")
    policy = tmp_path / "spark.toml"
    policy.write_text(SPARK + text, encoding="utf-8")
    users = write_users(tmp_path / "users.json")
    with ServerThread(policy, users) as server:
        # A worker opens its own Spark session (seconds on a busy machine): wait for it.
        out = psql(
            server.port, "alice", "SELECT COUNT(*) AS n FROM visits;", timeout=180,
            connect_timeout="120",
        )  # fmt: skip
    assert "charged: epsilon 0.01" in out.stderr + out.stdout, out
    assert re.search(r"^\s*-?\d+\s*$", out.stdout, re.M), out.stdout


def test_a_table_of_spark_s_catalog_answers_as_its_files_do(
    tmp_path: Path,
    spark: Any,  # noqa: F811
) -> None:
    if not DATA.exists():
        pytest.skip("needs the example data")
    # A table of the session catalog over the example's file, as a lake's would be registered.
    spark.sql("CREATE DATABASE IF NOT EXISTS dpsql_lake")
    spark.sql(
        "CREATE TABLE IF NOT EXISTS dpsql_lake.visits USING parquet "
        f"LOCATION '{DATA.parent.as_uri()}/visits.parquet'"
    )
    from_files = _policy_text(tmp_path, True)
    text = from_files.read_text(encoding="utf-8").replace(
        f'tables = {{ visits = "{DATA}" }}', 'catalog = { visits = "dpsql_lake.visits" }'
    )
    assert "dpsql_lake" in text
    from_catalog = tmp_path / "catalog.toml"
    from_catalog.write_text(text, encoding="utf-8")
    files, lake = Session(from_files), Session(from_catalog)
    try:
        assert lake.engine.catalog == files.engine.catalog  # the catalog's stored schema
        plan = files.plan("SELECT region, SUM(spend) AS s FROM visits GROUP BY region")
        assert sorted(lake.engine.run(plan.engine_sql)[1]) == sorted(
            files.engine.run(plan.engine_sql)[1]
        )
    finally:
        files.close()
        lake.close()


def test_old_dates_and_timestamps_read_as_on_duckdb(tmp_path: Path, spark: Any) -> None:  # noqa: F811
    """Parquet dates and timestamps before the Gregorian reform (1582), at year 1 and at 9999
    read as stored on both engines: no rebasing, and no error for one old value."""
    path = tmp_path / "old.parquet"
    con = duckdb.connect()
    con.execute(
        "COPY (SELECT * FROM (VALUES (1, DATE '0001-01-01', TIMESTAMP '0001-01-01 00:00:01'), "
        "(2, DATE '1500-03-01', TIMESTAMP '1500-02-28 23:59:59.5'), "
        "(3, DATE '1582-10-10', TIMESTAMP '1582-10-05 12:00:00'), "
        "(4, DATE '9999-12-31', TIMESTAMP '9999-12-31 23:59:59.999999'), (5, NULL, NULL)) "
        f"AS t(user_id, d, ts)) TO '{path}' (FORMAT PARQUET)"
    )
    con.close()
    table = {"privacy_unit": "user_id", "max_groups_per_unit": 1, "max_rows_per_unit_per_group": 1}
    policy: dict[str, Any] = {
        "dataset": {"id": "old"},
        "data": {"tables": {"old": str(path)}},
        "budget": {"diagnose": False, "epsilon": "1", "delta": "0.000001"},
        "tables": {"old": table},
    }
    duck = open_engine(load_policy(policy), 1)
    on_spark = open_engine(
        load_policy({**policy, "engine": {"name": "spark", "master": "local[2]"}}), 1
    )
    try:
        sql = "SELECT user_id, d, ts, year(d) AS y, month(ts) AS m FROM old"
        assert on_spark.catalog == duck.catalog
        assert sorted(on_spark.run(sql)[1]) == sorted(duck.run(sql)[1])
    finally:
        duck.close()
        on_spark.close()


def test_a_star_lists_the_columns_in_the_table_s_order(sessions: tuple[Session, Session]) -> None:
    """``SELECT *`` on Spark gives DuckDB's columns in DuckDB's order, each converted by its own
    type (a sorted catalog once paired the values of one column with another's type)."""
    duck, on_spark = sessions
    sql = "SELECT * FROM visits WHERE user_id < 20"
    names, rows = on_spark.engine.run(sql)
    expected_names, expected = duck.engine.run(sql)
    assert names == expected_names
    assert sorted(map(repr, rows)) == sorted(map(repr, expected))


def test_a_unit_level_sample_keeps_the_same_units_on_both_engines(
    sessions: tuple[Session, Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sample's PRF, SHA-256 of the secret and the unit's text, on DuckDB and on Spark:
    with one secret both keep the same units (the same exact totals); each run draws its own."""
    duck, on_spark = sessions
    sql = (
        "SELECT region, COUNT(*) AS n, SUM(spend) AS s FROM visits "
        "TABLESAMPLE BERNOULLI (5 PERCENT) GROUP BY region"
    )
    plan = duck.plan(sql)
    assert plan.sample is not None and on_spark.plan(sql).engine_sql == plan.engine_sql
    assert ":sample" in on_spark.engine.shown_sql(plan.engine_sql)
    secret = "0123456789abcdef0123456789abcdef"
    monkeypatch.setattr(duckdb_engine.secrets, "token_hex", lambda n: secret)
    monkeypatch.setattr(spark_engine.secrets, "token_hex", lambda n: secret)
    _, expected = duck.engine.run(plan.engine_sql)
    _, got = on_spark.engine.run(plan.engine_sql)
    assert sorted(map(repr, got)) == sorted(map(repr, expected))
    _, full = duck.engine.run(
        duck.plan(sql.replace(" TABLESAMPLE BERNOULLI (5 PERCENT)", "")).engine_sql
    )
    assert sum(int(r[1]) for r in expected) < sum(int(r[1]) for r in full) / 5
    monkeypatch.undo()
    result = on_spark.execute(sql)
    assert result.charge is not None and result.charge.epsilon == plan.epsilon


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT COUNT(*) AS n FROM visits WHERE age > 30",
        "SELECT region, SUM(spend) AS s FROM visits GROUP BY region",
    ],
)
def test_the_bound_choices_histograms_are_duckdb_s(
    sessions: tuple[Session, Session], sql: str
) -> None:
    """The histograms ``dpsql.bounds = auto`` walks over (``dpsql.bound.selection``), the
    per-group cells numbered by a window over the keys included: the same rows on Spark."""
    duck, on_spark = sessions
    plan = duck.plan(sql)
    assert plan.bounding is not None
    text = selection_query(plan.analysis, plan.bounding, bool(plan.analysis.keys))
    _, expected = duck.engine.run(text)
    _, got = on_spark.engine.run(text)
    assert sorted(map(repr, got)) == sorted(map(repr, expected))
    assert any(row[0] >= GROUP_CELLS for row in expected) == bool(plan.analysis.keys)
