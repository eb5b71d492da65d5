"""A catalog query's answer for ``dpsql serve``: its rows encoded and counted against the byte
cap as they are fetched, whole for a portal or streamed for a simple query.

A free answer must not exhaust the server: one analyst's 100 MB catalog answer, built whole,
held 100 MB in the process that every connection shares. Here the rows are counted
(``AnswerRows``) batch by batch as DuckDB returns them, so an answer over the cap stops being
fetched; a streamed answer is fetched only as fast as its client reads it, since its worker
sends each frame before it fetches the next rows (``Backend._answer_steps``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

from dpsql.interfaces.pgwire import protocol as pg
from dpsql.interfaces.pgwire.catalog import Catalog
from dpsql.interfaces.pgwire.statements import Answer, AnswerRows

__all__ = ["catalog_answer"]


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
    columns, first = next(batches)  # a query that fails at once fails before any row is sent
    described = tuple((name, *pg.pg_type(dtype)) for name, dtype in columns)
    oids = [oid for _, oid, _ in described]
    counted = AnswerRows(cap)

    def rows() -> Iterator[bytes]:
        try:
            for batch in itertools.chain((first,), (b for _, b in batches)):
                for row in batch:  # counted as encoded: past the cap, nothing more is fetched
                    yield counted.encode(_values(row, oids))
        finally:
            batches.close()  # the catalog's connection, free for the next statement

    if stream:
        return Answer(described, rows(), "SELECT")
    whole = list(rows())
    return Answer(described, whole, f"SELECT {len(whole)}")


def _values(row: tuple[Any, ...], oids: Sequence[int]) -> list[bytes | None]:
    return [pg.encode_text(v, oid=o) for v, o in zip(row, oids, strict=True)]
