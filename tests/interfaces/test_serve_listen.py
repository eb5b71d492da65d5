"""``dpsql serve`` on an address it cannot listen on says so, as a usage error (exit 2).

A port already in use, an address of another machine or a name that does not resolve was an
internal error (exit 70, "OSError"). The message names the address and the reason, nothing else;
the server never starts a worker, and its ledger is not touched.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_fixtures import write_dataset, write_policy, write_users


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path, Path]:
    policy, ledger = write_policy(tmp_path, write_dataset(tmp_path / "data"))
    return policy, write_users(tmp_path / "users.json"), ledger


@pytest.fixture
def taken() -> Iterator[int]:
    """A port of 127.0.0.1 that another socket listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def serve(setup: tuple[Path, Path, Path], listen: str) -> subprocess.CompletedProcess[str]:
    policy, users, _ = setup
    command = [
        str(Path(sys.executable).parent / "dpsql"), "--policy", str(policy), "serve",
        "--users-file", str(users), "--listen", listen,
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def test_a_port_in_use(setup: tuple[Path, Path, Path], taken: int) -> None:
    ledger = setup[2]
    before = ledger.read_bytes()
    done = serve(setup, f"127.0.0.1:{taken}")
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        f"Error: InputError: cannot listen on 127.0.0.1:{taken}: address already in use\n"
    )
    assert ledger.read_bytes() == before


@pytest.mark.parametrize(
    ("host", "reason"),
    [
        ("192.0.2.1", "cannot assign requested address"),  # TEST-NET-1: never this machine's
        ("no-such-host.invalid", "name or service not known"),
    ],
)
def test_an_address_not_of_this_machine(
    setup: tuple[Path, Path, Path], host: str, reason: str
) -> None:
    done = serve(setup, f"{host}:5433")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"Error: InputError: cannot listen on {host}:5433: ")
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
