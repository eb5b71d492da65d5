"""Unsynced ledger records (``Ledger.append(synced=False)``: a release kept for the cache, a
re-serve): committed without a sync and named by the anchor's tail slot, never by its head.

The contract, checked on generated histories of synced and unsynced appends:

* the anchor's head is the last synced record, or later; the tail names every record after it,
  at most ``MAX_TAIL`` (the next is synced);
* losing any suffix of the unsynced records (a crash before the WAL reached the disk; the tail
  slot as last written, or as it was before) is not an error: the ledger opens, verifies, and
  takes new records, synced or not, and opens again;
* losing a synced record, editing any record that is present (rechained, so that only the
  anchor can tell) or putting another record in a lost one's place fails closed.

And through a session: an answer's release is in the tail, the connection is back to
``synchronous=FULL`` after it, and a release lost in a crash makes the same query cost a fresh
charge, never a free answer from nowhere.
"""

from __future__ import annotations

import contextlib
import sqlite3
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from conftest import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_ledger import ledger_policy, open_session, sql

from dpsql.accounting.ledger.anchor import _TAIL, MAX_TAIL, anchor_path, read_anchor
from dpsql.accounting.ledger.chain import GENESIS, record_hash
from dpsql.accounting.ledger.ledger import Ledger
from dpsql.accounting.ledger.store import create_ledger
from dpsql.errors import LedgerError
from dpsql.policy import load_policy

SETTINGS = settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _rows(path: Path) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(path)
    try:
        return [tuple(r) for r in con.execute("SELECT * FROM records ORDER BY seq")]
    finally:
        con.close()


def _rechain(path: Path, edit: int | None = None) -> None:
    """Rewrite every hash from GENESIS, after editing record ``edit``'s payload: a chain that
    verifies on its own (it needs no secret), so that only the anchor can tell."""
    prev = GENESIS
    for seq, when, kind, analyst, stored, _, _ in _rows(path):
        payload = stored.replace("}", ',"forged":1}', 1) if seq == edit else stored
        digest = record_hash(prev, (seq, when, kind, analyst, payload))
        sql(path, "UPDATE records SET payload = ?, prev = ?, hash = ? WHERE seq = ?",
             (payload, prev, digest, seq))  # fmt: skip
        prev = digest


def _opens(path: Path) -> int:
    ledger = Ledger(path)
    try:
        return ledger.verify()
    finally:
        ledger.close()


def _build(folder: Path, synced: list[bool]) -> tuple[Path, list[bytes], list[bool]]:
    """A ledger with one record per entry of ``synced``; the anchor's bytes after each append;
    which records are synced (the budget record, 1, is)."""
    path = folder / "ledger.db"
    Ledger.create(path, "d", budget={"epsilon": "1"}).close()
    ledger = Ledger(path)
    anchors, kinds = [anchor_path(path).read_bytes()], [True]
    try:
        for i, flag in enumerate(synced):
            ledger.append("charge" if flag else "release", {"i": i}, synced=flag)
            anchors.append(anchor_path(path).read_bytes())
            anchor = read_anchor(anchor_path(path))
            # A record past MAX_TAIL unsynced ones is synced: it is the head then.
            kinds.append(flag or anchor["seq"] == len(kinds) + 1)
            con = ledger._connection()
            assert con.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL again
    finally:
        ledger.close()
    return path, anchors, kinds


HISTORY = st.lists(st.booleans(), min_size=1, max_size=14)


@SETTINGS
@given(synced=HISTORY)
def test_the_head_is_synced_and_the_tail_names_the_rest(
    tmp_path_factory: pytest.TempPathFactory, synced: list[bool]
) -> None:
    path, _, kinds = _build(tmp_path_factory.mktemp("tail"), synced)
    anchor = read_anchor(anchor_path(path))
    last_synced = max(i + 1 for i, k in enumerate(kinds) if k)
    assert anchor["seq"] == last_synced
    assert anchor["seq"] + len(anchor["tail"]) == len(kinds) == _opens(path)
    assert len(anchor["tail"]) <= MAX_TAIL
    assert anchor["tail"] == [row[6] for row in _rows(path)[anchor["seq"] :]]


@SETTINGS
@given(synced=HISTORY, data=st.data())
def test_losing_unsynced_records_is_not_an_error(
    tmp_path_factory: pytest.TempPathFactory, synced: list[bool], data: st.DataObject
) -> None:
    path, anchors, kinds = _build(tmp_path_factory.mktemp("lose"), synced)
    n = len(kinds)
    unsynced = next((i for i in range(n) if all(not k for k in kinds[i:])), n)  # first of them
    keep = data.draw(st.integers(unsynced, n), label="records kept")
    sql(path, "DELETE FROM records WHERE seq > ?", (keep,))
    # The tail slot as last written, or as the crash left it: an earlier version (written
    # unsynced, it may not have reached the disk either) or torn.
    slot = data.draw(st.sampled_from(["last", "earlier", "torn"]), label="tail slot")
    if slot != "last":
        with open(anchor_path(path), "r+b") as handle:
            handle.seek(_TAIL)
            # Any version since the last synced write (whose fdatasync took the tail along).
            earlier = anchors[data.draw(st.integers(unsynced - 1, n - 1), label="as after")]
            handle.write(earlier[_TAIL:] or b"\0" * 8 if slot == "earlier" else b"\0" * 8)
    assert _opens(path) == keep
    # New records go where the lost ones were: the tail must not disagree with them, even when
    # the first one's process is killed after its commit, before it is anchored.
    ledger = Ledger(path)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(ledger, "_anchor_after", lambda *args, **kwargs: None)
            ledger.append("more", {"killed": True}, synced=data.draw(st.booleans()))
        assert _opens(path) == keep + 1
        for flag in data.draw(st.lists(st.booleans(), max_size=6), label="more"):
            ledger.append("more", {"synced": flag}, synced=flag)
    finally:
        ledger.close()
    assert _opens(path) > keep


@SETTINGS
@given(synced=HISTORY, data=st.data())
def test_an_edit_or_a_lost_synced_record_fails_closed(
    tmp_path_factory: pytest.TempPathFactory, synced: list[bool], data: st.DataObject
) -> None:
    path, _, kinds = _build(tmp_path_factory.mktemp("edit"), synced)
    n = len(kinds)
    how = data.draw(st.sampled_from(["edit", "lose synced", "replace"]), label="tamper")
    if how == "edit":  # any record present, rechained
        _rechain(path, data.draw(st.integers(1, n), label="edited"))
    elif how == "lose synced":  # a suffix that holds a synced record (beyond the first)
        synced_seqs = [i + 1 for i, k in enumerate(kinds) if k and i > 0]
        if not synced_seqs:
            return
        first = data.draw(st.sampled_from(synced_seqs), label="from")
        sql(path, "DELETE FROM records WHERE seq >= ?", (first,))
    else:  # an unsynced record lost and another put in its place, the chain made whole
        unsynced = [i + 1 for i, k in enumerate(kinds) if not k]
        if not unsynced:
            return
        seq = data.draw(st.sampled_from(unsynced), label="replaced")
        sql(path, "DELETE FROM records WHERE seq > ?", (seq,))
        _rechain(path, seq)
    with pytest.raises(LedgerError):
        _opens(path)


@pytest.mark.parametrize("killed", [True, False])
def test_a_record_the_tail_does_not_name_comes_under_the_head(tmp_path: Path, killed: bool) -> None:
    """A charge whose process was killed after its commit, before its anchor write, is neither
    in the head nor in the tail: the next record, even an unsynced one, is synced and anchored
    at the head, so that the charge's loss fails closed (else its removal would pass for an
    unsynced record lost in a crash, and give the budget back)."""
    path = tmp_path / "ledger.db"
    Ledger.create(path, "d", budget={"epsilon": "1"}).close()
    ledger = Ledger(path)
    try:
        ledger.append("release", {"i": 0}, synced=False)
        with pytest.MonkeyPatch.context() as patch:
            if killed:
                patch.setattr(ledger, "_anchor_after", lambda *args, **kwargs: None)
            charge = ledger.append("charge", {"i": 1})
        ledger.append("release", {"i": 2}, synced=False)
    finally:
        ledger.close()
    anchor = read_anchor(anchor_path(path))
    assert anchor["seq"] >= charge.seq
    sql(path, "DELETE FROM records WHERE seq >= ?", (charge.seq,))
    with pytest.raises(LedgerError):
        _opens(path)


def _spent(raw: dict[str, Any]) -> Fraction:
    with contextlib.closing(open_session(raw)) as session:
        return session.budget().epsilon_spent


def test_a_release_lost_in_a_crash_costs_a_fresh_charge(tmp_path: Path) -> None:
    raw = ledger_policy(tmp_path)
    create_ledger(load_policy(raw)).close()
    path = Path(raw["ledger"]["path"])
    query = "SELECT COUNT(*) FROM visits WHERE age > 30"
    with contextlib.closing(open_session(raw)) as session:
        first = session.execute(query, epsilon="0.5")
        assert first.charge is not None
        again = session.execute(query, epsilon="0.5")
        assert again.charge is None  # the cache: free
    kinds = [row[2] for row in _rows(path)]
    assert kinds[-3:] == ["charge", "release", "reserve"]
    anchor = read_anchor(anchor_path(path))
    assert anchor["seq"] == first.charge.seq and len(anchor["tail"]) == 2
    assert _spent(raw) == Fraction(1, 2)
    # A crash lost the release and the re-serve (unsynced), not the charge (synced).
    sql(path, "DELETE FROM records WHERE seq > ?", (first.charge.seq,))
    with contextlib.closing(open_session(raw)) as session:
        assert session.budget().epsilon_spent == Fraction(1, 2)
        after = session.execute(query, epsilon="0.5")
        assert after.charge is not None and after.charge.seq == first.charge.seq + 1
    assert _spent(raw) == Fraction(1)
    assert _opens(path) == first.charge.seq + 2
