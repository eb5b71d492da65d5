"""A unit-level sample through every interface: the shell, ``dpsql run`` and ``dpsql query``,
the server over the wire with real psql, and the DB-API; each plans the amplified cost before
spending it and charges exactly that."""

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
from dpsql.analyze.sample import implemented
from dpsql.interfaces.shell.core import Shell
from dpsql.plan.sample import amplified_epsilon

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "examples" / "data" / "visits.parquet"
SAMPLED = "SELECT COUNT(*) AS n FROM visits TABLESAMPLE BERNOULLI (1 PERCENT)"
COST = re.compile(r"cost: epsilon ([\d.]+), delta 0")


def _amplified(epsilon: str) -> str:
    rate = implemented(Fraction(1, 100))
    return str(float(amplified_epsilon(Fraction(epsilon), rate)))


def test_the_shell_plans_and_charges_the_amplified_cost(
    shell: Shell,  # noqa: F811
) -> None:
    explained = shell.handle(f"\\explain {SAMPLED}")
    assert "sample: each unit kept with probability 0.01" in explained
    (cost,) = COST.findall(explained)
    assert float(cost) == float(_amplified("0.25"))
    shown = shell.handle(f"{SAMPLED};")
    assert f"charged epsilon {cost}, delta 0" in shown
    assert "Error" in shell.handle("SELECT COUNT(*) FROM visits TABLESAMPLE SYSTEM (1 PERCENT);")


def test_dpsql_run_and_query_take_the_clause_and_the_setting(
    batch_policy: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    path = sql_file(tmp_path, "SET dpsql.sample_rate = 0.01;\nSELECT COUNT(*) AS n FROM visits;\n")
    planned = invoke(batch_policy, "run", "--plan", str(path))
    assert planned.exit_code == 0, planned.output
    cost = _amplified("0.25")
    assert re.search(rf"query\s+{re.escape(cost)}\s+0\s+charge", planned.output), planned.output
    run = invoke(batch_policy, "run", "--quiet", str(path))
    assert run.exit_code == 0, run.output
    out = invoke(batch_policy, "query", SAMPLED)
    assert out.exit_code == 0, out.output
    explained = invoke(batch_policy, "explain", "--verbose", SAMPLED)
    assert explained.exit_code == 0 and "$sample" in explained.output
    bad = invoke(batch_policy, "query", SAMPLED.replace("BERNOULLI", "SYSTEM"))
    assert bad.exit_code != 0 and "SYSTEM" in bad.output


def test_the_server_takes_a_sample_over_the_wire(tmp_path: Path) -> None:
    dataset = write_dataset(tmp_path / "data")
    users = write_users(tmp_path / "users.json")
    policy, _ = write_server_policy(tmp_path / "server", dataset)
    sql = "SELECT COUNT(*) FROM visits TABLESAMPLE BERNOULLI (10 PERCENT)"
    with ServerThread(policy, users) as server:
        out = psql(server.port, "alice", f"EXPLAIN {sql};\n{sql};\n")
    assert out.returncode == 0, out.stderr
    (cost,) = COST.findall(out.stdout)
    notice = [line for line in out.stderr.splitlines() if line.startswith("NOTICE:  dpsql: ch")]
    assert len(notice) == 1 and f"epsilon {cost}, delta 0" in notice[0], out.stderr


def test_the_dbapi_runs_a_sample_and_charges_it(tmp_path: Path) -> None:
    with dpsql.connect(write_policy(tmp_path)) as conn:
        cur = conn.cursor()
        cur.execute(SAMPLED)
        assert cur.result is not None and cur.result.charge is not None
        assert str(float(cur.result.charge.epsilon)) == _amplified("0.25")
        # The same query on a sample at the same rate, asked by the setting: the same release.
        cur.execute("SELECT COUNT(*) AS n FROM visits", sample_rate="0.01")
        assert cur.result is not None and cur.result.cached_from is not None
        with pytest.raises(dpsql.ProgrammingError, match="sample_rate"):
            cur.execute("SELECT COUNT(*) FROM visits", sample_rate=2)
