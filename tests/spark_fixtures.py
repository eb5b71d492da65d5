"""The Spark session of the Spark tests: one per pytest run (a session-scoped fixture), local
with two cores, with the settings dpsql pins for Spark (ANSI mode, the UTC session time zone, no
UI; ``dpsql.policy.spec.SPARK_PINNED``).

A test module uses it by importing the fixture (``from spark_fixtures import spark``) and marks
its tests ``@pytest.mark.spark``. Without pyspark or without Java the tests are skipped, saying
which is missing. The helpers below run one SQL text on each engine over the same Parquet files
and put the rows in one comparable form.

Logging is switched off: Spark's logs and PySpark's error logger quote SQL text and data values.
In the default profile adaptive query execution is off and the JVM compiles with its quick
compiler only (each halves the time of these many small queries); ``DPSQL_SPARK_FULL=1`` runs
with both as a production session would have them.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import shutil
from collections.abc import Iterable, Iterator, Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import pytest

from dpsql.engine.duckdb.connections import DISABLED_OPTIMIZERS
from dpsql.policy.engine import SPARK_PINNED

FULL = os.environ.get("DPSQL_SPARK_FULL") == "1"
# PySpark reads a result over a local socket that it leaves to the garbage collector: the
# ResourceWarning that raises there is PySpark's, not dpsql's (a test module's pytestmark).
SOCKET_WARNINGS = [
    pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning"),
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning"
    ),
]


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark", reason="pyspark is not installed")
    if shutil.which("java") is None:
        pytest.skip("Spark needs Java: no java on PATH")
    sql = importlib.import_module("pyspark.sql")
    builder = sql.SparkSession.builder.master("local[2]").appName("dpsql-tests")
    for key, value in SPARK_PINNED.items():
        builder = builder.config(key, value)
    builder = (
        builder.config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.adaptive.enabled", "true" if FULL else "false")
    )
    if not FULL:
        # The JVM's quick compiler only: for a short run of many small queries it halves the
        # CPU the JVM spends (compiling, not answering); no result depends on it.
        builder = builder.config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("OFF")
    # PySpark logs a failed query's text (and the values it quotes) through this logger.
    logging.getLogger("SQLQueryContextLogger").disabled = True
    yield session
    session.stop()


def normalise(value: Any) -> Any:
    """A result value in one form for both engines: a DECIMAL of scale 0 (Spark's HUGEINT) is
    an int, a map a sorted tuple of pairs, a list or row a tuple, NaN a marker (NaN != NaN)."""
    if isinstance(value, Decimal):
        exponent = value.as_tuple().exponent
        return int(value) if isinstance(exponent, int) and exponent >= 0 else value
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, dict):
        return tuple(sorted((normalise(k), normalise(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(normalise(v) for v in value)
    return value


def sorted_rows(rows: Iterable[Sequence[Any]]) -> list[tuple[Any, ...]]:
    """Rows as a sorted list of normalised tuples (neither engine orders a result)."""
    return sorted((tuple(normalise(v) for v in row) for row in rows), key=repr)


def register(session: Any, tables: Mapping[str, Path]) -> None:
    """The tables as Spark temporary views over the same Parquet files DuckDB reads."""
    for name, path in tables.items():
        session.read.parquet(str(path)).createOrReplaceTempView(name)


def spark_rows(session: Any, sql: str, salt: int) -> list[tuple[Any, ...]]:
    """Spark SQL run with the salt bound as :salt, as the Spark engine binds it."""
    return [tuple(row) for row in session.sql(sql, args={"salt": salt}).collect()]


def duck_rows(tables: Mapping[str, Path], sql: str, salt: int) -> list[tuple[Any, ...]]:
    """DuckDB SQL over the same files, the salt bound as $salt, as the DuckDB engine binds it,
    with the optimizers the engine runs without (a NaN in a Parquet file is NaN only without
    the files' statistics)."""
    con = duckdb.connect(":memory:", config={"disabled_optimizers": DISABLED_OPTIMIZERS})
    try:
        for name, path in tables.items():
            con.execute(f"CREATE VIEW \"{name}\" AS SELECT * FROM read_parquet('{path}')")
        return con.execute(sql, {"salt": salt} if "$salt" in sql else None).fetchall()
    finally:
        con.close()
