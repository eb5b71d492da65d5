"""The durable ledger's guarantees, through a real Session: tampering of every kind fails closed
(``LedgerError``; ``LedgerFailure`` through DB-API) and never resets the budget; a failed write
releases nothing; charges, top-ups and allocations survive restarts; export keeps the chain.

``ledger_policy`` and ``open_session`` are shared with the concurrency and crash tests.
"""

from __future__ import annotations

import json
import multiprocessing
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from conftest import write_parquet

import dpsql
from dpsql.accounting.ledger import ledger as ledger_module
from dpsql.accounting.ledger.anchor import anchor_path, read_anchor
from dpsql.accounting.ledger.chain import GENESIS, canonical, record_hash
from dpsql.accounting.ledger.ledger import Ledger
from dpsql.accounting.ledger.store import create_ledger
from dpsql.errors import BudgetExceededError, LedgerError
from dpsql.policy import Policy, load_policy
from dpsql.session.session import Session

DATASET = "ledger-test"
ROWS = [(u, ["east", "west"][u % 2], 20 + u % 50, float(u % 200)) for u in range(1, 60)]
COUNT = "SELECT COUNT(*) FROM visits"


def ledger_policy(folder: Path, epsilon: str = "10", dataset: str = DATASET) -> dict[str, Any]:
    """A policy (plain data, picklable for worker processes) over a tiny Parquet file, whose
    budget lives in the durable ledger ``folder/ledger.db``; ``Ledger.create`` it first."""
    data = folder / "visits.parquet"
    if not data.exists():
        schema = (("user_id", "BIGINT"), ("region", "VARCHAR"), ("age", "INTEGER"))
        write_parquet(data, [r[:3] for r in ROWS], schema)
    return {
        "dataset": {"id": dataset, "data_version": "1"},
        "data": {"tables": {"visits": str(data)}},
        "budget": {
            "diagnose": False,
            "epsilon": epsilon,
            "delta": "0.000001",
            "query_epsilon": "1",
        },
        "tables": {
            "visits": {
                "privacy_unit": "user_id",
                "max_groups_per_unit": 1,
                "max_rows_per_unit_per_group": 1,
                "columns": {"age": {"lower": 18, "upper": 90}},
            }
        },
        "ledger": {"path": str(folder / "ledger.db")},
    }


def worker_context() -> Any:
    """Processes for the concurrency and crash tests: forked from a server that has imported
    dpsql once (fast to start) but holds no DuckDB connection or thread (unlike pytest's own
    process, which fork would copy)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["dpsql.session.session", "test_ledger"])
    return ctx


def open_session(raw: dict[str, Any], analyst: str | None = None) -> Session:
    return Session(load_policy(raw, base_dir=Path(raw["ledger"]["path"]).parent), analyst)


def charges_in(path: Path) -> list[tuple[int, str, Fraction]]:
    """(seq, query, epsilon) of every charge record, read with plain sqlite3 (no dpsql)."""
    con = sqlite3.connect(path)
    try:
        rows = con.execute("SELECT seq, payload FROM records WHERE kind = 'charge' ORDER BY seq")
        out = []
        for seq, payload in rows.fetchall():
            body = json.loads(payload)
            out.append((seq, body["query"], Fraction(body["epsilon"])))
        return out
    finally:
        con.close()


def checkpoint(path: Path) -> None:
    """Fold the WAL into the main file, so that copying the main file copies the ledger."""
    con = sqlite3.connect(path)
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        con.close()


def sql(path: Path, statement: str, params: tuple[Any, ...] = ()) -> None:
    con = sqlite3.connect(path)
    try:
        with con:
            con.execute(statement, params)
    finally:
        con.close()


class Spent:
    """A charged ledger: ``charge(n)`` spends n queries of epsilon 1 through a Session."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.raw = ledger_policy(folder)
        self.path = folder / "ledger.db"
        self.anchor = anchor_path(self.path)
        create_ledger(load_policy(self.raw))

    @property
    def policy(self) -> Policy:
        return load_policy(self.raw, base_dir=self.folder)

    def charge(self, n: int) -> None:
        session = open_session(self.raw)
        try:
            for _ in range(n):
                session.execute(COUNT, epsilon=1, fresh=True)
        finally:
            session.close()


@pytest.fixture
def spent(tmp_path: Path) -> Spent:
    ledger = Spent(tmp_path)
    ledger.charge(5)
    return ledger


# -- tampering ----------------------------------------------------------------------------------


def _row(path: Path, seq: int) -> tuple[Any, ...]:
    con = sqlite3.connect(path)
    try:
        row = con.execute("SELECT * FROM records WHERE seq = ?", (seq,)).fetchone()
        assert row is not None
        return tuple(row)
    finally:
        con.close()


def _cheaper(payload: str) -> str:
    body = json.loads(payload)
    body["epsilon"] = "0"
    return canonical(body)


def _charge_seqs(path: Path) -> list[int]:
    return [seq for seq, _, _ in charges_in(path)]


def _last_seq(path: Path) -> int:
    con = sqlite3.connect(path)
    try:
        return int(con.execute("SELECT MAX(seq) FROM records").fetchone()[0])
    finally:
        con.close()


def edit_payload(s: Spent) -> None:
    seq, _, _, _, payload, _, _ = _row(s.path, _charge_seqs(s.path)[1])
    sql(s.path, "UPDATE records SET payload = ? WHERE seq = ?", (_cheaper(payload), seq))


def _rehash(s: Spent, seq: int) -> None:
    _, when, kind, analyst, payload, prev, _ = _row(s.path, seq)
    payload = _cheaper(payload)
    digest = record_hash(prev, (seq, when, kind, analyst, payload))
    sql(s.path, "UPDATE records SET payload = ?, hash = ? WHERE seq = ?", (payload, digest, seq))


def rehash_middle(s: Spent) -> None:
    _rehash(
        s, _charge_seqs(s.path)[1]
    )  # consistent with its payload, but the next record links the old hash


def rehash_tail(s: Spent) -> None:
    _rehash(s, _last_seq(s.path))  # the chain is whole; only the anchor's head disagrees


def rechain_everything(s: Spent, forge: Callable[[str], str] = _cheaper) -> None:
    """Forge a fully consistent chain after an edit (needs no secret): the anchor catches it."""
    con = sqlite3.connect(s.path)
    try:
        rows = con.execute("SELECT * FROM records ORDER BY seq").fetchall()
        prev = GENESIS
        with con:
            for seq, when, kind, analyst, stored, _, _ in rows:
                payload = forge(stored) if kind == "charge" else stored
                digest = record_hash(prev, (seq, when, kind, analyst, payload))
                con.execute(
                    "UPDATE records SET payload = ?, prev = ?, hash = ? WHERE seq = ?",
                    (payload, prev, digest, seq),
                )
                prev = digest
    finally:
        con.close()


def deeply_nested_payload(s: Spent) -> None:
    """A consistent chain over payloads nested past json's recursion limit: fail closed, typed."""
    rechain_everything(s, lambda _: "[" * 100_000 + "]" * 100_000)


def drop_record(s: Spent) -> None:
    sql(s.path, "DELETE FROM records WHERE seq = ?", (_charge_seqs(s.path)[1],))


def truncate_tail(s: Spent) -> None:
    sql(s.path, "DELETE FROM records WHERE seq > ?", (_last_seq(s.path) - 3,))


def drop_everything(s: Spent) -> None:
    sql(s.path, "DELETE FROM records")


def _remove_ledger_file(s: Spent) -> None:
    for suffix in ("", "-wal", "-shm"):
        s.path.with_name(s.path.name + suffix).unlink(missing_ok=True)


def delete_file(s: Spent) -> None:
    _remove_ledger_file(s)


def empty_file(s: Spent) -> None:
    _remove_ledger_file(s)
    s.path.write_bytes(b"")


def delete_anchor(s: Spent) -> None:
    s.anchor.unlink()


def old_copy_put_back(s: Spent) -> None:
    _remove_ledger_file(s)
    shutil.copy(s.folder / "old.db", s.path)


def garbage(s: Spent) -> None:
    _remove_ledger_file(s)
    s.path.write_bytes(bytes(range(256)) * 64)


def garbage_anchor(s: Spent) -> None:
    s.anchor.write_bytes(b"\x00\xff not json")


def other_ledger_file(s: Spent) -> None:
    """Another ledger's file (same data set) in place of this one, this anchor left."""
    other = s.folder / "other"
    other.mkdir()
    create_ledger(load_policy(ledger_policy(other)))
    _remove_ledger_file(s)
    shutil.copy(other / "ledger.db", s.path)


def other_dataset(s: Spent) -> None:
    """A whole ledger (file and anchor) that belongs to another data set."""
    other = s.folder / "other"
    other.mkdir()
    create_ledger(load_policy(ledger_policy(other, dataset="another-data-set")))
    _remove_ledger_file(s)
    shutil.copy(other / "ledger.db", s.path)
    shutil.copy(anchor_path(other / "ledger.db"), s.anchor)


TAMPERS: dict[str, Callable[[Spent], None]] = {
    f.__name__: f
    for f in (
        edit_payload,
        rehash_middle,
        rehash_tail,
        rechain_everything,
        deeply_nested_payload,
        drop_record,
        truncate_tail,
        drop_everything,
        delete_file,
        empty_file,
        delete_anchor,
        old_copy_put_back,
        garbage,
        garbage_anchor,
        other_ledger_file,
        other_dataset,
    )
}


@pytest.fixture(params=sorted(TAMPERS))
def tampered(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Spent]:
    s = Spent(tmp_path)
    s.charge(3)
    checkpoint(s.path)
    shutil.copy(s.path, tmp_path / "old.db")  # an older version, for old_copy_put_back
    s.charge(2)
    before = charges_in(s.path)
    assert [e for _, _, e in before] == [1] * 5
    TAMPERS[request.param](s)
    yield s
    # Never reset: after the test, a session still cannot open (no fresh, empty, trusted ledger
    # was recreated in place of the history by a failed attempt).
    with pytest.raises(LedgerError):
        open_session(s.raw)


def test_a_tampered_ledger_stops_every_new_session(tampered: Spent) -> None:
    with pytest.raises(LedgerError):
        open_session(tampered.raw)
    with pytest.raises(dpsql.LedgerFailure) as info:
        dpsql.connect(tampered.policy)
    assert isinstance(info.value, dpsql.OperationalError)
    assert isinstance(info.value, LedgerError)
    assert str(info.value)  # a clear message, e.g. "... was altered", "... is missing"


def test_dpsql_init_cannot_reset_a_tampered_ledger(tampered: Spent) -> None:
    # Re-running ``dpsql init`` over whatever is left must refuse: it would reset the budget.
    if tampered.path.exists() or tampered.anchor.exists():
        with pytest.raises(LedgerError):
            create_ledger(load_policy(tampered.raw))
    with pytest.raises(LedgerError):
        open_session(tampered.raw)


@pytest.mark.parametrize(
    "tamper",
    [
        truncate_tail,
        drop_everything,
        rehash_tail,
        delete_file,
        old_copy_put_back,
        garbage,
        delete_anchor,
        garbage_anchor,
    ],
)
def test_a_running_session_refuses_after_the_ledger_changes_under_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tamper: Callable[[Spent], None]
) -> None:
    s = Spent(tmp_path)
    s.charge(3)
    checkpoint(s.path)
    shutil.copy(s.path, tmp_path / "old.db")
    session = open_session(s.raw)
    session.execute(COUNT, epsilon=1, fresh=True)
    session.execute(COUNT, epsilon=1, fresh=True)
    runs: list[str] = []
    monkeypatch.setattr(session.engine, "run", runs.append)
    tamper(s)
    with pytest.raises(LedgerError):
        session.execute(COUNT, epsilon=1, fresh=True)
    assert runs == []  # the engine never ran: nothing released
    session.close()


@pytest.mark.parametrize("tamper", [edit_payload, drop_record])
def test_a_running_session_refuses_after_an_earlier_record_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tamper: Callable[[Spent], None]
) -> None:
    s = Spent(tmp_path)
    s.charge(3)
    session = open_session(s.raw)
    session.execute(COUNT, epsilon=1, fresh=True)
    session.execute(COUNT, epsilon=1, fresh=True)
    tamper(s)
    with pytest.raises(LedgerError):
        session.execute(COUNT, epsilon=1, fresh=True)
    session.close()


def test_an_edited_identity_is_detected(spent: Spent) -> None:
    sql(spent.path, "UPDATE meta SET value = '12345' WHERE key = 'salt'")
    with pytest.raises(LedgerError):
        Ledger(spent.path)


def test_an_untampered_ledger_opens_and_verifies(spent: Spent) -> None:
    # The control for every tamper test: the same steps without the tampering pass.
    checkpoint(spent.path)
    ledger = Ledger(spent.path)
    assert ledger.verify() == _last_seq(spent.path) >= 5
    assert len(charges_in(spent.path)) == 5
    session = open_session(spent.raw)
    assert session.budget().epsilon_spent == 5
    session.close()


# -- failed writes --------------------------------------------------------------------------------


def test_a_failed_write_refuses_the_query_and_releases_nothing(
    spent: Spent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger is read-only for this process (as root chmod stops nothing, so the
    connection itself is opened read-only): the INSERT fails as on a read-only file system.
    A Ledger keeps its connection, so the session is opened over the read-only one."""
    before = _last_seq(spent.path)
    real = ledger_module._connect

    def read_only(path: Path) -> sqlite3.Connection:
        real(path).close()  # the file exists and is in WAL mode
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=60, isolation_level=None)
        return con

    monkeypatch.setattr(ledger_module, "_connect", read_only)
    session = open_session(spent.raw)
    runs: list[str] = []
    monkeypatch.setattr(session.engine, "run", runs.append)
    with pytest.raises(LedgerError, match="nothing was released"):
        session.execute(COUNT, epsilon=1, fresh=True)
    with pytest.raises(dpsql.LedgerFailure):
        dpsql.Connection(session).cursor().execute(COUNT)
    assert runs == []
    monkeypatch.setattr(ledger_module, "_connect", real)
    assert len(charges_in(spent.path)) == 5  # nothing was charged either
    assert Ledger(spent.path).verify() == before
    session.close()


def test_a_failed_insert_refuses_the_query_and_releases_nothing(
    spent: Spent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk-full error at the INSERT (SQLITE_FULL), on the connection the session's ledger
    keeps (so it is opened while the disk is full)."""
    before = _last_seq(spent.path)
    real = ledger_module._connect

    class Full:
        def __init__(self, con: sqlite3.Connection):
            self._con = con

        def execute(self, statement: str, *args: Any) -> sqlite3.Cursor:
            if statement.lstrip().upper().startswith("INSERT"):
                raise sqlite3.OperationalError("database or disk is full")
            return self._con.execute(statement, *args)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._con, name)

    monkeypatch.setattr(ledger_module, "_connect", lambda path: Full(real(path)))
    session = open_session(spent.raw)
    runs: list[str] = []
    monkeypatch.setattr(session.engine, "run", runs.append)
    with pytest.raises(LedgerError):
        session.execute(COUNT, epsilon=1, fresh=True)
    assert runs == []
    monkeypatch.setattr(ledger_module, "_connect", real)
    assert len(charges_in(spent.path)) == 5
    assert Ledger(spent.path).verify() == before
    # The session recovers once the disk has room again, and its next charge chains on.
    monkeypatch.undo()
    assert session.execute(COUNT, epsilon=1, fresh=True).rows
    assert len(charges_in(spent.path)) == 6
    assert Ledger(spent.path).verify() == _last_seq(spent.path) > before
    session.close()


def test_a_failed_anchor_write_releases_nothing(
    spent: Spent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The charge commits, then the anchor cannot be written: the query is refused (the charge
    stays: conservative), and the ledger, ahead of its anchor, still verifies. The engine works
    while the disk syncs (group commit), so it has run: its answer is dropped, not released."""
    session = open_session(spent.raw)
    before = _last_seq(spent.path)
    runs: list[str] = []
    run = session.engine.run

    def counted(sql: str) -> Any:
        runs.append(sql)
        return run(sql)

    monkeypatch.setattr(session.engine, "run", counted)

    def fail(path: Path, data: Any) -> None:
        raise LedgerError("the ledger's anchor could not be written")

    monkeypatch.setattr(ledger_module, "_write_anchor", fail)
    with pytest.raises(LedgerError):
        session.execute(COUNT, epsilon=1, fresh=True)
    assert runs  # the engine ran beside the sync; the LedgerError took its answer's place
    monkeypatch.undo()
    assert len(charges_in(spent.path)) == 6
    assert _last_seq(spent.path) == before + 1  # the charge, and no release record
    assert Ledger(spent.path).verify() == before + 1
    session.close()


# -- restarts, administration, export ------------------------------------------------------------


def test_charges_carry_over_restarts_and_the_cap_holds_across_them(tmp_path: Path) -> None:
    s = Spent(tmp_path)  # epsilon 10
    s.charge(4)
    session = open_session(s.raw)
    assert session.budget().epsilon_spent == 4
    assert session.budget().durable
    session.execute(COUNT, epsilon=5, fresh=True)
    session.close()
    session = open_session(s.raw)
    assert session.budget().epsilon_spent == 9
    runs: list[str] = []
    session.engine.run = runs.append  # type: ignore[method-assign,assignment]
    with pytest.raises(BudgetExceededError):
        session.execute(
            COUNT, epsilon=2, fresh=True
        )  # 9 + 2 > 10, with the 9 spent by earlier processes
    assert runs == []
    session.close()
    session = open_session(s.raw)
    assert session.execute(COUNT, epsilon=1, fresh=True).rows  # exactly to the cap
    with pytest.raises(BudgetExceededError):
        session.execute(COUNT, epsilon="0.001", fresh=True)
    assert session.budget().epsilon_spent == 10
    session.close()
    assert sum(e for _, _, e in charges_in(s.path)) == 10


def test_top_ups_and_allocations_are_recorded_and_take_effect(tmp_path: Path) -> None:
    s = Spent(tmp_path)
    s.charge(10)  # the whole budget
    owner = open_session(s.raw)
    with pytest.raises(BudgetExceededError):
        owner.execute(COUNT, epsilon=1, fresh=True)
    owner.filter.add(Fraction(3), Fraction(0), by="owner", why="new quarter")
    owner.filter.allocate("alice", Fraction(2), Fraction(0), by="owner", why="pilot study")
    owner.close()

    alice = open_session(s.raw, analyst="alice")  # a restart: read back from the ledger
    report = alice.budget()
    assert report.epsilon_total == 13 and report.epsilon_spent == 10
    alice.execute(COUNT, epsilon=2, fresh=True)
    with pytest.raises(BudgetExceededError, match="alice"):
        alice.execute(
            COUNT, epsilon="0.5", fresh=True
        )  # her share is used up; the data set has 1 left
    alice.close()
    bob = open_session(s.raw, analyst="bob")
    with pytest.raises(BudgetExceededError):
        bob.execute(
            COUNT, epsilon="0.5", fresh=True
        )  # shares declared: only named analysts may spend
    bob.close()

    records = Ledger(s.path).records()
    kinds = [r.kind for r in records if r.kind != "release"]  # the cache's own records
    assert kinds == ["budget"] + ["charge"] * 10 + ["budget_add", "allocate", "charge"]
    (add,) = [r.payload for r in records if r.kind == "budget_add"]
    (allocate,) = [r.payload for r in records if r.kind == "allocate"]
    assert add == {"epsilon": "3", "delta": "0", "by": "owner", "why": "new quarter"}
    assert allocate["analyst"] == "alice" and allocate["by"] == "owner"
    assert [r for r in records if r.kind == "charge"][-1].analyst == "alice"


def test_export_yields_every_record_with_its_chain(spent: Spent) -> None:
    spent_session = open_session(spent.raw)
    spent_session.filter.add(Fraction(1), Fraction(0), by="owner", why="test")
    spent_session.close()
    exported = list(Ledger(spent.path).export())
    assert [r["seq"] for r in exported] == list(range(1, _last_seq(spent.path) + 1))
    assert [r["kind"] for r in exported].count("charge") == 5
    assert exported[-1]["kind"] == "budget_add"
    prev = GENESIS
    for r in exported:
        assert r["prev"] == prev
        body = canonical(r["payload"])
        assert record_hash(prev, (r["seq"], r["time"], r["kind"], r["analyst"], body)) == r["hash"]
        prev = r["hash"]
    anchor = read_anchor(spent.anchor)
    assert anchor["head"] == prev and anchor["seq"] == len(exported)
    json.dumps(exported)  # plain JSON data throughout
    assert exported[0]["kind"] == "budget" and exported[0]["payload"]["epsilon"] == "10"
    assert exported[1]["payload"]["query"] == COUNT
    assert exported[1]["payload"]["epsilon"] == "1"
