"""Overrides on the record: a query's bounds that differ from the policy's are kept with its
charge, and shown with the analyst's name by the shell's ``\\ledger``, ``dpsql budget
--overrides`` and the report's audit section (JSON, Markdown and HTML)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from conftest import TINY_REGIONS, TinyPolicy, durable_policy, write_parquet

from dpsql.interfaces.cli import main as cli
from dpsql.interfaces.report.report import build_report
from dpsql.session.session import Session

ROWS = [(u, TINY_REGIONS[u % 5], 20 + u % 50, float(u % 7)) for u in range(120)]


def _overrides(session: Session) -> list[Any]:
    """The overrides of each charge of the session's ledger, in order (None: none kept)."""
    records = session.pipeline.budget.store.records()
    return [r.payload.get("overrides") for r in records if r.kind == "charge"]


def test_each_bound_that_differs_is_kept_with_its_source(tiny_policy: TinyPolicy) -> None:
    session = Session(tiny_policy(ROWS, max_groups=2, max_rows=10), "ann")
    session.execute("SELECT region, COUNT(*) FROM visits GROUP BY region")  # the policy's own
    session.execute("SET dpsql.max_groups_per_unit = 2")  # the policy's value: no override
    session.execute("SELECT region, SUM(age) FROM visits GROUP BY region")
    session.execute("SET dpsql.max_groups_per_unit = 4")
    session.execute("SET dpsql.max_rows_per_unit = 12")
    session.execute("SET dpsql.split = even")
    session.execute("SELECT region, COUNT(*), AVG(age) FROM visits GROUP BY region")
    session.execute("SELECT COUNT(*) FROM visits", max_rows_per_unit_per_group=3)
    session.execute("RESET dpsql.split")
    session.execute("SELECT SUM(spend) FROM visits", mechanism="gaussian", delta="0.0000001")
    first, second, third, fourth, fifth = _overrides(session)
    assert first is None and second is None
    assert third == [
        {"bound": "L0", "of": "visits", "policy": "2", "session": "4", "source": "session"},
        {"bound": "R", "of": "visits", "policy": "none", "session": "12", "source": "session"},
        {"bound": "split", "policy": "min_max_ratio", "session": "even", "source": "session"},
    ]
    # No GROUP BY: L0 bounds nothing, and is not said to differ.
    assert [o["bound"] for o in fourth] == ["C", "R", "split"]
    assert fourth[0] == {"bound": "C", "of": "visits", "policy": "10", "session": "3",
                         "source": "session"}  # fmt: skip
    assert fifth[-1] == {"bound": "mechanism", "policy": "laplace", "session": "gaussian",
                         "source": "session"}  # fmt: skip


def test_an_estimate_filling_an_undeclared_clamp_is_named_as_such(
    tiny_policy: TinyPolicy,
) -> None:
    policy = tiny_policy(ROWS, columns={"spend": {}, "region": {"public_values": ["east"]}})
    session = Session(policy, "ann")
    session.execute("ESTIMATE BOUNDS FOR visits.spend", epsilon="4")
    session.execute("SELECT COUNT(*) FROM visits")  # reads no clamped column: nothing differs
    session.execute("SELECT SUM(spend) FROM visits")
    *_, count, total = _overrides(session)
    assert count is None
    (clamp,) = total
    assert (clamp["bound"], clamp["of"], clamp["policy"], clamp["source"]) == (
        "clamps",
        "visits.spend",
        "none",
        "estimate",
    )
    assert clamp["session"].startswith("[") and clamp["session"].endswith("]")


def test_auto_bounds_and_a_batch_file_are_kept_too(tiny_policy: TinyPolicy) -> None:
    policy = tiny_policy(ROWS, columns={"region": {"public_values": ["east"]}})
    table = policy.tables["visits"].model_copy(update={"max_rows_per_unit_per_group": None})
    session = Session(policy.model_copy(update={"tables": {"visits": table}}), "ann")
    session.execute("SELECT COUNT(*) FROM visits", bounds="auto")
    (auto,) = _overrides(session)[-1]
    assert auto["bound"] == "auto" and auto["policy"] == "declared" and "R" in auto["session"]
    session.run_script(
        "SET dpsql.max_rows_per_unit_per_group = 4;\n"
        "SELECT COUNT(*) FROM visits WHERE age > 30;\n"
        "SELECT COUNT(age) FROM visits WHERE age > 40;\n"
    )
    batch = _overrides(session)[-1]
    assert batch == [
        {"bound": "C", "of": "visits", "policy": "none", "session": "4", "source": "session",
         "statement": str(n)}
        for n in (2, 3)
    ]  # fmt: skip


def _ledgered(tmp_path: Path) -> Path:
    data = tmp_path / "visits.parquet"
    write_parquet(
        data,
        [(u, TINY_REGIONS[u % 5], 20 + u % 50, float(u % 7)) for u in range(300)],
        (("user_id", "BIGINT"), ("region", "VARCHAR"), ("age", "INTEGER"), ("spend", "DOUBLE")),
    )
    policy = durable_policy(
        tmp_path,
        data,
        "epsilon = 5",
        "[tables.visits.columns.age]\nlower = 0\nupper = 100\n"
        '[tables.visits.columns.region]\npublic_values = ["central", "east", "north", "south", '
        '"west"]\n',
    )
    runner = CliRunner()
    assert (
        runner.invoke(cli.cli, ["--policy", str(policy), "--analyst", "own", "init"]).exit_code == 0
    )
    shell = runner.invoke(
        cli.cli,
        ["--policy", str(policy), "--analyst", "ann", "shell"],
        input="SET dpsql.max_groups_per_unit = 3;\n"
        "SELECT region, SUM(age) AS s FROM visits GROUP BY region;\n"
        "\\ledger 3\n",
    )
    assert shell.exit_code == 0, shell.output
    squashed = re.sub(r"[\s│]+", " ", shell.stdout)  # the table's wrapped cells, read in order
    assert "differs from the policy: L0 of visits 3 (policy 1)" in squashed
    plain = runner.invoke(
        cli.cli, ["--policy", str(policy), "query", "SELECT COUNT(*) FROM visits"]
    )
    assert plain.exit_code == 0, plain.output
    return policy


def test_the_owner_sees_who_overrode_what(tmp_path: Path) -> None:
    policy = _ledgered(tmp_path)
    runner = CliRunner()
    for args in (["budget", "--overrides"], ["budget", "show", "--overrides"]):
        shown = runner.invoke(cli.cli, ["--policy", str(policy), *args])
        assert shown.exit_code == 0, shown.output
        tail = shown.stdout.split("Overrides of the policy's bounds:\n", 1)[1]
        assert "by ann: L0 of visits 3 (policy 1)" in tail
        assert "SELECT region, SUM(age) AS s FROM visits GROUP BY region" in tail
        assert "1 charge(s) by no named analyst, epsilon 0.1 in all" in tail
    plain = runner.invoke(cli.cli, ["--policy", str(policy), "budget"])
    assert "Overrides" not in plain.stdout
    misplaced = runner.invoke(
        cli.cli, ["--policy", str(policy), "budget", "--overrides", "what-if", "--epsilon", "1",
                  "--queries", "2"]
    )  # fmt: skip
    assert misplaced.exit_code == 2
    markdown = runner.invoke(cli.cli, ["--policy", str(policy), "report"]).stdout
    audit = markdown.split("## Audit", 1)[1].split("## Release schedule", 1)[0]
    assert (
        "| ann | SELECT region, SUM(age) AS s FROM visits GROUP BY region | L0 of visits 3" in audit
    )
    assert "Charges by no named analyst: 1, epsilon 0.1 in all" in audit


def test_the_report_keeps_them_in_its_json_and_schedule(tiny_policy: TinyPolicy) -> None:
    policy = tiny_policy(ROWS)
    session = Session(policy, "bea")
    session.execute("SELECT region, COUNT(*) FROM visits GROUP BY region", max_groups_per_unit=5)
    data = build_report(policy, session.pipeline.budget)
    (entry,) = data["audit"]["overrides"]
    assert entry["analyst"] == "bea" and entry["overrides"][0]["bound"] == "L0"
    charge = next(e for e in data["schedule"] if e["kind"] == "charge")
    assert charge["overrides"] == entry["overrides"]
    assert data["audit"]["unnamed_charges"] == 0
