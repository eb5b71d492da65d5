"""Refusals that say what to do: the largest epsilon that would fit now (a dry run of the
filter, nothing recorded), whether a released answer exists (never whose), who can add
budget; ``dpsql explain`` says when a query would be refused; a piped shell whose query is
refused exits with the refusal's code."""

from __future__ import annotations

import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import TINY_REGIONS, TinyPolicy, durable_policy
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsql.errors import BudgetExceededError
from dpsql.interfaces.cli import main as cli
from dpsql.session.advice import fitting_epsilon
from dpsql.session.session import Session

ROWS = [(u, TINY_REGIONS[u % 5], 20 + u % 50, float(u % 7)) for u in range(200)]


@settings(max_examples=50, deadline=None)
@given(st.fractions(Fraction(1, 100), Fraction(5)), st.fractions(Fraction(1, 10), Fraction(5)))
def test_the_fitting_epsilon_fits_and_the_next_step_does_not(
    left: Fraction, asked: Fraction
) -> None:
    """Against a filter that admits up to ``left``: the figure fits, is within 2 significant
    digits of the boundary, and None exactly when not even a thousandth of the ask fits."""
    fits = fitting_epsilon(asked, lambda e: e <= left)
    if asked / 1000 > left:
        assert fits is None
        return
    assert fits is not None and fits <= left and fits < asked
    assert fits >= min(left, asked) * Fraction(89, 100)  # two digits, rounded down


def test_a_refusal_names_the_epsilon_that_fits_a_cached_answer_and_the_owner(
    tiny_policy: TinyPolicy,
) -> None:
    session = Session(tiny_policy(ROWS, budget={"epsilon": "1"}), "ann")
    session.execute("SELECT COUNT(*) FROM visits", epsilon=0.6)
    before = len(session.pipeline.budget.store.records())
    with pytest.raises(BudgetExceededError) as refused:
        session.execute("SELECT COUNT(*) FROM visits", epsilon=0.6, fresh=True)
    message = str(refused.value)
    assert "nothing was charged; the largest epsilon that fits now is 0.4 " in message
    assert "a released answer to this query exists: asked without fresh, it is free" in message
    assert "ann" not in message  # whose answer it is: never said
    assert message.endswith("the data owner can add budget (dpsql budget add)")
    assert len(session.pipeline.budget.store.records()) == before  # the dry runs record nothing
    # What it says fits does fit, and is then charged as any query.
    assert session.execute("SELECT SUM(age) FROM visits", epsilon=0.4).charge is not None
    with pytest.raises(BudgetExceededError, match="no epsilon fits now"):
        session.execute("SELECT SUM(age) FROM visits WHERE age > 30", epsilon=0.1)


def test_explain_says_when_a_query_would_be_refused(
    tiny_policy: TinyPolicy, tmp_path: Path
) -> None:
    path = _durable(tiny_policy, tmp_path)
    runner = CliRunner()
    assert runner.invoke(cli.cli, ["--policy", str(path), "init"]).exit_code == 0
    base = ["--policy", str(path), "--analyst", "ann"]
    fits = runner.invoke(cli.cli, [*base, "explain", "SELECT COUNT(*) FROM visits"])
    assert fits.exit_code == 0 and "would be refused" not in fits.stdout
    big = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon = 1.5) SUM(age) FROM visits"
    refused = runner.invoke(cli.cli, [*base, "explain", big])
    assert refused.exit_code == 0, refused.stderr
    assert "budget: it would be refused now: this query (epsilon 1.5" in refused.stdout


def test_a_piped_shell_whose_query_is_refused_exits_non_zero(
    tiny_policy: TinyPolicy, tmp_path: Path
) -> None:
    path = _durable(tiny_policy, tmp_path)
    assert CliRunner().invoke(cli.cli, ["--policy", str(path), "init"]).exit_code == 0
    script = (
        "SELECT COUNT(*) FROM visits;\n"
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon = 0.9) SUM(age) FROM visits;\n"
        "SELECT AVG(age) FROM visits;\n"
    )
    command = [sys.executable, "-m", "dpsql.interfaces.shell.shell", "--policy", str(path)]
    done = subprocess.run(
        command, check=False, input=script, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 4, (done.stdout, done.stderr)  # BudgetExceededError's code
    assert done.stdout.count("charged epsilon") == 2  # the statements after it still ran
    ok = subprocess.run(
        command,
        check=False,
        input="SELECT COUNT(*) FROM visits;\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr


def _durable(tiny_policy: TinyPolicy, tmp_path: Path) -> Path:
    data = tiny_policy(ROWS).data.tables["visits"]
    age = "[tables.visits.columns.age]\nlower = 18\nupper = 90"
    return durable_policy(tmp_path, data, "epsilon = 1\nquery_epsilon = 0.25", age)
