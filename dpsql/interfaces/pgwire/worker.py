"""The worker process of each ``dpsql serve`` connection, and the handle the event loop keeps.

Why a process: sqlglot is pure Python, so a statement that takes seconds to split, parse or
plan holds the interpreter lock for seconds. In a thread of the server it stalled the event
loop, and with it every other connection (one analyst's 1 MiB message stopped the server for a
minute, at no cost to the analyst). In a process of its own it slows only its own connection.
Each connection's :class:`~dpsql.session.session.Session` (its DuckDB engine, its view of the
ledger) and its :class:`~dpsql.interfaces.pgwire.backend.Backend` live in the worker; the ledger is
shared by every process through SQLite, each check-and-charge one transaction.

Workers come from a forkserver: a clean process that has imported dpsql but holds no DuckDB
connection and no thread, forked once per connection (a plain ``fork`` of the server would copy
its threads' locks in whatever state they are). The forkserver preloads the heavy modules, so a
worker starts in milliseconds.

Two socket pairs join the loop and a worker. On the data channel the loop sends one request at
a time, ``(id, message type, raw body, transaction status)``, and the worker answers with
frames ``(id, wire bytes, failed, fatal, status, last)``: plain data, unpickled with no class
allowed, never an exception or a traceback. A frame carries at most ``Limits.frame_bytes`` of
wire bytes, and the loop reads at most two frames ahead of what its client has read, so an
answer streams through the loop a few frames at a time and a worker whose client does not read
blocks in its send. On the control channel the loop sends the id of a
request to interrupt (statement timeout, CancelRequest); a thread of the worker then calls
``engine.interrupt()`` every few milliseconds until that request ends, since DuckDB forgets an
interrupt that comes before its query starts. A worker that has not ended the request within
the grace after an interrupt (pure-Python planning never looks) is killed, and its connection
ends; a charge it committed stands.

What runs inside the worker (``serve_worker``, its interrupt thread, the frames of the channels)
is in ``worker_process.py``; this module keeps the forkserver and the handle the event loop
keeps, ``Worker``, and re-exports ``WorkerSetup`` and ``LOG_FORMAT``.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import multiprocessing
import multiprocessing.forkserver
import pickle
import socket
import warnings
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from multiprocessing.process import BaseProcess

from dpsql.interfaces.pgwire.backend import Step
from dpsql.interfaces.pgwire.worker_process import (
    _HEADER,
    _ID,
    WorkerSetup,
    serve_worker,
)

__all__ = ["PRELOAD", "Worker", "WorkerFailed", "WorkerLost", "start_forkserver"]

log = logging.getLogger("dpsql.interfaces.pgwire")
# Imported once by the forkserver, so that each worker starts without importing them again. A
# worker also runs the server's main module again (multiprocessing does, to unpickle what it
# defines): for ``dpsql serve`` that is the command line, so it is preloaded too. Run as
# ``python -m dpsql.interfaces.cli.main``, runpy then warns that the module it runs is imported
# already; running it again is what multiprocessing means to do.
PRELOAD = [
    "dpsql.interfaces.pgwire.worker",
    "dpsql.interfaces.report.report",
    "dpsql.interfaces.cli.main",
]
warnings.filterwarnings(
    "ignore", r"'dpsql\.interfaces\.cli' found in sys\.modules", RuntimeWarning, "runpy"
)
_CONTEXT = multiprocessing.get_context("forkserver")


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


class _Plain(pickle.Unpickler):
    """Unpickles tuples, bytes, strings, numbers and None only: whatever a worker sends, the
    server never builds an object of the worker's choosing from it."""

    def find_class(self, module: str, name: str) -> type:
        raise pickle.UnpicklingError("a worker frame holds plain data only")


_DEAD = object()  # the worker's channel closed
_WAKE = object()  # an interrupt: recompute the deadline
# Frames read from a worker before the connection has written the ones before to its client:
# with the channel's own buffer (two frames) and the transport's high-water mark, what the loop
# holds of one connection's answer is a few frames, however large the answer and however slowly
# the client reads; a worker whose frames are not read blocks in its send (backpressure).
_AHEAD = 2


class Worker:
    """The event loop's handle on one connection's worker process."""

    def __init__(self, process: BaseProcess, control: socket.socket, grace: float) -> None:
        self._process = process
        self._control = control
        self._grace = grace
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._room = asyncio.Semaphore(_AHEAD)  # frames the listener may read ahead
        self._closed = False  # then the listener reads what is left, to see the channel end
        self.largest_frame = 0  # bytes of the largest frame read from this worker
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._listener: asyncio.Task[None] | None = None
        self._id = 0
        self._kill_at: float | None = None
        self.busy = False
        self.killed = False

    @classmethod
    async def spawn(
        cls, setup: WorkerSetup, grace: float, spawner: Executor, frame_bytes: int
    ) -> Worker:
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
        # The channel's buffer holds about two frames before the loop stops reading it.
        worker._reader, worker._writer = await asyncio.open_connection(sock=data, limit=frame_bytes)
        worker._listener = asyncio.create_task(worker._listen())
        return worker

    async def ready(self) -> None:
        """Wait until the Session is open; ``WorkerFailed`` if it cannot open."""
        frame = await self._queue.get()
        if frame is _DEAD or not isinstance(frame, tuple):
            raise WorkerLost("the worker ended before its session opened")
        self._room.release()
        if frame[0] == "failed":
            raise WorkerFailed(str(frame[1]), str(frame[2]))

    async def _listen(self) -> None:
        assert self._reader is not None
        try:
            while True:
                if not self._closed:
                    await self._room.acquire()  # released when the frame is taken
                (size,) = _HEADER.unpack(await self._reader.readexactly(_HEADER.size))
                payload = await self._reader.readexactly(size)
                self.largest_frame = max(self.largest_frame, size)
                if self._closed:
                    continue  # no one to answer: read to the channel's end, keep nothing
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
            if frame is not _DEAD:
                self._room.release()
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
        self._closed = True
        self._room.release()  # a listener waiting for room goes on to the channel's end
        while not self._queue.empty():  # frames no one will send: freed now
            self._queue.get_nowait()
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
