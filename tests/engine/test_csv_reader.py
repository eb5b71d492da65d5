"""CSV tables: no row can make a query fail, nor change another unit's rows (class 3).

DuckDB's reader sniffs types from a sample of rows (100,000 integers and one ``abc`` fail the
query after its charge), raises on malformed rows, and with quoting lets one unbalanced quote
swallow every line after it. dpsql reads every column as text, casts it to the policy's type
with TRY_CAST, and reads one physical line per row without quoting, dropping a malformed line on
its own. These tests insert a unit's hostile lines into the middle of a file and check the
neighbour property of every measurement, with the checker of ``test_neighbours``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_neighbours import _check

from dpsql.errors import PolicyError
from dpsql.policy import Policy, load_policy
from dpsql.session.session import Session

HEADER = b"user_id,region,age,spend,note\n"
REGIONS = ("north", "south", "east")
BASE_LINES = [
    f"{u},{REGIONS[u % 3]},{20 + u % 50},{u % 90}.5,n{u % 4}\n".encode() for u in range(300)
]
QUERIES = (
    "SELECT COUNT(*) FROM visits",
    "SELECT SUM(age), AVG(spend) FROM visits",
    "SELECT region, COUNT(*), SUM(spend) FROM visits GROUP BY region",
    "SELECT COUNT(DISTINCT user_id), MEDIAN(age) FROM visits WHERE note",
    "SELECT note, COUNT(*) FROM visits GROUP BY note",
)
UNIT = b"777777"
HOSTILE = st.sampled_from(
    [
        UNIT + b',"north,30,1.5,a\n',  # an unbalanced quote
        UNIT + b',"no\nrth",30,1.5,a\n',  # a quoted newline
        UNIT + b",north,abc,1e999,\n",  # values that do not parse
        UNIT + b",north,99999999999999999999,nan,x\n",
        UNIT + b",north,30\n",  # too few fields
        UNIT + b",north,30,1.5,a,extra,fields\n",  # too many
        UNIT + b",nor\xffth,30,1.5,a\n",  # invalid UTF-8
        UNIT + b",north,30,1.5,a\x00b\n",
        UNIT + b",south,40,-inf,true\r\n",
        UNIT + b",,,,\n",
        UNIT + b',east,"31",2.5,"q"\n',
        b"\n",
        b"   \n",
        UNIT + b",east,31,2.5,'\n",
    ]
)
# Without quoting, a quoted unit is the text '"777777"', which is no BIGINT: its row belongs to
# the NULL unit, another unit than 777777. It is a neighbour on its own.
QUOTED_UNIT = b'"' + UNIT + b'",east,31,2.5,z\n'
ONE_UNIT = st.one_of(st.lists(HOSTILE, min_size=1, max_size=6), st.just([QUOTED_UNIT]))


def _policy(folder: Path, lines: list[bytes], name: str) -> Policy:
    path = folder / f"{name}.csv"
    path.write_bytes(HEADER + b"".join(lines))
    return load_policy(
        {
            "dataset": {"id": "csv"},
            "data": {"tables": {"visits": str(path)}},
            "budget": {
                "diagnose": False,
                "epsilon": "10000",
                "delta": "0.5",
                "query_epsilon": "1",
                "query_delta": "0.000001",
            },
            "tables": {
                "visits": {
                    "privacy_unit": "user_id",
                    "max_groups_per_unit": 2,
                    "max_rows_per_unit_per_group": 3,
                    "columns": {
                        "user_id": {"type": "BIGINT"},
                        "age": {"type": "INTEGER", "lower": 18, "upper": 90},
                        "spend": {"type": "DOUBLE", "lower": 0, "upper": 200},
                        "region": {"public_values": list(REGIONS)},
                    },
                }
            },
        },
        base_dir=folder,
    )


@settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    hostile=ONE_UNIT,
    at=st.integers(0, len(BASE_LINES)),
    sql=st.sampled_from(QUERIES),
)
def test_a_units_hostile_lines_move_totals_by_at_most_the_sensitivity(
    tmp_path_factory: pytest.TempPathFactory, hostile: list[bytes], at: int, sql: str
) -> None:
    folder = tmp_path_factory.mktemp("csv")
    base = Session(_policy(folder, BASE_LINES, "base"))
    # The unit's lines go in the middle of the file: a quote in them must not swallow the rest.
    neighbour = Session(_policy(folder, [*BASE_LINES[:at], *hostile, *BASE_LINES[at:]], "n"))
    neighbour.engine.salt = base.engine.salt
    try:
        plan = base.plan(sql)
        assert neighbour.plan(sql).engine_sql == plan.engine_sql
        _, before = base.engine.run(plan.engine_sql)
        _, after = neighbour.engine.run(plan.engine_sql)  # never raises
        answered = neighbour.execute(sql)
    finally:
        base.close()
        neighbour.close()
    _check(plan, before, after)
    assert answered.charge is not None


def test_one_bad_value_after_a_hundred_thousand_integers_is_a_null(tmp_path: Path) -> None:
    lines = [f"{u},north,{20 + u % 50},1.0,x\n".encode() for u in range(100_000)]
    lines.append(b"100000,north,abc,1.0,x\n")
    session = Session(_policy(tmp_path, lines, "sniffed"))
    assert session.engine.catalog["visits"]["age"] == "INTEGER"
    assert session.engine.catalog["visits"]["note"] == "VARCHAR"  # undeclared: never sniffed
    session.execute("SELECT SUM(age), COUNT(age) FROM visits")
    session.close()


def test_a_line_longer_than_the_limit_is_dropped_alone(tmp_path: Path) -> None:
    long = UNIT + b",north," + b"9" * 3_000_000 + b",1.0,x\n"
    session = Session(_policy(tmp_path, [*BASE_LINES[:10], long, *BASE_LINES[10:]], "long"))
    _, rows = session.engine.run("SELECT COUNT(*), COUNT(DISTINCT user_id) FROM visits")
    assert rows == [(len(BASE_LINES), len(BASE_LINES))]
    session.close()


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (b"user_id,region,user_id\n", "repeated"),
        (b"user_id,,age\n", "empty"),
        (b"\xff\xfe\n", "UTF-8"),
        (b"user_id,region", "header line"),
    ],
)
def test_a_malformed_header_is_a_policy_error(tmp_path: Path, header: bytes, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_bytes(header)
    policy = load_policy(
        {
            "dataset": {"id": "csv"},
            "data": {"tables": {"visits": str(path)}},
            "budget": {"diagnose": False, "epsilon": "1"},
            "tables": {"visits": {"privacy_unit": "user_id"}},
        }
    )
    with pytest.raises(PolicyError, match=message):
        Session(policy)


def test_a_declared_type_applies_to_csv_tables_only(tiny_policy: Any) -> None:
    policy = tiny_policy([(1, "east", 20, 1.0)], columns={"age": {"type": "INTEGER"}})
    with pytest.raises(PolicyError, match="CSV tables only"):
        Session(policy)


@pytest.mark.parametrize("bad", ["int; DROP TABLE visits", "mood", "INTEGER)", "", "x" * 300])
def test_a_declared_type_is_a_duckdb_type_and_nothing_else(tmp_path: Path, bad: str) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(HEADER)
    with pytest.raises(PolicyError, match="type"):
        load_policy(
            {
                "dataset": {"id": "csv"},
                "data": {"tables": {"visits": str(path)}},
                "budget": {"diagnose": False, "epsilon": "1"},
                "tables": {
                    "visits": {"privacy_unit": "user_id", "columns": {"age": {"type": bad}}}
                },
            }
        )


def test_a_run_of_empty_lines_does_not_drop_the_next_row(tmp_path: Path) -> None:
    # DuckDB's reader counts the empty lines before a line into that line's size: at its default
    # cap, a unit's 2 MB of newlines would drop the next unit's row. The cap is far above the rule.
    lines = [*BASE_LINES[:10], b"\n" * 3_000_000, *BASE_LINES[10:]]
    session = Session(_policy(tmp_path, lines, "empty"))
    _, rows = session.engine.run("SELECT COUNT(*), COUNT(DISTINCT user_id) FROM visits")
    assert rows == [(len(BASE_LINES), len(BASE_LINES))]
    session.close()


@pytest.mark.parametrize(
    ("text", "column", "value"),
    [
        ("12.7", "age", None),  # DuckDB's own cast would round it to 13
        ("1e3", "age", None),
        ("0x1F", "age", None),
        ("1_000", "spend", None),
        (" 41\t", "age", 41),  # spaces and tabs are trimmed
        ("\u00a041", "age", None),  # other blanks are not
        ("-nan", "spend", None),
        ("NaN", "spend", "nan"),
        ("1e309", "spend", "inf"),
        ("2.5", "spend", 2.5),
    ],
)
def test_a_value_is_cast_only_when_it_matches_its_type_s_grammar(
    tmp_path: Path, text: str, column: str, value: Any
) -> None:
    row = {"age": "30", "spend": "1.5"} | {column: text}
    line = f"1,north,{row['age']},{row['spend']},x\n".encode()
    session = Session(_policy(tmp_path, [line, b"user_id,region,age,spend,note\n"], "grammar"))
    _, rows = session.engine.run(f"SELECT {column} FROM visits")
    session.close()
    assert len(rows) == 1  # the repeated header line is no row
    got = rows[0][0]
    assert (str(got) if isinstance(value, str) else got) == value
