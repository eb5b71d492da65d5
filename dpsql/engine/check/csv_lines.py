"""Which lines of a CSV file the engines drop, and which fields they read as NULL, and why.

The engines read a CSV file through the rules of ``dpsql.engine.csv_text``, in SQL: a line that
breaks a rule is no row, a field whose text does not match its type's grammar is NULL, and
nothing says so (a query must not fail, nor its answer depend on which rows broke a rule). The
owner needs to know. ``scan_csv`` walks the file once, in Python, applying the same rules to
each line with its number, and gives each dropped line and NULLed field with its reason: line
numbers count every line end (a newline, a carriage return, or the two as CRLF), the header is
line 1. It reads the file in blocks; a line's memory is bounded by the readers' line cap.

The rules are the engines' (the grammars are ``csv_text.GRAMMARS``; the integer ranges, the
decimal's rounding and the dates' calendar are what DuckDB's TRY_CAST gives), and the
differential tests hold the scan to DuckDB's view row for row (``tests/engine/test_csv_check``).
"""

from __future__ import annotations

import datetime as dt
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Context, Decimal
from pathlib import Path
from typing import BinaryIO

from dpsql.engine.csv_text import (
    BOM,
    CUT,
    GRAMMARS,
    MAX_LINE_BYTES,
    READER_LINE_BYTES,
    CsvType,
)

__all__ = ["BLOCK_BYTES", "CsvScan", "LineFinding", "scan_csv"]

BLOCK_BYTES = 1 << 22  # read 4 MiB at a time
_CUT = CUT.encode("utf-8")
_ENDS = re.compile(rb"\r\n|\r|\n")
# DuckDB's integer types -> their (lowest, highest) values
_RANGES: dict[str, tuple[int, int]] = {
    "TINYINT": (-(2**7), 2**7 - 1),
    "SMALLINT": (-(2**15), 2**15 - 1),
    "INTEGER": (-(2**31), 2**31 - 1),
    "BIGINT": (-(2**63), 2**63 - 1),
    "HUGEINT": (-(2**127), 2**127 - 1),
    "UTINYINT": (0, 2**8 - 1),
    "USMALLINT": (0, 2**16 - 1),
    "UINTEGER": (0, 2**32 - 1),
    "UBIGINT": (0, 2**64 - 1),
    "UHUGEINT": (0, 2**128 - 1),
}
_FLOAT_MAX = 3.4028234663852886e38  # FLOAT's largest value: DuckDB reads text beyond it as inf
_DECIMAL = re.compile(r"DECIMAL\((\d+),(\d+)\)")


@dataclass(frozen=True)
class LineFinding:
    """One line's finding: its number, what happened (``dropped``: no row; ``null``: a field
    read as NULL; ``ignored``: text the row does not hold; ``changed``: a value read otherwise
    than written), the column (for a field) and why, in the policy's words (never the text)."""

    line: int
    what: str
    reason: str
    column: str | None = None


@dataclass
class CsvScan:
    """What one scan of a CSV file found: line counts, the findings' counts by (what, column,
    reason), and the first ``limit`` findings themselves, in line order."""

    lines: int = 0
    rows: int = 0
    empty: int = 0
    headers: int = 0  # repeats of the header line (no row)
    counts: Counter[tuple[str, str | None, str]] = field(default_factory=Counter)
    listed: list[LineFinding] = field(default_factory=list)
    limit: int = 50

    def add(self, finding: LineFinding) -> None:
        self.counts[(finding.what, finding.column, finding.reason)] += 1
        if len(self.listed) < self.limit:
            self.listed.append(finding)

    @property
    def dropped(self) -> int:
        return sum(n for (what, _, _), n in self.counts.items() if what == "dropped")

    @property
    def nulled(self) -> int:
        return sum(n for (what, _, _), n in self.counts.items() if what == "null")


def _batches(handle: BinaryIO) -> Iterator[list[bytes | None]]:
    """The file's lines without their ends, a block's worth at a time; None for a line longer
    than the readers' cap, which is not kept (its bytes are skipped: an endless line takes no
    memory)."""
    pending = b""
    too_long = False
    while block := handle.read(BLOCK_BYTES):
        data = pending + block
        # A CR at the end of a block may be the first half of a CRLF: keep it for the next one.
        hold = 1 if data.endswith(b"\r") else 0
        body = data[: len(data) - hold]
        if b"\r" in body:
            lines: list[bytes | None] = list(_ENDS.split(body))
        else:
            lines = list(body.split(b"\n"))
        last = lines.pop()  # the text after the block's last line end: the next line's start
        if too_long and lines:
            lines[0], too_long = None, False
        pending = (last or b"") + data[len(data) - hold :]
        if len(pending) > READER_LINE_BYTES + 1:  # the reader drops it: keep nothing of it
            pending, too_long = data[len(data) - hold :], True
        yield lines
    if too_long:
        yield [None]
    elif pending:
        yield [pending[:-1] if pending.endswith(b"\r") else pending]


def scan_csv(
    path: Path,
    delimiter: str,
    header: str,
    names: list[str],
    kinds: Mapping[str, CsvType],
    *,
    limit: int = 50,
    fast: bool = True,
) -> CsvScan:
    """Walk ``path`` (a CSV table: its header line and column names as ``csv_columns`` gives
    them, ``kinds`` the declared columns' readings by lower-case name) and report each line the
    engines drop and each field they read as NULL, with its reason. ``fast``: a line that one
    regular expression shows to hold nothing to report skips the field-by-field reading."""
    scan = CsvScan(limit=limit)
    typed = [(i, n, kinds[n.lower()]) for i, n in enumerate(names) if n.lower() in kinds]
    typed = [(i, n, k) for i, n, k in typed if k.family != "text"]
    clean = _clean_line(delimiter, names, kinds) if fast else None
    repeats = {header, BOM + header}
    width = len(names)
    number = 0
    with open(path, "rb") as handle:
        for batch in _batches(handle):
            for raw in batch:
                number += 1
                if number == 1:
                    continue  # the header line (csv_columns read it)
                if raw is None:
                    reason = f"longer than {READER_LINE_BYTES:,} bytes"
                    scan.add(LineFinding(number, "dropped", reason))
                    continue
                line, cut, _ = raw.partition(_CUT)  # text from a U+FFFF on is ignored
                try:
                    text = line.decode("utf-8")  # strict: no surrogates, no overlong forms
                except UnicodeDecodeError:
                    scan.add(LineFinding(number, "dropped", "not valid UTF-8"))
                    continue
                if not text:
                    scan.empty += 1
                elif len(line) > MAX_LINE_BYTES:
                    reason = f"longer than {MAX_LINE_BYTES:,} bytes"
                    scan.add(LineFinding(number, "dropped", reason))
                elif text in repeats:
                    scan.headers += 1
                elif clean is not None and not cut and clean.fullmatch(text):
                    scan.rows += 1  # the common case: every field as written
                else:
                    _fields(
                        scan,
                        number,
                        text,
                        cut=bool(cut),
                        delimiter=delimiter,
                        width=width,
                        typed=typed,
                    )
    scan.lines = number
    return scan


def _fields(
    scan: CsvScan,
    number: int,
    text: str,
    *,
    cut: bool,
    delimiter: str,
    width: int,
    typed: list[tuple[int, str, CsvType]],
) -> None:
    """One line's rules past the line's own: its fields, and each typed field's reading."""
    fields = text.split(delimiter)
    if len(fields) < width:
        reason = f"fewer fields than the header's {width}"
        scan.add(LineFinding(number, "dropped", reason))
        return
    scan.rows += 1
    if cut:
        scan.add(LineFinding(number, "ignored", "text after a U+FFFF character"))
    if len(fields) > width:
        scan.add(LineFinding(number, "ignored", f"more fields than the header's {width}: the rest"))
    for index, name, kind in typed:
        value = fields[index]
        if not value.strip(" \t"):
            continue  # an empty field is NULL by design: a missing value
        what, reason = _read(value, kind)
        if reason:
            scan.add(LineFinding(number, what, reason, name))


# Text a typed field may hold that is read as written, whatever its digits: a subset of each
# grammar (integers short enough for their type, days 1 to 28, floats far from the range's
# ends). A line of such fields has nothing to report; any other line is read field by field.
_ANY_DAY = "(?:0[1-9]|[12][0-9]|3[01])"
assert GRAMMARS["date"].endswith(_ANY_DAY)  # a fact of csv_text's grammar
_SAFE_DATE = GRAMMARS["date"][: -len(_ANY_DAY)] + "(?:0[1-9]|1[0-9]|2[0-8])"
_SAFE_TIME = GRAMMARS["timestamp"][len(GRAMMARS["date"]) :]


def _safe(kind: CsvType) -> str:
    family = kind.family
    if family == "integer":
        low, high = _RANGES[kind.duckdb]
        digits = len(str(high)) - 1
        return f"{'[+-]?' if low < 0 else '[+]?'}[0-9]{{1,{digits}}}"
    if family == "decimal":
        shape = _DECIMAL.fullmatch(kind.duckdb)
        assert shape is not None
        whole, scale = int(shape.group(1)) - int(shape.group(2)), int(shape.group(2))
        if whole < 1 or scale < 1:
            return "(?!)"  # read field by field
        return f"[+-]?(?:[0-9]{{1,{whole}}}(?:[.][0-9]{{0,{scale}}})?|[.][0-9]{{1,{scale}}})"
    if family == "float":  # at most 15 digits before an exponent of one digit: within FLOAT
        return "[+-]?(?:[0-9]{1,15}(?:[.][0-9]{0,15})?|[.][0-9]{1,15})(?:[eE][+-]?[0-9])?"
    if family == "date":
        return _SAFE_DATE
    if family == "timestamp":
        return _SAFE_DATE + _SAFE_TIME
    return f"{GRAMMARS['true']}|{GRAMMARS['false']}"  # a boolean: its whole grammar


def _clean_line(delimiter: str, names: list[str], kinds: Mapping[str, CsvType]) -> re.Pattern[str]:
    """A line of exactly the header's fields, each text, blank or safe for its type."""
    other = f"[^{re.escape(delimiter)}]*"
    parts = []
    for name in names:
        kind = kinds.get(name.lower())
        if kind is None or kind.family == "text":
            parts.append(other)
        else:
            parts.append(f"[ \\t]*(?:{_safe(kind)})?[ \\t]*")
    return re.compile(re.escape(delimiter).join(parts), re.ASCII | re.DOTALL)


_PATTERNS = {
    family: re.compile(rf"[ \t]*({grammar})[ \t]*", re.ASCII)
    for family, grammar in GRAMMARS.items()
}
_NOT_A = {
    "integer": "not an integer (digits, an optional sign)",
    "decimal": "not a decimal (digits with an optional point, no exponent)",
    "float": "not a number",
    "date": "not a date (YYYY-MM-DD, year 0001 to 9999)",
    "timestamp": "not a timestamp (YYYY-MM-DD, optionally HH:MM:SS[.ffffff], no time zone)",
}


def _read(value: str, kind: CsvType) -> tuple[str, str]:
    """How the engines read a non-blank field of a typed column: ("", "") when as written,
    ("null", why) when NULL, ("changed", why) when read as another value."""
    family = kind.family
    if family == "boolean":
        if _PATTERNS["true"].fullmatch(value) or _PATTERNS["false"].fullmatch(value):
            return "", ""
        return "null", "not a boolean (true, t, 1, false, f, 0)"
    matched = _PATTERNS[family].fullmatch(value)
    if matched is None:
        return "null", _NOT_A[family]
    core = matched.group(1)
    if family == "integer":
        low, high = _RANGES[kind.duckdb]
        if not low <= int(core) <= high:
            return "null", f"out of the range of {kind.duckdb}"
    elif family == "decimal":
        return _decimal(core, kind.duckdb)
    elif family == "float":
        number = float(core)
        literal = core.lstrip("+-")[:1].lower() in ("i", "n")  # inf, infinity, nan as written
        if not literal and (
            number in (float("inf"), float("-inf"))
            or (kind.duckdb == "FLOAT" and abs(number) > _FLOAT_MAX)
        ):
            return "changed", f"beyond the range of {kind.duckdb}: read as infinity"
    else:  # a date or timestamp: the grammar allows a 30th of February, the calendar not
        year, month, day = (int(part) for part in core[:10].split("-"))
        try:
            dt.date(year, month, day)
        except ValueError:
            return "null", "no such day"
    return "", ""


def _decimal(core: str, declared: str) -> tuple[str, str]:
    """A decimal's reading: more than ``s`` fractional digits round half away from zero; more
    than ``p - s`` integer digits after rounding is NULL."""
    shape = _DECIMAL.fullmatch(declared)
    if shape is None:  # csv_type spells every decimal DECIMAL(p,s)
        raise ValueError(f"{declared} is not DECIMAL(p,s)")
    precision, scale = int(shape.group(1)), int(shape.group(2))
    # Enough digits for every digit of the text and the scale: the rounding is exact.
    context = Context(prec=len(core) + scale + 2, rounding=ROUND_HALF_UP)
    number = Decimal(core).quantize(Decimal(1).scaleb(-scale), context=context)
    if abs(number) >= Decimal(10) ** (precision - scale):
        return "null", f"more than {precision - scale} integer digit(s) for {declared}"
    return "", ""
