"""How long client B waits for its answers while client A floods ``dpsql serve``.

    python benchmarks/server_stall.py                      # about 1.5 minutes
    python benchmarks/server_stall.py --seconds 5 --sizes 10000 100000 --attackers 1 2
    python benchmarks/server_stall.py --source /path/to/an/older/checkout   # before and after

Setup, in a temporary folder (``--dir``): the example policy over ``examples/data/visits.parquet``
with a durable ``[ledger]`` (``benchmarks/server.py``'s), users ``analyst0`` (B) and
``analyst1`` .. (A's connections), and ``dpsql serve`` in a subprocess, logging at INFO as
deployed (``--source DIR`` runs the server from another checkout's ``dpsql``, e.g. the code
before the worker processes, for a before/after on the same machine).

B is an ordinary analyst: one psycopg connection running ``SELECT region, COUNT(*) FROM visits
GROUP BY region`` (released once before the run, then served from the cache: plan, lookup, a
durable re-serve record) in a loop for ``--seconds``, plus five fresh connections opened one
after another (TCP, SCRAM, the connection's worker and Session). A floods the server from
``--attackers`` connections (default 1), each a raw socket that writes Query messages back to
back without waiting for answers (a second thread reads and drops them), so that its next
statement is always queued behind the one running:

* **slow N bytes**: ``EXPLAIN SELECT COUNT(*) FROM visits WHERE COALESCE(age, age, ..., 1) > 0``
  padded to N bytes (``--sizes``, default 10,000, 30,000 and 100,000, the default
  ``--max-statement-bytes``): analyzing it is pure Python before any charge, about 0.2 s at
  10 KB and 2 s at 100 KB on 2 cores (quadratic before ``dpsql.sql.tree``: 0.35 s, 3 s and
  about 30 s); EXPLAIN charges nothing;
* **over the limit**: 1 MiB Query messages (the largest frame), refused before any parsing.

The baseline is B alone, measured first in the same run and again at the end. Per cell: B's
median, 95th-percentile and largest latency, B's delay (the cell's median and 95th percentile
minus the baseline's median), the median time to open a connection, and how many of A's
messages the server answered. Before each flood A's first statement is given ``--warmup``
seconds to start; after it, A's connections send a CancelRequest and hang up, and the cell
ends when the server has closed them (a worker stuck in planning is killed after the grace).
Results are printed as Markdown and written as JSON into ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import hashlib
import hmac
import os
import secrets
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quantiles import example_data
from run import write_results
from server import COUNT, PASSWORD, write_policy, write_users

HERE = Path(__file__).resolve().parent
OVER = 1 << 20  # bytes of the over-limit messages: the server's whole frame limit
TARGET_MS = 300.0


def slow_statement(size: int) -> bytes:
    """A COALESCE of as many ``age`` arguments as fit in ``size`` bytes."""
    head, tail = b"EXPLAIN SELECT COUNT(*) FROM visits WHERE COALESCE(", b"1) > 0"
    count = (size - len(head) - len(tail)) // len(b"age, ")
    return (head + b"age, " * count + tail).ljust(size)


# -- the server ------------------------------------------------------------------------------


class Served:
    """``dpsql serve`` in a subprocess: its port, CPU time and log."""

    def __init__(self, policy: Path, users: Path, folder: Path, source: Path | None, *extra: str):
        env = dict(os.environ)
        if source is not None:
            env["PYTHONPATH"] = str(source)
        self.log = folder / "serve.log"
        self._log_file = self.log.open("w")
        # The folder, not the repository, is the working directory: with -m it comes first on
        # sys.path, and --source must win over the installed dpsql.
        self.process = subprocess.Popen(
            [sys.executable, "-m", "dpsql.interfaces.cli.main", "--policy", str(policy), "serve",
             "--users-file", str(users), "--listen", "127.0.0.1:0", *extra],
            stdout=subprocess.DEVNULL, stderr=self._log_file, cwd=folder, env=env,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while "listening on" not in self.log.read_text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dpsql serve did not start:\n{self.log.read_text()}")
            time.sleep(0.05)
        line = next(x for x in self.log.read_text().splitlines() if "listening on" in x)
        self.port = int(line.rsplit(":", 1)[1])

    def close(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log_file.close()


# -- A: a raw client that writes without waiting ---------------------------------------------


def _frame(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


def _read(sock: socket.socket) -> tuple[bytes, bytes]:
    head = _exactly(sock, 5)
    if len(head) < 5:
        return b"", b""
    return head[:1], _exactly(sock, struct.unpack("!i", head[1:])[0] - 4)


def _exactly(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            break
        data += chunk
    return data


def client_final(password: str, first_bare: str, server_first: str) -> bytes:
    """SCRAM-SHA-256's client-final message (RFC 5802, 3), without channel binding."""
    attrs = dict(item.split("=", 1) for item in server_first.split(","))
    salted = hashlib.pbkdf2_hmac(
        "sha256", password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"])
    )
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    without_proof = f"c=biws,r={attrs['r']}"
    message = f"{first_bare},{server_first},{without_proof}".encode()
    signature = hmac.digest(hashlib.sha256(client_key).digest(), message, "sha256")
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()


def login(port: int, user: str) -> tuple[socket.socket, int, int]:
    """A socket past SCRAM-SHA-256 at ReadyForQuery, and the backend's (pid, key)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    params = b"user\0" + user.encode() + b"\0database\0visits\0\0"
    sock.sendall(struct.pack("!ii", len(params) + 8, 196608) + params)
    _read(sock)  # AuthenticationSASL
    nonce = base64.b64encode(secrets.token_bytes(18)).decode()
    first_bare = f"n=,r={nonce}"
    first = ("n,," + first_bare).encode()
    sock.sendall(_frame(b"p", b"SCRAM-SHA-256\0" + struct.pack("!i", len(first)) + first))
    server_first = _read(sock)[1][4:].decode()
    sock.sendall(_frame(b"p", client_final(PASSWORD, first_bare, server_first)))
    pid = key = 0
    while True:
        kind, body = _read(sock)
        if kind in (b"E", b""):
            raise RuntimeError("the attacker could not log in")
        if kind == b"K":
            pid, key = struct.unpack("!iI", body)
        if kind == b"Z":
            sock.settimeout(None)
            return sock, pid, key


class Flood:
    """A's connections, each writing ``message`` over and over without waiting."""

    def __init__(self, port: int, users: list[str], message: bytes):
        self.port = port
        self.frame = _frame(b"Q", message + b"\0")
        self.stop = threading.Event()
        self.answered = 0
        self.peers = [login(port, user) for user in users]
        self.threads = [
            threading.Thread(target=target, args=(sock,), daemon=True)
            for sock, _, _ in self.peers
            for target in (self._write, self._drain)
        ]
        for thread in self.threads:
            thread.start()

    def _write(self, sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while not self.stop.is_set():
                sock.sendall(self.frame)

    def _drain(self, sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while True:
                kind, _ = _read(sock)
                if not kind:
                    return
                self.answered += kind == b"Z"

    def end(self) -> None:
        """Cancel what runs and reset the connections: a plain close would leave the server
        every statement still queued in the socket buffers to run first."""
        self.stop.set()
        for sock, pid, key in self.peers:
            with socket.create_connection(("127.0.0.1", self.port), timeout=10) as cancel:
                cancel.sendall(struct.pack("!iiii", 16, 80877102, pid, key))
                with contextlib.suppress(OSError):
                    cancel.recv(1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()  # with a zero linger: a reset, which drops what the server has not read
        for thread in self.threads:
            thread.join(timeout=60)


# -- B: an ordinary analyst -------------------------------------------------------------------


def connect(port: int) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(
        host="127.0.0.1", port=port, user="analyst0", password=PASSWORD, dbname="visits",
        sslmode="disable", autocommit=True, connect_timeout=120,
    )  # fmt: skip


@dataclass
class Cell:
    kind: str
    attackers: int
    latencies: list[float]  # seconds, each of B's queries
    connects: list[float]  # seconds, each of B's fresh connections
    answered: int  # A's messages answered while B was measured (ReadyForQuery)

    def ms(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(int(q * len(ordered)), len(ordered) - 1)] * 1e3


def measure(port: int, seconds: float) -> tuple[list[float], list[float]]:
    connects = []
    for _ in range(5):
        began = time.perf_counter()
        connect(port).close()
        connects.append(time.perf_counter() - began)
    latencies = []
    with connect(port) as conn:
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            began = time.perf_counter()
            conn.execute(COUNT).fetchall()
            latencies.append(time.perf_counter() - began)
    return latencies, connects


def cell(port: int, args: argparse.Namespace, kind: str, message: bytes | None, n: int) -> Cell:
    flood = None
    if message is not None:
        flood = Flood(port, [f"analyst{i + 1}" for i in range(n)], message)
        time.sleep(args.warmup)
    try:
        latencies, connects = measure(port, args.seconds)
        answered = flood.answered if flood is not None else 0
    finally:
        if flood is not None:
            flood.end()
    return Cell(kind, n if flood else 0, latencies, connects, answered)


def table(cells: list[Cell]) -> str:
    base = statistics.median(cells[0].latencies) * 1e3
    lines = [
        "| A floods with | A's connections | B p50 ms | B p95 ms | B max ms | B delay p50 ms "
        "| B delay p95 ms | B connect ms | B queries | A answered |",
        "|---|---:" + "|---:" * 8 + "|",
    ]
    for c in cells:
        p50 = statistics.median(c.latencies) * 1e3
        lines.append(
            f"| {c.kind} | {c.attackers} | {p50:.1f} | {c.ms(0.95):.1f} | {c.ms(1.0):.1f} "
            f"| {p50 - base:+.1f} | {c.ms(0.95) - base:+.1f} "
            f"| {statistics.median(c.connects) * 1e3:.1f} | {len(c.latencies)} | {c.answered} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="B's timed seconds per cell")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 30_000, 100_000])
    parser.add_argument("--attackers", type=int, nargs="+", default=[1])
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds A runs before B")
    parser.add_argument("--source", type=Path, help="run the server from this checkout")
    parser.add_argument("--dir", type=Path, default=None, help="where the temporary folder goes")
    parser.add_argument("--results-dir", type=Path, default=HERE / "results")
    args = parser.parse_args()
    started, load = dt.datetime.now(dt.UTC), os.getloadavg()[0]
    example_data()
    floods: list[tuple[str, bytes]] = [(f"slow {n:,} bytes", slow_statement(n)) for n in args.sizes]
    floods.append((f"over the limit ({OVER:,} bytes)", slow_statement(OVER - 1)))
    cells: list[Cell] = []
    with tempfile.TemporaryDirectory(dir=args.dir) as name:
        folder = Path(name)
        users = write_users(folder, 1 + max(args.attackers))
        served = Served(write_policy(folder), users, folder, args.source)
        try:
            with connect(served.port) as first:
                first.execute(COUNT).fetchall()  # the release B's queries are served from
            plan = [("alone", None, 0)]
            plan += [(kind, message, n) for n in args.attackers for kind, message in floods]
            plan.append(("alone, again", None, 0))
            for kind, message, n in plan:
                done = cell(served.port, args, kind, message, n)
                cells.append(done)
                print(
                    f"  {kind:<34} x{n}  B p50 {statistics.median(done.latencies) * 1e3:8.1f} ms"
                    f"  p95 {done.ms(0.95):8.1f} ms  ({len(done.latencies)} queries)",
                    flush=True,
                )
        finally:
            served.close()
    print()
    print(table(cells))
    worst = max(c.ms(0.95) for c in cells) - statistics.median(cells[0].latencies) * 1e3
    print(
        f"\nworst B delay at p95: {worst:.1f} ms (target {TARGET_MS:.0f} ms); "
        f"{os.cpu_count()} CPUs; 1-minute load average {load:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after; server from {args.source or 'this checkout'}"
    )
    write_results(
        args.results_dir, "server_stall", started, 1, [asdict(c) for c in cells],
        seconds=args.seconds, load_average=os.getloadavg(), source=str(args.source or ""),
    )  # fmt: skip


if __name__ == "__main__":
    main()
