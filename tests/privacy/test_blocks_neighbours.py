"""Neighbours on a table made of blocks: one more unit, with rows in several blocks (and rows
its blocks' periods exclude), moves every bounded total by at most the plan's sensitivity.

The table is one scan of every block's files, each row kept only within its own block's
period (``dpsql.engine.duckdb.views.block_source``): a row-level filter, so a unit's rows in
every block are one unit's, bounded together. D and D' hold the same blocks; D' adds the unit's
rows to each block's file. Checked as tests/privacy/test_neighbours.py checks the plain table
(``_check``: per group, per measurement, L0 groups, the L1 and L2 sensitivities).
"""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import TINY_BUDGET, TINY_COLUMNS, examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_neighbours import _check

from dpsql.policy import Policy, load_policy
from dpsql.session.blocks import register
from dpsql.session.session import Session

MONTHS = [(dt.date(2026, m, 1), dt.date(2026, m + 1, 1)) for m in (1, 2, 3)]
REGIONS = ["central", "east", "north", "south", "west"]
QUERIES = [
    "SELECT region, COUNT(*) AS n, SUM(spend) AS s FROM visits GROUP BY region",
    "SELECT region, COUNT(*) AS n FROM visits WHERE day < DATE '2026-03-01' GROUP BY region",
    "SELECT COUNT(*), AVG(spend) FROM visits WHERE day >= '2026-02-01'",
    "SELECT region, COUNT(DISTINCT user_id) FROM visits GROUP BY region",
]
Row = tuple[int, str, float, dt.date]


def _policy(folder: Path, periods: dict[str, Any] | None = None) -> Policy:
    """The policy; with ``periods``, a person-within-period unit on visits."""
    raw: dict[str, Any] = {
        "dataset": {"id": "blocks-neighbours"},
        "data": {"blocks": {"visits": {"period": "day"}}},
        "budget": {"diagnose": False, **TINY_BUDGET, "epsilon": "100"},
        "tables": {"visits": {
            "privacy_unit": "user_id", "max_groups_per_unit": 2,
            "max_rows_per_unit_per_group": 3,
            "columns": {k: dict(v) for k, v in TINY_COLUMNS.items()},
        }},
    }  # fmt: skip
    if periods is not None:
        raw["periods"] = periods
    return load_policy(raw, base_dir=folder)


def _session(
    folder: Path, months: list[list[Row]], capped: bool, periods: dict[str, Any] | None = None
) -> Session:
    session = Session(_policy(folder, periods))
    if capped:
        session.set_option("max_rows_per_unit", 4)
    for i, rows in enumerate(months):
        path = folder / f"m{i}.parquet"
        table = pa.table({
            "user_id": pa.array([r[0] for r in rows], pa.int64()),
            "region": pa.array([r[1] for r in rows], pa.string()),
            "age": pa.array([30] * len(rows), pa.int32()),
            "spend": pa.array([r[2] for r in rows], pa.float64()),
            "day": pa.array([r[3] for r in rows], pa.date32()),
        })  # fmt: skip
        pq.write_table(table, path)
        start, end = MONTHS[i]
        register(session.policy, session.filter.store, "visits", f"m{i}",
                 period=(start.isoformat(), end.isoformat()), paths=[path])  # fmt: skip
    return session


def _base(seed: int = 5) -> list[list[Row]]:
    rng = random.Random(seed)
    return [
        [(rng.randrange(30), rng.choice(REGIONS), rng.uniform(0, 200),
          start + dt.timedelta(days=rng.randrange(28))) for _ in range(80)]
        for start, _ in MONTHS
    ]  # fmt: skip


@st.composite
def unit_rows(draw: st.DrawFn) -> list[list[Row]]:
    """One new unit's rows in each block's file: in its period, or (for some) outside it."""
    out = []
    for start, _ in MONTHS:
        rows = []
        for _ in range(draw(st.integers(0, 6))):
            offset = draw(st.integers(-40, 40))  # outside the period for some
            region = draw(st.sampled_from([*REGIONS, "elsewhere"]))
            rows.append((999, region, draw(st.floats(-10, 300)), start + dt.timedelta(offset)))
        out.append(rows)
    return out


@settings(max_examples=examples(25), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(unit=unit_rows(), sql=st.sampled_from(QUERIES), capped=st.booleans())
def test_one_more_unit_across_blocks_moves_every_total_by_at_most_the_sensitivity(
    tmp_path_factory: pytest.TempPathFactory, unit: list[list[Row]], sql: str, capped: bool
) -> None:
    base = _base()
    d = _session(tmp_path_factory.mktemp("d"), base, capped)
    d_prime = _session(
        tmp_path_factory.mktemp("d_prime"), [b + u for b, u in zip(base, unit, strict=True)], capped
    )
    try:
        plan = d.plan(sql)
        again = d_prime.plan(sql)  # binds the blocks registered
        assert again.engine_sql == plan.engine_sql and again.blocks == plan.blocks
        d_prime.engine.salt = d.engine.salt  # the same keyed hash picks every other unit's rows
        _, before = d.engine.run(plan.engine_sql)
        _, after = d_prime.engine.run(plan.engine_sql)
    finally:
        d.close()
        d_prime.close()
    _check(plan, before, after)
