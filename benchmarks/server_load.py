"""The event loop of ``dpsql serve`` under large answers and under clients that never read.

    python benchmarks/server_load.py                      # about 1 minute
    python benchmarks/server_load.py --source /path/to/an/older/checkout   # before and after
    python benchmarks/server_load.py --query "SELECT ..." # another load query

Setup, in a temporary folder (``--dir``): the example policy and users of ``server.py`` and
``dpsql serve`` in a subprocess (``server_stall.py``'s ``Served``; ``--source DIR`` runs the
server from another checkout's ``dpsql``, e.g. ``main`` before the answers were streamed).
``--serve-arg`` passes options to the server (``--serve-arg=--write-timeout=5``), which an
older checkout may not know.

The load query (``--query``) is a free catalog-only answer of about 14 MB by default (a cross
join of catalog relations: no function, so any list of catalog functions the server admits
answers it), under the default ``--max-answer-bytes`` of 16 MiB: the largest answer allowed.
The cells, each ``--seconds`` long:

* **idle**: B alone, measured first (and again at the end);
* **catalog load**: ``--clients`` raw connections, each sending the load query, reading its
  answer whole (and dropping it) and sending it again (threads of a process of their own, so
  that B's client never waits for their interpreter lock);
* **slow readers**: ``--clients`` raw connections, each sending the load query once and never
  reading (a receive buffer of 4 KiB), closed with a reset at the end of the cell.

B is an ordinary analyst: one psycopg connection running ``SELECT region, COUNT(*) FROM visits
GROUP BY region`` (released once before the run, then served from the cache) in a loop. Per
cell: the event-loop process's resident memory (``VmRSS`` of ``/proc/<pid>/status``, sampled
every 20 ms: its largest value and at the end of the cell, minus the idle cell's), its peak
(``VmHWM``), its CPU time in the cell, B's median and 95th-percentile latency beside idle's,
the answers the load clients read whole and their size, and the ``dropped`` lines of the
server's log. The targets: the
event loop grows by at most 50 MB over idle, and B's 95th percentile stays within 2x idle's.
Results are printed as Markdown and written as JSON into ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import multiprocessing
import os
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quantiles import example_data
from run import write_results
from server import COUNT, write_policy, write_users
from server_stall import Served, connect, login

HERE = Path(__file__).resolve().parent
LOAD = "SELECT a.*, b.* FROM pg_catalog.pg_proc a, pg_catalog.pg_proc b LIMIT 30000"
TARGET_MB = 50.0
TARGET_RATIO = 2.0


def memory(pid: int) -> tuple[float, float]:
    """The process's resident memory now and at its peak (VmRSS, VmHWM), in MB."""
    fields = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                fields[name] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["VmHWM"]


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of the process so far (its threads, not its children)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Sampler:
    """The largest VmRSS of a process, sampled every 20 ms in a thread."""

    def __init__(self, pid: int):
        self.pid = pid
        self.largest = 0.0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            self.largest = max(self.largest, memory(self.pid)[0])
            time.sleep(0.02)

    def end(self) -> float:
        self.stop.set()
        self.thread.join()
        return max(self.largest, memory(self.pid)[0])


def _query(sql: str) -> bytes:
    return b"Q" + struct.pack("!i", len(sql) + 5) + sql.encode() + b"\0"


def read_answer(sock: socket.socket, buffer: bytearray) -> tuple[int, bool]:
    """Read messages up to ReadyForQuery: the answer's bytes, and whether it was an error.
    (Parsed by offset: the client's own CPU is not what is measured.)"""
    size, failed, pos = 0, False, 0
    while True:
        while len(buffer) - pos < 5:
            chunk = sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            buffer += chunk
        kind = buffer[pos]
        (length,) = struct.unpack_from("!i", buffer, pos + 1)
        while len(buffer) - pos < 1 + length:
            chunk = sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            buffer += chunk
        pos += 1 + length
        size += 1 + length
        failed = failed or kind == ord("E")
        if kind == ord("Z"):
            del buffer[:pos]
            return size, failed
        if pos > 1 << 20:
            del buffer[:pos]
            pos = 0


class Load:
    """``clients`` raw connections asking for the load query: in a loop, reading each answer
    whole (``read``), or once without ever reading."""

    def __init__(self, port: int, users: list[str], query: str, read: bool):
        self.frame = _query(query)
        self.read = read
        self.stop = threading.Event()
        self.answers: list[int] = []  # bytes of each answer read whole
        self.errors = 0
        self.peers = [login(port, user)[0] for user in users]
        if not read:
            for sock in self.peers:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.sendall(self.frame)
        self.threads = [
            threading.Thread(target=self._ask, args=(s,), daemon=True) for s in self.peers
        ]
        if read:
            for thread in self.threads:
                thread.start()

    def _ask(self, sock: socket.socket) -> None:
        buffer = bytearray()
        with contextlib.suppress(OSError):
            while not self.stop.is_set():
                sock.sendall(self.frame)
                size, failed = read_answer(sock, buffer)
                if failed:
                    self.errors += 1
                else:
                    self.answers.append(size)

    def end(self) -> None:
        self.stop.set()
        for sock in self.peers:
            # A reset: the server drops what is left of the answer at once.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in self.threads:
            if thread.is_alive():
                thread.join(timeout=60)


def _load_process(asked: tuple[int, list[str], str, bool], ready: Any, stop: Any, out: Any) -> None:
    load = Load(*asked)
    ready.set()
    stop.wait()
    load.end()
    out.put((list(load.answers), load.errors))


class LoadProcess:
    """``Load`` in a process of its own: B's client measures the server, not the wait for
    the interpreter lock that ten reading threads beside it would hold."""

    def __init__(self, port: int, users: list[str], query: str, read: bool):
        context = multiprocessing.get_context("fork")
        self.ready, self.stop, self.out = context.Event(), context.Event(), context.Queue()
        self.process = context.Process(
            target=_load_process,
            args=((port, users, query, read), self.ready, self.stop, self.out),
            daemon=True,
        )
        self.process.start()
        if not self.ready.wait(120):
            raise RuntimeError("the load clients did not log in")
        self.answers: list[int] = []
        self.errors = 0

    def end(self) -> None:
        self.stop.set()
        self.answers, self.errors = self.out.get(timeout=120)
        self.process.join(timeout=60)


@dataclass
class Cell:
    kind: str
    clients: int
    latencies: list[float]  # seconds, each of B's queries
    rss_largest: float  # MB, VmRSS of the event loop, sampled
    rss_end: float  # MB, at the end of the cell, before the load clients hang up
    hwm: float  # MB, VmHWM after the cell
    loop_cpu: float  # seconds of CPU the event-loop process used during the cell
    answers: list[int] = field(default_factory=list)  # bytes of each answer read whole
    errors: int = 0  # load answers that were errors
    dropped: int = 0  # "dropped" lines of the server's log during the cell

    def ms(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(int(q * len(ordered)), len(ordered) - 1)] * 1e3


def cell(served: Served, args: argparse.Namespace, kind: str, read: bool | None) -> Cell:
    logged = served.log.read_text().count(" dropped: ")
    load = None
    if read is not None:
        users = [f"analyst{i + 1}" for i in range(args.clients)]
        load = LoadProcess(served.port, users, args.query, read)
    sampler = Sampler(served.process.pid)
    cpu = cpu_seconds(served.process.pid)
    latencies: list[float] = []
    try:
        with connect(served.port) as conn:
            deadline = time.perf_counter() + args.seconds
            while time.perf_counter() < deadline:
                began = time.perf_counter()
                conn.execute(COUNT).fetchall()
                latencies.append(time.perf_counter() - began)
        rss_end = memory(served.process.pid)[0]
        cpu = cpu_seconds(served.process.pid) - cpu
    finally:
        largest = sampler.end()
        if load is not None:
            load.end()
    time.sleep(0.5)  # the server closes the load's connections
    return Cell(
        kind, args.clients if load else 0, latencies, largest, rss_end,
        memory(served.process.pid)[1], cpu,
        list(load.answers) if load else [], load.errors if load else 0,
        served.log.read_text().count(" dropped: ") - logged,
    )  # fmt: skip


def table(cells: list[Cell]) -> str:
    idle = cells[0]
    lines = [
        "| load | clients | loop RSS largest MB (over idle) | at end MB (over idle) | VmHWM MB "
        "| loop CPU s | B p50 ms | B p95 ms | p95 / idle p95 | answers read (MB each) | dropped |",
        "|---|---:" + "|---:" * 9 + "|",
    ]
    for c in cells:
        size = f"{statistics.median(c.answers) / 1e6:.1f}" if c.answers else "-"
        base = idle.rss_largest
        lines.append(
            f"| {c.kind} | {c.clients} | {c.rss_largest:.0f} ({c.rss_largest - base:+.0f}) "
            f"| {c.rss_end:.0f} ({c.rss_end - base:+.0f}) | {c.hwm:.0f} | {c.loop_cpu:.1f} "
            f"| {statistics.median(c.latencies) * 1e3:.1f} | {c.ms(0.95):.1f} "
            f"| {c.ms(0.95) / idle.ms(0.95):.2f} | {len(c.answers)} ({size}) | {c.dropped} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds per cell")
    parser.add_argument("--clients", type=int, default=10, help="load connections")
    parser.add_argument("--query", default=LOAD, help="the load query: a large free answer")
    parser.add_argument("--source", type=Path, help="run the server from this checkout")
    parser.add_argument("--serve-arg", action="append", default=[], help="a server option")
    parser.add_argument("--dir", type=Path, default=None, help="where the temporary folder goes")
    parser.add_argument("--results-dir", type=Path, default=HERE / "results")
    args = parser.parse_args()
    started, load = dt.datetime.now(dt.UTC), os.getloadavg()[0]
    example_data()
    cells: list[Cell] = []
    with tempfile.TemporaryDirectory(dir=args.dir) as name:
        folder = Path(name)
        users = write_users(folder, 1 + args.clients)
        served = Served(write_policy(folder), users, folder, args.source, *args.serve_arg)
        try:
            with connect(served.port) as first:
                first.execute(COUNT).fetchall()  # the release B's queries are served from
            plan = [
                ("idle", None),
                ("catalog load", True),
                ("slow readers", False),
                ("idle, again", None),
            ]
            for kind, read in plan:
                done = cell(served, args, kind, read)
                cells.append(done)
                print(
                    f"  {kind:<14} loop RSS {done.rss_largest:7.1f} MB"
                    f"  B p95 {done.ms(0.95):8.1f} ms"
                    f"  ({len(done.latencies)} queries, {len(done.answers)} answers, "
                    f"{done.errors} errors, {done.dropped} dropped)",
                    flush=True,
                )
        finally:
            served.close()
    print()
    print(table(cells))
    idle = cells[0]
    growth = max(c.rss_largest for c in cells) - idle.rss_largest
    ratio = max(c.ms(0.95) for c in cells) / idle.ms(0.95)
    print(
        f"\nlargest loop growth over idle: {growth:.1f} MB (target {TARGET_MB:.0f} MB); worst B "
        f"p95 / idle p95: {ratio:.2f} (target {TARGET_RATIO:.0f}); {os.cpu_count()} CPUs; "
        f"1-minute load average {load:.2f} before, {os.getloadavg()[0]:.2f} after; "
        f"server from {args.source or 'this checkout'} {' '.join(args.serve_arg)}"
    )
    write_results(
        args.results_dir, "server_load", started, 1, [asdict(c) for c in cells],
        seconds=args.seconds, query=args.query, load_average=os.getloadavg(),
        source=str(args.source or ""), serve_args=args.serve_arg,
    )  # fmt: skip


if __name__ == "__main__":
    main()
