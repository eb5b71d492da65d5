"""A catalog query's answer for ``dpsql serve``: its rows encoded and counted against the byte
cap as they are fetched, whole for a portal or streamed for a simple query.

A free answer must not exhaust the server: one analyst's 100 MB catalog answer, built whole,
held 100 MB in the process that every connection shares. Here the rows are counted
(``AnswerRows``) batch by batch as DuckDB returns them, so an answer over the cap stops being
fetched; a streamed answer is fetched only as fast as its client reads it, since its worker
sends each frame before it fetches the next rows (``Backend._answer_steps``).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from dpsql.interfaces.pgwire import protocol as pg
from dpsql.interfaces.pgwire.catalog import Catalog
from dpsql.interfaces.pgwire.statements import Answer, AnswerRows, AnswerTooLarge

__all__ = ["catalog_answer"]

NICE = 10  # the catalog thread's niceness: about a tenth of the CPU weight of other work
# Past this many bytes a catalog answer is bulk (psql's, the BI tools' and the drivers' catalog
# answers are a few KB): its next batches are fetched and encoded at the idle priority.
BULK_BYTES = 1 << 20
T = TypeVar("T")
Chunk = tuple[list[bytes], AnswerTooLarge | None]  # a batch's rows, and the cap if passed


def catalog_answer(
    catalog: Catalog,
    sql: str,
    params: Sequence[object] | None,
    cap: int,
    *,
    stream: bool,
) -> Answer:
    """The answer of a catalog query: ``stream``, rows fetched as the client reads them (a
    simple query; the tag gets its count once the last is sent); otherwise whole, for a
    portal's Executes to page through. Either way at most ``cap`` bytes of rows; an interrupt
    (the statement timeout, a cancel request) reaches DuckDB's fetch of the next batch."""
    batches = catalog.batches(sql, params)
    # A query that fails at once fails before any row is sent.
    columns, first = _LOW.run(next, batches)
    described = tuple((name, *pg.pg_type(dtype)) for name, dtype in columns)
    oids = [oid for _, oid, _ in described]
    counted = AnswerRows(cap)

    def encode(batch: list[tuple[Any, ...]]) -> Chunk:
        # Counted as encoded: past the cap, nothing more is fetched; the rows before it go out.
        done: list[bytes] = []
        try:
            done.extend(counted.encode(_values(row, oids)) for row in batch)
        except AnswerTooLarge as exc:
            return done, exc
        return done, None

    def following() -> Chunk | None:  # the next batch, fetched and encoded
        got = next(batches, None)
        return None if got is None else encode(got[1])

    def rows() -> Iterator[bytes]:
        try:
            chunk: Chunk | None = _LOW.run(encode, first)
            while chunk is not None:
                yield from chunk[0]
                if chunk[1] is not None:
                    raise chunk[1]
                chunk = (_BULK if counted.size > BULK_BYTES else _LOW).run(following)
        finally:
            batches.close()  # the catalog's connection, free for the next statement

    if stream:
        return Answer(described, rows(), "SELECT")
    whole = list(rows())
    return Answer(described, whole, f"SELECT {len(whole)}")


class _LowPriority:
    """One thread of the worker process, its scheduling priority lowered once, that runs the
    free catalog answers' fetching and encoding: ten clients each asking for the largest
    catalog answer kept both cores busy, and an analyst's small query on another connection
    waited behind them (p95 5-14x idle). ``_LOW`` runs at nice +10, about a tenth of the CPU
    weight of other work; ``_BULK``, an answer's batches past ``BULK_BYTES``, in the idle
    class (SCHED_IDLE: only when no other work wants the core), so that bulk free answers
    never slow a charged one (p95 within 2x idle, benchmarks/server_load.py) while the small
    ones clients need keep a share. Lowering a thread's priority needs no privilege (raising
    it back would: hence two threads); where the system refuses, the thread runs at nice +19,
    or at the usual priority."""

    def __init__(self, idle: bool) -> None:
        self._idle = idle
        self._pool: ThreadPoolExecutor | None = None
        self._pid = 0

    def run(self, function: Callable[..., T], *args: Any) -> T:
        if self._pool is None or self._pid != os.getpid():  # one per process (workers fork)
            name = "dpsql-catalog-bulk" if self._idle else "dpsql-catalog"
            self._pool = ThreadPoolExecutor(1, name, initializer=self._lower)
            self._pid = os.getpid()
        return self._pool.submit(function, *args).result()

    def _lower(self) -> None:
        tid = threading.get_native_id()
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, tid, 19 if self._idle else NICE)
        if self._idle:
            with contextlib.suppress(OSError, AttributeError):
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


_LOW = _LowPriority(idle=False)
_BULK = _LowPriority(idle=True)


def _values(row: tuple[Any, ...], oids: Sequence[int]) -> list[bytes | None]:
    return [pg.encode_text(v, oid=o) for v, o in zip(row, oids, strict=True)]
