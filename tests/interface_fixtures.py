"""Fixtures shared by the tests that drive one feature through every interface: the example
data (skipped without it) and a shell over ``test_shell``'s policy of it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from test_shell import write_policy

from dpsql.interfaces.shell.core import Shell
from dpsql.session.session import Session

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "examples" / "data" / "visits.parquet"


@pytest.fixture(autouse=True)
def example_data() -> None:
    """Skips a test when the example data has not been made (``make demo``)."""
    if not DATA.exists():
        pytest.skip("run `make demo` (or examples/make_data.py) to create the example data")


@pytest.fixture
def shell(tmp_path: Path) -> Iterator[Shell]:
    session = Session(write_policy(tmp_path))
    yield Shell(session)
    session.close()
