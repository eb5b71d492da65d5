"""Statements per second through ``dpsql web`` beside the in-process DB-API, 1 and 4 clients.

    python benchmarks/web.py [--seconds 5] [--clients 1 4] [--dir PATH]

Setup, as ``server.py`` sets up ``dpsql serve``: the example policy over
``examples/data/visits.parquet`` with a durable ``[ledger]``, a budget of epsilon 10,000 and a
per-query epsilon of 0.01, and one analyst per client. The console is ``dpsql web`` in a
subprocess (``--listen 127.0.0.1:PORT``, ``--max-running`` = the most clients), as deployed.

For each kind and number of clients, N threads each log in (their own cookie and CSRF token)
and send the same statement in a loop for ``--seconds`` after a common start barrier:

* **web**: ``POST /api/run`` (or ``/api/preview``) with the statement as JSON, over one
  keep-alive HTTP connection per client; the fresh kind sends ``SET dpsql.fresh = true`` first
  (kept by the login).
* **in-process** (the baseline, in the same run): ``dpsql.connect(policy, analyst=...)``, one
  connection per thread, ``cursor.execute(sql)`` (fresh kinds: ``fresh=True``); preview:
  ``EXPLAIN``.

Kinds: **preview** (EXPLAIN's cost and fit, nothing charged), **cached count** (released once
before, then served from the release cache), **fresh count** (charged every time). Per cell:
statements per second (all clients), the median and 95th-percentile latency. The console opens
a Session per statement (the in-process connection keeps one), which is most of the gap.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server import PASSWORD, write_policy, write_users

import dpsql

COUNT = "SELECT region, COUNT(*) FROM visits GROUP BY region"
KINDS = ("preview", "cached count", "fresh count")


class Console:
    """``dpsql web`` in a subprocess on a free loopback port."""

    def __init__(self, policy: Path, users: Path, running: int) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.process = subprocess.Popen(
            [sys.executable, "-c", "from dpsql.interfaces.cli.main import main; main()",
             "--policy", str(policy), "web", "--users-file", str(users),
             "--listen", f"127.0.0.1:{self.port}", "--max-running", str(running)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            try:
                http.client.HTTPConnection("127.0.0.1", self.port, timeout=2).request("GET", "/")
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("dpsql web did not start") from None
                time.sleep(0.1)

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(10)


class WebClient:
    """One analyst's login over one keep-alive connection."""

    def __init__(self, port: int, name: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        self.cookies: dict[str, str] = {}
        page = self._send("GET", "/login")
        token = re.search(rb'name="csrf" value="([^"]+)"', page)
        assert token is not None
        form = f"csrf={token.group(1).decode()}&name={name}&password={PASSWORD}"
        self._send("POST", "/login", form.encode(),
                   {"Content-Type": "application/x-www-form-urlencoded"})  # fmt: skip
        found = re.search(rb'name="csrf-token" content="([^"]+)"', self._send("GET", "/analyst"))
        assert found is not None
        self.csrf = found.group(1).decode()

    def _send(self, method: str, path: str, body: bytes | None = None,
              headers: dict[str, str] | None = None) -> bytes:  # fmt: skip
        sent = {"Cookie": "; ".join(f"{k}={v}" for k, v in self.cookies.items()), **(headers or {})}
        self.conn.request(method, path, body=body, headers=sent)
        response = self.conn.getresponse()
        data = response.read()
        for name, value in response.getheaders():
            if name.lower() == "set-cookie":
                key, _, rest = value.partition("=")
                self.cookies[key] = rest.split(";", 1)[0]
        if response.status >= 400:
            raise RuntimeError(f"{path}: HTTP {response.status}: {data[:200]!r}")
        return data

    def post(self, path: str, sql: str) -> dict[str, object]:
        body = json.dumps({"sql": sql}).encode()
        headers = {"Content-Type": "application/json", "X-CSRF-Token": self.csrf}
        return dict(json.loads(self._send("POST", path, body, headers)))


def _measure(clients: int, seconds: float, one: Callable[[int], Callable[[], None]]) -> list[str]:
    """N threads, each running its own ``one(i)()`` in a loop for ``seconds``."""
    runs = [one(i) for i in range(clients)]
    barrier = threading.Barrier(clients)
    latencies: list[list[float]] = [[] for _ in range(clients)]

    def loop(i: int) -> None:
        barrier.wait()
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            start = time.perf_counter()
            runs[i]()
            latencies[i].append(time.perf_counter() - start)

    started = time.perf_counter()
    threads = [threading.Thread(target=loop, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    every = sorted(x for per in latencies for x in per)
    p95 = every[min(len(every) - 1, int(0.95 * len(every)))]
    return [f"{len(every) / wall:8.1f}", f"{1000 * statistics.median(every):7.1f}",
            f"{1000 * p95:7.1f}"]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    most = max(args.clients)
    print("| kind | clients | web per s | web p50 ms | web p95 ms | in-process per s | "
          "in-process p50 ms | in-process p95 ms |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for kind in KINDS:
        for clients in args.clients:
            with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
                folder = Path(tmp)
                policy = write_policy(folder)
                users = write_users(folder, most)
                console = Console(policy, users, most)
                try:
                    web = _measure(clients, args.seconds, _web(kind, console.port))
                finally:
                    console.close()
                local = _measure(clients, args.seconds, _local(kind, policy))
            print(f"| {kind} | {clients} | " + " | ".join(web + local) + " |", flush=True)


def _web(kind: str, port: int) -> Callable[[int], Callable[[], None]]:
    def one(i: int) -> Callable[[], None]:
        client = WebClient(port, f"analyst{i}")
        path = "/api/preview" if kind == "preview" else "/api/run"
        if kind == "fresh count":
            client.post("/api/run", "SET dpsql.fresh = true")
        first = client.post(path, COUNT)
        if kind == "fresh count":
            assert first["charged"] is not None, "a fresh answer is charged"
        elif kind == "cached count" and i > 0:  # the first client's answer is released first
            assert first["served_free"], "a repeat is served from the release"

        def run() -> None:
            client.post(path, COUNT)

        return run

    return one


def _local(kind: str, policy: Path) -> Callable[[int], Callable[[], None]]:
    def one(i: int) -> Callable[[], None]:
        cursor = dpsql.connect(str(policy), analyst=f"analyst{i}").cursor()
        if kind == "preview":
            return lambda: cursor.execute("EXPLAIN " + COUNT) and None
        fresh = kind == "fresh count"
        cursor.execute(COUNT, fresh=fresh)
        return lambda: cursor.execute(COUNT, fresh=fresh) and None

    return one


if __name__ == "__main__":
    main()
