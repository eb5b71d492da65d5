"""A CSV file gives the same rows on DuckDB and on Spark, value for value (``csv_text``).

Each test writes a CSV, opens a ``DuckDBEngine`` and a ``SparkEngine`` on the same policy and
runs ``SELECT <every column> FROM t`` through each engine's own ``run`` (no privacy layer: the
rows the bounded queries read). Values: a hand-written list of hostile texts (what the two
engines' casts read differently: '12.7' as an integer, '1_000', Arabic-Indic digits, '-nan',
'24:00:00', year 0, ...) in every declared type, and generated texts. Lines: a hand-written
file of every line rule, and generated files of hostile bytes, read in tiny splits on Spark,
both against a model of the rules.

One local Spark serves the run (``spark_fixtures.spark``); each engine has its own session on it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from spark_fixtures import SOCKET_WARNINGS, spark  # noqa: F401  (the session-scoped fixture)

from dpsql.engine.csv_text import BOM, CUT, MAX_LINE_BYTES
from dpsql.engine.duckdb.engine import DuckDBEngine
from dpsql.engine.spark.engine import SparkEngine
from dpsql.errors import PolicyError
from dpsql.policy import Policy, load_policy

pytestmark = [pytest.mark.spark, *SOCKET_WARNINGS]

# One column of each declared type the grammars cover (and an undeclared one: text).
TYPES = {
    "i": "BIGINT",
    "n": "INTEGER",
    "s": "SMALLINT",
    "y": "TINYINT",
    "d": "DECIMAL(10,2)",
    "w": "DECIMAL(38,10)",
    "z": "DECIMAL(5,0)",
    "f": "FLOAT",
    "x": "DOUBLE",
    "dt": "DATE",
    "ts": "TIMESTAMP",
    "b": "BOOLEAN",
    "v": "VARCHAR",
}
COLUMNS = ["k", *TYPES]  # k: the row's number (text), to name a differing value
# Each example opens both engines (half a second of Spark): few examples, each a file of many
# rows or lines.
SETTINGS = settings(
    max_examples=examples(12),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Texts the engines' own casts read differently, or that sit on a grammar's edge.
HOSTILE = [
    *["12", " 12 ", "\t12\t", "+12", "-0", "+0", "007", "0" * 60 + "12", "12a", "1 2", "--1"],
    *["12.7", "12.5", "-12.5", "1e3", "1E3", "0x1F", "1_000", ".5", "5.", "-.5", "+.5", "."],
    *["١٢", "１２", "\u00a012", "12\u00a0", "\u300012", "12\u2028", "12\u0085", "12\x00"],
    *["127", "128", "-128", "-129", "32767", "32768", "2147483647", "2147483648"],
    *["9223372036854775807", "9223372036854775808", "-9223372036854775809", "1" * 40],
    *["1.005", "1.015", "-1.005", "0.005", "-0.005", "1.0049999", "99999999.99", "99999999.995"],
    *["100000000", "12.50", "12.500000000000000000000000000000000000000000001", "0.0049"],
    *["1.23456789012345678901234567890123456789", "0" * 45 + "1.5", "0." + "0" * 45 + "1"],
    *["99999.5", "99999.4999", "1234567890123456789012345678.1234567895", "9" * 38, "9" * 39],
    *["NaN", "nan", "NAN", "-nan", "+nan", "inf", "-inf", "+inf", "INF", "Infinity"],
    *["-Infinity", "+infinity", "iNfInItY", "infinit", "1.5e308", "1e309", "-1e309", "1e-400"],
    *["4.9e-324", "1e99999999999999", "1.5d", "1.5f", "0x1p3", "1e", "1e+", ".e1", "1.e1"],
    *["1.0000000596046447753906250000001", "1.000000059604644775390625", "3.4028235e38"],
    *["3.4028236e38", "1.4e-45", "7.006492321624085354618e-46", "0." + "0" * 400 + "1"],
    *["true", "false", "TRUE", "False", "tRuE", "t", "f", "T", "F", "1", "0", "yes", "no"],
    *["y", "n", "on", "off", "truee", " true ", "\ttrue", "ｔrue", "tru\u0435"],
    *["2024-01-05", "2024-1-5", "2024-02-30", "2023-02-29", "2024-02-29", "2024-13-01"],
    *["0000-01-01", "0001-01-01", "-0001-01-01", "9999-12-31", "10000-01-01", "+2024-01-05"],
    *["20240105", "2024/01/05", " 2024-01-05 ", "1500-03-01", "1582-10-10", "٢٠٢٤-01-05"],
    *["2024-01-05 10:00:00", "2024-01-05T10:11:12", "2024-01-05 10:11:12.1234567"],
    *["2024-01-05 10:11:12.123456", "2024-01-05 10:11:12.5", "2024-01-05 10:11:12."],
    *["2024-01-05 25:00:00", "2024-01-05 24:00:00", "2024-01-05 23:59:60", "2024-01-05 1:02:03"],
    *["2024-01-05 10:11", "2024-01-05 10:11:12+02:00", "2024-01-05 10:11:12 UTC", "2024-01-05Z"],
    *["2024-01-05T10:11:12Z", "2024-01-05  10:11:12", "0000-01-01 00:00:00", "2024-01-05 "],
    *["9999-12-31 23:59:59.999999", "0001-01-01 00:00:00", "12,5", "12.5.1", "1-", "\\N"],
    *["NULL", "'12'", '"12"', "\u200b12", "12\ufeff", "\ufeff12"],
]
# What a few of them read as, on both engines (the grammars' decisions, not the casts').
EXPECTED = {
    ("12.7", "n"): None,
    ("1e3", "i"): None,
    ("0x1F", "i"): None,
    ("1_000", "x"): None,
    ("١٢", "d"): None,
    (" 12 ", "n"): 12,
    ("\u00a012", "n"): None,
    ("1.005", "d"): "1.01",
    ("99999999.995", "d"): None,
    ("-nan", "x"): None,
    ("1e309", "x"): "inf",
    ("1.5d", "x"): None,
    ("t", "b"): True,
    ("yes", "b"): None,
    ("2024-1-5", "dt"): None,
    ("0000-01-01", "dt"): None,
    ("2024-01-05 24:00:00", "ts"): None,
    ("2024-01-05 10:11:12.1234567", "ts"): None,
    ("2024-01-05 10:11:12+02:00", "ts"): None,
    (" 12 ", "v"): " 12 ",
}


def _policy(path: Path, on_spark: bool, types: dict[str, str], delimiter: str = ",") -> Policy:
    spec: dict[str, Any] = {
        "dataset": {"id": "csv"},
        "data": {"tables": {"t": str(path)}, "csv_delimiter": delimiter},
        "budget": {"diagnose": False, "epsilon": "1"},
        "tables": {
            "t": {"privacy_unit": "k", "columns": {c: {"type": t} for c, t in types.items()}}
        },
    }
    if on_spark:
        spec["engine"] = {"name": "spark", "master": "local[2]"}
    return load_policy(spec)


def _both(
    path: Path, types: dict[str, str], delimiter: str = ",", split_bytes: int | None = None
) -> Iterator[tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]]:
    """Each engine's rows of the table (and the engines' catalogs must agree)."""
    duck = DuckDBEngine(_policy(path, False, types, delimiter), salt=1)
    on_spark = SparkEngine(_policy(path, True, types, delimiter), salt=1)
    try:
        assert on_spark.catalog == duck.catalog  # the same types, so the same query plans
        if split_bytes is not None:  # tiny splits: lines cut at split boundaries, CR before LF
            on_spark._session.conf.set("spark.sql.files.maxPartitionBytes", str(split_bytes))
        # The columns named, in the file's order: the lowering expands * in sorted order.
        listed = ", ".join(f'"{c}"' for c in duck.catalog["t"])
        query = f"SELECT {listed} FROM t"
        yield duck.run(query)[1], on_spark.run(query)[1]
    finally:
        duck.close()
        on_spark.close()


def _same(path: Path, types: dict[str, str], **kwargs: Any) -> list[tuple[Any, ...]]:
    """The table's rows, after checking that both engines read exactly them."""
    for duck_rows, spark_rows in _both(path, types, **kwargs):
        assert _key(spark_rows) == _key(duck_rows)
        return duck_rows
    raise AssertionError("no rows")


def _key(rows: list[tuple[Any, ...]]) -> list[str]:
    """Rows as sorted reprs: the same value and the same type (-0.0, NaN and scales included)."""
    return sorted(repr(row) for row in rows)


def _write(path: Path, rows: list[list[str]], delimiter: str = "|") -> Path:
    lines = [delimiter.join(COLUMNS)] + [
        delimiter.join([str(i), *row]) for i, row in enumerate(rows)
    ]
    path.write_bytes(("\n".join(lines) + "\n").encode("utf-8"))
    return path


def test_hostile_values_read_the_same_in_every_type(tmp_path: Path, spark: Any) -> None:  # noqa: F811
    assert not any("|" in v or "\r" in v or "\n" in v for v in HOSTILE)
    path = _write(tmp_path / "hostile.csv", [[v] * len(TYPES) for v in HOSTILE])
    for duck_rows, spark_rows in _both(path, TYPES, delimiter="|"):
        assert len(duck_rows) == len(HOSTILE)
        duck = {row[0]: row for row in duck_rows}
        for row in spark_rows:  # value for value, naming the text and the type that differ
            for name, got, want in zip(COLUMNS, row, duck[row[0]], strict=True):
                text = HOSTILE[int(row[0])]
                assert repr(got) == repr(want), (text, TYPES.get(name))
        for (text, name), want in EXPECTED.items():
            got = duck[str(HOSTILE.index(text))][COLUMNS.index(name)]
            shown = str(got) if isinstance(want, str) else got
            assert shown == want, (text, name)


# Text near each grammar: digits (some not ASCII), signs, points, exponents, the special words
# in any case, dates and times of any width, and padding of spaces, tabs and other blanks.
_DIGITS = st.text(st.sampled_from("0123456789"), min_size=1, max_size=25) | st.text(
    st.sampled_from("0123456789١٢３"), min_size=1, max_size=4
)
_SIGN = st.sampled_from(["", "", "+", "-"])
_NUMBER = st.builds(
    lambda s, a, p, b, e: s + a + p + b + e,
    _SIGN,
    _DIGITS | st.just(""),
    st.sampled_from(["", ".", "."]),
    _DIGITS | st.just(""),
    st.sampled_from(["", "e", "E-", "e+"]).flatmap(
        lambda e: st.just("") if not e else _DIGITS.map(lambda d: e + d[:4])
    ),
)
_WORD = st.builds(
    lambda s, w, cases: s + "".join(c.upper() if u else c for c, u in zip(w, cases, strict=False)),
    _SIGN,
    st.sampled_from(["nan", "inf", "infinity", "true", "false", "t", "f", "yes"]),
    st.lists(st.booleans(), min_size=8, max_size=8),
)
_TWO = st.integers(0, 99).map(lambda n: f"{n:02d}") | st.integers(0, 9).map(str)
_DAY = st.builds(
    lambda y, m, d: f"{y}-{m}-{d}",
    st.integers(0, 10999).map(lambda n: f"{n:04d}"),
    _TWO,
    _TWO,
)
_STAMP = st.builds(
    lambda day, sep, h, m, s, frac: f"{day}{sep}{h}:{m}:{s}{frac}",
    _DAY,
    st.sampled_from([" ", "T", "  "]),
    _TWO,
    _TWO,
    _TWO,
    st.sampled_from(["", "."]).flatmap(lambda p: st.just(p) if not p else _DIGITS.map(p.__add__)),
)
_PAD = st.sampled_from(["", "", "", " ", "\t", "  ", "\u00a0", "\u3000", "\x0b"])
_TEXT = st.one_of(
    st.sampled_from(HOSTILE), _NUMBER, _WORD, _DAY, _STAMP, st.text(max_size=8)
).filter(lambda v: not re.search(f"[|\r\n{CUT}]", v))  # CUT cuts the line: a line rule
VALUE = st.builds(lambda a, v, b: a + v + b, _PAD, _TEXT, _PAD)


@SETTINGS
@given(rows=st.lists(st.lists(VALUE, min_size=len(TYPES), max_size=len(TYPES)), max_size=200))
def test_generated_values_read_the_same(
    tmp_path_factory: pytest.TempPathFactory,
    spark: Any,  # noqa: F811
    rows: list[list[str]],
) -> None:
    path = _write(tmp_path_factory.mktemp("values") / "t.csv", rows)
    assert len(_same(path, TYPES, delimiter="|")) == len(rows)


def _model(data: bytes, delimiter: str, n: int) -> list[tuple[Any, ...]]:
    """The line rules, in Python: what both engines must read from ``data`` (text columns)."""
    first = re.split(rb"[\r\n]", data, maxsplit=1)[0].decode("utf-8-sig")
    rows = []
    for raw in re.split(rb"[\r\n]", data)[1:]:  # every newline and carriage return ends a line
        line = raw.split(CUT.encode("utf-8"))[0]  # text from a U+FFFF on is ignored
        try:
            text = line.decode("utf-8")  # strict: no surrogates, no overlong forms
        except UnicodeDecodeError:
            continue
        if not text or len(line) > MAX_LINE_BYTES or text in (first, BOM + first):
            continue
        fields = text.split(delimiter)
        if len(fields) >= n:
            rows.append(tuple(f or None for f in fields[:n]))
    return rows


def test_the_line_rules(tmp_path: Path, spark: Any) -> None:  # noqa: F811
    long_tail = "x" * (3 * MAX_LINE_BYTES)
    lines = [
        b"\xef\xbb\xbfk,a,b",  # a byte order mark before the header
        b"1,a,b",
        b"2,short",  # too few fields: no row
        b"3,a,b,extra,fields",  # fields beyond the header's are ignored
        b"4,,",  # empty fields are NULL
        b"",  # an empty line: no row
        b"5, a ,\tb\t",  # text is not trimmed
        b"6,caf\xc3\xa9,\xf0\x9f\x98\x80",
        b"7,bad\xff,b",  # not UTF-8: no row
        b"8,\xed\xa0\x80,b",  # an encoded surrogate: no row
        b"9,\xc0\xaf,b",  # an overlong form: no row
        b"10,a\x00b,\x00",  # NUL is a character like any other
        b'11,"a,b"',  # no quoting: three fields
        b"12,'a',#b",
        b"k,a,b",  # the header again: no row
        b"\xef\xbb\xbfk,a,b",
        b" k,a,b",  # not quite the header: a row
        "13,a,b\uffff,x,y".encode(),  # from U+FFFF on, ignored
        "\uffff14,a,b".encode(),
        b"15,a," + b"b" * MAX_LINE_BYTES,  # over the limit: no row
        b"16,a," + b"b" * (MAX_LINE_BYTES - 5),  # exactly at it: a row
        ("17,a,b" + CUT + long_tail).encode(),  # a long tail past U+FFFF: a row
        b"\xef\xbb\xbf18,a,b",  # a byte order mark inside the file is text
    ]
    ends = [b"\n", b"\r\n", b"\r", b"\n\n", b"\r\r\n", b"\n\r"]
    data = b"".join(line + ends[i % len(ends)] for i, line in enumerate(lines)) + b"19,no,end"
    path = tmp_path / "lines.csv"
    path.write_bytes(data)
    rows = _same(path, {})
    assert _key(rows) == _key(_model(data, ",", 3))
    assert {int(row[0].lstrip(BOM)) for row in rows if row[0] != " k"} == (
        set(range(1, 20)) - {2, 7, 8, 9, 14, 15}
    )


_PIECES = st.sampled_from(
    [
        *[b"a", b"1", b",", b",", b" ", b"\t", b"\r", b"\n", b"\r\n", b"\x00", b"\xff"],
        *[b"\xc3\xa9", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe0\x80\x80"],
        *[b"\xef\xbb\xbf", b"\xef\xbf\xbf", b'"', b"'", b"\\", b"#", b"k,a,b"],
        b"\xf0\x9f\x98\x80",
    ]
)


@SETTINGS
@given(body=st.lists(_PIECES, max_size=800).map(b"".join), crlf=st.booleans())
def test_generated_lines_read_the_same(
    tmp_path_factory: pytest.TempPathFactory,
    spark: Any,  # noqa: F811
    body: bytes,
    crlf: bool,
) -> None:
    data = (b"k,a,b\r\n" if crlf else b"k,a,b\n") + body
    path = tmp_path_factory.mktemp("lines") / "t.csv"
    path.write_bytes(data)
    # Spark reads the file in 16-byte splits: lines and CRLFs cut at every boundary.
    assert _key(_same(path, {}, split_bytes=16)) == _key(_model(data, ",", 3))


def test_a_tab_or_a_regex_character_delimits_the_same(tmp_path: Path, spark: Any) -> None:  # noqa: F811
    for delimiter in ("\t", ".", "|", "\\", "§", " ", "x", "+"):
        texts = ["1", "2.5", ".5", "a\\b", "§", "x y", "1+2", ""]
        lines = [delimiter.join(["k", "n", "v"])] + [delimiter.join([t, t, "v"]) for t in texts]
        data = ("\n".join(lines) + "\n").encode()
        path = tmp_path / "d.csv"
        path.write_bytes(data)
        rows = _same(path, {"n": "DOUBLE"}, delimiter=delimiter)
        model = _model(data, delimiter, 3)
        assert sorted(map(repr, (r[0] for r in rows))) == sorted(map(repr, (m[0] for m in model)))


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        ("TIME", r"tables\.t\.columns\.a\.type TIME has no text form"),
        ("INTERVAL", "has no text form"),
        ("UUID", "has no text form"),
        ("BLOB", "has no text form"),
        ("INTEGER[]", "has no text form"),
        ("TIMESTAMPTZ", "has no text form"),
        ("TIMESTAMP_NS", "has no text form"),
        ("DECIMAL(40,2)", "has no text form"),
    ],
)
def test_a_type_without_a_grammar_is_refused_on_both_engines(
    tmp_path: Path,
    spark: Any,  # noqa: F811
    declared: str,
    message: str,
) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(b"k,a\n1,secret-value\n")
    for on_spark in (False, True):
        policy = _policy(path, on_spark, {"a": declared})
        with pytest.raises(PolicyError, match=message) as refused:
            (SparkEngine if on_spark else DuckDBEngine)(policy, salt=1)
        assert "secret" not in str(refused.value)  # the policy's words, never a data value


@pytest.mark.parametrize("declared", ["HUGEINT", "UTINYINT", "UINTEGER", "UBIGINT"])
def test_a_duckdb_only_integer_is_read_on_duckdb_and_refused_on_spark(
    tmp_path: Path,
    spark: Any,  # noqa: F811
    declared: str,
) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(b"k,a\n1, 7 \n2,-1\n3,1e3\n")
    duck = DuckDBEngine(_policy(path, False, {"a": declared}), salt=1)
    assert sorted(duck.run("SELECT k, a FROM t")[1]) == [
        ("1", 7),
        ("2", -1 if declared == "HUGEINT" else None),
        ("3", None),
    ]
    duck.close()
    with pytest.raises(PolicyError, match=rf"columns\.a\.type {declared} has no Spark type"):
        SparkEngine(_policy(path, True, {"a": declared}), salt=1)
