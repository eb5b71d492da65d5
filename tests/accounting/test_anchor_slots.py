"""The anchor's two slots: each synced write replaces one slot in place (slot seq % 2), so a
write torn by a crash leaves the other slot's earlier head, which the ledger still extends; an
anchor with no valid slot, or behind a truncated ledger, fails closed; an anchor of the older
single-JSON form is read and rewritten in the slotted form by the next write. Each answer's
release record is unsynced and named by the third slot, the tail (``test_ledger_tail.py``)."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
from test_ledger import ledger_policy, open_session

from dpsql.accounting.ledger import anchor as ledger_module
from dpsql.accounting.ledger.anchor import read_anchor
from dpsql.accounting.ledger.ledger import Ledger
from dpsql.accounting.ledger.store import create_ledger
from dpsql.errors import LedgerError
from dpsql.policy import load_policy

SLOT = ledger_module._SLOT


def _ledger(tmp_path: Path, answers: int) -> tuple[Path, Path]:
    raw = ledger_policy(tmp_path)
    create_ledger(load_policy(raw)).close()
    session = open_session(raw)
    try:
        for k in range(answers):
            session.execute(f"SELECT COUNT(*) FROM visits WHERE age > {k}", epsilon="0.01")
    finally:
        session.close()
    path = Path(raw["ledger"]["path"])
    return path, ledger_module.anchor_path(path)


def _charges(path: Path) -> list[int]:
    con = sqlite3.connect(path)
    try:
        return [r[0] for r in con.execute("SELECT seq FROM records WHERE kind = 'charge'")]
    finally:
        con.close()


def _slot_of(anchor: Path, seq: int) -> int:
    text = anchor.read_bytes()
    return next(i for i in (0, 1) if json.loads(text[i * SLOT : (i + 1) * SLOT])["seq"] == seq)


def test_each_write_takes_the_other_slot(tmp_path: Path) -> None:
    path, anchor = _ledger(tmp_path, 2)
    text = anchor.read_bytes()
    assert len(text) == 3 * SLOT  # two slots and the tail
    seqs = sorted(json.loads(text[i * SLOT : (i + 1) * SLOT])["seq"] for i in (0, 1))
    n = Ledger(path).verify()
    assert seqs == _charges(path) == [n - 3, n - 1]  # the two charges; each release after one
    assert read_anchor(anchor)["seq"] == n - 1
    assert len(read_anchor(anchor)["tail"]) == 1  # the last release, unsynced


@pytest.mark.parametrize("torn", [b"\x00" * SLOT, b'{"seq": 99' + b" " * (SLOT - 10)])
def test_a_torn_slot_leaves_the_earlier_head(tmp_path: Path, torn: bytes) -> None:
    """A crash in the middle of the slot write: the other slot's head is behind the ledger,
    which is consistent; the next write repairs the torn slot."""
    path, anchor = _ledger(tmp_path, 2)
    n = Ledger(path).verify()
    first, last = _charges(path)
    with open(anchor, "r+b") as handle:
        handle.seek(_slot_of(anchor, last) * SLOT)
        handle.write(torn)
    assert read_anchor(anchor)["seq"] == first
    assert read_anchor(anchor)["tail"] == []  # it followed the torn head: it names nothing
    assert Ledger(path).verify() == n
    session = open_session(ledger_policy(tmp_path))
    try:
        session.execute("SELECT COUNT(*) FROM visits WHERE age > 50", epsilon="0.01")
    finally:
        session.close()
    assert read_anchor(anchor)["seq"] == Ledger(path).verify() - 1 > n - 1


def test_an_altered_slot_does_not_count(tmp_path: Path) -> None:
    """A slot whose digest does not match its content is ignored, like a torn one: raising its
    seq does not make the ledger look shorter than its anchor."""
    path, anchor = _ledger(tmp_path, 2)
    first, last = _charges(path)
    raw, index = anchor.read_bytes(), _slot_of(anchor, last)
    newest = json.loads(raw[index * SLOT : (index + 1) * SLOT])
    newest["seq"] = last + 5
    forged = json.dumps(newest).encode()
    with open(anchor, "r+b") as handle:
        handle.seek(index * SLOT)
        handle.write(forged + b" " * (SLOT - 1 - len(forged)) + b"\n")
    assert read_anchor(anchor)["seq"] == first


def test_no_valid_slot_fails_closed(tmp_path: Path) -> None:
    path, anchor = _ledger(tmp_path, 1)
    anchor.write_bytes(b" " * (SLOT - 1) + b"\n" + b"x" * (SLOT - 1) + b"\n")
    with pytest.raises(LedgerError, match="anchor"):
        Ledger(path)


def test_a_truncated_ledger_is_still_caught(tmp_path: Path) -> None:
    path, _ = _ledger(tmp_path, 3)
    n = Ledger(path).verify()
    con = sqlite3.connect(path)
    with con:
        con.execute("DELETE FROM records WHERE seq >= ?", (n - 1,))
    con.close()
    with pytest.raises(LedgerError):
        Ledger(path)


def test_an_anchor_of_the_older_form_is_read_and_rewritten(tmp_path: Path) -> None:
    path, anchor = _ledger(tmp_path, 1)
    current = read_anchor(anchor)
    anchor.write_text(json.dumps(current))  # the single-JSON form of earlier versions
    os.sync()
    assert Ledger(path).verify() == current["seq"] + 1  # and the release after the charge
    session = open_session(ledger_policy(tmp_path))
    try:
        session.execute("SELECT COUNT(*) FROM visits WHERE age > 60", epsilon="0.01")
    finally:
        session.close()
    assert len(anchor.read_bytes()) == 3 * SLOT  # the slots, and the tail for the release
    assert read_anchor(anchor)["seq"] == Ledger(path).verify() - 1
