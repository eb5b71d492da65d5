"""``budget.require_analyst``: only a named analyst is answered, fresh or from the cache, with or
without shares; an unnamed connection is refused before anything is charged or recorded. The
real CLI takes the name from ``--analyst`` or ``DPSQL_ANALYST``."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import TINY_REGIONS, TinyPolicy, durable_policy

import dpsql
from dpsql.errors import BudgetExceededError
from dpsql.interfaces.cli import main as cli
from dpsql.session.session import Session

ROWS = [(u, TINY_REGIONS[u % 5], 20 + u % 50, float(u % 7)) for u in range(200)]


def test_an_unnamed_connection_gets_no_answer(tiny_policy: TinyPolicy) -> None:
    policy = tiny_policy(ROWS, budget={"require_analyst": True})
    anonymous = Session(policy)
    for sql in ("SELECT COUNT(*) FROM visits", "EXPLAIN SELECT COUNT(*) FROM visits"):
        if sql.startswith("EXPLAIN"):
            anonymous.execute(sql)  # planning answers nothing and charges nothing: allowed
            continue
        with pytest.raises(BudgetExceededError, match="named analysts only"):
            anonymous.execute(sql)
    with pytest.raises(BudgetExceededError, match="named analysts only"):
        anonymous.run_script("SELECT COUNT(*) FROM visits;")
    with pytest.raises(BudgetExceededError, match="named analysts only"):
        anonymous.execute("ESTIMATE BOUNDS FOR visits.age")
    assert anonymous.budget().epsilon_spent == 0
    assert [r.kind for r in anonymous.pipeline.budget.store.records()] == [
        r.kind for r in Session(policy).pipeline.budget.store.records()
    ]  # nothing recorded beyond what a new session holds
    # Named, without any share: admitted.
    assert Session(policy, "bob").execute("SELECT SUM(age) FROM visits").charge is not None


def test_the_budget_refuses_an_unnamed_charge_too(tiny_policy: TinyPolicy) -> None:
    """Defence in depth: the filter itself, whatever calls it."""
    policy = tiny_policy(ROWS, budget={"require_analyst": True})
    session = Session(policy)
    plan = session.plan("SELECT COUNT(*) FROM visits")
    with pytest.raises(BudgetExceededError, match="named analysts only"):
        session.pipeline.budget.charge(plan.event, "q", None, {})
    assert session.budget().epsilon_spent == 0


def test_it_does_not_change_the_policy_version(tiny_policy: TinyPolicy) -> None:
    """It changes who is answered, never an answer: cached releases keep their keys."""
    policy = tiny_policy(ROWS)
    named = policy.model_copy(
        update={"budget": policy.budget.model_copy(update={"require_analyst": True})}
    )
    assert named.budget.require_analyst and named.version == policy.version


def test_the_cli_takes_the_name_from_its_option_or_the_environment(
    tiny_policy: TinyPolicy, tmp_path: Path
) -> None:
    data = tiny_policy(ROWS).data.tables["visits"]
    budget = "epsilon = 5\nquery_epsilon = 0.5\nrequire_analyst = true"
    path = durable_policy(tmp_path, data, budget)
    runner = CliRunner()
    assert runner.invoke(cli.cli, ["--policy", str(path), "init"]).exit_code == 0
    query = ["query", "SELECT COUNT(*) FROM visits"]
    refused = runner.invoke(cli.cli, ["--policy", str(path), *query])
    assert refused.exit_code == 4, (refused.output, refused.stderr)  # BudgetExceededError
    assert "named analysts only" in refused.stderr
    assert (
        runner.invoke(cli.cli, ["--policy", str(path), "--analyst", "ann", *query]).exit_code == 0
    )
    # Ann's answer is cached now: an unnamed connection is refused it all the same.
    again = runner.invoke(cli.cli, ["--policy", str(path), *query])
    assert again.exit_code == 4 and "named analysts only" in again.stderr
    from_env = runner.invoke(cli.cli, ["--policy", str(path), *query], env={"DPSQL_ANALYST": "bob"})
    assert from_env.exit_code == 0, from_env.stderr
    with dpsql.connect(path, analyst="carl") as conn:  # the DB-API names it with analyst=
        conn.cursor().execute("SELECT COUNT(*) FROM visits")
    with dpsql.connect(path) as conn, pytest.raises(dpsql.OperationalError):
        conn.cursor().execute("SELECT COUNT(*) FROM visits")
