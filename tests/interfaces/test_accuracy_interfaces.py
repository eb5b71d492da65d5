"""The split of a query's budget and accuracy targets through every interface: the shell,
``dpsql run`` and ``dpsql query``, the server over the wire with real psql, and the DB-API.
Each shows the solved cost before spending (EXPLAIN, ``--plan``) and charges exactly it."""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

import pytest
from interface_fixtures import example_data, shell  # noqa: F401  (fixtures)
from server_fixtures import ServerThread, psql, write_dataset, write_users
from server_fixtures import write_policy as write_server_policy
from test_batch import invoke, sql_file
from test_batch import policy as batch_policy  # noqa: F401  (a fixture)
from test_shell import write_policy

import dpsql
from dpsql.interfaces.shell.core import Shell

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "examples" / "data" / "visits.parquet"
TARGET = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(halfwidth = 500) COUNT(*) AS n FROM visits"
SOLVED = re.compile(r"cost: epsilon ([\d.]+), delta 0")
TWO = "SELECT SUM(spend) AS s, COUNT(*) AS n FROM visits"


def _solved(text: str) -> str:
    found = SOLVED.search(text)
    assert found is not None, text
    return found.group(1)


def test_the_shell_solves_the_target_and_shows_each_share(
    shell: Shell,  # noqa: F811
) -> None:
    explained = shell.handle(f"\\explain {TARGET}")
    epsilon = _solved(explained)
    assert f"would charge epsilon {epsilon}, delta 0" in explained
    shown = shell.handle(f"{TARGET};")
    assert f"charged epsilon {epsilon}, delta 0" in shown
    (width,) = re.findall(r"\d+ ± (\d+)", shown)
    assert int(width) <= 500
    # The default keeps each output at most k times its ± alone: here each takes half.
    assert shell.handle(f"\\explain {TWO}").count("share 0.5 of the query's epsilon") == 2
    shell.handle("SET dpsql.split = 'min_total_variance';")
    shares = shell.handle(f"\\explain {TWO}")
    assert re.search(r"SUM\(\"?spend\"?\).*share 0\.9\d+ of the query's epsilon", shares)
    assert "share 0.5 of the query's epsilon" not in shares
    shell.handle("SET dpsql.split = 'even';")
    assert shell.handle(f"\\explain {TWO}").count("share 0.5 of the query's epsilon") == 2
    assert "Error" in shell.handle("SET dpsql.split = 'fair';")
    assert "Error" in shell.handle("SET dpsql.halfwidth = 0;")


def test_dpsql_run_plans_the_solved_cost_and_charges_it(
    batch_policy: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    path = sql_file(
        tmp_path, f"SET dpsql.halfwidth = 500;\n{TWO.replace('SUM(spend) AS s, ', '')};\n"
    )
    explained = invoke(batch_policy, "explain", TARGET)
    assert explained.exit_code == 0, explained.output
    epsilon = _solved(explained.output)
    planned = invoke(batch_policy, "run", "--plan", str(path))
    assert planned.exit_code == 0, planned.output
    assert re.search(rf"query\s+{re.escape(epsilon)}\s+0\s+charge", planned.output), planned.output
    run = invoke(batch_policy, "run", "--quiet", str(path))
    assert run.exit_code == 0, run.output
    (width,) = re.findall(r"± (\d+)", run.output) or re.findall(r"(\d+) ±", run.output)[:1]
    assert int(width) <= 500, run.output
    out = invoke(batch_policy, "query", TARGET)
    assert out.exit_code == 0 and "noise only" in out.output, out.output
    bad = invoke(batch_policy, "query", TARGET.replace("halfwidth = 500", "halfwidth = 0"))
    assert bad.exit_code == 3 and "halfwidth" in bad.output


def test_the_server_takes_a_target_over_the_wire(tmp_path: Path) -> None:
    dataset = write_dataset(tmp_path / "data")
    users = write_users(tmp_path / "users.json")
    policy, _ = write_server_policy(tmp_path / "server", dataset)
    script = (
        "SET dpsql.halfwidth = 50;\n"
        "EXPLAIN SELECT COUNT(*) FROM visits;\n"
        "SELECT COUNT(*) FROM visits;\n"
        "RESET dpsql.halfwidth;\n"
        "SET dpsql.split = 'even';\n"
        "EXPLAIN SELECT SUM(spend), COUNT(*) FROM visits;\n"
    )
    with ServerThread(policy, users) as server:
        out = psql(server.port, "alice", script)
    assert out.returncode == 0, out.stderr
    epsilon = _solved(out.stdout)
    notice = [line for line in out.stderr.splitlines() if line.startswith("NOTICE:  dpsql: ch")]
    assert len(notice) == 1 and f"epsilon {epsilon}, delta 0" in notice[0], out.stderr
    assert "share 0.5 of the query's" in out.stdout


def test_the_dbapi_takes_targets_as_keywords_and_settings(tmp_path: Path) -> None:
    with dpsql.connect(write_policy(tmp_path)) as conn:
        cur = conn.cursor()
        cur.execute("SELECT COUNT(*) AS n FROM visits", halfwidth=500)
        assert cur.result is not None and cur.result.charge is not None
        charged = cur.result.charge.epsilon
        assert Fraction(0) < charged < Fraction(1, 4)
        assert cur.accuracy is not None and cur.accuracy[0][0] <= 500
        cur.execute("SET dpsql.split = 'even'")
        cur.execute("EXPLAIN " + TWO)
        lines = [row[0] for row in cur.fetchall()]
        assert sum("share 0.5 of the query's epsilon" in line for line in lines) == 2
        with pytest.raises(dpsql.ProgrammingError, match="rank_error"):
            cur.execute("SELECT MEDIAN(spend) FROM visits", rank_error="0.5")
