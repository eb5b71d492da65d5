"""A diagnosed query's one statement (``dpsql.bound.together``) returns exactly what the bounded
query and the diagnosis return apart: the same answer rows and the same histogram (as
multisets: the engine may give the rows in another order, and the noise, drawn independently
for each row, is the same whatever the order), for the neighbour fuzzer's generated queries over
data with a hostile unit (NaN, infinities, huge values, NULL keys)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlglot
from hypothesis import HealthCheck, event, given, settings
from sqlglot import exp
from test_neighbours import BASE, EXAMPLES, _policy, query, unit_rows

from dpsql import errors
from dpsql.bound.together import split
from dpsql.session.session import Session


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("together")


@pytest.fixture(scope="module")
def base(folder: Path) -> Iterator[Session]:
    session = Session(_policy(folder, BASE, "base"))
    yield session
    session.close()


def _same(session: Session, sql: str) -> str:
    """What was checked ("checked", or why not)."""
    try:
        plan = session.plan(sql, diagnose=True)
    except errors.DpsqlError as exc:
        assert not isinstance(exc, errors.EngineError | errors.InternalError), sql
        return f"refused: {type(exc).__name__}"
    diagnosis = plan.diagnosis
    if diagnosis is None:  # a sampled query is not diagnosed
        return "not diagnosed"
    engine = session.engine
    assert engine.shares_rows
    names, together = engine.run(diagnosis.together_sql)
    answer, patterns = split(together, diagnosis.width)
    alone_names, alone = engine.run(plan.engine_sql)
    _, histogram = engine.run(diagnosis.engine_sql)
    assert names[1 : 1 + diagnosis.width] == alone_names
    assert Counter(map(repr, answer)) == Counter(map(repr, alone)), sql
    assert Counter(map(repr, patterns)) == Counter(map(repr, histogram)), sql
    return "checked"


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sql=query(), unit=unit_rows())
def test_one_statement_returns_what_the_two_return(
    base: Session, tmp_path_factory: pytest.TempPathFactory, sql: str, unit: list[tuple[Any, ...]]
) -> None:
    session = Session(_policy(tmp_path_factory.mktemp("d"), [*BASE, *unit], "hostile"))
    session.engine.salt = base.engine.salt
    try:
        event(_same(session, sql))
    finally:
        session.close()


@pytest.mark.parametrize(
    "sql",
    [
        # R's window over the relation, with and without values; the pivot of few groups; the
        # direct path; a variance's vector; a quantile's histogram.
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(max_rows_per_unit = 2) COUNT(*) FROM visits",
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(max_rows_per_unit = 4) region, SUM(spend) "
        "FROM visits GROUP BY region",
        "SELECT region, COUNT(*), AVG(spend) FROM visits GROUP BY region",
        "SELECT flag, VAR_POP(age), STDDEV_SAMP(spend) FROM visits GROUP BY flag",
        "SELECT region, MEDIAN(age) FROM visits GROUP BY region",
        "SELECT COUNT(DISTINCT user_id) FROM visits",
    ],
)
def test_each_shape_of_the_bounded_query(base: Session, sql: str) -> None:
    assert _same(base, sql) == "checked"


def test_a_session_runs_the_one_statement_and_releases_as_before(
    base: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session runs one statement for a diagnosed query (not two), and the answer and the
    diagnosis it releases are those of the two statements under the same noise."""
    sql = "SELECT region, COUNT(*), SUM(spend) FROM visits GROUP BY region"
    seen: list[str] = []
    run = type(base.engine).run

    def counted(self: Any, text: str) -> Any:
        seen.append(text)
        return run(self, text)

    monkeypatch.setattr(type(base.engine), "run", counted)
    monkeypatch.setattr("dpsql.noise.measure.discrete_laplace", lambda _s, n: [0] * n)
    shared = base.execute(sql, fresh=True, diagnose=True)
    plan = base.plan(sql, diagnose=True)
    assert plan.diagnosis is not None
    assert seen == [plan.diagnosis.together_sql]
    monkeypatch.setattr(type(base.engine), "shares_rows", False)
    seen.clear()
    apart = base.execute(sql, fresh=True, diagnose=True)
    assert seen == [plan.engine_sql, plan.diagnosis.engine_sql]
    assert shared.rows == apart.rows
    assert shared.diagnosis == apart.diagnosis


def _reads(sql: str, name: str) -> tuple[set[str], bool]:
    """The tables the CTE ``name`` of ``sql`` reads, and whether it is materialised."""
    tree = sqlglot.parse_one(sql, read="duckdb")
    for c in tree.find_all(exp.CTE):
        if c.alias == name:
            return {t.name for t in c.this.find_all(exp.Table)}, bool(c.args.get("materialized"))
    raise AssertionError(f"no CTE {name}")


@pytest.mark.parametrize(
    ("sql", "dg", "heavy"),
    [
        # R's weighted window: its (unit, keys) counts are the diagnosis's.
        ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(max_rows_per_unit = 10) region, COUNT(*) "
         "FROM visits GROUP BY region", "_all", ("_heavy", "_du")),
        # R's window over rows with values: the units over R are read from the diagnosis's.
        ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(max_rows_per_unit = 4) region, SUM(spend) "
         "FROM visits GROUP BY region", "_rel", ("_heavy", "_du")),
        # L0 and C: _units groups every row as the diagnosis does, the clamp flag carried.
        ("SELECT region, COUNT(*), AVG(spend) FROM visits WHERE age > 20 GROUP BY region",
         "_units", ("_multi", "_du")),
        ("SELECT COUNT(DISTINCT user_id), SUM(big) FROM visits", "_units", None),
        # L0 per unit in one row: its cells' counts are the unit's, and no _dg is made.
        ("SELECT region, COUNT(*) FROM visits GROUP BY region", None, ("_du", "_pivot")),
    ],
)  # fmt: skip
def test_the_diagnosis_reads_the_counts_the_bounded_query_makes(
    base: Session, sql: str, dg: str | None, heavy: tuple[str, str] | None
) -> None:
    """Each unit's rows are counted once: the diagnosis's per-group counts come from the
    bounded query's own where they are the same rows, and the units over R or L0 from the
    diagnosis's per-unit row; the answers and histogram stay those of the two apart."""
    plan = base.plan(sql, diagnose=True)
    assert plan.diagnosis is not None
    together = plan.diagnosis.together_sql
    if dg is None:
        assert "_dg" not in together
    else:
        assert _reads(together, "_dg")[0] == {dg}
    assert _reads(together, "_rel")[1] == (dg == "_rel")  # materialised only if read twice
    if heavy is not None:
        assert _reads(together, heavy[0])[0] == {heavy[1]}
    assert _same(base, sql) == "checked"
