"""The owner's CSV scan (``dpsql.engine.check.csv_lines``) says what the engines do, line by line.

The engines drop lines and NULL fields silently; ``dpsql check`` must name each one, with its
line and column, and must agree with DuckDB's view of the same file row for row: the same
number of rows, and a NULL reported exactly where the view reads NULL from non-blank text.
Every malformation docs/policy.md lists (its value table is parsed here, example by example) is
reported on its own line; generated files hold the scan to the engine; the fast path (one
regular expression per clean line) and block boundaries change nothing.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import duckdb
import pytest
from conftest import examples
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dpsql.engine.check import csv_lines
from dpsql.engine.check.csv_lines import CsvScan, scan_csv
from dpsql.engine.csv_text import CUT, MAX_LINE_BYTES, csv_type, value_sql
from dpsql.engine.duckdb.engine import DuckDBEngine
from dpsql.engine.duckdb.views import csv_columns
from dpsql.policy import Policy, load_policy

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = settings(
    max_examples=examples(25),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _policy(path: Path, types: dict[str, str], delimiter: str = ",") -> Policy:
    return load_policy(
        {
            "dataset": {"id": "check"},
            "data": {"tables": {"t": str(path)}, "csv_delimiter": delimiter},
            "budget": {"diagnose": False, "epsilon": "1"},
            "tables": {
                "t": {"privacy_unit": "k", "columns": {c: {"type": t} for c, t in types.items()}}
            },
        }
    )


def _scan(path: Path, types: dict[str, str], **kwargs: Any) -> CsvScan:
    policy = _policy(path, types)
    header, names, kinds = csv_columns(policy, "t", path)
    return scan_csv(path, ",", header, names, kinds, limit=10**9, **kwargs)


def _found(scan: CsvScan) -> set[tuple[int, str, str | None]]:
    return {(f.line, f.what, f.column) for f in scan.listed}


# -- every malformation docs/policy.md lists ------------------------------------------------------


def _documented_nulls() -> list[tuple[str, str]]:
    """(declared type, text) for each example of the "NULL, e.g." column of the value table in
    docs/policy.md: what the docs promise is NULL, read back from the docs themselves."""
    text = (ROOT / "docs" / "policy.md").read_text(encoding="utf-8")
    table = text.split("| declared type | text that parses | NULL, e.g. |", 1)[1]
    found = []
    for row in table.split("\n")[2:]:
        if not row.startswith("|"):
            break
        types, _, nulls = (cell.strip() for cell in row.strip("|").split("|"))
        declared = re.findall(r"`([^`]+)`", types)[0].replace("DECIMAL(p,s)", "DECIMAL(5,2)")
        found += [(declared, example) for example in re.findall(r"`([^`]*)`", nulls)]
        # The examples the docs give in words: an overflow, too many integer digits.
        if "an overflow" in nulls:
            found.append((declared, "128"))
        if "integer digits" in nulls:
            found.append((declared, "1234.5"))
    return found


DOCUMENTED = _documented_nulls()


def test_the_docs_table_is_read() -> None:
    kinds = {declared for declared, _ in DOCUMENTED}
    assert {"TINYINT", "DECIMAL(5,2)", "FLOAT", "DATE", "TIMESTAMP", "BOOLEAN"} <= kinds
    assert len(DOCUMENTED) >= 25 and ("TINYINT", "128") in DOCUMENTED, DOCUMENTED


def test_every_documented_null_is_reported_on_its_line_and_column(tmp_path: Path) -> None:
    types = {f"c{i}": declared for i, declared in enumerate(sorted({d for d, _ in DOCUMENTED}))}
    column = {declared: name for name, declared in types.items()}
    names = ["k", *types]
    lines = [",".join(names)]
    expected = set()
    for number, (declared, example) in enumerate(DOCUMENTED, start=2):
        fields = [str(number)] + [""] * len(types)
        fields[names.index(column[declared])] = example
        lines.append(",".join(fields))
        expected.add((number, "null", column[declared]))
    lines.append("99," + ",".join("" for _ in types))  # empty fields: NULL by design, no finding
    path = tmp_path / "values.csv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    scan = _scan(path, types)
    assert _found(scan) == expected
    assert scan.rows == len(DOCUMENTED) + 1
    _agrees_with_duckdb(path, types, scan)


def test_every_line_rule_is_reported_on_its_line(tmp_path: Path) -> None:
    lines = [
        (b"k,a,n", None),  # line 1: the header
        (b"1,x,5", None),
        (b"2,short", ("dropped", "fewer fields than the header's 3")),
        (b"3,x,5,extra", ("ignored", "more fields than the header's 3")),
        (b"", None),  # an empty line: no row, no finding
        (b"4,caf\xff,5", ("dropped", "not valid UTF-8")),
        (b"5,\xed\xa0\x80,5", ("dropped", "not valid UTF-8")),  # an encoded surrogate
        (b"k,a,n", None),  # the header again: no row, counted
        ("6,x,5\uffff,tail".encode(), ("ignored", "text after a U+FFFF character")),
        (b"7,x," + b"9" * MAX_LINE_BYTES, ("dropped", f"longer than {MAX_LINE_BYTES:,} bytes")),
        (b'8,"a,b",5', ("null", "not an integer")),  # no quoting: n is 'b"', 5 is beyond
        (b"9,x,12.7", ("null", "not an integer")),
        (b"10,x,99999999999", ("null", "out of the range of INTEGER")),
    ]
    ends = [b"\n", b"\r\n", b"\r"]  # every line end counts once, CRLF included
    data = b"".join(line + ends[i % 3] for i, (line, _) in enumerate(lines))
    path = tmp_path / "lines.csv"
    path.write_bytes(data)
    scan = _scan(path, {"n": "INTEGER"})
    got = {f.line: (f.what, f.reason) for f in scan.listed if f.line != 11}
    want = {n: finding for n, (_, finding) in enumerate(lines, start=1) if finding is not None}
    assert set(got) | {11} == set(want)
    for number, (what, reason) in got.items():
        assert what == want[number][0] and reason.startswith(want[number][1]), number
    assert {(f.what, f.column) for f in scan.listed if f.line == 11} == {
        ("null", "n"),
        ("ignored", None),
    }
    assert (scan.lines, scan.empty, scan.headers) == (len(lines), 1, 1)
    assert scan.rows == 6  # lines 2, 4, 9, 11, 12 and 13
    _agrees_with_duckdb(path, {"n": "INTEGER"}, scan)


def test_a_column_is_named_and_no_value_is(tmp_path: Path) -> None:
    path = tmp_path / "secret.csv"
    path.write_text("k,n\n1,secret-value-7\n", encoding="utf-8")
    scan = _scan(path, {"n": "INTEGER"})
    (finding,) = scan.listed
    assert (finding.line, finding.column) == (2, "n")
    assert "secret" not in finding.reason and "7" not in finding.reason


# -- generated files: the scan against DuckDB's view ------------------------------------------

TYPES = {"i": "SMALLINT", "d": "DATE", "b": "BOOLEAN", "s": "DECIMAL(3,1)", "f": "FLOAT"}
COLUMNS = ["k", *TYPES]
_PIECES = st.sampled_from(
    [
        *[b"a", b"1", b"-5", b"40000", b"2024-02-30", b"2024-01-05", b"1.5", b"99.95", b"1e39"],
        *[b"t", b"yes", b"inf", b"-nan", b",", b",", b",", b",", b" ", b"\t", b"\r", b"\n"],
        *[b"\r\n", b"\x00", b"\xff", b"\xc3\xa9", b"\xed\xa0\x80", b"\xef\xbb\xbf"],
        *[b"\xef\xbf\xbf", b'"', b"k,i,d,b,s,f", b"12:00:00", b"1,2024-01-05,t,1.5,2"],
    ]
)

# Whole lines, each field drawn for its column, on its type's edges: the fast path's safe forms
# end where these begin (a line of mostly clean fields reaches the fast path).
_EDGES = {
    "i": ["1", " 5 ", "\t7", "+1", "32767", "-32768", "32768", "40000", "099999", "x"],
    "d": ["2024-02-28", "2024-02-29", "2023-02-29", "2024-02-30", "2024-12-31", "2024-1-5"],
    "b": ["t", "F", "0", "true", "yes", ""],
    "s": ["99.9", "99.94", "99.95", "-99.96", ".05", "5.", "9", "100", "1e1", " 1.5"],
    "f": ["1e38", "3.4e38", "3.5e38", "1e5", "1234567890123456", "inf", "-nan", "1.5e-3"],
}
_ROW = st.tuples(
    st.integers(0, 9).map(str), *(st.sampled_from(values) for values in _EDGES.values())
).map(",".join)
_ROWS = st.lists(_ROW, max_size=60).map(lambda rows: "\n".join(rows).encode("utf-8"))


def _agrees_with_duckdb(path: Path, types: dict[str, str], scan: CsvScan) -> None:
    """DuckDB's view reads ``scan.rows`` rows, and NULL from non-blank text exactly as often,
    column by column, as the scan reports it."""
    typed = DuckDBEngine(_policy(path, types), salt=1)
    text = DuckDBEngine(_policy(path, {}), salt=1)
    try:
        columns = list(typed.catalog["t"])
        query = "SELECT " + ", ".join(f'"{c}"' for c in columns) + " FROM t"
        values, raw = typed.run(query)[1], text.run(query)[1]
    finally:
        typed.close()
        text.close()
    assert len(values) == len(raw) == scan.rows
    for j, column in enumerate(columns):
        nulls = sum(
            1
            for v, r in zip(values, raw, strict=True)
            if v[j] is None and r[j] is not None and r[j].strip(" \t")
        )
        reported = sum(
            n for (what, c, _), n in scan.counts.items() if what == "null" and c == column
        )
        assert reported == nulls, column


@SETTINGS
@given(body=st.one_of(st.lists(_PIECES, max_size=400).map(b"".join), _ROWS))
def test_generated_files_are_reported_as_duckdb_reads_them(
    tmp_path_factory: pytest.TempPathFactory, body: bytes
) -> None:
    path = tmp_path_factory.mktemp("gen") / "t.csv"
    path.write_bytes(b"k,i,d,b,s,f\n" + body)
    _agrees_with_duckdb(path, TYPES, _scan(path, TYPES))


def _same(one: CsvScan, other: CsvScan) -> None:
    assert (one.lines, one.rows, one.empty, one.headers) == (
        other.lines,
        other.rows,
        other.empty,
        other.headers,
    )
    assert one.counts == other.counts and one.listed == other.listed


@settings(max_examples=examples(300), deadline=None)
@given(
    body=st.one_of(st.lists(_PIECES, max_size=200).map(b"".join), _ROWS),
    block=st.integers(1, 64),
)
def test_the_fast_path_and_block_boundaries_change_nothing(
    tmp_path_factory: pytest.TempPathFactory, body: bytes, block: int
) -> None:
    path = tmp_path_factory.mktemp("fast") / "t.csv"
    path.write_bytes(b"k,i,d,b,s,f\r\n" + body)
    whole = _scan(path, TYPES, fast=False)
    _same(_scan(path, TYPES), whole)
    with pytest.MonkeyPatch.context() as patch:  # lines and CRLFs cut at every boundary
        patch.setattr(csv_lines, "BLOCK_BYTES", block)
        _same(_scan(path, TYPES), whole)


def test_a_line_past_the_readers_cap_is_dropped_without_being_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(csv_lines, "READER_LINE_BYTES", 50)
    monkeypatch.setattr(csv_lines, "BLOCK_BYTES", 16)
    path = tmp_path / "long.csv"
    long = b"2," + b"x" * 500
    path.write_bytes(b"k,a\n1,x\r" + long + b"\r\n3,y\n" + long)  # one in the middle, one last
    scan = _scan(path, {})
    assert [(f.line, f.what) for f in scan.listed] == [(3, "dropped"), (5, "dropped")]
    assert scan.lines == 5 and scan.rows == 2
    assert all("longer than 50 bytes" in f.reason for f in scan.listed)


def test_a_delimiter_other_than_a_comma(tmp_path: Path) -> None:
    path = tmp_path / "tabs.csv"
    path.write_text("k\tn\n1\t5\n2\tfive\n3\n", encoding="utf-8")
    policy = _policy(path, {"n": "INTEGER"}, delimiter="\t")
    header, names, kinds = csv_columns(policy, "t", path)
    scan = scan_csv(path, "\t", header, names, kinds)
    assert _found(scan) == {(3, "null", "n"), (4, "dropped", None)}
    assert CUT not in header


_KINDS = [
    *["TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT"],
    *["UINTEGER", "UBIGINT", "UHUGEINT", "FLOAT", "DOUBLE", "DATE", "TIMESTAMP", "BOOLEAN"],
    *["DECIMAL(1,0)", "DECIMAL(2,2)", "DECIMAL(3,1)", "DECIMAL(5,2)", "DECIMAL(38,10)"],
]


@settings(max_examples=examples(3000), deadline=None)
@given(
    declared=st.sampled_from(_KINDS),
    text=st.one_of(
        st.text(alphabet="0123456789+-.eE :T\t", max_size=45),
        st.integers(-(2**130), 2**130).map(str),
        st.tuples(st.integers(0, 9999), st.integers(0, 13), st.integers(0, 32)).map(
            lambda d: f"{d[0]:04d}-{d[1]:02d}-{d[2]:02d}"
        ),
    ),
)
def test_the_fast_path_passes_only_values_read_as_written(declared: str, text: str) -> None:
    kind = csv_type(declared)
    assert kind is not None
    clean = csv_lines._clean_line(",", ["v"], {"v": kind})
    if clean.fullmatch(text) and text.strip(" \t"):
        assert csv_lines._read(text, kind) == ("", ""), (declared, text)


_DUCK = duckdb.connect(":memory:")
_TEXTS = st.one_of(
    st.text(alphabet="0123456789+-.eE :TtrufalsnNiI\t", max_size=45),
    st.integers(-(2**130), 2**130).map(str),
    st.decimals(allow_nan=False, allow_infinity=False, places=12).map(str),
    st.tuples(st.integers(0, 9999), st.integers(0, 13), st.integers(0, 32)).map(
        lambda d: f"{d[0]:04d}-{d[1]:02d}-{d[2]:02d}"
    ),
)


@settings(max_examples=examples(800), deadline=None)
@given(declared=st.sampled_from(_KINDS), text=_TEXTS)
def test_each_field_is_reported_null_exactly_when_duckdb_reads_null(
    declared: str, text: str
) -> None:
    kind = csv_type(declared)
    assert kind is not None
    assume(text.strip(" \t"))  # a blank field is NULL by design: no finding
    value = _DUCK.execute(f"SELECT {value_sql('duckdb', '$v', kind)}", {"v": text}).fetchone()
    what, _ = csv_lines._read(text, kind)
    assert (what == "null") == (value is None or value[0] is None), (declared, text, value)
    if what == "changed":  # read as infinity
        assert value is not None and value[0] in (float("inf"), float("-inf"))
