"""Shared fixtures. Other test files may rely on exactly what is documented here.

``tiny_policy`` (function-scoped fixture) is a factory::

    policy = tiny_policy(rows, max_groups=2, max_rows=10, columns=None, schema=None,
                         budget=None)

It writes ``rows`` (a list of tuples, in ``schema`` order) to a fresh Parquet file in the
test's ``tmp_path`` and returns a ``dpsql.policy.Policy`` with one private table ``visits``
(privacy unit ``user_id``, ``max_groups_per_unit`` = ``max_groups``,
``max_rows_per_unit_per_group`` = ``max_rows``). Defaults:

- ``schema`` = ``TINY_SCHEMA``: user_id BIGINT, region VARCHAR, age INTEGER, spend DOUBLE
  (the columns of ``examples/data/visits.parquet`` without ``day``);
- ``columns`` = ``TINY_COLUMNS``: age in [18, 90], spend in [0, 200], region with public values
  ``TINY_REGIONS`` ("central", "east", "north", "south", "west"); a ``columns`` dict replaces
  it entirely (values are the policy's column specs, e.g. ``{"lower": "-0.3", ...}``);
- ``budget`` = ``TINY_BUDGET``: epsilon 10, delta 1e-6, query_epsilon 1, query_delta 1e-8
  (written as decimal text, so each is an exact rational), and no diagnosis by default
  (``diagnose = false``: the tests of other features charge their own loss alone; the
  diagnosis's tests turn it on); a dict given is merged over it.

Each call writes a new file, so one test may build several policies.

Hypothesis runs under a profile: ``quick`` in ``make test``, ``long`` with ``DPSQL_FUZZ=long``
(``make test-long``), which also lengthens the hand-rolled fuzzers that read it. A test sizes
its examples with ``examples(n)``: n under the quick profile, ``LONG_FACTOR`` times n under the
long one, so that one flag deepens every property test at once.

``fixed_noise`` (function-scoped fixture) replaces the operating system's randomness by one
SHAKE-256 stream, for a test that pins what a noisy release does (its charge, its cache, its
use) rather than the noise's quality: the sparse-vector walks of ``ESTIMATE BOUNDS`` stop a rung
or more off about once in 1,000 runs, which a range assertion on fresh noise would see as a
failure (``test_bounds_advice.py`` measures the estimates' quality on fresh noise).

``adds_up(parent, children)`` asserts that published counts are consistent as least squares
makes them, given that each is shown at 0 or above when published (docs/reading.md): the
children add up to the parent where none of them was shown as 0, else to at least the parent.

Every test marked ``spark`` runs in one process of the parallel run (``xdist_group``): one
local Spark, whose JVM takes seconds to start, serves them all.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import settings

from dpsql.policy import Policy, load_policy

TINY_SCHEMA: tuple[tuple[str, str], ...] = (
    ("user_id", "BIGINT"),
    ("region", "VARCHAR"),
    ("age", "INTEGER"),
    ("spend", "DOUBLE"),
)
TINY_REGIONS = ("central", "east", "north", "south", "west")
TINY_COLUMNS: dict[str, dict[str, Any]] = {
    "age": {"lower": 18, "upper": 90},
    "spend": {"lower": 0, "upper": 200},
    "region": {"public_values": list(TINY_REGIONS)},
}
TINY_BUDGET: dict[str, Any] = {
    "diagnose": False,
    "epsilon": "10",
    "delta": "0.000001",
    "query_epsilon": "1",
    "query_delta": "0.00000001",
}

TinyPolicy = Callable[..., Policy]

# -- profiles -----------------------------------------------------------------------------------

LONG = os.environ.get("DPSQL_FUZZ") == "long"
LONG_FACTOR = 10
settings.register_profile("quick", deadline=None)
settings.register_profile("long", deadline=None, max_examples=100 * LONG_FACTOR)
settings.load_profile("long" if LONG else "quick")


def adds_up(parent: float, children: Sequence[float]) -> None:
    """Published counts of a consistent release (module docstring)."""
    tolerance = 1e-9 * max(1.0, abs(parent)) + 1e-6
    if all(c > 0 for c in children):
        assert abs(parent - sum(children)) <= tolerance, (parent, children)
    else:
        assert sum(children) >= parent - tolerance, (parent, children)


@pytest.fixture
def fixed_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operating system's randomness as one fixed SHAKE-256 stream (module docstring)."""
    state = {"counter": 0}

    def urandom(n: int) -> bytes:
        state["counter"] += 1
        return hashlib.shake_256(f"dpsql-bounds-{state['counter']}".encode()).digest(n)

    monkeypatch.setattr(os, "urandom", urandom)


def examples(n: int) -> int:
    """A property test's examples: ``n`` under the quick profile, ``LONG_FACTOR`` times more
    under the long one (module docstring)."""
    return n * LONG_FACTOR if LONG else n


# The files whose tests take longest in all (make test's durations), run first, longest first:
# two workers then end together (longest processing time first) rather than one running a
# long test alone at the end. Whole files move, so a module's fixtures are built once per
# worker as before; every other file keeps its place.
SLOW_FILES = (
    "tests/docs/test_docs_blocks.py",
    "tests/sql/test_function_totality.py",
    "tests/privacy/test_neighbours.py",
    "tests/privacy/test_privacy_breadth_statistical.py",
    "tests/interfaces/test_hostile_parameters.py",
    "tests/release/test_quantile_intervals.py",
    "tests/interfaces/test_server.py",
    "tests/session/test_hostile.py",
    "tests/interfaces/test_io_failures.py",
    "tests/plan/test_sample.py",
)


def _rank(item: pytest.Item) -> int:
    if item.get_closest_marker("spark") is not None:
        return -1  # the Spark group is the longest unit of all (a fifth of the suite): first
    path = item.nodeid.split("::", 1)[0]
    return SLOW_FILES.index(path) if path in SLOW_FILES else len(SLOW_FILES)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups off the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # One worker runs every Spark test, so one JVM serves them all (module docstring).
    for item in items:
        if item.get_closest_marker("spark") is not None:
            item.add_marker(pytest.mark.xdist_group("spark"))
    items.sort(key=_rank)  # stable: the order within a file, and of the others, is kept


_ARROW_TYPES = {
    "BIGINT": pa.int64(),
    "INTEGER": pa.int32(),
    "SMALLINT": pa.int16(),
    "DOUBLE": pa.float64(),
    "REAL": pa.float32(),
    "VARCHAR": pa.string(),
    "BOOLEAN": pa.bool_(),
    "DATE": pa.date32(),
}


def write_parquet(
    path: Path, rows: Sequence[tuple[Any, ...]], schema: Sequence[tuple[str, str]]
) -> None:
    """Write ``rows`` with column names and DuckDB types ``schema`` to a Parquet file."""
    if all(dtype.upper() in _ARROW_TYPES for _, dtype in schema):
        columns = {
            name: pa.array([r[i] for r in rows], type=_ARROW_TYPES[dtype.upper()])
            for i, (name, dtype) in enumerate(schema)
        }
        pq.write_table(pa.table(columns), path)
        return
    con = duckdb.connect(":memory:")  # other types: slower, but any DuckDB type works
    try:
        columns_sql = ", ".join(f'"{name}" {dtype}' for name, dtype in schema)
        con.execute(f"CREATE TABLE t ({columns_sql})")
        if rows:
            marks = ", ".join("?" for _ in schema)
            con.executemany(f"INSERT INTO t VALUES ({marks})", [list(r) for r in rows])
        con.execute(f"COPY t TO '{path}' (FORMAT PARQUET)")
    finally:
        con.close()


def policy_over(
    path: Path,
    *,
    max_groups: int,
    max_rows: int,
    columns: Mapping[str, Mapping[str, Any]] | None = None,
    budget: Mapping[str, Any] | None = None,
    dataset_id: str = "tiny",
) -> Policy:
    """The tiny policy over the Parquet file ``path`` (its folder the policy's base)."""
    return load_policy(
        {
            "dataset": {"id": dataset_id, "data_version": "1"},
            "data": {"tables": {"visits": str(path)}},
            "budget": {"diagnose": False, **TINY_BUDGET, **(budget or {})},
            "tables": {
                "visits": {
                    "privacy_unit": "user_id",
                    "max_groups_per_unit": max_groups,
                    "max_rows_per_unit_per_group": max_rows,
                    "columns": {
                        k: dict(v)
                        for k, v in (TINY_COLUMNS if columns is None else columns).items()
                    },
                }
            },
        },
        base_dir=path.parent,
    )


def durable_policy(folder: Path, data: Path, budget: str, table: str = "") -> Path:
    """A policy file over one ``visits`` file with a ledger beside it (one row per unit:
    L0 = C = 1), for tests that run the real CLI: ``budget`` holds the [budget] lines, ``table``
    more lines of [tables.visits] sections."""
    path = folder / "policy.toml"
    path.write_text(
        f"""
[dataset]
id = "durable"
data_version = "1"

[data]
tables = {{ visits = "{data}" }}

[budget]
diagnose = false
{budget}

[tables.visits]
privacy_unit = "user_id"
max_groups_per_unit = 1
max_rows_per_unit_per_group = 1
{table}

[ledger]
path = "durable.ledger"
""",
        encoding="utf-8",
    )
    return path


@pytest.fixture
def tiny_policy(tmp_path: Path) -> TinyPolicy:
    counter = itertools.count()

    def make(
        rows: Sequence[tuple[Any, ...]],
        *,
        max_groups: int = 2,
        max_rows: int = 10,
        columns: Mapping[str, Mapping[str, Any]] | None = None,
        schema: Sequence[tuple[str, str]] | None = None,
        budget: Mapping[str, Any] | None = None,
    ) -> Policy:
        path = tmp_path / f"visits_{next(counter)}.parquet"
        write_parquet(path, rows, schema or TINY_SCHEMA)
        return policy_over(
            path, max_groups=max_groups, max_rows=max_rows, columns=columns, budget=budget
        )

    return make
