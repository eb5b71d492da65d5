"""What runs inside the worker process of a ``dpsql serve`` connection, and its channels' frames.

``serve_worker`` is a worker's life: it opens the connection's ``Session`` (from its
``WorkerSetup``) and ``Backend``, then answers one request at a time on the data channel until
the loop hangs up. ``_Cutter`` is its interrupt state, and the thread that reads the control
channel and repeats an interrupt until its request ends. A frame on the data channel is a
4-byte length and a pickle of plain data (``_HEADER``, ``_send``, ``_receive``); an interrupt
on the control channel is the 8-byte id of its request (``_ID``). ``dpsql.interfaces.pgwire.worker``
starts the workers and keeps the event loop's handle on each; it re-exports ``WorkerSetup``
and ``LOG_FORMAT``.
"""

from __future__ import annotations

import logging
import pickle
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dpsql import errors
from dpsql.interfaces.pgwire import protocol as pg
from dpsql.interfaces.pgwire.backend import Backend, Step
from dpsql.interfaces.pgwire.config import Limits
from dpsql.interfaces.pgwire.logs import LOG_FORMAT, configure_logging
from dpsql.interfaces.pgwire.statements import sqlstate
from dpsql.policy import Policy
from dpsql.session.session import Session

__all__ = ["LOG_FORMAT", "WorkerSetup", "serve_worker", "startup_settings"]

log = logging.getLogger("dpsql.interfaces.pgwire")
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
    # ``dpsql.*`` settings of the startup packet's ``options`` (``-c dpsql.name=value``), set
    # after the policy's ``[server]`` ones, as if the client's first statements SET them.
    settings: tuple[tuple[str, str], ...] = ()
    limits: Limits = field(default_factory=Limits)  # state caps, answer cap, frame size


def startup_settings(options: str) -> tuple[tuple[str, str], ...]:
    """The ``dpsql.*`` settings in a startup packet's ``options`` parameter, PostgreSQL's
    command-line form: ``-c name=value``, ``-cname=value`` or ``--name=value``, separated by
    spaces, a backslash escaping the next character. Other settings (a driver's
    ``search_path``...) are left out, as dpsql has none of them. A malformed option is a
    ``ParameterError`` that names no value."""
    words, word, escaped, started = [], [], False, False
    for ch in options:
        if escaped:
            word.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = started = True
        elif ch.isspace():
            if started:
                words.append("".join(word))
            word, started = [], False
        else:
            word.append(ch)
            started = True
    if escaped:
        raise errors.ParameterError("the startup options end with a lone backslash")
    if started:
        words.append("".join(word))
    found: list[tuple[str, str]] = []
    it = iter(words)
    for w in it:
        if w == "-c":
            pair = next(it, None)
        elif w.startswith("-c") or w.startswith("--"):
            pair = w[2:]
        else:
            raise errors.ParameterError("a startup option is not -c name=value or --name=value")
        if pair is None or "=" not in pair:
            raise errors.ParameterError("a startup option is not -c name=value or --name=value")
        name, value = pair.split("=", 1)
        name = name.strip().lower().replace("-", "_")
        if name.startswith("dpsql."):
            found.append((name[len("dpsql.") :], value))
    return tuple(found)


def serve_worker(data: socket.socket, control: socket.socket, setup: WorkerSetup) -> None:
    """A worker's life: open the Session, then answer requests until the loop hangs up."""
    # Ctrl-C in a terminal and a hangup reach the whole process group: the server drains its
    # connections, then closes the workers itself.
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    configure_logging(setup.log_level)  # sqlglot's messages may quote the statement
    try:
        session = Session(setup.policy, setup.user, setup.memory_limit)
        try:
            # The policy's display settings for every connection, then the client's own.
            if setup.policy.server.accuracy_columns:
                session.set_option("accuracy_columns", True)
            for name, value in setup.settings:
                session.set_option(name, value)
        except Exception:
            session.close()
            raise
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
        backend = Backend(
            session, setup.user, setup.role, setup.database, cutter.interrupted,
            limits=setup.limits,
        )  # fmt: skip
        size = setup.limits.frame_bytes
        cutter.also = backend.interrupt_catalog
        _send(data, ("ready",))
        while (request := _receive(data)) is not None:
            rid, kind, body, status = request
            cutter.begin(rid)
            try:
                for step in backend.handle(kind, body, status):
                    _send_step(data, rid, step, backend.status, size)
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


def _send_step(sock: socket.socket, rid: int, step: Step, status: str, size: int) -> None:
    """A step in frames of at most ``size`` wire bytes (cut if need be), the failed and fatal
    flags with the last. The blocking send is the backpressure: the loop reads a frame only
    once its client has read the ones before, so a worker whose client does not read stops."""
    pieces = list(pg.frames((step.wire,), size)) or [b""]
    for i, piece in enumerate(pieces, 1):
        last = i == len(pieces)
        _send(sock, (rid, piece, step.failed and last, step.fatal and last, status, False))


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
