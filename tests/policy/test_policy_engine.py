"""The policy's [engine] section: Spark's fields apply to Spark only, its master is a master,
and the settings the guarantees depend on cannot be changed (docs/engines.md)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dpsql.policy.engine import SPARK_PINNED, EngineSpec
from dpsql.policy.spec import Policy


def test_a_spark_engine_with_its_settings() -> None:
    spec = EngineSpec(name="spark", master="local[2]", conf={"spark.sql.shuffle.partitions": "8"})
    assert (spec.name, spec.master, spec.remote) == ("spark", "local[2]", None)
    assert EngineSpec().name == "duckdb"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"master": "local[2]"}, "apply to name"),  # a Spark field on DuckDB
        ({"name": "spark", "master": "file:///etc"}, "Spark master"),
        ({"name": "spark", "master": "local[2] --conf x"}, "Spark master"),
        ({"name": "spark", "master": "local[2]", "remote": "sc://h:15002"}, "not both"),
        ({"name": "spark", "conf": {"ansi": "true"}}, "spark.<name>"),
        ({"name": "spark", "conf": {"spark.x": "y" * 1001}}, "1,000"),
    ],
)
def test_invalid_engine_fields_are_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        EngineSpec.model_validate(fields)


@pytest.mark.parametrize("name", sorted(SPARK_PINNED))
def test_a_pinned_setting_may_only_be_repeated(name: str) -> None:
    with pytest.raises(ValidationError, match="pinned"):
        EngineSpec(name="spark", conf={name: "something else"})
    EngineSpec(name="spark", conf={name: SPARK_PINNED[name].upper()})  # its own value: fine


def _policy(data: dict[str, object], engine: dict[str, object]) -> dict[str, object]:
    return {
        "dataset": {"id": "d"},
        "data": data,
        "budget": {"diagnose": False, "epsilon": "1", "query_epsilon": "0.1"},
        "tables": {"visits": {"privacy_unit": "user_id", "max_rows_per_unit_per_group": 1}},
        "engine": engine,
    }


def test_catalog_tables_are_spark_s_and_named_plainly() -> None:
    spark = {"name": "spark", "master": "local[2]"}
    policy = Policy.model_validate(_policy({"catalog": {"visits": "lake.web.visits"}}, spark))
    assert policy.data.catalog == {"visits": "lake.web.visits"}
    with pytest.raises(ValidationError, match=r"engine\.name"):
        Policy.model_validate(_policy({"catalog": {"visits": "lake.visits"}}, {}))
    for bad in ("lake.visits; DROP", "`x`", "a.b.c.d", "lake..visits", ""):
        with pytest.raises(ValidationError, match="must name a table"):
            Policy.model_validate(_policy({"catalog": {"visits": bad}}, spark))
    with pytest.raises(ValidationError, match="new plain SQL identifier"):
        both = {"tables": {"visits": "v.parquet"}, "catalog": {"visits": "lake.visits"}}
        Policy.model_validate(_policy(both, spark))
