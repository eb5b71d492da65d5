"""PEP 249 (DB-API 2.0) over ``Session``.

The exception classes of PEP 249, each dpsql leaf both the PEP 249 class and the dpsql class,
are defined in ``dpsql.interfaces.dbapi.errors`` (their tree is in its docstring), with the one
mapping from the ``DpsqlError`` tree to them; the ``dpsql`` package exports them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from dpsql import errors
from dpsql.accounting.budget.report import BudgetReport
from dpsql.interfaces.dbapi.errors import (
    InterfaceError,
    InvalidParameterError,
    NotSupportedError,
    ProgrammingError,
    _pep249,
)
from dpsql.policy import Policy, load_policy
from dpsql.release.diagnosis import Diagnosed
from dpsql.release.post import Accuracy
from dpsql.release.result import Result, covers, to_arrow, to_pandas
from dpsql.session.session import Session

__all__ = [
    "BINARY",
    "DATETIME",
    "NUMBER",
    "ROWID",
    "STRING",
    "Connection",
    "Cursor",
    "Description",
    "apilevel",
    "connect",
    "paramstyle",
    "threadsafety",
]

apilevel = "2.0"
threadsafety = 1  # threads may share the module, not connections
paramstyle = "qmark"


# PEP 249 type objects: compare equal to the DuckDB type names in ``description``.
class _TypeObject(frozenset[str]):
    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return other.upper() in self or other.upper().startswith(tuple(self))
        return frozenset.__eq__(self, other)

    def __hash__(self) -> int:
        return frozenset.__hash__(self)


STRING = _TypeObject({"VARCHAR", "TEXT", "STRING"})
BINARY = _TypeObject({"BLOB", "BYTEA"})
NUMBER = _TypeObject(
    {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "DOUBLE", "FLOAT", "REAL", "DECIMAL"}
)
DATETIME = _TypeObject({"DATE", "TIMESTAMP", "TIME"})
ROWID = _TypeObject({"ROWID"})


class Connection:
    """A PEP 249 connection: one ``Session`` (policy, engine, budget, settings)."""

    def __init__(self, session: Session):
        self._session: Session | None = session

    @property
    def session(self) -> Session:
        if self._session is None:
            raise InterfaceError("the connection is closed")
        return self._session

    def cursor(self) -> Cursor:
        return Cursor(self)

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def commit(self) -> None:
        """A no-op: dpsql never writes data; charges are committed before each release."""
        self.session  # noqa: B018 - raises on a closed connection

    def rollback(self) -> None:
        raise NotSupportedError("a release cannot be rolled back: its charge stands")

    @_pep249
    def budget(self) -> BudgetReport:
        """A frozen report of spent and remaining budget."""
        return self.session.budget()

    @_pep249
    def set(self, name: str, value: object) -> None:
        """Python form of ``SET dpsql.name = value`` (``None`` resets it)."""
        if not isinstance(name, str) or len(name) > 64:  # no setting's name is longer
            raise errors.ParameterError("a setting's name is one of dpsql's setting names")
        self.session.set_option(name, value)

    def __enter__(self) -> Connection:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


Description = tuple[str, str, None, None, None, None, None]


class Cursor:
    """A PEP 249 cursor. ``accuracy`` holds per-cell 95% (``confidence``) noise half-widths."""

    def __init__(self, connection: Connection):
        self.connection = connection
        self.arraysize = 1
        self._result: Result | None = None
        self._results: list[Result] = []  # the result sets after the current one
        self._position = 0
        self._closed = False

    def _check(self) -> None:
        if self._closed:
            raise InterfaceError("the cursor is closed")
        self.connection.session  # noqa: B018 - raises on a closed connection

    @property
    def description(self) -> tuple[Description, ...] | None:
        if self._result is None or not self._result.columns:
            return None
        return tuple(
            (name, dtype, None, None, None, None, None)
            for name, dtype in zip(self._result.columns, self._result.types, strict=False)
        )

    @property
    def rowcount(self) -> int:
        return -1 if self._result is None or not self._result.columns else len(self._result.rows)

    @property
    def accuracy(self) -> tuple[tuple[Accuracy, ...], ...]:
        """Per row, per column: the half-width of the noise interval (None where no noise);
        for MEDIAN, quantiles, MIN and MAX an interval ``(lo, hi)`` that covers the quantile of
        the kept rows at the confidence (asymmetric: never a half-width)."""
        return self._result.accuracy if self._result is not None else ()

    @property
    def noise(self) -> tuple[tuple[bool, ...], ...]:
        """Per row, per column: True where the value is mostly noise (its ± at least its own
        size, or its interval spanning the whole range its estimate is clamped to)."""
        return self._result.noise if self._result is not None else ()

    @property
    def confidence(self) -> float | None:
        return self._result.confidence if self._result is not None else None

    @property
    def diagnostics(self) -> Diagnosed | None:
        """The diagnosis of the bounds of the last query (``SET dpsql.diagnose = on``): the
        fraction of units each bound cut, with its ±; None when none was asked for."""
        return self._result.diagnosis if self._result is not None else None

    @property
    def covers(self) -> str:
        """What the half-widths in ``accuracy`` cover: ``noise only``, with a diagnosis
        ``noise only; bounds cut ~8% of units``. Never the bias of the bounds."""
        return covers(self._result) if self._result is not None else "noise only"

    @property
    def result(self) -> Result | None:
        """The full result of the last statement (plan, charge, accuracy)."""
        return self._result

    @_pep249
    def execute(
        self, operation: str, parameters: Sequence[object] | None = None, **options: object
    ) -> Cursor:
        """Run one statement; ``options`` are per-query settings (epsilon=..., delta=...)."""
        self._check()
        self._result = None
        self._results = []
        self._result = self.connection.session.execute(operation, parameters, **options)
        self._position = 0
        return self

    @_pep249
    def executescript(self, script: str, *, partial: bool = False) -> Cursor:
        """Run a script of statements planned as one workload (``docs/workload.md``): one
        charge for all of them before any engine work, answers shared where the plan finds
        them. The first result set is current; ``nextset()`` moves to the next one. With
        ``partial``, the longest prefix that fits runs and the rest is skipped."""
        self._check()
        self._result = None
        done = self.connection.session.run_script(script, partial)
        self._results = [r for s, r in done if r is not None and s.kind != "set"]
        self._result = self._results.pop(0) if self._results else None
        self._position = 0
        return self

    def nextset(self) -> bool | None:
        """Move to the next result set of ``executescript`` (PEP 249): True, or None when
        there is none."""
        self._check()
        if not self._results:
            return None
        self._result = self._results.pop(0)
        self._position = 0
        return True

    def executemany(
        self, operation: str, seq_of_parameters: Sequence[Sequence[object]], **options: object
    ) -> Cursor:
        """Each parameter set is a separate query, charged separately."""
        if isinstance(seq_of_parameters, str | bytes) or not isinstance(
            seq_of_parameters, Iterable
        ):
            raise InvalidParameterError("executemany takes a sequence of parameter sequences")
        for parameters in seq_of_parameters:
            self.execute(operation, parameters, **options)
        return self

    def _rows(self) -> tuple[tuple[Any, ...], ...]:
        self._check()
        if self._result is None or not self._result.columns:
            raise ProgrammingError("no result set: execute a query first")
        return self._result.rows

    def fetchone(self) -> tuple[Any, ...] | None:
        rows = self._rows()
        if self._position >= len(rows):
            return None
        self._position += 1
        return rows[self._position - 1]

    def fetchmany(self, size: int | None = None) -> list[tuple[Any, ...]]:
        rows = self._rows()
        count = self.arraysize if size is None else size
        if not isinstance(count, int) or isinstance(count, bool):
            raise ProgrammingError("fetchmany's size (or arraysize) must be an integer")
        chunk = rows[self._position : self._position + count]
        self._position += len(chunk)
        return list(chunk)

    @_pep249
    def fetch_df(self, accuracy: bool = False) -> Any:
        """The remaining rows as a pandas DataFrame (``accuracy``: a ``<name> ±`` column after
        each column with half-widths); the cost in ``DataFrame.attrs``. Needs pandas."""
        result, rows = self._remaining()
        return to_pandas(result, rows, accuracy)

    @_pep249
    def fetch_arrow_table(self, accuracy: bool = False) -> Any:
        """The remaining rows as a pyarrow Table (``accuracy`` as for ``fetch_df``); the cost
        in the schema's metadata. Needs pyarrow."""
        result, rows = self._remaining()
        return to_arrow(result, rows, accuracy)

    def _remaining(self) -> tuple[Result, tuple[tuple[Any, ...], ...]]:
        rows = self._rows()[self._position :]
        assert self._result is not None  # _rows raised otherwise
        self._position += len(rows)
        return self._result, rows

    def fetchall(self) -> list[tuple[Any, ...]]:
        rows = self._rows()
        chunk = rows[self._position :]
        self._position = len(rows)
        return list(chunk)

    def setinputsizes(self, sizes: object) -> None:
        pass

    def setoutputsize(self, size: object, column: object = None) -> None:
        pass

    def close(self) -> None:
        self._closed = True

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        while (row := self.fetchone()) is not None:
            yield row

    def __enter__(self) -> Cursor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@_pep249
def connect(
    policy: Policy | str | Path | Mapping[str, Any], analyst: str | None = None
) -> Connection:
    """Open a connection over a policy (a TOML path, a ``Policy`` or a dict).

    ``analyst`` is self-declared in process; only the server authenticates it.
    """
    if analyst is not None and not isinstance(analyst, str):
        # The ledger records the name as JSON text: anything else cannot be recorded.
        raise errors.ParameterError("analyst must be a string (the analyst's name) or None")
    if isinstance(policy, Mapping):
        policy = load_policy(dict(policy))
    return Connection(Session(policy, analyst=analyst))
