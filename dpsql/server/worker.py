"""The worker process of each ``dpsql serve`` connection, and the handle the event loop keeps.

Why a process: sqlglot is pure Python, so a statement that takes seconds to split, parse or
plan holds the interpreter lock for seconds. In a thread of the server it stalled the event
loop, and with it every other connection (one analyst's 1 MiB message stopped the server for a
minute, at no cost to the analyst). In a process of its own it slows only its own connection.
Each connection's :class:`~dpsql.session.Session` (its DuckDB engine, its view of the ledger)
and its :class:`~dpsql.server.backend.Backend` live in the worker; the ledger is shared by
every process through SQLite, each check-and-charge one transaction.

Workers come from a forkserver: a clean process that has imported dpsql but holds no DuckDB
connection and no thread, forked once per connection (a plain ``fork`` of the server would copy
its threads' locks in whatever state they are). The forkserver preloads the heavy modules, so a
worker starts in milliseconds.

Two socket pairs join the loop and a worker. On the data channel the loop sends one request at
a time, ``(id, message type, raw body, transaction status)``, and the worker answers with
frames ``(id, wire bytes, failed, fatal, status, last)``: plain data, unpickled with no class
allowed, never an exception or a traceback. On the control channel the loop sends the id of a
request to interrupt (statement timeout, CancelRequest); a thread of the worker then calls
``engine.interrupt()`` every few milliseconds until that request ends, since DuckDB forgets an
interrupt that comes before its query starts. A worker that has not ended the request within
the grace after an interrupt (pure-Python planning never looks) is killed, and its connection
ends; a charge it committed stands.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import multiprocessing
import multiprocessing.forkserver
import pickle
import signal
import socket
import struct
import threading
import time
import warnings
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from multiprocessing.process import BaseProcess

from dpsql import errors
from dpsql.policy import Policy
from dpsql.server import protocol as pg
from dpsql.server.backend import Backend, Step
from dpsql.server.statements import sqlstate
from dpsql.session import Session

log = logging.getLogger("dpsql.server")
LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
# Imported once by the forkserver, so that each worker starts without importing them again. A
# worker also runs the server's main module again (multiprocessing does, to unpickle what it
# defines): for ``dpsql serve`` that is the command line, so it is preloaded too. Run as
# ``python -m dpsql.interfaces.cli``, runpy then warns that the module it runs is imported
# already; running it again is what multiprocessing means to do.
PRELOAD = ["dpsql.server.worker", "dpsql.interfaces.report", "dpsql.interfaces.cli"]
warnings.filterwarnings(
    "ignore", r"'dpsql\.interfaces\.cli' found in sys\.modules", RuntimeWarning, "runpy"
)
_CONTEXT = multiprocessing.get_context("forkserver")
_REPEAT = 0.02  # seconds between two interrupts of an interrupted request
_HEADER = struct.Struct("!I")
_ID = struct.Struct("!Q")


@dataclass(frozen=True)
class WorkerSetup:
    """What a worker needs to open its connection's Session (pickled to the new process)."""

    policy: Policy
    user: str
    role: str
    database: str
    memory_limit: str
    log_level: int


class WorkerLost(Exception):  # noqa: N818 - an event, not an error of the client's
    """The worker died or was killed; its connection must end."""


class WorkerFailed(Exception):  # noqa: N818
    """The worker could not open its Session; ``code`` and ``message`` are for the client."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def start_forkserver(also: Sequence[str] = ()) -> None:
    """Start the forkserver with dpsql preloaded, unless it runs already, and wait until it
    forks: the first connection must not wait for the imports. ``also`` names more modules to
    preload: a program that runs the server names what its main module imports (each worker
    runs that module again)."""
    _CONTEXT.set_forkserver_preload([*PRELOAD, *also])
    multiprocessing.forkserver.ensure_running()
    probe = _CONTEXT.Process(target=_noop, daemon=True)
    probe.start()
    probe.join()
    probe.close()


def _noop() -> None:
    pass


# -- inside the worker -----------------------------------------------------------------------


def serve_worker(data: socket.socket, control: socket.socket, setup: WorkerSetup) -> None:
    """A worker's life: open the Session, then answer requests until the loop hangs up."""
    # Ctrl-C in a terminal and a hangup reach the whole process group: the server drains its
    # connections, then closes the workers itself.
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    logging.basicConfig(level=setup.log_level, format=LOG_FORMAT)
    try:
        session = Session(setup.policy, setup.user, setup.memory_limit)
    except Exception as exc:  # the client gets the error's SQLSTATE, the log its class only
        log.error("cannot open a session for %s: %s", setup.user, type(exc).__name__)
        if isinstance(exc, errors.DpsqlError):
            _send(data, ("failed", sqlstate(exc), str(exc)))
        else:
            _send(data, ("failed", "XX000", "internal error; see the server log"))
        return
    backend: Backend | None = None
    try:
        cutter = _Cutter(session)
        threading.Thread(target=cutter.listen, args=(control,), daemon=True).start()
        backend = Backend(session, setup.user, setup.role, setup.database, cutter.interrupted)
        cutter.also = backend.interrupt_catalog
        _send(data, ("ready",))
        while (request := _receive(data)) is not None:
            rid, kind, body, status = request
            cutter.begin(rid)
            try:
                for step in backend.handle(kind, body, status):
                    _send(data, (rid, step.wire, step.failed, step.fatal, backend.status, False))
            except OSError:
                raise
            except Exception as exc:
                # A bug: answered, and the worker goes on. Never the traceback: its text could
                # quote a data value.
                log.error("unexpected %s in a worker", type(exc).__name__)
                error = pg.error_response("XX000", "internal error; see the server log")
                _send(data, (rid, error, True, False, backend.status, False))
            finally:
                cutter.end()
            _send(data, (rid, b"", False, False, backend.status, True))
    except OSError:
        pass  # the server is gone: nothing to answer
    finally:
        if backend is not None:
            backend.close()
        session.close()


class _Cutter:
    """The interrupt state of a worker: which request runs, and whether it was interrupted."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self._lock = threading.Lock()
        self._current: int | None = None
        self._cut = False
        self._last_cut = 0  # the latest request id interrupted: ids only grow
        self.also: Callable[[], None] = lambda: None  # another connection to interrupt

    def begin(self, rid: int) -> None:
        # An interrupt may overtake its request (another channel): it then cuts it at once.
        with self._lock:
            self._current, self._cut = rid, rid <= self._last_cut

    def end(self) -> None:
        # Under the lock: once this returns, no interrupt meant for the request that ended can
        # reach the engine and cut the next one.
        with self._lock:
            self._current = None

    def interrupted(self) -> bool:
        with self._lock:
            return self._cut

    def listen(self, control: socket.socket) -> None:
        """The control thread: read interrupts, and repeat them until their request ends."""
        control.settimeout(_REPEAT)
        pending, gone = b"", False
        while True:
            chunk = b""
            if gone:
                time.sleep(_REPEAT)
            else:
                try:
                    chunk = control.recv(64)
                except TimeoutError:
                    pass
                except OSError:
                    chunk, gone = b"", True
                else:
                    gone = not chunk  # the loop hung up: cut what runs, it has no one to answer
            pending += chunk
            with self._lock:
                while len(pending) >= _ID.size:
                    (rid,) = _ID.unpack_from(pending)
                    pending = pending[_ID.size :]
                    self._last_cut = max(self._last_cut, rid)
                    self._cut = self._cut or rid == self._current
                if gone and self._current is not None:
                    self._cut = True
                if self._cut and self._current is not None:
                    self._session.engine.interrupt()  # takes no lock: a running query holds it
                    self.also()  # the connection's catalog, if a catalog query runs


def _send(sock: socket.socket, message: tuple[object, ...]) -> None:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_HEADER.pack(len(payload)))
    sock.sendall(payload)


def _receive(sock: socket.socket) -> tuple[int, bytes, bytes, str] | None:
    head = _receive_exactly(sock, _HEADER.size)
    if head is None:
        return None
    body = _receive_exactly(sock, _HEADER.unpack(head)[0])
    if body is None:
        return None
    request: tuple[int, bytes, bytes, str] = pickle.loads(body)  # from the server itself
    return request


def _receive_exactly(sock: socket.socket, count: int) -> bytes | None:
    buffer = bytearray(count)
    view, done = memoryview(buffer), 0
    while done < count:
        got = sock.recv_into(view[done:])
        if got == 0:
            return None
        done += got
    return bytes(buffer)


# -- in the server -----------------------------------------------------------------------------


class _Plain(pickle.Unpickler):
    """Unpickles tuples, bytes, strings, numbers and None only: whatever a worker sends, the
    server never builds an object of the worker's choosing from it."""

    def find_class(self, module: str, name: str) -> type:
        raise pickle.UnpicklingError("a worker frame holds plain data only")


_DEAD = object()  # the worker's channel closed
_WAKE = object()  # an interrupt: recompute the deadline


class Worker:
    """The event loop's handle on one connection's worker process."""

    def __init__(self, process: BaseProcess, control: socket.socket, grace: float) -> None:
        self._process = process
        self._control = control
        self._grace = grace
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._listener: asyncio.Task[None] | None = None
        self._id = 0
        self._kill_at: float | None = None
        self.busy = False
        self.killed = False

    @classmethod
    async def spawn(cls, setup: WorkerSetup, grace: float, spawner: Executor) -> Worker:
        """Start a worker; ``ready()`` then waits for its Session."""
        data, data_child = socket.socketpair()
        control, control_child = socket.socketpair()
        process = _CONTEXT.Process(
            target=serve_worker, args=(data_child, control_child, setup), daemon=True
        )

        def launch() -> None:
            # Blocking: it hands the sockets to the forkserver and reads the new pid back.
            try:
                process.start()
            finally:
                data_child.close()
                control_child.close()

        try:
            await asyncio.get_running_loop().run_in_executor(spawner, launch)
        except BaseException:
            data.close()  # a worker started all the same reads the end of its channel, and exits
            control.close()
            raise
        control.setblocking(False)
        worker = cls(process, control, grace)
        worker._reader, worker._writer = await asyncio.open_connection(sock=data)
        worker._listener = asyncio.create_task(worker._listen())
        return worker

    async def ready(self) -> None:
        """Wait until the Session is open; ``WorkerFailed`` if it cannot open."""
        frame = await self._queue.get()
        if frame is _DEAD or not isinstance(frame, tuple):
            raise WorkerLost("the worker ended before its session opened")
        if frame[0] == "failed":
            raise WorkerFailed(str(frame[1]), str(frame[2]))

    async def _listen(self) -> None:
        assert self._reader is not None
        try:
            while True:
                (size,) = _HEADER.unpack(await self._reader.readexactly(_HEADER.size))
                payload = await self._reader.readexactly(size)
                self._queue.put_nowait(_Plain(io.BytesIO(payload)).load())
        except Exception:  # a closed channel, or a frame that is not plain data
            self._queue.put_nowait(_DEAD)

    async def request(
        self,
        kind: bytes,
        body: bytes,
        status: str,
        timeout: float,
        emit: Callable[[Step], Awaitable[None]],
    ) -> str:
        """Send one message to the worker, ``emit`` each step it answers, and return the
        transaction status after it. ``timeout`` bounds each statement (each step); then the
        request is interrupted, and the worker killed after the grace (``WorkerLost``)."""
        assert self._writer is not None
        self._id += 1
        self.busy, self._kill_at = True, None
        try:
            payload = pickle.dumps((self._id, kind, body, status), pickle.HIGHEST_PROTOCOL)
            self._writer.write(_HEADER.pack(len(payload)) + payload)
            try:
                await self._writer.drain()
            except OSError as exc:
                raise WorkerLost("the worker's channel closed") from exc
            while True:
                rid, step, status, last = await self._next(timeout)
                if rid != self._id:
                    continue
                if step.wire:
                    await emit(step)
                if last:
                    return status
        finally:
            self.busy, self._kill_at = False, None

    async def _next(self, timeout: float) -> tuple[int, Step, str, bool]:
        loop = asyncio.get_running_loop()
        while True:
            wait = timeout if self._kill_at is None else max(self._kill_at - loop.time(), 0)
            try:
                frame = await asyncio.wait_for(self._queue.get(), wait)
            except TimeoutError:
                if self._kill_at is None:
                    self.interrupt()  # the statement timeout
                    continue
                log.warning("a worker did not stop within %.1f s of an interrupt", self._grace)
                self.kill()
                raise WorkerLost("killed after an interrupt") from None
            if frame is _WAKE:
                continue
            match frame:
                case (int(rid), bytes(wire), bool(failed), bool(fatal), str(status), bool(last)):
                    return rid, Step(wire, failed, fatal), status, last
            raise WorkerLost("the worker ended")

    def interrupt(self) -> None:
        """Cut the running request (statement timeout, CancelRequest); kill after the grace."""
        if not self.busy or self._kill_at is not None:
            return
        self._kill_at = asyncio.get_running_loop().time() + self._grace
        with contextlib.suppress(OSError):  # a full or closed channel: the grace decides
            self._control.send(_ID.pack(self._id))
        self._queue.put_nowait(_WAKE)

    def kill(self) -> None:
        self.killed = True
        with contextlib.suppress(OSError, ValueError, AttributeError):
            self._process.kill()

    async def close(self, spawner: Executor) -> None:
        """End the worker: hang up (it closes its Session and exits), kill it if it is busy or
        does not exit, and reap it."""
        if self.busy:
            self.kill()
        if self._writer is not None:
            self._writer.close()
        self._control.close()
        if self._listener is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._listener), 5)
            except TimeoutError:
                self.kill()
        try:
            await asyncio.get_running_loop().run_in_executor(spawner, self._reap)
        except RuntimeError:  # the server has stopped its spawner: a worker left is killed
            self.kill()

    def _reap(self) -> None:
        self._process.join(5)
        if self._process.exitcode is None:
            self.kill()
            self._process.join(5)
        with contextlib.suppress(ValueError):  # still running: left to the forkserver
            self._process.close()
