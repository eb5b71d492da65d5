"""Tables made of blocks (``dpsql.session.blocks``): registering, releases keyed by the blocks
they read, corrections that retire releases, and sessions that see new blocks before their next
statement.

The neighbour property: appending a block (any rows, of old units or new ones) never changes an
earlier release, nor what serving it again returns, nor what it cost; a query over the new
block is charged. A correction retires exactly the releases that read the block it replaces.
"""

from __future__ import annotations

import datetime as dt
import random
import re
from contextlib import closing
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import TINY_BUDGET, TINY_COLUMNS, examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpsql.accounting.ledger.blocks import BLOCK_RECORD, block_list, retired
from dpsql.accounting.ledger.store import create_ledger
from dpsql.errors import DataChangedError, ParameterError, PolicyError
from dpsql.policy import Policy, load_policy
from dpsql.session.blocks import _tests, register, remove
from dpsql.session.session import Session

MONTHS = [(dt.date(2026, m, 1), dt.date(2026, m + 1, 1)) for m in range(1, 6)]
JAN_FEB = "SELECT region, COUNT(*) AS n, SUM(spend) AS s FROM visits WHERE day < DATE '2026-03-01' GROUP BY region"  # noqa: E501
ALL = "SELECT region, COUNT(*) AS n FROM visits GROUP BY region"
JANUARY = "SELECT COUNT(*) AS n FROM visits WHERE day BETWEEN '2026-01-01' AND '2026-01-31'"


def _policy(folder: Path, ledger: bool = False) -> Policy:
    raw: dict[str, Any] = {
        "dataset": {"id": "blocks", "data_version": "1"},
        "data": {"blocks": {"visits": {"period": "day"}}},
        "budget": {"diagnose": False, **TINY_BUDGET, "epsilon": "100"},
        "tables": {
            "visits": {
                "privacy_unit": "user_id",
                "max_groups_per_unit": 2,
                "max_rows_per_unit_per_group": 5,
                "columns": {k: dict(v) for k, v in TINY_COLUMNS.items()},
            }
        },
    }
    if ledger:
        raw["ledger"] = {"path": "blocks.ledger"}
    return load_policy(raw, base_dir=folder)


def _month(folder: Path, name: str, month: int, rows: list[tuple[int, str, float, int]]) -> Path:
    """A block's file: rows (user, region, spend, day of month) of 2026-``month``."""
    path = folder / f"{name}.parquet"
    start = MONTHS[month - 1][0]
    table = pa.table(
        {
            "user_id": pa.array([r[0] for r in rows], pa.int64()),
            "region": pa.array([r[1] for r in rows], pa.string()),
            "age": pa.array([30 for _ in rows], pa.int32()),
            "spend": pa.array([r[2] for r in rows], pa.float64()),
            "day": pa.array([start + dt.timedelta(days=r[3]) for r in rows], pa.date32()),
        }
    )
    pq.write_table(table, path)
    return path


def _rows(seed: int, n: int = 60) -> list[tuple[int, str, float, int]]:
    rng = random.Random(seed)
    regions = ["central", "east", "north", "south", "west"]
    return [(rng.randrange(40), rng.choice(regions), rng.uniform(0, 250), rng.randrange(28))
            for _ in range(n)]  # fmt: skip


def _add(session: Session, folder: Path, block: str, month: int, rows: Any, **kw: Any) -> None:
    start, end = MONTHS[month - 1]
    register(session.policy, session.filter.store, "visits", block,
             period=(start.isoformat(), end.isoformat()),
             paths=[_month(folder, block, month, rows)], **kw)  # fmt: skip


ROW = st.tuples(
    st.integers(0, 60),
    st.sampled_from(["central", "east", "north", "south", "west", "elsewhere"]),
    st.floats(-10, 300, allow_nan=False),
    st.integers(0, 27),
)


@settings(max_examples=examples(12), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(appended=st.lists(ROW, max_size=40), seed=st.integers(0, 10**6))
def test_appending_a_block_never_changes_an_earlier_release(
    tmp_path_factory: pytest.TempPathFactory, appended: list[Any], seed: int
) -> None:
    """D: blocks January and February; D': D and a March block of any rows (units of D and new
    ones). The release over January-February made on D is served on D' as it was, free, and its
    ledger record is unchanged; a query that reads March is charged."""
    folder = tmp_path_factory.mktemp("append")
    with closing(Session(_policy(folder))) as session:
        _add(session, folder, "jan", 1, _rows(seed))
        _add(session, folder, "feb", 2, _rows(seed + 1))
        first = session.execute(JAN_FEB)
        assert first.charge is not None
        records = [r.payload for r in session.filter.store.records()]
        spent = session.budget().epsilon_spent
        # The bounded rows' exact totals, under R (a keyed-hash window over each unit's rows)
        # and under (L0, C): the WHERE keeps March's rows out before any bound reads them.
        capped = {"max_rows_per_unit": 3}

        def totals() -> list[list[Any]]:
            plans = [session.plan(JAN_FEB, **o) for o in ({}, capped)]  # the engine moves on
            return [sorted(session.engine.run(p.engine_sql)[1]) for p in plans]

        exact = totals()
        _add(session, folder, "mar", 3, appended)
        assert totals() == exact
        again = session.execute(JAN_FEB)
        assert again.charge is None and again.rows == first.rows
        assert again.accuracy == first.accuracy
        assert session.budget().epsilon_spent == spent
        # Nothing recorded before is changed (the new block's record and the serve come after).
        assert [r.payload for r in session.filter.store.records()][: len(records)] == records
        assert session.plan(JAN_FEB).blocks == (("visits", ("jan", "feb")),)
        every = session.execute(ALL)
        assert every.charge is not None
        assert session.plan(ALL).blocks == (("visits", ("jan", "feb", "mar")),)


def test_a_correction_retires_exactly_the_releases_that_read_it(tmp_path: Path) -> None:
    with closing(Session(_policy(tmp_path))) as session:
        _add(session, tmp_path, "jan", 1, _rows(1))
        _add(session, tmp_path, "feb", 2, _rows(2))
        january = session.execute(JANUARY)
        both = session.execute(JAN_FEB)
        assert january.charge is not None and both.charge is not None
        _add(session, tmp_path, "feb-fixed", 2, _rows(3), replaces="feb")
        records = session.filter.store.records()
        gone = retired(records, block_list(records))
        assert [(r.seq, hit) for r, hit in gone] == [(both.charge.seq, [("visits", "feb")])]
        # January's release read no replaced block: served again, free; the other is charged.
        assert session.execute(JANUARY).charge is None
        fresh = session.execute(JAN_FEB)
        assert fresh.charge is not None
        assert session.plan(JAN_FEB).blocks == (("visits", ("jan", "feb-fixed")),)


def test_registering_checks_the_block_and_appends_nothing_when_refused(tmp_path: Path) -> None:
    with closing(Session(_policy(tmp_path))) as session:
        _add(session, tmp_path, "jan", 1, _rows(1))
        count = len(session.filter.store.records())
        store, policy = session.filter.store, session.policy
        other = tmp_path / "other.parquet"
        pq.write_table(pa.table({"user_id": [1], "day": [dt.date(2026, 2, 2)]}), other)
        feb = _month(tmp_path, "feb", 2, _rows(2))
        cases: list[tuple[dict[str, Any], type[Exception], str]] = [
            ({"table": "nope"}, ParameterError, "data.blocks names no table"),
            ({"block": "jan"}, ParameterError, "already has a block jan"),
            ({"block": "bad id!"}, ParameterError, "a block id"),
            ({"period": ("2026-02-01", "2026-02-01")}, ParameterError, "period"),
            ({"period": ("2026-2-1", "2026-03-01")}, ParameterError, "period"),
            ({"period": ("2026-01-15", "2026-02-15")}, ParameterError, "overlaps"),
            ({"replaces": "dec"}, ParameterError, "no active block dec"),
            ({"paths": [tmp_path / "jan.parquet.csv"]}, ParameterError, "Parquet"),
            ({"paths": [tmp_path / "missing.parquet"]}, PolicyError, "does not exist"),
            ({"paths": [other]}, PolicyError, "no such column"),
            # January's file again: read twice, its rows kept against either period.
            ({"paths": [tmp_path / "jan.parquet"]}, ParameterError, "already a file of block jan"),
        ]
        for change, error, text in cases:
            args: dict[str, Any] = {"table": "visits", "block": "feb",
                                    "period": ("2026-02-01", "2026-03-01"),
                                    "paths": [feb]}  # fmt: skip
            args.update(change)
            with pytest.raises(error, match=text):
                register(policy, store, args.pop("table"), args.pop("block"), **args)
        assert len(session.filter.store.records()) == count


def test_a_block_rewritten_after_registration_is_refused(tmp_path: Path) -> None:
    """A block is never rewritten: an open session refuses the next query before its charge,
    and a new one refuses to open, naming the block."""
    policy = _policy(tmp_path, ledger=True)
    create_ledger(policy).close()
    with closing(Session(policy)) as session:
        _add(session, tmp_path, "jan", 1, _rows(1))
        assert session.execute(JANUARY).charge is not None
        spent = session.budget().epsilon_spent
        _month(tmp_path, "jan", 1, _rows(9))  # written in place: another file
        with pytest.raises(DataChangedError):
            session.execute(JANUARY, fresh=True)
        assert session.budget().epsilon_spent == spent
    with pytest.raises(DataChangedError, match="block jan of table visits changed"):
        Session(policy)


def test_a_session_sees_a_block_registered_elsewhere_before_its_next_statement(
    tmp_path: Path,
) -> None:
    """Two sessions on one durable ledger (two processes or server connections): a block the
    owner registers through one is read by the other's next statement; a statement planned
    before the registration is refused before its charge, and nothing is charged."""
    policy = _policy(tmp_path, ledger=True)
    create_ledger(policy).close()
    with closing(Session(policy)) as reader, closing(Session(policy)) as owner:
        _add(owner, tmp_path, "jan", 1, _rows(1))
        before = reader.execute(ALL)
        assert reader.plan(ALL).blocks == (("visits", ("jan",)),)
        planned = reader.planned(ALL, None, {"fresh": True})
        assert planned is not None
        _add(owner, tmp_path, "feb", 2, _rows(2))
        spent = reader.budget().epsilon_spent
        # The engine moves to the new list at the next statement; the old plan is refused.
        assert reader.plan(ALL).blocks == (("visits", ("jan", "feb")),)
        with pytest.raises(DataChangedError, match="blocks were registered"):
            reader._planned_result(planned, {"fresh": True})
        assert reader.budget().epsilon_spent == spent
        after = reader.execute(ALL)
        assert after.charge is not None and before.charge is not None
        assert sum(n for _, n in after.rows) > sum(n for _, n in before.rows) - 200


def test_rows_outside_a_blocks_period_are_not_the_tables(tmp_path: Path) -> None:
    """A block's file may hold rows of other days: the table keeps only its period's, so a
    query whose WHERE excludes the period reads none of its rows (what lets it keep its key)."""
    with closing(Session(_policy(tmp_path))) as session:
        start, end = MONTHS[0]
        path = _month(tmp_path, "wide", 2, _rows(4))  # February's rows, declared as January
        register(session.policy, session.filter.store, "visits", "jan",
                 period=(start.isoformat(), end.isoformat()), paths=[path])  # fmt: skip
        assert session.plan(JANUARY).blocks == (("visits", ("jan",)),)  # the engine moves on
        con = session.engine._con  # the engine's own view of the table
        assert con.execute("SELECT COUNT(*) FROM visits").fetchone() == (0,)


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ("day >= DATE '2026-02-01'", ["feb", "mar"]),
        ("day > '2026-02-01'", ["feb", "mar"]),
        ("day > '2026-02-28'", ["feb", "mar"]),  # a TIMESTAMP may lie later that day
        ("day < '2026-02-01'", ["jan"]),
        ("day <= '2026-02-01'", ["jan", "feb"]),
        ("'2026-02-01' > day", ["jan"]),
        ("day = CAST('2026-03-05' AS DATE)", ["mar"]),
        ("day BETWEEN '2026-01-10' AND '2026-02-10' AND spend > 3", ["jan", "feb"]),
        ("(day >= '2026-03-01') AND region = 'east'", ["mar"]),
        ("day >= '2026-03-01' OR spend > 3", ["jan", "feb", "mar"]),  # an OR: no test
        ("day >= '2026-3-1'", ["jan", "feb", "mar"]),  # another spelling: not read
        ("day + 40 >= DATE '2026-03-01'", ["jan", "feb", "mar"]),
        ("day >= TIMESTAMP '2026-03-01 00:00:00'", ["jan", "feb", "mar"]),
    ],
)
def test_the_where_prunes_only_blocks_it_excludes(
    tmp_path: Path, where: str, expected: list[str]
) -> None:
    """The blocks read are those whose period the WHERE's AND terms leave some day in; the
    engine's answer over the blocks read equals its answer over every block."""
    with closing(Session(_policy(tmp_path))) as session:
        for i, name in enumerate(["jan", "feb", "mar"], start=1):
            _add(session, tmp_path, name, i, _rows(i))
        sql = f"SELECT COUNT(*) FROM visits WHERE {where}"
        assert session.plan(sql).blocks == (("visits", tuple(expected)),)
        con = session.engine._con
        (everything,) = con.execute(f"SELECT COUNT(*) FROM visits WHERE {where}").fetchone()
        periods = " OR ".join(
            f"(day >= DATE '{MONTHS[i][0]}' AND day < DATE '{MONTHS[i][1]}')"
            for i, name in enumerate(["jan", "feb", "mar"])
            if name in expected
        )
        (read,) = con.execute(
            f"SELECT COUNT(*) FROM visits WHERE ({where}) AND ({periods})"
        ).fetchone()
        assert read == everything


def test_tests_read_only_plain_date_comparisons() -> None:
    import sqlglot

    where = sqlglot.parse_one("SELECT 1 FROM t WHERE v.day >= '2026-01-01'", read="duckdb")
    assert _tests(where.args["where"].this, "day") == []  # qualified: not this table's surely


def test_block_records_are_what_the_budget_ignores(tmp_path: Path) -> None:
    with closing(Session(_policy(tmp_path))) as session:
        before = session.budget().epsilon_spent
        _add(session, tmp_path, "jan", 1, _rows(1))
        assert session.budget().epsilon_spent == before
        kinds = [r.kind for r in session.filter.store.records()]
        assert kinds.count(BLOCK_RECORD) == 1


def test_a_bounds_estimate_is_keyed_by_its_blocks_and_stays_in_use(tmp_path: Path) -> None:
    """ESTIMATE BOUNDS reads every active block: asked again over the same blocks it is served
    free; after a block is appended it is estimated afresh (charged); the earlier estimate stays
    in use by plans meanwhile (a released value: post-processing)."""
    columns = {k: dict(v) for k, v in TINY_COLUMNS.items() if k != "spend"}
    raw = _policy(tmp_path).model_dump(mode="json", exclude={"base_dir"})
    raw["tables"]["visits"]["columns"] = columns
    with closing(Session(load_policy(raw, base_dir=tmp_path))) as session:
        _add(session, tmp_path, "jan", 1, _rows(1, 300))
        estimate = "ESTIMATE BOUNDS FOR visits.spend"
        first = session.execute(estimate)
        assert first.charge is not None
        assert session.execute(estimate).charge is None
        assert session.plan("SELECT SUM(spend) FROM visits").analysis is not None
        _add(session, tmp_path, "feb", 2, _rows(2, 300))
        # Still planned with January's estimate: a SUM needs no new one.
        assert session.plan("SELECT SUM(spend) FROM visits").blocks == (("visits", ("jan", "feb")),)
        assert session.execute(estimate).charge is not None


def test_a_workloads_family_is_keyed_by_its_blocks(tmp_path: Path) -> None:
    """Files of statements answered as one family, over January-February and over every
    month: run again after March is appended, the first is served free; the second reads
    March now, and is charged."""
    where = " WHERE day < DATE '2026-03-01'"
    script = "SET dpsql.other_group = on;\n" + "".join(
        f"SELECT region, {aggregates} FROM visits{where} GROUP BY region;\n"
        for aggregates in ("COUNT(*) AS n", "SUM(spend) AS s, AVG(spend) AS a", "STDDEV(spend)")
    )
    with closing(Session(_policy(tmp_path))) as session:
        _add(session, tmp_path, "jan", 1, _rows(1))
        _add(session, tmp_path, "feb", 2, _rows(2))
        first = session.run_script(script)
        session.run_script(script.replace(where, ""))  # every month: January and February
        spent = session.budget().epsilon_spent
        kinds = [r.kind for r in session.filter.store.records()]
        assert kinds.count("family_release") == 2  # each answered as one family
        _add(session, tmp_path, "mar", 3, _rows(3))
        again = session.run_script(script)
        assert session.budget().epsilon_spent == spent
        assert [r.rows for _, r in again if r] == [r.rows for _, r in first if r]
        session.run_script(script.replace(where, ""))
        assert session.budget().epsilon_spent > spent


def test_policies_that_cannot_hold_blocks_are_refused(tmp_path: Path) -> None:
    """Blocks are bound by the DuckDB engine, each connection anew: not beside a database file
    (its instance is shared and fixes its readable files), not on Spark; a name taken twice or
    a period that names no column is refused when the policy loads."""
    raw = _policy(tmp_path).model_dump(mode="json", exclude={"base_dir"})
    spark = {**raw, "engine": {**raw["engine"], "name": "spark"}}
    with pytest.raises(PolicyError, match=re.escape('read by engine.name = "duckdb" only')):
        Session(load_policy(spark, base_dir=tmp_path))
    database = {**raw, "data": {**raw["data"], "database": str(tmp_path / "w.duckdb")}}
    with pytest.raises(PolicyError, match=re.escape("cannot be combined with data.database")):
        load_policy(database, base_dir=tmp_path)
    (tmp_path / "v.parquet").write_bytes(b"")
    twice = {**raw, "data": {**raw["data"], "tables": {"visits": "v.parquet"}}}
    with pytest.raises(PolicyError, match="not a new plain SQL identifier"):
        load_policy(twice, base_dir=tmp_path)
    bad = {**raw, "data": {"blocks": {"visits": {"period": "day; DROP"}}}}
    with pytest.raises(PolicyError, match="period must name a column"):
        load_policy(bad, base_dir=tmp_path)


ALL_3 = ["jan", "feb", "mar"]
PASSED_THROUGH = [
    # (FROM ... WHERE ..., the blocks read): the WHERE tests a column the relation passes
    # through from the table's only scan, or it does not and every block is read.
    ("visits v JOIN regions r ON v.region = r.name WHERE v.day < DATE '2026-02-01'", ["jan"]),
    ("visits v LEFT JOIN regions r ON v.region = r.name WHERE day >= '2026-03-01'", ["mar"]),
    ("(SELECT user_id, day AS d FROM visits) WHERE d < '2026-02-01'", ["jan"]),
    (
        "(SELECT user_id, day + 40 AS day FROM visits) WHERE day < '2026-02-01'",
        ALL_3,
    ),
    ("visits a JOIN visits b ON a.user_id = b.user_id WHERE a.day < '2026-02-01'", ALL_3),
    (
        "(SELECT user_id, MAX(day) AS day FROM visits GROUP BY user_id) WHERE day < '2026-02-01'",
        ALL_3,
    ),
    (
        "(SELECT user_id, day FROM visits UNION ALL SELECT user_id, day FROM visits) "
        "WHERE day < '2026-02-01'",
        ALL_3,
    ),
]


@pytest.mark.parametrize(("relation", "expected"), PASSED_THROUGH)
def test_joins_and_subqueries_prune_what_they_pass_through(
    tmp_path: Path, relation: str, expected: list[str]
) -> None:
    """Through a join or a subquery, the blocks read are those whose period the WHERE leaves
    some day in, where the relation passes the period column through from the table's only
    scan; the bounded query's exact totals are the same over every block and over those."""
    regions = tmp_path / "regions.parquet"
    pq.write_table(pa.table({"name": ["east", "west"], "area": [1, 2]}), regions)
    raw = _policy(tmp_path).model_dump(mode="json", exclude={"base_dir"})
    raw["data"]["tables"] = {"regions": str(regions)}
    raw["tables"]["regions"] = {"public": True}
    policy = load_policy(raw, base_dir=tmp_path)
    sql = f"SELECT COUNT(*) FROM {relation}"
    with closing(Session(policy)) as session:
        for i, name in enumerate(["jan", "feb", "mar"], start=1):
            _add(session, tmp_path, name, i, _rows(i))
        plan = session.plan(sql)
        assert plan.blocks == (("visits", tuple(expected)),)
        everything = session.engine.run(plan.engine_sql)[1]
    # The same query over a table of the blocks read only.
    with closing(Session(policy)) as only:
        for i, name in enumerate(["jan", "feb", "mar"], start=1):
            if name in expected:
                _add(only, tmp_path, name + "-again", i, _rows(i))
        plan = only.plan(sql)
        assert only.engine.run(plan.engine_sql)[1] == everything


def test_blocks_whose_files_order_their_columns_differently_are_read_by_name(
    tmp_path: Path,
) -> None:
    """The table is one scan of every block's files, matched by column name: a block whose
    file lists its columns in another order reads the same values; a file with the column the
    scan names each row's file by is refused."""
    with closing(Session(_policy(tmp_path))) as session:
        _add(session, tmp_path, "jan", 1, _rows(1))
        feb = _month(tmp_path, "feb", 2, _rows(2))
        table = pq.read_table(feb)
        pq.write_table(table.select(list(reversed(table.column_names))), feb)
        register(session.policy, session.filter.store, "visits", "feb",
                 period=("2026-02-01", "2026-03-01"), paths=[feb])  # fmt: skip
        session.plan(ALL)  # the engine binds February
        con = duckdb.connect()
        try:
            expected = con.execute(
                f"SELECT region, COUNT(*), SUM(spend::DECIMAL(18, 6)), MIN(day) FROM read_parquet("
                f"['{tmp_path / 'jan.parquet'}', '{feb}'], union_by_name = true) "
                "GROUP BY region ORDER BY region"
            ).fetchall()
        finally:
            con.close()
        got = session.engine._con.execute(
            "SELECT region, COUNT(*), SUM(spend::DECIMAL(18, 6)), MIN(day) FROM visits "
            "GROUP BY region ORDER BY region"
        ).fetchall()
        assert got == expected  # exact sums (a float sum's order moves its last bits)
        named = tmp_path / "named.parquet"
        pq.write_table(table.append_column("_dpsql_file", pa.array(["x"] * table.num_rows)), named)
        with pytest.raises(PolicyError, match="_dpsql_file, a name dpsql keeps"):
            register(session.policy, session.filter.store, "visits", "mar",
                     period=("2026-03-01", "2026-04-01"), paths=[named])  # fmt: skip


def test_a_removed_block_is_read_by_no_plan_and_retires_its_releases(tmp_path: Path) -> None:
    """Retention: the owner removes a block with no replacement. No later plan reads it, the
    releases that read it are retired (the others still served free), its id is not reused,
    and its files may be deleted: sessions bind only the active blocks."""
    policy = _policy(tmp_path, ledger=True)
    create_ledger(policy).close()
    with closing(Session(policy)) as session:
        for i, name in enumerate(["jan", "feb", "mar"], start=1):
            _add(session, tmp_path, name, i, _rows(i))
        january, every = session.execute(JANUARY), session.execute(ALL)
        assert january.charge is not None and every.charge is not None
        seq = remove(session.policy, session.filter.store, "visits", "jan", by="owner")
        records = session.filter.store.records()
        listed = block_list(records)
        assert listed.removed == (("visits", "jan", seq),)
        assert [(r.seq, hit) for r, hit in retired(records, listed)] == [
            (january.charge.seq, [("visits", "jan")]),
            (every.charge.seq, [("visits", "jan")]),
        ]
        assert session.plan(ALL).blocks == (("visits", ("feb", "mar")),)
        assert session.plan(JANUARY).blocks == (("visits", ()),)
        assert session.execute(ALL).charge is not None
        count = len(session.filter.store.records())
        with pytest.raises(ParameterError, match="no active block jan to remove"):
            remove(session.policy, session.filter.store, "visits", "jan")
        with pytest.raises(ParameterError, match="already has a block jan"):
            _add(session, tmp_path, "jan", 1, _rows(1))
        assert len(session.filter.store.records()) == count
    (tmp_path / "jan.parquet").unlink()
    with closing(Session(policy)) as later:
        assert later.plan(ALL).blocks == (("visits", ("feb", "mar")),)
