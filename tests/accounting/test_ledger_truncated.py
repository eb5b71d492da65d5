"""A ledger truncated under an open session fails closed at the next record, not later.

The session's SQLite connection caches pages: after the file was cut (the records table halved,
the WAL emptied) it kept answering, and charging, from them. Each record added now first reads
the ledger's tail on disk over a connection of its own (``CatchUp._check_disk``): the file has
not shrunk and its last record is the one verified against the anchor. The next query is refused
with ``LedgerError``, nothing is charged (the ledger's files are byte for byte what they were
after the cut), and so is every query after it. Real SQLite, a real session; the server's case
is in tests/interfaces/test_server_files.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from test_ledger import ledger_policy, open_session

from dpsql.accounting.ledger.store import create_ledger
from dpsql.errors import LedgerError
from dpsql.policy import load_policy

QUERY = "SELECT COUNT(*) FROM visits"


def _halved(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def _emptied(path: Path) -> None:
    os.truncate(path, 0)


def _wal_emptied(path: Path) -> None:
    os.truncate(path.with_name(path.name + "-wal"), 0)


CUTS: dict[str, Callable[[Path], None]] = {
    "file halved": _halved,
    "file emptied": _emptied,
    "WAL emptied": _wal_emptied,
}


def _files(folder: Path) -> dict[str, bytes]:
    names = ("ledger.db", "ledger.db-wal", "ledger.db.anchor")
    return {n: (folder / n).read_bytes() for n in names if (folder / n).exists()}


@pytest.mark.parametrize("cut", CUTS.values(), ids=CUTS.keys())
def test_a_truncated_ledger_refuses_the_next_query(
    tmp_path: Path, cut: Callable[[Path], None]
) -> None:
    raw = ledger_policy(tmp_path)
    create_ledger(load_policy(raw, base_dir=tmp_path))
    session = open_session(raw)
    try:
        for _ in range(3):
            assert session.execute(QUERY, fresh=True).charge is not None
        cut(tmp_path / "ledger.db")
        after_cut = _files(tmp_path)
        for _ in range(2):  # refused, and refused again: it does not recover by itself
            with pytest.raises(LedgerError):
                session.execute(QUERY, fresh=True)
            assert _files(tmp_path) == after_cut
        with pytest.raises(LedgerError):  # a re-serve adds a record too: refused as well
            session.execute(QUERY)
    finally:
        session.close()
