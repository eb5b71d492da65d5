"""An answer as the console shows and downloads it: JSON for the page, CSV and Parquet files.

Values travel as JSON numbers where they are finite numbers and as text otherwise (a date, a
Decimal, a key); the page writes every one with ``textContent``, never as markup. Each value
with a half-width carries it (noise only, at the answer's confidence), a quantile its interval,
and every value its mostly-noise flag. What the answer cost is said without naming any other
analyst's release: an answer served again says "served free from an earlier release", never
whose or which (the ledger record numbers of releases are left out, here and in downloads).
"""

from __future__ import annotations

import csv
import datetime
import decimal
import io
import math
from typing import Any

from dpsql.policy.numbers import decimal_text
from dpsql.release.cells import cell
from dpsql.release.result import Result, columns, shown_rows, summary, to_arrow

__all__ = ["SERVED_FREE", "answer_json", "cost_text", "to_csv", "to_parquet"]

SERVED_FREE = "served free from an earlier release: nothing was charged"
MAX_SHOWN_ROWS = 2000  # rows the page shows; the downloads hold them all


def cost_text(result: Result) -> str:
    """What the answer cost and what its ± covers, naming no other release."""
    if result.charge is not None:
        cost = (
            f"charged epsilon {decimal_text(result.charge.epsilon)}, delta "
            f"{decimal_text(result.charge.delta)}"
        )
    else:
        cost = SERVED_FREE if result.cached_from is not None else "nothing was charged"
    return summary(result, cost)


def _json_value(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, decimal.Decimal | datetime.date | datetime.datetime | datetime.time):
        return str(value)
    return str(value)


def _accuracy(width: Any) -> Any:
    if isinstance(width, tuple):
        return [float(width[0]), float(width[1])]
    if isinstance(width, int | float):
        return float(width) if math.isfinite(float(width)) else None
    return None


def answer_json(result: Result, answer_id: str | None) -> dict[str, Any]:
    """The page's form of ``result``."""
    rows = []
    for r, row in enumerate(shown_rows(result)[:MAX_SHOWN_ROWS]):
        widths = result.accuracy[r] if r < len(result.accuracy) else ()
        flags = result.noise[r] if r < len(result.noise) else ()
        cells = []
        for i, value in enumerate(row):
            width = widths[i] if i < len(widths) else None
            noisy = bool(flags[i]) if i < len(flags) else False
            cells.append(
                {
                    "value": _json_value(value),
                    "text": cell(value, width),
                    "accuracy": _accuracy(width),
                    "noise": noisy,
                }
            )
        rows.append(cells)
    return {
        "id": answer_id,
        "total_rows": len(result.rows),
        "columns": list(result.columns),
        "types": list(result.types),
        "rows": rows,
        "cost": cost_text(result) if result.columns or result.charge else result.message,
        "charged": None
        if result.charge is None
        else {
            "epsilon": decimal_text(result.charge.epsilon),
            "delta": decimal_text(result.charge.delta),
        },
        "served_free": result.cached_from is not None,
        "note": result.note,
        "bounds_note": result.bounds_note,
        "message": result.message,
    }


def to_csv(result: Result) -> bytes:
    """The answer as CSV: each value, then after each value with half-widths its ``± `` column
    (a quantile: its interval's two ends) and its ``noise`` flag column."""
    table = columns(result, shown_rows(result), accuracy=True, noise=True)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([name for name, _, _ in table])
    for r in range(len(result.rows)):
        writer.writerow(["" if v[r] is None else _csv_value(v[r]) for _, _, v in table])
    return out.getvalue().encode("utf-8")


def _csv_value(value: Any) -> str:
    text = str(value)
    # A cell that a spreadsheet would run as a formula is quoted as text (CSV injection).
    if text[:1] in ("=", "+", "-", "@", "\t", "\r") and not isinstance(
        value, int | float | decimal.Decimal
    ):
        return "'" + text
    return text


def to_parquet(result: Result) -> bytes:
    """The answer as Parquet, with the ± and noise columns of the CSV and what it cost in the
    file's metadata (no release number: see the module docstring)."""
    import pyarrow.parquet as pq  # noqa: PLC0415 - the web extra's, imported when a file is asked

    table = to_arrow(result, accuracy=True, noise=True)
    meta = dict(table.schema.metadata or {})
    for hidden in (b"cached_from", b"ledger_record"):
        meta.pop(hidden, None)
    meta[b"cost"] = cost_text(result).encode()
    sink = io.BytesIO()
    pq.write_table(table.replace_schema_metadata(meta), sink)
    return sink.getvalue()
