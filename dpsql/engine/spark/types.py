"""The DuckDB types the lowering computes on: their names, Spark's names for them, the type
DuckDB gives mixed values (``unify``) and the integer magnitude each type holds.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from sqlglot import exp

from dpsql.analyze.scope import SIGNED_RANGES
from dpsql.engine.spark.dialect import refuse

# -- types -------------------------------------------------------------------------------------
# The DuckDB type of every lowered expression, as DuckDB names it: what DuckDB computes decides
# how the Spark expression must compute. "NULL" is an untyped NULL, "PARAM" the salt parameter,
# "HASH" a keyed hash, "LIST(T)" and "MAP(K,V)" the quantile machinery's, "?T" a type the
# lowering only passes through (it refuses to compute on it).

INT_RANK = {"TINYINT": 1, "SMALLINT": 2, "INTEGER": 3, "BIGINT": 4, "HUGEINT": 5}
INT_BY_RANK = {rank: name for name, rank in INT_RANK.items()}
INT_RANGE = SIGNED_RANGES
_FLOATS = ("FLOAT", "DOUBLE")
_SPARK_NAMES = {
    "BOOLEAN": "BOOLEAN",
    "TINYINT": "TINYINT",
    "SMALLINT": "SMALLINT",
    "INTEGER": "INT",
    "BIGINT": "BIGINT",
    "HUGEINT": "DECIMAL(38, 0)",  # no 128-bit integer on Spark: exact 38-digit decimals
    "FLOAT": "FLOAT",
    "DOUBLE": "DOUBLE",
    "VARCHAR": "STRING",
    "DATE": "DATE",
    "TIMESTAMP": "TIMESTAMP_NTZ",  # DuckDB's TIMESTAMP has no time zone, like TIMESTAMP_NTZ
}
_TYPE_ALIASES = {
    "INT1": "TINYINT",
    "INT2": "SMALLINT",
    "SHORT": "SMALLINT",
    "INT": "INTEGER",
    "INT4": "INTEGER",
    "SIGNED": "INTEGER",
    "INT8": "BIGINT",
    "LONG": "BIGINT",
    "INT128": "HUGEINT",
    "REAL": "FLOAT",
    "FLOAT4": "FLOAT",
    "FLOAT8": "DOUBLE",
    "TEXT": "VARCHAR",
    "STRING": "VARCHAR",
    "CHAR": "VARCHAR",
    "BPCHAR": "VARCHAR",
    "BOOL": "BOOLEAN",
    "LOGICAL": "BOOLEAN",
    "DATETIME": "TIMESTAMP",
    "TIMESTAMP WITHOUT TIME ZONE": "TIMESTAMP",
}
_DECIMAL = re.compile(r"^(?:DECIMAL|NUMERIC)\s*\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\)$")


def norm_type(text: str) -> str:
    """A DuckDB type name in the lowering's spelling; "?NAME" for one it does not compute on."""
    name = " ".join(text.strip().upper().split())
    if name.startswith("VARCHAR("):
        return "VARCHAR"
    if name in ("DECIMAL", "NUMERIC"):
        return "DECIMAL(18,3)"  # DuckDB's default precision and scale
    match = _DECIMAL.match(name)
    if match:
        p, s = int(match.group(1)), int(match.group(2) or 0)
        return f"DECIMAL({p},{s})"
    name = _TYPE_ALIASES.get(name, name)
    return name if name in _SPARK_NAMES else f"?{name}"


def is_int(t: str) -> bool:
    return t in INT_RANK


def is_float(t: str) -> bool:
    return t in _FLOATS


def is_decimal(t: str) -> bool:
    return t.startswith("DECIMAL(")


def is_num(t: str) -> bool:
    return is_int(t) or is_float(t) or is_decimal(t)


def element_type(t: str) -> str:
    if not t.startswith("LIST(") or not t.endswith(")"):
        raise refuse(f"a list operation on {t}")
    return t[5:-1]


def spark_type(t: str) -> exp.DataType:
    if is_decimal(t):
        return exp.DataType.build(t, dialect="spark")
    if t not in _SPARK_NAMES:
        raise refuse(f"the type {t.lstrip('?')}")
    return exp.DataType.build(_SPARK_NAMES[t], dialect="spark")


def unify(types: Sequence[str], what: str) -> str:
    """The type DuckDB gives a CASE, COALESCE, LEAST, VALUES column or comparison of these
    types; mixed kinds (text with numbers, dates with timestamps) are refused: DuckDB and Spark
    convert them by different rules."""
    known = [t for t in types if t != "NULL"]
    if not known:
        return "NULL"
    if all(t == known[0] for t in known):
        return known[0]
    if all(is_int(t) for t in known):
        return INT_BY_RANK[max(INT_RANK[t] for t in known)]
    if all(is_num(t) for t in known):
        if "DOUBLE" in known or ("FLOAT" in known and any(is_decimal(t) for t in known)):
            return "DOUBLE"
        if "FLOAT" in known:  # a FLOAT with integers stays FLOAT on both engines
            return "FLOAT"
        scale = max(int(t[:-1].split(",")[1]) if is_decimal(t) else 0 for t in known)
        return f"DECIMAL(38,{scale})"
    raise refuse(f"{what} over values of types {', '.join(sorted(set(known)))}")


def type_kind(t: str) -> str:
    """The class of values a comparison may mix: numbers with numbers, text with text, ..."""
    if is_num(t):
        return "number"
    return t


# The integer magnitude each type holds (±2^bits at most) and the largest that cannot overflow
# it on Spark (DECIMAL(38, 0) holds less than DuckDB's HUGEINT: below 10^38).
TYPE_BITS = {"TINYINT": 7, "SMALLINT": 15, "INTEGER": 31, "BIGINT": 63, "HUGEINT": 127}
CAPACITY = {"TINYINT": 6, "SMALLINT": 14, "INTEGER": 30, "BIGINT": 62, "HUGEINT": 126}
