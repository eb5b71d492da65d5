"""A workload family's release derives answers only where it was made: the same data set,
policy version (so the same declared data version), blocks read and engine.

Found by the growing-data work: a file of statements answered as one family was served again
from the family's release after the owner declared a new ``data_version`` (release records of
single queries were keyed by it; the family's derivation matched on the statements alone).
"""

from __future__ import annotations

import random
from contextlib import closing
from pathlib import Path
from typing import Any

from conftest import TINY_BUDGET, TINY_COLUMNS, TINY_SCHEMA, write_parquet

from dpsql.accounting.ledger.store import create_ledger
from dpsql.policy import Policy, load_policy
from dpsql.session.session import Session
from dpsql.session.workload_plan import plan_workload
from dpsql.sql.split import split_statements

SCRIPT = "SET dpsql.other_group = on;\n" + "".join(
    f"SELECT region, {a} FROM visits GROUP BY region;\n"
    for a in ("COUNT(*) AS n", "SUM(spend) AS s, AVG(spend) AS a", "STDDEV(spend)")
)


def _policy(folder: Path, version: str) -> Policy:
    raw: dict[str, Any] = {
        "dataset": {"id": "scope", "data_version": version},
        "data": {"tables": {"visits": "v.parquet"}},
        "ledger": {"path": "scope.ledger"},
        "budget": {"diagnose": False, **TINY_BUDGET, "epsilon": "100"},
        "tables": {"visits": {
            "privacy_unit": "user_id", "max_groups_per_unit": 2,
            "max_rows_per_unit_per_group": 5,
            "columns": {k: dict(v) for k, v in TINY_COLUMNS.items()},
        }},
    }  # fmt: skip
    return load_policy(raw, base_dir=folder)


def test_a_new_data_version_is_answered_afresh(tmp_path: Path) -> None:
    rng = random.Random(1)
    regions = ["central", "east", "north", "south", "west"]
    rows = [(u, rng.choice(regions), 30, rng.uniform(0, 200)) for u in range(200) for _ in "ab"]
    write_parquet(tmp_path / "v.parquet", rows, TINY_SCHEMA)
    create_ledger(_policy(tmp_path, "1")).close()
    with closing(Session(_policy(tmp_path, "1"))) as session:
        session.run_script(SCRIPT)
        kinds = [r.kind for r in session.filter.store.records()]
        assert "family_release" in kinds
    with closing(Session(_policy(tmp_path, "1"))) as same:
        steps = plan_workload(same, split_statements(SCRIPT)).steps
        assert [s.source for s in steps] == ["free", "cache", "cache", "cache"]
    with closing(Session(_policy(tmp_path, "2"))) as refreshed:
        steps = plan_workload(refreshed, split_statements(SCRIPT)).steps
        assert [s.source for s in steps] == ["free", "charge", "charge", "charge"]
