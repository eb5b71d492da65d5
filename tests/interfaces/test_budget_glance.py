"""The budget at a glance: every budget screen leads with one line (the deciding filter's spent
and left, and the analyst's share); the other accountants fold under one "compare theorems"
line; an unbounded figure is spelled one way everywhere; what-if takes real queries (a batch
file, query templates) and counts the rounds the deciding filter would actually admit."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from conftest import TINY_REGIONS, durable_policy, write_parquet

from dpsql.accounting.budget.report import UNBOUNDED
from dpsql.errors import BudgetExceededError
from dpsql.interfaces.cli import main as cli
from dpsql.session.session import Session

SCHEMA = (("user_id", "BIGINT"), ("region", "VARCHAR"), ("age", "INTEGER"), ("spend", "DOUBLE"))
TABLE = (
    "[tables.visits.columns.age]\nlower = 0\nupper = 100\n"
    f"[tables.visits.columns.region]\npublic_values = {json.dumps(list(TINY_REGIONS))}\n"
)
OTHER_SPELLINGS = ("∞", " inf", "n/a", "—")  # in an accountant's row


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    data = tmp_path / "visits.parquet"
    rows = [(u, TINY_REGIONS[u % 5], 20 + u % 50, float(u % 7)) for u in range(200)]
    write_parquet(data, rows, SCHEMA)
    budget = 'epsilon = 1\n[budget.analysts.ann]\nepsilon = "0.6"\n'
    path = durable_policy(tmp_path, data, budget, TABLE)
    assert _run(path, "--analyst", "own", "init").exit_code == 0
    with _session(path) as session:
        session.execute("SELECT COUNT(*) FROM visits", epsilon="0.1")
    return path


@contextlib.contextmanager
def _session(policy: Path) -> Iterator[Session]:
    session = Session(policy, "ann")
    try:
        yield session
    finally:
        session.close()


def _records(policy: Path) -> list[tuple[int, str]]:
    with _session(policy) as session:
        return [(r.seq, r.kind) for r in session.pipeline.budget.store.records()]


def _run(policy: Path, *args: str) -> Result:
    return CliRunner().invoke(cli.cli, ["--policy", str(policy), *args])


LEAD = re.compile(
    r"^analyst ann: epsilon 0\.1 spent of their share 0\.6 \(0\.5 left\), .*; "
    r"dataset durable: epsilon 0\.1 spent of 1 \(0\.9 left\), .* basic composition "
    r"decides"
)


def test_every_budget_screen_leads_with_the_same_line(policy: Path) -> None:
    screens = {
        "budget": _run(policy, "--analyst", "ann", "budget"),
        "show": _run(policy, "--analyst", "ann", "budget", "show", "--compare"),
        "what-if": _run(
            policy, "--analyst", "ann", "budget", "what-if", "--epsilon", "0.1", "--queries", "3"
        ),
        "what-if --query": _run(
            policy,
            "--analyst",
            "ann",
            "budget",
            "what-if",
            "--query",
            "SELECT COUNT(*) FROM visits WHERE age > ?",
        ),
        "shell": _run(policy, "--analyst", "ann", "shell"),
    }
    shell = CliRunner().invoke(
        cli.cli, ["--policy", str(policy), "--analyst", "ann", "shell"], input="\\budget\n"
    )
    screens["shell"] = shell
    for name, result in screens.items():
        assert result.exit_code == 0, (name, result.output)
        text = result.stdout
        if name == "shell":  # after the prompt; the terminal's width wraps the one line
            text = re.sub(r"\s*\n\s*", " ", text.split("> ", 1)[1])
        assert LEAD.match(text), (name, text[:300])
    with _session(policy) as session:
        shown = session.execute("SHOW dpsql.budget").rows[0][0]
    assert LEAD.match(shown)
    # The report, for the owner, with no analyst: the data set's part of the same line.
    report = _run(policy, "report").stdout
    assert "## Budget\n\ndataset durable: epsilon 0.1 spent of 1 (0.9 left)" in report


def test_the_other_theorems_fold_under_one_line(policy: Path) -> None:
    folded = _run(policy, "budget").stdout
    assert "compare theorems: --compare reads the same history under advanced" in folded
    assert "rdp" in folded and "│" not in folded  # named on the line, no table
    unfolded = _run(policy, "budget", "--compare").stdout
    for name in ("basic", "advanced", "optimal", "rdp", "zcdp", "gdp", "pld"):
        assert re.search(rf"│ {name}\s+│", unfolded), name
    shell = CliRunner().invoke(
        cli.cli,
        ["--policy", str(policy), "--analyst", "ann", "shell"],
        input="\\budget\n\\budget compare\n\\budget everything\n",
    )
    out = shell.stdout
    assert "compare theorems: \\budget compare reads" in out
    assert re.search(r"│ pld\s+│", out)
    assert "\\budget takes nothing, or compare" in out


def test_an_unbounded_figure_has_one_spelling_everywhere(policy: Path) -> None:
    # gdp proves nothing for discrete Laplace noise: its figure is unbounded.
    texts = [
        _run(policy, "budget", "--compare").stdout,
        _run(policy, "report").stdout,
        _run(policy, "report", "--format", "html").stdout,
        _run(
            policy, "budget", "what-if", "--query", "SELECT SUM(age) FROM visits", "--compare"
        ).stdout,
    ]
    document = json.loads(_run(policy, "report", "--format", "json").stdout)
    gdp = next(f for f in document["accounting"]["figures"] if f["accountant"] == "gdp")
    assert gdp["epsilon"] == UNBOUNDED
    for text in texts:
        assert UNBOUNDED in text
        figures = [line for line in text.splitlines() if "gdp" in line or "pld" in line]
        assert figures
        for other in OTHER_SPELLINGS:
            assert not any(other in line for line in figures), (other, figures)


def test_what_if_counts_the_rounds_the_filter_would_admit(policy: Path, tmp_path: Path) -> None:
    batch = tmp_path / "month.sql"
    batch.write_text(
        "SELECT COUNT(*) FROM visits;\n"  # released by the fixture: free
        "SELECT region, SUM(age) AS s FROM visits GROUP BY region;\n"
        "SELECT AVG(age) FROM visits WHERE region = 'east';\n",
        encoding="utf-8",
    )
    template = "SELECT COUNT(*) FROM visits WHERE age > ?"
    before = _records(policy)
    out = _run(
        policy, "--analyst", "ann", "budget", "what-if", "--file", str(batch), "--query", template
    )
    assert out.exit_code == 0, out.output
    assert _records(policy) == before  # nothing charged, nothing recorded
    assert (
        "month.sql: epsilon 0.2, delta 0 (3 statement(s): 2 charged, 1 served free)" in out.stdout
    )
    assert (
        f"{template}: epsilon 0.1, delta 0 (a fresh answer; a template of 1 parameter" in out.stdout
    )
    found = re.search(r"admits (\d+) round\(s\) from now", out.stdout)
    assert found is not None, out.stdout
    # ann's share leaves 0.5: one round is 0.3, so one round fits, and the refusal says why.
    assert found.group(1) == "1" and "over their share" not in out.stdout
    # The count is what the filter does: charge rounds for real (the file's two charged
    # statements and the template, each fresh) until it refuses.
    charged = [s for s in batch.read_text(encoding="utf-8").split(";\n")[1:] if s.strip()]
    admitted = 0
    with _session(policy) as session:
        try:
            for k in range(10):
                for sql in charged:
                    session.execute(sql, fresh=True)
                session.execute(template, [k], fresh=True)
                admitted += 1
        except BudgetExceededError:
            pass
    assert admitted == int(found.group(1))
    refused = _run(policy, "--analyst", "ann", "budget", "what-if", "--query", template)
    assert "admits 0 round(s) from now" in refused.stdout and "over their share" in refused.stdout
    free = _run(policy, "--analyst", "ann", "budget", "what-if", "--file", str(batch))
    assert "3 served free" in free.stdout and "every answer is released already" in free.stdout


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (("--epsilon", "0.1", "--query", "SELECT COUNT(*) FROM visits"), 2),
        (
            (
                "--epsilon",
                "0.1",
            ),
            2,
        ),  # --queries is required for a hypothetical one
        (("--query", "SELECT nope FROM visits"), 3),
        (("--query", "DELETE FROM visits"), 3),
        (("--file", "/nonexistent/x.sql"), 2),
        (("--query", "SELECT COUNT(*) FROM visits", "--chart", "x.svg"), 2),
    ],
)
def test_what_if_refuses_what_it_cannot_plan(
    policy: Path, args: tuple[str, ...], code: int
) -> None:
    result = _run(policy, "budget", "what-if", *args)
    assert result.exit_code == code, result.output
