"""The first hour with the example data: ``make demo`` creates the durable example's ledger with
the owner command, after which every command works on it; ``explain`` works before that (it
charges nothing and needs no ledger), and nothing but ``dpsql init`` creates a ledger."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from dpsql.interfaces.cli import main as cli
from dpsql.mechanisms.events import describe
from dpsql.mechanisms.laplace_events import DiscreteLaplace

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "durable.toml"
DATA = ROOT / "examples" / "data" / "visits.parquet"
QUERY = "SELECT region, COUNT(*) AS n FROM visits GROUP BY region"


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    """The shipped durable example, its data and ledger paths made absolute in a copy."""
    if not DATA.exists():
        pytest.skip("run `make demo` (or examples/make_data.py) to create the example data")
    text = EXAMPLE.read_text(encoding="utf-8")
    text = text.replace('"data/visits.parquet"', f'"{DATA}"')
    text = text.replace('"data/visits.ledger"', f'"{tmp_path / "visits.ledger"}"')
    path = tmp_path / "durable.toml"
    path.write_text(text, encoding="utf-8")
    return path


def dpsql(policy: Path, *args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(cli.cli, ["--policy", str(policy), *args], input=stdin)


def test_explain_works_before_the_ledger_exists_and_creates_none(
    policy: Path, tmp_path: Path
) -> None:
    out = dpsql(policy, "explain", QUERY)
    assert out.exit_code == 0, out.stderr
    # The query's epsilon 0.5 and, by default, its diagnosis's tenth of it.
    assert "cost: epsilon 0.55, delta 0 (the diagnosis's epsilon 0.05 included)" in out.stdout
    assert "no ledger yet (dpsql init creates it)" in out.stdout
    assert not (tmp_path / "visits.ledger").exists()
    # The commands that spend or report need the ledger, and say how to make one.
    for args in (("query", QUERY), ("budget",)):
        refused = dpsql(policy, *args)
        assert refused.exit_code != 0 and "dpsql init" in refused.stderr, refused.stderr
    assert not (tmp_path / "visits.ledger").exists()


def test_after_init_every_command_works(policy: Path, tmp_path: Path) -> None:
    created = dpsql(policy, "init")
    assert created.exit_code == 0, created.stderr
    answered = dpsql(policy, "query", QUERY)
    assert answered.exit_code == 0, answered.stderr
    assert any(x.startswith("charged epsilon 0.55, delta 0") for x in answered.stdout.splitlines())
    assert "diagnosis: bounds cut" in answered.stdout
    sql = tmp_path / "q.sql"
    sql.write_text(f"{QUERY};\nSELECT AVG(spend) AS mean FROM visits;\n", encoding="utf-8")
    ran = dpsql(policy, "run", str(sql))
    assert ran.exit_code == 0, ran.stderr
    assert "cache (release" in ran.stdout  # the first statement: served again, free
    report = dpsql(policy, "budget")
    assert report.exit_code == 0, report.stderr
    assert "epsilon 1.1 spent of 10" in report.stdout
    explained = dpsql(policy, "explain", QUERY)
    assert explained.exit_code == 0 and "cache: served from release" in explained.stdout
    assert "no ledger yet" not in explained.stdout


def test_the_example_policy_without_a_ledger_still_explains() -> None:
    if not DATA.exists():
        pytest.skip("needs the example data")
    out = dpsql(ROOT / "examples" / "policy.toml", "explain", QUERY)
    assert out.exit_code == 0, out.stderr
    assert "the policy has no [ledger]" in out.stdout


def test_make_demo_creates_the_ledger_with_the_owner_command() -> None:
    """The Makefile's rule for the durable example's ledger is ``dpsql ... init`` (a dry run)."""
    done = subprocess.run(
        ["make", "-n", "-W", "examples/data/visits.parquet", "examples/data/visits.ledger"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if "visits.ledger' is up to date" in done.stdout:
        return  # created by an earlier make demo
    assert "dpsql --policy examples/durable.toml init" in done.stdout, done.stdout + done.stderr


def test_the_shell_on_the_durable_example_in_a_terminal(policy: Path, tmp_path: Path) -> None:
    """As after ``make demo``: ``dpsql --policy ... shell`` in a terminal spends from the example's
    ledger, and what it spent is there for ``dpsql budget`` after it quits."""
    pexpect = pytest.importorskip("pexpect")
    assert dpsql(policy, "init").exit_code == 0
    executable = Path(sys.executable).parent / "dpsql"
    env = {**os.environ, "TERM": "dumb"}
    child = pexpect.spawn(
        str(executable), ["--policy", str(policy), "shell", "--no-history"],
        env=env, encoding="utf-8", timeout=60, dimensions=(40, 160),
    )  # fmt: skip
    try:
        child.expect(re.escape("dpsql (eps 0/10)> "))
        child.send(QUERY + ";\r")
        child.expect(r"central\s+│\s+\d+ ± \d+")
        child.expect(re.escape("charged epsilon 0.55, delta 0"))
        child.expect(re.escape("dpsql (eps 0.55/10)> "))
        child.send(QUERY + ";\r")  # the same text again: from the ledger's cache, free
        child.expect(re.escape("served from the cache"))
        child.expect(re.escape("dpsql (eps 0.55/10)> "))
        child.send("\\ledger\r")
        child.expect("release")
        child.expect(re.escape("dpsql (eps 0.55/10)> "))
        child.send("\\quit\r")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, child.before
    report = dpsql(policy, "budget")
    assert report.exit_code == 0 and "epsilon 0.55 spent of 10" in report.stdout, report.stdout


def test_mechanisms_and_labels_are_in_decimals(policy: Path) -> None:
    """EXPLAIN and the report name a mechanism's parameters as decimals (0.25, never 1/4)."""
    out = dpsql(policy, "explain", "SELECT MEDIAN(age) AS m, COUNT(*) AS n FROM visits")
    assert out.exit_code == 0, out.stderr
    assert 'QUANTILE("age", 0.5)' in out.stdout
    assert describe(DiscreteLaplace(scale=Fraction(5, 2), sensitivity=Fraction(1))) == (
        "DiscreteLaplace(scale=2.5, L1=1)"
    )
    assert "(exactly 1/3)" in describe(DiscreteLaplace(Fraction(1, 3), Fraction(1)))
