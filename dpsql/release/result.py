"""What a statement gives back: ``Result``, a table with its plan, its charge and its ±, and
the forms it is read in: a notebook's HTML, a pandas DataFrame, an Arrow table.

``_with_accuracy`` is the form of a Result with ``SET dpsql.accuracy_columns = on``: after
each output that has half-widths, a column of them and a column of its mostly-noise flags.

pandas and pyarrow are optional (``pip install 'dpsql[frames]'``): without them, ``to_pandas``
and ``to_arrow`` raise an ``ImportError`` that says what to install; the HTML needs
neither. With ``accuracy=True`` each column that has half-widths is followed by a ``<name> ±``
column (noise only, at the result's confidence). What the answer cost travels with it:
``DataFrame.attrs`` and the Arrow schema's metadata hold ``epsilon``, ``delta`` (exact, as
text), ``confidence``, ``ledger_record`` (the charge) or ``cached_from`` (the release served
again), so a frame saved or passed on still says what it is.
"""

from __future__ import annotations

import datetime
import html
import importlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from dpsql.accounting.budget.report import Charge
from dpsql.plan.plans import Plan
from dpsql.release import diagnosis
from dpsql.release.cells import (
    INTERVALS_COVER,
    NOISE_MARK,
    Accuracy,
    accuracy_forms,
    cell,
    half_width,
    interval_text,
)
from dpsql.release.diagnosis import Diagnosed
from dpsql.release.post import ACCURACY_SUFFIX, INTERVAL_SUFFIX, NOISE_SUFFIX


@dataclass(frozen=True)
class Result:
    """What one statement returns: a table (possibly empty) and, for queries, the plan."""

    columns: tuple[str, ...]
    types: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    # Per cell: a half-width (±), a quantile's interval (lo, hi), or None (``Accuracy``).
    accuracy: tuple[tuple[Accuracy, ...], ...] = ()
    # Per cell: True where the published value is mostly noise (``dpsql.release.post``).
    noise: tuple[tuple[bool, ...], ...] = ()
    confidence: float | None = None
    plan: Plan | None = None
    charge: Charge | None = None
    message: str = ""
    cached_from: int | None = None  # the ledger record of the release served again, if any
    # The diagnosis of the bounds, when asked for (``SET dpsql.diagnose = on``).
    diagnosis: Diagnosed | None = None
    # How the answer was computed when it is not from measurements of its own (a workload's
    # least squares, ``dpsql.plan.workload.family``): shown beside the table.
    note: str = ""
    # What the answer's bounds are, shown by every interface beside the cost: the values chosen
    # privately for it (``dpsql.bounds = auto``, DP outputs released with it), or what an
    # estimate's bounds are expected to cut (``ESTIMATE BOUNDS``).
    bounds_note: str = ""

    def __repr__(self) -> str:
        shown = ", ".join(self.columns[:6]) + (", ..." if len(self.columns) > 6 else "")
        what = f"{len(self.rows)} row(s) of {shown}" if self.columns else self.message or "empty"
        return f"<Result: {what}; {summary(self)}>"

    def _repr_html_(self) -> str:
        """A notebook's display: the values with their ±, and the cost."""
        return to_html(self)


def _with_accuracy(result: Result, extra: Sequence[tuple[int, str, str]]) -> Result:
    """``result`` with, after each output that has half-widths, a column of them and a column
    of its mostly-noise flags (``SET dpsql.accuracy_columns = on``): for clients that show
    columns only (psql, BI tools)."""
    after = {i: (width, flag) for i, width, flag in extra}
    columns: list[str] = []
    types: list[str] = []
    for i, (name, dtype) in enumerate(zip(result.columns, result.types, strict=True)):
        columns.append(name)
        types.append(dtype)
        if i in after:
            columns.extend(after[i])
            interval = after[i][0].startswith(name + INTERVAL_SUFFIX)
            types.extend(("VARCHAR" if interval else "DOUBLE", "BOOLEAN"))
    rows, accuracy, noise = [], [], []
    for r, row in enumerate(result.rows):
        widths = result.accuracy[r] if r < len(result.accuracy) else ()
        flags = result.noise[r] if r < len(result.noise) else ()
        out: list[Any] = []
        kept: list[Accuracy] = []
        marked: list[bool] = []
        for i, value in enumerate(row):
            width = widths[i] if i < len(widths) else None
            flag = bool(flags[i]) if i < len(flags) else False
            out.append(value)
            kept.append(width)
            marked.append(flag)
            if i in after:
                out.extend((interval_text(width) if isinstance(width, tuple) else width, flag))
                kept.extend((None, None))  # these columns have no half-width of their own
                marked.extend((False, False))
        rows.append(tuple(out))
        accuracy.append(tuple(kept))
        noise.append(tuple(marked))
    return replace(
        result,
        columns=tuple(columns),
        types=tuple(types),
        rows=tuple(rows),
        accuracy=tuple(accuracy),
        noise=tuple(noise),
    )


MAX_HTML_ROWS = 50  # a notebook shows the first rows; the caption says how many there are


def _optional(module: str, what: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        package = "pandas" if module == "pandas" else "pyarrow"
        raise ImportError(
            f"{what} needs {package}, which is not installed: pip install 'dpsql[frames]' "
            f"(or pip install {package})"
        ) from None


def cost_metadata(result: Result) -> dict[str, str]:
    """What the result cost, as text: for ``DataFrame.attrs`` and Arrow schema metadata."""
    meta: dict[str, str] = {}
    if result.confidence is not None:
        meta["confidence"] = repr(result.confidence)
    if result.charge is not None:
        meta["epsilon"] = str(result.charge.epsilon)
        meta["delta"] = str(result.charge.delta)
        meta["ledger_record"] = str(result.charge.seq)
    elif result.cached_from is not None:
        meta["epsilon"] = meta["delta"] = "0"
        meta["cached_from"] = str(result.cached_from)
    if result.confidence is not None:
        meta["accuracy"] = (
            "half-widths of the noise only, not confidence intervals of the truth; a "
            "quantile's interval covers the quantile of the kept rows"
        )
    if result.diagnosis is not None:
        meta["diagnosis"] = result.diagnosis.describe()
    return meta


def columns(
    result: Result, rows: Sequence[Sequence[Any]], accuracy: bool, noise: bool = False
) -> list[tuple[str, str, list[Any]]]:
    """(name, DuckDB type, values) of each output column, and with ``accuracy`` the ± columns
    after the columns that have half-widths (a quantile's ``<name> interval low`` and ``<name>
    interval high``); with ``noise`` too, after them a BOOLEAN ``<name> noise`` column, true
    where the value is mostly noise."""
    start = len(result.rows) - len(rows)  # ``rows`` are the last ones (a cursor's remainder)
    widths = result.accuracy[start:] if result.accuracy else ()
    flags = result.noise[start:] if result.noise else ()
    out: list[tuple[str, str, list[Any]]] = []
    for i, (name, dtype) in enumerate(zip(result.columns, result.types, strict=True)):
        out.append((name, dtype, [row[i] for row in rows]))
        column = [w[i] if i < len(w) else None for w in widths]
        if not accuracy or all(w is None for w in column):
            continue
        if any(isinstance(w, tuple) for w in column):
            # A quantile's interval: its two ends, never a ± (``Accuracy``).
            for end, suffix in ((0, " low"), (1, " high")):
                ends = [w[end] if isinstance(w, tuple) else None for w in column]
                out.append((name + INTERVAL_SUFFIX + suffix, "DOUBLE", ends))
        else:
            out.append((name + ACCURACY_SUFFIX, "DOUBLE", column))
        if noise:
            marked = [bool(f[i]) if i < len(f) else False for f in flags]
            marked += [False] * (len(rows) - len(marked))
            out.append((name + NOISE_SUFFIX, "BOOLEAN", marked))
    return out


def to_pandas(
    result: Result, rows: Sequence[Sequence[Any]] | None = None, accuracy: bool = False
) -> Any:
    """``result`` (or its last ``rows``) as a pandas DataFrame; see the module's docstring."""
    pd = _optional("pandas", "fetch_df()")
    chosen = result.rows if rows is None else rows
    chosen_columns = columns(result, chosen, accuracy)
    frame = pd.DataFrame({name: pd.Series(values, dtype=_pandas_dtype(dtype, values))
                          for name, dtype, values in chosen_columns})  # fmt: skip
    frame.attrs.update(cost_metadata(result))
    return frame


def _pandas_dtype(dtype: str, values: Sequence[Any]) -> str | None:
    """A nullable pandas dtype for integers and booleans (a NULL keeps the column integral);
    None (inferred) for the rest."""
    upper = dtype.upper()
    if upper in ("BIGINT", "INTEGER", "SMALLINT", "TINYINT", "UBIGINT", "UINTEGER", "USMALLINT",
                 "UTINYINT"):  # fmt: skip
        return "Int64" if upper != "UBIGINT" else "UInt64"
    if upper == "BOOLEAN":
        return "boolean"
    if upper in ("DOUBLE", "FLOAT", "REAL"):
        return "float64"
    if upper == "VARCHAR":
        return "string" if any(v is not None for v in values) else "object"
    return None


def to_arrow(
    result: Result,
    rows: Sequence[Sequence[Any]] | None = None,
    accuracy: bool = False,
    noise: bool = False,
) -> Any:
    """``result`` (or its last ``rows``) as a pyarrow Table, each column in the Arrow type of
    its DuckDB type (with ``accuracy`` and ``noise``, the columns of ``columns``); the cost in
    the schema's metadata."""
    pa = _optional("pyarrow", "fetch_arrow_table()")
    chosen = result.rows if rows is None else rows
    arrays, fields = [], []
    for name, dtype, values in columns(result, chosen, accuracy, noise):
        kind = _arrow_type(pa, dtype)
        arrays.append(pa.array(values, type=kind))
        fields.append(pa.field(name, arrays[-1].type))
    schema = pa.schema(fields, metadata=cost_metadata(result))
    return pa.Table.from_arrays(arrays, schema=schema)


def _arrow_type(pa: Any, dtype: str) -> Any:
    upper = " ".join(dtype.upper().split())
    simple = {
        "BOOLEAN": pa.bool_(), "TINYINT": pa.int8(), "SMALLINT": pa.int16(),
        "INTEGER": pa.int32(), "BIGINT": pa.int64(), "UTINYINT": pa.uint8(),
        "USMALLINT": pa.uint16(), "UINTEGER": pa.uint32(), "UBIGINT": pa.uint64(),
        "FLOAT": pa.float32(), "REAL": pa.float32(), "DOUBLE": pa.float64(),
        "VARCHAR": pa.string(), "DATE": pa.date32(), "TIMESTAMP": pa.timestamp("us"),
        "TIMESTAMP WITH TIME ZONE": pa.timestamp("us", tz="UTC"),
        "TIMESTAMPTZ": pa.timestamp("us", tz="UTC"), "BLOB": pa.binary(),
        "HUGEINT": pa.decimal128(38, 0),
    }  # fmt: skip
    if upper in simple:
        return simple[upper]
    if upper.startswith("DECIMAL(") and upper.endswith(")"):
        precision, scale = (int(x) for x in upper[8:-1].split(","))
        return pa.decimal128(precision, scale)
    return None  # inferred from the values


def to_html(result: Result) -> str:
    """The result as an HTML table for notebooks: each value with its ± where it has one, and a
    caption with the cost and what the ± covers. Every value is escaped: data values are text
    an attacker may have written."""
    n = len(result.rows)
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in result.columns)
    body = []
    for r, row in enumerate(shown_rows(result)[:MAX_HTML_ROWS]):
        widths = result.accuracy[r] if r < len(result.accuracy) else ()
        flags = result.noise[r] if r < len(result.noise) else ()
        cells = []
        for i, value in enumerate(row):
            width = widths[i] if i < len(widths) else None
            noisy = i < len(flags) and flags[i]
            text = html.escape(cell(value, width))
            if noisy:
                text = f"<s>{text}</s> <em>mostly noise</em>"
            cells.append(f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    more = f"; first {MAX_HTML_ROWS} shown" if n > MAX_HTML_ROWS else ""
    caption = html.escape(f"{n} row(s){more}; {summary(result)}")
    return (
        f"<table><caption>{caption}</caption><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def summary(result: Result, cost: str | None = None) -> str:
    """One line: what the answer cost (``cost``: said another way, as the web console says it
    without release numbers), and what its ± covers."""
    if cost is None:
        cost = _cost(result)
    widths, intervals = accuracy_forms(result.accuracy)
    if result.confidence is not None and widths:
        cost += f"; ± at {result.confidence:.4g} confidence, {covers(result)}"
    if result.confidence is not None and intervals:
        cost += f"; [lo, hi] at {intervals_confidence(result):.4g} confidence: {INTERVALS_COVER}"
    shown = widths or intervals
    if (result.confidence is None or not shown) and result.diagnosis is not None:
        cost += f"; {result.diagnosis.summary()}"
    if result.bounds_note:
        cost += f"; {result.bounds_note}"
    return cost


def _cost(result: Result) -> str:
    if result.charge is not None:
        return (
            f"charged epsilon {_decimal(result.charge.epsilon)}, delta "
            f"{_decimal(result.charge.delta)} (ledger record #{result.charge.seq})"
        )
    if result.cached_from is not None:
        return f"served from the cache (release #{result.cached_from}), no charge"
    return "nothing was charged"


def intervals_confidence(result: Result) -> float:
    """The confidence a result's quantile intervals were drawn at (fixed when drawn: a cached
    interval keeps its own), else the result's."""
    if result.plan is not None:
        for m in result.plan.measurements:
            if m.spec.side and m.spec.confidence is not None:
                return m.spec.confidence
    return result.confidence or 0.0


def covers(result: Result) -> str:
    """What a result's ± covers, as every interface says it: the noise only, and with a
    diagnosis (``SET dpsql.diagnose = on``) how much the bounds cut, which the ± does not cover:
    ``noise only; bounds cut ~8% of units``. Never a confidence interval of the true value."""
    return diagnosis.covers(result.diagnosis, result.plan)


def _decimal(value: Any) -> str:
    if isinstance(value, Fraction) and value.denominator != 1:
        return f"{float(value):.6g}"
    return str(value)


def shown_rows(result: Result) -> tuple[tuple[Any, ...], ...]:
    """The rows as the text interfaces show them (the shell, ``dpsql run`` and ``query``,
    notebooks, CSV and JSON): a TIMESTAMP column whose every value is at midnight, as
    ``date_trunc('month', a_date)`` gives (a TIMESTAMP in DuckDB and PostgreSQL alike), shows
    dates, without a spurious ``00:00:00``. The values and types themselves stay the engine's
    (``cursor``, frames, Parquet, the wire). Released keys only: post-processing."""
    dates = [
        i
        for i, dtype in enumerate(result.types)
        if dtype.upper() in ("TIMESTAMP", "TIMESTAMP_NS", "TIMESTAMP_MS", "TIMESTAMP_S")
        and all(_midnight(row[i]) for row in result.rows)
        and any(row[i] is not None for row in result.rows)
    ]
    if not dates:
        return result.rows
    return tuple(
        tuple(v.date() if i in dates and v is not None else v for i, v in enumerate(row))
        for row in result.rows
    )


def _midnight(value: Any) -> bool:
    if value is None:
        return True
    return (
        isinstance(value, datetime.datetime)
        and value.tzinfo is None
        and value.time() == datetime.time(0)
    )


def noise_names(result: Result) -> list[str]:
    """The columns holding a value that is mostly noise in some row, in column order."""
    flagged = {i for row in result.noise for i, f in enumerate(row) if f}
    return [name for i, name in enumerate(result.columns) if i in flagged]


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


__all__ = [
    "INTERVALS_COVER",
    "NOISE_MARK",
    "cell",
    "columns",
    "cost_metadata",
    "covers",
    "half_width",
    "interval_text",
    "intervals_confidence",
    "noise_names",
    "shown_rows",
    "summary",
    "to_arrow",
    "to_html",
    "to_pandas",
]
