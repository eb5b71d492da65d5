"""A join along the first link of a child's unit path (``dpsql.analyze.path_joins``): the child
is read as the table itself and the joined row takes the parent row's unit, only where the rest
of the child's path is the parent's own, in an inner join or a SEMI/ANTI join with the child on
the right. Elsewhere the child stays resolved and the units' equality is added. The neighbour
tests of these joins on data with duplicate, dangling and NULL keys are
``tests/privacy/test_unit_paths.py``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from conftest import write_parquet

from dpsql.policy import load_policy
from dpsql.session.session import Session

PATIENTS = [(1,), (2,), (3,)]
# Admission 10 is patient 1's, but its doctor is patient 2 (another path to a patient).
ADMISSIONS = [(10, 1, 2), (11, 2, 2), (12, 3, 1), (12, 3, 1)]  # 12 listed twice
LABS = [(100, 10), (101, 10), (102, 11), (103, 12), (104, None), (105, 99)]


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    folder = tmp_path_factory.mktemp("paths")
    write_parquet(folder / "patients.parquet", PATIENTS, (("patient_id", "BIGINT"),))
    write_parquet(
        folder / "admissions.parquet",
        ADMISSIONS,
        (("adm_id", "BIGINT"), ("patient_id", "BIGINT"), ("doctor_id", "BIGINT")),
    )
    write_parquet(folder / "labs.parquet", LABS, (("lab_id", "BIGINT"), ("adm_id", "BIGINT")))
    # "notes" hang off admissions like labs, but reach a patient through the doctor.
    write_parquet(folder / "notes.parquet", LABS, (("note_id", "BIGINT"), ("adm_id", "BIGINT")))
    caps: dict[str, Any] = {"max_groups_per_unit": 5, "max_rows_per_unit_per_group": 100}
    admissions = "adm_id -> admissions.adm_id"
    policy = load_policy(
        {
            "dataset": {"id": "paths"},
            "data": {
                "tables": {
                    t: str(folder / f"{t}.parquet")
                    for t in ("patients", "admissions", "labs", "notes")
                }
            },
            "budget": {"diagnose": False, "epsilon": "100", "query_epsilon": "1"},
            "tables": {
                "patients": {"privacy_unit": "patient_id", **caps},
                "admissions": {"unit_path": ["patient_id -> patients.patient_id"], **caps},
                "labs": {"unit_path": [admissions, "patient_id -> patients.patient_id"], **caps},
                "notes": {"unit_path": [admissions, "doctor_id -> patients.patient_id"], **caps},
            },
        }
    )
    s = Session(policy)
    yield s
    s.close()


def _total(session: Session, sql: str) -> tuple[int, str]:
    plan = session.plan(sql)
    (row,) = session.engine.run(plan.engine_sql)[1]
    return int(row[0] or 0), plan.engine_sql


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT COUNT(*) FROM labs l JOIN admissions a ON l.adm_id = a.adm_id",
        "SELECT COUNT(*) FROM admissions a JOIN labs l ON a.adm_id = l.adm_id",
        "SELECT COUNT(*) FROM labs l, admissions a WHERE a.adm_id = l.adm_id",
    ],
)
def test_the_child_takes_the_parent_row_s_unit(session: Session, sql: str) -> None:
    """Labs 100 and 101 meet admission 10, 102 meets 11, 103 meets each of the two rows of 12:
    five rows, as SQL over the tables pairs them; the labs' path is not joined again."""
    total, text = _total(session, sql)
    assert total == 5
    assert '"labs" AS "_j' in text  # the table itself, not its resolved path
    assert text.count('"patients"') == 1  # the admissions' path only


def test_a_semi_join_reads_the_child_as_it_is(session: Session) -> None:
    total, text = _total(
        session, "SELECT COUNT(*) FROM admissions a SEMI JOIN labs l ON l.adm_id = a.adm_id"
    )
    assert total == 4  # admissions 10, 11 and both rows of 12
    assert 'SEMI JOIN "labs"' in text


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        # The notes' path leaves admissions by the doctor, not by the admission's patient: the
        # resolved note and the admission pair only where the two patients are one. Admission
        # 11 (patient 2, doctor 2) pairs with its note; 10 (1 vs 2) and 12 (3 vs 1) do not.
        ("SELECT COUNT(*) FROM notes n JOIN admissions a ON n.adm_id = a.adm_id", 1),
        # A LEFT join may keep the child's row alone: it keeps its own resolved unit, and each
        # resolved lab row of 12 (two) meets both rows of 12: 1 + 1 + 1 + 4.
        ("SELECT COUNT(*) FROM labs l LEFT JOIN admissions a ON l.adm_id = a.adm_id", 7),
        # The child on the left of a SEMI join has no parent row to take a unit from; each
        # resolved lab row of 12 (two: the admission is listed twice) is kept.
        ("SELECT COUNT(*) FROM labs l SEMI JOIN admissions a ON l.adm_id = a.adm_id", 5),
    ],
)
def test_elsewhere_the_child_stays_resolved(session: Session, sql: str, expected: int) -> None:
    total, text = _total(session, sql)
    assert total == expected
    assert '"_j0"."_dpsql_unit" = "_j1"."_dpsql_unit"' in text  # the units' equality
