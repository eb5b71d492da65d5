"""A policy with units through foreign keys (``unit_path``) over the wire: ``psql`` against
``dpsql serve``, and the shell's ``\\describe``; the DB-API is in
``tests/privacy/test_unit_paths.py``."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import write_parquet
from server_fixtures import ServerThread, psql, write_users

from dpsql.accounting.budget.build import budget_for
from dpsql.accounting.ledger.store import create_ledger, open_store
from dpsql.interfaces.report.report import build_report
from dpsql.interfaces.shell.core import Shell
from dpsql.policy import Policy, load_policy
from dpsql.session.session import Session


def _hospital(folder: Path) -> Policy:
    folder.mkdir(parents=True, exist_ok=True)
    write_parquet(
        folder / "patients.parquet", [(p,) for p in range(40)], (("patient_id", "BIGINT"),)
    )
    write_parquet(folder / "admissions.parquet", [(a, a % 40) for a in range(100)],
                  (("adm_id", "BIGINT"), ("patient_id", "BIGINT")))  # fmt: skip
    write_parquet(
        folder / "labs.parquet",
        [(i, i % 100, float(i % 9), ("hb", "na")[i % 2]) for i in range(600)],
        (("lab_id", "BIGINT"), ("adm_id", "BIGINT"), ("value", "DOUBLE"), ("test", "VARCHAR")),
    )
    tables = {t: str(folder / f"{t}.parquet") for t in ("patients", "admissions", "labs")}
    text = f"""
[dataset]
id = "hospital"
data_version = "1"

[data]
tables = {{ {", ".join(f"{k} = {json.dumps(v)}" for k, v in tables.items())} }}

[ledger]
path = {json.dumps(str(folder / "ledger.sqlite"))}

[budget]
diagnose = false
epsilon = "10"
query_epsilon = "0.5"

[tables.patients]
privacy_unit = "patient_id"
max_groups_per_unit = 2
max_rows_per_unit_per_group = 40

[tables.admissions]
unit_path = ["patient_id -> patients.patient_id"]
max_groups_per_unit = 2
max_rows_per_unit_per_group = 40

[tables.labs]
unit_path = ["adm_id -> admissions.adm_id", "patient_id -> patients.patient_id"]
max_groups_per_unit = 2
max_rows_per_unit_per_group = 40

[tables.labs.columns.test]
public_values = ["hb", "na"]

[tables.labs.columns.value]
lower = 0
upper = 10
"""
    path = folder / "policy.toml"
    path.write_text(text, encoding="utf-8")
    policy = load_policy(path)
    create_ledger(policy)
    return policy


def test_psql_queries_a_table_whose_unit_is_a_path(tmp_path: Path) -> None:
    policy = _hospital(tmp_path / "hospital")
    users = write_users(tmp_path / "users.json")
    script = (
        "SELECT test, COUNT(*) AS n FROM labs GROUP BY test ORDER BY test;\n"
        "SELECT COUNT(*) FROM labs JOIN admissions ON labs.adm_id = admissions.adm_id;\n"
        "SELECT COUNT(*) FROM labs l JOIN admissions a ON l.lab_id = a.adm_id;\n"
    )
    with ServerThread(policy, users) as server:
        out = psql(server.port, "alice", script, args=("-X", "-A", "-t"))
    lines = out.stdout.split()
    assert [line.split("|")[0] for line in lines[:2]] == ["hb", "na"], out.stdout
    assert int(lines[2]) > 0, out.stdout  # the join along the key, answered
    # The join off the key is refused with its reason, and the session goes on.
    assert "needs ON equality" in out.stderr and "foreign key" in out.stderr, out.stderr


def test_the_shell_describes_the_path_as_the_unit(tmp_path: Path) -> None:
    session = Session(_hospital(tmp_path / "hospital"))
    try:
        text = Shell(session).handle("\\describe labs")
    finally:
        session.close()
    assert "privacy unit through adm_id -> admissions.adm_id, then patient_id ->" in text


def test_the_report_states_adjacency_over_resolved_rows(tmp_path: Path) -> None:
    policy = _hospital(tmp_path / "hospital")
    data = build_report(policy, budget_for(policy.dataset.id, policy.budget, open_store(policy)))
    adjacency = data["adjacency"]
    assert "as resolved along the path" in adjacency["definition"]
    assert adjacency["privacy_units"]["labs"].startswith("through adm_id -> admissions.adm_id")
