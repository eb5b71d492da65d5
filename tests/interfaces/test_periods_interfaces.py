"""A person-within-period unit from every interface: ``dpsql query``, ``dpsql run`` and
``dpsql explain``, ``dpsql budget show`` and the report (which lead with the lifetime cap per
person), a real server (its catalog shows no period column; its answers are charged for the
person), the DB-API and the shell."""

from __future__ import annotations

import json
from contextlib import closing
from fractions import Fraction
from pathlib import Path

import duckdb
import pytest
from click.testing import Result
from server_fixtures import ServerThread, charges, connect, write_users
from test_blocks_interfaces import POLICY, REGIONS, _add, _cli, _months

import dpsql
from dpsql.accounting.ledger.store import create_ledger
from dpsql.interfaces.shell.core import Shell
from dpsql.policy import load_policy
from dpsql.session.session import Session

PERIODS = '\n[periods]\ntable = "visits"\nepsilon = "2"\n'
FIRST_TWO = "SELECT COUNT(*) FROM visits WHERE day < DATE '2026-03-01'"


@pytest.fixture
def owned(tmp_path: Path) -> tuple[Path, list[Path]]:
    """A policy with a person-within-period unit, a durable ledger and three months registered."""
    policy = tmp_path / "policy.toml"
    text = POLICY.format(regions=json.dumps(REGIONS)).replace('epsilon = "50"', 'epsilon = "9"')
    policy.write_text(text + PERIODS, encoding="utf-8")
    create_ledger(load_policy(policy)).close()
    months = _months(tmp_path)
    for i, path in enumerate(months):
        added = _add(policy, i + 1, path)
        assert added.exit_code == 0, added.output
    return policy, months


def _ok(result: Result) -> str:
    assert result.exit_code == 0, result.output
    return result.output


def test_the_cli_budget_screen_and_report_lead_with_the_lifetime_cap(
    owned: tuple[Path, list[Path]],
) -> None:
    policy, _ = owned
    _ok(_cli(policy, "query", FIRST_TWO))  # query_epsilon 0.5, two periods: 1 for a person
    explained = _ok(_cli(policy, "explain", "SELECT SUM(spend) FROM visits"))
    assert "lifetime cost for one person in all 3: epsilon 1.5" in explained
    shown = _ok(_cli(policy, "budget", "show")).splitlines()
    assert shown[0].startswith("Lifetime cap per person (user_id, across every period of visits)")
    assert "epsilon 1 spent of 9" in shown[0] and "This is the guarantee." in shown[0]
    assert "  2026-01 (2026-01-01 to 2026-02-01): epsilon 0.5 spent, 1.5 left; delta 0" in shown
    assert "  2026-03 (2026-03-01 to 2026-04-01): epsilon 0 spent, 2 left; delta 0" in shown
    report = json.loads(_ok(_cli(policy, "report", "--format", "json")))
    assert report["budget"]["glance"].startswith("lifetime cap per person")
    assert report["periods"]["lifetime"]["epsilon_spent"] == "1"
    assert [p["epsilon"] for p in report["periods"]["periods"]] == ["1/2", "1/2", "0"]
    markdown = _ok(_cli(policy, "report", "--format", "markdown"))
    assert markdown.index("## Periods") < markdown.index("## Budget")
    # A query over a period whose budget is spent is refused, naming the period.
    script = policy.parent / "q.sql"
    script.write_text("SET dpsql.epsilon = 1.6;\n" + FIRST_TWO.replace("COUNT(*)", "SUM(spend)")
                      + ";\n", encoding="utf-8")  # fmt: skip
    refused = _cli(policy, "run", str(script))
    # Refused when the file is planned: its admission is the charge's, period budgets included.
    assert refused.exit_code == 4 and "do not fit the remaining budget" in refused.output


def test_a_server_charges_the_person_and_hides_the_period_column(
    owned: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    policy, _ = owned
    users = write_users(tmp_path / "users.json")
    columns = (
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'visits' "
        "ORDER BY column_name"
    )
    with ServerThread(policy, users) as server, connect(server.port, "alice") as conn:
        assert [c for (c,) in conn.execute(columns).fetchall()] == [
            "day", "region", "spend", "user_id"
        ]  # fmt: skip
        conn.execute("SELECT COUNT(*) FROM visits")
        shown = conn.execute("SHOW dpsql.budget").fetchall()[0][0]
    assert shown.startswith("lifetime cap per person")
    (charge,) = charges(policy.parent / "ledger.sqlite")
    assert Fraction(charge.payload["epsilon"]) == Fraction(3, 2)  # 0.5 for each of 3 periods
    assert charge.payload["periods"]["persons"] == 3


def test_the_dbapi_and_the_shell(owned: tuple[Path, list[Path]]) -> None:
    policy, _ = owned
    with dpsql.connect(policy) as conn:
        cursor = conn.cursor()
        cursor.execute(FIRST_TWO)
        assert cursor.fetchone() is not None
        assert conn.budget().epsilon_spent == 1
    with closing(Session(load_policy(policy))) as session:
        shell = Shell(session)
        shown = shell.handle("SELECT SUM(spend) FROM visits WHERE day >= DATE '2026-03-01';")
        assert "charged" in shown
        assert session.budget().epsilon_spent == Fraction(3, 2)
        assert "lifetime cap per person" in shell.handle("\\budget")


VIEW_SQL = "SELECT region, COUNT(*) AS n FROM visits GROUP BY region"


def test_views_from_the_cli_a_batch_file_the_server_and_the_dbapi(
    owned: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    policy, _ = owned
    planned = _ok(_cli(policy, "views", "plan", VIEW_SQL, "--horizon", "12", "--epsilon", "0.25"))
    assert "view mechanism: plain" in planned
    assert "tree never beats plain answers up to 256 periods" in planned
    assert "a person in all 12 periods: epsilon 3" in planned
    assert charges(policy.parent / "ledger.sqlite") == []  # planning charges nothing
    added = _ok(_cli(policy, "views", "add", "monthly", VIEW_SQL, "--start", "2026-01-01",
                     "--every", "month", "--horizon", "12", "--epsilon", "0.25",
                     "--by", "owner"))  # fmt: skip
    assert "view monthly, plain over 12 month(s) from 2026-01-01" in added
    # A block that completes a period releases the view's values as it arrives.
    april = policy.parent / "visits-4.parquet"
    duckdb.sql(f"""COPY (SELECT (i % 200)::BIGINT AS user_id, 'east' AS region,
                  10.0::DOUBLE AS spend, DATE '2026-04-01' + (i % 28)::INTEGER AS day
                  FROM range(300) t(i)) TO '{april}' (FORMAT PARQUET)""")
    registered = _ok(_add(policy, 4, april))
    assert "view monthly: 4 value(s) released" in registered
    assert "monthly: plain, 12 month(s) from 2026-01-01" in _ok(_cli(policy, "views", "list"))
    read = _ok(_cli(policy, "query", "VIEW monthly FROM '2026-01-01' TO '2026-04-01'"))
    assert "period_start" in read and "central" in read
    script = policy.parent / "read.sql"
    script.write_text("VIEW monthly;\nVIEW monthly FROM '2026-02-01' TO '2026-03-01';\n",
                      encoding="utf-8")  # fmt: skip
    _ok(_cli(policy, "run", str(script)))
    (reservation,) = charges(policy.parent / "ledger.sqlite")
    assert Fraction(reservation.payload["epsilon"]) == 3  # 12 periods x 0.25, and nothing more
    users = write_users(tmp_path / "users.json")
    with ServerThread(policy, users) as server, connect(server.port, "alice") as conn:
        rows = conn.execute("VIEW monthly").fetchall()
        assert len(rows) == 4 * 5 and rows[0][2] == "central"
    explained = _ok(_cli(policy, "query", "EXPLAIN VIEW monthly"))
    assert "view monthly: 12 month(s) from 2026-01-01" in explained
    assert "a person in all 12 periods: epsilon 3" in explained
    with closing(Session(load_policy(policy))) as session:
        shown = Shell(session).handle("VIEW monthly FROM '2026-01-01' TO '2026-02-01';")
        assert "central" in shown and "period_start" in shown
    with dpsql.connect(policy) as conn:
        cursor = conn.cursor()
        cursor.execute("VIEW monthly FROM '2026-01-01' TO '2026-03-01'")
        assert [d[0] for d in cursor.description][:4] == ["period_start", "period_end",
                                                           "region", "n"]  # fmt: skip
        assert len(cursor.fetchall()) == 5
    assert len(charges(policy.parent / "ledger.sqlite")) == 1
    report = json.loads(_ok(_cli(policy, "report", "--format", "json")))
    kinds = {entry["kind"] for entry in report["schedule"]}
    assert {"view", "view_value"} <= kinds
    assert "): ok" in _ok(_cli(policy, "ledger", "verify"))
    _ok(_cli(policy, "report", "--format", "html"))
