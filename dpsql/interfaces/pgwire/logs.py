"""The server's log: repeated lines rate-limited, and sqlglot's own messages kept out of it.

Two things a client could otherwise write into the owner's log at will:

- **Repeats.** A line written for each refused message lets one client write a line per message:
  three floods of over-long statements wrote 53,592 lines. :class:`RepeatLimit` lets each kind
  of line (its logger and its format string, whatever its arguments) through at most ``burst``
  times per ``interval`` seconds; the rest are counted, and the next line of any kind after the
  interval reports the count as one ``suppressed N similar lines`` line, which quotes only the
  format string (code, never a client's text).
- **sqlglot's messages.** sqlglot logs through its own ``sqlglot`` logger, and some of its
  warnings quote the statement (``'VACUUM ...' contains unsupported syntax``): the log must
  never hold query text (docs/server.md, "Logs"). :func:`quiet_sqlglot` puts a filter on that
  logger that drops each record and writes, rate-limited, one fixed line in its place.

``configure_logging`` is what both the server process and each worker process call.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
BURST = 20  # lines of one kind per interval
INTERVAL = 60.0  # seconds


@dataclass
class _Window:
    start: float
    level: int
    written: int = 0
    suppressed: int = 0


class RepeatLimit:
    """At most ``burst`` lines of each kind per ``interval`` seconds, then one count."""

    def __init__(
        self,
        burst: int = BURST,
        interval: float = INTERVAL,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.burst = burst
        self.interval = interval
        self._now = now
        # Keyed by (logger, format string): code constants, so the table stays small.
        self._windows: dict[tuple[str, str], _Window] = {}

    def log(self, logger: logging.Logger, level: int, msg: str, *args: object) -> None:
        """``logger.log(level, msg, *args)``, unless its kind has used up its lines."""
        now = self._now()
        self._report(now)
        window = self._windows.setdefault((logger.name, msg), _Window(now, level))
        if window.written < self.burst:
            window.written += 1
            logger.log(level, msg, *args)
        else:
            window.suppressed += 1

    def _report(self, now: float) -> None:
        """End the windows whose interval is over, each with its count if it suppressed any."""
        for (name, msg), window in list(self._windows.items()):
            if now - window.start < self.interval:
                continue
            del self._windows[(name, msg)]
            if window.suppressed:
                logging.getLogger(name).log(
                    window.level,
                    "suppressed %d similar lines in %.0f s: %r",
                    window.suppressed, now - window.start, msg,
                )  # fmt: skip


# One per process: the server's event loop, or a worker (one connection).
LIMIT = RepeatLimit()


def limited(logger: logging.Logger, level: int, msg: str, *args: object) -> None:
    """Log through the process's :data:`LIMIT`."""
    LIMIT.log(logger, level, msg, *args)


class _WithholdSqlglot(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        # Its text may quote a statement, i.e. an analyst's query or a data value written in it.
        limited(
            logging.getLogger("dpsql"),
            record.levelno,
            "sqlglot %s withheld (it may quote a statement)",
            record.levelname.lower(),
        )
        return False


_WITHHOLD = _WithholdSqlglot()


def quiet_sqlglot() -> None:
    """Replace every message of the ``sqlglot`` logger by a fixed, rate-limited line."""
    logging.getLogger("sqlglot").addFilter(_WITHHOLD)  # added once, however often called


def configure_logging(level: int) -> None:
    """The server's logging, in its process and in each worker: one format, sqlglot quiet."""
    logging.basicConfig(level=level, format=LOG_FORMAT)
    quiet_sqlglot()


__all__ = ["LOG_FORMAT", "RepeatLimit", "configure_logging", "limited", "quiet_sqlglot"]
