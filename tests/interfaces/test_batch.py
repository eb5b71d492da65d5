"""``dpsql run FILE.sql`` and ``dpsql explain`` end to end on the example data.

Each test writes a policy whose durable ``[ledger]`` lives in tmp_path, runs ``dpsql init``, and
invokes the commands through a fresh ``DpsqlGroup`` carrying the ``dpsql`` group's own options
(so error mapping and ``Config`` are exactly what ``dpsql`` gives them).
"""

from __future__ import annotations

import csv
import io
import json
import re
from fractions import Fraction
from pathlib import Path

import click
import duckdb
import pytest
from click.testing import CliRunner, Result

from dpsql.accounting.ledger.ledger import Ledger
from dpsql.interfaces.cli import main as cli
from dpsql.interfaces.cli.batch import explain_command, query_command, run_command
from dpsql.policy.numbers import exact
from dpsql.session.session import Session
from dpsql.session.workload_plan import plan_file
from dpsql.sql.options import KEYS, PRIVACY_UNIT
from dpsql.sql.split import split_statements

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "examples" / "data" / "visits.parquet"
POLICY = """
[dataset]
id = "visits-batch"
data_version = "v1"

[data]
tables = {{ visits = "{data}" }}

[budget]
diagnose = false
epsilon = 1.0
delta = 1e-6
query_epsilon = 0.25
query_delta = 1e-8

[tables.visits]
privacy_unit = "user_id"
max_groups_per_unit = 2
max_rows_per_unit_per_group = 10

[tables.visits.columns.spend]
lower = 0
upper = 200

[tables.visits.columns.region]
public_values = ["central", "east", "north", "south", "west"]

[ledger]
path = "visits.ledger"
"""
FILE = """\
-- a comment; with a semicolon
SET dpsql.epsilon = 0.1;
SELECT region, COUNT(*) AS n FROM visits /* not; here */ GROUP BY region;
SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon = 0.2) AVG(spend) AS mean
FROM visits WHERE region <> 'a;b';
SHOW dpsql.epsilon;
"""


@pytest.fixture(autouse=True)
def _example_data() -> None:
    if not DATA.exists():
        pytest.skip("run `make demo` (or examples/make_data.py) to create the example data")


GROUP = cli.DpsqlGroup(name="dpsql", callback=cli.cli.callback, params=cli.cli.params)
GROUP.add_command(run_command)
GROUP.add_command(explain_command)
GROUP.add_command(query_command)


def invoke(policy: Path, *args: str) -> Result:
    return CliRunner().invoke(GROUP, ["--policy", str(policy), *args])


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(POLICY.format(data=DATA), encoding="utf-8")
    assert CliRunner().invoke(cli.cli, ["--policy", str(path), "init"]).exit_code == 0
    return path


def sql_file(folder: Path, text: str, name: str = "q.sql") -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def charges(policy: Path) -> list[str]:
    """The epsilon of every charge in the ledger, in order, as decimal text."""
    ledger = Ledger(policy.parent / "visits.ledger")
    return [exact(Fraction(r.payload["epsilon"])) or "" for r in ledger.records()
            if r.kind == "charge"]  # fmt: skip


# -- splitting --------------------------------------------------------------------------------
def test_statements_split_only_on_real_semicolons() -> None:
    text = (
        "-- leading; comment\n"
        "SELECT 'a;b' AS \"x;y\" FROM t; ;\n"
        "/* block; comment */ SET dpsql.epsilon = 0.1;\n"
        "EXPLAIN SELECT COUNT(*) FROM t WHERE s = ';' -- tail; comment\n"
        ";\n"
        "SHOW dpsql.all\n"
        "-- trailing; comment"
    )
    pieces = split_statements(text)
    assert [p.number for p in pieces] == [1, 2, 3, 4]
    assert [p.line for p in pieces] == [2, 3, 4, 6]
    assert pieces[0].text == "SELECT 'a;b' AS \"x;y\" FROM t"
    assert pieces[1].text == "SET dpsql.epsilon = 0.1"
    assert pieces[2].text.startswith("EXPLAIN SELECT COUNT(*) FROM t WHERE s = ';'")
    assert pieces[3].text.startswith("SHOW dpsql.all")
    assert split_statements("-- nothing; here\n ; ;") == []


# -- the plan ---------------------------------------------------------------------------------
def test_the_plan_charges_nothing_and_its_events_are_what_is_charged(
    policy: Path, tmp_path: Path
) -> None:
    path = sql_file(tmp_path, FILE)
    shown = invoke(policy, "run", str(path), "--plan")
    assert shown.exit_code == 0, shown.output
    assert "to charge (basic composition, the sum): epsilon 0.3, delta 0" in shown.stdout
    assert "fits: yes" in shown.stdout
    assert charges(policy) == []
    records = len(Ledger(policy.parent / "visits.ledger").records())

    session = Session(policy)
    steps = plan_file(session, split_statements(FILE))
    planned = [e for s in steps if s.charged and s.plan is not None for e in s.plan.event.events]
    assert session.settings()["epsilon"] == session.policy.budget.query_epsilon  # SET undone
    session.close()
    assert len(Ledger(policy.parent / "visits.ledger").records()) == records

    result = invoke(policy, "run", str(path))
    assert result.exit_code == 0, result.stderr
    session = Session(policy)
    # The whole file is one charge, committed before anything runs: its events are the
    # statements' (no two statements here share rows, so nothing is planned jointly).
    assert [list(c.event.events) for c in session.filter.charges] == [planned]
    session.close()
    assert charges(policy) == ["0.3"]
    assert "-- statement 4 (line 6)" in result.stdout and "0.1" in result.stdout
    assert "2 charged (epsilon 0.3, delta 0)" in result.stdout

    again = invoke(policy, "run", str(path), "--quiet")
    assert again.exit_code == 0
    assert "plan of" not in again.stdout
    assert "0 charged (epsilon 0, delta 0), 2 from the cache" in again.stdout
    assert charges(policy) == ["0.3"]  # a second run costs nothing
    replan = invoke(policy, "run", str(path), "--plan")
    assert "cache (release" in replan.stdout and "epsilon 0, delta 0" in replan.stdout


def test_an_identical_statement_later_in_the_file_is_planned_free(
    policy: Path, tmp_path: Path
) -> None:
    query = "SELECT COUNT(*) AS n FROM visits;\n"
    path = sql_file(tmp_path, query * 2)
    shown = invoke(policy, "run", str(path), "--plan")
    assert "cache (statement 1)" in shown.stdout
    assert invoke(policy, "run", str(path)).exit_code == 0
    assert charges(policy) == ["0.25"]


# -- outputs ----------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["csv", "json", "parquet"])
def test_each_format_per_statement_and_combined(policy: Path, tmp_path: Path, fmt: str) -> None:
    path = sql_file(tmp_path, FILE)
    out = tmp_path / "out"
    result = invoke(policy, "run", str(path), "--output", str(out), "--format", fmt)
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == [f"0{n}.{fmt}" for n in (2, 3, 4)]
    first = out / f"02.{fmt}"
    if fmt == "csv":
        lines = first.read_text(encoding="utf-8").splitlines()
        # The half-widths stay with the values: a <name> ± column after each noisy one, then
        # its flag <name> noise (the value is mostly noise).
        assert lines[0] == "region,n,n ±,n noise" and len(lines) == 6
        assert lines[1].startswith("central,")
        assert all(float(line.split(",")[2]) > 0 for line in lines[1:])
        assert all(line.split(",")[3] in ("True", "False") for line in lines[1:])
    elif fmt == "json":
        doc = json.loads(first.read_text(encoding="utf-8"))
        assert doc["columns"] == ["region", "n"] and len(doc["rows"]) == 5
        assert doc["epsilon"] == "0.1" and doc["accuracy"][0][1] > 0
        assert [len(r) for r in doc["noise"]] == [2] * 5 and not doc["noise"][0][0]
    else:
        rows = duckdb.sql(f"SELECT * FROM '{first}'").fetchall()
        assert len(rows) == 5 and rows[0][0] == "central"
        assert duckdb.sql(f"SELECT * FROM '{out / '03.parquet'}'").columns == ["mean"]

    combined = tmp_path / "all"
    again = invoke(policy, "run", str(path), "--output", str(combined), "--format", fmt,
                   "--combined")  # fmt: skip
    assert again.exit_code == 0, again.stderr
    assert [p.name for p in combined.iterdir()] == [f"results.{fmt}"]
    target = combined / f"results.{fmt}"
    if fmt == "json":
        docs = json.loads(target.read_text(encoding="utf-8"))
        assert [d["statement"] for d in docs] == [2, 3, 4]
        assert docs[1]["columns"] == ["mean"] and docs[1]["cached_from"] is not None
        assert {"statement", "columns", "rows", "accuracy", "noise"} <= set(docs[0])
    elif fmt == "csv":
        lines = target.read_text(encoding="utf-8").splitlines()
        assert lines[0] == "statement,row,column,value,accuracy,noise,low,high"
        assert len(lines) == 1 + 10 + 1 + 1  # 5 rows x 2 columns, one mean, one setting
    else:
        count = duckdb.sql(f"SELECT COUNT(*) FROM '{target}'").fetchall()
        assert count == [(12,)]
    assert charges(policy) == ["0.3"]


REGIONS = ["central", "east", "north", "south", "west"]  # the policy's domain of region


def test_a_file_sets_the_other_group_for_its_later_statements(policy: Path, tmp_path: Path) -> None:
    text = (
        "SET dpsql.other_group = on;\n"
        "SET dpsql.other_label = 'elsewhere';\n"
        "SELECT region, COUNT(*) AS n FROM visits GROUP BY region;\n"
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(other_group = false) region, COUNT(*) AS n "
        "FROM visits GROUP BY region;\n"
    )
    out = tmp_path / "out"
    result = invoke(policy, "run", str(sql_file(tmp_path, text)), "--output", str(out),
                    "--format", "json")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    with_other = json.loads((out / "03.json").read_text(encoding="utf-8"))
    assert sorted(r[0] for r in with_other["rows"]) == sorted([*REGIONS, "elsewhere"])
    without = json.loads((out / "04.json").read_text(encoding="utf-8"))
    assert sorted(r[0] for r in without["rows"]) == sorted(REGIONS)
    # A label that is a domain value refuses the file before anything runs.
    bad = sql_file(tmp_path, text.replace("'elsewhere'", "'east'"), "bad.sql")
    refused = invoke(policy, "run", str(bad))
    assert refused.exit_code != 0 and "dpsql.other_label equals a value" in refused.output
    assert charges(policy) == ["0.5"]  # the refused file charged nothing


# -- the budget -------------------------------------------------------------------------------
TOO_BIG = "".join(
    f"SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon = {e}) SUM(spend) AS s{i} FROM visits;\n"
    for i, e in enumerate(("0.4", "0.5", "0.3", "0.1"))
)


def test_a_file_that_does_not_fit_is_refused_as_a_whole(policy: Path, tmp_path: Path) -> None:
    path = sql_file(tmp_path, TOO_BIG)
    result = invoke(policy, "run", str(path))
    assert result.exit_code == 4
    assert "refused (does not fit)" in result.stdout
    assert result.stderr.startswith("Error: BudgetExceededError:") and "nothing was run" in (
        result.stderr
    )
    assert charges(policy) == []

    partial = invoke(policy, "run", str(path), "--partial")
    assert partial.exit_code == 0, partial.stderr
    # The longest prefix that fits, in one charge: statement 4 would fit after 3 is left out,
    # but a workload is admitted as a prefix, so that what runs never depends on later costs.
    assert charges(policy) == ["0.9"]
    assert "skipped 3, 4 (over the budget)" in partial.stdout


def test_partial_that_admits_nothing_fails(policy: Path, tmp_path: Path) -> None:
    """--partial runs the prefix that fits; an empty prefix is a refusal (exit 4), not a
    success that ran nothing."""
    some = invoke(policy, "run", "--partial", str(sql_file(tmp_path, TOO_BIG, "big.sql")))
    assert some.exit_code == 0, some.output  # a prefix fits: 0.9 of 1
    ledger = (policy.parent / "visits.ledger").read_bytes()
    path = sql_file(tmp_path, "SET dpsql.epsilon = 0.5;\nSELECT COUNT(*) FROM visits;\n")
    nothing = invoke(policy, "run", "--partial", str(path))
    assert nothing.exit_code == 4, nothing.output
    assert "none of the 1 statement(s) of" in nothing.stderr
    assert "fits the remaining budget; nothing was run or charged" in nothing.stderr
    assert (policy.parent / "visits.ledger").read_bytes() == ledger


def test_a_bad_statement_refuses_the_file_before_anything_runs(
    policy: Path, tmp_path: Path
) -> None:
    path = sql_file(tmp_path, "SELECT COUNT(*) FROM visits;\nSELECT user_id FROM visits;\n")
    result = invoke(policy, "run", str(path))
    assert result.exit_code == 3
    assert result.stderr.startswith("Error: ") and "statement 2 (line 2)" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert charges(policy) == []


def test_usage_errors(policy: Path, tmp_path: Path) -> None:
    path = sql_file(tmp_path, "SELECT COUNT(*) FROM visits;")
    assert invoke(policy, "run", str(path), "--format", "json").exit_code == 2
    assert invoke(policy, "run", str(tmp_path / "missing.sql")).exit_code == 2
    assert charges(policy) == []


# -- explain ----------------------------------------------------------------------------------
def test_explain_prints_the_plan_and_charges_nothing(policy: Path) -> None:
    sql = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon = 0.2) COUNT(*) AS n FROM visits"
    result = invoke(policy, "explain", "--verbose", sql)
    assert result.exit_code == 0, result.stderr
    assert "cost: epsilon 0.2, delta 0" in result.stdout
    assert "bounded SQL:" in result.stdout and "cache:" not in result.stdout
    assert charges(policy) == []
    path = sql_file(policy.parent, sql + ";")
    assert invoke(policy, "run", str(path), "--quiet").exit_code == 0
    assert "cache: served from release" in invoke(policy, "explain", sql).stdout
    bad = invoke(policy, "explain", "SELECT user_id FROM visits")
    assert bad.exit_code == 3 and bad.stdout == ""


# -- docs -------------------------------------------------------------------------------------
DOC = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("command", [run_command, explain_command], ids=["run", "explain"])
def test_every_option_is_documented_in_its_section(command: click.Command) -> None:
    match = re.search(rf"^## `dpsql {command.name}`\s*$(.*?)(?=^## |\Z)", DOC, re.M | re.S)
    assert match, f"no section for dpsql {command.name}"
    for param in command.params:
        names = param.opts if isinstance(param, click.Option) else [param.human_readable_name]
        for name in names:
            assert f"`{name}" in match.group(1), f"{name} is not documented"


def test_every_options_key_is_in_the_mapping_table() -> None:
    for key, setting in KEYS.items():
        assert f"| `{key}`" in DOC and f"| `{setting}` |" in DOC, key
    assert f"| `{PRIVACY_UNIT}` (BigQuery) |" in DOC


REPEATS = """\
SET dpsql.fresh = true;
SELECT COUNT(*) AS n FROM visits;
SELECT COUNT(*) AS n FROM visits;
SET dpsql.epsilon = 0.1;
SELECT COUNT(*) AS n FROM visits;
EXPLAIN SELECT COUNT(*) AS n FROM visits;
SET dpsql.fresh = false;
SELECT COUNT(*) AS n FROM visits;
SELECT COUNT(*) AS n FROM visits;
SET dpsql.epsilon = 0.25;
SELECT COUNT(*) AS n FROM visits;
SELECT SUM(spend) AS s FROM visits;
SELECT COUNT(*) AS n FROM visits;
"""


def test_a_repeated_statement_is_planned_under_the_settings_in_force(policy: Path) -> None:
    """Plans are reused across statements of a file only under the same settings, and the
    trial charges decide as the budget's own filter would on a plain copy of the ledger."""
    session = Session(policy)
    try:
        steps = plan_file(session, split_statements(REPEATS))
    finally:
        session.close()
    got = [(s.kind, s.source, s.plan.epsilon if s.plan else None, s.note) for s in steps]
    quarter, tenth = Fraction(1, 4), Fraction(1, 10)
    assert got == [
        ("set", "free", None, ""),
        ("query", "charge", quarter, ""),  # fresh: each one charged
        ("query", "charge", quarter, ""),
        ("set", "free", None, ""),
        ("query", "charge", tenth, ""),
        ("explain", "free", None, ""),
        ("set", "free", None, ""),
        ("query", "cache", tenth, "statement 5"),
        ("query", "cache", tenth, "statement 5"),
        ("set", "free", None, ""),
        ("query", "cache", quarter, "statement 3"),
        # epsilon 1 in all: 0.25 + 0.25 + 0.1 spent, so 0.25 fits and nothing more would
        ("query", "charge", quarter, ""),
        ("query", "cache", quarter, "statement 3"),
    ]


def test_a_long_file_is_refused_from_the_statement_that_does_not_fit(
    policy: Path, tmp_path: Path
) -> None:
    text = "SET dpsql.fresh = true;\n" + "SELECT COUNT(*) AS n FROM visits;\n" * 6
    shown = invoke(policy, "run", str(sql_file(tmp_path, text)), "--plan")
    assert shown.exit_code == 0, shown.output
    # epsilon 1 at 0.25 a query: statements 2-5 fit, 6 and 7 are refused.
    assert "fits: no: the basic filter refuses statement(s) 6, 7" in shown.stdout


# -- pipelined planning -------------------------------------------------------------------------
# The engine checks statement i while statement i + 1 is planned: these pin that the file still
# reads as if planned one statement after the other.
UNTYPED = "SELECT UPPER(COUNT(*)) AS n FROM visits"  # fails the check (post-processing bind)
UNPLANNED = "SELECT user_id FROM visits"  # fails while planning (not an aggregate)


@pytest.mark.parametrize(
    ("statements", "failing"),
    [
        ([COUNT_SQL := "SELECT COUNT(*) AS n FROM visits", UNTYPED, UNPLANNED], 2),
        ([COUNT_SQL, UNTYPED, COUNT_SQL], 2),
        ([COUNT_SQL, UNPLANNED, UNTYPED], 2),
        ([UNTYPED, UNTYPED], 1),
        ([COUNT_SQL, COUNT_SQL, UNTYPED], 3),
    ],
)
def test_the_first_failing_statement_in_the_file_is_the_one_reported(
    policy: Path, tmp_path: Path, statements: list[str], failing: int
) -> None:
    path = sql_file(tmp_path, "".join(f"{s};\n" for s in statements))
    for args in ((), ("--plan",)):
        result = invoke(policy, "run", str(path), *args)
        assert result.exit_code == 3, result.stderr
        assert f"statement {failing} (line {failing})" in result.stderr
    assert charges(policy) == []


def test_each_statement_reads_the_settings_before_the_next_set(
    policy: Path, tmp_path: Path
) -> None:
    """A released answer serves statement 1 from the cache although statement 2, planned while
    statement 1 was still being checked, turns ``fresh`` on for statement 3."""
    first = invoke(policy, "run", str(sql_file(tmp_path, f"{COUNT_SQL};\n", "a.sql")))
    assert first.exit_code == 0, first.stderr
    text = f"{COUNT_SQL};\nSET dpsql.fresh = true;\n{COUNT_SQL};\n"
    session = Session(policy)
    try:
        steps = plan_file(session, split_statements(text))
    finally:
        session.close()
    assert [(s.kind, s.source) for s in steps] == [
        ("query", "cache"),
        ("set", "free"),
        ("query", "charge"),
    ]


# -- dpsql query ------------------------------------------------------------------------------
ONE = "SELECT region, COUNT(*) AS n FROM visits GROUP BY region"


def test_query_prints_one_answer_in_each_format(policy: Path) -> None:
    table = invoke(policy, "query", ONE)
    assert table.exit_code == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["region", "n"] and " ± " in lines[1]
    assert lines[-1].startswith("charged epsilon 0.25, delta 0")
    csv_out = invoke(policy, "query", ONE, "--format", "csv")
    assert csv_out.exit_code == 0, csv_out.stderr
    rows = list(csv.reader(io.StringIO(csv_out.stdout)))
    assert rows[0] == ["region", "n", "n ±", "n noise"] and len(rows) == 6
    doc = json.loads(invoke(policy, "query", ONE, "--format", "json").stdout)
    assert doc["columns"] == ["region", "n"] and doc["cached_from"] is not None
    assert doc["epsilon"] == "0" and len(doc["rows"]) == 5 and doc["sql"] == ONE
    assert charges(policy) == ["0.25"]  # the later two were served from the cache, free


def test_query_errors_have_their_exit_codes(policy: Path) -> None:
    bad = invoke(policy, "query", "SELECT user_id FROM visits")
    assert bad.exit_code == 3 and bad.stderr.startswith("Error: ")
    big = invoke(policy, "query", "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon = 9) "
                 "COUNT(*) FROM visits")  # fmt: skip
    assert big.exit_code == 4
    assert charges(policy) == []


def test_a_syntax_error_names_the_construct_and_its_line_in_the_file(
    policy: Path, tmp_path: Path
) -> None:
    text = (
        "SELECT COUNT(*) AS n FROM visits;\n\n"
        "SELECT region,\n  COUNT(*) AS n\nFROM visits\nWHERE age >\nGROUP BY region;\n"
    )
    result = invoke(policy, "run", str(sql_file(tmp_path, text)))
    assert result.exit_code == 3
    message = result.stderr.strip()
    assert message.startswith("Error: ParseError: statement 2 (line 3): syntax error at or near")
    assert "the comparison is incomplete" in message
    assert message.endswith("(line 7, column 8)")  # GROUP, on the file's seventh line
    assert "<class" not in message and "sqlglot" not in message


def test_a_later_file_is_answered_from_releases_of_the_same_rows(
    policy: Path, tmp_path: Path
) -> None:
    """Released apart (``dpsql.share = off``: no family), a SUM and a COUNT by region answer a
    later file's AVG by region at another epsilon: planned from the cache, charged nothing."""
    first = sql_file(tmp_path, """\
SET dpsql.share = off;
SELECT region, SUM(spend) AS s FROM visits GROUP BY region;
SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon = 0.3) region, COUNT(spend) AS c
FROM visits GROUP BY region;
""", "first.sql")  # fmt: skip
    assert invoke(policy, "run", str(first)).exit_code == 0
    spent = charges(policy)
    later = sql_file(tmp_path, (
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon = 2) region, AVG(spend) AS a "
        "FROM visits GROUP BY region;\n"
    ), "later.sql")  # fmt: skip
    plan = invoke(policy, "run", str(later), "--plan")
    assert plan.exit_code == 0, plan.output
    assert "cache (releases " in plan.stdout and "epsilon 0, delta 0" in plan.stdout
    result = invoke(policy, "run", str(later))
    assert result.exit_code == 0, result.output
    assert "derived from release(s)" in result.stdout
    assert charges(policy) == spent
