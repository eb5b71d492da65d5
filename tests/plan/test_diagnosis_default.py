"""The diagnosis by default: a fresh query under a policy that leaves ``budget.diagnose`` as it
is releases its diagnosis, charged as a line of its own at ``budget.diagnose_share`` of the
query's epsilon; the policy's switch and ``SET dpsql.diagnose = off`` leave it out; a cached
repeat serves it again for nothing; the advice names the bound to raise and the estimate to run;
a sample is left undiagnosed rather than refused; a workload family still shares.

The policies here are written without the ``diagnose`` key (``_policy``), so what is tested is
the default a data owner gets, not the suite's ``TINY_BUDGET`` (which turns it off).
"""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import TINY_BUDGET, TINY_COLUMNS, TINY_REGIONS, examples, write_parquet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpsql.errors import BoundsError, PolicyError, UnsupportedQueryError
from dpsql.interfaces.cli.main import cli
from dpsql.mechanisms.laplace_events import DiscreteLaplace
from dpsql.plan.diagnosis import LABEL, share_of
from dpsql.policy import Policy, load_policy
from dpsql.session.session import Session
from dpsql.session.workload_plan import plan_workload
from dpsql.sql.split import split_statements

COUNT = "SELECT COUNT(*) AS n FROM visits"
BY_REGION = "SELECT region, COUNT(*) AS n, AVG(spend) AS a FROM visits GROUP BY region"


def _rows(units: int, heavy: int, seed: int = 0) -> list[tuple[Any, ...]]:
    """``units`` units in the five regions; the first ``heavy`` have 9 rows in one region (more
    than C = 4), the others 2."""
    rows = []
    for u in range(units):
        for r in range(9 if u < heavy else 2):
            rows.append((u, TINY_REGIONS[(u + seed) % 5], 20 + (u * 7 + r) % 50, float(r * 3 % 90)))
    return rows


def _policy(tmp_path: Path, rows: list[tuple[Any, ...]], **budget: Any) -> Policy:
    """A policy as an owner writes it: no ``diagnose`` key unless given in ``budget``."""
    path = tmp_path / f"visits_{len(list(tmp_path.glob('*.parquet')))}.parquet"
    write_parquet(path, rows, (("user_id", "BIGINT"), ("region", "VARCHAR"), ("age", "INTEGER"),
                               ("spend", "DOUBLE")))  # fmt: skip
    spec = {k: v for k, v in TINY_BUDGET.items() if k != "diagnose"}
    return load_policy(
        {
            "dataset": {"id": "diag", "data_version": "1"},
            "data": {"tables": {"visits": str(path)}},
            "budget": {**spec, **budget},
            "tables": {
                "visits": {
                    "privacy_unit": "user_id",
                    "max_groups_per_unit": 2,
                    "max_rows_per_unit_per_group": 4,
                    "columns": TINY_COLUMNS,
                }
            },
        },
        base_dir=tmp_path,
    )


def test_a_fresh_query_carries_its_diagnosis_by_default(tmp_path: Path) -> None:
    policy = _policy(tmp_path, _rows(200, 80))
    assert policy.budget.diagnose and policy.budget.diagnose_share == Fraction(1, 10)
    s = Session(policy)
    result = s.execute(COUNT)
    assert result.diagnosis is not None
    # One charge: the query's epsilon 1 and the diagnosis's tenth of it.
    assert s.budget().epsilon_spent == Fraction(11, 10)
    assert result.plan is not None and result.plan.event.events[-1].label == LABEL
    assert result.plan.event.events[-1] == DiscreteLaplace(Fraction(10), Fraction(1), dimensions=1)
    # 40% of the units have more than C = 4 rows: the advice names C and the estimate to run.
    summary = result.diagnosis.summary()
    assert "C: " in summary and "raise max_rows_per_unit_per_group" in summary
    assert summary.endswith("or run ESTIMATE BOUNDS FOR visits")


def test_the_explain_shows_the_diagnosis_s_line_before_anything_is_charged(tmp_path: Path) -> None:
    s = Session(_policy(tmp_path, _rows(100, 10), diagnose_share="0.25"))
    lines = [line for (line,) in s.execute(f"EXPLAIN {BY_REGION}").rows]
    assert s.budget().epsilon_spent == 0
    line = next(x for x in lines if x.startswith("diagnosis: epsilon"))
    assert line.startswith("diagnosis: epsilon 0.25 (budget.diagnose_share 0.25 of the query's")
    assert "cost: epsilon 1.25, delta 0 (the diagnosis's epsilon 0.25 included)" in lines
    assert lines.index(line) < lines.index(next(x for x in lines if x.startswith("cost:")))
    s.execute(BY_REGION)
    assert s.budget().epsilon_spent == Fraction(5, 4)


def test_a_cached_repeat_serves_the_diagnosis_again_for_nothing(tmp_path: Path) -> None:
    s = Session(_policy(tmp_path, _rows(150, 30)))
    first = s.execute(BY_REGION)
    spent = s.budget().epsilon_spent
    again = s.execute(BY_REGION)
    assert s.budget().epsilon_spent == spent and again.cached_from is not None
    assert again.diagnosis == first.diagnosis and again.rows == first.rows


def test_the_policy_switch_and_the_setting_turn_it_off(tmp_path: Path) -> None:
    rows = _rows(100, 20)
    off = Session(_policy(tmp_path, rows, diagnose=False))
    assert off.execute(COUNT).diagnosis is None
    assert off.budget().epsilon_spent == 1
    # The analyst may still ask under a policy that has it off.
    asked = off.execute(COUNT, diagnose=True)
    assert asked.diagnosis is not None and off.budget().epsilon_spent == Fraction(21, 10)
    s = Session(_policy(tmp_path, rows))
    s.execute("SET dpsql.diagnose = off")
    assert s.execute(COUNT).diagnosis is None and s.budget().epsilon_spent == 1
    lines = [line for (line,) in s.execute(f"EXPLAIN {COUNT}").rows]
    assert not any(x.startswith("diagnosis") for x in lines)


def test_the_diagnosis_settings_leave_the_policy_version_alone(tmp_path: Path) -> None:
    rows = _rows(10, 0)
    versions = {
        _policy(tmp_path, rows).version,
        _policy(tmp_path, rows, diagnose=False).version,
        _policy(tmp_path, rows, diagnose_share="0.5").version,
    }
    # Only the data path differs between the files: compare with the same file.
    base = _policy(tmp_path, rows)
    same = base.model_copy(update={"budget": base.budget.model_copy(update={"diagnose": False})})
    assert same.version == base.version and len(versions) == 3


@pytest.mark.parametrize("share", ["0", "-0.1", "1.5", "abc"])
def test_a_bad_share_is_refused_by_the_policy(tmp_path: Path, share: str) -> None:
    with pytest.raises(PolicyError, match="diagnose_share"):
        _policy(tmp_path, _rows(5, 0), diagnose_share=share)


def test_a_sample_is_not_diagnosed_by_default_and_refused_when_asked(tmp_path: Path) -> None:
    s = Session(_policy(tmp_path, _rows(300, 30)))
    sampled = "SELECT COUNT(*) AS n FROM visits TABLESAMPLE BERNOULLI (50 PERCENT)"
    result = s.execute(sampled)
    assert result.diagnosis is None and result.plan is not None and result.plan.diagnosis is None
    spent = s.budget().epsilon_spent
    s.execute("SET dpsql.diagnose = on")
    with pytest.raises(UnsupportedQueryError, match="not diagnosed"):
        s.execute(sampled)
    assert s.budget().epsilon_spent == spent


def test_the_pld_filter_diagnoses_with_its_declared_mechanism_or_not_at_all(tmp_path: Path) -> None:
    pld = {
        "accountant": "pld",
        "declared_mechanism": {"kind": "discrete_laplace", "scale": "80", "sensitivity": 8},
    }
    rows = _rows(100, 10)
    s = Session(_policy(tmp_path, rows, **pld))
    plan = s.plan(COUNT)
    assert plan.diagnosis is not None and plan.event.events[-1].label == LABEL
    assert len(plan.event.events) == 2  # the count and the diagnosis, both declared noise
    off = Session(_policy(tmp_path, rows, diagnose=False, **pld))
    assert off.plan(COUNT).diagnosis is None and len(off.plan(COUNT).event.events) == 1


def test_clamped_values_are_advised_a_wider_bound(tmp_path: Path) -> None:
    rows = [(u, "east", 30, 500.0 if u % 2 else 10.0) for u in range(400)]
    s = Session(_policy(tmp_path, rows))
    summary = s.execute("SELECT SUM(spend) AS s FROM visits").diagnosis
    assert summary is not None
    text = summary.summary()
    assert "clamped: " in text and "widen the bounds of the aggregated columns" in text
    assert "ESTIMATE BOUNDS FOR visits.<column>" in text


def test_a_workload_family_still_shares_under_the_default(tmp_path: Path) -> None:
    """Statements of one grouping form a family; its members are answered from the family's
    measurements, with no diagnosis of their own; a statement outside it keeps its own."""
    text = (
        "SET dpsql.other_group = on;\n"
        "SELECT COUNT(*) AS n FROM visits;\n"
        "SELECT region, COUNT(*) AS n FROM visits GROUP BY region;\n"
        "SELECT region, SUM(spend) AS s, AVG(spend) AS a FROM visits GROUP BY region;\n"
        "SELECT region, STDDEV(spend) AS sd FROM visits GROUP BY region;\n"
    )
    rows = _rows(300, 30)
    plans = []
    sessions = [Session(_policy(tmp_path, rows, diagnose=False)), Session(_policy(tmp_path, rows))]
    for session in sessions:
        workload = plan_workload(session, split_statements(text))
        assert workload.event is not None
        plans.append((workload.joint.families, workload.event.epsilon, workload.steps))
    (families, epsilon, _), (default_families, default_epsilon, steps) = plans
    assert len(families) == 1 and len(default_families) == 1
    # The statements by region share; the total is answered on its own, with its diagnosis.
    assert default_epsilon == epsilon + Fraction(1, 10)
    queries = [step for step in steps if step.kind == "query"]
    assert [step.family is not None for step in queries] == [False, True, True, True]
    assert [step.plan is not None and step.plan.diagnosis is not None for step in queries] == [
        True,
        False,
        False,
        False,
    ]
    # Run: one charge, what the plan said; the lone statement's answer carries its diagnosis.
    ran = sessions[1].run_script(text)
    assert sessions[1].budget().epsilon_spent == default_epsilon
    answers = [result for step, result in ran if step.kind == "query"]
    assert answers[0] is not None and answers[0].diagnosis is not None
    assert all(r is not None and r.diagnosis is None for r in answers[1:])


@settings(max_examples=examples(40), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    epsilon=st.fractions(min_value=Fraction(1, 10**9), max_value=20),
    share=st.fractions(min_value=Fraction(1, 10**4), max_value=1),
)
def test_the_share_is_never_rounded_up(epsilon: Fraction, share: Fraction) -> None:
    d = share_of(epsilon, share)
    assert 0 < d <= epsilon * share
    assert d.denominator <= 10**6 or d >= epsilon * share * Fraction(999_99, 100_000)


def test_bounds_dpsql_estimated_need_no_diagnosis_by_default(tmp_path: Path) -> None:
    """A query whose every flagged bound is an estimate (ESTIMATE BOUNDS) is not diagnosed by
    default; one with a bound the analyst set, or asked for a diagnosis, is."""
    policy = _policy(tmp_path, _rows(300, 30))
    tables = dict(policy.tables)
    tables["visits"] = tables["visits"].model_copy(
        update={"max_groups_per_unit": None, "max_rows_per_unit_per_group": None}
    )
    s = Session(policy.model_copy(update={"tables": tables}))
    s.execute("ESTIMATE BOUNDS FOR visits GROUP BY region")
    query = "SELECT region, COUNT(*) AS n FROM visits GROUP BY region"
    assert s.plan(query).diagnosis is None
    assert s.plan(query, max_rows_per_unit_per_group=3).diagnosis is not None
    assert s.plan(query, diagnose=True).diagnosis is not None
    # A clamp the policy declares is a bound dpsql did not choose.
    assert s.plan("SELECT region, SUM(spend) AS s FROM visits GROUP BY region").diagnosis
    spent = s.budget().epsilon_spent
    assert s.execute(query).diagnosis is None
    assert s.budget().epsilon_spent == spent + 1


def test_dpsql_run_takes_the_policy_s_default_or_its_flag(tmp_path: Path) -> None:
    """``dpsql run`` plans the default diagnosis of the example policy, and none with
    ``--no-diagnose`` (the plan's per-statement epsilon says which)."""
    examples = Path(__file__).resolve().parents[2] / "examples"
    text = (examples / "policy.toml").read_text(encoding="utf-8")
    data = (examples / "data" / "visits.parquet").as_posix()
    example = tmp_path / "policy.toml"
    example.write_text(
        text.replace('"data/visits.parquet"', f'"{data}"') + '\n[ledger]\npath = "v.ledger"\n',
        encoding="utf-8",
    )
    sql = tmp_path / "q.sql"
    sql.write_text("SELECT COUNT(*) AS n FROM visits;\n", encoding="utf-8")
    runner = CliRunner()
    assert runner.invoke(cli, ["--policy", str(example), "init"]).exit_code == 0
    by_default = runner.invoke(cli, ["--policy", str(example), "run", "--plan", str(sql)])
    assert by_default.exit_code == 0, by_default.output
    assert re.search(r"query\s+0\.55\s+0\s+charge", by_default.output), by_default.output
    off = runner.invoke(cli, ["--policy", str(example), "run", "--plan", "--no-diagnose", str(sql)])
    assert off.exit_code == 0, off.output
    assert re.search(r"query\s+0\.5\s+0\s+charge", off.output), off.output


def test_a_release_without_a_diagnosis_serves_the_default_one_free(tmp_path: Path) -> None:
    """A default diagnosis is never a reason to charge what the cache answers: the same query
    released undiagnosed is served again, free, and EXPLAIN-like lookups say so."""
    s = Session(_policy(tmp_path, _rows(150, 30)))
    s.execute("SET dpsql.diagnose = off")
    first = s.execute(BY_REGION)
    spent = s.budget().epsilon_spent
    s.execute("RESET dpsql.diagnose")
    plan = s.plan(BY_REGION)
    assert plan.diagnosis is not None and s.served_from(plan) is not None
    again = s.execute(BY_REGION)
    assert again.cached_from is not None and again.diagnosis is None
    assert again.rows == first.rows and s.budget().epsilon_spent == spent
    # Asked for explicitly, a diagnosis is a fresh release, charged.
    asked = s.execute(BY_REGION, diagnose=True)
    assert asked.diagnosis is not None and s.budget().epsilon_spent > spent


def test_a_diagnosis_whose_noise_cannot_be_sampled_is_refused_before_the_charge(
    tmp_path: Path,
) -> None:
    """An epsilon so small that the diagnosis's discrete Laplace cannot be drawn exactly is
    refused when planned (EXPLAIN too), with nothing charged and the ledger as it was."""
    s = Session(_policy(tmp_path, _rows(50, 5)))
    s.execute("SET dpsql.diagnose_epsilon = 0.00000000000000000001")
    records = len(s.filter.store.records())
    for sql in (COUNT, f"EXPLAIN {COUNT}"):
        with pytest.raises(BoundsError, match="diagnosis of the bounds would be too large"):
            s.execute(sql)
    assert s.budget().epsilon_spent == 0 and len(s.filter.store.records()) == records
