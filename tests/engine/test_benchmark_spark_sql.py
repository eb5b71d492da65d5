"""The hand-written bounded Spark SQL of benchmarks/spark_scale.py returns the pre-noise totals
of dpsql on Spark, for every query of the Spark benchmark (the scale benchmark's, a GROUP BY a
private key, a join with a public table), under the (L0, C) contract.

The Spark benchmark's ratios are only fair if both sides compute the same numbers; the benchmark
checks it on every run, and this test checks it on a small version of its data (the same
generator: some units hold hundreds of rows in several regions, so L0 and C both bind, also on
the join's three zones).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from spark_fixtures import SOCKET_WARNINGS, spark  # noqa: F401  (the session-scoped fixture)

from dpsql.policy import load_policy
from dpsql.session.session import Session

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
pytestmark = [pytest.mark.spark, *SOCKET_WARNINGS]


def _load(name: str) -> ModuleType:
    sys.path.insert(0, str(BENCH))  # spark_scale.py imports scale.py and queries.py beside it
    spec = importlib.util.spec_from_file_location(f"dpsql_benchmark_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being created
    spec.loader.exec_module(module)
    return module


B = _load("spark_scale")


@pytest.fixture(scope="module")
def session(
    spark: Any,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Any]:
    path = B.data_file(tmp_path_factory.mktemp("spark_scale"), 5_000)
    # No settings of its own: the engine runs on the test run's local Spark (the fixture's).
    # One policy with the public table for every query (the benchmark adds it to the join's).
    ours = Session(load_policy(B.spark_policy(path, conf={}, regions=True)))
    ours.engine.salt = B.SALT  # the hand SQL's salt
    spark.read.parquet(str(path)).createOrReplaceTempView("visits")
    spark.read.parquet(str(B.regions_file(path))).createOrReplaceTempView("regions")
    try:
        yield ours
    finally:
        ours.close()


@pytest.mark.parametrize("name", [q.name for q in B.QUERIES])
def test_hand_spark_sql_returns_dpsql_totals(
    spark: Any,  # noqa: F811
    session: Any,
    name: str,
) -> None:
    query = next(q for q in B.QUERIES if q.name == name)
    plan = session.plan(query.sql)
    assert tuple(m.spec.kind for m in plan.measurements) == query.kinds
    _, ours = session.engine.run(plan.engine_sql)
    hand = [tuple(r) for r in spark.sql(B.hand_spark(query, B.Bounds(salt=B.SALT))).collect()]
    assert B.totals(hand, len(query.keys)) == B.totals(ours, len(query.keys))


def test_the_data_makes_l0_and_c_bind(spark: Any, session: Any) -> None:  # noqa: F811
    row = spark.sql(
        "SELECT MAX(n), COUNT_IF(n > 10), MAX(g), COUNT_IF(g > 2) FROM (SELECT user_id, "
        "COUNT(*) AS n, COUNT(DISTINCT region) AS g FROM visits GROUP BY user_id)"
    ).collect()[0]
    biggest, over_c, most_groups, over_l0 = row
    assert biggest > 100 and over_c > 0 and most_groups == 5 and over_l0 > 0
    zones, over_l0 = spark.sql(
        "SELECT MAX(g), COUNT_IF(g > 2) FROM (SELECT user_id, COUNT(DISTINCT zone) AS g "
        f"FROM {B.JOIN} GROUP BY user_id)"
    ).collect()[0]
    assert zones == 3 and over_l0 > 0


def test_the_new_queries_have_private_keys(session: Any) -> None:
    """dpsql runs partition selection on them (the measured distinct-unit counts), and their
    hand SQL returns the groups that kept units have, not a public domain."""
    for name in ("private_key_age", "join_zone"):
        query = next(q for q in B.QUERIES if q.name == name)
        assert name in B.DEFAULT_QUERIES
        assert all(k.domain is None for k in query.keys)
        assert session.plan(query.sql).measurements[-1].spec.kind == "units"
