"""How the text of a CSV file becomes rows and typed values: written once, for both engines.

DuckDB and Spark parse text differently: DuckDB casts ``'12.7'`` to the integer 13, ``'0x1F'`` to
31 and ``'1_000'`` to 1000 where Spark gives NULL; Spark reads the Arabic-Indic digits ``'١٢'``
as the decimal 12, ``'1.5d'`` and ``'0x1p3'`` as doubles and ``' 2024-01-05 '`` as a timestamp,
DuckDB not; DuckDB reads ``'2024-01-05 24:00:00'`` as the next midnight, Spark as NULL. Their
CSV readers split lines differently too. dpsql promises the same exact totals on both engines, so
neither engine's reader nor its casts decide alone: each engine reads the file as raw lines and
applies the SQL built here, the same rules in each engine's spelling.

**Lines** (``line_conditions``, ``split_fields``): a line ends at a newline, a carriage return or
both; an empty line is no row; a line that is not valid UTF-8 or longer than ``MAX_LINE_BYTES``
is dropped, and so is a line that repeats the header line. Text from a U+FFFF (a Unicode
noncharacter, the "delimiter" of the raw-line read) to the end of its line is ignored. A line is
split on the delimiter, without quoting; one with fewer fields than the header is dropped, fields
beyond the header's are ignored, an empty field is NULL. Each rule reads one line only.

**Values** (``value_sql``): a field of a typed column is trimmed of spaces and tabs (only those)
and cast only when the rest matches the type's grammar in full (``GRAMMARS``: ASCII digits, no
exponent in integers and decimals, no time zone, ...); anything else is NULL. Each grammar is
unambiguous and accepts only text that both engines' casts read to the same value, so the cast
never decides what parses; the differential tests (``tests/engine/test_spark_csv.py``) check it,
value for value. Text columns are kept as read, untrimmed. A type without a grammar (``csv_type``
gives None: TIME, INTERVAL, UUID, BLOB, lists, ...) is refused at open on both engines.

Regular expressions are ASCII classes only, anchored with ``^`` and ``\\z`` (Java's ``$`` also
matches before a final line terminator such as U+2028), and written without quotes, so that the
same pattern means the same on RE2 (DuckDB) and java.util.regex (Spark) and is a raw literal
``r'...'`` in Spark SQL, which no parser setting reinterprets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sqlglot import exp

__all__ = [
    "BOM",
    "CUT",
    "GRAMMARS",
    "MAX_LINE_BYTES",
    "READER_BUFFER_BYTES",
    "READER_LINE_BYTES",
    "TRIMMED",
    "CsvType",
    "csv_type",
    "field_count",
    "field_sql",
    "line_conditions",
    "spark_string",
    "split_fields",
    "value_sql",
]

Engine = Literal["duckdb", "spark"]

# A line longer than this (in bytes, without its end) is dropped on both engines.
MAX_LINE_BYTES = 2_000_000
# The readers' own cap, far above MAX_LINE_BYTES so that the rule above decides; it bounds the
# memory one line takes (DuckDB's max_line_size; Hadoop's maximum line length on Spark).
READER_LINE_BYTES = 16_000_000
READER_BUFFER_BYTES = 32_000_000  # DuckDB's buffer must exceed its line cap (its default size)
CUT = "\uffff"  # a noncharacter: the raw-line read's delimiter; text after it is ignored
BOM = "\ufeff"
TRIMMED = " \t"  # what a typed field is trimmed of: spaces and tabs, nothing else

_INTEGER = "[+-]?[0-9]+"
_DECIMAL = "[+-]?(?:[0-9]+(?:[.][0-9]*)?|[.][0-9]+)"
_FLOAT = (
    f"{_DECIMAL}(?:[eE][+-]?[0-9]+)?"
    "|[+-]?[iI][nN][fF](?:[iI][nN][iI][tT][yY])?"  # inf, infinity, any case, a sign
    "|[nN][aA][nN]"  # NaN, any case, no sign (engines differ on -nan)
)
_YEAR = "(?:000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})"  # 0001-9999: Python holds them
_DATE = f"{_YEAR}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])"
_TIME = "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:[.][0-9]{1,6})?"  # no 24:00, no leap second
_TIMESTAMP = f"{_DATE}(?:[ T]{_TIME})?"
_TRUE = "[tT](?:[rR][uU][eE])?|1"
_FALSE = "[fF](?:[aA][lL][sS][eE])?|0"

# family -> the grammar of its text (no capturing groups: value_sql adds the one it extracts).
GRAMMARS: dict[str, str] = {
    "integer": _INTEGER,
    "decimal": _DECIMAL,
    "float": _FLOAT,
    "date": _DATE,
    "timestamp": _TIMESTAMP,
    "true": _TRUE,
    "false": _FALSE,
}


@dataclass(frozen=True)
class CsvType:
    """A declared type a CSV column can be read as: its family (which grammar), its name in
    DuckDB and in Spark (None when Spark has no type of exactly these values)."""

    family: Literal["text", "boolean", "integer", "decimal", "float", "date", "timestamp"]
    duckdb: str
    spark: str | None


# sqlglot's name of a parsed type -> its reading
_SIMPLE: dict[str, CsvType] = {
    "TEXT": CsvType("text", "VARCHAR", "STRING"),
    "VARCHAR": CsvType("text", "VARCHAR", "STRING"),
    "CHAR": CsvType("text", "VARCHAR", "STRING"),
    "BOOLEAN": CsvType("boolean", "BOOLEAN", "BOOLEAN"),
    "TINYINT": CsvType("integer", "TINYINT", "TINYINT"),
    "SMALLINT": CsvType("integer", "SMALLINT", "SMALLINT"),
    "INT": CsvType("integer", "INTEGER", "INT"),
    "BIGINT": CsvType("integer", "BIGINT", "BIGINT"),
    # DuckDB's 128-bit and unsigned integers: the same grammar, no Spark type of their range
    "INT128": CsvType("integer", "HUGEINT", None),
    "UTINYINT": CsvType("integer", "UTINYINT", None),
    "USMALLINT": CsvType("integer", "USMALLINT", None),
    "UINT": CsvType("integer", "UINTEGER", None),
    "UBIGINT": CsvType("integer", "UBIGINT", None),
    "UINT128": CsvType("integer", "UHUGEINT", None),
    "FLOAT": CsvType("float", "FLOAT", "FLOAT"),
    "DOUBLE": CsvType("float", "DOUBLE", "DOUBLE"),
    "DATE": CsvType("date", "DATE", "DATE"),
    # DuckDB's TIMESTAMP is a local date and time in microseconds: Spark's TIMESTAMP_NTZ
    "TIMESTAMPNTZ": CsvType("timestamp", "TIMESTAMP", "TIMESTAMP_NTZ"),
    "TIMESTAMP": CsvType("timestamp", "TIMESTAMP", "TIMESTAMP_NTZ"),
}
_MAX_PRECISION = 38  # DuckDB's and Spark's widest DECIMAL


def csv_type(declared: str) -> CsvType | None:
    """The CSV reading of a declared type (DuckDB's spelling, as the policy keeps it), or None
    when it has no grammar here: such a column is refused, on both engines alike."""
    try:
        parsed = exp.DataType.build(declared, dialect="duckdb")
    except Exception:  # the policy validated it; anything unusual has no grammar
        return None
    args = [a.name for a in parsed.expressions]
    if parsed.this == exp.DataType.Type.DECIMAL:
        if not 1 <= len(args) <= 2 or not all(a.isdigit() for a in args):
            return None
        precision, scale = int(args[0]), int(args[1]) if len(args) == 2 else 0
        if not 1 <= precision <= _MAX_PRECISION or scale > precision:
            return None
        name = f"DECIMAL({precision},{scale})"
        return CsvType("decimal", name, name)
    kind = _SIMPLE.get(parsed.this.name)
    if kind is None or (args and kind.family != "text"):  # TIMESTAMP(3): another type
        return None
    return kind


def spark_string(text: str) -> str:
    """A Spark SQL string of any text. Spark's spelling of a literal depends on a parser setting
    for backslashes, so the text goes as hex-encoded UTF-8, which no setting reinterprets."""
    return f"decode(unhex('{text.encode('utf-8').hex()}'), 'UTF-8')"


def _string(engine: Engine, text: str) -> str:
    """A string literal of any text (a header line, a delimiter) in the engine's SQL."""
    return "'" + text.replace("'", "''") + "'" if engine == "duckdb" else spark_string(text)


def _pattern(engine: Engine, pattern: str) -> str:
    """A regular expression as a literal: verbatim for DuckDB, raw (``r'...'``) for Spark."""
    if "'" in pattern:  # the patterns are this module's and the delimiter, never a quote
        raise ValueError("a pattern with a quote")
    return f"'{pattern}'" if engine == "duckdb" else f"r'{pattern}'"


def _matches(engine: Engine, value: str, pattern: str) -> str:
    """Whether the whole of ``value`` matches ``pattern``."""
    anchored = _pattern(engine, f"^(?:{pattern})\\z")
    if engine == "duckdb":
        return f"regexp_matches({value}, {anchored})"
    return f"({value} RLIKE {anchored})"


def _padded(pattern: str) -> str:
    """A grammar with any spaces and tabs around it."""
    return "[ \\t]*(?:" + pattern + ")[ \\t]*"


def _core(engine: Engine, value: str, pattern: str) -> str:
    """``value`` without its leading and trailing spaces and tabs when the rest matches
    ``pattern`` in full; '' otherwise. Each grammar starts and ends with no space or tab, so
    what is extracted does not depend on how a regex engine resolves ambiguity."""
    padded = _pattern(engine, f"^[ \\t]*({pattern})[ \\t]*\\z")
    return f"regexp_extract({value}, {padded}, 1)"


def value_sql(engine: Engine, field: str, kind: CsvType | None) -> str:
    """The SQL of a column's value from its field's text (``field``, NULL when empty): the text
    itself for a text column, else the trimmed text cast when it matches the type's grammar, NULL
    otherwise. Casting never fails (TRY_CAST), and only grammatical text reaches the cast."""
    if kind is None or kind.family == "text":
        return field  # kept as read: not trimmed, empty already NULL
    if kind.family == "boolean":
        # true/t/1 and false/f/0 in any case, mapped here: no engine's own boolean spellings
        truthy = _matches(engine, field, _padded(GRAMMARS["true"]))
        falsy = _matches(engine, field, _padded(GRAMMARS["false"]))
        return f"CASE WHEN {truthy} THEN true WHEN {falsy} THEN false END"
    target = kind.duckdb if engine == "duckdb" else kind.spark
    if target is None:  # the Spark engine refuses such a type at open
        raise ValueError(f"{kind.duckdb} has no Spark type")
    grammar = GRAMMARS[kind.family]
    cast = "TRY_CAST" if engine == "duckdb" else "try_cast"
    # Out of range (an integer, a decimal's digits after rounding half away from zero) is NULL
    # on both; a float beyond the range is ±Infinity on both. Text that matches untrimmed is
    # its own core: one full match instead of an extraction, for the common case (a fifth of
    # the grammar's time).
    return (
        f"CASE WHEN {_matches(engine, field, grammar)} THEN {cast}({field} AS {target}) "
        f"ELSE {cast}(nullif({_core(engine, field, grammar)}, '') AS {target}) END"
    )


def line_conditions(engine: Engine, line: str, header: str) -> list[str]:
    """The conditions a line (``line``: its text up to a U+FFFF) must meet to be a row: not
    empty, at most MAX_LINE_BYTES, not the header line again (with or without a byte order
    mark). On DuckDB the reader has already dropped the lines that are not UTF-8 and reads an
    empty line as NULL; on Spark these are the conditions' work."""
    # The header by content, not position: Spark cannot tell a file's first line from another
    # (a repeat is no row on either engine, a rule of the line alone).
    repeated = [f"{line} <> {_string(engine, h)}" for h in (header, BOM + header)]
    if engine == "duckdb":
        return [
            f"{line} IS NOT NULL",  # an empty line: no row, whatever surrounds it
            f"strlen({line}) <= {MAX_LINE_BYTES}",  # strlen counts bytes, as Spark's below
            *repeated,
        ]
    return [
        f"{line} <> ''",  # as DuckDB's NULL: an empty line is no row
        f"is_valid_utf8({line})",  # DuckDB's reader drops such a line; Spark keeps the bytes
        f"octet_length({line}) <= {MAX_LINE_BYTES}",
        *repeated,
    ]


def _java_literal(delimiter: str) -> str:
    """A regular expression matching exactly ``delimiter`` in java.util.regex: an ASCII
    punctuation or space character escaped with a backslash, any other character itself."""
    if delimiter.isascii() and not delimiter.isalnum():
        return "\\" + delimiter
    return delimiter


def split_fields(engine: Engine, line: str, delimiter: str) -> str:
    """The line's fields, as a list, split on the delimiter (a literal, never a pattern)."""
    if engine == "duckdb":
        return f"string_split({line}, {_string(engine, delimiter)})"
    return f"split({line}, {_pattern(engine, _java_literal(delimiter))}, -1)"


def field_count(engine: Engine, fields: str) -> str:
    """How many fields the list holds (a line with fewer than the header's is no row)."""
    return f"len({fields})" if engine == "duckdb" else f"size({fields})"


def field_sql(engine: Engine, fields: str, index: int) -> str:
    """Field ``index`` (1-based) of the list, NULL when empty."""
    if engine == "duckdb":
        return f"nullif({fields}[{index}], '')"
    return f"nullif(try_element_at({fields}, {index}), '')"
