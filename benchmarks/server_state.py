"""A worker's memory when one client prepares many statements, with and without the caps.

    python benchmarks/server_state.py                        # about 30 s
    python benchmarks/server_state.py --statements 3000 --size 90000

One ``dpsql serve`` subprocess per cell over the example policy (``benchmarks/server.py``'s), one
psycopg connection that sends ``--statements`` Parse messages of distinct named statements, each
``--size`` bytes of text (under the default ``--max-statement-bytes``), and the connection's
worker process's resident memory (``VmRSS``) read from /proc before and after. The baseline
cell lifts the caps (``--max-prepared 1000000 --max-state-bytes 2**40``: the server as it was
before them); the other runs with the defaults (1,000 statements, 32 MiB). Results are printed
as Markdown.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
from server import PASSWORD, write_policy, write_users

LIFTED = ("--max-prepared", "1000000", "--max-state-bytes", str(1 << 40))


def _descendants(pid: int) -> set[int]:
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        for task in os.listdir(f"/proc/{parent}/task"):
            try:
                children = Path(f"/proc/{parent}/task/{task}/children").read_text().split()
            except OSError:
                continue
            found.update(int(c) for c in children)
            todo.extend(int(c) for c in children)
    return found


def _rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    return int(match.group(1)) / 1024 if match else 0.0


def cell(folder: Path, extra: tuple[str, ...], statements: int, size: int) -> tuple[float, ...]:
    policy, users = write_policy(folder), write_users(folder, 1)
    log = (folder / "serve.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "dpsql.interfaces.cli.main", "--policy", str(policy), "serve",
         "--users-file", str(users), "--listen", "127.0.0.1:0", *extra],
        stdout=subprocess.DEVNULL, stderr=log, cwd=folder,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (
            found := re.search(r"listening on [\d.]+:(\d+)", (folder / "serve.log").read_text())
        ):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("dpsql serve did not start")
            time.sleep(0.05)
        before = _descendants(process.pid)
        with psycopg.connect(
            host="127.0.0.1", port=int(found.group(1)), user="analyst0", password=PASSWORD,
            dbname="visits", sslmode="disable", autocommit=True,
        ) as conn:  # fmt: skip
            conn.execute("SELECT 1")
            (worker,) = _descendants(process.pid) - before
            idle = _rss_mb(worker)
            padding = " " * size
            refused = 0
            for i in range(statements):
                result = conn.pgconn.prepare(f"s{i}".encode(), f"SELECT {i}{padding}".encode())
                refused += bool(result.error_message)
            time.sleep(0.3)
            return idle, _rss_mb(worker), statements - refused, refused
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--statements", type=int, default=3000)
    parser.add_argument("--size", type=int, default=90_000)
    args = parser.parse_args()
    print("| caps | worker RSS idle | after | grew | statements held | refused (53400) |")
    print("|---|---|---|---|---|---|")
    for name, extra in (("lifted (baseline)", LIFTED), ("defaults", ())):
        with tempfile.TemporaryDirectory() as folder:
            idle, after, held, refused = cell(Path(folder), extra, args.statements, args.size)
        grew = after - idle
        print(f"| {name} | {idle:.0f} MB | {after:.0f} MB | {grew:.0f} MB | {held} | {refused} |")


if __name__ == "__main__":
    main()
