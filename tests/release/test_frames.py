"""Results in the tools of Python users: ``cursor.fetch_df()`` (pandas), ``fetch_arrow_table()``
(pyarrow), a notebook's ``_repr_html_`` with ± and cost, and a short ``repr``; with the optional
libraries missing, an ImportError that says what to install."""

from __future__ import annotations

import builtins
import datetime as dt
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from conftest import TinyPolicy, examples
from hypothesis import given, settings
from hypothesis import strategies as st

import dpsql
from dpsql.release import result as frames
from dpsql.release.result import Result

ROWS = [(u, ("east", "west")[u % 2], 18 + u % 60, float(u % 50)) for u in range(1, 300)]
GROUPED = "SELECT region, COUNT(*) AS n, AVG(spend) AS mean FROM visits GROUP BY region"


@pytest.fixture
def cursor(tiny_policy: TinyPolicy) -> Any:
    with dpsql.connect(tiny_policy(ROWS)) as conn:
        yield conn.cursor()


def test_fetch_df_gives_the_rows_the_cost_and_on_request_the_half_widths(cursor: Any) -> None:
    cursor.execute(GROUPED)
    rows, widths = cursor.fetchall(), cursor.accuracy
    cursor.execute(GROUPED)  # served from the cache: the same release
    frame = cursor.fetch_df()
    assert list(frame.columns) == ["region", "n", "mean"]
    assert [tuple(r) for r in frame.itertuples(index=False)] == rows
    assert str(frame["n"].dtype) == "Int64" and str(frame["mean"].dtype) == "float64"
    assert frame.attrs["epsilon"] == "0" and frame.attrs["cached_from"]
    cursor.execute(GROUPED, fresh=True)
    plus = cursor.fetch_df(accuracy=True)
    assert list(plus.columns) == ["region", "n", "n ±", "mean", "mean ±"]
    assert list(plus["n ±"]) == [w[1] for w in cursor.accuracy]
    assert plus.attrs["epsilon"] == "1" and plus.attrs["ledger_record"]
    assert "noise only" in plus.attrs["accuracy"]
    assert widths  # the first answer had half-widths too
    assert cursor.fetchall() == []  # fetch_df took the remaining rows


def test_fetch_arrow_table_types_each_column(cursor: Any) -> None:
    cursor.execute(GROUPED)
    table = cursor.fetch_arrow_table(accuracy=True)
    assert table.schema.names == ["region", "n", "n ±", "mean", "mean ±"]
    assert table.schema.field("region").type == pa.string()
    integer = {"INTEGER": pa.int32(), "BIGINT": pa.int64()}[cursor.result.types[1]]
    assert table.schema.field("n").type == integer
    assert table.schema.field("mean ±").type == pa.float64()
    assert table.schema.metadata[b"epsilon"] == b"1"
    assert table.num_rows == 5


def test_fetch_df_takes_the_rest_after_fetchone(cursor: Any) -> None:
    cursor.execute(GROUPED)
    first = cursor.fetchone()
    frame = cursor.fetch_df(accuracy=True)
    assert len(frame) == 4 and tuple(frame.iloc[0][["region", "n", "mean"]]) != first
    assert list(frame["n ±"]) == [w[1] for w in cursor.accuracy[1:]]


def test_the_arrow_types_of_dates_decimals_and_nulls() -> None:
    result = Result(
        ("d", "x", "t", "k"),
        ("DATE", "DECIMAL(18,3)", "TIMESTAMP", "BIGINT"),
        ((dt.date(2026, 1, 1), Decimal("1.500"), dt.datetime(2026, 1, 1, 3), None),),
    )
    table = frames.to_arrow(result)
    assert [f.type for f in table.schema] == [
        pa.date32(), pa.decimal128(18, 3), pa.timestamp("us"), pa.int64(),
    ]  # fmt: skip
    frame = frames.to_pandas(result)
    assert frame["k"].isna().all() and str(frame["k"].dtype) == "Int64"


def test_html_escapes_values_and_shows_cost_and_half_widths(cursor: Any) -> None:
    cursor.execute(GROUPED)
    page = cursor.result._repr_html_()
    assert "<table>" in page and "<th>region</th>" in page and " ± " in page
    assert "charged epsilon 1, delta 0" in page and "noise only" in page
    hostile = Result(
        ("k", "n"), ("VARCHAR", "BIGINT"), (("<script>x</script>", 3),), ((None, 1.5),)
    )
    shown = hostile._repr_html_()
    assert "<script>" not in shown and "&lt;script&gt;" in shown and "3.0 ± 1.5" in shown


def test_repr_is_short(cursor: Any) -> None:
    cursor.execute(GROUPED)
    text = repr(cursor.result)
    assert text.startswith("<Result: 5 row(s) of region, n, mean; charged epsilon 1")
    assert len(text) < 200
    wide = Result(tuple(f"c{i}" for i in range(40)), ("BIGINT",) * 40, ((0,) * 40,) * 1000)
    assert len(repr(wide)) < 200


def test_a_missing_optional_library_says_what_to_install(
    cursor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = builtins.__import__

    def without(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.split(".", maxsplit=1)[0] in ("pandas", "pyarrow"):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without)
    monkeypatch.setattr(frames.importlib, "import_module", without)
    cursor.execute(GROUPED)
    with pytest.raises(ImportError, match=r"fetch_df\(\) needs pandas.*dpsql\[frames\]"):
        cursor.fetch_df()
    with pytest.raises(ImportError, match=r"fetch_arrow_table\(\) needs pyarrow"):
        cursor.fetch_arrow_table()
    assert "<table>" in cursor.result._repr_html_()  # the HTML needs neither
    assert pd.__name__ == "pandas" and Fraction(1) == 1


@settings(max_examples=examples(300), deadline=None)
@given(
    value=st.floats(-1e9, 1e9, allow_nan=False),
    width=st.floats(1e-9, 1e9, allow_nan=False),
)
def test_a_printed_half_width_never_understates_the_noise(value: float, width: float) -> None:
    """Every text interface prints ``frames.cell``: its half-width is at least the true one."""
    shown = frames.cell(value, width)
    printed = float(shown.split(" ± ")[1])
    assert printed >= width
    assert float(frames.half_width(width)) >= width
