"""The budget's cap, its filter and the filter's fixed parameters live in the ledger from its
creation (DESIGN.md section 5): a policy that disagrees is refused, whichever interface opens
the ledger, and a ledger is created only by ``dpsql init``.

An attacker who could edit the policy file (or pass another dict to ``dpsql.connect``) used to
raise the cap of an exhausted ledger silently. These tests generate random mismatches between
the policy a ledger was created with and the policy that opens it, and check that every
interface refuses exactly the mismatched ones, charges nothing and leaves the ledger verifying.
"""

from __future__ import annotations

import json
import sqlite3
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_ledger import COUNT, ledger_policy

import dpsql
from dpsql.accounting.ledger.anchor import read_anchor
from dpsql.accounting.ledger.ledger import BUDGET_RECORD, Ledger
from dpsql.accounting.ledger.store import budget_caps, create_ledger
from dpsql.accounting.theorems.zcdp import ZcdpFilter
from dpsql.errors import BudgetExceededError, LedgerError, PolicyError
from dpsql.interfaces.cli import main as cli
from dpsql.interfaces.cli.context import EXIT_CODES
from dpsql.policy import load_policy
from dpsql.session.session import Session

BASE: dict[str, Any] = {"epsilon": "3", "delta": "0.000001", "query_epsilon": "1"}


def _budget(draw: st.DrawFn) -> dict[str, Any]:
    """A valid budget section: caps, filter and parameters, shares, per-query defaults."""
    accountant = draw(st.sampled_from(["basic", "advanced", "rdp", "zcdp", "pld"]))
    budget: dict[str, Any] = {
        "epsilon": draw(st.sampled_from(["3", "3.5", "30", "2.9999"])),
        "delta": draw(st.sampled_from(["0.000001", "0.00001"])),
        "query_epsilon": draw(st.sampled_from(["1", "0.5"])),
        "accountant": accountant,
    }
    if accountant == "advanced":
        budget["advanced_delta_prime"] = draw(st.sampled_from(["0.0000001", "0.0000005"]))
    if accountant == "rdp" and draw(st.booleans()):
        budget["rdp_order"] = draw(st.sampled_from([8.0, 32.0]))  # order 2 admits nothing
    if accountant in ("rdp", "zcdp") and draw(st.booleans()):
        budget["selection_delta"] = draw(st.sampled_from(["0", "0.0000001"]))
    if accountant in ("rdp", "zcdp") and draw(st.booleans()):
        budget["filter_version"] = draw(st.sampled_from([1, 2]))
    if accountant == "pld":  # the run below sets epsilon 0.05: one measurement of this
        budget["declared_mechanism"] = {"kind": "discrete_laplace", "scale": "20", "sensitivity": 1}
    if draw(st.booleans()):
        shares = draw(st.sampled_from(["1", "2"]))
        budget["analysts"] = {"ann": {"epsilon": shares, "delta": budget["delta"]}}
    return budget


budgets = st.composite(_budget)()


def _raw(folder: Path, budget: dict[str, Any]) -> dict[str, Any]:
    raw = ledger_policy(folder)
    raw["budget"] = {"diagnose": False, **budget}  # each query its own loss alone
    return raw


def _records(path: Path) -> list[tuple[int, str]]:
    con = sqlite3.connect(path)
    try:
        return con.execute("SELECT seq, kind FROM records ORDER BY seq").fetchall()
    finally:
        con.close()


def _toml(raw: dict[str, Any], path: Path) -> Path:
    """The policy as a TOML file (the data and ledger paths as strings)."""

    def value(v: Any) -> str:
        return json.dumps(v) if not isinstance(v, float) else repr(v)

    lines = [
        f'[dataset]\nid = "{raw["dataset"]["id"]}"\n',
        f"[data]\ntables = {{ visits = {json.dumps(raw['data']['tables']['visits'])} }}\n",
        f"[ledger]\npath = {json.dumps(raw['ledger']['path'])}\n",
        "[budget]",
    ]
    budget = dict(raw["budget"])
    shares = budget.pop("analysts", {})
    declared = budget.pop("declared_mechanism", None)
    lines += [f"{k} = {value(v)}" for k, v in budget.items()]
    if declared is not None:
        lines.append("\n[budget.declared_mechanism]")
        lines += [f"{k} = {value(v)}" for k, v in declared.items()]
    for name, share in shares.items():
        lines.append(f"\n[budget.analysts.{name}]")
        lines += [f"{k} = {value(v)}" for k, v in share.items()]
    spec = raw["tables"]["visits"]
    lines += [
        "\n[tables.visits]",
        f'privacy_unit = "{spec["privacy_unit"]}"',
        f"max_groups_per_unit = {spec['max_groups_per_unit']}",
        f"max_rows_per_unit_per_group = {spec['max_rows_per_unit_per_group']}",
        "\n[tables.visits.columns.age]\nlower = 18\nupper = 90",
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# Each mutation changes one field of a budget; the caps change unless it is a per-query default.
MUTATIONS: dict[str, tuple[str, Any]] = {
    "epsilon up": ("epsilon", "4"),
    "epsilon down": ("epsilon", "2.5"),
    "delta": ("delta", "0.00001"),
    "filter": ("accountant", "zcdp"),
    "advanced delta'": ("advanced_delta_prime", "0.0000002"),
    "rdp order": ("rdp_order", 4.0),
    "selection delta": ("selection_delta", "0.0000002"),
    "filter version": ("filter_version", 1),
    "declared scale": (
        "declared_mechanism",
        {"kind": "discrete_laplace", "scale": "40", "sensitivity": 1},
    ),
    "declared kind": (
        "declared_mechanism",
        {"kind": "discrete_gaussian", "sigma": "20", "sensitivity": 1},
    ),
    "share up": ("analysts", {"ann": {"epsilon": "3", "delta": "0.000001"}}),
    "share added": ("analysts", {"bob": {"epsilon": "1", "delta": "0.000001"}}),
    "shares dropped": ("analysts", {}),
    "query epsilon": ("query_epsilon", "0.25"),
    "query delta": ("query_delta", "0.0000001"),
}


def _mutated(budget: dict[str, Any], name: str) -> dict[str, Any] | None:
    """``budget`` with one mutation applied, or None where it would not be a valid policy."""
    key, value = MUTATIONS[name]
    if budget.get(key, {} if key == "analysts" else None) == value:
        return None
    out = {**budget, key: value}
    if key == "advanced_delta_prime" and budget["accountant"] != "advanced":
        return None
    if key == "rdp_order" and budget["accountant"] != "rdp":
        return None
    if key in ("selection_delta", "filter_version") and budget["accountant"] not in ("rdp", "zcdp"):
        return None
    if key == "declared_mechanism" and budget["accountant"] != "pld":
        return None
    if key == "accountant":
        out["accountant"] = "rdp" if budget["accountant"] == "zcdp" else "zcdp"
        out.pop("advanced_delta_prime", None)
        out.pop("rdp_order", None)
        out.pop("filter_version", None)
        out.pop("declared_mechanism", None)
    return out


@settings(
    max_examples=examples(30),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(created=budgets, mutation=st.sampled_from(sorted(MUTATIONS)))
def test_every_interface_refuses_a_policy_whose_budget_differs_from_the_ledger(
    tmp_path_factory: pytest.TempPathFactory, created: dict[str, Any], mutation: str
) -> None:
    opened = _mutated(created, mutation)
    if opened is None:
        return
    folder = tmp_path_factory.mktemp("pinned")
    create_ledger(load_policy(_raw(folder, created)))
    ledger = folder / "ledger.db"
    before = _records(ledger)
    raw = _raw(folder, opened)
    try:
        load_policy(raw)
    except PolicyError:
        return  # not a valid policy at all (a share above the total)
    differs = budget_caps(load_policy(raw).budget) != budget_caps(
        load_policy(_raw(folder, created)).budget
    )
    assert differs != mutation.startswith("query")  # per-query defaults are not caps
    policy_file = _toml(raw, folder / "policy.toml")
    # DB-API with a dict and with a policy file, the Session core, and the CLI.
    opens = [
        lambda: dpsql.connect(raw).close(),
        lambda: dpsql.connect(str(policy_file)).close(),
        lambda: Session(load_policy(raw)).close(),
    ]
    for open_ in opens:
        if differs:
            with pytest.raises(PolicyError, match="differs from the one its ledger was created"):
                open_()
        else:
            open_()
    for args in (["budget"], ["report"], ["run", str(_sql(folder))]):
        result = CliRunner().invoke(
            cli.cli, ["--policy", str(policy_file), "--analyst", "ann", *args]
        )
        if differs:
            assert result.exit_code == EXIT_CODES[PolicyError], (args, result.output)
        else:  # opens; a tight filter (rdp at one order) may still refuse the query itself
            allowed = (0, EXIT_CODES[BudgetExceededError]) if args[0] == "run" else (0,)
            assert result.exit_code in allowed, (args, result.output, result.stderr)
    if differs:
        assert _records(ledger) == before  # nothing charged, nothing written
    assert Ledger(ledger).verify() == len(_records(ledger))


def _sql(folder: Path) -> Path:
    path = folder / "queries.sql"
    # Small enough for every filter (advanced composition is costly for large epsilons).
    path.write_text("SET dpsql.epsilon = 0.05;\n" + COUNT + ";\n", encoding="utf-8")
    return path


def test_a_larger_epsilon_in_the_policy_does_not_reopen_an_exhausted_ledger(
    tmp_path: Path,
) -> None:
    raw = _raw(tmp_path, dict(BASE))
    create_ledger(load_policy(raw))
    conn = dpsql.connect(raw)
    for _ in range(3):
        conn.cursor().execute(COUNT, fresh=True)
    with pytest.raises(BudgetExceededError):
        conn.cursor().execute(COUNT, fresh=True)
    conn.close()
    bigger = _raw(tmp_path, {**BASE, "epsilon": "1000"})
    with pytest.raises(PolicyError, match=r"budget\.epsilon is 1000 in the policy, 3 in the"):
        dpsql.connect(bigger)
    # An owner's top-up is the one way to raise the cap, and it is recorded.
    session = Session(load_policy(raw))
    session.filter.add(Fraction(1), Fraction(0), by="owner", why="more")
    session.execute(COUNT, fresh=True)
    with pytest.raises(BudgetExceededError):
        session.execute(COUNT, fresh=True)
    session.close()
    kinds = [k for _, k in _records(tmp_path / "ledger.db") if k != "release"]
    assert kinds == [BUDGET_RECORD, "charge", "charge", "charge", "budget_add", "charge"]


def test_opening_a_session_never_creates_a_ledger(tmp_path: Path) -> None:
    raw = _raw(tmp_path, dict(BASE))
    with pytest.raises(LedgerError, match="dpsql init"):
        dpsql.connect(raw)
    assert not (tmp_path / "ledger.db").exists()
    assert not (tmp_path / "ledger.db.anchor").exists()


@pytest.mark.parametrize("accountant", ["basic", "rdp"])
def test_a_ledger_without_a_budget_record_is_refused_until_the_owner_pins_it(
    tmp_path: Path, accountant: str
) -> None:
    raw = _raw(tmp_path, {**BASE, "accountant": accountant})
    policy = load_policy(raw)
    # A ledger as an earlier dpsql made it: no budget record at all.
    Ledger.create(tmp_path / "ledger.db", policy.dataset.id, budget={})
    con = sqlite3.connect(tmp_path / "ledger.db")
    with con:
        con.execute("DELETE FROM records")
    con.close()
    (tmp_path / "ledger.db.anchor").write_text(
        json.dumps({**read_anchor(tmp_path / "ledger.db.anchor"), "seq": 0, "head": "0" * 64})
    )
    with pytest.raises(LedgerError, match="pin-budget"):
        Session(policy)
    policy_file = _toml(raw, tmp_path / "policy.toml")
    pin = ["--policy", str(policy_file), "ledger", "pin-budget", "--by", "owner", "--why", "v2"]
    assert CliRunner().invoke(cli.cli, pin).exit_code == 0
    Session(policy).close()
    again = CliRunner().invoke(cli.cli, pin)
    assert again.exit_code == EXIT_CODES[LedgerError]
    assert [k for _, k in _records(tmp_path / "ledger.db")] == [BUDGET_RECORD]
    # Such a ledger's history was decided by version 1 of the rdp/zcdp defaults: pinned so.
    (record,) = Ledger(tmp_path / "ledger.db").records()
    assert record.payload["filter_version"] == (1 if accountant == "rdp" else None)


RDP = {"epsilon": "1", "delta": "0.000001", "query_epsilon": "0.05", "accountant": "rdp"}


def _fill(raw: dict[str, Any]) -> int:
    """Fresh COUNTs of epsilon 0.05 until the ledger's filter refuses one."""
    session = Session(load_policy(raw))
    try:
        for n in range(200):
            try:
                session.execute(COUNT, fresh=True)
            except BudgetExceededError:
                return n
        raise AssertionError("the cap never binds")
    finally:
        session.close()


def test_a_ledger_created_with_version_1_keeps_deciding_with_it(tmp_path: Path) -> None:
    # A ledger as the dpsql before versions made it: its budget record names none.
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir(), new.mkdir()
    raw_old, raw_new = _raw(old, dict(RDP)), _raw(new, dict(RDP))
    caps = budget_caps(load_policy(raw_old).budget)
    assert caps.pop("filter_version") == 2  # what a new ledger pins
    Ledger.create(old / "ledger.db", load_policy(raw_old).dataset.id, budget=caps)
    create_ledger(load_policy(raw_new))
    session = Session(load_policy(raw_old))
    assert session.filter.spec.filter_version == 1
    session.close()
    # The same policy, unchanged: version 1 (42 orders split equally, half of delta reserved)
    # on the old ledger, version 2 on the new one.
    assert (_fill(raw_old), _fill(raw_new)) == (20, 22)
    (first, *_) = Ledger(new / "ledger.db").records()
    assert first.payload["filter_version"] == 2
    # A policy may state the version only as its ledger has it.
    with pytest.raises(PolicyError, match=r"budget\.filter_version is 2 in the policy, 1 in the"):
        Session(load_policy(_raw(old, {**RDP, "filter_version": 2})))
    Session(load_policy(_raw(old, {**RDP, "filter_version": 1}))).close()
    with pytest.raises(PolicyError, match=r"budget\.filter_version is 1 in the policy, 2 in the"):
        Session(load_policy(_raw(new, {**RDP, "filter_version": 1})))


def test_a_zcdp_ledger_of_version_1_keeps_half_of_delta_for_selection(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir(), new.mkdir()
    raw_old, raw_new = (
        _raw(old, {**RDP, "accountant": "zcdp"}),
        _raw(new, {**RDP, "accountant": "zcdp"}),
    )
    caps = budget_caps(load_policy(raw_old).budget)
    del caps["filter_version"]
    Ledger.create(old / "ledger.db", load_policy(raw_old).dataset.id, budget=caps)
    create_ledger(load_policy(raw_new))
    reserved = []
    for raw in (raw_old, raw_new):
        session = Session(load_policy(raw))
        try:
            decider = session.filter._decider(Fraction(1), Fraction(1, 10**6), None)
        finally:
            session.close()
        assert isinstance(decider, ZcdpFilter)
        reserved.append(decider.approx_delta_cap)
    assert reserved == [Fraction(1, 2 * 10**6), Fraction(1, 10**7)]
