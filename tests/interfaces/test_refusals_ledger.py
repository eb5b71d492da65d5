"""Every refusal before the charge leaves the durable ledger byte for byte as it was.

One case per error class of docs/errors.md that refuses a query (its "charged?" column says
"no"), each a real statement or command on a durable ledger in tmp_path (the ledger file and
its anchor are compared byte for byte before and after). ``test_every_refusal_class_is_covered``
reads the table of docs/errors.md, so a new error class that can refuse a query cannot be added
without a case here (or a reason in ``NOT_A_QUERY_REFUSAL``).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_batch import POLICY, invoke, sql_file

from dpsql import errors
from dpsql.interfaces.cli import main as cli
from dpsql.policy.load import load_policy
from dpsql.session.session import Session

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "examples" / "data" / "visits.parquet"
PLD = POLICY.replace("query_delta = 1e-8\n", 'query_delta = 1e-8\naccountant = "pld"\n').replace(
    "[tables.visits]\n",
    '[budget.declared_mechanism]\nkind = "discrete_laplace"\nscale = "20"\nsensitivity = 1\n\n'
    "[tables.visits]\n",
    1,
)
# Classes of the table that never refuse a query as such: the roots (every refusal is one of
# their leaves), a dpsql bug (an internal check, no statement triggers it), and
# a query the Spark engine cannot run (needs a Spark policy: tests/engine/test_spark_engine.py).
NOT_A_QUERY_REFUSAL = {"DpsqlError", "QueryError", "InternalError", "NotSupportedOnEngineError"}


def _policy(folder: Path, text: str = POLICY) -> Path:
    path = folder / "policy.toml"
    path.write_text(text.format(data=DATA), encoding="utf-8")
    assert CliRunner().invoke(cli.cli, ["--policy", str(path), "init"]).exit_code == 0
    return path


def _ledger(policy: Path) -> dict[str, bytes]:
    """The ledger's bytes: its file, its anchor, and its WAL (what a commit not yet
    checkpointed holds; absent is empty). SQLite's shared-memory index and the lock file hold
    no record."""
    ledger = policy.parent / "visits.ledger"
    files = {p.name: p.read_bytes() for p in (ledger, policy.parent / "visits.ledger.anchor")}
    wal = ledger.with_name(ledger.name + "-wal")
    files[wal.name] = wal.read_bytes() if wal.exists() else b""
    return files


def _query(sql: str) -> Callable[[Path], None]:
    def run(policy: Path) -> None:
        with closing(Session(load_policy(policy))) as session:
            session.execute(sql)

    return run


def _script(text: str) -> Callable[[Path], None]:
    def run(policy: Path) -> None:
        with closing(Session(load_policy(policy))) as session:
            session.run_script(text)

    return run


def _cli(*args: str, text: str = "SELECT COUNT(*) AS n FROM visits;\n") -> Callable[[Path], None]:
    """``dpsql run`` of a file holding ``text``, its error raised as the class it names."""

    def run(policy: Path) -> None:
        path = sql_file(policy.parent, text, "refused.sql")
        out = policy.parent / "out"
        result = invoke(policy, "run", *[a.format(file=path, out=out) for a in args])
        assert result.exit_code != 0, result.output
        name = re.search(r"Error: (\w+Error):", result.output)
        assert name is not None, result.output
        raise getattr(errors, name.group(1))(result.output)

    return run


def _altered_ledger(policy: Path) -> None:
    """An older copy of the ledger put back after a charge: every query fails closed (the bytes
    compared are the older copy's, which the refusal must leave as they are)."""
    ledger = policy.parent / "visits.ledger"
    older = ledger.read_bytes()
    with closing(Session(load_policy(policy))) as session:
        session.execute("SELECT COUNT(*) AS n FROM visits")
    # The older copy whole: its file, without the WAL that holds the later records.
    for sidecar in ("-wal", "-shm"):
        ledger.with_name(ledger.name + sidecar).unlink(missing_ok=True)
    ledger.write_bytes(older)


def _data_replaced(policy: Path) -> None:
    """A query on a session whose data file was replaced (by rename) since it bound it, under
    the same data version (the session reads a copy of the example data in tmp_path)."""
    data = policy.parent / "visits.parquet"
    shutil.copyfile(DATA, data)
    text = policy.read_text(encoding="utf-8").replace(str(DATA), str(data), 1)
    policy.write_text(text, encoding="utf-8")
    with closing(Session(load_policy(policy))) as session:
        fresh = policy.parent / "visits.new.parquet"
        shutil.copyfile(DATA, fresh)
        os.replace(fresh, data)
        session.execute("SELECT COUNT(*) AS n FROM visits")


def _budget_changed(policy: Path) -> None:
    text = policy.read_text(encoding="utf-8").replace("epsilon = 1.0", "epsilon = 2.0", 1)
    policy.write_text(text, encoding="utf-8")


CASES: list[tuple[str, type[errors.DpsqlError], Callable[[Path], None], str, Any]] = [
    ("syntax", errors.ParseError, _query("SELEC COUNT(*) FROM visits"), POLICY, None),
    ("select distinct", errors.UnsupportedQueryError,
     _query("SELECT DISTINCT region FROM visits"), POLICY, None),
    ("too many aggregates", errors.UnsupportedQueryError,
     _query("SELECT " + ", ".join(f"SUM(spend + {i})" for i in range(30)) + " FROM visits"),
     POLICY, None),
    ("quantile under pld", errors.UndeclaredMechanismError,
     _query("SELECT QUANTILE_CONT(spend, 0.5) AS m FROM visits"), PLD, None),
    ("unknown table", errors.SchemaError, _query("SELECT COUNT(*) FROM nowhere"), POLICY, None),
    ("no bounds", errors.BoundsError, _query("SELECT SUM(age) AS s FROM visits"), POLICY, None),
    ("unsampled diagnosis", errors.BoundsError,
     _script("SET dpsql.diagnose = on;\nSET dpsql.diagnose_epsilon = 1e-20;\n"
             "SELECT COUNT(*) AS n FROM visits;"), POLICY, None),
    ("unsampled partition selection", errors.BoundsError,
     _query("EXPLAIN SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon = 1e-30, "
            "max_groups_per_unit = 1000000) age, COUNT(*) AS n FROM visits GROUP BY age"),
     POLICY, None),
    ("unsampled estimate", errors.BoundsError,
     _script("SET dpsql.epsilon = 1e-30;\nESTIMATE BOUNDS FOR visits.age;"), POLICY, None),
    ("bad epsilon", errors.ParameterError,
     _query("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon = 0) COUNT(*) FROM visits"),
     POLICY, None),
    ("over the budget", errors.BudgetExceededError,
     _query("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon = 5) COUNT(*) FROM visits"),
     POLICY, None),
    ("file over the limit", errors.InputError, _cli("--max-bytes", "8", "{file}"), POLICY, None),
    ("output under a file", errors.OutputError, _cli("--output", "{file}/out", "{file}"), POLICY,
     None),
    ("data replaced", errors.DataChangedError, _data_replaced, POLICY, None),
    ("budget changed since init", errors.PolicyError, _cli("{file}"), POLICY, _budget_changed),
    ("altered ledger", errors.LedgerError, _query("SELECT COUNT(*) AS n FROM visits"), POLICY,
     _altered_ledger),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_refusal_leaves_the_ledger_byte_for_byte_unchanged(
    tmp_path: Path, case: tuple[str, type[errors.DpsqlError], Callable[[Path], None], str, Any]
) -> None:
    name, error, run, policy_text, before = case
    policy = _policy(tmp_path, policy_text)
    if before is not None:
        before(policy)
    kept = _ledger(policy)
    with pytest.raises(error) as raised:
        run(policy)
    assert type(raised.value) is error, (name, raised.value)
    assert _ledger(policy) == kept, name


def _refusal_classes() -> set[str]:
    """The classes of docs/errors.md's table of the dpsql tree that refuse with nothing
    charged: "no", or "—" (a policy refused before any query)."""
    text = (ROOT / "docs" / "errors.md").read_text(encoding="utf-8")
    table = text.split("## The dpsql tree", 1)[1].split("## Numbers in parameters", 1)[0]
    out = set()
    for line in table.splitlines():
        match = re.match(r"\| `dpsql\.errors\.(\w+)` \|.*\| ([^|]+) \|$", line)
        if match and (match.group(2).strip().startswith("no") or match.group(2).strip() == "—"):
            out.add(match.group(1))
    return out


def test_every_refusal_class_is_covered() -> None:
    classes = _refusal_classes()
    assert {"ParseError", "BudgetExceededError", "LedgerError"} <= classes
    covered = {error.__name__ for _, error, _, _, _ in CASES}
    assert classes - NOT_A_QUERY_REFUSAL <= covered, classes - NOT_A_QUERY_REFUSAL - covered


# -- every statement kind at tiny and huge epsilons, under extreme bounds --------------------------
KINDS = (
    "SELECT COUNT(*) AS n FROM visits",
    "SELECT SUM(spend) AS s FROM visits",
    "SELECT region, AVG(spend) AS a FROM visits GROUP BY region",
    "SELECT STDDEV(spend) AS d FROM visits",
    "SELECT QUANTILE_CONT(spend, 0.5) AS m FROM visits",
    "SELECT age, COUNT(*) AS n FROM visits GROUP BY age",  # private keys: partition selection
    "SELECT COUNT(DISTINCT region) AS n FROM visits",
    "ESTIMATE BOUNDS FOR visits.spend",
    "ESTIMATE BOUNDS FOR visits GROUP BY region",
    "ESTIMATE BOUNDS FOR visits",
)
EPSILONS = ("1e-300", "1e-30", "1e-17", "1e-15", "1e-9", "0.001", "1", "20")
SETTINGS = (
    "",
    "SET dpsql.mechanism = 'gaussian';",
    "SET dpsql.diagnose = on; SET dpsql.diagnose_epsilon = 1e-19;",
    "SET dpsql.max_rows_per_unit_per_group = 1000000; SET dpsql.max_groups_per_unit = 1000000;",
    "SET dpsql.max_rows_per_unit = 1000000;",
    "SET dpsql.delta = 1e-300;",
)
# Spend bounded at +-2^52, the largest bounds a policy may declare.
EXTREME = POLICY.replace(
    "lower = 0\nupper = 200", "lower = -4503599627370496\nupper = 4503599627370496"
)
WIDE = "epsilon = 1000.0"


@settings(
    max_examples=examples(20),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(kind=st.sampled_from(KINDS), epsilon=st.sampled_from(EPSILONS),
       setting=st.sampled_from(SETTINGS), extreme=st.booleans())  # fmt: skip
def test_any_statement_is_answered_or_refused_before_the_charge(
    tmp_path_factory: pytest.TempPathFactory, kind: str, epsilon: str, setting: str,
    extreme: bool,
) -> None:  # fmt: skip
    text = (EXTREME if extreme else POLICY).replace("epsilon = 1.0", WIDE, 1)
    policy = _policy(tmp_path_factory.mktemp("ledger"), text)
    kept = _ledger(policy)
    script = f"{setting}\nSET dpsql.epsilon = {epsilon};\n{kind};"
    try:
        _script(script)(policy)
    except (errors.QueryError, errors.BudgetExceededError) as exc:
        # Refused: before the charge, and nothing written.
        assert _ledger(policy) == kept, (script, exc)
    # Anything else (an engine or entropy error after the charge, an internal error) fails.
