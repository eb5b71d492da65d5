"""The ``dpsql`` command end to end, with click's CliRunner against real files in tmp_path.

Each test writes a policy whose ``[ledger]`` lives in its tmp_path and whose table is the example
data (examples/data/visits.parquet, by absolute path), runs ``dpsql init``, sends queries through
``dpsql.connect`` and reads the ledger back through the command: report, verify, export, and the
owner commands whose records change what later queries may spend.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import dpsql
from dpsql.accounting.ledger.chain import GENESIS, record_hash
from dpsql.accounting.ledger.ledger import Ledger
from dpsql.accounting.ledger.store import budget_caps
from dpsql.errors import (
    BudgetExceededError,
    EngineError,
    EntropyError,
    InternalError,
    LedgerError,
    ParameterError,
    ParseError,
    PolicyError,
)
from dpsql.interfaces.cli import main as cli
from dpsql.policy import load_policy
from dpsql.policy.numbers import exact

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "examples" / "data" / "visits.parquet"

POLICY = """
[dataset]
id = "visits-cli"
data_version = "v1"

[data]
tables = {{ visits = "{data}" }}

[budget]
diagnose = false
epsilon = 1.0
delta = 1e-6
query_epsilon = 0.25
query_delta = 1e-8
{extra_budget}

[tables.visits]
privacy_unit = "user_id"
max_groups_per_unit = 2
max_rows_per_unit_per_group = 10

[tables.visits.columns.age]
lower = 18
upper = 90

[tables.visits.columns.spend]
lower = 0
upper = 200

[tables.visits.columns.region]
public_values = ["central", "east", "north", "south", "west"]

[ledger]
path = "visits.ledger"
"""

QUERIES = (
    "SELECT COUNT(*) AS n FROM visits",
    "SELECT region, AVG(spend) AS mean FROM visits GROUP BY region",
    "SELECT SUM(age) AS s FROM visits WHERE spend > 10",
)


@pytest.fixture(autouse=True)
def _example_data() -> None:
    if not DATA.exists():
        pytest.skip("run `make demo` (or examples/make_data.py) to create the example data")


def write_policy(folder: Path, extra_budget: str = "") -> Path:
    path = folder / "policy.toml"
    path.write_text(POLICY.format(data=DATA, extra_budget=extra_budget), encoding="utf-8")
    return path


def run(policy: Path | None, *args: str, env: dict[str, str] | None = None) -> Result:
    prefix = ["--policy", str(policy)] if policy is not None else []
    return CliRunner().invoke(cli.cli, [*prefix, *args], env=env)


def assert_one_line_error(result: Result, code: int) -> str:
    assert result.exit_code == code, (result.exit_code, result.output, result.stderr)
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    return lines[0]


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    path = write_policy(tmp_path)
    result = run(path, "init")
    assert result.exit_code == 0, result.stderr
    return path


def ask(policy: Path, sql: str, analyst: str | None = None, **options: object) -> None:
    with dpsql.connect(policy, analyst=analyst) as conn:
        conn.cursor().execute(sql, **options)


def json_report(policy: Path) -> dict[str, Any]:
    result = run(policy, "report", "--format", "json")
    assert result.exit_code == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


# -- init -------------------------------------------------------------------------------------
def test_init_creates_the_ledger_and_refuses_to_do_it_twice(tmp_path: Path) -> None:
    path = write_policy(tmp_path)
    result = run(path, "init")
    assert result.exit_code == 0, result.stderr
    ledger = Ledger(tmp_path / "visits.ledger")
    assert ledger.identity["dataset"] == "visits-cli"
    assert ledger.identity["ledger_id"] in result.stdout
    assert str(tmp_path / "visits.ledger.anchor") in result.stdout
    # Its one record pins the policy's budget: caps, filter and shares.
    (pinned,) = ledger.records()
    assert pinned.kind == "budget" and pinned.payload == budget_caps(load_policy(path).budget)

    again = run(path, "init")
    line = assert_one_line_error(again, 6)
    assert "LedgerError" in line and "existing" in line
    assert Ledger(tmp_path / "visits.ledger").identity == ledger.identity  # untouched


def test_a_policy_without_a_ledger_or_an_invalid_one_exits_7(tmp_path: Path) -> None:
    path = write_policy(tmp_path)
    text = path.read_text(encoding="utf-8")
    path.write_text(text.split("[ledger]")[0], encoding="utf-8")
    assert "[ledger]" in assert_one_line_error(run(path, "init"), 7)
    path.write_text(text.replace("epsilon = 1.0", "epsilon = -1.0"), encoding="utf-8")
    assert "budget" in assert_one_line_error(run(path, "report"), 7)
    assert_one_line_error(run(tmp_path / "missing.toml", "report"), 7)


# -- report -----------------------------------------------------------------------------------
def test_report_lists_every_charge_with_its_cost_and_every_figure(policy: Path) -> None:
    ask(policy, QUERIES[0], analyst="ann")
    ask(policy, QUERIES[1], analyst="ann", epsilon="0.1")
    ask(policy, QUERIES[2], analyst="bob", epsilon="0.3")
    data = json_report(policy)

    charges = [e for e in data["schedule"] if e["kind"] == "charge"]
    assert [(c["query"], c["analyst"], c["epsilon"], c["delta"]) for c in charges] == [
        (QUERIES[0], "ann", "0.25", "0"),
        (QUERIES[1], "ann", "0.1", "0"),
        (QUERIES[2], "bob", "0.3", "0"),
    ]
    assert all(c["time"].endswith("Z") and "T" in c["time"] for c in charges)
    assert "DiscreteLaplace" in charges[0]["mechanisms"][0]
    assert len(charges[1]["mechanisms"]) == 2  # AVG: a noisy sum and a noisy count
    assert [e["seq"] for e in data["schedule"]] == list(range(1, data["ledger"]["records"] + 1))

    eps, delta = data["budget"]["epsilon"], data["budget"]["delta"]
    assert (eps["total"], eps["spent"], eps["remaining"]) == ("1", "0.65", "0.35")
    assert (delta["total"], delta["top_ups"]) == ("0.000001", "0")
    assert data["budget"]["charged_queries"] == 3
    assert data["budget"]["analysts"]["ann"]["epsilon_charged"] == "0.35"

    figures = {f["accountant"]: f for f in data["accounting"]["figures"]}
    assert {"basic", "advanced", "optimal", "rdp", "zcdp", "gdp", "pld"} <= set(figures)
    assert figures["basic"]["note"] == "decides" and float(figures["basic"]["epsilon"]) == 0.65
    assert figures["optimal"]["note"] == "as if fixed in advance"
    assert figures["rdp"]["note"] == "as if fixed in advance"  # the best order after the fact
    assert figures["advanced"]["exceeds_cap"] is False
    assert {f["note"] for f in figures.values()} <= set(data["accounting"]["notes"])

    assert data["adjacency"]["privacy_units"] == {"visits": "user_id"}
    (bounds,) = data["bounds"]
    assert (bounds["max_groups_per_unit"], bounds["max_rows_per_unit_per_group"]) == (2, 10)
    assert bounds["columns"]["spend"]["upper"] == "200"
    assert bounds["columns"]["region"]["public_values"][0] == "central"
    assert data["mechanism"]["preference"] == "laplace"

    markdown = run(policy, "report")
    assert markdown.exit_code == 0
    text = markdown.stdout
    for heading in ("Budget", "Adjacency", "Contribution bounds", "Mechanism", "Accountants",
                    "Release schedule"):  # fmt: skip
        assert f"\n## {heading}\n" in text
    for query in QUERIES:
        assert query in text
    assert "| basic | 0.65 | decides |" in text
    assert "as if fixed in advance" in text


def test_report_writes_to_a_file_and_refuses_an_unwritable_one(
    policy: Path, tmp_path: Path
) -> None:
    target = tmp_path / "report.json"
    result = run(policy, "report", "--format", "json", "--output", str(target))
    assert result.exit_code == 0 and result.stdout == ""
    assert json.loads(target.read_text(encoding="utf-8"))["dataset"]["id"] == "visits-cli"
    bad = run(policy, "report", "--output", str(tmp_path / "no" / "such" / "dir.md"))
    assert bad.exit_code == 2 and "Traceback" not in bad.stderr


def test_exact_decimals_in_the_report() -> None:
    assert exact(Fraction(1, 100)) == "0.01"
    assert exact(Fraction(-3, 8)) == "-0.375"
    assert exact(Fraction(1, 3)) == "1/3"
    assert exact(Fraction(7)) == "7"
    assert exact(Fraction(1, 10**6)) == "0.000001"


# -- budget administration --------------------------------------------------------------------
def test_a_query_fits_only_after_the_top_up(policy: Path) -> None:
    ask(policy, QUERIES[0], epsilon="0.9")
    with pytest.raises(BudgetExceededError):
        ask(policy, QUERIES[1], epsilon="0.2")
    result = run(policy, "budget", "add", "--epsilon", "0.1", "--delta", "0", "--by", "owner",
                 "--why", "second quarter")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert "epsilon 1.1, delta 0.000001" in result.stdout  # decimals, never 11/10
    ask(policy, QUERIES[1], epsilon="0.2")  # 0.9 + 0.2 = 1.1 exactly: fits
    with pytest.raises(BudgetExceededError):
        ask(policy, QUERIES[2], epsilon="0.0001")

    data = json_report(policy)
    eps = data["budget"]["epsilon"]
    assert (eps["policy"], eps["top_ups"], eps["total"], eps["spent"]) == ("1", "0.1", "1.1", "1.1")
    assert eps["remaining"] == "0"
    (top_up,) = [e for e in data["schedule"] if e["kind"] == "budget_add"]
    assert (top_up["by"], top_up["why"], top_up["epsilon"]) == ("owner", "second quarter", "0.1")


def test_a_top_up_after_an_answer_marks_the_cap_adaptive_everywhere(tmp_path: Path) -> None:
    """Under the rdp filter a cap raised after answers is no guarantee: the top-up says so,
    ``budget show`` and both report formats name the record and give basic composition of the
    charges instead; the ledger still verifies (nothing new is written to it)."""
    early, late = tmp_path / "early", tmp_path / "late"
    for folder in (early, late):
        folder.mkdir()
        path = write_policy(folder, 'accountant = "rdp"')
        assert run(path, "init").exit_code == 0
    top_up = ("budget", "add", "--epsilon", "1", "--delta", "0", "--by", "owner", "--why", "w")
    before = run(early / "policy.toml", *top_up)  # before any query: the cap is still fixed
    assert before.exit_code == 0 and "raised after answers" not in before.stdout
    ask(early / "policy.toml", QUERIES[0])
    assert json_report(early / "policy.toml")["budget"]["adaptive_cap"] is None

    ask(late / "policy.toml", QUERIES[0])
    after = run(late / "policy.toml", *top_up)
    assert after.exit_code == 0 and "raised after answers were seen" in after.stdout
    record = int(after.stdout.split(":")[0].removeprefix("record "))
    ask(late / "policy.toml", QUERIES[2])
    shown = run(late / "policy.toml", "budget", "show").stdout
    assert f"Adaptive cap: raised after answers were seen (ledger record {record})" in shown
    assert "by basic composition of the charges: epsilon 0.5, delta 0." in shown
    data = json_report(late / "policy.toml")
    assert data["budget"]["adaptive_cap"] == {
        "since_record": record,
        "valid_adaptively": {"theorem": "basic composition", "epsilon": "0.5", "delta": "0"},
    }
    markdown = run(late / "policy.toml", "report").stdout
    assert (
        f"**Adaptive cap.** The cap was raised after answers were seen (ledger record {record})"
        in markdown
    )
    assert run(late / "policy.toml", "ledger", "verify").exit_code == 0


def test_an_allocation_limits_the_analyst(policy: Path) -> None:
    result = run(policy, "budget", "allocate", "ann", "--epsilon", "0.3", "--by", "owner",
                 "--why", "churn study")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    ask(policy, QUERIES[0], analyst="ann")  # 0.25 of 0.3
    with pytest.raises(BudgetExceededError, match="share"):
        ask(policy, QUERIES[1], analyst="ann")
    with pytest.raises(BudgetExceededError):  # with shares declared, no share means no spending
        ask(policy, QUERIES[1], analyst="bob")
    ask(policy, QUERIES[1], analyst="ann", epsilon="0.05")  # 0.3 exactly

    analysts = json_report(policy)["budget"]["analysts"]
    assert analysts["ann"]["share"]["epsilon"] == "0.3"
    assert analysts["ann"]["share"]["set_by"].startswith("ledger record")
    assert analysts["ann"]["epsilon_charged"] == "0.3"


def test_a_share_beyond_the_total_is_a_usage_error(policy: Path) -> None:
    result = run(policy, "budget", "allocate", "ann", "--epsilon", "2", "--by", "o", "--why", "w")
    assert result.exit_code == 2 and "within the total" in result.stderr
    assert [r.kind for r in Ledger(policy.parent / "visits.ledger").records()] == ["budget"]


@pytest.mark.parametrize("value", ["0", "-1", "abc", "nan", "inf", "1/0", "10001", ""])
def test_a_bad_epsilon_is_a_usage_error_without_a_traceback(policy: Path, value: str) -> None:
    result = run(policy, "budget", "add", "--epsilon", value, "--delta", "0", "--by", "o",
                 "--why", "w")  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.stderr and "--epsilon" in result.stderr
    assert [r.kind for r in Ledger(policy.parent / "visits.ledger").records()] == ["budget"]


@pytest.mark.parametrize("value", ["1", "-0.1", "x"])
def test_a_bad_delta_is_a_usage_error(policy: Path, value: str) -> None:
    result = run(policy, "budget", "allocate", "ann", "--epsilon", "0.1", "--delta", value,
                 "--by", "o", "--why", "w")  # fmt: skip
    assert result.exit_code == 2 and "--delta" in result.stderr


def test_env_vars_back_the_group_options(policy: Path) -> None:
    env = {"DPSQL_POLICY": str(policy), "DPSQL_ANALYST": "carol"}
    result = run(None, "budget", "add", "--epsilon", "0.5", "--delta", "0", "--why", "w", env=env)
    assert result.exit_code == 0, result.stderr
    (_, record) = Ledger(policy.parent / "visits.ledger").records()
    assert record.payload["by"] == "carol" and record.payload["epsilon"] == "1/2"
    # The command line wins over the environment.
    wrong = {"DPSQL_POLICY": str(policy.parent / "nope.toml")}
    assert run(policy, "ledger", "verify", env=wrong).exit_code == 0
    assert run(None, "ledger", "verify", env=wrong).exit_code == 7
    # Neither --by nor an analyst: usage error.
    alone = {"DPSQL_POLICY": str(policy)}
    assert run(None, "budget", "add", "--epsilon", "1", "--delta", "0", "--why", "w",
               env=alone).exit_code == 2  # fmt: skip
    assert run(None, "report").exit_code == 2  # no policy at all


# -- ledger -----------------------------------------------------------------------------------
def test_verify_passes_then_fails_closed_after_tampering(policy: Path) -> None:
    ask(policy, QUERIES[0], analyst="ann")
    ask(policy, QUERIES[1], analyst="ann")
    ledger = Ledger(policy.parent / "visits.ledger")
    records = ledger.records()
    ok = run(policy, "ledger", "verify")
    assert ok.exit_code == 0, ok.stderr
    assert f"records: {len(records)}" in ok.stdout
    assert f"head: {records[-1].hash}" in ok.stdout

    con = sqlite3.connect(policy.parent / "visits.ledger")
    with con:  # lower the first charge's cost: a classic attempt to free budget
        payload = json.loads(con.execute("SELECT payload FROM records WHERE seq = 1").fetchone()[0])
        payload["epsilon"] = "0.01"
        con.execute("UPDATE records SET payload = ? WHERE seq = 1", (json.dumps(payload),))
    con.close()
    for command in (("ledger", "verify"), ("report",), ("ledger", "export")):
        line = assert_one_line_error(run(policy, *command), 6)
        assert "altered" in line
    with pytest.raises(dpsql.LedgerFailure):
        ask(policy, QUERIES[2])


def test_a_deleted_ledger_fails_closed(policy: Path) -> None:
    (policy.parent / "visits.ledger").unlink()
    assert "missing" in assert_one_line_error(run(policy, "ledger", "verify"), 6)
    assert_one_line_error(run(policy, "budget", "add", "--epsilon", "1", "--delta", "0",
                              "--by", "o", "--why", "w"), 6)  # fmt: skip


def test_export_round_trips_the_records_and_their_chain(policy: Path, tmp_path: Path) -> None:
    ask(policy, QUERIES[0], analyst="ann")
    run(policy, "budget", "allocate", "ann", "--epsilon", "0.5", "--by", "o", "--why", "w")
    ledger = Ledger(policy.parent / "visits.ledger")
    expected = list(ledger.export())

    lines = run(policy, "ledger", "export")
    assert lines.exit_code == 0, lines.stderr
    exported = [json.loads(line) for line in lines.stdout.splitlines()]
    assert exported == expected
    prev = GENESIS
    for r in exported:  # the chain checks outside dpsql, as docs/cli.md describes it
        assert r["prev"] == prev
        body = json.dumps(r["payload"], sort_keys=True, separators=(",", ":"))
        assert record_hash(prev, (r["seq"], r["time"], r["kind"], r["analyst"], body)) == r["hash"]
        prev = r["hash"]

    target = tmp_path / "ledger.json"
    whole = run(policy, "ledger", "export", "--format", "json", "--output", str(target))
    assert whole.exit_code == 0 and whole.stdout == ""
    document = json.loads(target.read_text(encoding="utf-8"))
    assert document["records"] == expected
    assert document["ledger"]["ledger_id"] == ledger.identity["ledger_id"]
    assert "salt" not in document["ledger"]


# -- the exit-code table ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ParseError("x"), 3),
        (ParameterError("x"), 3),
        (BudgetExceededError("x"), 4),
        (EngineError("x"), 5),
        (LedgerError("x"), 6),
        (PolicyError("x"), 7),
        (EntropyError("x"), 8),
        (InternalError("x"), 70),
        (RuntimeError("x"), 70),
    ],
)
def test_exit_codes_follow_the_table(error: Exception, code: int) -> None:
    assert cli.exit_code(error) == code


@pytest.mark.parametrize(
    ("error", "code"),
    [(EngineError("the engine failed"), 5), (ValueError("user 4711 spent 12.5"), 70)],
)
def test_an_error_in_a_command_is_one_line_and_never_its_data(
    policy: Path, monkeypatch: pytest.MonkeyPatch, error: Exception, code: int
) -> None:
    def boom(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(cli, "build_report", boom)
    line = assert_one_line_error(run(policy, "report"), code)
    assert "4711" not in line and type(error).__name__ in line


def test_the_console_script_exits_with_the_table_codes(policy: Path) -> None:
    def dpsql_cmd(*args: str) -> subprocess.CompletedProcess[str]:
        command = [
            sys.executable,
            "-m",
            "dpsql.interfaces.cli.main",
            "--policy",
            str(policy),
            *args,
        ]
        return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)

    assert dpsql_cmd("ledger", "verify").returncode == 0
    again = dpsql_cmd("init")
    assert again.returncode == 6 and "Traceback" not in again.stderr
    assert dpsql_cmd("budget", "add", "--epsilon", "0").returncode == 2


def test_report_under_a_zcdp_rho_budget(tmp_path: Path) -> None:
    path = write_policy(tmp_path)
    text = path.read_text(encoding="utf-8").replace(
        "epsilon = 1.0", 'rho = 0.5\naccountant = "zcdp"\nmechanism = "gaussian"'
    )
    path.write_text(text, encoding="utf-8")
    assert run(path, "init").exit_code == 0
    ask(path, QUERIES[0])
    data = json_report(path)
    assert data["budget"]["rho"] == "0.5" and data["budget"]["accountant"] == "zcdp"
    figures = {f["accountant"]: f["note"] for f in data["accounting"]["figures"]}
    assert figures["zcdp"] == "decides" and figures["basic"] == "valid adaptively"
    (charge,) = [e for e in data["schedule"] if e["kind"] == "charge"]
    assert charge["mechanisms"][0].startswith("DiscreteGaussian")
    assert (charge["epsilon"], charge["delta"]) == ("0.25", "0.00000001")
    markdown = run(path, "report").stdout
    # rho 0.5 certifies epsilon 5.24 at delta 9e-7: all of delta but the selection reserve (a
    # tenth), CKS 2020 Corollary 13.
    assert "| epsilon | 5.24" in markdown and "rho = 0.5" in markdown


def test_report_as_a_self_contained_html_page(policy: Path) -> None:
    ask(policy, "SELECT COUNT(*) FROM visits", epsilon=0.5)
    result = run(policy, "report", "--format", "html")
    assert result.exit_code == 0, result.stderr
    page = result.stdout
    assert page.lstrip().lower().startswith("<!doctype html")
    assert "<svg" in page  # the budget chart, inline
    # Nothing is loaded from outside (XML namespace URIs in the SVG are names, not loads).
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "SELECT COUNT(*) FROM visits" in page
