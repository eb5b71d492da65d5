"""The policy's [engine] section: Spark's fields apply to Spark only, its master is a master,
and the settings the guarantees depend on cannot be changed (docs/engines.md)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dpsql.policy_engine import SPARK_PINNED, EngineSpec


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
