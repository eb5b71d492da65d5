"""How many passwords a client can try against ``dpsql serve``, and whether idle sockets lock
analysts out.

    python benchmarks/logins.py                                # this checkout, about 45 s
    python benchmarks/logins.py --before /path/to/an/older/checkout   # before and after

Setup (``--dir``): ``benchmarks/server.py``'s policy and users, and ``dpsql serve`` in a
subprocess with its default limits (``benchmarks/server_stall.py``'s launcher; ``--before DIR``
also runs the server from another checkout's ``dpsql``, first, for a before/after in one run).
Every client is a raw socket over 127.0.0.1 that binds its own source address in 127.0.0.0/8,
which Linux routes to loopback, so that the attacker and the analyst are different addresses.

Per server:

* **guesses**: for each of ``--parallel`` (default 1 and 8), that many threads from one address
  try passwords for one analyst for ``--seconds`` (default 10), each computing the real SCRAM
  proof of its guess (PBKDF2, as a guesser must). Counted: verdicts (28P01, a password tested),
  refusals before SCRAM (28000), anything else. Each cell uses a new address and a new target.
* **the analyst under attack**: during the parallel cell, the attacked analyst logs in with the
  right password from another address once a second: how many got in, and their median and
  largest login time.
* **idle sockets**: ``--idle`` (default 300) sockets that send nothing, then one analyst's login
  from another address: its outcome and time.

Results are printed as Markdown and written as JSON into ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import secrets
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import write_results
from server import PASSWORD, write_policy, write_users
from server_stall import Served, _frame, client_final

HERE = Path(__file__).resolve().parent


def _read(sock: socket.socket) -> tuple[bytes, bytes]:
    head = b""
    while len(head) < 5:
        chunk = sock.recv(5 - len(head))
        if not chunk:
            return b"", b""
        head += chunk
    (length,) = struct.unpack("!i", head[1:])
    body = b""
    while len(body) < length - 4:
        chunk = sock.recv(length - 4 - len(body))
        if not chunk:
            return b"", b""
        body += chunk
    return head[:1], body


def _code(body: bytes) -> str:
    fields = {p[:1]: p[1:] for p in body.split(b"\0") if p}
    return fields.get(b"C", b"?").decode()


def login(port: int, user: str, password: str, source: str) -> str:
    """One SCRAM-SHA-256 login: ``"ok"``, the SQLSTATE of its error, or ``"closed"``."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(30)
            sock.bind((source, 0))
            sock.connect(("127.0.0.1", port))
            params = f"user\0{user}\0database\0visits\0\0".encode()
            body = struct.pack("!i", 196608) + params
            sock.sendall(struct.pack("!i", len(body) + 4) + body)
            kind, body = _read(sock)
            if kind != b"R":
                return _code(body) if kind == b"E" else "closed"
            bare = f"n=,r={base64.b64encode(secrets.token_bytes(18)).decode()}"
            first = ("n,," + bare).encode()
            sock.sendall(_frame(b"p", b"SCRAM-SHA-256\0" + struct.pack("!i", len(first)) + first))
            kind, body = _read(sock)
            if kind != b"R":
                return _code(body) if kind == b"E" else "closed"
            sock.sendall(_frame(b"p", client_final(password, bare, body[4:].decode())))
            while True:
                kind, body = _read(sock)
                if kind == b"E":
                    return _code(body)
                if kind == b"Z":
                    return "ok"
                if not kind:
                    return "closed"
    except OSError:
        return "closed"


def guesses(port: int, parallel: int, seconds: float, target: str, source: str) -> Counter[str]:
    counts: Counter[str] = Counter()
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def guess() -> None:
        n = 0
        while time.monotonic() < stop:
            result = login(port, target, f"guess-{n}", source)
            n += 1
            with lock:
                counts[result] += 1

    threads = [threading.Thread(target=guess) for _ in range(parallel)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return counts


def victim(port: int, user: str, seconds: float, out: list[tuple[str, float]]) -> None:
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        start = time.monotonic()
        out.append((login(port, user, PASSWORD, "127.0.0.200"), time.monotonic() - start))
        time.sleep(max(0.0, 1.0 - (time.monotonic() - start)))


def idle_lockout(port: int, count: int) -> tuple[str, float]:
    idle = []
    try:
        for _ in range(count):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        time.sleep(0.5)  # the server has accepted them all
        start = time.monotonic()
        result = login(port, "analyst0", PASSWORD, "127.0.0.201")
        return result, time.monotonic() - start
    finally:
        for sock in idle:
            sock.close()


def measure(args: argparse.Namespace, label: str, source: Path | None) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        folder = Path(tmp)
        users = write_users(folder, 2 + len(args.parallel))
        served = Served(write_policy(folder), users, folder, source)
        try:
            result, took = idle_lockout(served.port, args.idle)
            rows.append({"server": label, "cell": f"{args.idle} idle sockets, then a login",
                         "login": result, "login_s": round(took, 3)})  # fmt: skip
            time.sleep(1.0)
            for i, parallel in enumerate(args.parallel):
                target = f"analyst{i + 1}"
                seen: list[tuple[str, float]] = []
                watcher = threading.Thread(
                    target=victim, args=(served.port, target, args.seconds, seen)
                )
                watcher.start()
                counts = guesses(served.port, parallel, args.seconds, target, f"127.0.0.{10 + i}")
                watcher.join()
                times = [t for r, t in seen if r == "ok"]
                rows.append({
                    "server": label, "cell": f"{parallel} guessing connection(s)",
                    "verdicts": counts["28P01"], "refused": counts["28000"],
                    "other": sum(n for r, n in counts.items() if r not in ("28P01", "28000")),
                    "analyst_logins": f"{len(times)}/{len(seen)}",
                    "analyst_median_s": round(statistics.median(times), 3) if times else None,
                    "analyst_max_s": round(max(times), 3) if times else None,
                })  # fmt: skip
        finally:
            served.close()
    return rows


def table(rows: list[dict[str, object]]) -> str:
    keys = list(dict.fromkeys(k for row in rows for k in row))
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(row.get(k, "")) for k in keys) + " |" for row in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--parallel", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--idle", type=int, default=300)
    parser.add_argument("--before", type=Path, help="another checkout to run first, as before")
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    started = dt.datetime.now(dt.UTC)
    rows: list[dict[str, object]] = []
    if args.before is not None:
        rows += measure(args, "before", args.before.resolve())
    rows += measure(args, "after" if args.before is not None else "this checkout", None)
    print(table(rows))
    write_results(HERE / "results", "logins", started, 1, rows)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
